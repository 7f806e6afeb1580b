//! The IPAM core over the embedded store: addresses never handed out twice (also by
//! concurrent allocators), none lost, a retried request gets its address back, reserved
//! addresses never leave, exhaustion and bad input refused with the reason, and everything
//! still there after the store is reopened.

use knitter_manager::ipam::{self, Addressing, IpamError, Pool, Subnet};
use knitter_manager::store::embedded::Embedded;
use knitter_manager::store::{
    Claim, First, Op as StoreOp, OwnerKey, Store, StoreError, Versioned, With,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(cidr: &str, gw: Option<&str>) -> Addressing {
    Addressing::new(cidr.parse().unwrap(), gw.map(ip), &[], &[]).unwrap()
}

fn store() -> (tempfile::TempDir, Embedded) {
    let dir = tempfile::tempdir().unwrap();
    let s = Embedded::open(&dir.path().join("store.redb")).unwrap();
    (dir, s)
}

#[test]
fn subnets_pools_and_reserved_addresses_are_checked() {
    assert_eq!(
        "10.0.0.1/24".parse::<Subnet>().unwrap_err().to_string(),
        "subnet 10.0.0.1/24: host bits are set (did you mean 10.0.0.0/24?)"
    );
    assert!(matches!("10.0.0.0/33".parse::<Subnet>(), Err(IpamError::BadCidr(_))));
    assert!(matches!("fish".parse::<Subnet>(), Err(IpamError::BadCidr(_))));
    let s: Subnet = "10.0.0.0/24".parse().unwrap();
    assert!(
        s.overlaps(&"10.0.0.128/25".parse().unwrap())
            && !s.overlaps(&"10.0.1.0/24".parse().unwrap())
    );
    assert!(!s.overlaps(&"::/0".parse().unwrap()), "families never overlap");
    let e = Addressing::new(s, Some(ip("10.0.1.1")), &[], &[]).unwrap_err();
    assert_eq!(e.to_string(), "gateway 10.0.1.1 is outside subnet 10.0.0.0/24");
    let pool = |a: &str, b: &str| Pool { start: ip(a), end: ip(b) };
    let e = Addressing::new(
        s,
        None,
        &[pool("10.0.0.10", "10.0.0.20"), pool("10.0.0.20", "10.0.0.30")],
        &[],
    )
    .unwrap_err();
    assert!(matches!(e, IpamError::PoolsOverlap { .. }), "{e}");
    assert!(matches!(
        Addressing::new(s, None, &[pool("10.0.0.9", "10.0.0.2")], &[]),
        Err(IpamError::EmptyPool { .. })
    ));
    assert!(matches!(
        Addressing::new("10.0.0.0/32".parse().unwrap(), None, &[], &[]),
        Err(IpamError::TooSmall(_))
    ));

    let a = Addressing::new(s, Some(ip("10.0.0.1")), &[], &[ip("10.0.0.2")]).unwrap();
    assert_eq!(
        a.check(ip("10.0.0.1")).unwrap_err().to_string(),
        "10.0.0.1 cannot be allocated: it is the subnet's gateway"
    );
    assert!(matches!(
        a.check(ip("10.0.0.0")),
        Err(IpamError::Reserved { what: "network address", .. })
    ));
    assert!(matches!(
        a.check(ip("10.0.0.255")),
        Err(IpamError::Reserved { what: "broadcast address", .. })
    ));
    assert!(matches!(
        a.check(ip("10.0.0.2")),
        Err(IpamError::Reserved { what: "reserved address", .. })
    ));
    assert!(matches!(a.check(ip("10.0.1.5")), Err(IpamError::Outside { .. })));
    let c: Vec<IpAddr> = a.candidates(0).collect();
    assert_eq!(
        (c.len(), c[0], c[251]),
        (252, ip("10.0.0.3"), ip("10.0.0.254")),
        "254 hosts but the gateway and .2"
    );
    // After a hint, wrapping.
    let c: Vec<IpAddr> = a.candidates(ipam::hint_of(ip("10.0.0.250"))).take(6).collect();
    assert_eq!(
        c,
        ["10.0.0.251", "10.0.0.252", "10.0.0.253", "10.0.0.254", "10.0.0.3", "10.0.0.4"].map(ip)
    );
    // IPv6: the subnet-router anycast address is not handed out; there is no broadcast.
    let a6 = net("2001:db8::/120", Some("2001:db8::1"));
    assert_eq!(a6.candidates(0).next(), Some(ip("2001:db8::2")));
    assert_eq!(a6.candidates(0).last(), Some(ip("2001:db8::ff")));
}

#[test]
fn allocation_is_idempotent_exclusive_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let a = net("192.0.2.0/29", Some("192.0.2.1")); // hosts .2 .. .6
    let owners: Vec<OwnerKey> = (0..5).map(|i| OwnerKey::new(&format!("c{i}"), "eth0")).collect();
    let mut got = BTreeMap::new();
    {
        let s = Embedded::open(&path).unwrap();
        for o in &owners {
            got.insert(o.clone(), ipam::allocate(&s, "red", &a, o, 0).unwrap());
        }
        let distinct: HashSet<_> = got.values().collect();
        assert_eq!(distinct.len(), 5);
        // A retry (the first answer lost to a timeout) gets the same address back.
        assert_eq!(ipam::allocate(&s, "red", &a, &owners[2], 0).unwrap(), got[&owners[2]]);
        let extra = OwnerKey::new("c9", "eth0");
        assert_eq!(
            ipam::allocate(&s, "red", &a, &extra, 0).unwrap_err().to_string(),
            "subnet 192.0.2.0/29 has no free address left"
        );
        // Another network has its own addresses.
        assert_eq!(ipam::allocate(&s, "blue", &a, &extra, 0).unwrap(), ip("192.0.2.2"));
        // A fixed address: taken, reserved, or free.
        let e = ipam::allocate_fixed(&s, "red", &a, &extra, got[&owners[0]]).unwrap_err();
        assert!(e.to_string().contains("already allocated to c0/eth0"), "{e}");
        assert!(matches!(
            ipam::allocate_fixed(&s, "red", &a, &extra, ip("192.0.2.1")),
            Err(IpamError::Reserved { .. })
        ));
        assert_eq!(s.release("red", &owners[0]).unwrap(), Some(got[&owners[0]]));
        assert_eq!(s.release("red", &owners[0]).unwrap(), None, "releasing twice changes nothing");
        assert_eq!(
            ipam::allocate_fixed(&s, "red", &a, &extra, got[&owners[0]]).unwrap(),
            got[&owners[0]]
        );
        got.remove(&owners[0]);
        got.insert(extra.clone(), ipam::allocate(&s, "red", &a, &extra, 0).unwrap());
    }
    let s = Embedded::open(&path).unwrap();
    let now: BTreeMap<OwnerKey, IpAddr> =
        s.allocations("red").unwrap().into_iter().map(|(ip, o)| (o, ip)).collect();
    assert_eq!(now, got, "every allocation is there after reopening, nothing else");
    assert!(s.revision().unwrap() >= 8);
}

#[test]
fn concurrent_allocators_never_share_an_address() {
    let (_dir, s) = store();
    let s = Arc::new(s);
    let a = Arc::new(net("10.1.0.0/20", Some("10.1.0.1"))); // 4093 usable
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (s, a) = (s.clone(), a.clone());
            std::thread::spawn(move || {
                (0..250)
                    .map(|i| {
                        let o = OwnerKey::new(&format!("t{t}-{i}"), "eth0");
                        // Every thread starts from the same hint: they race for the same addresses.
                        (o.clone(), ipam::allocate(&*s, "red", &a, &o, 0).unwrap())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<(OwnerKey, IpAddr)> =
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let distinct: HashSet<IpAddr> = all.iter().map(|(_, ip)| *ip).collect();
    assert_eq!((all.len(), distinct.len()), (2000, 2000), "no address twice");
    let stored = s.allocations("red").unwrap();
    assert_eq!(stored.len(), 2000, "none lost");
    for (o, ip) in &all {
        assert_eq!(s.owned("red", o).unwrap(), Some(*ip));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(u8),
    Retry(u8),
    Release(u8),
    Fixed(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12).prop_map(Op::Allocate),
        (0u8..12).prop_map(Op::Retry),
        (0u8..12).prop_map(Op::Release),
        (0u8..12, 0u8..16).prop_map(|(o, h)| Op::Fixed(o, h)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Against a model (owner → address): the store holds exactly the model's allocations,
    /// never one address twice, never the gateway, and allocates whenever an address is free.
    #[test]
    fn the_store_matches_a_model(ops in proptest::collection::vec(op(), 1..60)) {
        let (_dir, s) = store();
        let a = net("198.51.100.0/28", Some("198.51.100.1")); // 13 usable
        let mut model: BTreeMap<OwnerKey, IpAddr> = BTreeMap::new();
        let owner = |i: u8| OwnerKey::new(&format!("c{i}"), "eth0");
        for op in ops {
            match op {
                Op::Allocate(i) | Op::Retry(i) => {
                    let o = owner(i);
                    match ipam::allocate(&s, "n", &a, &o, 0) {
                        Ok(ip) => {
                            if let Some(had) = model.get(&o) { prop_assert_eq!(*had, ip); }
                            model.insert(o, ip);
                        }
                        Err(IpamError::Exhausted(_)) => prop_assert!(model.len() == 13 && !model.contains_key(&o)),
                        Err(e) => prop_assert!(false, "{}", e),
                    }
                }
                Op::Release(i) => {
                    prop_assert_eq!(s.release("n", &owner(i)).unwrap(), model.remove(&owner(i)));
                }
                Op::Fixed(i, host) => {
                    let want = ip(&format!("198.51.100.{host}"));
                    let r = ipam::allocate_fixed(&s, "n", &a, &owner(i), want);
                    let holder = model.iter().find(|(_, v)| **v == want).map(|(k, _)| k.clone());
                    match (&r, a.check(want), model.get(&owner(i)), holder) {
                        (Ok(got), Ok(()), None, None) => { model.insert(owner(i), *got); }
                        (Ok(got), Ok(()), Some(had), _) => prop_assert_eq!(*had, *got),
                        (Err(_), Err(_), _, _) | (Err(IpamError::Taken { .. }), _, _, _) => {}
                        other => prop_assert!(false, "{:?}", other),
                    }
                }
            }
            let stored: BTreeMap<OwnerKey, IpAddr> = s.allocations("n").unwrap().into_iter().map(|(ip, o)| (o, ip)).collect();
            prop_assert_eq!(&stored, &model);
            let distinct: HashSet<&IpAddr> = model.values().collect();
            prop_assert_eq!(distinct.len(), model.len());
            prop_assert!(!model.values().any(|v| *v == ip("198.51.100.1")));
        }
    }
}

/// Three pods of an IP group are deleted at once and re-created in reverse order: each gets
/// its own address back; a fourth pod finds the group full while their grace lasts, and
/// takes an address whose grace ran out.
#[test]
fn an_ip_group_gives_each_pod_its_address_back() {
    use knitter_manager::ipam::IpGroup;
    let (_dir, s) = store();
    let a = net("10.9.0.0/24", Some("10.9.0.1"));
    let g =
        IpGroup::new("sip", &a, &[ip("10.9.0.10"), ip("10.9.0.11"), ip("10.9.0.12")], 300).unwrap();
    assert!(matches!(
        IpGroup::new("bad", &a, &[ip("10.9.0.1")], 300),
        Err(IpamError::Reserved { .. })
    ));
    let pods = ["ims/sip-0", "ims/sip-1", "ims/sip-2"];
    let owner = |pod: &str, generation: u32| {
        OwnerKey::new(&format!("{pod}-container-{generation}"), "net1")
    };
    let t0 = 1_000_000;
    let first: Vec<IpAddr> =
        pods.iter().map(|p| g.allocate(&s, "media", &owner(p, 0), p, t0).unwrap()).collect();
    assert_eq!(first.iter().collect::<HashSet<_>>().len(), 3);
    assert!(matches!(
        g.allocate(&s, "media", &owner("ims/other", 0), "ims/other", t0),
        Err(IpamError::Exhausted(_))
    ));
    for p in pods {
        assert!(g.release(&s, "media", &owner(p, 0), p, t0 + 1).unwrap().is_some());
    }
    // New containers (new ids), the pods in reverse order.
    for (i, p) in pods.iter().enumerate().rev() {
        assert_eq!(
            g.allocate(&s, "media", &owner(p, 1), p, t0 + 5).unwrap(),
            first[i],
            "{p} got its own address back"
        );
    }
    // sip-1 goes for good; within its grace nobody else takes its address.
    g.release(&s, "media", &owner(pods[1], 1), pods[1], t0 + 10).unwrap();
    assert!(matches!(
        g.allocate(&s, "media", &owner("ims/other", 0), "ims/other", t0 + 20),
        Err(IpamError::Exhausted(_))
    ));
    assert_eq!(
        g.allocate(&s, "media", &owner("ims/other", 0), "ims/other", t0 + 311).unwrap(),
        first[1],
        "after the grace"
    );
}

/// A port's MAC follows its address: unique in the network, and the same when a pod gets its
/// address back. IPv6 pools stay within one /96 so that holds there too.
#[test]
fn macs_follow_addresses() {
    assert_eq!(ipam::mac_for(ip("10.0.0.7")), [0x0a, 0x58, 10, 0, 0, 7]);
    assert_eq!(ipam::mac_for(ip("2001:db8::1:2")), [0x0a, 0x59, 0, 1, 0, 2]);
    let wide = Pool { start: ip("2001:db8::1"), end: ip("2001:db8::1:0:0:1") };
    let e = Addressing::new("2001:db8::/64".parse().unwrap(), None, &[wide], &[]).unwrap_err();
    assert!(matches!(e, IpamError::PoolTooWide { .. }), "{e}");
    // A /64 without pools hands out its first /96: distinct MACs for all of it.
    let a = Addressing::new("2001:db8::/64".parse().unwrap(), None, &[], &[]).unwrap();
    assert_eq!(a.size(), 0xffff_ffff);
    let (_dir, s) = store();
    let macs: HashSet<[u8; 6]> = (0..300)
        .map(|i| {
            ipam::mac_for(
                ipam::allocate(&s, "v6", &a, &OwnerKey::new(&format!("c{i}"), "eth0"), 0).unwrap(),
            )
        })
        .collect();
    assert_eq!(macs.len(), 300);
}

/// A store where another allocator wins the first `races` claims an allocation makes (as a
/// second manager replica working at the same addresses would).
struct Contended {
    inner: Embedded,
    races: std::sync::atomic::AtomicUsize,
}

impl Store for Contended {
    fn claim_near(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
        with: With,
    ) -> Result<First, StoreError> {
        let lose = self.races.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok();
        if lose {
            return Ok(First::Raced);
        }
        self.inner.claim_near(network, candidates, owner, with)
    }
    fn claim(&self, network: &str, ip: IpAddr, owner: &OwnerKey) -> Result<Claim, StoreError> {
        self.inner.claim(network, ip, owner)
    }
    fn owned(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        self.inner.owned(network, owner)
    }
    fn release(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        self.inner.release(network, owner)
    }
    fn remember(&self, network: &str, ip: IpAddr, pod: &str, until: u64) -> Result<(), StoreError> {
        self.inner.remember(network, ip, pod, until)
    }
    fn remembered(&self, network: &str, ip: IpAddr) -> Result<Option<(String, u64)>, StoreError> {
        self.inner.remembered(network, ip)
    }
    fn allocations(&self, network: &str) -> Result<Vec<(IpAddr, OwnerKey)>, StoreError> {
        self.inner.allocations(network)
    }
    fn revision(&self) -> Result<u64, StoreError> {
        self.inner.revision()
    }
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        self.inner.get(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        self.inner.list(prefix)
    }
    fn commit_at(&self, ops: &[StoreOp]) -> Result<Option<u64>, StoreError> {
        self.inner.commit_at(ops)
    }
    fn put_expiring(&self, key: &str, value: &str, ttl_secs: u64) -> Result<(), StoreError> {
        self.inner.put_expiring(key, value, ttl_secs)
    }
}

/// Allocation order: in order after the hint; past a run of held addresses longer than
/// `ipam::NEAR`, or after losing a race, from a random free place; a pool whose every
/// address is held is exhausted; races lost everywhere are a retryable store error, with
/// nothing claimed.
#[test]
fn allocations_go_in_order_and_move_away_from_held_runs_and_races() {
    let (_dir, inner) = store();
    let s = Contended { inner, races: 0.into() };
    let a = net("10.40.0.0/22", Some("10.40.0.1"));
    let owner = |i: usize| OwnerKey::new(&format!("c{i}"), "eth0");
    // One allocator with its cursor (the last address it got), as a manager keeps one.
    let mut hint = a.start_point();
    let run: Vec<IpAddr> = (0..300)
        .map(|i| {
            let got = ipam::allocate(&s, "n", &a, &owner(i), hint).unwrap();
            hint = ipam::hint_of(got);
            got
        })
        .collect();
    assert_eq!(
        (run[0], run[299]),
        (ip("10.40.0.2"), ip("10.40.1.45")),
        "in order from the pools' start"
    );
    // Past the run (longer than NEAR): somewhere free, not the run's end.
    let away = ipam::allocate(&s, "n", &a, &owner(300), a.start_point()).unwrap();
    assert!(!run.contains(&away) && a.check(away).is_ok(), "{away}");
    // Near the hint, but a race lost there: elsewhere.
    s.races.store(3, SeqCst);
    let hint = ipam::hint_of(ip("10.40.2.0"));
    let moved = ipam::allocate(&s, "n", &a, &owner(301), hint).unwrap();
    assert!(moved != away && !run.contains(&moved), "{moved}");
    assert_eq!(s.inner.allocations("n").unwrap().len(), 302);
    // Every race lost: retry later, nothing claimed.
    s.races.store(usize::MAX, SeqCst);
    let e = ipam::allocate(&s, "n", &a, &owner(302), hint).unwrap_err();
    assert_eq!(e, IpamError::Contended("10.40.0.0/22".into()));
    assert_eq!(
        e.to_string(),
        "allocating in subnet 10.40.0.0/22 kept losing races to other allocators"
    );
    assert_eq!(s.inner.owned("n", &owner(302)).unwrap(), None);
    s.races.store(0, SeqCst);
    // A /29 filled: exhausted, and a retry of the last request still gets its address.
    let small = net("192.0.2.0/29", None);
    let got: Vec<IpAddr> = (0..6)
        .map(|i| ipam::allocate(&s, "small", &small, &owner(i), small.start_point()).unwrap())
        .collect();
    assert_eq!(ipam::allocate(&s, "small", &small, &owner(5), 0).unwrap(), got[5]);
    assert!(matches!(
        ipam::allocate(&s, "small", &small, &owner(9), 0),
        Err(IpamError::Exhausted(_))
    ));
}
