//! Node plumbing: what knitter-vswitchd asks of the kernel around its ports, apart from the
//! data plane — [`netlink`] (rtnetlink and generic netlink sockets and messages), [`link`]
//! (links, namespaces, addresses, link events), [`ethtool`] (offload features), [`netdev`]
//! (the XDP features a device reports), [`sriov`] (a PF's VFs) and [`sys`] (the socket and
//! ioctl calls ports share). It knows the switch only by its wire types (`MacAddr`).

pub mod ethtool;
pub mod link;
pub mod netdev;
pub mod netlink;
pub mod sriov;
pub mod sys;
