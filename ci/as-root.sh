# Sourced by ci/demo.sh and ci/test.sh, which need root (apt-get, network namespaces): run by
# another user, they run themselves again with sudo, with that user's Rust toolchain.
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0 needs root (apt-get, network namespaces) and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}" "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" \
    ${CI:+"CI=$CI"} ${KNITTER_FUZZ_SECS:+"KNITTER_FUZZ_SECS=$KNITTER_FUZZ_SECS"} bash "ci/$(basename "$0")" "$@"
fi
