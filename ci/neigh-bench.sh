#!/usr/bin/env bash
# Idle CPU of knitter-vswitchd following the kernel for a shared-address VTEP with N peers
# (all resolved: permanent neighbors in a namespace the script makes and deletes), per
# thread, over S seconds (docs/perf/control-plane.md "Following the kernel's neighbors"). As root:
#   cargo build --release -p knitter-vswitchd -p knitterctl
#   ci/neigh-bench.sh target/release [N=10000] [S=20]
set -euo pipefail
bin=$1; n=${2:-10000}; secs=${3:-20}
ns=kn-nb-$$; dir=$(mktemp -d)
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; ip netns del "$ns" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link add ul0 type veth peer name ul1
ip -n "$ns" addr add 10.77.0.1/16 dev ul0
ip -n "$ns" link set ul0 up; ip -n "$ns" link set ul1 up
python3 -c "
n=$n
print('\n'.join(f'neigh add 10.77.{i//250+1}.{i%250+2} lladdr 02:00:00:{i>>16&255:02x}:{i>>8&255:02x}:{i&255:02x} dev ul0 nud permanent' for i in range(n)))" > "$dir/batch"
ip -n "$ns" -batch "$dir/batch"
python3 -c "
n=$n
peers=', '.join(f'{{ ip = \"10.77.{i//250+1}.{i%250+2}\" }}' for i in range(n))
print(f'''[[bridges]]
name = \"red\"
vni = 5001

[[ports]]
name = \"ul0\"
device = {{ kind = \"af_packet\", ifname = \"ul0\", netns = \"$ns\" }}
mode = {{ kind = \"underlay\" }}

[vtep]
local_ip = \"10.77.0.1\"
underlay_port = \"ul0\"
shared_address = true
peers = [{peers}]
''')" > "$dir/vswitchd.toml"
"$bin/knitter-vswitchd" -c "$dir/vswitchd.toml" --socket "$dir/api.sock" --no-state --no-metrics --buffers 8192 --no-hugepages 2>"$dir/log" &
pid=$!
until "$bin/knitterctl" --socket "$dir/api.sock" node show >/dev/null 2>&1; do sleep 0.2; done
sleep 3   # the first full read done
ticks=$(getconf CLK_TCK)
# Per thread (threads that come and go, such as tokio's blocking pool, are in the process's
# total only).
cpu() { for t in /proc/$pid/task/*; do c=$(cat $t/comm 2>/dev/null | tr ' ' _) && v=$(awk '{print $14+$15}' $t/stat 2>/dev/null) && echo "$(basename $t) $c $v"; done | sort; }
total() { awk '{print $14+$15}' /proc/$pid/stat; }
a=$(cpu); ta=$(total); sleep "$secs"; b=$(cpu); tb=$(total)
resolved=$("$bin/knitterctl" --socket "$dir/api.sock" vtep show | grep -c "next hop 02:00:00" || true)
echo "peers $n, resolved $resolved, over $secs s:"
join <(echo "$a") <(echo "$b") | awk -v t="$ticks" -v s="$secs" '{d=($5-$3)/t; by[$2]+=d; tot+=d} END {for (k in by) printf "  %-16s %6.2f s CPU (%5.1f %%)\n", k, by[k], 100*by[k]/s}'
awk -v a="$ta" -v b="$tb" -v t="$ticks" -v s="$secs" 'BEGIN {d=(b-a)/t; printf "  %-16s %6.2f s CPU (%5.1f %%)\n", "process", d, 100*d/s}'
