//! Knitter's control plane. Today: the IPAM core (`ipam`), networks checked against each
//! other and the underlay (`network`), and the manager's store
//! (`store`: the trait, the embedded and etcd backends) that knitter-manager serves, and the
//! manager itself (`manager`: objects, both APIs, node sync, the Kubernetes controller).
//! knitterctl is its own crate (control/knitterctl).

#![forbid(unsafe_code)]

pub mod ipam;
pub mod manager;
pub mod network;
pub mod store;
