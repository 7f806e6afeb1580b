//! Classic pcap files (Ethernet), for ports whose device reads and writes them (DPDK's
//! `net_pcap`): written with microsecond timestamps, read in either resolution.

use std::io;
use std::path::Path;

pub fn write(path: &Path, frames: &[Vec<u8>]) -> io::Result<()> {
    let mut out = Vec::new();
    out.extend(0xa1b2_c3d4u32.to_le_bytes());
    out.extend(2u16.to_le_bytes());
    out.extend(4u16.to_le_bytes());
    out.extend([0u8; 8]);
    out.extend(65535u32.to_le_bytes());
    out.extend(1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend((i as u32).to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend((f.len() as u32).to_le_bytes());
        out.extend((f.len() as u32).to_le_bytes());
        out.extend(f);
    }
    std::fs::write(path, out)
}

pub fn read(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let b = std::fs::read(path)?;
    let bad = |what: &str| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()))
    };
    let magic = b
        .get(..4)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]))
        .ok_or_else(|| bad("no header"))?;
    if magic != 0xa1b2_c3d4 && magic != 0xa1b2_3c4d {
        return Err(bad("not a little-endian pcap file"));
    }
    let (mut at, mut out) = (24, Vec::new());
    while at + 16 <= b.len() {
        let incl = u32::from_le_bytes([b[at + 8], b[at + 9], b[at + 10], b[at + 11]]) as usize;
        out.push(b.get(at + 16..at + 16 + incl).ok_or_else(|| bad("truncated record"))?.to_vec());
        at += 16 + incl;
    }
    Ok(out)
}
