//! knitter-perf: the perf lab. `frames.rs` makes the offered frames, `testpmd.rs` drives
//! dpdk-testpmd as generator and yardstick, `switches.rs` starts the switches under test (`ovs.rs`: Open vSwitch with DPDK),
//! `cpu.rs` measures the CPU the VM really gives, `machine.rs` reserves the hugepages a run
//! needs (`hugepages.rs`: the kernel's pool, and waiting for pages to come back) and `doctor.rs` checks the rest before it starts, `progress.rs` shows how far it is, `stats.rs` holds medians, ratios and the
//! NDR/PDR search, `mrr.rs` runs the interleaved maximum-receive-rate comparison,
//! `report.rs` writes its JSON and Markdown and `sweep.rs` one table across the VNF's ring sizes. `vgen.rs` is Knitter's own generator (a
//! vhost-user frontend offering frames at a set rate, timing each), on `driver.rs` (the
//! driver side of split virtqueues in memory it shares with the switch); `ndr.rs` runs the
//! NDR/PDR searches and latency trials with it, `plots.rs` draws their SVG plots; `scenario.rs` says what is offered where (L2, VXLAN
//! encapsulation, decapsulation).

pub mod cpu;
pub mod doctor;
/// The split-virtqueue driver the generator runs (shared with the vhost test kit).
pub use knitter_vhost::driver;
pub mod frames;
pub mod hugepages;
pub mod interrupt;
pub mod machine;
pub mod mrr;
pub mod ndr;
pub mod ovs;
pub mod plots;
pub mod progress;
pub mod report;
pub mod scenario;
pub mod stats;
pub mod sut;
pub mod sweep;
pub mod switches;
pub mod testpmd;
pub mod trial;
pub mod veth;
pub mod vgen;
pub mod xgen;
