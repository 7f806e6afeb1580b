#!/usr/bin/env bash
# The Knitter demo: two nodes (network namespaces), each with its own knitter-vswitchd
# (idle policy adaptive), joined by a VXLAN underlay and an 802.1Q trunk, and
# knitter-manager (embedded store) on node1. Pods are namespaces with veth interfaces on a
# VXLAN plane ("red", VNI 5001, dual-stack: defined on the manager, which gives the pods
# their addresses and MACs and pushes the plane to the nodes; a pod network: each node its
# pods' gateway through a host port the manager gives it, so probes from the node, a Service
# with a backend on each node over IPv4 and IPv6, and the way out work) and a VLAN plane ("blue", VLAN 200:
# configured on the nodes by hand); with dpdk-testpmd installed, a VNF on a vhost-user port
# answers too. Everything is configured with knitterctl, checked, shown and torn down (also
# on Ctrl-C). No etcd, no Kubernetes. Needs root and the release binaries (ci/demo.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${KNITTER_BIN:-target/release}
RUN=/run/knitter-demo
N1=kdemo-node1 N2=kdemo-node2
PODS="kdemo-a kdemo-b kdemo-c kdemo-d kdemo-e"
PASS=0 FAIL=0
TESTPMD_PID=""

if [ -t 1 ]; then B=$'\033[1m' G=$'\033[32m' R=$'\033[31m' N=$'\033[0m'; else B= G= R= N=; fi
bold() { printf '%s%s%s\n' "$B" "$*" "$N"; }
step() { echo; bold "[$1] $2"; }
check() { # check "what" command...
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then
    printf '  %s✓%s %s\n' "$G" "$N" "$what"; PASS=$((PASS + 1))
  else
    printf '  %s✗%s %s\n' "$R" "$N" "$what"; FAIL=$((FAIL + 1))
  fi
}
refuses() { ! "$@"; }
ctl() { local node=$1; shift; "$BIN/knitterctl" --socket "$RUN/$node.sock" "$@"; }
MANAGER=198.51.100.1:9481
# The manager's CLI, from node1 (where the manager listens), with the manager's token.
mctl() { ip netns exec $N1 "$BIN/knitterctl" --manager $MANAGER --token-file "$RUN/manager/token" manager "$@"; }
# A manager port's IPv4 or IPv6 address or its MAC: mport CONTAINER ip|ip6|mac
mport() { mctl -o json port show "$1" eth0 | python3 -c "
import json, sys
p, f = json.load(sys.stdin), sys.argv[1]
if f == 'mac': print(p['mac'])
else: print(next(a['address'] for a in p['addresses'] if (':' in a['address']) == (f == 'ip6')))" "$2"; }
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

cleanup() {
  trap - EXIT INT TERM
  [ -n "$TESTPMD_PID" ] && kill "$TESTPMD_PID" 2>/dev/null && wait "$TESTPMD_PID" 2>/dev/null
  for n in node1 node2 manager; do
    [ -f "$RUN/$n.pid" ] && kill "$(cat "$RUN/$n.pid")" 2>/dev/null
  done
  for n in node1 node2 manager; do   # SIGTERM stops a daemon cleanly within a few seconds
    [ -f "$RUN/$n.pid" ] || continue
    for _ in $(seq 50); do kill -0 "$(cat "$RUN/$n.pid")" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$(cat "$RUN/$n.pid")" 2>/dev/null
  done
  for ns in $N1 $N2 $PODS; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$RUN" /var/run/dpdk/kdemo
}
on_signal() { echo; echo "interrupted: tearing down"; cleanup; exit 130; }
trap cleanup EXIT
trap on_signal INT TERM

[ "$(id -u)" = 0 ] || { echo "the demo needs root (network namespaces)" >&2; exit 1; }
for b in knitter-vswitchd knitterctl knitter-manager; do
  [ -x "$BIN/$b" ] || { echo "$BIN/$b is missing: run ci/demo.sh (it builds it)" >&2; exit 1; }
done
for ns in $N1 $N2 $PODS; do ip netns del "$ns" 2>/dev/null; done   # a previous run killed hard
rm -rf "$RUN"; mkdir -p "$RUN"

bold "Knitter demo: two nodes and a manager, a VXLAN plane and a VLAN plane, pods on both"

step 1/9 "nodes: namespaces $N1 and $N2, an underlay link and a trunk link between them"
for ns in $N1 $N2; do ip netns add "$ns"; in_ns "$ns" ip link set lo up; done
ip link add kdemo-ul1 type veth peer name kdemo-ul2
ip link add kdemo-tr1 type veth peer name kdemo-tr2
for i in 1 2; do
  ns=kdemo-node$i
  ip link set kdemo-ul$i netns "$ns"; in_ns "$ns" ip link set kdemo-ul$i name ul0
  ip link set kdemo-tr$i netns "$ns"; in_ns "$ns" ip link set kdemo-tr$i name trunk0
  in_ns "$ns" ip link set ul0 up; in_ns "$ns" ip link set trunk0 up
  # The node's own address on the underlay: its kernel keeps it while the switch shares the link.
  in_ns "$ns" ip addr add 198.51.100.$i/24 dev ul0
  in_ns "$ns" ip -6 addr add 2001:db8:100::$i/64 dev ul0 nodad
done
echo "  underlay 198.51.100.0/24 (nodes .1 and .2, VTEPs .11 and .12), trunk carrying VLAN 200"

step 2/9 "starting knitter-manager on node1 and knitter-vswitchd on each node (1 PMD thread, idle adaptive)"
# `ip netns exec` execs the daemon: $! is the daemon itself. Nodes hold no admin token: they
# join with the bootstrap token and each gets its own (docs/manager.md "Node identity").
head -c 24 /dev/urandom | base64 >"$RUN/bootstrap-token"
ip netns exec $N1 "$BIN/knitter-manager" --data-dir "$RUN/manager" --listen 198.51.100.1:9480 \
  --grpc-listen $MANAGER --bootstrap-token-file "$RUN/bootstrap-token" >"$RUN/manager.log" 2>&1 &
echo $! >"$RUN/manager.pid"
for _ in $(seq 100); do mctl tenant list >/dev/null 2>&1 && break; sleep 0.1; done
mctl tenant list >/dev/null || { echo "the manager did not start:"; cat "$RUN/manager.log"; exit 1; }
echo "  manager: REST on 198.51.100.1:9480, gRPC on $MANAGER, embedded store and token in $RUN/manager"
for i in 1 2; do
  ip netns exec kdemo-node$i "$BIN/knitter-vswitchd" --socket "$RUN/node$i.sock" --no-state --pmd-threads 1 \
    --idle adaptive --buffers 8192 --manager $MANAGER --node-name node$i \
    --manager-bootstrap-token-file "$RUN/bootstrap-token" --manager-credential-file "$RUN/node$i-token" >"$RUN/node$i.log" 2>&1 &
  echo $! >"$RUN/node$i.pid"
done
for i in 1 2; do
  for _ in $(seq 100); do ctl node$i node show >/dev/null 2>&1 && break; sleep 0.1; done
  ctl node$i node show >/dev/null || { echo "node$i did not start:"; cat "$RUN/node$i.log"; exit 1; }
  echo "  node$i: API on $RUN/node$i.sock, log $RUN/node$i.log"
done

step 3/9 "configuring both nodes with knitterctl: underlay, VTEP, the VLAN plane"
for i in 1 2; do
  me=$((10 + i))
  ctl node$i port add ul0 --af-xdp ul0 --underlay >/dev/null &&
    ctl node$i vtep set --local 198.51.100.$me --underlay ul0 >/dev/null &&
    ctl node$i bridge add blue --vlan 200 >/dev/null &&
    ctl node$i port add trunk0 --af-xdp trunk0 --trunk 200 >/dev/null || exit 1
  echo "  node$i: bridge blue (VLAN 200), VTEP 198.51.100.$me on ul0 (peers: from the manager), trunk0"
done

step 4/9 "the manager: the red plane (a pod network: the nodes its gateway), the red pods' ports"
mctl network create red --kind vxlan --segment 5001 --plane media --ipv4 10.0.0.0/24 --gateway4 10.0.0.1 \
  --ipv6 fd00:10::/64 --gateway6 fd00:10::1 --node-gateway --masquerade | sed 's/^/  /'
for p in a:node1 c:node2 e:node1; do
  mctl port create --network red --container "kdemo-${p%%:*}" --interface eth0 --pod "demo/${p%%:*}" --node "${p#*:}" >/dev/null || exit 1
done
mctl port list --network red | sed 's/^/  /'
for i in 1 2; do   # the nodes' sync streams bring the plane
  for _ in $(seq 100); do ctl node$i -o json bridge list 2>/dev/null | grep -q '"red"' && break; sleep 0.1; done
done

step 5/9 "pods: namespaces with a veth each, plugged into the nodes' switches"
pod() { # pod NAME NODE BRIDGE IP MTU [MAC [IPV6]]
  local name=$1 node=$2 bridge=$3 ip=$4 mtu=$5 port=${1#kdemo-} ip6=${7:-}
  ip netns add "$name"; in_ns "$name" ip link set lo up
  ip link add "kdemo-$port" type veth peer name "kdemo-$port-p"
  ip link set "kdemo-$port-p" netns "$name"; in_ns "$name" ip link set "kdemo-$port-p" name eth0
  ip link set "kdemo-$port" netns "kdemo-$node"; in_ns "kdemo-$node" ip link set "kdemo-$port" name "pod-$port"
  in_ns "kdemo-$node" ip link set "pod-$port" up
  [ -n "${6:-}" ] && in_ns "$name" ip link set eth0 address "$6"
  in_ns "$name" ip addr add "$ip/24" dev eth0; in_ns "$name" ip link set eth0 mtu "$mtu" up
  [ "$bridge" = red ] && in_ns "$name" ip route add default via 10.0.0.1   # its node (step 7)
  if [ -n "$ip6" ]; then
    in_ns "$name" ip -6 addr add "$ip6/64" dev eth0 nodad
    in_ns "$name" ip -6 route add default via fd00:10::1
  fi
  # As the CNI does: no offloads, so frames leave the pod whole and checksummed.
  in_ns "$name" ethtool -K eth0 tx off tso off gso off >/dev/null 2>&1
  local mac; mac=$(in_ns "$name" cat /sys/class/net/eth0/address)
  ctl "$node" port add "pod-$port" --af-xdp "pod-$port" --access "$bridge" --mac "$mac" --ip "$ip" \
    ${ip6:+--ip "$ip6"} --mtu "$mtu" >/dev/null || exit 1
  printf '  %-5s on %s, %-4s  %s%s  MTU %s  (port security: %s)\n' "${name#kdemo-}" "$node" "$bridge" "$ip" "${ip6:+ $ip6}" "$mtu" "$mac"
}
# Red pods take what the manager gave them (the network's MTU is the underlay's minus the
# 50 bytes of VXLAN); blue pods are set by hand.
IP_A=$(mport kdemo-a ip) IP_C=$(mport kdemo-c ip) IP_E=$(mport kdemo-e ip)
IP6_A=$(mport kdemo-a ip6) IP6_C=$(mport kdemo-c ip6) IP6_E=$(mport kdemo-e ip6)
export IP_A
pod kdemo-a node1 red "$IP_A" 1450 "$(mport kdemo-a mac)" "$IP6_A"
pod kdemo-b node1 blue 10.0.0.103 1500
pod kdemo-c node2 red "$IP_C" 1450 "$(mport kdemo-c mac)" "$IP6_C"
pod kdemo-d node2 blue 10.0.0.104 1500
pod kdemo-e node1 red "$IP_E" 1450 "$(mport kdemo-e mac)" "$IP6_E"
step 6/9 "checks"
from_manager() { for i in 1 2; do ctl node$i bridge list | grep -w red | grep -qw manager || return 1; done; }
both_alive() { [ "$(mctl node list | grep -cw alive)" = 2 ]; }
check "the manager's red plane reached both nodes (bridge red, owner manager)" from_manager
check "both nodes are alive on the manager (their sync streams)" both_alive
check "red: pod a (node1) pings pod c (node2) across VXLAN" in_ns kdemo-a ping -c 3 -i 0.2 -W 2 "$IP_C"
check "red over IPv6: pod a pings pod c across VXLAN" in_ns kdemo-a ping -6 -c 3 -i 0.2 -W 2 "$IP6_C"
check "blue: pod b (node1) pings pod d (node2) across the VLAN 200 trunk" in_ns kdemo-b ping -c 3 -i 0.2 -W 2 10.0.0.104
# tcp_ok SERVER-NS BIND-IP CLIENT-NS CONNECT-IP PORT: 4 MiB over TCP, every byte received.
tcp_ok() {
  python3 - "$@" <<'PY'
import subprocess, sys
server_ns, bind, client_ns, connect, port = sys.argv[1:6]
srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "python3", "-c", f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('{bind}', {port})); s.listen(1); s.settimeout(20)
c, _ = s.accept(); c.settimeout(20); n = 0
while True:
    d = c.recv(65536)
    if not d: break
    n += len(d)
print(n)
"""], stdout=subprocess.PIPE, text=True)
subprocess.run(["ip", "netns", "exec", client_ns, "python3", "-c", f"""
import socket, time
for i in range(50):
    try:
        c = socket.create_connection(('{connect}', {port}), timeout=5); break
    except OSError: time.sleep(0.1)
c.sendall(b'k' * (4 << 20)); c.close()
"""], timeout=30)
out, _ = srv.communicate(timeout=30)
sys.exit(0 if out.strip() == str(4 << 20) else 1)
PY
}
check "red: TCP, 4 MiB from pod c to pod a across VXLAN" tcp_ok kdemo-a "$IP_A" kdemo-c "$IP_A" 5201
check "isolation: red pod a cannot reach blue pod d (same subnet, other plane)" refuses in_ns kdemo-a ping -c 2 -i 0.2 -W 1 10.0.0.104
check "isolation: blue pod b cannot reach red pod c" refuses in_ns kdemo-b ping -c 2 -i 0.2 -W 1 "$IP_C"
check "the nodes' own addresses still work on the shared underlay link" in_ns $N2 ping -c 2 -i 0.2 -W 2 198.51.100.1
check "a conflicting request is refused with a reason (VNI 5001 twice)" refuses ctl node1 bridge add green --vni 5001
check "Prometheus metrics on node1 (127.0.0.1:9477/metrics in its namespace)" in_ns $N1 python3 -c '
import urllib.request, sys
body = urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=5).read().decode()
sys.exit(0 if "knitter_port_rx_packets_total{port=\"pod-a\"}" in body else 1)'

step 7/9 "a pod network: each node the red plane's gateway through the host port the manager gave it"
# The manager gave each node with red pods a host port (an address from red's pool) and
# sends it with red's gateway in the node's state; the node made the interface (kh…, with
# that address and NAT rules) and answers the pods' gateway 10.0.0.1 with one MAC on both
# nodes: what a cluster's pod network needs (docs/pod-network.md).
# A node's host port on red: hostport NODE ip|interface
hostport() { mctl -o json port list --network red --node "$1" | python3 -c "
import json, sys
p = next(p for p in json.load(sys.stdin) if p['container'].startswith('knitter-host.'))
print(p['addresses'][0]['address'] if sys.argv[1] == 'ip' else p['interface'])" "$2"; }
for i in 1 2; do
  KH=$(hostport node$i interface) HIP=$(hostport node$i ip)
  for _ in $(seq 100); do in_ns kdemo-node$i ip -o addr show dev "$KH" 2>/dev/null | grep -q "$HIP/" && break; sleep 0.1; done
  echo "  node$i: host port $KH $HIP/24 on red (from the manager), gateway 10.0.0.1"
done
HOST1=$(hostport node1 ip)
# A ClusterIP Service as kube-proxy's nftables mode writes it on node1 (its chains, reduced):
# 10.96.0.10:5202 → pod a (node1) or pod c (node2), one of the two at random.
in_ns $N1 nft -f - <<NFT
table ip kdemo_proxy {
  chain endpoint-a { ip protocol tcp dnat to $IP_A:5202; }
  chain endpoint-c { ip protocol tcp dnat to $IP_C:5202; }
  chain service-demo { numgen random mod 2 vmap { 0 : goto endpoint-a, 1 : goto endpoint-c }; }
  chain services { type nat hook prerouting priority dstnat; ip daddr 10.96.0.10 tcp dport 5202 goto service-demo; }
}
table ip6 kdemo_proxy6 {
  chain endpoint-a { meta l4proto tcp dnat to [$IP6_A]:5202; }
  chain endpoint-c { meta l4proto tcp dnat to [$IP6_C]:5202; }
  chain service-demo { numgen random mod 2 vmap { 0 : goto endpoint-a, 1 : goto endpoint-c }; }
  chain services { type nat hook prerouting priority dstnat; ip6 daddr fd00:96::10 tcp dport 5202 goto service-demo; }
}
NFT
echo "  node1: a dual-stack Service 10.96.0.10 and [fd00:96::10], port 5202 → pod a (node1) or pod c (node2), as kube-proxy would write it"
# both_backends SERVICE BACKEND-A BACKEND-C: pod e connects to the Service until pod a and
# pod c have each answered.
both_backends() {
  python3 - "$@" <<'PY'
import subprocess, sys
service = sys.argv[1]
servers = [subprocess.Popen(["ip", "netns", "exec", ns, "timeout", "20", "python3", "-c", f"""
import socket
s = socket.socket(socket.AF_INET6 if ':' in '{ip}' else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('{ip}', 5202)); s.listen(8)
while True:
    c, _ = s.accept(); c.sendall(b'{ns}'); c.close()
"""]) for ns, ip in (("kdemo-a", sys.argv[2]), ("kdemo-c", sys.argv[3]))]
out = subprocess.run(["ip", "netns", "exec", "kdemo-e", "python3", "-c", f"""
import socket, time
seen = set()
for _ in range(200):
    try:
        c = socket.create_connection(('{service}', 5202), timeout=3); seen.add(c.recv(16).decode()); c.close()
    except OSError: time.sleep(0.1)
    if len(seen) == 2: break
print(' '.join(sorted(seen)))
"""], capture_output=True, text=True, timeout=60).stdout.split()
for s in servers: s.kill()
sys.exit(0 if out == ["kdemo-a", "kdemo-c"] else 1)
PY
}
check "node1 probes its pod a from its own address, as a kubelet does" in_ns $N1 ping -c 3 -i 0.2 -W 2 "$IP_A"
check "node2 probes its pod c" in_ns $N2 ping -c 3 -i 0.2 -W 2 "$IP_C"
check "node1 probes its pod a over IPv6" in_ns $N1 ping -6 -c 3 -i 0.2 -W 2 "$IP6_A"
check "pod a reaches its node's address in the plane" in_ns kdemo-a ping -c 3 -i 0.2 -W 2 "$HOST1"
# seen_as SERVER-NS BIND-IP CLIENT-NS EXPECTED: a TCP connection's source, as the server sees it.
seen_as() {
  python3 - "$@" <<'PY'
import subprocess, sys
server_ns, bind, client_ns, expected = sys.argv[1:5]
srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "timeout", "20", "python3", "-c", f"""
import socket
s = socket.socket(socket.AF_INET6 if ':' in '{bind}' else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('{bind}', 5203)); s.listen(1); c, a = s.accept(); print(a[0])
"""], stdout=subprocess.PIPE, text=True)
subprocess.run(["ip", "netns", "exec", client_ns, "python3", "-c", f"""
import socket, time
for _ in range(50):
    try:
        socket.create_connection(('{bind}', 5203), timeout=3).close(); break
    except OSError: time.sleep(0.1)
"""], timeout=30)
out, _ = srv.communicate(timeout=30)
sys.exit(0 if out.strip() == expected else 1)
PY
}
check "pod c reaches beyond the plane through node2, masqueraded (node1's underlay address sees node2's)" \
  seen_as $N1 198.51.100.1 kdemo-c 198.51.100.2
check "and over IPv6: node1's underlay address 2001:db8:100::1 sees node2's" \
  seen_as $N1 2001:db8:100::1 kdemo-c 2001:db8:100::2
check "a Service: pod e → 10.96.0.10:5202 reaches both backends, pod a on node1 and pod c on node2" \
  both_backends 10.96.0.10 "$IP_A" "$IP_C"
check "the Service over IPv6: pod e → [fd00:96::10]:5202 reaches pod a on node1 and pod c on node2" \
  both_backends fd00:96::10 "$IP6_A" "$IP6_C"
check "pods still talk to each other directly: pod e pings pod c" in_ns kdemo-e ping -c 3 -i 0.2 -W 2 "$IP_C"

step 8/9 "a DPDK VNF on a vhost-user port; then the manager goes away and comes back"
if command -v dpdk-testpmd >/dev/null; then
  # A VNF with a MAC of its own (VRRP, a licensed MAC): the manager records it, so node2
  # knows the VNF by it (remote MACs, ARP suppression).
  mctl port create --network red --container kdemo-vnf --interface eth0 --pod demo/vnf --node node1 --ip 10.0.0.9 \
    --mac 02:00:00:00:72:50 >/dev/null || exit 1
  ctl node1 port add vnf --vhost-user "$RUN/vnf.sock" --access red >/dev/null || exit 1
  start_vnf() {
    dpdk-testpmd -l 0,1 --no-pci --no-huge -m 512 --single-file-segments --file-prefix=kdemo \
      --vdev="net_virtio_user0,path=$RUN/vnf.sock,mac=$VNF_MAC" -- \
      --forward-mode=icmpecho --no-flush-rx --nb-cores=1 --total-num-mbufs=4096 --stats-period=3600 \
      >>"$RUN/testpmd.log" 2>&1 </dev/null &
    TESTPMD_PID=$!
    # The port says connected once DPDK has started its receive ring (filled, and kicked at
    # the end of rte_eth_dev_start): from then on nothing sent to it is lost. --no-flush-rx
    # keeps testpmd from throwing away what came before its forwarding loop began (a
    # testpmd habit, not a VNF's).
    for _ in $(seq 100); do
      ctl node1 -o json node show 2>/dev/null | grep -q '"vhost_connected": true' && break; sleep 0.1
    done
  }
  # Every ping answered (ping itself succeeds with one answer of three).
  pings_all() { in_ns "$1" ping -c 3 -i 0.2 -W 2 "$2" | grep -q ' 3 received'; }
  VNF_MAC=$(mport kdemo-vnf mac)
  check "the manager records the VNF's own MAC (and pushes it to node2)" [ "$VNF_MAC" = 02:00:00:00:72:50 ]
  start_vnf
  echo "  dpdk-testpmd (virtio-user, forward mode icmpecho: it answers ARP and ping for any address)"
  echo "  on a vhost-user port of node1's red plane (address 10.0.0.9 from the manager, its own MAC $VNF_MAC)"
  check "vhost-user: pod c (node2) pings the DPDK VNF on node1 across VXLAN, the moment it is connected" \
    pings_all kdemo-c 10.0.0.9
  kill -9 "$TESTPMD_PID"; wait "$TESTPMD_PID" 2>/dev/null
  for _ in $(seq 100); do
    ctl node1 -o json node show 2>/dev/null | grep -q '"vhost_connected": true' || break; sleep 0.1
  done
  start_vnf
  echo "  the VNF killed (SIGKILL) and started again"
  check "vhost-user: pod c pings the restarted VNF, the moment it is connected again" pings_all kdemo-c 10.0.0.9
else
  echo "  (dpdk-testpmd is not installed: no vhost-user VNF this time)"
fi
{ kill -9 "$(cat "$RUN/manager.pid")"; wait "$(cat "$RUN/manager.pid")"; } 2>/dev/null; rm -f "$RUN/manager.pid"; sleep 1
echo "  knitter-manager killed (SIGKILL)"
check "with the manager down, pod a still pings pod c (the nodes keep their last state)" in_ns kdemo-a ping -c 3 -i 0.2 -W 2 "$IP_C"
ip netns exec $N1 "$BIN/knitter-manager" --data-dir "$RUN/manager" --listen 198.51.100.1:9480 \
  --grpc-listen $MANAGER --bootstrap-token-file "$RUN/bootstrap-token" >>"$RUN/manager.log" 2>&1 &
echo $! >"$RUN/manager.pid"
for _ in $(seq 300); do both_alive 2>/dev/null && break; sleep 0.1; done
echo "  knitter-manager restarted on the same store"
check "after the restart: both nodes back on their sync streams" both_alive
check "after the restart: pod a pings pod c" in_ns kdemo-a ping -c 3 -i 0.2 -W 2 "$IP_C"


step 9/9 "what node1 and the manager look like"
ctl node1 node show | sed 's/^/  /'
echo
ctl node1 stats | sed 's/^/  /'
echo
ctl node1 fdb show | sed 's/^/  /'
echo
mctl node list | sed 's/^/  /'

echo
if [ $FAIL = 0 ]; then
  bold "Summary: all $PASS checks passed. Tearing down."
else
  bold "Summary: $FAIL of $((PASS + FAIL)) checks FAILED (logs: $RUN/*.log, shown below). Tearing down."
  tail -n 20 "$RUN"/*.log
fi
[ $FAIL = 0 ]
