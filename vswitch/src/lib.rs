//! Knitter's data plane: a poll-mode userspace switch.
//!
//! Packets live in [`buf`] (one region of 2 KiB chunks, headroom in front, chains, reference
//! counts) and move through [`port`]s in [`batch`]es of 32. A [`pipeline::Pipeline`] per PMD
//! thread parses Ethernet/802.1Q, classifies each frame into a bridge domain by (port, VLAN)
//! or (VTEP, VNI), applies port security and ARP/ND suppression, learns and looks up MACs in
//! the shared [`fdb`], and emits per-port tx batches with VLAN rewrite or VXLAN encapsulation,
//! flooding with split horizon where the destination is unknown. Configuration is an
//! immutable [`snapshot`] built and validated by the control side ([`switch`]) and adopted by
//! PMD threads ([`pmd`]) between batches. See `docs/architecture/data-plane.md`.

pub mod batch;
pub mod bpf;
pub mod buf;
pub mod capture;
pub mod config;
pub mod counters;
pub mod descriptor;
pub mod emc;
pub mod faults;
pub mod fdb;
pub mod graph;
pub mod megaflow;
pub mod neigh;
pub mod pipeline;
pub mod pmd;
pub mod policer;
pub mod port;
pub mod region;
pub mod security;
pub mod snapshot;
pub mod spsc;
pub mod suppress;
pub mod switch;
mod sync;
pub mod trace;
pub mod util;
pub mod vlan;
pub mod vtep;
pub mod wire;

pub use batch::{BATCH, Batch};
pub use buf::{BufId, LentTail, Pool, PoolCache};
pub use config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
pub use counters::{DropReason, Event};
pub use pipeline::Dispatch;
pub use pmd::{IdlePolicy, PmdConfig, PmdSet};
pub use switch::{Switch, SwitchOptions};
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
