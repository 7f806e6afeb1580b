#!/usr/bin/env bash
# The main job: install what is needed, then run the data-plane demo.
set -euo pipefail
cd "$(dirname "$0")/.."
KNITTER_FUZZ=0 bash ci/setup.sh
cargo run --release -q -p knitter-vswitch --example demo
