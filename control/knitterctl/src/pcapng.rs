//! pcapng (draft-ietf-opsawg-pcapng), as `tcpdump -r` and Wireshark read it: a section
//! header, one interface (the captured port: Ethernet, nanosecond timestamps), an enhanced
//! packet block per frame (its direction in `epb_flags`, a drop's reason as its comment) and,
//! at the end, the interface's statistics (frames the daemon could not keep: `isb_osdrop`).
//! Written in the machine's byte order, which the section header's magic declares.

use std::io::{self, Write};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 1;
const ISB: u32 = 5;
const EPB: u32 = 6;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const LINKTYPE_ETHERNET: u16 = 1;
const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
const ISB_FILTERACCEPT: u16 = 6;
const ISB_OSDROP: u16 = 7;
const ISB_USRDELIV: u16 = 8;
/// `epb_flags` bits 0-1: the frame's direction.
const INBOUND: u32 = 1;
const OUTBOUND: u32 = 2;

/// A pcapng stream of one captured port.
pub struct Writer<W: Write> {
    w: W,
}

/// Appends option `code` with `value`, padded to 32 bits.
fn opt(body: &mut Vec<u8>, code: u16, value: &[u8]) {
    body.extend_from_slice(&code.to_ne_bytes());
    body.extend_from_slice(&(value.len() as u16).to_ne_bytes());
    body.extend_from_slice(value);
    pad(body);
}

fn pad(body: &mut Vec<u8>) {
    body.resize(body.len().next_multiple_of(4), 0);
}

fn split_ts(ns: u64) -> [u8; 8] {
    let mut b = [0; 8];
    b[..4].copy_from_slice(&((ns >> 32) as u32).to_ne_bytes());
    b[4..].copy_from_slice(&(ns as u32).to_ne_bytes());
    b
}

impl<W: Write> Writer<W> {
    /// Starts the stream: the section header and the port's interface description.
    pub fn new(w: W, port: &str, snaplen: u32) -> io::Result<Writer<W>> {
        let mut me = Writer { w };
        let mut shb = Vec::new();
        shb.extend_from_slice(&BYTE_ORDER_MAGIC.to_ne_bytes());
        shb.extend_from_slice(&1u16.to_ne_bytes());
        shb.extend_from_slice(&0u16.to_ne_bytes());
        shb.extend_from_slice(&(-1i64).to_ne_bytes());
        opt(&mut shb, SHB_USERAPPL, concat!("knitterctl ", env!("CARGO_PKG_VERSION")).as_bytes());
        opt(&mut shb, OPT_END, &[]);
        me.block(SHB, &shb)?;
        let mut idb = Vec::new();
        idb.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        idb.extend_from_slice(&0u16.to_ne_bytes());
        idb.extend_from_slice(&snaplen.to_ne_bytes());
        opt(&mut idb, IF_NAME, port.as_bytes());
        opt(&mut idb, IF_TSRESOL, &[9]);
        opt(&mut idb, OPT_END, &[]);
        me.block(IDB, &idb)?;
        Ok(me)
    }

    /// One frame: `outbound` it left the port; `comment` (a drop's reason) if any.
    pub fn frame(
        &mut self,
        ts_ns: u64,
        outbound: bool,
        orig_len: u32,
        data: &[u8],
        comment: Option<&str>,
    ) -> io::Result<()> {
        let mut epb = Vec::with_capacity(data.len() + 64);
        epb.extend_from_slice(&0u32.to_ne_bytes());
        epb.extend_from_slice(&split_ts(ts_ns));
        epb.extend_from_slice(&(data.len() as u32).to_ne_bytes());
        epb.extend_from_slice(&orig_len.to_ne_bytes());
        epb.extend_from_slice(data);
        pad(&mut epb);
        opt(&mut epb, EPB_FLAGS, &(if outbound { OUTBOUND } else { INBOUND }).to_ne_bytes());
        if let Some(c) = comment {
            opt(&mut epb, OPT_COMMENT, c.as_bytes());
        }
        opt(&mut epb, OPT_END, &[]);
        self.block(EPB, &epb)
    }

    /// The interface's statistics: frames the filter took (`isb_filteraccept`), those the
    /// daemon could not keep (`isb_osdrop`) and those written (`isb_usrdeliv`).
    pub fn stats(&mut self, ts_ns: u64, delivered: u64, lost: u64) -> io::Result<()> {
        let mut isb = Vec::new();
        isb.extend_from_slice(&0u32.to_ne_bytes());
        isb.extend_from_slice(&split_ts(ts_ns));
        opt(&mut isb, ISB_FILTERACCEPT, &(delivered + lost).to_ne_bytes());
        opt(&mut isb, ISB_OSDROP, &lost.to_ne_bytes());
        opt(&mut isb, ISB_USRDELIV, &delivered.to_ne_bytes());
        opt(&mut isb, OPT_END, &[]);
        self.block(ISB, &isb)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    fn block(&mut self, kind: u32, body: &[u8]) -> io::Result<()> {
        let total = (12 + body.len()) as u32;
        self.w.write_all(&kind.to_ne_bytes())?;
        self.w.write_all(&total.to_ne_bytes())?;
        self.w.write_all(body)?;
        self.w.write_all(&total.to_ne_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block is a multiple of 4 bytes and carries its length at both ends.
    #[test]
    fn blocks_are_framed_and_padded() {
        let mut w = Writer::new(Vec::new(), "pod-a", 9216).unwrap();
        w.frame(1_700_000_000_123_456_789, false, 61, &[0xab; 61], Some("dropped: security_ip"))
            .unwrap();
        w.stats(1_700_000_000_200_000_000, 1, 0).unwrap();
        let b = w.w;
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < b.len() {
            let kind = u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
            let len = u32::from_ne_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize;
            assert_eq!(len % 4, 0);
            assert_eq!(
                u32::from_ne_bytes(b[at + len - 4..at + len].try_into().unwrap()) as usize,
                len
            );
            kinds.push(kind);
            at += len;
        }
        assert_eq!(at, b.len());
        assert_eq!(kinds, vec![SHB, IDB, EPB, ISB]);
    }
}
