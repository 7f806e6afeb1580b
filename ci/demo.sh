#!/usr/bin/env bash
# The main job: install what is needed, build, and run the two-node demo (ci/demo-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/as-root.sh
KNITTER_FUZZ=0 bash ci/setup.sh
echo "== building knitter-vswitchd and knitterctl (release)"
cargo build --release -q -p knitter-vswitchd -p knitter-manager -p knitterctl
# knitterctl's completions and man pages, as docs/operations.md "knitterctl" installs them.
install -d /usr/local/share/bash-completion/completions /usr/local/share/man/man1
target/release/knitterctl completion bash > /usr/local/share/bash-completion/completions/knitterctl
target/release/knitterctl man /usr/local/share/man/man1 >/dev/null
exec bash ci/demo-run.sh
