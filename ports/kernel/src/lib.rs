//! Kernel ports: the switch's [`vswitch::port::Port`]s over kernel sockets — [`afxdp`]
//! (AF_XDP sockets over a UMEM that is the switch's buffer pool, with the XDP redirect
//! program of [`bpf`], loaded through bpf(2) with kernel BTF) and [`afpacket`] (TPACKET_V3
//! rings with virtio-net headers, for devices XDP cannot serve); beside them [`offload`] (the checksums and segmentation
//! kernel senders leave to the device) and [`kernel_neigh`] (for an underlay whose address
//! is the kernel's: its neighbor table followed into the switch's next hops).

pub mod afpacket;
pub mod afxdp;
pub mod bpf;
mod btf;
pub mod kernel_neigh;
pub mod offload;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
