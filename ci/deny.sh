#!/usr/bin/env bash
# The dependency policy (deny.toml) with cargo-deny: licences, bans (wildcards; duplicate
# versions shown), sources, and RustSec's advisories. Installs cargo-deny when missing.
# The advisory database comes from GitHub; where GitHub cannot be reached the run says so
# and checks the rest (a database fetched before, in ~/.cargo/advisory-dbs, is used).
set -euo pipefail
cd "$(dirname "$0")/.."
DENY_VERSION=0.20.2
if ! cargo deny --version 2>/dev/null | grep -q "$DENY_VERSION"; then
  echo "== installing cargo-deny $DENY_VERSION"
  cargo install -q cargo-deny --locked --version "$DENY_VERSION"
fi
cargo deny --log-level error check licenses bans sources
if timeout 120 cargo deny --log-level error fetch db >/dev/null 2>&1; then
  cargo deny --log-level error check advisories
elif ls -d "${CARGO_HOME:-$HOME/.cargo}"/advisory-dbs/advisory-db-* >/dev/null 2>&1; then
  echo "advisories: GitHub unreachable; checking against the database fetched before"
  cargo deny --log-level error --offline check advisories
else
  echo "advisories: NOT CHECKED (RustSec's database on GitHub cannot be reached from here)"
fi
