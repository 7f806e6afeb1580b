//! Knitter's control plane. Today: the IPAM core (`ipam`) and the manager's store
//! (`store`: the trait and the embedded backend) that knitter-manager will serve; the
//! `knitterctl` binary lives in `src/knitterctl.rs`.

pub mod ipam;
pub mod store;
