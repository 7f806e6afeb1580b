//! Split virtqueues against a simulated guest: chains as drivers post them, completions as
//! they read them, notification suppression both ways, and hostile rings that must never
//! crash the device nor make it touch memory outside the guest's.

use knitter_vhost::memory::GuestAddr;
use knitter_vhost::testkit::{BUFS_AT, Buf, Guest, MEM_LEN};
use knitter_vhost::vring::{
    Chain, ChainError, MAX_SEGS, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};
use proptest::prelude::*;

#[test]
fn chains_pop_in_order_with_their_buffers() {
    let mut g = Guest::new(8);
    let mut q = g.queue();
    let (h1, a1) = g.post(&[Buf::Read(vec![1; 12]), Buf::Read(vec![2; 60])]);
    let (h2, a2) = g.post(&[Buf::Write(12), Buf::Write(1500)]);
    let mut c = Chain::default();
    {
        let mut r = q.ring(&g.mem).unwrap();
        assert_eq!(r.pending(), 2);
        assert_eq!(r.pop(&mut c), Some(Ok(())));
        assert_eq!((c.head, c.readable, c.writable), (h1, 72, 0));
        assert_eq!(c.segments().iter().map(|s| s.addr.0).collect::<Vec<_>>(), a1);
        assert_eq!(r.memory().slice(c.segments()[1].addr, 60).unwrap().to_vec(), [2; 60]);
        r.push_used(c.head, 0);
        assert_eq!(r.pop(&mut c), Some(Ok(())));
        assert_eq!((c.head, c.readable, c.writable), (h2, 0, 1512));
        assert!(c.segments().iter().all(|s| s.writable));
        assert_eq!(c.segments()[1].addr.0, a2[1]);
        r.memory().slice(c.segments()[1].addr, 3).unwrap().write(b"abc");
        r.push_used(c.head, 15);
        assert_eq!(r.pop(&mut c), None);
        // Nothing is visible before the burst ends.
    }
    assert_eq!(g.completions(), vec![(h1, 0), (h2, 15)]);
    assert_eq!(&g.read(a2[1], 3), b"abc");
    assert_eq!(q.next_avail(), 2);
}

#[test]
fn the_queue_wraps_around() {
    let mut g = Guest::new(4);
    let mut q = g.queue();
    let mut c = Chain::default();
    for round in 0..1000u32 {
        let (h, _) = g.post(&[Buf::Read(round.to_le_bytes().to_vec())]);
        let mut r = q.ring(&g.mem).unwrap();
        assert_eq!(r.pop(&mut c), Some(Ok(())));
        assert_eq!(
            r.memory().slice(c.segments()[0].addr, 4).unwrap().to_vec(),
            round.to_le_bytes()
        );
        r.push_used(h, 0);
        drop(r);
        assert_eq!(g.completions(), vec![(h, 0)]);
    }
}

#[test]
fn malformed_chains_are_refused_and_consumed() {
    let mut g = Guest::new(8);
    let mut q = g.queue();
    type Setup = Box<dyn Fn(&Guest)>;
    let cases: Vec<(&str, Setup, ChainError)> = vec![
        (
            "next outside the table",
            Box::new(|g: &Guest| g.put_desc(0, BUFS_AT, 8, VIRTQ_DESC_F_NEXT, 9)),
            ChainError::Index(9),
        ),
        (
            "a loop",
            Box::new(|g: &Guest| {
                g.put_desc(0, BUFS_AT, 8, VIRTQ_DESC_F_NEXT, 1);
                g.put_desc(1, BUFS_AT, 8, VIRTQ_DESC_F_NEXT, 0);
            }),
            ChainError::Loop,
        ),
        (
            "read after write",
            Box::new(|g: &Guest| {
                g.put_desc(0, BUFS_AT, 8, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 1);
                g.put_desc(1, BUFS_AT, 8, 0, 0);
            }),
            ChainError::ReadAfterWrite,
        ),
        (
            "indirect not negotiated",
            Box::new(|g: &Guest| g.put_desc(0, BUFS_AT, 32, VIRTQ_DESC_F_INDIRECT, 0)),
            ChainError::Indirect,
        ),
    ];
    let mut c = Chain::default();
    for (what, setup, want) in cases {
        setup(&g);
        g.make_available(0);
        let mut r = q.ring(&g.mem).unwrap();
        assert_eq!(r.pop(&mut c), Some(Err(want)), "{what}");
        assert_eq!(c.head, 0);
        r.push_used(c.head, 0);
        drop(r);
        assert_eq!(g.completions(), vec![(0, 0)], "{what}: the buffers go back");
    }
    // A buffer outside guest memory.
    g.put_desc(0, MEM_LEN as u64 - 4, 8, 0, 0);
    g.make_available(0);
    let mut r = q.ring(&g.mem).unwrap();
    assert!(matches!(r.pop(&mut c), Some(Err(ChainError::Memory(_)))));
}

#[test]
fn indirect_tables_when_negotiated() {
    let mut g = Guest::new(8);
    let mut q = g.queue();
    q.set_features(false, true);
    // An indirect table of three descriptors at 0x20_0000.
    let table = 0x20_0000u64;
    let write_desc = |g: &Guest, i: u64, addr: u64, len: u32, flags: u16, next: u16| {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
        g.write(table + 16 * i, &d);
    };
    write_desc(&g, 0, BUFS_AT, 12, VIRTQ_DESC_F_NEXT, 1);
    write_desc(&g, 1, BUFS_AT + 64, 100, VIRTQ_DESC_F_NEXT, 2);
    write_desc(&g, 2, BUFS_AT + 256, 1500, VIRTQ_DESC_F_WRITE, 0);
    g.put_desc(3, table, 48, VIRTQ_DESC_F_INDIRECT, 0);
    g.make_available(3);
    let mut c = Chain::default();
    let mut r = q.ring(&g.mem).unwrap();
    assert_eq!(r.pop(&mut c), Some(Ok(())));
    assert_eq!((c.head, c.segments().len(), c.readable, c.writable), (3, 3, 112, 1500));
    // Nested indirect tables are refused.
    write_desc(&g, 0, table, 48, VIRTQ_DESC_F_INDIRECT, 0);
    drop(r);
    g.make_available(3);
    let mut r = q.ring(&g.mem).unwrap();
    assert_eq!(r.pop(&mut c), Some(Err(ChainError::Indirect)));
}

/// A chain of more descriptors than the queue has entries is refused however few buffers
/// it names: empty descriptors chained through the whole table and an indirect table of
/// 32,768 more, the shape that once cost the PMD thread a million descriptor reads a poll.
#[test]
fn chains_of_empty_descriptors_longer_than_the_queue_are_refused() {
    let mut g = Guest::new(64);
    let mut q = g.queue();
    q.set_features(false, true);
    // 63 empty descriptors chained, then one pointing at an indirect table of 32,768 empty
    // ones (512 KiB at 0x20_0000).
    for i in 0..63 {
        g.put_desc(i, BUFS_AT, 0, VIRTQ_DESC_F_NEXT, i + 1);
    }
    let (table, n) = (0x20_0000u64, 32_768u64);
    g.put_desc(63, table, (16 * n) as u32, VIRTQ_DESC_F_INDIRECT, 0);
    let mut d = vec![0u8; 16 * n as usize];
    for (i, e) in d.chunks_mut(16).enumerate() {
        e[..8].copy_from_slice(&BUFS_AT.to_le_bytes());
        let next = (i as u16).wrapping_add(1);
        let flags = if (i as u64) < n - 1 { VIRTQ_DESC_F_NEXT } else { 0 };
        e[12..14].copy_from_slice(&flags.to_le_bytes());
        e[14..].copy_from_slice(&next.to_le_bytes());
    }
    g.write(table, &d);
    g.make_available(0);
    let mut c = Chain::default();
    let mut r = q.ring(&g.mem).unwrap();
    assert_eq!(r.pop(&mut c), Some(Err(ChainError::TooManyDescriptors)));
    drop(r);
    // Exactly a queue's worth passes: 63 empty, then one buffer.
    g.put_desc(63, BUFS_AT, 8, 0, 0);
    g.make_available(0);
    let mut r = q.ring(&g.mem).unwrap();
    assert_eq!(r.pop(&mut c), Some(Ok(())));
    assert_eq!(c.segments().len(), 1);
}

/// On a queue larger than `MAX_CHAIN` the bound is `MAX_CHAIN`, not the queue's size: a
/// 2,048-entry queue refuses an indirect table of 1,025 empty descriptors and a buffer.
#[test]
fn chains_are_bounded_below_a_large_queues_size() {
    let mut g = Guest::new(2048);
    let mut q = g.queue();
    q.set_features(false, true);
    let table = 0x20_0000u64;
    let put = |g: &mut Guest, n: u64| {
        let mut d = vec![0u8; 16 * n as usize];
        for (i, e) in d.chunks_mut(16).enumerate() {
            let last = i as u64 == n - 1;
            e[..8].copy_from_slice(&BUFS_AT.to_le_bytes());
            e[8..12].copy_from_slice(&(if last { 8u32 } else { 0 }).to_le_bytes());
            e[12..14].copy_from_slice(&(if last { 0 } else { VIRTQ_DESC_F_NEXT }).to_le_bytes());
            e[14..].copy_from_slice(&((i as u16).wrapping_add(1)).to_le_bytes());
        }
        g.write(table, &d);
        g.put_desc(0, table, (16 * n) as u32, VIRTQ_DESC_F_INDIRECT, 0);
        g.make_available(0);
    };
    let mut c = Chain::default();
    put(&mut g, knitter_vhost::vring::MAX_CHAIN as u64 + 2);
    assert_eq!(q.ring(&g.mem).unwrap().pop(&mut c), Some(Err(ChainError::TooManyDescriptors)));
    // The indirect descriptor and 1,023 in its table: exactly MAX_CHAIN, taken.
    put(&mut g, knitter_vhost::vring::MAX_CHAIN as u64 - 1);
    assert_eq!(q.ring(&g.mem).unwrap().pop(&mut c), Some(Ok(())));
    assert_eq!(c.segments().len(), 1);
}

#[test]
fn too_many_buffers_in_one_chain() {
    let mut g = Guest::new(64);
    let mut q = g.queue();
    let bufs: Vec<Buf> = (0..MAX_SEGS + 1).map(|_| Buf::Read(vec![0; 8])).collect();
    g.post(&bufs);
    let mut c = Chain::default();
    assert_eq!(q.ring(&g.mem).unwrap().pop(&mut c), Some(Err(ChainError::TooLong)));
}

#[test]
fn interrupts_follow_the_guests_wishes() {
    let mut g = Guest::new(8);
    let mut q = g.queue();
    let mut c = Chain::default();
    let mut one = |g: &mut Guest, q: &mut knitter_vhost::vring::SplitQueue| {
        g.post(&[Buf::Write(64)]);
        let mut r = q.ring(&g.mem).unwrap();
        r.pop(&mut c).unwrap().unwrap();
        r.push_used(c.head, 64);
        r.needs_interrupt()
    };
    // Flags: the guest turns interrupts off and on.
    assert!(one(&mut g, &mut q));
    g.set_avail_flags(1);
    assert!(!one(&mut g, &mut q));
    g.set_avail_flags(0);
    assert!(one(&mut g, &mut q));
    // EVENT_IDX: an interrupt when the used index passes the guest's used_event.
    let mut g = Guest::new(8);
    let mut q = g.queue();
    q.set_features(true, false);
    g.set_used_event(2);
    let wants: Vec<bool> = (0..4).map(|_| one(&mut g, &mut q)).collect();
    assert_eq!(wants, vec![false, false, true, false], "used idx 1, 2, 3, 4 against used_event 2");
}

#[test]
fn kicks_are_suppressed_while_polling() {
    let g = Guest::new(8);
    let mut q = g.queue();
    {
        let mut r = q.ring(&g.mem).unwrap();
        r.set_kicks(false);
    }
    assert_eq!(g.used_flags() & 1, 1, "VIRTQ_USED_F_NO_NOTIFY");
    q.ring(&g.mem).unwrap().set_kicks(true);
    assert_eq!(g.used_flags() & 1, 0);
    let mut g = Guest::new(8);
    let mut q = g.queue();
    q.set_features(true, false);
    g.post(&[Buf::Read(vec![1])]);
    let mut c = Chain::default();
    let mut r = q.ring(&g.mem).unwrap();
    r.pop(&mut c).unwrap().unwrap();
    r.set_kicks(true);
    drop(r);
    assert_eq!(g.avail_event(), 1, "EVENT_IDX: kick me when index 1 is made available");
}

#[test]
fn rings_outside_memory_or_misaligned_are_refused() {
    use knitter_vhost::vring::SplitQueue;
    let g = Guest::new(8);
    assert!(
        SplitQueue::new(6, GuestAddr(0), GuestAddr(0), GuestAddr(0), 0).is_err(),
        "size not a power of two"
    );
    let mut q =
        SplitQueue::new(8, GuestAddr(MEM_LEN as u64 - 64), GuestAddr(0x100), GuestAddr(0x200), 0)
            .unwrap();
    assert!(q.ring(&g.mem).is_err(), "descriptor table past the end");
    let mut q =
        SplitQueue::new(8, GuestAddr(0x1008), GuestAddr(0x100), GuestAddr(0x200), 0).unwrap();
    assert!(q.ring(&g.mem).is_err(), "descriptor table not 16-aligned");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the guest writes into its descriptor table and available ring, the device
    /// neither panics nor accepts a buffer outside guest memory, consumes at most a queue's
    /// worth per burst, and every chain it accepts is well formed.
    #[test]
    fn hostile_rings_are_survived(
        descs in proptest::collection::vec((any::<u64>(), any::<u32>(), 0u16..8, any::<u16>()), 16),
        ring in proptest::collection::vec(any::<u16>(), 16),
        avail_idx in prop_oneof![3 => 0u16..=16, 1 => any::<u16>()],
        near in any::<bool>(),
        indirect in any::<bool>(),
        flat_first in proptest::collection::vec(proptest::option::of(any::<bool>()), 16),
    ) {
        let g = Guest::new(16);
        let mut q = g.queue();
        q.set_features(false, indirect);
        for (i, (addr, len, flags, next)) in descs.iter().enumerate() {
            // Half the time, addresses and lengths near real memory, to reach deeper checks.
            let (addr, len, next) = if near { (BUFS_AT + addr % 0x1000, len % 4096, next % 20) } else { (*addr, *len, *next) };
            g.put_desc(i as u16, addr, len, *flags, next);
        }
        for (i, h) in ring.iter().enumerate() {
            g.write(g.avail + 4 + 2 * i as u64, &(if near { h % 20 } else { *h }).to_le_bytes());
        }
        g.write(g.avail + 2, &avail_idx.to_le_bytes());
        let mut c = Chain::default();
        let mut r = q.ring(&g.mem).unwrap();
        let mut popped = 0;
        loop {
            // Sometimes the one-buffer fast path first (writable or not), as the port does.
            if let Some(writable) = flat_first[popped % 16]
                && let Some(f) = r.pop_flat(writable)
            {
                popped += 1;
                prop_assert!(popped <= 16);
                let checked = r.memory().slice(f.addr(), f.len());
                prop_assert!(checked.is_ok_and(|b| b.as_ptr() == f.buffer().as_ptr() && b.len() == f.len()), "a flat chain outside guest memory");
                prop_assert!(!f.is_empty());
                let (_, _, flags, _) = descs[f.head as usize];
                prop_assert_eq!(flags & 7, if writable { 2 } else { 0 }, "only single buffers of the asked direction");
                r.push_used(f.head, 0);
                continue;
            }
            let Some(res) = r.pop(&mut c) else { break };
            popped += 1;
            prop_assert!(popped <= 16);
            if res.is_ok() {
                let mut seen_write = false;
                for s in c.segments() {
                    prop_assert!(r.memory().slice(s.addr, s.len as usize).is_ok());
                    prop_assert!(!seen_write || s.writable, "readable after writable");
                    seen_write |= s.writable;
                }
                prop_assert!(c.segments().len() <= MAX_SEGS);
            }
            r.push_used(c.head, 0);
        }
        drop(r);
        // More than a queue's worth available is a broken driver: nothing is taken.
        prop_assert_eq!(popped, if avail_idx <= 16 { avail_idx as usize } else { 0 });
        prop_assert_eq!(q.is_broken(), avail_idx > 16);
    }
}
