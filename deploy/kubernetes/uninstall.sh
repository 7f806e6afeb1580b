#!/usr/bin/env bash
# Uninstalls Knitter from the cluster kubectl points at, in the order that leaves nothing
# stuck in Terminating and nothing on the hosts:
#   1. Network, IPGroup and Cluster resources are deleted while the manager still runs: it
#      takes each one's finalizer (knitter.io/cleanup) off once what it made is gone (and the
#      garbage collector takes the NADs). One whose network pods still use is held
#      (Ready=False, InUse): the script shows them and stops, changing nothing more; delete
#      those pods first, or run with --force to take the finalizers off (the manager's store
#      goes in 3). Then the Cluster resources, with releaseOnDelete set (the manager that
#      served the member clusters goes): only once no Network or IPGroup is held.
#   2. The node DaemonSet goes (pods on Knitter networks lose them), then a cleanup
#      DaemonSet (uninstall/cleanup.yaml) runs the node image's installer in `uninstall`
#      mode on every node: knitter-cni and Knitter's conflist removed from the hosts; with
#      --purge also the node agents' state and sockets (/var/lib/knitter, /run/knitter).
#   3. What the overlay made: kubectl delete -k OVERLAY (the manager and its volume, RBAC,
#      the CRDs, the namespace and the Secrets secrets.sh made in it).
#
#   bash deploy/kubernetes/uninstall.sh [--overlay DIR] [--image IMAGE] [--force] [--purge] [--timeout SECONDS]
#
# OVERLAY is the one you installed (default deploy/kubernetes/overlays/embedded); a
# kustomization of your own over it works the same. The cleanup runs the node image the
# node DaemonSet ran (or IMAGE; a second run after a failure finds it on the cleanup
# DaemonSet left behind). Running it again after a failure carries on where it stopped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
overlay=$here/overlays/embedded
force=0 purge=0 timeout=120 image=
while [ $# -gt 0 ]; do
  case "$1" in
    --overlay) overlay=${2:?--overlay DIR}; shift ;;
    --image) image=${2:?--image IMAGE}; shift ;;
    --force) force=1 ;;
    --purge) purge=1 ;;
    --timeout) timeout=${2:?--timeout SECONDS}; shift ;;
    *) echo "usage: $0 [--overlay DIR] [--image IMAGE] [--force] [--purge] [--timeout SECONDS]" >&2; exit 2 ;;
  esac
  shift
done
ns=knitter

echo "== 1. Network, IPGroup and Cluster resources (the manager cleans up after each)"
# Clusters last, once nothing else is held: an uninstall that stops at a held Network has
# released no member cluster.
delete_held() {
  local resources=$1
  kubectl delete "$resources" --all --wait=false
  deadline=$((SECONDS + timeout))
  while left=$(kubectl get "$resources" -o name 2>/dev/null) && [ -n "$left" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      if [ "$force" = 1 ]; then
        echo "still held after ${timeout} s; --force: taking their finalizers off"
        for r in $left; do
          kubectl patch "$r" --type=merge -p '{"metadata":{"finalizers":null}}'
        done
        break
      fi
      kubectl get "$resources"
      echo "uninstall.sh: these are still held (REASON InUse: pods use their networks; delete those pods), or the manager is not running; nothing after them was changed. Run again, or with --force." >&2
      exit 1
    fi
    sleep 2
  done
}
if kubectl get crd networks.knitter.io >/dev/null 2>&1; then
  delete_held networks.knitter.io,ipgroups.knitter.io
else
  echo "no CRDs: nothing to delete"
fi
if kubectl get crd clusters.knitter.io >/dev/null 2>&1; then
  for c in $(kubectl get clusters.knitter.io -o name); do
    kubectl patch "$c" --type=merge -p '{"spec":{"releaseOnDelete":true}}'
  done
  delete_held clusters.knitter.io
fi

echo "== 2. the node agents, then the hosts' CNI files"
image_of() { kubectl -n "$ns" get daemonset "$1" -o jsonpath='{.spec.template.spec.containers[0].image}' 2>/dev/null || true; }
[ -n "$image" ] || image=$(image_of knitter-node)
[ -n "$image" ] || image=$(image_of knitter-cleanup)
if kubectl get namespace "$ns" >/dev/null 2>&1; then
  if [ -z "$image" ]; then
    echo "uninstall.sh: the node DaemonSet is gone and no image is known for the cleanup: pass --image (the knitter-node image you ran)" >&2
    exit 1
  fi
  # Foreground: the DaemonSet goes after its pods did, so no agent writes its state while
  # the cleanup (--purge) removes it.
  kubectl -n "$ns" delete daemonset knitter-node --ignore-not-found --cascade=foreground --wait=true
  if [ -n "$(kubectl -n "$ns" get pod -l app.kubernetes.io/name=knitter-node -o name)" ]; then
    kubectl -n "$ns" wait --for=delete pod -l app.kubernetes.io/name=knitter-node --timeout="${timeout}s"
  fi
  sed -e "s|image: localhost/knitter-node:0.1.0|image: $image|" \
      -e "s|{name: KNITTER_PURGE, value: \"0\"}|{name: KNITTER_PURGE, value: \"$purge\"}|" \
      "$here/uninstall/cleanup.yaml" | kubectl apply -f -
  # Left behind on a failure (a node that never runs it): a second run finds its image and
  # carries on; kubectl shows which pods did not get ready.
  kubectl -n "$ns" rollout status daemonset knitter-cleanup --timeout="${timeout}s"
  kubectl -n "$ns" delete daemonset knitter-cleanup --wait=true
fi

echo "== 3. the manager, RBAC, CRDs, namespace and Secrets"
kubectl delete -k "$overlay" --ignore-not-found --wait=true
echo "uninstalled"
