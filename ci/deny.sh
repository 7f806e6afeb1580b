#!/usr/bin/env bash
# The dependency policy (deny.toml) with cargo-deny: licences, bans (wildcards refused,
# duplicate versions and yanked crates shown as warnings), sources, and RustSec's advisories.
# Installs cargo-deny when missing. The advisory database comes from GitHub (with git):
# enforced when it is at most 30 days old; an older one (GitHub unreachable, a copy fetched
# before) is checked against and its findings shown, not enforced; with none the run says
# that advisories were not checked.
set -euo pipefail
cd "$(dirname "$0")/.."
DENY_VERSION=0.20.2
if ! cargo deny --version 2>/dev/null | grep -q "$DENY_VERSION"; then
  echo "== installing cargo-deny $DENY_VERSION"
  cargo install -q cargo-deny --locked --version "$DENY_VERSION"
fi
cargo deny check --hide-inclusion-graph licenses bans sources
timeout 120 cargo deny --log-level error fetch db >/dev/null 2>&1 || true
db=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/advisory-dbs/advisory-db-* 2>/dev/null | head -n 1 || true)
if [ -z "$db" ] || ! newest=$(git -C "$db" log -1 --format=%ct 2>/dev/null); then
  echo "advisories: NOT CHECKED (RustSec's database on GitHub cannot be reached from here)"
  exit 0
fi
age=$(( ($(date +%s) - newest) / 86400 ))
if [ "$age" -le 30 ]; then
  cargo deny --offline check advisories
else
  echo "advisories: the database is $age days old (GitHub unreachable): findings shown, not enforced"
  cargo deny --offline check advisories || echo "advisories: NOT ENFORCED (see above)"
fi
