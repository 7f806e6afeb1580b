#!/usr/bin/env bash
# Pod → Service → pod beside pod → pod and node → pod on one node (docs/perf/pods.md "Services:
# the host's hop"): what the host's hop costs a pod network's traffic. Not a CI job: run it by hand
# on a quiet machine, as root, after `cargo build --release`.
#   ci/service-bench.sh [seconds]            (default 5 s a measurement)
# Layout: a node namespace running knitter-vswitchd (one PMD thread on CPU 1) with a bridge
# domain, a host port (knitter0, 10.1.0.254/24) and the gateway 10.1.0.1; two pods (veth,
# AF_XDP ports) a = 10.1.0.2 and b = 10.1.0.3; a ClusterIP Service 10.96.0.10:5201 → b,
# kube-proxy's DNAT in prerouting reduced to one rule. Client and server run on CPU 0
# (python3: the absolute numbers are the client's as much as the path's; compare the rows).
# Per path: TCP throughput (one stream, 64 KiB writes) and TCP request/response (1 byte each
# way, TCP_NODELAY): round trips a second and the median and 99th percentile round trip.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
B=$PWD/target/release
[ -x "$B/knitter-vswitchd" ] || { echo "build first: cargo build --release" >&2; exit 2; }
command -v nft >/dev/null || { echo "nft is not installed (apt-get install nftables)" >&2; exit 2; }
NS="ksb-node ksb-a ksb-b"
SOCK=/run/ksb.sock
cleanup() { kill "${DAEMON:-}" 2>/dev/null || true; wait "${DAEMON:-}" 2>/dev/null || true; for ns in $NS; do ip netns del "$ns" 2>/dev/null || true; done; }
trap cleanup EXIT
cleanup
for ns in $NS; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
for p in a b; do
  ip link add "ksb-$p" type veth peer name eth0 netns "ksb-$p"
  ip link set "ksb-$p" netns ksb-node
  ip -n ksb-node link set "ksb-$p" up; ip -n "ksb-$p" link set eth0 up
  ip netns exec "ksb-$p" ethtool -K eth0 tx off tso off gso off >/dev/null 2>&1 || true   # as the CNI does
done
ip -n ksb-a addr add 10.1.0.2/24 dev eth0; ip -n ksb-a route add default via 10.1.0.1
ip -n ksb-b addr add 10.1.0.3/24 dev eth0; ip -n ksb-b route add default via 10.1.0.1
ip netns exec ksb-node "$B/knitter-vswitchd" --socket "$SOCK" --no-state --no-metrics --no-hugepages \
  --buffers 16384 --pmd-cores 1 > /tmp/ksb.log 2>&1 &
DAEMON=$!
ctl() { "$B/knitterctl" --socket "$SOCK" "$@" >/dev/null; }
for _ in $(seq 100); do ctl node show 2>/dev/null && break; sleep 0.1; done
ctl bridge add pods
ctl port add a --af-xdp ksb-a --access pods
ctl port add b --af-xdp ksb-b --access pods
ctl port add knitter0 --host knitter0 --address 10.1.0.254/24 --access pods
ctl bridge add pods --gateway 10.1.0.1 --gateway-port knitter0 --replace
ip netns exec ksb-node nft -f - <<'NFT'
table ip ksb_proxy {
  chain services { type nat hook prerouting priority dstnat; ip daddr 10.96.0.10 tcp dport 5201 dnat to 10.1.0.3:5201; }
}
NFT
ip netns exec ksb-a ping -c 2 -W 2 10.1.0.3 >/dev/null

bench() { # CLIENT-NS TARGET LABEL
  python3 - "$1" "$2" "$3" "$secs" <<'PY'
import socket, statistics, subprocess, sys, time
client_ns, target, label, secs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
server = r'''
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.1.0.3", 5201)); s.listen(1); s.settimeout(30)
for mode in ("stream", "rr"):
    c, _ = s.accept(); c.settimeout(30)
    if mode == "stream":
        n = 0
        while True:
            d = c.recv(1 << 20)
            if not d: break
            n += len(d)
        c.sendall(str(n).encode()); c.close()
    else:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            d = c.recv(1)
            if not d: break
            c.sendall(d)
        c.close()
'''
client = r'''
import socket, statistics, sys, time
target, secs = sys.argv[1], float(sys.argv[2])
def connect():
    for _ in range(50):
        try: return socket.create_connection((target, 5201), timeout=5)
        except OSError: time.sleep(0.1)
    raise SystemExit("no connection")
c = connect(); buf = b"k" * 65536; sent = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < secs:
    c.sendall(buf); sent += len(buf)
c.shutdown(socket.SHUT_WR); got = int(c.recv(64)); dt = time.perf_counter() - t0; c.close()
c = connect(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); rtts = []
t0 = time.perf_counter()
while time.perf_counter() - t0 < secs:
    a = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - a)
c.close(); rtts.sort()
print(f"{got * 8 / dt / 1e9:.2f} {len(rtts) / secs:.0f} {rtts[len(rtts) // 2] * 1e6:.1f} {rtts[len(rtts) * 99 // 100] * 1e6:.1f}")
'''
srv = subprocess.Popen(["ip", "netns", "exec", "ksb-b", "taskset", "-c", "0", "python3", "-c", server])
time.sleep(0.3)
out = subprocess.run(["ip", "netns", "exec", client_ns, "taskset", "-c", "0", "python3", "-c", client, target, str(secs)], capture_output=True, text=True, timeout=4 * secs + 60)
srv.wait(timeout=30)
gbps, rps, p50, p99 = out.stdout.split()
print(f"| {label} | {gbps} | {rps} | {p50} | {p99} |")
PY
}
echo "| path | TCP Gbit/s | round trips/s | RTT p50 µs | RTT p99 µs |"
echo "|---|---|---|---|---|"
bench ksb-a 10.1.0.3 "pod → pod (switched)"
bench ksb-a 10.96.0.10 "pod → Service → pod (through the node: DNAT, masquerade)"
bench ksb-node 10.1.0.3 "node → pod (a kubelet's probe, a host-network pod)"
