//! Packet capture, like `ovs-tcpdump`, VPP's `pcap trace` and `dpdk-dumpcap`: copies of the
//! frames a port receives and sends — vhost-user, AF_XDP and DPDK ports whose traffic never
//! reaches the kernel's taps — each with the reason the switch dropped it, if it did, for the
//! control side to stream out (the node API writes them as pcapng through `knitterctl`).
//!
//! One capture at a time per switch ([`Capture::start`] refuses a second). PMD threads look
//! once per burst whether the burst's port is captured (one load on receive, one per tx batch
//! sent) and only then filter ([`crate::bpf`], over the frame's first segment) and copy its
//! frames into slots made when the capture started: no allocation, lock or syscall per
//! frame. Slots go round between two lock-free queues (free → full → the control side →
//! free); when the control side falls behind, frames find no free slot and are counted as
//! lost: a capture never stalls a PMD thread.

use crate::bpf::Program;
use crate::counters::DropReason;
use arc_swap::ArcSwapOption;
use crossbeam_queue::ArrayQueue;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use thiserror::Error;

/// Frames a capture can hold between two collections by the control side.
pub const SLOTS: usize = 1024;
/// The most bytes of a frame a capture keeps (a jumbo frame whole).
pub const MAX_SNAPLEN: u32 = 16_384;
/// The snap length when none is asked for: every frame of a 9,000-byte MTU whole.
pub const DEFAULT_SNAPLEN: u32 = 9_216;

/// Which way a captured frame went through its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received from the port (as the port gave it, before any decision).
    Rx,
    /// Sent to the port (as it left, after every rewrite).
    Tx,
}

/// What to capture.
#[derive(Debug, Clone)]
pub struct Request {
    pub port: u16,
    pub rx: bool,
    pub tx: bool,
    /// Frames to capture (0: until stopped).
    pub count: u64,
    /// Bytes of each frame kept (0: [`DEFAULT_SNAPLEN`]; at most [`MAX_SNAPLEN`]).
    pub snaplen: u32,
    pub filter: Option<Program>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CaptureError {
    #[error("a capture is running already (port id {0}); one at a time: stop it first")]
    Busy(u16),
    #[error("snap length {0}: at most {MAX_SNAPLEN} bytes")]
    Snaplen(u32),
    #[error("capture neither received nor sent frames: pick a direction")]
    NoDirection,
}

/// One captured frame, held in a slot.
pub struct Slot {
    /// When the burst it came in (or left) was handled: nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The frame's whole length (the slot keeps up to the snap length of it).
    pub orig_len: u32,
    pub dir: Direction,
    /// The PMD thread that saw it.
    pub thread: u16,
    /// Why the switch dropped it, where it did (on receive: anywhere in the pipeline; on
    /// send: a full ring).
    pub reason: Option<DropReason>,
    len: usize,
    data: Box<[u8]>,
}

impl Slot {
    fn new(snaplen: usize) -> Box<Slot> {
        Box::new(Slot {
            ts_ns: 0,
            orig_len: 0,
            dir: Direction::Rx,
            thread: 0,
            reason: None,
            len: 0,
            data: vec![0; snaplen].into_boxed_slice(),
        })
    }

    /// The frame's captured bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }

    /// Starts the slot over with a frame of `orig_len` bytes.
    pub(crate) fn begin(&mut self, ts_ns: u64, dir: Direction, thread: u16, orig_len: u32) {
        (self.ts_ns, self.dir, self.thread, self.orig_len, self.reason, self.len) =
            (ts_ns, dir, thread, orig_len, None, 0);
    }

    /// A frame to `from` leaves addressed to `to` (a gateway's port, see
    /// `PortEntry::deliver_as`).
    pub(crate) fn readdress(&mut self, from: crate::wire::MacAddr, to: crate::wire::MacAddr) {
        if let Some(dst) = self.data[..self.len].get_mut(..6)
            && *dst == from.0
        {
            dst.copy_from_slice(&to.0);
        }
    }

    /// Appends a piece of the frame, up to the snap length.
    pub(crate) fn append(&mut self, piece: &[u8]) {
        let room = self.data.len() - self.len;
        let n = piece.len().min(room);
        self.data[self.len..self.len + n].copy_from_slice(&piece[..n]);
        self.len += n;
    }
}

/// A running capture: its request and its slots.
pub struct Session {
    pub port: u16,
    pub rx: bool,
    pub tx: bool,
    pub snaplen: u32,
    filter: Option<Program>,
    /// Frames still to capture (`u64::MAX`: no count).
    remaining: AtomicU64,
    free: ArrayQueue<Box<Slot>>,
    full: ArrayQueue<Box<Slot>>,
    /// Frames that passed the filter but found no free slot.
    lost: AtomicU64,
    /// The switch ended the capture: its port went.
    gone: AtomicBool,
}

impl Session {
    /// Whether the filter (if any) takes a frame whose first segment is `head`.
    #[inline]
    pub(crate) fn wants(&self, head: &[u8], len: u32) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches(head, len))
    }

    /// A free slot for a frame the filter took, if the count allows one more and a slot is
    /// free (else the frame is counted as lost).
    pub(crate) fn take_slot(&self) -> Option<Box<Slot>> {
        match self.remaining.load(Relaxed) {
            0 => return None,
            u64::MAX => {}
            _ => {
                let claimed = self.remaining.fetch_update(AcqRel, Acquire, |r| r.checked_sub(1));
                if claimed.is_err() {
                    return None;
                }
            }
        }
        let slot = self.free.pop();
        if slot.is_none() {
            self.lost.fetch_add(1, Relaxed);
            self.unclaim();
        }
        slot
    }

    /// Gives back the count a frame took.
    fn unclaim(&self) {
        let _ = self.remaining.fetch_update(AcqRel, Acquire, |r| (r != u64::MAX).then(|| r + 1));
    }

    /// Hands a filled slot to the control side.
    pub(crate) fn hand_over(&self, slot: Box<Slot>) {
        // Never full: the two queues hold the session's slots between them.
        let _ = self.full.push(slot);
    }

    /// Returns an unused slot (its frame is not captured after all) and the count it took.
    pub(crate) fn give_back(&self, slot: Box<Slot>) {
        self.unclaim();
        let _ = self.free.push(slot);
    }

    /// The next captured frame, if any: `f` reads it and the slot goes back to the free list.
    pub fn next<T>(&self, f: impl FnOnce(&Slot) -> T) -> Option<T> {
        let slot = self.full.pop()?;
        let t = f(&slot);
        let _ = self.free.push(slot);
        Some(t)
    }

    /// Frames the capture could not keep (no free slot: the control side fell behind).
    pub fn lost(&self) -> u64 {
        self.lost.load(Relaxed)
    }

    /// Whether the count is reached (nothing more will be captured).
    pub fn complete(&self) -> bool {
        self.remaining.load(Acquire) == 0
    }

    /// Whether the capture was ended by the switch: its port was removed (its id may name
    /// another port next).
    pub fn port_gone(&self) -> bool {
        self.gone.load(Acquire)
    }

    /// Whether this session captures what `port` receives (or, `tx`, sends): a PMD thread's
    /// check that the session it found is the one its armed port was for.
    #[inline]
    pub(crate) fn serves(&self, port: u16, tx: bool) -> bool {
        self.port == port && if tx { self.tx } else { self.rx }
    }
}

/// The switch's capture: which port is captured (checked by PMD threads once per burst) and
/// the running session.
#[derive(Default)]
pub struct Capture {
    /// The port whose received frames are captured, plus one (0: none).
    rx: AtomicU32,
    /// The port whose sent frames are captured, plus one (0: none).
    tx: AtomicU32,
    session: ArcSwapOption<Session>,
    /// Held by `start` and `stop` across the session's swap and the armed ports' stores, so
    /// that a stop and a start never interleave (a new session left unarmed).
    control: Mutex<()>,
}

impl Capture {
    /// Starts a capture; refused while another runs.
    pub fn start(&self, r: Request) -> Result<Arc<Session>, CaptureError> {
        if !r.rx && !r.tx {
            return Err(CaptureError::NoDirection);
        }
        let snaplen = match r.snaplen {
            0 => DEFAULT_SNAPLEN,
            n if n <= MAX_SNAPLEN => n,
            n => return Err(CaptureError::Snaplen(n)),
        };
        let _control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(port) = self.running() {
            return Err(CaptureError::Busy(port));
        }
        let (free, full) = (ArrayQueue::new(SLOTS), ArrayQueue::new(SLOTS));
        for _ in 0..SLOTS {
            let _ = free.push(Slot::new(snaplen as usize));
        }
        let remaining = AtomicU64::new(if r.count == 0 { u64::MAX } else { r.count });
        let s = Arc::new(Session {
            port: r.port,
            rx: r.rx,
            tx: r.tx,
            snaplen,
            filter: r.filter,
            remaining,
            free,
            full,
            lost: AtomicU64::new(0),
            gone: AtomicBool::new(false),
        });
        self.session.store(Some(s.clone()));
        let armed = r.port as u32 + 1;
        self.rx.store(if r.rx { armed } else { 0 }, Release);
        self.tx.store(if r.tx { armed } else { 0 }, Release);
        Ok(s)
    }

    /// Ends `s` (if it is the running capture): PMD threads stop copying at their next
    /// burst; frames already copied stay readable through `s`.
    pub fn stop(&self, s: &Arc<Session>) {
        let _control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if self.session.load().as_ref().is_some_and(|p| Arc::ptr_eq(p, s)) {
            self.rx.store(0, Release);
            self.tx.store(0, Release);
            self.session.store(None);
        }
    }

    /// Ends the capture of port id `port`, if one runs (the port is going: its id may be
    /// given to another port).
    pub fn port_removed(&self, port: u16) {
        let running = self.session.load_full();
        if let Some(s) = running.filter(|s| s.port == port) {
            s.gone.store(true, Release);
            self.stop(&s);
        }
    }

    /// Whether frames received on `port` are captured (a PMD thread's one check per burst).
    #[inline(always)]
    pub fn rx_armed(&self, port: u16) -> bool {
        self.rx.load(Relaxed) == port as u32 + 1
    }

    /// Whether frames sent to `port` are captured (one check per tx batch).
    #[inline(always)]
    pub fn tx_armed(&self, port: u16) -> bool {
        self.tx.load(Relaxed) == port as u32 + 1
    }

    /// The running session, for a burst that found its port armed.
    pub(crate) fn session(&self) -> Option<Arc<Session>> {
        self.session.load_full()
    }

    /// The running session's port id, if one runs.
    pub fn running(&self) -> Option<u16> {
        self.session.load().as_ref().map(|s| s.port)
    }
}

/// Wall-clock time in nanoseconds since the Unix epoch (the vDSO's clock: no syscall).
pub(crate) fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(port: u16, count: u64) -> Request {
        Request { port, rx: true, tx: false, count, snaplen: 64, filter: None }
    }

    #[test]
    fn one_capture_at_a_time_and_stopping_disarms() {
        let c = Capture::default();
        let s = c.start(req(3, 0)).unwrap();
        assert!(c.rx_armed(3) && !c.tx_armed(3) && !c.rx_armed(2));
        assert_eq!(c.start(req(4, 0)).err(), Some(CaptureError::Busy(3)));
        c.stop(&s);
        assert!(!c.rx_armed(3));
        let t = c.start(req(4, 0)).unwrap();
        c.stop(&s); // an old session's stop leaves the new one running
        assert!(c.rx_armed(4));
        c.stop(&t);
        assert_eq!(
            c.start(Request { rx: false, ..req(1, 0) }).err(),
            Some(CaptureError::NoDirection)
        );
        assert_eq!(
            c.start(Request { snaplen: MAX_SNAPLEN + 1, ..req(1, 0) }).err(),
            Some(CaptureError::Snaplen(MAX_SNAPLEN + 1))
        );
    }

    #[test]
    fn the_count_and_the_slots_bound_a_capture() {
        let c = Capture::default();
        let s = c.start(req(0, 2)).unwrap();
        for i in 0..3u8 {
            if let Some(mut slot) = s.take_slot() {
                slot.begin(1, Direction::Rx, 0, 100);
                slot.append(&[i; 100]);
                s.hand_over(slot);
            }
        }
        assert!(s.complete());
        assert_eq!(
            s.next(|f| (f.bytes().len(), f.orig_len, f.bytes()[0])),
            Some((64, 100, 0)),
            "cut at the snap length"
        );
        assert_eq!(s.next(|f| f.bytes()[0]), Some(1));
        assert_eq!(s.next(|f| f.bytes()[0]), None);
        c.stop(&s);

        let s = c.start(req(0, 0)).unwrap();
        let held: Vec<_> = std::iter::from_fn(|| s.take_slot()).take(SLOTS + 5).collect();
        assert_eq!(held.len(), SLOTS);
        assert!(s.take_slot().is_none());
        assert_eq!(s.lost(), 2, "the frames that found no slot are counted");
    }
}
