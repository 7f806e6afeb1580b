#!/usr/bin/env bash
# Test certificates for TLS tests, made with openssl in directory $1: two CAs (ca, other-ca),
# a server certificate for `localhost` and a client certificate, both signed by `ca`
# (P-256 keys, valid one day). Used by control/manager/tests (the manager), control/knitterctl/tests
# (the node API) and the
# CNI lab (a node reaching its manager over TLS).
set -euo pipefail
cd "$1"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
for ca in ca other-ca; do
    openssl req -x509 "${ec[@]}" -keyout "$ca.key" -out "$ca.pem" -days 1 -subj "/CN=knitter test CA" 2>/dev/null
done
printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
for who in server client; do
    openssl req "${ec[@]}" -keyout "$who.key" -out "$who.csr" -subj "/CN=$who" 2>/dev/null
    openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out "$who.pem" -extfile "$who.ext" 2>/dev/null
done
