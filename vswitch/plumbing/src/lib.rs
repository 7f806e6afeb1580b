//! Node plumbing: what knitter-vswitchd asks of the kernel around its ports, apart from the
//! data plane — [`netlink`] (rtnetlink and generic netlink sockets and messages), [`link`]
//! (links, namespaces, addresses, link events), [`ethtool`] (offload features), [`netdev`]
//! (the XDP features a device reports), [`kernel_neigh`] (the kernel's neighbour table copied
//! into the switch's next hops in the shared-address VTEP mode) and [`sys`] (the socket and
//! ioctl calls ports share).

pub mod ethtool;
pub mod kernel_neigh;
pub mod link;
pub mod netdev;
pub mod netlink;
pub mod sriov;
pub mod sys;
