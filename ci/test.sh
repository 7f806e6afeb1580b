#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, bounded fuzzing, the demo, then every test.
# Tests that start PMD threads run one at a time (nextest group `serial`, see
# .config/nextest.toml); every test has a time limit.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/as-root.sh
export CARGO_TERM_COLOR=never
# One clean build: incremental state and full debug info only fill the disk (a run needs
# ~10 GB free with these; a failed link there reads "No space left on device").
export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only
echo "== disk: $(df -h --output=avail . | tail -n 1 | tr -d ' ') free where the build runs"
KNITTER_TEST_DEPS=1 bash ci/setup.sh
bash ci/guest.sh

FUZZ_SECS=${KNITTER_FUZZ_SECS:-45}
if [ "$FUZZ_SECS" -gt 0 ]; then
  # The switch's parsers and pipeline; what a vhost-user frontend sends (messages with any
  # descriptors, rings over any memory).
  for ct in vswitch:wire vswitch:pipeline ports/vhost:messages ports/vhost:virtqueue; do
    crate=${ct%%:*} t=${ct#*:}
    echo "== fuzz $crate/$t for ${FUZZ_SECS}s"
    corpus=$(mktemp -d)
    (cd "$crate" && RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "$corpus" "fuzz/corpus/$t" -- \
      -max_total_time="$FUZZ_SECS" -print_final_stats=0 2>&1 | tail -n 3)
    rm -rf "$corpus"
  done
fi

echo "== loom models (lock-free structures, every interleaving up to 3 preemptions)"
RUSTFLAGS="--cfg loom" cargo test -q -p knitter-vswitch --test loom --release --target-dir target/loom

echo "== Kubernetes manifests (rendered, against Kubernetes' schemas)"
python3 ci/k8s-validate.py manifests

echo "== no module cycles (ci/module-cycles.py)"
python3 ci/module-cycles.py

echo "== format (rustfmt.toml) and clippy"
cargo fmt --all -- --check
for d in vswitch/fuzz ports/vhost/fuzz; do (cd "$d" && cargo fmt -- --check); done
cargo clippy -q --workspace --all-targets -- -D warnings

echo "== dependency policy (deny.toml: licences, bans, sources, advisories)"
bash ci/deny.sh

echo "== demo (in-process data plane)"
timeout 300 cargo run --release -q -p knitter-vswitch --example demo

echo "== configuration changes at scale (small: keeps the benchmark working; docs/perf/scale.md)"
timeout 120 cargo run --release -q -p knitter-vswitch --example apply_bench -- --bds 512 --peers 2048 --applies 20

echo "== demo (two nodes, knitter-vswitchd + knitterctl)"
cargo build --release -q -p knitter-vswitchd -p knitter-manager -p knitterctl
timeout 300 bash ci/demo-run.sh

echo "== container images (podman, from a Debian-made base) and the node agent running in its image"
timeout 900 bash ci/images.sh

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --profile ci -j 2
else
  cargo test --workspace -j 2
fi
