//! DPDK for Knitter: the EAL initialised once per process ([`eal`]), and ethdev ports —
//! vdevs (`net_tap`, `net_pcap`, `net_ring`, `net_null`, `net_memif`, `net_af_packet`...),
//! NICs and VFs bound to vfio-pci — as the switch's `dpdk` port kind ([`DpdkPort`]).
//!
//! Buffers: a port's mempool (one per port) carries the switch's own buffers when its driver
//! copies frames with the CPU (vdevs such as `net_memif`, `net_tap`, `net_ring`): frames
//! cross the edge without a copy (`zerocopy.rs`). Other devices (NICs, VFs) get a mempool of
//! their own and frames are copied at the edge, one copy each way. The PMD threads stay
//! Knitter's, registered with the EAL (`rte_thread_register`) on their first burst so
//! mempool caches work.
//!
//! Built without DPDK (`dpdk_sys::AVAILABLE` false: no libdpdk-dev, or `KNITTER_NO_DPDK=1`)
//! every entry point returns [`DpdkError::NotBuilt`].

use std::sync::Arc;

#[cfg(dpdk)]
pub mod eal;
#[cfg(dpdk)]
mod port;
#[cfg(not(dpdk))]
mod unavailable;
#[cfg(dpdk)]
mod zerocopy;

#[cfg(dpdk)]
pub use port::DpdkPort;
#[cfg(not(dpdk))]
pub use unavailable::{DpdkPort, eal};

/// Huge pages free on this host (`/proc/meminfo`): the EAL takes its memory from them when
/// there are any.
pub fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("HugePages_Free:").map(|v| v.trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

#[derive(Debug, Clone)]
pub struct PortOptions {
    /// rx/tx queue pairs (RSS spreads flows over the rx queues when more than one).
    pub queues: u16,
    /// Descriptors per queue.
    pub descriptors: u16,
    /// mbufs in the port's mempool (with zero copy, each holds one of the switch's buffers).
    pub mbufs: u32,
    /// The switch's pool, to share its buffers with the device when its driver copies frames
    /// with the CPU ([`device_copies`]): no copy at the edge. `None`, or a device that DMAs:
    /// the port has a mempool of its own and copies every frame.
    pub zero_copy: Option<Arc<vswitch::Pool>>,
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions { queues: 1, descriptors: 1024, mbufs: 8191, zero_copy: None }
    }
}

impl PortOptions {
    /// Options for the device `devargs` with `queues` queue pairs, sharing `pool`'s buffers
    /// when its driver copies ([`device_copies`]). Then each mbuf holds one of the switch's
    /// buffers, so the mempool is sized to what the device can hold: both rings of every
    /// queue, and 1 024 for the mempool's per-thread caches (up to 192 idle mbufs each) and
    /// bursts in flight (3 072 for one queue pair). A device that DMAs keeps 8 191 mbufs of
    /// its own memory.
    pub fn for_device(devargs: &str, queues: u16, pool: Arc<vswitch::Pool>) -> PortOptions {
        let defaults = PortOptions { queues, ..PortOptions::default() };
        let mbufs = if device_copies(devargs) {
            2 * defaults.descriptors as u32 * queues as u32 + 1024
        } else {
            defaults.mbufs
        };
        PortOptions { mbufs, zero_copy: Some(pool), ..defaults }
    }
}

/// Whether a device, as `devargs` configure it, copies frames with the CPU through the mbufs'
/// virtual addresses and gives back the mbufs it holds when it closes, so that its mempool
/// can carry the switch's buffers ([`PortOptions::zero_copy`]). Not: DMA-capable devices
/// (PCI addresses); vdevs that hand buffer addresses to another process or the kernel
/// (`net_virtio_user`, `net_af_xdp`, `net_memif` with `zero-copy=yes`); `net_vhost` with
/// `ext-buffer` (it attaches buffers of its own to the mbufs); `net_ring` attached to rings
/// another port shares (`nodeaction`: mbufs outlive the port in them); `net_null`, which
/// delivers mbufs it never wrote (whatever bytes a buffer last held would reach the switch).
pub fn device_copies(devargs: &str) -> bool {
    const COPYING: [&str; 6] =
        ["net_memif", "net_ring", "net_tap", "net_af_packet", "net_pcap", "net_vhost"];
    // (device, key, values that make it so: "" any). memif turns zero copy on when the value
    // merely contains "yes" (its parser's `strstr`).
    const NOT_WITH: [(&str, &str, &str); 3] = [
        ("net_memif", "zero-copy", "yes"),
        ("net_vhost", "ext-buffer", ""),
        ("net_ring", "nodeaction", ""),
    ];
    let mut args = devargs.split(',').map(str::trim);
    let dev = args.next().unwrap_or_default();
    COPYING.iter().any(|p| dev.starts_with(p))
        && !args.any(|a| {
            let (key, value) = a.split_once('=').unwrap_or((a, ""));
            NOT_WITH
                .iter()
                .any(|(d, k, v)| dev.starts_with(d) && key.trim() == *k && value.contains(v))
        })
}

#[cfg(test)]
mod test {
    #[test]
    fn zero_copy_is_for_devices_that_copy_as_configured() {
        for yes in [
            "net_memif0,role=client,socket=/run/m.sock",
            "net_memif0,zero-copy=no",
            "net_tap0,iface=t0",
            "net_ring0",
            "net_pcap0,rx_pcap=a.pcap",
            "net_vhost0,iface=/tmp/v.sock",
        ] {
            assert!(super::device_copies(yes), "{yes}");
        }
        for no in [
            "0000:3b:00.0",
            "net_null0",
            "net_virtio_user0,path=/tmp/v.sock",
            "net_af_xdp0,iface=eth0",
            "net_memif0,role=client,zero-copy=yes",
            "net_memif0,zero-copy= yes",
            "net_vhost0,iface=/tmp/v.sock,ext-buffer=1",
            "net_ring0,nodeaction=r0:0:ATTACH",
        ] {
            assert!(!super::device_copies(no), "{no}");
        }
    }

    #[test]
    fn a_copying_device_gets_as_many_mbufs_as_its_rings_hold() {
        let pool = vswitch::Pool::new(64, false).expect("a small pool");
        let memif = super::PortOptions::for_device("net_memif0,role=client", 2, pool.clone());
        assert_eq!((memif.queues, memif.mbufs, memif.zero_copy.is_some()), (2, 5120, true));
        let nic = super::PortOptions::for_device("0000:3b:00.0", 1, pool);
        assert_eq!(nic.mbufs, 8191);
    }
}

/// Whether this build has DPDK.
pub const AVAILABLE: bool = dpdk_sys::AVAILABLE;

/// A device's own counters (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    /// Frames the device dropped for want of rx descriptors.
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    /// Receive mbuf allocation failures.
    pub rx_nombuf: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum DpdkError {
    #[error(
        "this knitter was built without DPDK (install libdpdk-dev and libclang-dev, then rebuild)"
    )]
    NotBuilt,
    #[error("EAL initialisation failed ({args}): {reason}")]
    Eal { args: String, reason: String },
    #[error("{what} {name:?}: {reason}")]
    Device { what: &'static str, name: String, reason: String },
    #[error("devargs {0:?}: name a device (\"0000:3b:00.0\", \"net_tap0,iface=dtap0\", ...)")]
    Devargs(String),
}
