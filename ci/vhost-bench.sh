#!/usr/bin/env bash
# vhost-user ↔ vhost-user L2 through Knitter against the yardstick (testpmd's own net_vhost
# io forwarding: no switching, two copies per frame), interleaved in one time window as
# docs/perf/README.md explains (this VM's CPU supply swings). Not a CI job: run it by hand on a quiet machine.
#   ci/vhost-bench.sh [cycles] [sizes...]        (default: 3 cycles, 64 and 512 bytes)
# Layout: the switch under test forwards on CPU 1 (Knitter: one busy PMD thread; the
# yardstick: one testpmd forwarding lcore); the generator forwards on CPU 0: a pcap port
# replays frames A → B into virtio-user port A, what reaches virtio-user port B goes to a
# pcap port that drops it, and one frame B → A at the start lets the switch learn B.
# Reports the rate received on B (Mpps, after a 3 s warm-up, over 10 s) and, for Knitter,
# its PMD's busy cycles per packet.
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-3}
shift || true
sizes=${*:-64 512}
command -v dpdk-testpmd >/dev/null || { echo "dpdk-testpmd is not installed (apt-get install dpdk-dev)" >&2; exit 2; }
cargo build --release -q -p knitter-vhost --example vhost_switch
work=$(mktemp -d /tmp/knitter-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work" /var/run/dpdk/kb-gen /var/run/dpdk/kb-sw
}
trap cleanup EXIT

# Frames with the FCS counted (60 bytes in the buffer for 64): UDP from A to B, and one
# from B to A.
python3 - "$work" $sizes <<'PY'
import struct, sys
work, sizes = sys.argv[1], [int(s) for s in sys.argv[2:]]
A, B = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
def frame(dst, src, size):
    n = size - 4
    ip_len = n - 14
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, ip_len, 0, 0x4000, 64, 17, 0, bytes([10,0,0,1]), bytes([10,0,0,2]))
    s = sum(struct.unpack("!10H", ip)); s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16)
    ip = ip[:10] + struct.pack("!H", ~s & 0xffff) + ip[12:]
    udp = struct.pack("!HHHH", 1024, 1024, ip_len - 20, 0)
    f = dst + src + b"\x08\x00" + ip + udp
    return f + bytes(n - len(f))
def pcap(path, frames):
    with open(path, "wb") as o:
        o.write(struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1))
        for f in frames:
            o.write(struct.pack("<IIII", 0, 0, len(f), len(f)) + f)
for size in sizes:
    pcap(f"{work}/a-{size}.pcap", [frame(B, A, size)] * 32)
pcap(f"{work}/b.pcap", [frame(A, B, 64)])
PY

# DPDK memory: hugepages when there are enough free (as perf-lab.md measured), else plain
# pages (slower: page faults and TLB misses on both sides of every copy).
if [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 1100 ]; then
  MEM="--in-memory -m 1024 --single-file-segments"
else
  echo "(no free hugepages: echo 1200 > /proc/sys/vm/nr_hugepages for the real numbers)" >&2
  MEM="--no-huge -m 1024 --single-file-segments"
fi

# The generator: ports 0 pcap (replays A → B) ↔ 1 virtio-user A; 2 virtio-user B ↔ 3 pcap
# (sends B → A once, drops what it receives).
start_generator() {
  local size=$1
  stdbuf -oL -eL dpdk-testpmd -l 0,1 --main-lcore 1 --no-pci $MEM --file-prefix=kb-gen \
    --vdev="net_pcap0,rx_pcap=$work/a-$size.pcap,tx_pcap=/dev/null,infinite_rx=1" \
    --vdev="net_virtio_user0,path=$work/a.sock,queues=1" \
    --vdev="net_virtio_user1,path=$work/b.sock,queues=1" \
    --vdev="net_pcap1,rx_pcap=$work/b.pcap,tx_pcap=/dev/null" \
    -- -i --nb-cores=1 --no-flush-rx --total-num-mbufs=16384 < "$work/gen.in" > "$work/gen.out" 2>&1 &
  pids+=($!)
}

# One trial: the switch is already listening on a.sock and b.sock.
trial() {
  local size=$1
  rm -f "$work/gen.in"; mkfifo "$work/gen.in"
  start_generator "$size"
  exec 7>"$work/gen.in"
  echo "set fwd io" >&7
  echo "start" >&7
  sleep 3
  echo "clear port stats all" >&7
  sleep 10
  echo "show port stats 2" >&7
  sleep 1
  echo "stop" >&7
  echo "quit" >&7
  exec 7>&-
  wait "${pids[-1]}" 2>/dev/null || true
  cp "$work/gen.out" /tmp/knitter-bench-gen.out 2>/dev/null || true
  # Port 2's RX-packets after the clear, over 10 s.
  awk '/statistics for port 2 / {p=1} p && /RX-packets:/ {print $2 / 10e6; exit}' "$work/gen.out"
}

knitter_trial() {
  local size=$1
  rm -f "$work"/a.sock "$work"/b.sock
  # Runs 20 s (the trial's length), then prints its PMD's cycles per packet.
  taskset -c 1 target/release/examples/vhost_switch "$work" 2 20 > "$work/sw.out" 2>&1 &
  local sw=$!
  pids+=($sw)
  sleep 1
  ln -sf "$work/vu0.sock" "$work/a.sock"; ln -sf "$work/vu1.sock" "$work/b.sock"
  local mpps
  mpps=$(trial "$size")
  wait "$sw" 2>/dev/null || true
  echo "$mpps"
}

yardstick_trial() {
  local size=$1
  rm -f "$work"/a.sock "$work"/b.sock
  # Non-interactive testpmd exits at its first byte of input: give it none.
  sleep 40 | stdbuf -oL dpdk-testpmd -l 0,1 --main-lcore 0 --no-pci $MEM --file-prefix=kb-sw \
    --vdev="net_vhost0,iface=$work/a.sock,queues=1" --vdev="net_vhost1,iface=$work/b.sock,queues=1" \
    -- --forward-mode=io --nb-cores=1 --auto-start --total-num-mbufs=16384 \
    > "$work/ys.out" 2>&1 &
  local sw=$!
  pids+=($sw)
  sleep 2
  local mpps
  mpps=$(trial "$size")
  kill -9 "$sw" 2>/dev/null || true
  wait "$sw" 2>/dev/null || true
  rm -rf /var/run/dpdk/kb-sw
  echo "$mpps"
}

printf '%-6s %-6s %-10s %-10s %-12s\n' cycle size knitter yardstick knitter-cycles/pkt
for c in $(seq 1 "$cycles"); do
  for size in $sizes; do
    k=$(knitter_trial "$size")
    kc=$(sed -n 's/.*PMD busy cycles per packet: \([0-9]*\).*/\1/p' "$work/sw.out" | tail -n 1)
    y=$(yardstick_trial "$size")
    printf '%-6s %-6s %-10s %-10s %-12s\n' "$c" "$size" "${k:-?}" "${y:-?}" "${kc:-?}"
  done
done
