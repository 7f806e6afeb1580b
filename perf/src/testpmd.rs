//! dpdk-testpmd in the lab's two roles: the **generator** (a pcap port replays the offered
//! frames into one virtio-user port; what reaches the other is counted and dropped, and
//! that port first sends the scenario's learning frame so a learning switch knows where it
//! is), and the **yardstick** (two `net_vhost` ports with `io` forwarding: no
//! switching at all, two copies per frame). Both run with their forwarding lcore where the
//! layout says and their main lcore elsewhere, in memory of their own (`--in-memory`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// How DPDK gets its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Memory {
    /// 2 MiB hugepages (the real numbers).
    Hugepages,
    /// Plain pages: works anywhere, slower (page faults, TLB misses on every copy).
    Plain,
}

impl Memory {
    /// Before a DPDK process starts: with hugepages, waits (up to 5 s) for its `-m` to be
    /// free — the previous round's processes may still be giving theirs back.
    pub fn await_room(self) {
        if self == Memory::Hugepages {
            let _ =
                crate::hugepages::await_free(crate::hugepages::DPDK_MIB, Duration::from_secs(5));
        }
    }

    fn eal(self) -> &'static [&'static str] {
        match self {
            Memory::Hugepages => &["--in-memory", "-m", "1024", "--single-file-segments"],
            Memory::Plain => &["--no-huge", "-m", "1024", "--single-file-segments"],
        }
    }
}

/// Is dpdk-testpmd installed?
pub fn available() -> bool {
    Command::new("dpdk-testpmd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// An interactive testpmd: commands on stdin, output in a file.
pub struct Testpmd {
    child: Child,
    stdin: Option<ChildStdin>,
    out: PathBuf,
    /// Its `--file-prefix`: DPDK leaves /var/run/dpdk/<prefix> behind, even in memory.
    prefix: String,
}

/// Has the child stopped (SIGTERM) when knitter-perf goes away, even killed: a switch or
/// generator left behind would spin a CPU forever.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl, sigemptyset and pthread_sigmask are async-signal-safe and touch only
    // the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // knitter-perf blocks SIGINT and SIGTERM in its threads (`interrupt.rs`); the
            // mask is inherited across exec, and a child with SIGTERM blocked would never
            // hear its parent die (nor stop on the SIGTERM sent to stop it).
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

impl Testpmd {
    /// Starts dpdk-testpmd (inside network namespace `netns` when given).
    fn spawn(
        out: PathBuf,
        prefix: &str,
        args: &[String],
        netns: Option<&str>,
    ) -> anyhow::Result<Testpmd> {
        let log = std::fs::File::create(&out)?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "stdbuf"]);
                c
            }
            None => Command::new("stdbuf"),
        };
        let mut child = die_with_parent(&mut cmd)
            .args(["-oL", "-eL", "dpdk-testpmd"])
            .arg(format!("--file-prefix={prefix}"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting dpdk-testpmd: {e}"))?;
        let stdin = child.stdin.take();
        Ok(Testpmd { child, stdin, out, prefix: prefix.to_string() })
    }

    pub fn say(&mut self, line: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{line}");
        }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits (bounded) until the output contains `what`.
    pub fn wait_for(&self, what: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while !self.output().contains(what) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "dpdk-testpmd never said {what:?} (its output {})",
                log_tail(&self.out)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.say("stop");
        self.say("quit");
        self.stdin = None;
        stop_child(&mut self.child, None);
        remove_runtime_dir(&self.prefix);
    }
}

/// Waits up to 5 s for `child` to end — sending `signal` first, and again while it runs,
/// when given — then kills it.
pub fn stop_child(child: &mut Child, signal: Option<i32>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
        if let Some(sig) = signal {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// DPDK keeps a runtime directory per file prefix, even with `--in-memory`.
pub fn remove_runtime_dir(prefix: &str) {
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(prefix));
}

/// The last lines of a program's output, on one line (an error message's).
fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// Where a program's log is and how it ends, for an error message: `path: last | lines`.
pub fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => format!("{}: {}", path.display(), tail(&s)),
        Ok(_) => format!("{} (empty)", path.display()),
        Err(e) => format!("{}: {e}", path.display()),
    }
}

/// Where the generator and the switch run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// The generator's forwarding lcore (and every other thread of the lab).
    pub generator_cpu: usize,
    /// The switch's forwarding thread (PMD).
    pub switch_cpu: usize,
    /// The second switch's PMD in the two-VTEP scenario (none: the switch CPU, shared).
    #[serde(default)]
    pub second_switch_cpu: Option<usize>,
}

/// How the VNF (the generator's `net_virtio_user` ports) sets up its virtqueues: users pick
/// these, so a headline holds across them or it is not a headline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Vnf {
    /// Queue pairs each virtio-user port is created with (`queues=`): what it negotiates.
    pub queues: u16,
    /// Queue pairs testpmd configures and sends on (`--rxq/--txq`, ≤ `queues`): a VNF that
    /// negotiated four and enables one is the common case.
    pub queues_used: u16,
    /// Entries of each virtqueue (`queue_size=`) and descriptors testpmd gives each queue
    /// (`--rxd/--txd`).
    pub ring: u16,
    /// More `net_virtio_user` options for both ports (`in_order=0`, `packed_vq=1`,
    /// `mrg_rxbuf=0`): the driver paths a VNF picks.
    #[serde(default)]
    pub devargs: String,
    /// testpmd's `--txfreet`: how many transmit descriptors the VNF's driver leaves used
    /// before it frees their buffers (0: the driver's default; DPDK's virtio driver frees
    /// only when all but 32 of the ring are used).
    #[serde(default)]
    pub tx_free: u16,
}

impl Default for Vnf {
    fn default() -> Vnf {
        Vnf { queues: 1, queues_used: 1, ring: 256, devargs: String::new(), tx_free: 0 }
    }
}

impl Vnf {
    /// What the report says of it.
    pub fn describe(&self) -> String {
        let extra =
            if self.devargs.is_empty() { String::new() } else { format!(", `{}`", self.devargs) };
        let free = if self.tx_free == 0 {
            "the driver's own transmit free threshold".to_string()
        } else {
            format!("`--txfreet={}`", self.tx_free)
        };
        let more = std::env::var("KNITTER_PERF_TESTPMD_ARGS")
            .ok()
            .filter(|a| !a.trim().is_empty())
            .map(|a| format!(", testpmd also given `{}`", a.trim()))
            .unwrap_or_default();
        format!(
            "{} of {} queue pair(s) used, {}-entry virtqueues{extra}, {free}{more}",
            self.queues_used, self.queues, self.ring
        )
    }
}

/// The generator of one trial: offers `a_pcap` (replayed forever) into `a_sock` and counts
/// what comes out of `b_sock`. It is the VNF of the comparison (DPDK's own virtio-user
/// driver), so what each switch costs it is read too: its forwarding cycles
/// (`--record-core-cycles`) and its system calls (kicks are eventfd writes).
pub struct Generator {
    pmd: Testpmd,
    /// At [`Generator::clear`]: the VNF's counters, to take the window's share.
    start: Option<VnfCounters>,
}

/// The VNF's own counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
struct VnfCounters {
    at: Instant,
    /// testpmd's forwarding cycles (busy bursts only) since `start`.
    busy_cycles: Option<u64>,
    /// Frames received on B since start.
    received: Option<u64>,
    /// `syscw` and `syscr` of /proc/PID/io: write and read system calls.
    writes: Option<u64>,
    reads: Option<u64>,
}

/// What a switch cost the VNF over a window.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct VnfCost {
    /// The generator's forwarding cycles per frame received on B (its pcap replay
    /// included: the same for every switch, so the differences are the switch's).
    pub cycles_per_packet: Option<f64>,
    /// Write system calls a second (eventfd kicks to the switch) and read ones.
    pub writes_per_s: Option<f64>,
    pub reads_per_s: Option<f64>,
}

/// What a measurement window gave, in packets per second.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Rates {
    /// Sent into the switch on A.
    pub offered: f64,
    /// Received from the switch on B.
    pub received: f64,
    /// Bytes per frame received on B (testpmd's Rx-bps over Rx-pps; no FCS): a check that
    /// the frames that came out are the size offered.
    pub received_frame_bytes: Option<f64>,
}

/// What the generator connects: the switch's socket it offers frames to and the one it
/// counts frames from, the frames offered (replayed forever), the one frame the counting
/// side sends first (so a learning switch knows where it is: a tagged frame on a trunk, a
/// VXLAN frame from the remote VTEP on an underlay), and the MACs of its two virtio-user
/// ports.
pub struct Wiring<'a> {
    pub offer_sock: &'a Path,
    pub count_sock: &'a Path,
    pub offer_pcap: &'a Path,
    pub back_pcap: &'a Path,
    pub offer_mac: &'a str,
    pub count_mac: &'a str,
    /// Frames in the offer's pcap, each held in an mbuf of its own while it is replayed.
    pub offered_frames: usize,
    /// Frames in the back pcap (one a host behind the counting side, `mrr --macs`).
    pub back_frames: usize,
}

impl Generator {
    pub fn start(
        work: &Path,
        tag: &str,
        w: &Wiring,
        mem: Memory,
        layout: Layout,
        vnf: Vnf,
    ) -> anyhow::Result<Generator> {
        let Wiring {
            offer_sock,
            count_sock,
            offer_pcap,
            back_pcap,
            offer_mac,
            count_mac,
            offered_frames,
            back_frames,
        } = w;
        let other = layout.switch_cpu;
        let mut args: Vec<String> = vec![
            "-l".into(),
            format!("{},{}", layout.generator_cpu, other),
            "--main-lcore".into(),
            other.to_string(),
            "--no-pci".into(),
        ];
        args.extend(mem.eal().iter().map(|s| s.to_string()));
        mem.await_room();
        // io forwarding pairs ports 0↔1 and 2↔3: the offered frames go 0 → 1 (into the
        // switch); what the switch sends to port 2 goes to port 3, a pcap port with no
        // transmit file, which drops it for nothing (a pcap writing /dev/null cost the
        // generator ~30 % of its time). Port 3 replays its file once: the learning frame,
        // sent into the switch from port 2. testpmd's own `start tx_first` burst cannot be
        // tagged or encapsulated, and a pod port with port security drops its default
        // addresses.
        // With several queues each pcap port has one replay per queue, so io forwarding's
        // streams (pcap queue i → virtio-user queue i) spread the offer evenly.
        let used = vnf.queues_used.clamp(1, vnf.queues.max(1)) as usize;
        let (offer, back) = (offer_pcap.display(), back_pcap.display());
        args.push(format!(
            "--vdev=net_pcap0,{}infinite_rx=1",
            format!("rx_pcap={offer},tx_pcap=/dev/null,").repeat(used)
        ));
        let ring = vnf.ring.max(64);
        let extra =
            if vnf.devargs.is_empty() { String::new() } else { format!(",{}", vnf.devargs) };
        args.push(format!(
            "--vdev=net_virtio_user0,path={},queues={},queue_size={ring},mac={offer_mac}{extra}",
            offer_sock.display(),
            vnf.queues.max(1)
        ));
        args.push(format!(
            "--vdev=net_virtio_user1,path={},queues={},queue_size={ring},mac={count_mac}{extra}",
            count_sock.display(),
            vnf.queues.max(1)
        ));
        args.push(format!("--vdev=net_pcap1,{}", vec![format!("rx_pcap={back}"); used].join(",")));
        let mbufs = (16384usize).max(4 * 2 * used * ring as usize + 8192) + used * offered_frames;
        args.extend(
            ["--", "-i", "--nb-cores=1", "--no-flush-rx", "--record-core-cycles"].map(String::from),
        );
        args.extend([
            format!("--total-num-mbufs={mbufs}"),
            format!("--rxq={used}"),
            format!("--txq={used}"),
            format!("--rxd={ring}"),
            format!("--txd={ring}"),
        ]);
        if vnf.tx_free > 0 {
            // DPDK's virtio driver refuses a threshold of the ring less 3 or more, and testpmd
            // then runs without the queue: a run that measures nothing.
            anyhow::ensure!(
                vnf.tx_free < ring - 3,
                "--vnf-tx-free {}: below the ring's {ring} entries less 3",
                vnf.tx_free
            );
            args.push(format!("--txfreet={}", vnf.tx_free));
        }
        // For diagnosis (`--record-burst-stats`, say): read in the kept work directory.
        args.extend(
            std::env::var("KNITTER_PERF_TESTPMD_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from),
        );
        let mut t = Testpmd::spawn(
            work.join(format!("gen-{tag}.out")),
            &format!("kp-gen-{tag}"),
            &args,
            None,
        )?;
        t.wait_for("testpmd>", Duration::from_secs(30))?;
        if *back_frames > 1 {
            // Many hosts speak first: io forwarding drops what a full transmit ring does not
            // take, and a switch that floods their frames (their destinations not yet known)
            // takes them slower than a pcap replays them, so most would never arrive and
            // their hosts never be learned. Forwarding that retries a full ring (1 µs, up to
            // 64 times) while they go, then plain io forwarding for the trial.
            t.say("set fwd io retry");
            t.say("start");
            std::thread::sleep(
                Duration::from_secs(1) + Duration::from_micros(*back_frames as u64 * 40),
            );
            t.say("stop");
        }
        t.say("set fwd io");
        t.say("start");
        Ok(Generator { pmd: t, start: None })
    }

    /// Its counters now (the CLI answers in its output file).
    fn counters(&mut self) -> VnfCounters {
        let before = self.pmd.output().len();
        // The port's counters, then the forwarding statistics, whose last line is the
        // cycles one (printed only once something moved): wait for that line, not for the
        // first block that names port 2 (the forwarding statistics have one of their own).
        self.pmd.say("show port stats 2");
        self.pmd.say("show fwd stats all");
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.pmd.child.id()))
            .unwrap_or_default();
        let at = Instant::now();
        loop {
            let out = self.pmd.output();
            let fresh = out.get(before..).unwrap_or("");
            let (received, cycles) = (last_count(fresh, 2, "RX-packets:"), busy_cycles(fresh));
            let waited = at.elapsed();
            if (received.is_some() && (cycles.is_some() || waited > Duration::from_secs(2)))
                || waited > Duration::from_secs(5)
            {
                return VnfCounters {
                    at,
                    busy_cycles: cycles,
                    received,
                    writes: io_count(&io, "syscw:"),
                    reads: io_count(&io, "syscr:"),
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the switch cost the VNF since [`Generator::clear`].
    pub fn cost(&mut self) -> VnfCost {
        let Some(a) = self.start else { return VnfCost::default() };
        let b = self.counters();
        let secs = (b.at - a.at).as_secs_f64().max(1e-9);
        let delta = |x: Option<u64>, y: Option<u64>| Some(y?.checked_sub(x?)? as f64);
        let frames = delta(a.received, b.received).filter(|f| *f > 0.0);
        VnfCost {
            cycles_per_packet: delta(a.busy_cycles, b.busy_cycles).zip(frames).map(|(c, f)| c / f),
            writes_per_s: delta(a.writes, b.writes).map(|w| w / secs),
            reads_per_s: delta(a.reads, b.reads).map(|r| r / secs),
        }
    }

    /// Starts a measurement window: testpmd reports each port's rate since the previous
    /// `show port stats` of it, timed by its own clock — the CLI runs on a busy CPU and may
    /// answer late, so our own clock would be wrong by that much.
    pub fn clear(&mut self) {
        self.pmd.say("show port stats 1");
        self.pmd.say("show port stats 2");
        self.start = Some(self.counters());
    }

    /// The rates since [`Generator::clear`].
    pub fn read(&mut self) -> anyhow::Result<Rates> {
        let before = self.pmd.output().len();
        self.pmd.say("show port stats 1");
        self.pmd.say("show port stats 2");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = self.pmd.output();
            let fresh = out.get(before..).unwrap_or("");
            if let (Some(tx), Some(rx)) =
                (last_count(fresh, 1, "Tx-pps:"), last_count(fresh, 2, "Rx-pps:"))
            {
                let bytes = last_count(fresh, 2, "Rx-bps:")
                    .filter(|_| rx > 0)
                    .map(|bps| bps as f64 / 8.0 / rx as f64);
                return Ok(Rates {
                    offered: tx as f64,
                    received: rx as f64,
                    received_frame_bytes: bytes,
                });
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no port statistics from the generator (its output {})",
                log_tail(&self.pmd.out)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// testpmd's forwarding cycles in the last `show fwd stats` of `out`
/// (`CPU cycles/packet=… (total cycles=N / total io packets=…` in DPDK 22.11, `busy
/// cycles=N` in later releases).
fn busy_cycles(out: &str) -> Option<u64> {
    let at = out.rfind(" cycles=")? + " cycles=".len();
    out[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A counter of /proc/PID/io.
fn io_count(io: &str, field: &str) -> Option<u64> {
    io.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().parse().ok())
}

/// The count after `field` in the last "NIC statistics for port `port`" block of `out`
/// (`show port stats`; not the "Forward statistics" block of `show fwd stats`).
fn last_count(out: &str, port: u16, field: &str) -> Option<u64> {
    let at = out.rfind(&format!("NIC statistics for port {port} "))?;
    let block = &out[at..];
    let i = block.find(field)? + field.len();
    block[i..].split_whitespace().next()?.parse().ok()
}

/// The yardstick: testpmd forwarding between two `net_vhost` servers on `a_sock`, `b_sock`.
pub fn yardstick(
    work: &Path,
    a_sock: &Path,
    b_sock: &Path,
    mem: Memory,
    layout: Layout,
) -> anyhow::Result<Testpmd> {
    let vdevs = [
        format!("net_vhost0,iface={},queues=1", a_sock.display()),
        format!("net_vhost1,iface={},queues=1", b_sock.display()),
    ];
    io_forwarding(work, &vdevs, None, mem, layout)
}

/// The yardstick on kernel interfaces: testpmd's `io` forwarding between DPDK's own AF_XDP
/// ports on `a_if` and `b_if` in network namespace `netns` (DPDK loads its default XDP
/// program: every frame of queue 0 to the socket).
pub fn yardstick_af_xdp(
    work: &Path,
    netns: &str,
    a_if: &str,
    b_if: &str,
    mem: Memory,
    layout: Layout,
) -> anyhow::Result<Testpmd> {
    let vdevs = [
        format!("net_af_xdp0,iface={a_if},start_queue=0,queue_count=1"),
        format!("net_af_xdp1,iface={b_if},start_queue=0,queue_count=1"),
    ];
    io_forwarding(work, &vdevs, Some(netns), mem, layout)
}

/// testpmd forwarding between two ports (`io`: no switching), its forwarding core on the
/// switch CPU.
fn io_forwarding(
    work: &Path,
    vdevs: &[String; 2],
    netns: Option<&str>,
    mem: Memory,
    layout: Layout,
) -> anyhow::Result<Testpmd> {
    let mut args: Vec<String> = vec![
        "-l".into(),
        format!("{},{}", layout.generator_cpu, layout.switch_cpu),
        "--main-lcore".into(),
        layout.generator_cpu.to_string(),
        "--no-pci".into(),
    ];
    args.extend(mem.eal().iter().map(|s| s.to_string()));
    mem.await_room();
    args.extend(vdevs.iter().map(|v| format!("--vdev={v}")));
    args.extend(
        ["--", "-i", "--nb-cores=1", "--forward-mode=io", "--total-num-mbufs=16384"]
            .map(String::from),
    );
    let mut t = Testpmd::spawn(work.join("yardstick.out"), "kp-yardstick", &args, netns)?;
    t.wait_for("testpmd>", Duration::from_secs(30))?;
    t.say("start");
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_statistics_are_read_from_the_last_block() {
        let out = "  ######## NIC statistics for port 2  ########\n  RX-packets: 5 RX-missed: 0\n  TX-packets: 1\n\
                   ######## NIC statistics for port 1  ########\n  RX-packets: 0\n  TX-packets: 777\n\
                   Throughput (since last show)\n  Rx-pps:            0          Rx-bps:            0\n  Tx-pps:      7123456          Tx-bps:   3647209472\n\
                   ######## NIC statistics for port 2  ########\n  RX-packets: 123456  RX-missed: 0\n\
                   Throughput (since last show)\n  Rx-pps:      7012345          Rx-bps:   3590320640\n";
        assert_eq!(last_count(out, 2, "RX-packets:"), Some(123456));
        assert_eq!(last_count(out, 1, "TX-packets:"), Some(777));
        assert_eq!(last_count(out, 1, "Tx-pps:"), Some(7123456));
        assert_eq!(last_count(out, 2, "Rx-pps:"), Some(7012345));
        assert_eq!(last_count(out, 3, "RX-packets:"), None);
        let fwd = "  ---------------------- Forward statistics for port 2  ----------------------\n  RX-packets: 99\n";
        assert_eq!(
            last_count(fwd, 2, "RX-packets:"),
            None,
            "the forwarding statistics count since start, not the port's"
        );
    }

    #[test]
    fn the_vnfs_own_counters_are_read() {
        let out = "  CPU cycles/packet=50.00 (busy cycles=1000 / total io packets=20) at 2600 MHz Clock\n\
                   ...\n  CPU cycles/packet=61.25 (busy cycles=4900 / total io packets=80) at 2600 MHz Clock\n";
        assert_eq!(busy_cycles(out), Some(4900), "the last reading");
        let dpdk_22_11 = "  CPU cycles/packet=44.70 (total cycles=4372591900 / total io packets=97829344) at 2300 MHz Clock\n";
        assert_eq!(busy_cycles(dpdk_22_11), Some(4372591900));
        assert_eq!(busy_cycles("no cycles recorded"), None);
        let io = "rchar: 1\nwchar: 2\nsyscr: 123\nsyscw: 456789\n";
        assert_eq!((io_count(io, "syscw:"), io_count(io, "syscr:")), (Some(456789), Some(123)));
    }
}
