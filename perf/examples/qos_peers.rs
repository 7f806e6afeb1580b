//! Control-plane latency and loss under a media flood, with senders that are not Knitter's
//! own generator: DPDK's testpmd (`net_virtio_user`, `txonly`) floods the `media` VXLAN
//! network through a vhost-user port, and the control pod is a network namespace whose
//! kernel UDP socket sends timestamped datagrams through a veth into an AF_PACKET port of the
//! `control` network (priority, DSCP 40). Both networks go to one remote VTEP over one
//! underlay, the shared egress, which this program drains at `--underlay-pps` frames a
//! second (an uplink slower than the flood) and where it reads each control datagram's
//! latency from its socket to the uplink. The same run is made with the control network's
//! priority on and off, one after the other on one switch, the flood running throughout.
//!
//!     cargo build --release -p knitter-perf --example qos_peers
//!     sudo target/release/examples/qos_peers --seconds 3 --underlay-pps 300000 --ring 256
//!
//! Root (namespaces, AF_PACKET), `dpdk-testpmd` on the path; testpmd runs on hugepages when
//! 300 are free (`echo 512 > /proc/sys/vm/nr_hugepages`), else on plain pages (slower). Layout: the switch's PMD thread
//! on CPU 1; testpmd, the control pod's sender and the uplink's drain on CPU 0 (the sender
//! and the drain sleep between their turns, testpmd spins: the VM's scheduling is in the
//! tails, the same in both runs).

use anyhow::{Context, Result, bail};
use kernel_ports::afpacket::AfPacketPort;
use knitter_vhost::backend::serve;
use knitter_vhost::port::VhostPort;
use std::io::Write;
use std::net::{IpAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use vswitch::config::{BridgeConfig, PortConfig, StaticMac, SwitchConfig, VtepConfig};
use vswitch::port::Port;
use vswitch::port::ring::{RingPeer, RingPort};
use vswitch::testkit::mac;
use vswitch::testkit::netns::{Netns, veth};
use vswitch::{Batch, IdlePolicy, PmdConfig, PmdSet, Pool, PoolCache, Switch, SwitchOptions};

const CONTROL_VNI: u32 = 100;
const MEDIA_VNI: u32 = 200;
/// Outer headers of an IPv4 VXLAN frame on an untagged underlay.
const OUTER: usize = 50;
/// Where a control datagram carries its send time: the inner UDP payload.
const STAMP: usize = 42;

struct Args {
    seconds: f64,
    control_pps: f64,
    underlay_pps: f64,
    ring: usize,
    media_size: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        seconds: 3.0,
        control_pps: 10_000.0,
        underlay_pps: 300_000.0,
        ring: 256,
        media_size: 512,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--seconds" => a.seconds = v()?.parse()?,
            "--control-pps" => a.control_pps = v()?.parse()?,
            "--underlay-pps" => a.underlay_pps = v()?.parse()?,
            "--ring" => a.ring = v()?.parse()?,
            "--media-size" => a.media_size = v()?.parse()?,
            _ => bail!("unknown argument {k} (see the program's doc)"),
        }
    }
    anyhow::ensure!(a.underlay_pps > 0.0, "--underlay-pps: the uplink's rate, > 0");
    Ok(a)
}

/// Free 2 MiB hugepages (`HugePages_Free` of /proc/meminfo).
fn free_hugepages() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    m.lines().find_map(|l| l.strip_prefix("HugePages_Free:")?.trim().parse().ok()).unwrap_or(0)
}

/// testpmd flooding the media network; stopped on drop.
struct Testpmd(Child);

impl Testpmd {
    fn start(sock: &std::path::Path, size: usize) -> Result<Testpmd> {
        let mut child = Command::new("dpdk-testpmd")
            .args([
                "-l",
                "0,1",
                "--main-lcore",
                "1",
                "--no-pci",
                "-m",
                "512",
                "--single-file-segments",
            ])
            // Hugepages when the machine has them free (as DPDK runs), else plain pages.
            .arg(if free_hugepages() >= 300 { "--in-memory" } else { "--no-huge" })
            .arg(format!("--file-prefix=qos-peers-{}", std::process::id()))
            .arg(format!("--vdev=net_virtio_user0,path={},queues=1,mac={}", sock.display(), mac(2)))
            .args(["--", "-i", "--nb-cores=1", "--forward-mode=txonly", "--total-num-mbufs=8192"])
            .arg(format!("--eth-peer=0,{}", mac(12)))
            .arg(format!("--txpkts={size}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dpdk-testpmd (is DPDK installed?)")?;
        std::thread::sleep(Duration::from_secs(2));
        if let Some(s) = child.stdin.as_mut() {
            writeln!(s, "start")?;
        }
        Ok(Testpmd(child))
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        if let Some(s) = self.0.stdin.as_mut() {
            let _ = writeln!(s, "stop\nquit");
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The switch's configuration: control (priority as `priority` says) and media networks to
/// one remote VTEP, each remote pod's MAC static behind it.
fn config(control_port: &str, priority: bool) -> Result<SwitchConfig> {
    let (local, peer): (IpAddr, IpAddr) = ("198.51.100.1".parse()?, "198.51.100.2".parse()?);
    let network = |name: &str, vni: u32, far: u32, dscp: u8| {
        let mut b = BridgeConfig::new(name).vni(vni).flood(&[peer]);
        b.dscp = Some(dscp);
        b.static_macs.push(StaticMac { mac: mac(far), port: None, remote: Some(peer) });
        b
    };
    let mut control = network("control", CONTROL_VNI, 11, 40);
    control.priority = priority;
    Ok(SwitchConfig {
        bridges: vec![control, network("media", MEDIA_VNI, 12, 34)],
        ports: vec![
            PortConfig::access(control_port, "control"),
            PortConfig::access("media", "media"),
            PortConfig::underlay("up"),
        ],
        vtep: Some(VtepConfig::new(local, "up").peer(peer, mac(0xb0))),
    })
}

/// One run's result.
struct Seen {
    sent: u64,
    latencies_us: Vec<f64>,
    media_pps: f64,
    up_tx: u64,
    priority_dropped: u64,
    tx_full: u64,
}

/// The control pod's sender: `pps` datagrams a second, each stamped with the nanoseconds since
/// `start`, until `stop`; counts what it sent.
fn control_sender(
    sock: UdpSocket,
    pps: f64,
    start: Instant,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) {
    vswitch::pmd::pin_current_thread(0);
    realtime();
    let mut payload = [0u8; 64];
    let mut n = 0u64;
    let began = Instant::now();
    while !stop.load(Relaxed) {
        let due = (pps * began.elapsed().as_secs_f64()) as u64;
        while n < due {
            payload[..8].copy_from_slice(&(start.elapsed().as_nanos() as u64).to_le_bytes());
            if sock.send(&payload).is_ok() {
                sent.fetch_add(1, Relaxed);
            }
            n += 1;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Drains the uplink at `pps` for `secs`: control datagrams' latencies recorded, media frames
/// freed.
fn drain(
    pool: &Pool,
    up: &mut RingPeer,
    cache: &mut PoolCache,
    start: Instant,
    from: Duration,
    secs: f64,
    pps: f64,
) -> Vec<f64> {
    let mut latencies = Vec::new();
    let mut taken = 0u64;
    let mut batch = Batch::new();
    let end = from + Duration::from_secs_f64(secs);
    loop {
        let t = start.elapsed();
        if t >= end + Duration::from_millis(200) {
            return latencies;
        }
        // The uplink's rate while measuring; afterwards what is left arrives at once.
        let budget = if t < end { (pps * (t - from).as_secs_f64()) as u64 } else { u64::MAX };
        let mut moved = false;
        while taken < budget && up.recv(0, &mut batch) > 0 {
            moved = true;
            let now = start.elapsed().as_nanos() as u64;
            for b in batch.drain() {
                taken += 1;
                let h = pool.head(&b);
                let vni = h.get(46..49).map_or(0, |v| u32::from_be_bytes([0, v[0], v[1], v[2]]));
                let at = OUTER + STAMP;
                if vni == CONTROL_VNI
                    && let Some(s) = h.get(at..at + 8)
                {
                    let sent = u64::from_le_bytes(s.try_into().unwrap_or_default());
                    latencies.push(now.saturating_sub(sent) as f64 / 1000.0);
                }
                cache.free(b);
            }
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Runs the calling thread with a real-time priority (SCHED_FIFO 10): the sender and the
/// uplink's drain share CPU 0 with testpmd's spinning lcore, and without it they would wait
/// for its time slice to end (milliseconds) whenever they wake. Both sleep between turns.
fn realtime() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: sets the calling thread's policy (0: this thread) from a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        eprintln!(
            "warning: no real-time priority ({}): latencies include CPU 0's time slices",
            std::io::Error::last_os_error()
        );
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p / 100.0).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() -> Result<()> {
    let a = args()?;
    anyhow::ensure!(
        vswitch::testkit::netns::available(),
        "needs root and `ip netns` (network namespaces)"
    );
    let dir = tempfile::tempdir()?;
    let pool = Pool::new(65_536, false)?;
    let switch = Switch::new(pool.clone(), SwitchOptions::default());

    // The control pod: a namespace with a veth into the switch's namespace, its far peer's
    // address and MAC static (no ARP), IPv6 off (no stray frames).
    let (sw_ns, pod_ns) = (Netns::quiet("qos-sw")?, Netns::quiet("qos-ctl")?);
    veth(&sw_ns, "c0", &pod_ns, "eth0")?;
    pod_ns.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"])?;
    pod_ns.run(&[
        "ip",
        "neigh",
        "add",
        "192.0.2.11",
        "lladdr",
        &mac(11).to_string(),
        "dev",
        "eth0",
        "nud",
        "permanent",
    ])?;
    let control = sw_ns.enter(|| AfPacketPort::open("control", "c0"))??;
    switch.register_port("control", Arc::new(control))?;

    let media = Arc::new(VhostPort::new("media", pool.clone()));
    let sock = dir.path().join("media.sock");
    let _server = serve(&sock, media.clone())?;
    switch.register_port("media", media.clone())?;
    let (up, mut up_peer) = RingPort::new("up", 1, a.ring)?;
    switch.register_port("up", up.with_mac(mac(0xa0)))?;
    switch.apply(config("control", true)?)?;
    let pmd = PmdSet::start(
        switch.clone(),
        &PmdConfig { threads: 1, cores: vec![1], idle: IdlePolicy::Busy },
    )?;
    vswitch::pmd::pin_current_thread(0);

    let testpmd = Testpmd::start(&sock, a.media_size)?;
    let t = Instant::now();
    while !media.link_up() {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "testpmd's port did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut cache = PoolCache::new(pool.clone());
    realtime();
    let start = Instant::now();
    // Warm-up: testpmd on plain pages takes a few seconds to reach its rate.
    drain(&pool, &mut up_peer, &mut cache, start, Duration::ZERO, 3.0, a.underlay_pps);

    let socket = pod_ns.enter(|| -> std::io::Result<UdpSocket> {
        let s = UdpSocket::bind("192.0.2.1:5000")?;
        s.connect("192.0.2.11:5000")?;
        Ok(s)
    })??;
    let mut rows = Vec::new();
    for priority in [true, false] {
        switch.apply(config("control", priority)?)?;
        let media_id = switch.snapshot().port_id("media").context("media port")? as usize;
        let up_id = switch.snapshot().port_id("up").context("up port")? as usize;
        let before = switch.stats();
        let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let sender = {
            let (s, stop, sent) = (socket.try_clone()?, stop.clone(), sent.clone());
            let pps = a.control_pps;
            std::thread::spawn(move || control_sender(s, pps, start, stop, sent))
        };
        let from = start.elapsed();
        let measured =
            drain(&pool, &mut up_peer, &mut cache, start, from, a.seconds, a.underlay_pps);
        stop.store(true, Relaxed);
        let _ = sender.join();
        let after = switch.stats();
        let (p0, p1) = (
            before.ports.get(up_id).cloned().unwrap_or_default(),
            after.ports.get(up_id).cloned().unwrap_or_default(),
        );
        let media_rx = after.ports.get(media_id).map_or(0, |p| p.rx_packets)
            - before.ports.get(media_id).map_or(0, |p| p.rx_packets);
        let mut l = measured;
        l.sort_by(f64::total_cmp);
        rows.push((
            priority,
            Seen {
                sent: sent.load(Relaxed),
                latencies_us: l,
                media_pps: media_rx as f64 / a.seconds,
                up_tx: p1.tx_packets - p0.tx_packets,
                priority_dropped: p1.priority_dropped - p0.priority_dropped,
                tx_full: after.drop(vswitch::DropReason::TxFull)
                    - before.drop(vswitch::DropReason::TxFull),
            },
        ));
    }
    drop(testpmd);
    pmd.stop();
    up_peer.drain(&mut cache);

    println!(
        "uplink {:.0} frames/s, ring {}; control {:.0} datagrams/s from a kernel socket; media {} B frames from testpmd txonly",
        a.underlay_pps, a.ring, a.control_pps, a.media_size
    );
    println!(
        "| control plane | media taken by the switch | × uplink | control sent | lost | p50 µs | p99 µs | p99.9 µs | max µs | uplink tx | tx_full drops |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (priority, s) in &rows {
        let l = &s.latencies_us;
        println!(
            "| {} | {:.2} Mpps | {:.2}× | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} |",
            if *priority { "priority" } else { "no priority" },
            s.media_pps / 1e6,
            s.media_pps / a.underlay_pps,
            s.sent,
            s.sent.saturating_sub(l.len() as u64),
            pct(l, 50.0),
            pct(l, 99.0),
            pct(l, 99.9),
            pct(l, 100.0),
            s.up_tx,
            s.tx_full
        );
        if s.priority_dropped > 0 {
            println!("  (priority queue overflowed: {} dropped)", s.priority_dropped);
        }
    }
    Ok(())
}
