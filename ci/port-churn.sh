#!/usr/bin/env bash
# By hand (not CI): time 100 vhost-user port adds and 100 deletes through knitterctl against
# a release knitter-vswitchd, and 100 `node show` calls (knitterctl's own start and connect).
#   cargo build --release -p knitter-vswitchd -p knitter-manager -p knitterctl
#   bash ci/port-churn.sh [--no-state | "--state-file /tmp/x.json"]
set -euo pipefail
cd "$(dirname "$0")/.."
B=target/release D=$(mktemp -d) S=${1:---no-state}
$B/knitter-vswitchd --socket $D/api.sock $S --no-metrics --no-hugepages --buffers 4096 >/dev/null 2>&1 &
pid=$!; trap 'kill $pid; rm -rf $D' EXIT
for _ in $(seq 50); do $B/knitterctl --socket $D/api.sock node show >/dev/null 2>&1 && break; sleep 0.1; done
$B/knitterctl --socket $D/api.sock bridge add red >/dev/null
t0=$(date +%s%N)
for i in $(seq 100); do $B/knitterctl --socket $D/api.sock port add v$i --vhost-user $D/v$i.sock --access red >/dev/null; done
t1=$(date +%s%N)
for i in $(seq 100); do $B/knitterctl --socket $D/api.sock port del v$i >/dev/null; done
t2=$(date +%s%N)
t3=$(date +%s%N); for i in $(seq 100); do $B/knitterctl --socket $D/api.sock node show >/dev/null; done; t4=$(date +%s%N)
ms() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 100 / 1e6 }'; }
echo "port add $(ms $((t1 - t0))) ms, port del $(ms $((t2 - t1))) ms, node show $(ms $((t4 - t3))) ms per call ($S)"
