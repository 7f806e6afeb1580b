//! Frames between a simulated guest's virtqueues and the switch's packet pool, behind the
//! virtio-net header: header in its own buffer or not, frames split over buffers, offload
//! requests that were not negotiated, receive buffers too small, and a frame round trip
//! guest → pool → guest byte for byte.

use knitter_vhost::net::{self, HDR_LEN, NetError, Offloads};
use knitter_vhost::queue::{Burst, Virtqueue};
use knitter_vhost::testkit::{Buf, Guest};
use knitter_vhost::vring::Chain;
use vswitch::{Pool, PoolCache};

fn frame(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

fn hdr(flags: u8, gso: u8) -> Vec<u8> {
    let mut h = vec![0u8; HDR_LEN];
    (h[0], h[1]) = (flags, gso);
    h
}

fn pool() -> (std::sync::Arc<Pool>, PoolCache) {
    let p = Pool::new(256, false).unwrap();
    let c = PoolCache::new(p.clone());
    (p, c)
}

/// Posts a transmit chain and returns what `from_guest` makes of it.
fn transmit(bufs: &[Buf], offloads: Offloads) -> Result<Vec<u8>, NetError> {
    let (pool, mut cache) = pool();
    let mut g = Guest::new(8);
    let mut q = g.queue();
    g.post(bufs);
    let mut r = q.ring(&g.mem).unwrap();
    let mut c = Chain::default();
    r.pop(&mut c).unwrap().unwrap();
    let out = net::from_guest(r.memory(), &c, &mut cache, offloads).map(|b| {
        let mut v = Vec::new();
        pool.read_frame(&b, &mut v);
        cache.free(b);
        v
    });
    r.push_used(c.head, 0);
    out
}

#[test]
fn frames_leave_the_guest_whole() {
    let f = frame(1514);
    let mut joined = hdr(0, 0);
    joined.extend_from_slice(&f);
    assert_eq!(
        transmit(&[Buf::Read(joined)], Offloads::default()).unwrap(),
        f,
        "header and frame in one buffer"
    );
    assert_eq!(
        transmit(
            &[Buf::Read(hdr(0, 0)), Buf::Read(f[..100].to_vec()), Buf::Read(f[100..].to_vec())],
            Offloads::default()
        )
        .unwrap(),
        f,
        "header alone, frame in two buffers"
    );
    let split_hdr = hdr(0, 0)[..5].to_vec();
    let mut rest = hdr(0, 0)[5..].to_vec();
    rest.extend_from_slice(&f[..60]);
    assert_eq!(
        transmit(&[Buf::Read(split_hdr), Buf::Read(rest)], Offloads::default()).unwrap(),
        f[..60].to_vec(),
        "header across buffers"
    );
    let jumbo = frame(9000);
    assert_eq!(
        transmit(&[Buf::Read(hdr(0, 0)), Buf::Read(jumbo.clone())], Offloads::default()).unwrap(),
        jumbo,
        "jumbo, chained in the pool"
    );
}

#[test]
fn bad_transmit_chains_are_refused() {
    let f = frame(60);
    let with = |h: Vec<u8>| [Buf::Read(h), Buf::Read(f.clone())];
    assert_eq!(transmit(&with(hdr(1, 0)), Offloads::default()), Err(NetError::CsumNotNegotiated));
    assert!(transmit(&with(hdr(1, 0)), Offloads { csum: true, gso: false }).is_ok());
    assert_eq!(transmit(&with(hdr(0, 1)), Offloads::default()), Err(NetError::GsoNotNegotiated));
    assert_eq!(
        transmit(&[Buf::Read(hdr(0, 0)), Buf::Read(vec![0; 13])], Offloads::default()),
        Err(NetError::Runt)
    );
    assert_eq!(transmit(&[Buf::Read(vec![0; 8])], Offloads::default()), Err(NetError::Runt));
    assert_eq!(
        transmit(&[Buf::Read(hdr(0, 0)), Buf::Read(vec![0; 9217])], Offloads::default()),
        Err(NetError::TooLong)
    );
}

#[test]
fn frames_reach_the_guest_behind_a_header() {
    let (pool, mut cache) = pool();
    let f = frame(1514);
    let b = cache.alloc_frame(&f).unwrap();
    for layout in [
        vec![Buf::Write(2048)],
        vec![Buf::Write(12), Buf::Write(1514)],
        vec![Buf::Write(7), Buf::Write(700), Buf::Write(900)],
    ] {
        let mut g = Guest::new(8);
        let mut q = g.queue();
        let (head, addrs) = g.post(&layout);
        let mut r = q.ring(&g.mem).unwrap();
        let mut c = Chain::default();
        r.pop(&mut c).unwrap().unwrap();
        let n = net::to_guest(r.memory(), &c, &pool, &b).unwrap();
        r.push_used(c.head, n);
        drop(r);
        assert_eq!(g.completions(), vec![(head, (HDR_LEN + f.len()) as u32)]);
        let mut got = Vec::new();
        for (a, l) in addrs.iter().zip(&layout) {
            let Buf::Write(l) = l else { unreachable!() };
            got.extend(g.read(*a, *l as usize));
        }
        let mut want = vec![0u8; HDR_LEN];
        want[10] = 1; // num_buffers
        want.extend_from_slice(&f);
        assert_eq!(&got[..want.len()], &want[..], "layout {layout:?}");
    }
    cache.free(b);
}

#[test]
fn a_receive_chain_too_small_stays_for_a_smaller_frame() {
    let (pool, mut cache) = pool();
    let big = cache.alloc_frame(&frame(1514)).unwrap();
    let small = cache.alloc_frame(&frame(60)).unwrap();
    let mut g = Guest::new(8);
    let mut q = g.queue();
    let (head, _) = g.post(&[Buf::Write(512)]);
    let mut c = Chain::default();
    let mut r = q.ring(&g.mem).unwrap();
    r.pop(&mut c).unwrap().unwrap();
    assert_eq!(net::to_guest(r.memory(), &c, &pool, &big), Err(NetError::GuestBufferTooSmall));
    r.unpop();
    r.pop(&mut c).unwrap().unwrap();
    assert_eq!(c.head, head);
    let n = net::to_guest(r.memory(), &c, &pool, &small).unwrap();
    r.push_used(c.head, n);
    drop(r);
    assert_eq!(g.completions(), vec![(head, 72)]);
    cache.free(big);
    cache.free(small);
}

/// With MRG_RXBUF a frame spreads over several receive chains; the first header says how
/// many. Too few chains: none is used and the frame is refused.
#[test]
fn mergeable_receive_buffers() {
    let (pool, mut cache) = pool();
    let f = frame(1514);
    let b = cache.alloc_frame(&f).unwrap();
    let mut g = Guest::new(16);
    let mut q = Virtqueue::from(g.queue());
    // Three chains of 600 bytes hold the 12-byte header and 1514 bytes; a fourth is spare.
    let posted: Vec<(u16, u64)> =
        (0..4).map(|_| g.post(&[Buf::Write(600)])).map(|(h, a)| (h, a[0])).collect();
    {
        let mut r = q.ring(&g.mem).unwrap();
        net::to_guest_merged(&mut r, &pool, &b, &mut Default::default()).unwrap();
    }
    let done = g.completions();
    assert_eq!(
        done,
        vec![(posted[0].0, 600), (posted[1].0, 600), (posted[2].0, (HDR_LEN + 1514 - 1200) as u32)]
    );
    let mut got = Vec::new();
    for (i, (_, len)) in done.iter().enumerate() {
        got.extend(g.read(posted[i].1, *len as usize));
    }
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 3, "num_buffers");
    assert_eq!(&got[HDR_LEN..], &f[..]);
    // One 600-byte chain left: not enough for the next 1514-byte frame.
    {
        let mut r = q.ring(&g.mem).unwrap();
        assert_eq!(
            net::to_guest_merged(&mut r, &pool, &b, &mut Default::default()),
            Err(NetError::GuestBufferTooSmall)
        );
        assert_eq!(r.pending(), 1, "the chain is put back");
    }
    assert_eq!(g.completions(), vec![]);
    cache.free(b);
}

/// IN_ORDER is offered: a bad chain met in the middle of a merged frame goes back to the
/// guest after the chains filled before it, in ring order, all empty.
#[test]
fn a_bad_chain_mid_frame_returns_every_chain_in_ring_order() {
    let (pool, mut cache) = pool();
    let b = cache.alloc_frame(&frame(1514)).unwrap();
    let mut g = Guest::new(16);
    let mut q = Virtqueue::from(g.queue());
    let heads: Vec<u16> = (0..3).map(|_| g.post(&[Buf::Write(600)]).0).collect();
    // The third chain points outside guest memory.
    g.put_desc(heads[2], 0x7e00_0000_0000, 600, 2, 0);
    {
        let mut r = q.ring(&g.mem).unwrap();
        assert_eq!(
            net::to_guest_merged(&mut r, &pool, &b, &mut Default::default()),
            Err(NetError::BadChain)
        );
    }
    assert_eq!(g.completions(), vec![(heads[0], 0), (heads[1], 0), (heads[2], 0)]);
    cache.free(b);
}
