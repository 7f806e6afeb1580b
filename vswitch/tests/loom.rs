//! Loom models of the lock-free structures PMD threads share — the SPSC ring (data and wake
//! protocol), shared counters, the FDB's seqlock — run on the real code, built over loom's
//! atomics (`vswitch/src/sync.rs`):
//!
//!     RUSTFLAGS="--cfg loom" cargo test -p knitter-vswitch --test loom --release --target-dir target/loom
//!
//! Loom runs each closure under every interleaving (and every outcome the memory model allows
//! for each load) up to a preemption bound, and fails on an assertion, a data race on a
//! tracked cell, or a deadlock. CI runs it (`ci/test.sh`). Each model was checked to fail
//! with the ordering it guards weakened: the ring's release store of `tail` (a slot read
//! while written), the wake protocol's SeqCst fence (a lost wake-up), the FDB reader's
//! acquire fence or the writer's release fence after taking a bucket (A read with B's
//! destination).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use vswitch::counters::{Counter, SharedCounter};
use vswitch::fdb::{Dest, Fdb, Learn, Limits, key};
use vswitch::spsc;

/// Every interleaving with up to three preemptions (~40,000 for the FDB reader model,
/// under 3 s in all).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// A producer pushing three indices through a two-slot ring (so it fills and wraps) and a
/// consumer popping them: every index arrives once, in order, and no slot is read while it
/// is written (the slots are loom cells).
#[test]
fn spsc_delivers_in_order_across_a_wrap() {
    model(|| {
        let (mut p, mut c) = spsc::channel(2).unwrap();
        let t = thread::spawn(move || {
            let ids = [1u32, 2, 3];
            let mut sent = 0;
            while sent < ids.len() {
                match p.push(&ids[sent..]) {
                    0 => thread::yield_now(),
                    n => sent += n,
                }
            }
        });
        let (mut got, mut out) = (Vec::new(), [0u32; 2]);
        while got.len() < 3 {
            match c.pop(&mut out) {
                0 => thread::yield_now(),
                n => got.extend_from_slice(&out[..n]),
            }
        }
        t.join().unwrap();
        assert_eq!(got, [1, 2, 3]);
    });
}

/// The wake protocol: a consumer going to sleep as the producer pushes either sees the work
/// (`arm` says so) or finds its eventfd written. Never neither: that would be a lost wake-up.
#[test]
fn spsc_never_loses_a_wake_up() {
    model(|| {
        let (mut p, c) = spsc::channel(4).unwrap();
        let t = thread::spawn(move || {
            p.push(&[7]);
        });
        let saw_work = c.ring().arm(true);
        t.join().unwrap();
        let mut pfd = libc::pollfd { fd: c.ring().wake_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; a zero timeout.
        let woken = unsafe { libc::poll(&mut pfd, 1, 0) } == 1;
        assert!(saw_work || woken, "the consumer would sleep with work in the ring");
    });
}

/// Two threads adding to a shared counter: no count is lost.
#[test]
fn shared_counters_are_exact() {
    model(|| {
        let c = Arc::new(SharedCounter::default());
        let c2 = c.clone();
        let t = thread::spawn(move || c2.add(1));
        c.add(2);
        t.join().unwrap();
        assert_eq!(c.get(), 3);
    });
}

/// Why per-thread counters are per-thread: a `Counter` two threads add to loses counts
/// (load + store), which loom finds.
#[test]
#[should_panic]
fn a_per_thread_counter_shared_loses_counts() {
    model(|| {
        let c = Arc::new(Counter::default());
        let c2 = c.clone();
        let t = thread::spawn(move || c2.add(1));
        c.add(2);
        t.join().unwrap();
        assert_eq!(c.get(), 3);
    });
}

const LIMITS: Limits = Limits { bd_max: 1000, port_max: 1000 };

/// A key whose first bucket is `key_a`'s, for a MAC other than `a`'s.
fn neighbor_of(fdb: &Fdb, a: u64) -> u64 {
    let want = fdb.first_bucket(fdb.locate(a));
    (1..)
        .map(|m| key(1, 0x0200_0000_0000 + m))
        .find(|&k| k != a && fdb.first_bucket(fdb.locate(k)) == want)
        .unwrap()
}

/// The seqlock keeps a key and its value together: while a writer removes MAC A and learns
/// MAC B into the way A held, a reader looking A up sees A's destination or nothing — never
/// B's. (The reader is the spawned thread: loom explored far fewer interleavings with the
/// roles the other way round.)
#[test]
fn fdb_readers_never_see_another_macs_destination() {
    model(|| {
        let fdb = Arc::new(Fdb::new(16));
        let a = key(1, 0x0200_0000_0001);
        let b = neighbor_of(&fdb, a);
        assert_eq!(fdb.learn(a, fdb.locate(a), Dest::Port(1), 0, LIMITS), Learn::Learned);
        let r = fdb.clone();
        let reader = thread::spawn(move || r.lookup(a, r.locate(a)).map(|v| v.dest()));
        fdb.remove_where(|e| e.dest == Dest::Port(1));
        assert_eq!(fdb.learn(b, fdb.locate(b), Dest::Port(9), 0, LIMITS), Learn::Learned);
        let seen = reader.join().unwrap();
        assert!(matches!(seen, None | Some(Dest::Port(1))), "A looked up as {seen:?}");
        assert_eq!(fdb.lookup(b, fdb.locate(b)).map(|v| v.dest()), Some(Dest::Port(9)));
        assert_eq!(fdb.lookup(a, fdb.locate(a)), None);
    });
}

/// Two PMD threads learning two MACs into one bucket at once: each either learns or is told
/// the bucket was busy (and the next frame learns it); what was learned is there.
#[test]
fn fdb_concurrent_learners_lose_nothing_they_report_learned() {
    model(|| {
        let fdb = Arc::new(Fdb::new(16));
        let a = key(1, 0x0200_0000_0001);
        let b = neighbor_of(&fdb, a);
        let f2 = fdb.clone();
        let t = thread::spawn(move || f2.learn(b, f2.locate(b), Dest::Port(2), 0, LIMITS));
        let ra = fdb.learn(a, fdb.locate(a), Dest::Port(1), 0, LIMITS);
        let rb = t.join().unwrap();
        for (k, r, d) in [(a, ra, Dest::Port(1)), (b, rb, Dest::Port(2))] {
            match r {
                Learn::Learned => {
                    assert_eq!(fdb.lookup(k, fdb.locate(k)).map(|v| v.dest()), Some(d))
                }
                Learn::Busy => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(fdb.len(), [ra, rb].iter().filter(|r| **r == Learn::Learned).count());
    });
}
