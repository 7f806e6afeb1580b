#!/usr/bin/env bash
# Instructions per packet of the switch's fast path (rx burst + pipeline + tx burst), counted
# by callgrind on a fixed workload: repeatable whatever the VM's CPU supply does.
#   ci/insn-count.sh [packets] [scenario...]
# NO_CACHE=1 measures the slow path alone (the exact-match cache off); EMC_ENTRIES=2 a cache
# every flow misses (what a miss costs: lookup, slow path, fill; with MEGAFLOW_ENTRIES=0, or
# the port off the cache takes the second level); MEGAFLOW_ENTRIES=N sizes each half of the
# second level (0: none); PER_NODE=1 the per-node
# dispatcher (what fusing the nodes saves); CAPTURE=1 with a packet capture of the input port
# running (what copying each frame costs). CARGO_TARGET_DIR is honoured (an A/B against an
# older tree built into its own target directory).
set -euo pipefail
cd "$(dirname "$0")/.."
packets=${1:-320000}
shift || true
scenarios=${*:-l2-1k l2-100k l2-100k-both vlan-push vlan-pop vxlan-encap vxlan-decap flood-8 l2-pod-1k l2-pod-1k-policed l2-pod-1k-net-policed vxlan-encap-pod vxlan-encap-pod-marked vxlan-decap-pod l2-mesh-1k trunk-1bd trunk-4094bd}
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -q -p knitter-vswitch --example pipeline_insn
bin=${CARGO_TARGET_DIR:-target}/release/examples/pipeline_insn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-16s %12s %10s %10s %10s\n' scenario instructions insn/packet cache-hits megaflow
for s in $scenarios; do
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$s" --toggle-collect='*Bench*poll*' \
    "$bin" "$s" "$packets" ${NO_CACHE:+--no-cache} ${EMC_ENTRIES:+--emc-entries "$EMC_ENTRIES"} ${MEGAFLOW_ENTRIES:+--megaflow-entries "$MEGAFLOW_ENTRIES"} ${PER_NODE:+--per-node} ${CAPTURE:+--capture} >"$tmp/out.$s" 2>"$tmp/err.$s" || { cat "$tmp/err.$s" >&2; exit 1; }
  ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/err.$s")
  n=$(sed -n 's/.*packets=\([0-9]*\).*/\1/p' "$tmp/out.$s")
  hits=$(sed -n 's/.*cache_hits=\([0-9.]*%\).*/\1/p' "$tmp/out.$s")
  mega=$(sed -n 's/.*megaflow_hits=\([0-9.]*%\).*/\1/p' "$tmp/out.$s")
  printf '%-16s %12s %10.1f %10s %10s\n' "$s" "$ir" "$(echo "$ir / $n" | bc -l)" "$hits" "$mega"
done
