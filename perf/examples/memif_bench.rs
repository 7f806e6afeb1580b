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
//! fresh testpmd for every switch, and each round starts with the next switch.
//!
//! With `vhost[:QUEUE SIZE]` as the pair, testpmd's second port is DPDK's `net_virtio_user`
//! instead (a VNF listening with `server=1`, two queue pairs of QUEUE SIZE entries, 256 by
//! default, and as many descriptors), which the switch joins as a vhost-user client
//! (Knitter: a vhost-user port; OVS: `dpdkvhostuserclient`): the path a `dpdk` port ↔ a VNF
//! pod takes. Knitter's vhost-user port has port security as the CNI sets it on a pod's port
//! (the VNF's MAC and source address; `MEMIF_NO_SECURITY=1` without); OVS's NORMAL bridge
//! has none.
//!
//!     cargo run --release -p knitter-perf --example memif_bench -- [seconds] [rounds] [knitter,knitter-copy,ovs|both|all] [frame bytes, 60] [memif|vhost[:QUEUE SIZE]]

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
/// testpmd's source address in the frames it seeds (`txonly`'s default, 198.18.0.1).
const VNF_IP: &str = "198.18.0.1";

/// What testpmd's second port is: a memif server like the first, or a VNF's virtio-user
/// listening for a vhost-user backend with `queue_size`-entry virtqueues.
#[derive(Clone, Copy)]
enum Pair {
    Memif,
    Vhost { queue_size: u16 },
}

impl Pair {
    fn parse(s: &str) -> Result<Pair, Error> {
        match s.split_once(':') {
            None if s == "memif" => Ok(Pair::Memif),
            None if s == "vhost" => Ok(Pair::Vhost { queue_size: 256 }),
            Some(("vhost", n)) => Ok(Pair::Vhost { queue_size: n.parse()? }),
            _ => Err(format!("the pair: memif, vhost or vhost:QUEUE_SIZE, not {s:?}").into()),
        }
    }
}

/// testpmd with a memif server and a second port (`Pair`), forwarding once told to start.
struct Testpmd {
    vnf: ListeningVnf,
    sockets: [PathBuf; 2],
}

impl Testpmd {
    fn start(dir: &Path, tag: &str, pair: Pair) -> Result<Testpmd, Error> {
        let sockets = [dir.join(format!("{tag}0.sock")), dir.join(format!("{tag}1.sock"))];
        let memif = |i: usize, mac: &str| {
            format!(
                "net_memif{i},role=server,socket={},socket-abstract=no,mac={mac}",
                sockets[i].display()
            )
        };
        let second = match pair {
            Pair::Memif => memif(1, MAC_B),
            Pair::Vhost { queue_size } => format!(
                "net_virtio_user1,path={},server=1,queues=2,queue_size={queue_size},mac={MAC_B}",
                sockets[1].display()
            ),
        };
        let servers = [memif(0, MAC_A), second];
        let descriptors = match pair {
            Pair::Memif => vec![],
            Pair::Vhost { queue_size } => {
                vec![format!("--rxd={queue_size}"), format!("--txd={queue_size}")]
            }
        };
        let (peer0, peer1) = (format!("--eth-peer=0,{MAC_B}"), format!("--eth-peer=1,{MAC_A}"));
        // Two rings each way: OVS's client asks for a tx queue per PMD thread plus one (a
        // server with fewer refuses it, "Invalid ring index"), and sends on the second;
        // testpmd answers on the ring it received on, so OVS polls two rx queues. The same
        // testpmd for both switches; Knitter's clients take two rings too (sending on one).
        // The VNF's queues at 4 096 entries hold 2 × 2 × 4 096 mbufs.
        let mut app = vec![
            "--nb-cores=1",
            "--rxq=2",
            "--txq=2",
            "--total-num-mbufs=32768",
            "--forward-mode=mac",
            &peer0,
            &peer1,
        ];
        app.extend(descriptors.iter().map(String::as_str));
        let vnf = ListeningVnf::start_vdevs(Command::new("dpdk-testpmd"), &servers, &app)
            .ok_or("dpdk-testpmd is not installed")?;
        let tp = Testpmd { vnf, sockets };
        wait_for(Duration::from_secs(10), "testpmd made no sockets", || {
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

    /// The second port's vhost-user socket (with `Pair::Vhost`).
    fn vhost_socket(&self) -> &Path {
        &self.sockets[1]
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

/// Knitter's second port: a memif client, or a vhost-user port connected to the VNF (with
/// its connection thread).
enum Second {
    Memif(Arc<dpdk::DpdkPort>),
    /// The server is kept for its connection thread (stopped when dropped).
    Vhost(Arc<knitter_vhost::port::VhostPort>, #[allow(dead_code)] knitter_vhost::backend::Server),
}

impl Second {
    fn port(&self) -> Arc<dyn vswitch::port::Port> {
        match self {
            Second::Memif(p) => p.clone(),
            Second::Vhost(p, _) => p.clone(),
        }
    }

    fn up(&self) -> bool {
        match self {
            Second::Memif(p) => {
                p.refresh_link();
                p.link_up()
            }
            Second::Vhost(p, _) => p.running_pairs() > 0,
        }
    }
}

/// Knitter in this process: a memif client and the second port in one bridge domain, a PMD
/// thread on core 0.
fn knitter_round(
    tp: &mut Testpmd,
    pair: Pair,
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
    let tag = if copy { "c" } else { "" };
    let memif = |i: usize, end: &str| -> Result<Arc<dpdk::DpdkPort>, Error> {
        let devargs = tp.client(&format!("net_memif_k{tag}{round}{end}"), i);
        // As many rings as testpmd's servers have (and OVS's clients take): a client with
        // fewer leaves the server's other queues reading ring 0 again (DPDK 22.11's memif
        // server sets up no ring of its own for a queue past the rings the client asked for),
        // so the VNF forwards frames twice. `MEMIF_QUEUES` for another count.
        let queues = std::env::var("MEMIF_QUEUES").ok().and_then(|q| q.parse().ok()).unwrap_or(2);
        let mut opts = dpdk::PortOptions::for_device(&devargs, queues, pool.clone());
        if copy {
            opts.zero_copy = None;
        }
        let port = dpdk::DpdkPort::open(&format!("m{i}"), &devargs, &opts)?;
        if port.zero_copy() == copy {
            return Err(format!("zero copy: asked {}, got {}", !copy, port.zero_copy()).into());
        }
        Ok(port)
    };
    let p1 = match pair {
        Pair::Memif => Second::Memif(memif(1, "b")?),
        Pair::Vhost { .. } => {
            let port = Arc::new(knitter_vhost::port::VhostPort::new("m1", pool.clone()));
            let server = knitter_vhost::backend::connect(tp.vhost_socket(), port.clone())?;
            // testpmd probes its virtio-user until a backend connects and starts its ports
            // only then: a memif client that came before would be told "ID not found".
            wait_for(Duration::from_secs(10), "the VNF's virtio-user did not start", || {
                port.running_pairs() > 0
            })?;
            std::thread::sleep(Duration::from_secs(2));
            Second::Vhost(port, server)
        }
    };
    let p0 = memif(0, "a")?;
    switch.register_port("m0", p0.clone() as Arc<dyn vswitch::port::Port>)?;
    switch.register_port("m1", p1.port())?;
    let mut config = one_bridge(&["m0", "m1"]);
    if let Pair::Vhost { .. } = pair
        && std::env::var_os("MEMIF_NO_SECURITY").is_none()
    {
        // A pod's port as the CNI makes it: the VNF's MAC, and the source address testpmd's
        // frames carry (its txonly seed, kept by `mac` forwarding).
        config.ports[1].security = Some(vswitch::config::PortSecurity {
            enabled: true,
            macs: vec![MAC_B.parse()?],
            ips: vec![VNF_IP.parse()?],
            ..Default::default()
        });
    }
    switch.apply(config)?;
    let pmd = vswitch::PmdSet::start(
        switch.clone(),
        &vswitch::PmdConfig { threads: 1, cores: vec![0], idle: vswitch::IdlePolicy::Busy },
    )?;
    let mut polls = 0u32;
    let up = wait_for(Duration::from_secs(10), "Knitter's links did not come up", || {
        // virtio-user takes a backend that came after it started when it checks its link.
        polls += 1;
        if polls.is_multiple_of(10) {
            tp.vnf.poke();
        }
        p0.refresh_link();
        p0.link_up() && p1.up()
    })
    .map_err(|e| -> Error {
        format!("{e} (the memif client: {}, the second port: {})", p0.link_up(), p1.up()).into()
    });
    let measured = up.map(|()| {
        tp.go(frame);
        std::thread::sleep(Duration::from_secs(2)); // learn, settle
        let before = switch.stats();
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let after = switch.stats();
        tp.vnf.say("show port stats all");
        let drops = after.drops.iter().sum::<u64>() - before.drops.iter().sum::<u64>();
        let why: Vec<String> = vswitch::counters::DropReason::ALL
            .iter()
            .map(|r| (r.name(), after.drops[*r as usize] - before.drops[*r as usize]))
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        if !why.is_empty() {
            eprintln!("{:>6} Knitter's drops: {}", "", why.join(", "));
            for (i, (a, b)) in after.ports.iter().zip(&before.ports).enumerate().take(2) {
                eprintln!(
                    "{:>6} port {i}: rx {} tx {} drops {}",
                    "",
                    a.rx_packets - b.rx_packets,
                    a.tx_packets - b.tx_packets,
                    a.drops - b.drops
                );
            }
        }
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
    pair: Pair,
    work: &Path,
    round: u32,
    secs: u64,
    frame: usize,
) -> Result<Window, Error> {
    use knitter_perf::sut::SwitchUnderTest as _;
    let layout =
        knitter_perf::testpmd::Layout { generator_cpu: 1, switch_cpu: 0, second_switch_cpu: None };
    use knitter_perf::ovs::OvsPort;
    let memif = |i: usize, end: &str| OvsPort::Dpdk {
        name: format!("m{i}"),
        devargs: tp.client(&format!("net_memif_o{round}{end}"), i),
    };
    let second = match pair {
        Pair::Memif => memif(1, "b"),
        Pair::Vhost { .. } => {
            OvsPort::VhostUserClient { name: "m1".into(), socket: tp.vhost_socket().into() }
        }
    };
    // The second port first: testpmd starts its ports once a vhost-user backend connected.
    let settings = knitter_perf::ovs::tuning();
    let at = knitter_perf::ovs::Start { work, mem: memory(), layout, settings: &settings };
    let ovs = knitter_perf::ovs::Ovs::start_bridge(at).map_err(|e| format!("{e:#}"))?;
    ovs.add_port(&second, 2).map_err(|e| format!("{e:#}"))?;
    if let Pair::Vhost { .. } = pair {
        wait_for(Duration::from_secs(30), "OVS's vhost-user port did not come up", || {
            ovs.link_up("m1")
        })?;
        std::thread::sleep(Duration::from_secs(2));
    }
    ovs.add_port(&memif(0, "a"), 2).map_err(|e| format!("{e:#}"))?;
    wait_for(Duration::from_secs(30), "OVS's links did not come up", || {
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
    // The ports' and the vhost-user connection's warnings (`RUST_LOG=debug` for more).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let rounds: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let which = args.next().unwrap_or_else(|| "knitter".into());
    let frame: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(60);
    let pair = Pair::parse(&args.next().unwrap_or_else(|| "memif".into()))?;
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
        // Each round starts with the next switch, so none always runs first (or last).
        let mut order = switches.clone();
        order.rotate_left(r as usize % switches.len());
        for s in &order {
            let mut tp = Testpmd::start(&dir, &format!("{s}{r}"), pair)?;
            let w = match *s {
                "knitter" => knitter_round(&mut tp, pair, r, secs, frame, false)?,
                "knitter-copy" => knitter_round(&mut tp, pair, r, secs, frame, true)?,
                _ => ovs_round(&mut tp, pair, &dir, r, secs, frame)?,
            };
            println!("{:>6} {:>12} {:>10.3} {:>10.1} {:>10}", r + 1, s, w.mpps, w.cycles, w.drops);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
