#!/usr/bin/env bash
# Builds Knitter's container images with podman: localhost/knitter-node:VERSION and
# localhost/knitter-manager:VERSION, from release binaries built on this host (Debian's rustc
# is older than the project's; the binaries need only libc, libm and libgcc_s).
#
# The base: BASE=<image> uses that one (docker.io/library/debian:bookworm-slim where a
# registry is reachable); by default the script makes localhost/knitter-base:bookworm from
# Debian's packages (mmdebstrap, the `essential` set, no documentation) and `podman import`s
# it, so nothing is pulled from a registry. NO_CARGO=1 uses the binaries already in
# target/release. RUN steps use chroot isolation (no OCI runtime needed at build time).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
BASE=${BASE:-localhost/knitter-base:bookworm}

if [ "$BASE" = localhost/knitter-base:bookworm ] && ! podman image exists "$BASE"; then
  echo "== making $BASE from Debian packages (mmdebstrap)"
  tar=$(mktemp --suffix .tar)
  trap 'rm -f "$tar"' EXIT
  mmdebstrap --quiet --variant=essential \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$tar"
  podman import --quiet "$tar" "$BASE" >/dev/null
fi

if [ "${NO_CARGO:-0}" != 1 ]; then
  cargo build --release -q -p knitter-vswitchd -p knitter-control -p knitter-cni
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx" ${tar:+"$tar"}' EXIT
mkdir "$ctx/node" "$ctx/manager"
cp target/release/knitter-vswitchd target/release/knitterctl target/release/knitter-cni deploy/images/knitter-node/knitter-install-cni "$ctx/node/"
cp target/release/knitter-manager target/release/knitterctl "$ctx/manager/"
# The release profile keeps line tables for profiling; images do without.
strip --strip-debug "$ctx"/node/knitter-vswitchd "$ctx"/node/knitterctl "$ctx"/node/knitter-cni "$ctx"/manager/*
for image in node manager; do
  echo "== localhost/knitter-$image:$VERSION"
  podman build --quiet --isolation=chroot --format docker --build-arg "BASE=$BASE" -t "localhost/knitter-$image:$VERSION" \
    -f "deploy/images/knitter-$image/Containerfile" "$ctx/$image" >/dev/null
done
podman images --filter reference='localhost/knitter-*' --format '{{.Repository}}:{{.Tag}} {{.Size}}'
