#!/usr/bin/env bash
# Installs what a fresh Debian machine needs to build, test and demo Knitter.
# Idempotent; run as root (CI runs as root). Rust itself comes from the machine image (rustup).
set -euo pipefail

# Debian packages: a C toolchain for crates with C parts, and the tools the kernel-port tests
# (ip, ping, ethtool, sysctl, python3 for TCP/UDP endpoints, nft for host ports' NAT, tcpdump to compile
# capture filters and read captures back), DPDK's testpmd (dpdk-dev: the
# vhost-user interop test's frontend) and the perf scripts use; protoc compiles the gRPC API;
# libdpdk-dev and libclang-dev build the `dpdk` port kind (knitter-dpdk-sys runs bindgen).
PACKAGES="build-essential pkg-config valgrind bc iproute2 iputils-ping ethtool procps python3 openssl curl nftables tcpdump dpdk-dev libdpdk-dev libclang-dev protobuf-compiler"
# The test suite also boots a Linux guest under QEMU on a vhost-user port (ci/guest.sh
# builds its kernel and initramfs), starts its own etcd for the manager's store, and builds
# and runs the container images with podman.
if [ "${KNITTER_TEST_DEPS:-0}" = 1 ]; then
  PACKAGES="$PACKAGES qemu-system-x86 busybox-static etcd-server"
  # ci/images.sh builds and runs the container images (deploy/images).
  PACKAGES="$PACKAGES podman runc mmdebstrap"
fi
missing=""
for p in $PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null
fi

command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }

if [ "${KNITTER_FUZZ:-1}" = 1 ] && ! command -v cargo-fuzz >/dev/null; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked -q
fi

# kubectl renders the kustomizations (Debian's is 1.20, kustomize v2: the manifests keep to
# its syntax) and runs docs/kubernetes.md's install and uninstall against the API server
# stand-in (control/manager/tests/install.rs); a machine that has one already keeps it.
if [ "${KNITTER_TEST_DEPS:-0}" = 1 ] && ! command -v kubectl >/dev/null; then
  echo "== installing kubectl (Debian's kubernetes-client)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null; }
fi

# The Kubernetes manifests' checks (ci/k8s-validate.py; the controller's tests call it):
# kubernetes-validate carries the Kubernetes OpenAPI schemas and brings jsonschema and PyYAML;
# cel-python evaluates the CRDs' x-kubernetes-validations rules (CEL) as the apiserver does.
if [ "${KNITTER_TEST_DEPS:-0}" = 1 ] && ! python3 -c 'import kubernetes_validate, jsonschema, yaml, celpy' 2>/dev/null; then
  echo "== installing kubernetes-validate and cel-python (PyPI)"
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate==1.37.0 cel-python==0.5.0 ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages kubernetes-validate==1.37.0 cel-python==0.5.0
fi
