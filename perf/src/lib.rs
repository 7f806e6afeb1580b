//! knitter-perf: the perf lab. `frames.rs` makes the offered frames, `testpmd.rs` drives
//! dpdk-testpmd as generator and yardstick, `switches.rs` starts the switches under test (`ovs.rs`: Open vSwitch with DPDK),
//! `cpu.rs` measures the CPU the VM really gives, `stats.rs` holds medians, ratios and the
//! NDR/PDR search, `mrr.rs` runs the interleaved maximum-receive-rate comparison and
//! `report.rs` writes its JSON and Markdown.

pub mod cpu;
pub mod frames;
pub mod mrr;
pub mod ovs;
pub mod report;
pub mod stats;
pub mod switches;
pub mod testpmd;
