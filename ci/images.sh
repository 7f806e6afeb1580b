#!/usr/bin/env bash
# The container images as a cluster would run them (issue 25's checks that run here): built
# with podman from the Debian-made base (deploy/images/build.sh), each binary run in its
# image, the node image's CNI installer into a temporary host directory (the plugin it
# installs then runs on the host), and the manager image serving its health endpoint as its
# unprivileged user. Containers run with runc and lowered rlimits: this machine's crun
# refuses its hybrid cgroups, and the sandbox forbids raising RLIMIT_NPROC.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
NODE=localhost/knitter-node:$VERSION
MANAGER=localhost/knitter-manager:$VERSION
tmp=$(mktemp -d)
name=knitter-ci-manager-$$
node_ns=kci-node-$$ pod_a=kci-pa-$$ pod_b=kci-pb-$$
vnf_pid=""
cleanup() {
  [ -z "$vnf_pid" ] || kill "$vnf_pid" 2>/dev/null || true
  rm -rf "/var/run/dpdk/kci$$"
  podman rm -f -t 2 "$name" "$name-n" "$name-m" >/dev/null 2>&1 || true
  for ns in "$pod_a" "$pod_b" "$node_ns"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
RUN_OPTS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --no-healthcheck)
podman_run() { podman --runtime runc run "${RUN_OPTS[@]}" "$@"; }
run() { podman_run --rm "$@"; }

bash deploy/images/build.sh

echo "== the binaries run in their images"
run --network none "$NODE" --version
run --network none --entrypoint /usr/local/bin/knitterctl "$NODE" --version
run --network none "$MANAGER" --version
run --network none --entrypoint /usr/sbin/nft "$NODE" --version   # host ports' rules
run --network none --entrypoint /usr/bin/tcpdump "$NODE" --version   # capture filters
echo "== knitterctl's completions and man pages are in both images"
for image in "$NODE" "$MANAGER"; do
  run --network none --entrypoint /bin/sh "$image" -c 'test -s /usr/share/bash-completion/completions/knitterctl && test -s /usr/share/man/man1/knitterctl-port-add.1'
done

echo "== the node image's CNI installer, into a host directory (no capabilities, as the init container)"
mkdir -p "$tmp/host"
run --network none --cap-drop ALL -v "$tmp/host:/host" -v "$PWD/deploy/kubernetes/base/10-knitter.conflist:/etc/knitter/10-knitter.conflist:ro" \
  -e CNI_CONFLIST=/etc/knitter/10-knitter.conflist --entrypoint /usr/local/bin/knitter-install-cni "$NODE"
test "$(stat -c %a "$tmp/host/opt/cni/bin/knitter-cni")" = 755
cmp "$tmp/host/etc/cni/net.d/10-knitter.conflist" deploy/kubernetes/base/10-knitter.conflist
CNI_COMMAND=VERSION "$tmp/host/opt/cni/bin/knitter-cni" </dev/null | grep '"1.1.0"' >/dev/null
# Hosts with another (older) libc: the plugin has no dynamic dependency at all, and runs in
# a root that holds nothing but itself. (Pipes into grep read all: `grep -q` leaves at the
# first match and the writer, with pipefail, fails on SIGPIPE.)
command -v readelf >/dev/null
if readelf -l "$tmp/host/opt/cni/bin/knitter-cni" | grep INTERP || readelf -d "$tmp/host/opt/cni/bin/knitter-cni" | grep NEEDED; then
  echo "the installed knitter-cni is linked dynamically" >&2
  exit 1
fi
mkdir -p "$tmp/bare" && cp "$tmp/host/opt/cni/bin/knitter-cni" "$tmp/bare/"
CNI_COMMAND=VERSION chroot "$tmp/bare" /knitter-cni </dev/null | grep '"1.1.0"' >/dev/null
echo "installed; the plugin runs on the host, and in an empty root (linked statically)"

echo "== the manager image serves its health endpoint as user 65532"
mkdir -p "$tmp/data" && chown 65532:65532 "$tmp/data"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
podman_run -d --name "$name" --network host \
  -v "$tmp/data:/var/lib/knitter/manager" "$MANAGER" --listen "127.0.0.1:$port" --grpc-listen 127.0.0.1:0 >/dev/null
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null && break
  sleep 0.2
done
curl -sf "http://127.0.0.1:$port/v1/health"
echo
test "$(podman inspect -f '{{.Config.User}}' "$name")" = 65532:65532
test "$(stat -c %u "$tmp/data/token")" = 65532
echo "serving, unprivileged, its token written to the volume"

echo "== the node image runs the switch with only the DaemonSet's capabilities; pods attach through the installed CNI"
# The node's host network is a namespace of this test's; the manager runs in it too.
ip netns add "$node_ns" && ip netns add "$pod_a" && ip netns add "$pod_b"
for ns in "$node_ns" "$pod_a" "$pod_b"; do ip -n "$ns" link set lo up; done
mkdir -p "$tmp/m" "$tmp/run/vhost" "$tmp/state"
# As the manifests run them: the Secrets deploy/kubernetes/secrets.sh makes (the admin token
# and TLS for the manager; only the bootstrap token and the CA for the node, which joins and
# keeps its own token in its state directory).
bash deploy/kubernetes/secrets.sh --out "$tmp/secrets" >/dev/null
chown -R 65532:65532 "$tmp/m" "$tmp/secrets"
podman_run -d --name "$name-m" --network "ns:/run/netns/$node_ns" -v "$tmp/m:/var/lib/knitter/manager" \
  -v "$tmp/secrets:/etc/knitter/secrets:ro" "$MANAGER" --listen 127.0.0.1:9480 --grpc-listen 127.0.0.1:9481 \
  --token-file /etc/knitter/secrets/token --bootstrap-token-file /etc/knitter/secrets/bootstrap-token \
  --tls-cert /etc/knitter/secrets/tls.crt --tls-key /etc/knitter/secrets/tls.key >/dev/null
# The capabilities deploy/kubernetes/base/node.yaml gives the container, and nothing else.
CAPS=$(sed -n 's/^ *add: \[\(NET_ADMIN.*\)\]$/\1/p' deploy/kubernetes/base/node.yaml | tr -d ' ')
test -n "$CAPS"
start_node() {
  podman_run -d --name "$name-n" --network "ns:/run/netns/$node_ns" --cap-drop ALL --cap-add "$CAPS" \
    -v "$tmp/run:/run/knitter" -v "$tmp/run/vhost:$tmp/run/vhost" -v "$tmp/state:/var/lib/knitter" -v /run/netns:/run/netns:rslave \
    -v "$tmp/secrets/bootstrap-token:/etc/knitter/bootstrap/token:ro" -v "$tmp/secrets/ca.crt:/etc/knitter/manager-ca/ca.crt:ro" \
    "$NODE" --no-hugepages --buffers 4096 --idle adaptive --no-metrics \
    --manager 127.0.0.1:9481 --manager-bootstrap-token-file /etc/knitter/bootstrap/token \
    --manager-ca /etc/knitter/manager-ca/ca.crt --manager-server-name knitter-manager.knitter.svc --node-name n1 >/dev/null
  for _ in $(seq 1 100); do
    [ -S "$tmp/run/vswitchd.sock" ] && target/release/knitterctl --socket "$tmp/run/vswitchd.sock" node show >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  podman logs "$name-n" | tail -n 20
  return 1
}
start_node
mctl() {
  ip netns exec "$node_ns" target/release/knitterctl --manager 127.0.0.1:9481 --token-file "$tmp/secrets/token" \
    --manager-ca "$tmp/secrets/ca.crt" --manager-server-name knitter-manager.knitter.svc manager "$@"
}
for _ in $(seq 1 50); do mctl tenant list >/dev/null 2>&1 && break; sleep 0.2; done
for _ in $(seq 1 50); do [ -s "$tmp/state/manager-token" ] && break; sleep 0.2; done
grep -q '^node\.' "$tmp/state/manager-token" && test "$(stat -c %a "$tmp/state/manager-token")" = 600
echo "the manager serves TLS; the node joined with the bootstrap token and keeps its own (0600)"
mctl network create red --ipv4 10.99.0.0/24 >/dev/null
add() { # add CONTAINER NETNS: the CNI ADD a runtime would run; prints the pod's address
  printf '{"cniVersion":"1.0.0","name":"knitter","type":"knitter-cni","network":"red","socket":"%s"}' "$tmp/run/vswitchd.sock" |
    env -i CNI_COMMAND=ADD CNI_CONTAINERID="$1" CNI_NETNS="/run/netns/$2" CNI_IFNAME=eth0 CNI_PATH="$tmp/host/opt/cni/bin" \
      CNI_ARGS="K8S_POD_NAMESPACE=ci;K8S_POD_NAME=$1" "$tmp/host/opt/cni/bin/knitter-cni" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["ips"][0]["address"].split("/")[0])'
}
ip_a=$(add pod-a "$pod_a")
ip_b=$(add pod-b "$pod_b")
ip netns exec "$pod_a" ping -c 3 -i 0.2 -W 2 "$ip_b" >/dev/null
echo "pod-a ($ip_a) pings pod-b ($ip_b) through the containerised switch"
# A DPDK pod's vhost-user socket, its directory given to the pod's user (the switch makes
# the socket here: switchListens), as the CNI asks the containerised switch.
printf '{"cniVersion":"1.0.0","name":"knitter","type":"knitter-cni","network":"red","socket":"%s","interfaceType":"vhost-user","vhostUser":{"dir":"%s","switchListens":true,"mode":"0750","owner":1000,"group":1000}}' \
    "$tmp/run/vswitchd.sock" "$tmp/run/vhost" |
  env -i CNI_COMMAND=ADD CNI_CONTAINERID=pod-vnf-0123456789 CNI_NETNS="/run/netns/$pod_b" CNI_IFNAME=net1 CNI_PATH="$tmp/host/opt/cni/bin" \
    CNI_ARGS="K8S_POD_NAMESPACE=ci;K8S_POD_NAME=vnf" "$tmp/host/opt/cni/bin/knitter-cni" >/dev/null
test -S "$tmp/run/vhost/pod-vnf-0123/net1.sock"
test "$(stat -c %u:%g:%a "$tmp/run/vhost/pod-vnf-0123")" = 1000:1000:750
echo "a vhost-user socket made for the pod's user (1000:1000, 0750)"

# A VNF: DPDK's testpmd (net_virtio_user, listening: the switch connects, client mode)
# answering ARP and pings (icmpecho) on the MAC and address the CNI gave its interface.
vnf=$(printf '{"cniVersion":"1.0.0","name":"knitter","type":"knitter-cni","network":"red","socket":"%s","interfaceType":"vhost-user","vhostUser":{"dir":"%s"}}' \
    "$tmp/run/vswitchd.sock" "$tmp/run/vhost" |
  env -i CNI_COMMAND=ADD CNI_CONTAINERID=pod-dpdk-0123456789 CNI_NETNS="/run/netns/$pod_b" CNI_IFNAME=net2 CNI_PATH="$tmp/host/opt/cni/bin" \
    CNI_ARGS="K8S_POD_NAMESPACE=ci;K8S_POD_NAME=dpdk" "$tmp/host/opt/cni/bin/knitter-cni")
ip_vnf=$(echo "$vnf" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ips"][0]["address"].split("/")[0])')
mac_vnf=$(echo "$vnf" | python3 -c 'import json,sys; print(json.load(sys.stdin)["interfaces"][0]["mac"])')
# testpmd's virtio-user takes a new backend when it checks the link: make it check often.
{ echo "set fwd icmpecho"; echo start; while sleep 0.1; do echo "show port info all"; done; } |
  dpdk-testpmd -l 0,1 --no-pci --no-huge -m 512 --single-file-segments --file-prefix="kci$$" \
    --vdev="net_virtio_user0,path=$tmp/run/vhost/pod-dpdk-012/net2.sock,server=1,queues=1,mac=$mac_vnf" \
    -- -i --nb-cores=1 --total-num-mbufs=2048 >/dev/null 2>&1 &
vnf_pid=$!
for _ in $(seq 1 50); do ip netns exec "$pod_a" ping -c 1 -W 1 "$ip_vnf" >/dev/null 2>&1 && break; done
ip netns exec "$pod_a" ping -c 3 -i 0.2 -W 2 "$ip_vnf" >/dev/null
echo "pod-a pings the VNF ($ip_vnf, testpmd on vhost-user) through the containerised switch"

echo "== a DaemonSet-style upgrade: the old container stops, a new one starts on its state"
ip netns exec "$pod_a" ping -i 0.01 -c 1000 -W 1 "$ip_b" >"$tmp/ping-kernel.txt" 2>&1 &
kernel_pinger=$!
ip netns exec "$pod_a" ping -i 0.01 -c 1000 -W 1 "$ip_vnf" >"$tmp/ping-vnf.txt" 2>&1 &
vnf_pinger=$!
sleep 3
podman stop -t 10 "$name-n" >/dev/null && podman rm "$name-n" >/dev/null
start_node
wait "$kernel_pinger" "$vnf_pinger" || true
for who in kernel vnf; do
  sent=$(sed -n 's/^\([0-9]*\) packets transmitted.*/\1/p' "$tmp/ping-$who.txt")
  got=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$tmp/ping-$who.txt")
  lost_ms=$(( (sent - got) * 10 ))
  echo "$who pod: $sent pings sent at 10 ms, $got answered: ${lost_ms} ms of traffic lost across the upgrade"
  test "$lost_ms" -le 2000
done
# The new container reaches the manager with the token the old one got by joining (a second
# join would be refused): a pod's ADD creates its port there.
printf '{"cniVersion":"1.0.0","name":"knitter","type":"knitter-cni","network":"red","socket":"%s"}' "$tmp/run/vswitchd.sock" |
  env -i CNI_COMMAND=ADD CNI_CONTAINERID=pod-after-upgrade CNI_NETNS="/run/netns/$pod_a" CNI_IFNAME=net5 CNI_PATH="$tmp/host/opt/cni/bin" \
    CNI_ARGS="K8S_POD_NAMESPACE=ci;K8S_POD_NAME=after" "$tmp/host/opt/cni/bin/knitter-cni" >/dev/null
mctl port list | grep pod-after-upgrade >/dev/null
echo "after the upgrade the node attaches a pod with its own token"
