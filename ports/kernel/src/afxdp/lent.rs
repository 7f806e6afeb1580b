//! Pool buffers the kernel holds through a socket's rings, one bit each: a descriptor the
//! kernel returns is accepted only if it names a lent buffer.

/// Pool buffers the kernel holds, one bit each.
pub(super) struct Lent(Vec<u64>);

impl Lent {
    pub(super) fn new(buffers: usize) -> Lent {
        Lent(vec![0; buffers.div_ceil(64)])
    }

    pub(super) fn set(&mut self, idx: u32) {
        if let Some(w) = self.0.get_mut(idx as usize / 64) {
            *w |= 1 << (idx % 64);
        }
    }

    /// Whether `idx` was lent; marks it returned.
    pub(super) fn take(&mut self, idx: u32) -> bool {
        match self.0.get_mut(idx as usize / 64) {
            Some(w) if *w & (1 << (idx % 64)) != 0 => {
                *w &= !(1 << (idx % 64));
                true
            }
            _ => false,
        }
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter_mut().enumerate().flat_map(|(w, word)| {
            let mut bits = std::mem::take(word);
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    (w * 64) as u32 + b
                })
            })
        })
    }
}
