#!/usr/bin/env bash
# Builds Knitter's container images with podman: localhost/knitter-node:VERSION and
# localhost/knitter-manager:VERSION, from release binaries built on this host (Debian's rustc
# is older than the project's; the binaries need only libc, libm and libgcc_s, and
# knitter-vswitchd DPDK's runtime libraries and the PMDs its `dpdk` ports load: the node
# image has them, DPDK_PACKAGES below). knitter-cni is linked statically: the installer
# copies it onto each node's host, whose libc may be older than this one's.
#
# The base: BASE=<image> uses that one (docker.io/library/debian:bookworm-slim where a
# registry is reachable); by default the script makes localhost/knitter-base:bookworm from
# Debian's packages (mmdebstrap, the `essential` set, no documentation) and `podman import`s
# it, so nothing is pulled from a registry. NO_CARGO=1 uses the binaries already in
# target/release (and target/HOST-TRIPLE/release/knitter-cni). RUN steps use chroot isolation (no OCI runtime needed at build time).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
BASE=${BASE:-localhost/knitter-base:bookworm}
# DPDK 22.11's runtime for the node image: ethdev (and what it pulls: EAL, mbuf, mempool,
# ring...), the mempool driver pools are made with, the buses, and the PMDs of the devices
# users name (Intel NICs and VFs, virtio, and the vdevs: TAP, memif, AF_PACKET, vhost, pcap).
DPDK_PACKAGES="librte-ethdev23 librte-mempool-ring23 librte-bus-vdev23 librte-bus-pci23 librte-net-iavf23 librte-net-i40e23 librte-net-ice23 librte-net-virtio23 librte-net-tap23 librte-net-memif23 librte-net-af-packet23 librte-net-vhost23 librte-net-pcap23"
# And nft, which host ports' rules are written with (docs/pod-network.md), and tcpdump, which
# compiles `knitterctl capture`'s filters and reads its captures (docs/operations.md).
NODE_PACKAGES="$DPDK_PACKAGES nftables tcpdump"
NODE_BASE=${NODE_BASE:-$BASE}

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
if [ "$NODE_BASE" = localhost/knitter-base:bookworm ]; then
  NODE_BASE=localhost/knitter-node-base:bookworm-nft-tcpdump
  if ! podman image exists "$NODE_BASE"; then
    echo "== making $NODE_BASE from Debian packages (mmdebstrap, with DPDK's runtime, nft and tcpdump)"
    ntar=$(mktemp --suffix .tar)
    mmdebstrap --quiet --variant=essential --include="$(echo $NODE_PACKAGES | tr ' ' ,)" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      bookworm "$ntar"
    podman import --quiet "$ntar" "$NODE_BASE" >/dev/null
    rm -f "$ntar"
  fi
fi

# knitter-cni runs on the hosts, not in the image: linked statically against glibc
# (`crt-static`) it starts whatever the host's libc (RHEL 8's glibc 2.28, Ubuntu 20.04's
# 2.31, musl), as the reference CNI plugins do. It reads its config and talks to the node
# agent's Unix socket: nothing that needs glibc's NSS modules at run time. Built for the
# host triple named explicitly, so the flag reaches neither build scripts nor proc-macros.
HOST_TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
CNI_BIN=target/$HOST_TRIPLE/release/knitter-cni
if [ "${NO_CARGO:-0}" != 1 ]; then
  cargo build --release -q -p knitter-vswitchd -p knitter-manager -p knitterctl
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -q -p knitter-cni --target "$HOST_TRIPLE"
fi
command -v readelf >/dev/null || { echo "build.sh: readelf (binutils) is needed to check knitter-cni is static" >&2; exit 1; }
if readelf -l "$CNI_BIN" | grep INTERP >/dev/null || readelf -d "$CNI_BIN" | grep NEEDED >/dev/null; then
  echo "build.sh: $CNI_BIN is linked dynamically; it would not start on a host with an older libc" >&2
  exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx" ${tar:+"$tar"}' EXIT
mkdir "$ctx/node" "$ctx/manager"
cp target/release/knitter-vswitchd target/release/knitterctl "$CNI_BIN" deploy/images/knitter-node/knitter-install-cni "$ctx/node/"
cp target/release/knitter-manager target/release/knitterctl "$ctx/manager/"
# knitterctl's completions and man pages, made by the binary itself.
for image in node manager; do
  mkdir -p "$ctx/$image/man1"
  target/release/knitterctl completion bash > "$ctx/$image/knitterctl.bash"
  target/release/knitterctl man "$ctx/$image/man1" >/dev/null
done
# The release profile keeps line tables for profiling; images do without.
strip --strip-debug "$ctx"/node/knitter-vswitchd "$ctx"/node/knitterctl "$ctx"/node/knitter-cni "$ctx"/manager/knitter-manager "$ctx"/manager/knitterctl
for image in node manager; do
  echo "== localhost/knitter-$image:$VERSION"
  base=$BASE
  [ "$image" = node ] && base=$NODE_BASE
  podman build --quiet --isolation=chroot --format docker --build-arg "BASE=$base" --build-arg "NODE_PACKAGES=$NODE_PACKAGES" -t "localhost/knitter-$image:$VERSION" \
    -f "deploy/images/knitter-$image/Containerfile" "$ctx/$image" >/dev/null
done
podman images --filter reference='localhost/knitter-*' --format '{{.Repository}}:{{.Tag}} {{.Size}}'
