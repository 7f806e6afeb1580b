#!/usr/bin/env bash
# Builds the Linux guest that the vhost-user QEMU test boots: Debian's kernel, taken from its
# package (extracted, not installed), and an initramfs of busybox, the virtio-net modules and
# an /init that sets eth0 up from the kernel command line and reports on the serial console
# whether it reaches its peer; with ethtool (and its libraries) when the host has it, the
# guest also goes down to one queue pair and back to two (`ethtool -L eth0 combined N`).
#   ci/guest.sh [out-dir]        (default: target/guest; does nothing when it is up to date)
# Needs: apt (to fetch the kernel package), busybox-static, gzip.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/guest}
if [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ] && [ "$out/initrd.img" -nt ci/guest.sh ]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -qq
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "no linux-image package known to apt (apt-get update?)" >&2; exit 1; }
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || { echo "could not download $pkg" >&2; exit 1; }
dpkg -x "$work"/linux-image-*.deb "$work/k"
kver=$(ls "$work/k/lib/modules")
root="$work/root"
mkdir -p "$root"/bin "$root"/dev "$root"/proc "$root"/sys "$root"/lib/modules
cp "$(command -v busybox)" "$root/bin/busybox"
if e=$(command -v ethtool); then
  mkdir -p "$root/sbin"
  cp "$e" "$root/sbin/ethtool"
  for lib in $(ldd "$e" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
fi
# Load order: virtio core, PCI transport, failover (virtio_net depends on it), the driver.
modules="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net"
for m in $modules; do
  f=$(find "$work/k/lib/modules/$kver" -name "$m.ko*" | head -n 1)
  if [ -z "$f" ]; then
    grep -q "/$m.ko" "$work/k/lib/modules/$kver/modules.builtin" || { echo "module $m not found" >&2; exit 1; }
    continue
  fi
  case "$f" in
    *.xz) xz -dc "$f" > "$root/lib/modules/$m.ko" ;;
    *.zst) zstd -dcq "$f" > "$root/lib/modules/$m.ko" ;;
    *) cp "$f" "$root/lib/modules/$m.ko" ;;
  esac
done
cat > "$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $modules; do
  [ -e /lib/modules/\$m.ko ] && insmod /lib/modules/\$m.ko
done
for a in \$(cat /proc/cmdline); do
  case \$a in
    knitter.ip=*) ip=\${a#*=} ;;
    knitter.peer=*) peer=\${a#*=} ;;
  esac
done
ip link set lo up
ip link set eth0 up
ip addr add \$ip dev eth0
echo "KNITTER-QUEUES \$(ls /sys/class/net/eth0/queues | tr '\n' ' ')"
# reach: pings the peer up to \$1 times; prints KNITTER-\$2 when it answers.
reach() {
  i=0
  while [ \$i -lt \$1 ]; do
    if ping -c 1 -W 1 \$peer > /dev/null 2>&1; then echo KNITTER-\$2; return 0; fi
    echo KNITTER-DOWN
    i=\$((i + 1))
    sleep 0.3
  done
  return 1
}
if [ -x /sbin/ethtool ]; then
  # Down to one queue pair (the switch must stop sending on the second), then back.
  reach 200 UP
  /sbin/ethtool -L eth0 combined 1 && echo "KNITTER-COMBINED 1"
  sleep 3
  reach 30 UP-ONE-PAIR
  /sbin/ethtool -L eth0 combined 2 && echo "KNITTER-COMBINED 2"
  echo "KNITTER-CHANNELS \$(/sbin/ethtool -l eth0 | tail -n 2 | tr -s ' \t\n' ' ')"
fi
n=0
while [ \$n -lt 1000 ]; do
  if ping -c 1 -W 1 \$peer > /dev/null 2>&1; then echo KNITTER-UP; else echo KNITTER-DOWN; fi
  n=\$((n + 1))
  sleep 0.3
done
poweroff -f
EOF
chmod +x "$root/init"
mkdir -p "$out"
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$out/initrd.img.tmp"
cp "$work/k/boot/vmlinuz-$kver" "$out/vmlinuz"
mv "$out/initrd.img.tmp" "$out/initrd.img"
echo "guest: $out/vmlinuz ($kver), $out/initrd.img"
