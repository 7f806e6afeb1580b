//! Control-plane latency while a media plane floods: a switch with one busy PMD thread
//! (core 0) carries two VXLAN networks from two pods to one peer over the underlay — a
//! `control` network (priority, DSCP 40) and a `media` one (DSCP 34). This program (core 1)
//! is both pods and the far end of the underlay: it first measures what the PMD forwards of
//! the media pod's traffic alone (its capacity), then offers the media plane at `--load`
//! times that (2 by default; what the pod's ring refuses is the media pod's loss) while the
//! control pod sends `--control-pps` timestamped frames, and reports each control frame's
//! latency from its pod's ring to the underlay's far end (p50/p99/p99.9/max) and losses.
//!
//! `--underlay-pps R` drains the underlay at R frames a second instead of at once (the
//! uplink is then the bottleneck: the switch's priority queue decides, and the underlay's
//! ring of `--ring` slots, a FIFO beyond the switch, adds up to ring/R of waiting);
//! `--no-priority` runs the control network as an ordinary one.
//!
//!     cargo run --release -p knitter-vswitch --example qos_latency -- --seconds 3
//!     cargo run --release -p knitter-vswitch --example qos_latency -- --underlay-pps 500000 --ring 256
//!
//! The pods and the underlay are in-memory rings (what a kernel or guest ring would be to
//! the switch); media frames are recycled from the underlay's far end back into the media
//! pod's ring (their outer headers stripped), so the generator is not the bottleneck.

use anyhow::{Context, Result, bail};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vswitch::config::{BridgeConfig, PortConfig, StaticMac, SwitchConfig, VtepConfig};
use vswitch::port::ring::{RingPeer, RingPort};
use vswitch::testkit::{frames, mac};
use vswitch::{
    Batch, BufId, IdlePolicy, PmdConfig, PmdSet, Pool, PoolCache, Switch, SwitchOptions,
};

const CONTROL_VNI: u32 = 100;
const MEDIA_VNI: u32 = 200;
/// Outer headers of an IPv4 VXLAN frame on an untagged underlay.
const OUTER: usize = 50;
/// Where a control frame carries its send time (the inner UDP payload).
const STAMP: usize = 42;

struct Args {
    seconds: f64,
    load: f64,
    control_pps: f64,
    underlay_pps: f64,
    ring: usize,
    media_size: usize,
    priority: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        seconds: 3.0,
        load: 2.0,
        control_pps: 10_000.0,
        underlay_pps: 0.0,
        ring: 1024,
        media_size: 512,
        priority: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--seconds" => a.seconds = v()?.parse()?,
            "--load" => a.load = v()?.parse()?,
            "--control-pps" => a.control_pps = v()?.parse()?,
            "--underlay-pps" => a.underlay_pps = v()?.parse()?,
            "--ring" => a.ring = v()?.parse()?,
            "--media-size" => a.media_size = v()?.parse()?,
            "--no-priority" => a.priority = false,
            _ => bail!("unknown argument {k} (see the program's doc)"),
        }
    }
    Ok(a)
}

fn pod_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

struct Rig {
    switch: Arc<Switch>,
    pmd: Option<PmdSet>,
    control: RingPeer,
    media: RingPeer,
    up: RingPeer,
    cache: PoolCache,
}

fn rig(a: &Args) -> Result<Rig> {
    let pool = Pool::new(131_072, true)?;
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    let (control, control_peer) = RingPort::new("control", 1, 256)?;
    let (media, media_peer) = RingPort::new("media", 1, 256)?;
    let (up, up_peer) = RingPort::new("up", 1, a.ring)?;
    switch.register_port("control", control)?;
    switch.register_port("media", media)?;
    switch.register_port("up", up.with_mac(mac(0xa0)))?;
    let (local, peer): (IpAddr, IpAddr) = ("198.51.100.1".parse()?, "198.51.100.2".parse()?);
    let network = |name: &str, vni: u32, far: u32, dscp: u8| {
        let mut b = BridgeConfig::new(name).vni(vni).flood(&[peer]);
        b.dscp = Some(dscp);
        b.static_macs.push(StaticMac { mac: mac(far), port: None, remote: Some(peer) });
        b
    };
    let mut control_net = network("control", CONTROL_VNI, 11, 40);
    control_net.priority = a.priority;
    switch.apply(SwitchConfig {
        bridges: vec![control_net, network("media", MEDIA_VNI, 12, 34)],
        ports: vec![
            PortConfig::access("control", "control"),
            PortConfig::access("media", "media"),
            PortConfig::underlay("up"),
        ],
        vtep: Some(VtepConfig::new(local, "up").peer(peer, mac(0xb0))),
    })?;
    let pmd = PmdSet::start(
        switch.clone(),
        &PmdConfig { threads: 1, cores: vec![0], idle: IdlePolicy::Busy },
    )?;
    vswitch::pmd::pin_current_thread(1);
    Ok(Rig {
        cache: PoolCache::new(pool),
        switch,
        pmd: Some(pmd),
        control: control_peer,
        media: media_peer,
        up: up_peer,
    })
}

/// The media pod: frames ready to send (fresh, or recycled from the underlay's far end).
struct MediaPod {
    template: Vec<u8>,
    spare: Vec<BufId>,
    offered: u64,
    refused: u64,
}

impl MediaPod {
    /// Offers up to `n` frames to the media pod's ring, a batch at a time; what it refuses
    /// counts as the pod's loss (the buffers are kept for the next offer).
    fn offer(&mut self, ring: &mut RingPeer, cache: &mut PoolCache, mut n: u64) {
        let mut batch = Batch::new();
        while n > 0 {
            while n > 0 && batch.room() > 0 {
                let Some(b) = self.spare.pop().or_else(|| cache.alloc_frame(&self.template)) else {
                    break;
                };
                if let Err(b) = batch.push(b) {
                    self.spare.push(b);
                    break;
                }
                n -= 1;
            }
            if batch.is_empty() {
                return;
            }
            let k = batch.len() as u64;
            let taken = ring.send(0, &mut batch) as u64;
            self.offered += k;
            self.refused += k - taken;
            self.spare.extend(batch.drain());
            if taken < k {
                // The ring is full: the rest of this offer is refused too.
                self.offered += n;
                self.refused += n;
                return;
            }
        }
    }
}

/// What the underlay's far end saw.
#[derive(Default)]
struct FarEnd {
    latencies_ns: Vec<u64>,
    media: u64,
    taken: u64,
}

impl FarEnd {
    /// Takes up to `budget` frames from the underlay: control frames' latencies recorded,
    /// media frames stripped back to the pod's frame and kept for it.
    fn drain(
        &mut self,
        pool: &Pool,
        up: &mut RingPeer,
        cache: &mut PoolCache,
        pod: &mut MediaPod,
        start: Instant,
        budget: u64,
    ) {
        let mut batch = Batch::new();
        let mut left = budget;
        while left > 0 && up.recv(0, &mut batch) > 0 {
            let now = start.elapsed().as_nanos() as u64;
            for mut b in batch.drain() {
                self.taken += 1;
                left = left.saturating_sub(1);
                let h = pool.head(&b);
                let vni = h.get(46..49).map_or(0, |v| u32::from_be_bytes([0, v[0], v[1], v[2]]));
                if vni == CONTROL_VNI {
                    let at = OUTER + STAMP;
                    if let Some(t) = h.get(at..at + 8) {
                        let sent = u64::from_le_bytes(t.try_into().unwrap_or_default());
                        self.latencies_ns.push(now.saturating_sub(sent));
                    }
                    cache.free(b);
                } else {
                    self.media += 1;
                    if pool.strip(&mut b, OUTER) {
                        pod.spare.push(b);
                    } else {
                        cache.free(b);
                    }
                }
            }
            // A budget that ends mid-batch (a rate-limited underlay) takes whole batches:
            // within a batch of the rate.
        }
    }
}

/// Runs the pods and the far end for `secs`: media offered at `media_pps` (0: as fast as the
/// ring takes it), control at `control_pps`, the underlay drained at `underlay_pps` (0: at
/// once). Returns the far end's view, the media pod's, the control frames sent, and the
/// media frames a second the switch took from the media pod's ring while offering.
fn run(
    r: &mut Rig,
    a: &Args,
    secs: f64,
    media_pps: f64,
    control_pps: f64,
) -> (FarEnd, MediaPod, u64, f64) {
    let media_port = r.switch.snapshot().port_id("media").unwrap_or(0) as usize;
    let rx = |r: &Rig| r.switch.stats().ports.get(media_port).map_or(0, |p| p.rx_packets);
    let rx0 = rx(r);
    let pool = r.switch.pool().clone();
    let media_frame =
        frames::udp4(mac(12), mac(2), pod_ip(2), pod_ip(12), 4000, 4000, a.media_size);
    let mut control_frame = frames::udp4(mac(11), mac(1), pod_ip(1), pod_ip(11), 5000, 5000, 128);
    let mut pod = MediaPod { template: media_frame, spare: Vec::new(), offered: 0, refused: 0 };
    let mut far = FarEnd {
        latencies_ns: Vec::with_capacity((control_pps * secs) as usize + 16),
        ..Default::default()
    };
    let start = Instant::now();
    let end = Duration::from_secs_f64(secs);
    let (mut controls, mut control_refused) = (0u64, 0u64);
    loop {
        let t = start.elapsed();
        if t >= end {
            break;
        }
        let secs_in = t.as_secs_f64();
        // Control frames due.
        let due = (control_pps * secs_in) as u64;
        while controls < due {
            let now = start.elapsed().as_nanos() as u64;
            control_frame[STAMP..STAMP + 8].copy_from_slice(&now.to_le_bytes());
            controls += 1;
            match r.cache.alloc_frame(&control_frame) {
                Some(b) => {
                    if let Err(b) = r.control.send_one(0, b) {
                        control_refused += 1;
                        r.cache.free(b);
                    }
                }
                None => control_refused += 1,
            }
        }
        // Media frames due (a burst's worth at a time).
        let want = if media_pps > 0.0 {
            ((media_pps * secs_in) as u64).saturating_sub(pod.offered).min(256)
        } else {
            256
        };
        pod.offer(&mut r.media, &mut r.cache, want);
        let budget = if a.underlay_pps > 0.0 {
            ((a.underlay_pps * secs_in) as u64).saturating_sub(far.taken)
        } else {
            u64::MAX
        };
        far.drain(&pool, &mut r.up, &mut r.cache, &mut pod, start, budget);
    }
    let media_rx_pps = (rx(r) - rx0) as f64 / start.elapsed().as_secs_f64();
    // Let what is in flight arrive, then account for it (latencies of late ones count).
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(200) {
        far.drain(&pool, &mut r.up, &mut r.cache, &mut pod, start, u64::MAX);
    }
    if control_refused > 0 {
        eprintln!("  control pod ring refused {control_refused} frames");
    }
    for b in pod.spare.drain(..) {
        r.cache.free(b);
    }
    (far, pod, controls, media_rx_pps)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p / 100.0).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

fn main() -> Result<()> {
    let a = args()?;
    let mut r = rig(&a)?;
    // The PMD's capacity for the media pod's traffic alone (its ring kept full).
    let (_, pod, _, media_rx_pps) = run(&mut r, &a, 1.0, 0.0, 0.0);
    let capacity = if a.underlay_pps > 0.0 { a.underlay_pps } else { media_rx_pps };
    println!(
        "capacity: {:.0} frames/s ({}; the media pod's ring refused {:.1}% of what was offered unpaced)",
        capacity,
        if a.underlay_pps > 0.0 {
            "the underlay's drain rate"
        } else {
            "what the PMD took from the media pod's ring alone"
        },
        100.0 * pod.refused as f64 / pod.offered.max(1) as f64
    );

    let base = r.switch.stats();
    let media_pps = a.load * capacity;
    let (far, pod, sent, media_rx_pps) = run(&mut r, &a, a.seconds, media_pps, a.control_pps);
    let s = r.switch.stats();
    let up = r.switch.snapshot().port_id("up").context("up port")? as usize;
    let (u0, u1) = (
        base.ports.get(up).cloned().unwrap_or_default(),
        s.ports.get(up).cloned().unwrap_or_default(),
    );
    let mut l = far.latencies_ns;
    l.sort_unstable();
    println!(
        "media offered {:.0}/s ({:.2}x capacity; the pod's ring refused {:.1}%), the switch took {:.0}/s, reached the far end {:.0}/s",
        pod.offered as f64 / a.seconds,
        pod.offered as f64 / a.seconds / capacity,
        100.0 * pod.refused as f64 / pod.offered.max(1) as f64,
        media_rx_pps,
        far.media as f64 / a.seconds
    );
    println!(
        "control ({}): sent {sent}, received {} (lost {}), latency us p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}",
        if a.priority { "priority" } else { "no priority" },
        l.len(),
        sent.saturating_sub(l.len() as u64),
        pct(&l, 50.0),
        pct(&l, 99.0),
        pct(&l, 99.9),
        pct(&l, 100.0)
    );
    println!(
        "underlay: tx {} (priority {}, held {}), drops tx_full {} priority_dropped {}",
        u1.tx_packets - u0.tx_packets,
        u1.tx_priority - u0.tx_priority,
        u1.priority_held - u0.priority_held,
        s.drop(vswitch::DropReason::TxFull) - base.drop(vswitch::DropReason::TxFull),
        u1.priority_dropped - u0.priority_dropped
    );
    if let Some(p) = r.pmd.take() {
        p.stop();
    }
    let mut cache = PoolCache::new(r.switch.pool().clone());
    for peer in [&mut r.control, &mut r.media, &mut r.up] {
        peer.drain(&mut cache);
    }
    Ok(())
}
