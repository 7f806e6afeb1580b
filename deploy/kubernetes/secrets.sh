#!/usr/bin/env bash
# Makes the Secrets Knitter's manifests mount, in the namespace `knitter` (created if
# missing), each only if it is not there yet (running it again changes nothing):
#   knitter-token        the admin's bearer token (the managers; knitterctl of operators)
#   knitter-bootstrap    the bootstrap token nodes join with (each gets a token of its own)
#   knitter-metrics-token the token Prometheus reads the managers' /metrics with (nothing else)
#   knitter-manager-tls  the managers' TLS certificate (tls.crt, tls.key) for the Service's
#                        names, and the CA that signed it (ca.crt, which nodes verify with)
# The CA is made here with openssl (P-256, ten years; the certificate 825 days) and its key
# is not kept: renew by deleting knitter-manager-tls and running this again (or let
# cert-manager write that Secret: docs/kubernetes.md "TLS").
#
#   bash deploy/kubernetes/secrets.sh             # into the cluster kubectl points at
#   bash deploy/kubernetes/secrets.sh --out DIR   # the same files into DIR, no cluster
set -euo pipefail
ns=knitter
out=
case "${1:-}" in
  --out) out=${2:?--out DIR}; mkdir -p "$out" ;;
  "") ;;
  *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 700 "$tmp"

token() { head -c 32 /dev/urandom | base64 | tr -d '=+/\n'; }
token >"$tmp/token"
token >"$tmp/bootstrap-token"
token >"$tmp/metrics-token"

# The names clients reach the managers by: the Service (every form), and loopback for a
# health check inside the pod.
sans="DNS:knitter-manager,DNS:knitter-manager.$ns,DNS:knitter-manager.$ns.svc,DNS:knitter-manager.$ns.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" -days 3650 -subj "/CN=knitter-manager CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req "${ec[@]}" -keyout "$tmp/tls.key" -out "$tmp/tls.csr" -subj "/CN=knitter-manager.$ns.svc" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n' "$sans" >"$tmp/tls.ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial -days 825 \
  -out "$tmp/tls.crt" -extfile "$tmp/tls.ext" 2>/dev/null

if [ -n "$out" ]; then
  for f in token bootstrap-token metrics-token tls.crt tls.key ca.crt; do
    install -m 600 "$tmp/$f" "$out/$f"
  done
  echo "wrote token, bootstrap-token, metrics-token, tls.crt, tls.key and ca.crt to $out"
  exit 0
fi

kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns"
have() { kubectl -n "$ns" get secret "$1" >/dev/null 2>&1; }
made() { echo "secret/$1 made"; }
kept() { echo "secret/$1 exists: kept"; }
if have knitter-token; then kept knitter-token; else
  kubectl -n "$ns" create secret generic knitter-token --from-file=token="$tmp/token" >/dev/null && made knitter-token
fi
if have knitter-bootstrap; then kept knitter-bootstrap; else
  kubectl -n "$ns" create secret generic knitter-bootstrap --from-file=token="$tmp/bootstrap-token" >/dev/null && made knitter-bootstrap
fi
if have knitter-metrics-token; then kept knitter-metrics-token; else
  kubectl -n "$ns" create secret generic knitter-metrics-token --from-file=token="$tmp/metrics-token" >/dev/null && made knitter-metrics-token
fi
if have knitter-manager-tls; then kept knitter-manager-tls; else
  kubectl -n "$ns" create secret generic knitter-manager-tls --type=kubernetes.io/tls \
    --from-file=tls.crt="$tmp/tls.crt" --from-file=tls.key="$tmp/tls.key" --from-file=ca.crt="$tmp/ca.crt" >/dev/null && made knitter-manager-tls
fi
