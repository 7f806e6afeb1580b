//! Helpers for tests, benchmarks, fuzzing and the demo: frame builders written independently
//! of the fast path (from the `wire` `Repr`s), and a single-threaded [`Harness`] that drives a
//! switch's pipeline over ring ports deterministically.

pub mod bench;
pub mod fuzz;
pub mod netns;
pub mod pcap;
pub mod vnf;

use crate::batch::Batch;
use crate::buf::{Pool, PoolCache};
use crate::config::SwitchConfig;
use crate::counters::Totals;
use crate::pipeline::Pipeline;
use crate::port::Port;
use crate::port::ring::{RingPeer, RingPort};
use crate::snapshot::ConfigError;
use crate::switch::{Switch, SwitchOptions};
use crate::wire::{MacAddr, arp, checksum, ethernet, icmpv6, ipv4, ipv6, udp, vxlan};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Whether a test's external peer can run: `false` (the test returns early, saying why) when
/// `ready` is not, on a developer's machine; under CI (`CI` set) a skip would be a test that
/// cannot fail, so there it panics, naming what installs the peer.
pub fn peer_available(ready: bool, what: &str, installed_by: &str) -> bool {
    if !ready {
        assert!(std::env::var_os("CI").is_none(), "{what} is missing: {installed_by} provides it");
        eprintln!("skipped: {what} is missing ({installed_by} provides it)");
    }
    ready
}

/// Polls `done` every few milliseconds until it holds or `within` has passed; whether it held.
/// For tests waiting on another thread or the kernel: a fixed sleep before an assertion fails
/// whenever the machine stalls a little longer than the sleep (a VM's vCPU can stop for 10 ms).
pub fn eventually(within: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A thread spinning on one CPU until dropped (at most a minute): "the machine loaded", for
/// tests of what must hold while the other core is busy (a VNF's start, a pod's first frames).
pub struct BusyCpu {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyCpu {
    pub fn start(cpu: usize) -> BusyCpu {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            crate::pmd::pin_current_thread(cpu);
            let t = std::time::Instant::now();
            while !flag.load(Relaxed) && t.elapsed() < std::time::Duration::from_secs(60) {
                std::hint::spin_loop();
            }
        });
        BusyCpu { stop, thread: Some(thread) }
    }
}

impl Drop for BusyCpu {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `program` runs (`program --version` succeeds to start).
pub fn runs(program: &str) -> bool {
    std::process::Command::new(program).arg("--version").output().is_ok()
}

/// The smallest useful configuration: every port an untagged member of bridge domain "red".
pub fn one_bridge(ports: &[&str]) -> crate::config::SwitchConfig {
    crate::config::SwitchConfig {
        bridges: vec![crate::config::BridgeConfig::new("red")],
        ports: ports.iter().map(|p| crate::config::PortConfig::access(p, "red")).collect(),
        vtep: None,
    }
}

/// A locally administered unicast MAC with `n` in its low bytes.
pub fn mac(n: u32) -> MacAddr {
    let b = n.to_be_bytes();
    MacAddr([0x02, 0x00, b[0], b[1], b[2], b[3]])
}

/// Host `n`'s MAC drawn at random (a fixed draw: splitmix64 of `n`), locally administered:
/// such MACs crowd some of a hash table's sets, as a generator's or a VNF's do (counted ones,
/// [`mac`], spread evenly).
pub fn random_mac(n: u32) -> MacAddr {
    let mut z = (n as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let b = (z ^ (z >> 31)).to_be_bytes();
    MacAddr([0x02, b[0], b[1], b[2], b[3], b[4]])
}

/// Asserts two lists of frames are equal, describing the first difference briefly (frames
/// can be 9 KB long: never print them whole).
#[track_caller]
pub fn assert_frames(got: &[Vec<u8>], want: &[Vec<u8>]) {
    assert_eq!(got.len(), want.len(), "number of frames");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let at = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
            let end = |f: &Vec<u8>| f.len().min(at + 8);
            panic!(
                "frame {i} differs at byte {at} (lengths {} and {}): got {:02x?}, want {:02x?}",
                g.len(),
                w.len(),
                &g[at.min(g.len())..end(g)],
                &w[at.min(w.len())..end(w)]
            );
        }
    }
}

/// Frame builders.
pub mod frames {
    use super::*;

    /// An untagged Ethernet frame.
    pub fn eth(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        ethernet::Repr { dst, src, tag: None, ethertype }.emit(&mut f);
        f.extend_from_slice(payload);
        f
    }

    /// A frame with one tag.
    pub fn tagged(
        dst: MacAddr,
        src: MacAddr,
        tpid: u16,
        tci: u16,
        ethertype: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut f = vec![0u8; 18];
        ethernet::Repr { dst, src, tag: Some((tpid, tci)), ethertype }.emit(&mut f);
        f.extend_from_slice(payload);
        f
    }

    /// Adds an 802.1Q tag to an untagged frame.
    pub fn add_tag(frame: &[u8], tpid: u16, tci: u16) -> Vec<u8> {
        let mut f = frame[..12].to_vec();
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&tci.to_be_bytes());
        f.extend_from_slice(&frame[12..]);
        f
    }

    /// An IPv4/UDP frame whose total size is `size` bytes (at least 42), payload patterned.
    pub fn udp4(
        dst: MacAddr,
        src: MacAddr,
        sip: Ipv4Addr,
        dip: Ipv4Addr,
        sport: u16,
        dport: u16,
        size: usize,
    ) -> Vec<u8> {
        let size = size.max(42);
        let plen = size - 42;
        let mut l3 = vec![0u8; 28 + plen];
        ipv4::Repr {
            src: sip,
            dst: dip,
            protocol: ipv4::PROTO_UDP,
            ttl: 64,
            payload_len: (8 + plen) as u16,
            dont_fragment: false,
        }
        .emit(&mut l3);
        udp::emit(&mut l3[20..], sport, dport, (8 + plen) as u16, 0);
        for (i, b) in l3[28..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        eth(dst, src, ethernet::ethertype::IPV4, &l3)
    }

    /// An ICMP echo request (`reply`: an echo reply) with a 16-byte payload.
    pub fn icmp_echo(
        dst: MacAddr,
        src: MacAddr,
        sip: Ipv4Addr,
        dip: Ipv4Addr,
        reply: bool,
        ttl: u8,
    ) -> Vec<u8> {
        let mut l3 = vec![0u8; 20 + 8 + 16];
        ipv4::Repr { src: sip, dst: dip, protocol: 1, ttl, payload_len: 24, dont_fragment: false }
            .emit(&mut l3);
        let icmp = &mut l3[20..];
        icmp[0] = if reply { 0 } else { 8 };
        icmp[4..8].copy_from_slice(&[0x12, 0x34, 0, 1]);
        for (i, b) in icmp[8..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let c = checksum::of(icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        eth(dst, src, ethernet::ethertype::IPV4, &l3)
    }

    /// An ARP request from (mac, spa) for tpa, broadcast.
    pub fn arp_request(src: MacAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
        let mut a = [0u8; 28];
        arp::Repr { op: arp::OP_REQUEST, sha: src, spa, tha: MacAddr::default(), tpa }.emit(&mut a);
        eth(MacAddr::BROADCAST, src, ethernet::ethertype::ARP, &a)
    }

    /// An ARP reply, unicast.
    pub fn arp_reply(dst: MacAddr, src: MacAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
        let mut a = [0u8; 28];
        arp::Repr { op: arp::OP_REPLY, sha: src, spa, tha: dst, tpa }.emit(&mut a);
        eth(dst, src, ethernet::ethertype::ARP, &a)
    }

    /// The solicited-node multicast group of an address and its MAC.
    pub fn solicited_node(target: Ipv6Addr) -> (Ipv6Addr, MacAddr) {
        let o = target.octets();
        let g = Ipv6Addr::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | o[13] as u16,
            u16::from_be_bytes([o[14], o[15]]),
        );
        let go = g.octets();
        (g, MacAddr([0x33, 0x33, go[12], go[13], go[14], go[15]]))
    }

    /// A neighbor solicitation from (mac, src) for target, to the solicited-node group.
    pub fn ns(src_mac: MacAddr, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let (group, gmac) = solicited_node(target);
        let mut l3 = vec![0u8; 40 + icmpv6::NA_LEN];
        ipv6::Repr {
            src,
            dst: group,
            next_header: ipv6::NEXT_ICMPV6,
            hop_limit: 255,
            payload_len: icmpv6::NA_LEN as u16,
        }
        .emit(&mut l3);
        icmpv6::emit_ns(&mut l3[40..], &src, &group, &target, src_mac);
        eth(gmac, src_mac, ethernet::ethertype::IPV6, &l3)
    }

    /// A solicited neighbor advertisement for `target` from (mac, src) to (dst_mac, dst).
    pub fn na(
        src_mac: MacAddr,
        src: Ipv6Addr,
        target: Ipv6Addr,
        dst_mac: MacAddr,
        dst: Ipv6Addr,
    ) -> Vec<u8> {
        advertisement(src_mac, src, target, dst_mac, dst, false)
    }

    /// [`na`] from a router (the Router flag set): what a gateway answers.
    pub fn router_na(
        src_mac: MacAddr,
        src: Ipv6Addr,
        target: Ipv6Addr,
        dst_mac: MacAddr,
        dst: Ipv6Addr,
    ) -> Vec<u8> {
        advertisement(src_mac, src, target, dst_mac, dst, true)
    }

    fn advertisement(
        src_mac: MacAddr,
        src: Ipv6Addr,
        target: Ipv6Addr,
        dst_mac: MacAddr,
        dst: Ipv6Addr,
        router: bool,
    ) -> Vec<u8> {
        let mut l3 = vec![0u8; 40 + icmpv6::NA_LEN];
        ipv6::Repr {
            src,
            dst,
            next_header: ipv6::NEXT_ICMPV6,
            hop_limit: 255,
            payload_len: icmpv6::NA_LEN as u16,
        }
        .emit(&mut l3);
        icmpv6::emit_na(&mut l3[40..], &src, &dst, &target, src_mac, router);
        eth(dst_mac, src_mac, ethernet::ethertype::IPV6, &l3)
    }

    /// An IPv6 packet from (mac, src) to (dst_mac, dst) whose payload, after extension
    /// headers `ext` (each whole, its first byte the next header), is `upper` of protocol
    /// `proto`; hop limit 255. No checksums are filled in (port security does not read them).
    pub fn ipv6(
        src_mac: MacAddr,
        src: Ipv6Addr,
        dst_mac: MacAddr,
        dst: Ipv6Addr,
        ext: &[(u8, Vec<u8>)],
        proto: u8,
        upper: &[u8],
    ) -> Vec<u8> {
        let mut chain = Vec::new();
        let first = ext.first().map_or(proto, |e| e.0);
        for (i, (_, h)) in ext.iter().enumerate() {
            let mut h = h.clone();
            h[0] = ext.get(i + 1).map_or(proto, |e| e.0);
            chain.extend_from_slice(&h);
        }
        chain.extend_from_slice(upper);
        let mut l3 = vec![0u8; 40];
        ipv6::Repr {
            src,
            dst,
            next_header: first,
            hop_limit: 255,
            payload_len: chain.len() as u16,
        }
        .emit(&mut l3);
        l3.extend_from_slice(&chain);
        eth(dst_mac, src_mac, ethernet::ethertype::IPV6, &l3)
    }

    /// The modified EUI-64 link-local address a MAC makes (RFC 4291 appendix A).
    pub fn link_local(m: MacAddr) -> Ipv6Addr {
        let b = m.0;
        Ipv6Addr::from([
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            b[0] ^ 0x02,
            b[1],
            b[2],
            0xff,
            0xfe,
            b[3],
            b[4],
            b[5],
        ])
    }

    /// A router advertisement from (mac, src) to all nodes.
    pub fn ra(src_mac: MacAddr, src: Ipv6Addr) -> Vec<u8> {
        let all = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
        ipv6(
            src_mac,
            src,
            MacAddr([0x33, 0x33, 0, 0, 0, 1]),
            all,
            &[],
            ipv6::NEXT_ICMPV6,
            &[134, 0, 0, 0, 64, 0, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0],
        )
    }

    /// The outer addressing of a VXLAN frame.
    #[derive(Debug, Clone, Copy)]
    pub struct Outer {
        pub dst_mac: MacAddr,
        pub src_mac: MacAddr,
        pub src: IpAddr,
        pub dst: IpAddr,
        pub sport: u16,
        pub dport: u16,
        pub vlan: Option<u16>,
    }

    /// A VXLAN frame as RFC 7348 describes it (IPv4: DF, TTL 64, zero UDP checksum; IPv6:
    /// hop limit 64, UDP checksum computed unless `v6_zero_csum`).
    pub fn vxlan(o: &Outer, vni: u32, inner: &[u8], v6_zero_csum: bool) -> Vec<u8> {
        let et =
            if o.src.is_ipv4() { ethernet::ethertype::IPV4 } else { ethernet::ethertype::IPV6 };
        let udp_len = (8 + 8 + inner.len()) as u16;
        let mut l4 = vec![0u8; 16];
        udp::emit(&mut l4, o.sport, o.dport, udp_len, 0);
        vxlan::emit(&mut l4[8..], vni);
        l4.extend_from_slice(inner);
        let l3 = match (o.src, o.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = vec![0u8; 20];
                ipv4::Repr {
                    src: s,
                    dst: d,
                    protocol: ipv4::PROTO_UDP,
                    ttl: 64,
                    payload_len: udp_len,
                    dont_fragment: true,
                }
                .emit(&mut h);
                h.extend_from_slice(&l4);
                h
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                if !v6_zero_csum {
                    let sum = ipv6::pseudo_header_sum(&s, &d, ipv6::NEXT_UDP, udp_len as u32);
                    let mut c = !checksum::fold(checksum::accumulate(sum, &l4, &mut false));
                    if c == 0 {
                        c = 0xffff;
                    }
                    l4[6..8].copy_from_slice(&c.to_be_bytes());
                }
                let mut h = vec![0u8; 40];
                ipv6::Repr {
                    src: s,
                    dst: d,
                    next_header: ipv6::NEXT_UDP,
                    hop_limit: 64,
                    payload_len: udp_len,
                }
                .emit(&mut h);
                h.extend_from_slice(&l4);
                h
            }
            _ => panic!("mixed address families"),
        };
        match o.vlan {
            Some(v) => tagged(o.dst_mac, o.src_mac, ethernet::ethertype::VLAN, v, et, &l3),
            None => eth(o.dst_mac, o.src_mac, et, &l3),
        }
    }
}

/// A switch with ring ports driven by one pipeline on the calling thread.
pub struct Harness {
    pub pool: Arc<Pool>,
    pub switch: Arc<Switch>,
    pub pipe: Pipeline,
    peers: BTreeMap<String, RingPeer>,
    cache: PoolCache,
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with_pool(Pool::new(16384, false).expect("buffer pool"), SwitchOptions::default())
    }

    pub fn with_pool(pool: Arc<Pool>, opts: SwitchOptions) -> Harness {
        let switch = Switch::new(pool.clone(), opts);
        let pipe = switch.pipeline(0);
        Harness { cache: PoolCache::new(pool.clone()), pool, switch, pipe, peers: BTreeMap::new() }
    }

    /// Registers a ring port whose wire end this harness drives.
    pub fn ring(&mut self, name: &str) -> &mut Self {
        self.ring_with_mac(name, None)
    }

    pub fn ring_with_mac(&mut self, name: &str, m: Option<MacAddr>) -> &mut Self {
        let (port, peer) = RingPort::new(name, 1, 1024).expect("ring port");
        let port = match m {
            Some(m) => port.with_mac(m),
            None => port,
        };
        self.switch.register_port(name, port).expect("unique port name");
        self.peers.insert(name.into(), peer);
        self
    }

    /// Registers a port the harness does not drive (e.g. one end of a patch).
    pub fn register(&mut self, name: &str, port: Arc<dyn Port>) -> &mut Self {
        self.switch.register_port(name, port).expect("unique port name");
        self
    }

    pub fn apply(&mut self, cfg: SwitchConfig) -> Result<u64, ConfigError> {
        self.switch.apply(cfg)
    }

    pub fn set_now(&mut self, now: u32) {
        self.pipe.set_now(now);
    }

    /// Offers a frame on a ring port's wire end.
    pub fn send(&mut self, port: &str, frame: &[u8]) {
        let b = self.cache.alloc_frame(frame).expect("buffer for test frame");
        let peer = self.peers.get_mut(port).expect("ring port registered with the harness");
        if let Err(b) = peer.send_one(0, b) {
            self.cache.free(b);
            panic!("ring of {port} is full");
        }
    }

    /// Offers a frame split into the given segment sizes; what is left follows in full
    /// buffers.
    pub fn send_chain(&mut self, port: &str, frame: &[u8], sizes: &[usize]) {
        use crate::buf::{BUF_SIZE, HEADROOM};
        let mut pieces = Vec::new();
        let mut rest = frame;
        for (i, &n) in sizes.iter().enumerate() {
            let room = if i == 0 { BUF_SIZE - HEADROOM } else { BUF_SIZE };
            let n = n.min(rest.len()).min(room);
            pieces.push(&rest[..n]);
            rest = &rest[n..];
        }
        pieces.extend(rest.chunks(BUF_SIZE));
        let b = self.cache.alloc_chain(&pieces).expect("buffers for test chain");
        let peer = self.peers.get_mut(port).expect("ring port registered with the harness");
        if let Err(b) = peer.send_one(0, b) {
            self.cache.free(b);
            panic!("ring of {port} is full");
        }
    }

    /// Polls every rx queue of the current configuration until nothing moves.
    pub fn step(&mut self) -> usize {
        let snap = self.switch.snapshot();
        let mut batch = Batch::new();
        let mut total = 0;
        loop {
            let mut got = 0;
            for &(p, q) in &snap.rxqs {
                got += self.pipe.poll(&snap, p, q, &mut batch);
            }
            total += got;
            if got == 0 {
                return total;
            }
        }
    }

    /// Takes every frame the switch sent out of a ring port.
    pub fn recv(&mut self, port: &str) -> Vec<Vec<u8>> {
        let peer = self.peers.get_mut(port).expect("ring port registered with the harness");
        let mut out = Vec::new();
        let mut batch = Batch::new();
        while peer.recv(0, &mut batch) > 0 {
            for b in batch.drain() {
                let mut f = Vec::new();
                self.pool.read_frame(&b, &mut f);
                self.cache.free(b);
                out.push(f);
            }
        }
        out
    }

    /// Frames waiting on every port, by port name (drains them).
    pub fn recv_all(&mut self) -> BTreeMap<String, Vec<Vec<u8>>> {
        let names: Vec<String> = self.peers.keys().cloned().collect();
        names.into_iter().map(|n| (n.clone(), self.recv(&n))).collect()
    }

    pub fn stats(&self) -> Totals {
        self.switch.stats()
    }

    /// Returns every cached buffer to the pool (for leak checks).
    pub fn flush_caches(&mut self) {
        self.cache.flush();
        self.pipe.cache().flush();
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for p in self.peers.values_mut() {
            p.drain(&mut self.cache);
        }
    }
}

/// `tcpdump -ddd -y EN10MB 'udp port 53'` (tcpdump 4.99.3, libpcap 1.10.3) as instructions:
/// a real capture filter for tests (IPv4 and IPv6, fragments checked).
pub const UDP_53: [crate::bpf::Insn; 20] = {
    use crate::bpf::Insn;
    [
        Insn { code: 40, jt: 0, jf: 0, k: 12 },
        Insn { code: 21, jt: 0, jf: 6, k: 34525 },
        Insn { code: 48, jt: 0, jf: 0, k: 20 },
        Insn { code: 21, jt: 0, jf: 15, k: 17 },
        Insn { code: 40, jt: 0, jf: 0, k: 54 },
        Insn { code: 21, jt: 12, jf: 0, k: 53 },
        Insn { code: 40, jt: 0, jf: 0, k: 56 },
        Insn { code: 21, jt: 10, jf: 11, k: 53 },
        Insn { code: 21, jt: 0, jf: 10, k: 2048 },
        Insn { code: 48, jt: 0, jf: 0, k: 23 },
        Insn { code: 21, jt: 0, jf: 8, k: 17 },
        Insn { code: 40, jt: 0, jf: 0, k: 20 },
        Insn { code: 69, jt: 6, jf: 0, k: 8191 },
        Insn { code: 177, jt: 0, jf: 0, k: 14 },
        Insn { code: 72, jt: 0, jf: 0, k: 14 },
        Insn { code: 21, jt: 2, jf: 0, k: 53 },
        Insn { code: 72, jt: 0, jf: 0, k: 16 },
        Insn { code: 21, jt: 0, jf: 1, k: 53 },
        Insn { code: 6, jt: 0, jf: 0, k: 262144 },
        Insn { code: 6, jt: 0, jf: 0, k: 0 },
    ]
};
