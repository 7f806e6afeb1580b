//! A dpdk port pair forwarding through Knitter, measured: DPDK's testpmd owns two `net_memif`
//! servers and forwards in `mac` mode between them (each frame back to the other port with
//! the other's MAC as destination, seeded with `--tx-first`); Knitter's two `net_memif`
//! clients are access ports of one bridge domain, so every frame testpmd sends crosses
//! Knitter and comes back to testpmd, which sends it again. testpmd's forwarding lcore on one
//! core, Knitter's PMD thread on the other; Knitter's packets per second and busy TSC cycles
//! per packet (rx copy into the pool, pipeline, tx copy into mbufs) are printed.
//!
//!     cargo run --release -p knitter-dpdk --example memif_bench -- [seconds] [rounds]

use std::process::{Command, Stdio};
use vswitch::port::Port;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vswitch::testkit::one_bridge;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let rounds: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    if !dpdk::AVAILABLE {
        return Err("built without DPDK".into());
    }
    let dir = std::env::temp_dir().join(format!("knitter-memif-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (s0, s1) = (dir.join("m0.sock"), dir.join("m1.sock"));
    let (a, b) = ("02:00:00:00:00:0a", "02:00:00:00:00:0b");
    let mut testpmd = Command::new("dpdk-testpmd")
        .args(["-l", "0,1", "--no-pci", "--no-huge", "-m", "512", "--single-file-segments"])
        .arg(format!("--file-prefix=tp-{}", std::process::id()))
        .arg(format!("--vdev=net_memif0,role=server,socket={},socket-abstract=no,mac={a}", s0.display()))
        .arg(format!("--vdev=net_memif1,role=server,socket={},socket-abstract=no,mac={b}", s1.display()))
        .args(["--", "-i", "--nb-cores=1", "--total-num-mbufs=8192", "--forward-mode=mac"])
        .arg(format!("--eth-peer=0,{b}"))
        .arg(format!("--eth-peer=1,{a}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(s0.exists() && s1.exists()) {
        if Instant::now() > deadline {
            let _ = testpmd.kill();
            return Err("testpmd made no memif sockets".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The servers' interfaces join their sockets when testpmd starts its ports, a moment
    // after the sockets appear (a client that connects before is told "ID not found").
    std::thread::sleep(Duration::from_secs(2));
    let mut eal = dpdk::eal::default_args(&format!("kn-{}", std::process::id()), &[]);
    if std::env::var_os("MEMIF_DEBUG").is_some() {
        eal.extend(["--log-level".into(), "pmd.net.memif:debug".into()]);
    }
    dpdk::eal::init(&eal)?;
    let pool = vswitch::Pool::new(16384, false)?;
    let switch = vswitch::Switch::new(pool, vswitch::SwitchOptions::default());
    let opts = dpdk::PortOptions::default();
    let p0 = dpdk::DpdkPort::open("m0", &format!("net_memif_k0,role=client,socket={},socket-abstract=no", s0.display()), &opts)?;
    let p1 = dpdk::DpdkPort::open("m1", &format!("net_memif_k1,role=client,socket={},socket-abstract=no", s1.display()), &opts)?;
    switch.register_port("m0", p0.clone() as Arc<dyn vswitch::port::Port>)?;
    switch.register_port("m1", p1.clone() as Arc<dyn vswitch::port::Port>)?;
    switch.apply(one_bridge(&["m0", "m1"]))?;
    let pmd = vswitch::PmdSet::start(switch.clone(), &vswitch::PmdConfig { threads: 1, cores: vec![0], idle: vswitch::IdlePolicy::Busy })?;
    // Once both memif links are up, testpmd starts, seeding the loop with 4 bursts per port.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        p0.refresh_link();
        p1.refresh_link();
        if p0.link_up() && p1.link_up() {
            break;
        }
        if Instant::now() > deadline {
            let _ = testpmd.kill();
            return Err("the memif links did not come up".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stdin = testpmd.stdin.take().ok_or("testpmd stdin")?;
    use std::io::Write as _;
    writeln!(stdin, "start tx_first 4")?;
    std::thread::sleep(Duration::from_secs(2)); // learn, settle
    println!("{:>6} {:>12} {:>10} {:>10}", "round", "Mpps", "cycles/pkt", "drops");
    for r in 0..rounds {
        let before = switch.stats();
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let after = switch.stats();
        let dt = t.elapsed().as_secs_f64();
        let packets = after.packets - before.packets;
        let busy = after.busy_cycles - before.busy_cycles;
        let drops: u64 = after.drops.iter().sum::<u64>() - before.drops.iter().sum::<u64>();
        println!("{:>6} {:>12.3} {:>10.1} {:>10}", r + 1, packets as f64 / dt / 1e6, busy as f64 / packets.max(1) as f64, drops);
    }
    pmd.stop();
    let _ = writeln!(stdin, "quit");
    std::thread::sleep(Duration::from_millis(500));
    let _ = testpmd.kill();
    let _ = testpmd.wait();
    switch.apply(vswitch::config::SwitchConfig::default())?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
