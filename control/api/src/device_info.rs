//! NPWG device-info (the Network Plumbing Working Group's `device-info`, version 1.1.0), as
//! Multus reads it from a CNI's `CNIDeviceInfoFile` and as pods see it in their
//! `network-status` annotation: written by the CNI, recorded on the manager's port by the
//! node, published on the pod by the manager's Kubernetes controller.

/// A vhost-user interface: its socket, and the role the pod's app plays on it (`server`
/// when the switch connects to the app's socket, `client` when the switch listens).
pub fn vhost_user(socket: &str, switch_listens: bool) -> serde_json::Value {
    let mode = if switch_listens { "client" } else { "server" };
    serde_json::json!({ "type": "vhost-user", "version": "1.1.0", "vhost-user": { "mode": mode, "path": socket } })
}

/// A PCI device (an SR-IOV VF): its address and its PF's, as the SR-IOV device plugin and
/// sriov-cni write them for a DPDK app that opens the VF through vfio-pci.
pub fn pci(address: &str, pf_address: &str) -> serde_json::Value {
    serde_json::json!({ "type": "pci", "version": "1.1.0", "pci": { "pci-address": address, "pf-pci-address": pf_address } })
}
