#!/usr/bin/env bash
# Writes the kubeconfig the manager reaches a member cluster's apiserver with: the server
# kubectl's context CONTEXT names (it must be reachable from the manager's pods: a kind or
# minikube context's 127.0.0.1 is not; edit the file if so), the cluster's CA and the token
# of the knitter-manager service account there (the Secret knitter-manager-token, which
# overlays/member makes and the cluster's token controller fills; waited for up to 60 s).
# The token does not expire: keep the file private and remove it once the Secret
# knitter-clusters holds it.
#
#   (umask 077; bash deploy/kubernetes/member-kubeconfig.sh CONTEXT > east.kubeconfig)
set -euo pipefail
context=${1:?usage: $0 CONTEXT, the member cluster as a kubectl context}
k() { kubectl --context "$context" "$@"; }
cluster=$(kubectl config view -o jsonpath="{.contexts[?(@.name=='$context')].context.cluster}")
server=$(kubectl config view -o jsonpath="{.clusters[?(@.name=='$cluster')].cluster.server}")
[ -n "$server" ] || { echo "kubectl has no context $context naming a cluster with a server" >&2; exit 1; }
k -n knitter get serviceaccount knitter-manager >/dev/null ||
  { echo "no knitter/knitter-manager service account in $context: apply overlays/member first" >&2; exit 1; }
token=
for _ in $(seq 60); do
  # (Made by the same apply: it may not be there yet; access was checked above.)
  token=$(k -n knitter get secret knitter-manager-token -o jsonpath='{.data.token}' 2>/dev/null || true)
  [ -n "$token" ] && break
  sleep 1
done
[ -n "$token" ] || { echo "the Secret knitter/knitter-manager-token in $context got no token within 60 s" >&2; exit 1; }
ca=$(k -n knitter get secret knitter-manager-token -o jsonpath='{.data.ca\.crt}')
cat <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $context
  cluster:
    server: $server
    certificate-authority-data: $ca
users:
- name: knitter-manager
  user:
    token: $(printf %s "$token" | base64 -d)
contexts:
- name: $context
  context: {cluster: $context, user: knitter-manager}
current-context: $context
KUBECONFIG
