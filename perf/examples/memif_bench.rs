//! A dpdk port pair forwarding through Knitter, and the same through Open vSwitch with DPDK,
//! measured in interleaved rounds: DPDK's testpmd owns two `net_memif` servers and forwards
//! in `mac` mode between them (each frame back to the other port with the other's MAC as
//! destination, seeded with `--tx-first`); the switch's two `net_memif` clients are in one
//! bridge (Knitter: access ports of one bridge domain; OVS: a `netdev` bridge with the
//! NORMAL action and two `type=dpdk` interfaces), so every frame testpmd sends crosses the
//! switch and comes back to testpmd, which sends it again. testpmd's forwarding lcore on one
//! core, the switch's PMD thread on the other; each switch's packets per second and busy TSC
//! cycles per packet (Knitter: its ports' mempools carry the switch's buffers, so frames
//! cross the edge without a copy; `knitter-copy`: each frame copied into the pool and back
//! into an mbuf; OVS: its `dpif-netdev/pmd-stats-show` processing cycles) are printed. A
//! fresh testpmd for every round.
//!
//!     cargo run --release -p knitter-perf --example memif_bench -- [seconds] [rounds] [knitter,knitter-copy,ovs|both|all] [frame bytes, 60]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vswitch::port::Port;
use vswitch::testkit::one_bridge;
use vswitch::testkit::vnf::ListeningVnf;

type Error = Box<dyn std::error::Error>;

const MAC_A: &str = "02:00:00:00:00:0a";
const MAC_B: &str = "02:00:00:00:00:0b";

/// testpmd with two memif servers, forwarding once told to start.
struct Testpmd {
    vnf: ListeningVnf,
    sockets: [PathBuf; 2],
}

impl Testpmd {
    fn start(dir: &Path, tag: &str) -> Result<Testpmd, Error> {
        let sockets = [dir.join(format!("{tag}0.sock")), dir.join(format!("{tag}1.sock"))];
        let servers = [(0, MAC_A), (1, MAC_B)].map(|(i, mac)| {
            format!(
                "net_memif{i},role=server,socket={},socket-abstract=no,mac={mac}",
                sockets[i].display()
            )
        });
        let (peer0, peer1) = (format!("--eth-peer=0,{MAC_B}"), format!("--eth-peer=1,{MAC_A}"));
        // Two rings each way: OVS's client asks for a tx queue per PMD thread plus one (a
        // server with fewer refuses it, "Invalid ring index"), and sends on the second;
        // testpmd answers on the ring it received on, so OVS polls two rx queues. The same
        // testpmd for both switches (Knitter sends and polls one).
        let app = [
            "--nb-cores=1",
            "--rxq=2",
            "--txq=2",
            "--total-num-mbufs=8192",
            "--forward-mode=mac",
            &peer0,
            &peer1,
        ];
        let vnf = ListeningVnf::start_vdevs(Command::new("dpdk-testpmd"), &servers, &app)
            .ok_or("dpdk-testpmd is not installed")?;
        let tp = Testpmd { vnf, sockets };
        wait_for(Duration::from_secs(10), "testpmd made no memif sockets", || {
            tp.sockets.iter().all(|s| s.exists())
        })?;
        // The servers' interfaces join their sockets when testpmd starts its ports, a moment
        // after the sockets appear (a client that connects before is told "ID not found").
        std::thread::sleep(Duration::from_secs(2));
        Ok(tp)
    }

    /// The client devargs for server `i`.
    fn client(&self, name: &str, i: usize) -> String {
        format!("{name},role=client,socket={},socket-abstract=no", self.sockets[i].display())
    }

    /// Starts forwarding, seeding the loop with 4 bursts per port (`MEMIF_SEED`) of `frame`-byte frames
    /// (without the FCS: 60 for 64 B on the wire).
    fn go(&mut self, frame: usize) {
        self.vnf.say(&format!("set txpkts {frame}"));
        // MEMIF_SEED: bursts per port in flight (4 by default).
        let seed = std::env::var("MEMIF_SEED").unwrap_or_else(|_| "4".into());
        self.vnf.say(&format!("start tx_first {seed}"));
    }
}

fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Result<(), Error> {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return Err(what.into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// What a switch's counters said over a window.
struct Window {
    mpps: f64,
    cycles: f64,
    drops: u64,
}

impl Window {
    fn of(packets: u64, busy: u64, drops: u64, secs: f64) -> Window {
        Window {
            mpps: packets as f64 / secs / 1e6,
            cycles: busy as f64 / packets.max(1) as f64,
            drops,
        }
    }
}

/// Knitter in this process: two memif clients in one bridge domain, a PMD thread on core 0.
fn knitter_round(
    tp: &mut Testpmd,
    round: u32,
    secs: u64,
    frame: usize,
    copy: bool,
) -> Result<Window, Error> {
    let mut eal = dpdk::eal::default_args(&format!("kn-{}", std::process::id()), &[]);
    if std::env::var_os("MEMIF_DEBUG").is_some() {
        eal.extend(["--log-level".into(), "pmd.net.memif:debug".into()]);
    }
    dpdk::eal::init(&eal)?;
    let pool = vswitch::Pool::new(32768, true)?;
    if round == 0 {
        println!("{:>6} the switch's buffers: {}", "", pool.backing());
    }
    let switch = vswitch::Switch::new(pool.clone(), vswitch::SwitchOptions::default());
    let opts = dpdk::PortOptions { zero_copy: (!copy).then_some(pool), ..Default::default() };
    let tag = if copy { "c" } else { "" };
    let p0 =
        dpdk::DpdkPort::open("m0", &tp.client(&format!("net_memif_k{tag}{round}a"), 0), &opts)?;
    let p1 =
        dpdk::DpdkPort::open("m1", &tp.client(&format!("net_memif_k{tag}{round}b"), 1), &opts)?;
    if p0.zero_copy() == copy || p1.zero_copy() == copy {
        let got = (p0.zero_copy(), p1.zero_copy());
        return Err(format!("zero copy: asked {}, got {got:?}", !copy).into());
    }
    switch.register_port("m0", p0.clone() as Arc<dyn vswitch::port::Port>)?;
    switch.register_port("m1", p1.clone() as Arc<dyn vswitch::port::Port>)?;
    switch.apply(one_bridge(&["m0", "m1"]))?;
    let pmd = vswitch::PmdSet::start(
        switch.clone(),
        &vswitch::PmdConfig { threads: 1, cores: vec![0], idle: vswitch::IdlePolicy::Busy },
    )?;
    let up = wait_for(Duration::from_secs(10), "Knitter's memif links did not come up", || {
        p0.refresh_link();
        p1.refresh_link();
        p0.link_up() && p1.link_up()
    });
    let measured = up.map(|()| {
        tp.go(frame);
        std::thread::sleep(Duration::from_secs(2)); // learn, settle
        let before = switch.stats();
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let after = switch.stats();
        let drops = after.drops.iter().sum::<u64>() - before.drops.iter().sum::<u64>();
        Window::of(
            after.packets - before.packets,
            after.busy_cycles - before.busy_cycles,
            drops,
            t.elapsed().as_secs_f64(),
        )
    });
    pmd.stop();
    switch.apply(vswitch::config::SwitchConfig::default())?;
    measured
}

/// Open vSwitch with DPDK: the same two memif clients as `type=dpdk` ports of a NORMAL
/// bridge, its PMD on core 0 and its main lcore on core 1 (perf's launcher).
fn ovs_round(
    tp: &mut Testpmd,
    work: &Path,
    round: u32,
    secs: u64,
    frame: usize,
) -> Result<Window, Error> {
    use knitter_perf::sut::SwitchUnderTest as _;
    let layout =
        knitter_perf::testpmd::Layout { generator_cpu: 1, switch_cpu: 0, second_switch_cpu: None };
    let ports = [
        ("m0", tp.client(&format!("net_memif_o{round}a"), 0)),
        ("m1", tp.client(&format!("net_memif_o{round}b"), 1)),
    ];
    let ovs = knitter_perf::ovs::Ovs::start_dpdk_ports(work, memory(), layout, &ports, 2)
        .map_err(|e| format!("{e:#}"))?;
    wait_for(Duration::from_secs(30), "OVS's memif links did not come up", || {
        ovs.link_up("m0") && ovs.link_up("m1")
    })?;
    tp.go(frame);
    std::thread::sleep(Duration::from_secs(2));
    let before = ovs.own().ok_or("OVS's pmd-stats-show")?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let after = ovs.own().ok_or("OVS's pmd-stats-show")?;
    Ok(Window::of(
        after.packets - before.packets,
        after.busy_cycles - before.busy_cycles,
        after.drops - before.drops,
        t.elapsed().as_secs_f64(),
    ))
}

/// OVS's memory: huge pages when the host has them free (Knitter's EAL decides alike; OVS
/// always adds `--in-memory`, which DPDK refuses beside `--no-huge`).
fn memory() -> knitter_perf::testpmd::Memory {
    if dpdk::free_huge_pages() >= 512 {
        knitter_perf::testpmd::Memory::Hugepages
    } else {
        knitter_perf::testpmd::Memory::Plain
    }
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let rounds: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let which = args.next().unwrap_or_else(|| "knitter".into());
    let frame: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(60);
    let switches: Vec<&str> = match which.as_str() {
        "both" => vec!["knitter", "ovs"],
        "all" => vec!["knitter", "knitter-copy", "ovs"],
        list => list.split(',').collect(),
    };
    if let Some(other) = switches.iter().find(|s| !["knitter", "knitter-copy", "ovs"].contains(s)) {
        return Err(format!(
            "which switches: knitter, knitter-copy, ovs (comma-separated), both or all, not {other:?}"
        )
        .into());
    }
    if !dpdk::AVAILABLE {
        return Err("built without DPDK".into());
    }
    if switches.contains(&"ovs") && !knitter_perf::ovs::available() {
        return Err(
            "Open vSwitch with DPDK is not installed (apt-get install openvswitch-switch-dpdk)"
                .into(),
        );
    }
    let dir = std::env::temp_dir().join(format!("knitter-memif-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("{:>6} {:>12} {:>10} {:>10} {:>10}", "round", "switch", "Mpps", "cycles/pkt", "drops");
    for r in 0..rounds {
        for s in &switches {
            let mut tp = Testpmd::start(&dir, &format!("{s}{r}"))?;
            let w = match *s {
                "knitter" => knitter_round(&mut tp, r, secs, frame, false)?,
                "knitter-copy" => knitter_round(&mut tp, r, secs, frame, true)?,
                _ => ovs_round(&mut tp, &dir, r, secs, frame)?,
            };
            println!("{:>6} {:>12} {:>10.3} {:>10.1} {:>10}", r + 1, s, w.mpps, w.cycles, w.drops);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
