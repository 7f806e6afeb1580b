//! The capture's taps in the pipeline ([`crate::capture`]): a received burst of a captured
//! port is copied as it arrives and its copies held until the burst is done, so that a frame
//! the pipeline drops carries the drop's reason; a tx batch to a captured port is copied as
//! it leaves, the frames its ring refused marked `tx_full`. Bursts of other ports pay one
//! load (`Capture::rx_armed`, `Capture::tx_armed`); the taps are cold code.

use super::Pipeline;
use crate::batch::{BATCH, Batch};
use crate::buf::{BufId, Pool};
use crate::capture::{Capture, Direction, Session, Slot, wall_ns};

use crate::counters::DropReason;
use crate::snapshot::Snapshot;
use std::sync::Arc;

/// The copies of one burst's frames, each beside the index of the buffer it came from.
pub(super) struct Staged {
    session: Option<Arc<Session>>,
    slots: [Option<Box<Slot>>; BATCH],
    bufs: [u32; BATCH],
    n: usize,
}

impl Staged {
    fn new() -> Staged {
        Staged {
            session: None,
            slots: std::array::from_fn(|_| None),
            bufs: [u32::MAX; BATCH],
            n: 0,
        }
    }

    /// Copies the frames of `batch` the session's filter takes.
    fn copy(&mut self, s: Arc<Session>, pool: &Pool, batch: &Batch, dir: Direction, thread: usize) {
        let ts = wall_ns();
        for b in batch.as_slice() {
            let (head, len) = (pool.head(b), pool.pkt_len(b));
            if !s.wants(head, len as u32) {
                continue;
            }
            let Some(mut slot) = s.take_slot() else { continue };
            slot.begin(ts, dir, thread as u16, len as u32);
            pool.each_piece(b, |piece| slot.append(piece));
            match (self.slots.get_mut(self.n), self.bufs.get_mut(self.n)) {
                (Some(place), Some(buf)) => {
                    *place = Some(slot);
                    *buf = b.index();
                    self.n += 1;
                }
                _ => s.give_back(slot), // a batch holds at most BATCH frames: unreachable
            }
        }
        self.session = Some(s);
    }

    /// Marks the copy of buffer `b` (the first not marked yet) as dropped for `r`.
    fn mark(&mut self, b: u32, r: DropReason) {
        for (buf, slot) in self.bufs[..self.n].iter().zip(&mut self.slots) {
            if let Some(slot) = slot
                && *buf == b
                && slot.reason.is_none()
            {
                slot.reason = Some(r);
                return;
            }
        }
    }

    /// Gives back the copy of buffer `b` (a frame that will be copied again when it goes).
    fn forget(&mut self, b: u32) {
        for (buf, slot) in self.bufs[..self.n].iter_mut().zip(&mut self.slots) {
            if *buf == b
                && let (Some(slot), Some(s)) = (slot.take(), &self.session)
            {
                *buf = u32::MAX;
                s.give_back(slot);
                return;
            }
        }
    }

    /// Drops every copy (after a panic: the pipeline is left behind).
    fn reset(&mut self) {
        self.slots.iter_mut().for_each(|s| drop(s.take()));
        self.session = None;
        self.n = 0;
    }

    /// Hands every copy to the session.
    fn commit(&mut self) {
        if let Some(s) = self.session.take() {
            for slot in self.slots[..self.n].iter_mut().filter_map(Option::take) {
                s.hand_over(slot);
            }
        }
        self.n = 0;
    }
}

/// The pipeline's capture state: the switch's capture and, while a received burst is
/// captured (`on`), its copies.
pub(super) struct Taps {
    pub(super) requests: Arc<Capture>,
    pub(super) on: bool,
    rx: Box<Staged>,
    tx: Box<Staged>,
}

impl Taps {
    pub(super) fn new() -> Taps {
        Taps {
            requests: Arc::new(Capture::default()),
            on: false,
            rx: Box::new(Staged::new()),
            tx: Box::new(Staged::new()),
        }
    }
}

impl Taps {
    /// After a panic in a burst: the copies staged for it are dropped with their session's
    /// reference (the pipeline they belong to is left behind).
    pub(super) fn reset(&mut self) {
        self.rx.reset();
        self.tx.reset();
        self.on = false;
    }
}

impl Pipeline {
    /// Copies a received burst of captured port `port`; the copies wait for the burst's end.
    pub(super) fn capture_rx(&mut self, port: u16, batch: &Batch) {
        let Some(s) = self.taps.requests.session().filter(|s| s.serves(port, false)) else {
            return;
        };
        self.taps.rx.copy(s, &self.pool, batch, Direction::Rx, self.thread);
        self.taps.on = true;
    }

    /// The copies of frames a policer took out of `batch` are marked `policed`.
    pub(super) fn capture_policed(&mut self, batch: &Batch) {
        let st = &mut *self.taps.rx;
        for i in 0..st.n {
            if !batch.as_slice().iter().any(|b| b.index() == st.bufs[i])
                && let Some(slot) = &mut st.slots[i]
            {
                slot.reason.get_or_insert(DropReason::Policed);
            }
        }
    }

    /// A frame of a captured burst was dropped, charged to `port`: if that is the captured
    /// port (the frame's ingress; drops of copies a flood made are charged to their egress),
    /// its copy says why.
    #[cold]
    #[inline(never)]
    pub(super) fn capture_dropped(&mut self, b: &BufId, r: DropReason, port: u16) {
        if self.taps.rx.session.as_ref().is_some_and(|s| s.port == port) {
            self.taps.rx.mark(b.index(), r);
        }
    }

    /// The captured burst is done: its copies go to the control side.
    pub(super) fn capture_commit(&mut self) {
        self.taps.rx.commit();
        self.taps.on = false;
    }
}

impl Taps {
    /// Copies a tx batch to a captured port before it is sent (false: no capture runs);
    /// [`Taps::sent`] after.
    #[cold]
    #[inline(never)]
    pub(super) fn copy_tx(
        &mut self,
        snap: &Snapshot,
        port: u16,
        pool: &Pool,
        batch: &Batch,
        thread: usize,
    ) -> bool {
        let Some(s) = self.requests.session().filter(|s| s.serves(port, true)) else {
            return false;
        };
        self.tx.copy(s, pool, batch, Direction::Tx, thread);
        // A gateway's port gets the frames for the gateway addressed to its own MAC (done by
        // `send_batch`, after this copy): so do their copies.
        if let Some((gateway, own)) = snap.port(port).and_then(|pe| pe.deliver_as) {
            for slot in self.tx.slots[..self.tx.n].iter_mut().flatten() {
                slot.readdress(gateway, own);
            }
        }
        true
    }

    /// The port's ring took the first frames of the tx batch, `left` holds the rest: their
    /// copies are marked `unsent` (dropped) or, `None` (they wait for the next flush), given
    /// back; the others go to the control side.
    #[cold]
    #[inline(never)]
    pub(super) fn sent(&mut self, left: &Batch, unsent: Option<DropReason>) {
        let st = &mut *self.tx;
        for b in left.as_slice() {
            match unsent {
                Some(r) => st.mark(b.index(), r),
                None => st.forget(b.index()),
            }
        }
        st.commit();
    }
}
