//! Knitter's control plane. Today: the IPAM core (`ipam`), networks checked against each
//! other and the underlay (`network`), and the manager's store
//! (`store`: the trait, the embedded and etcd backends) that knitter-manager will serve; the
//! `knitterctl` binary lives in `src/knitterctl.rs`.

#![forbid(unsafe_code)]

pub mod ipam;
pub mod manager;
pub mod network;
pub mod store;
