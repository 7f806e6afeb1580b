//! 802.1Q tag push, pop and TPID rewrite on a packet's head segment, in place.
//!
//! Push prepends 4 bytes into the headroom and moves only the 12 bytes of MAC addresses;
//! pop moves them back. The payload never moves.

use crate::buf::{BufId, Pool, PoolView};

/// Inserts a tag (TPID, TCI) after the MAC addresses; false if headroom or data is short.
#[inline]
pub fn push(pool: &Pool, b: &mut BufId, tpid: u16, tci: u16) -> bool {
    if pool.head(b).len() < 12 {
        return false;
    }
    let Some(h) = pool.prepend(b, 4) else { return false };
    move_macs(h, 4, 0);
    h[12..14].copy_from_slice(&tpid.to_be_bytes());
    h[14..16].copy_from_slice(&tci.to_be_bytes());
    true
}

/// Removes the outer tag; false if the head is shorter than a tagged header. Always
/// inlined: the cache's hit path pops with it, and out of line it cost ~10 instructions a
/// frame more (the inliner dropped it once the hit path's caller grew).
#[inline(always)]
pub fn pop(pool: PoolView, b: &mut BufId) -> bool {
    let h = pool.head_mut(b);
    if h.len() < 18 {
        return false;
    }
    move_macs(h, 0, 4);
    pool.strip(b, 4)
}

/// Moves the 12 bytes of MAC addresses from `from` to `to` through a fixed-size copy, which
/// always compiles to a few register moves (a `copy_within` may become a `memmove` call once
/// the compiler outlines it for its other users).
#[inline(always)]
fn move_macs(h: &mut [u8], from: usize, to: usize) {
    let mut macs = [0u8; 12];
    macs.copy_from_slice(&h[from..from + 12]);
    h[to..to + 12].copy_from_slice(&macs);
}

/// Rewrites the TPID of an outer tag when it differs.
#[inline]
pub fn set_tpid(pool: &Pool, b: &mut BufId, tpid: u16) {
    let h = pool.head_mut(b);
    if h.len() >= 14 {
        let t = tpid.to_be_bytes();
        if h[12..14] != t {
            h[12..14].copy_from_slice(&t);
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::buf::PoolCache;

    #[test]
    fn push_then_pop_is_identity() {
        let pool = Pool::new(16, false).unwrap();
        let mut c = PoolCache::new(pool.clone());
        let frame: Vec<u8> = (0..64u8).collect();
        let mut b = c.alloc_frame(&frame).unwrap();
        assert!(push(&pool, &mut b, 0x8100, 0x2064));
        let h = pool.head(&b);
        assert_eq!(&h[..12], &frame[..12]);
        assert_eq!(&h[12..16], &[0x81, 0x00, 0x20, 0x64]);
        assert_eq!(&h[16..], &frame[12..]);
        set_tpid(&pool, &mut b, 0x88a8);
        assert_eq!(&pool.head(&b)[12..14], &[0x88, 0xa8]);
        assert!(pop(pool.view(), &mut b));
        assert_eq!(pool.head(&b), &frame[..]);
        c.free(b);
    }
}
