//! The little of `bpf(2)` the AF_XDP port needs, without a C toolchain: an XSKMAP, Knitter's
//! XDP program (five instructions, assembled here) and its attachment through a BPF link,
//! which the kernel removes when the link's descriptor is closed.
//!
//! The program redirects every frame of an rx queue to the AF_XDP socket registered for that
//! queue and passes frames of queues without a socket to the kernel:
//!
//! ```text
//! r2 = *(u32 *)(r1 + 16)        ; xdp_md->rx_queue_index
//! r1 = map_fd(xsks)             ; ld_imm64, pseudo map fd
//! r3 = XDP_PASS                 ; action when the map has no socket for the queue
//! call bpf_redirect_map
//! exit
//! ```

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_PASS: i32 = 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `XDP_FLAGS_SKB_MODE`: generic XDP, works on every device (veth included).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: native XDP in the driver.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// `union bpf_attr` is at most this large for the commands used here.
type Attr = [u8; 128];

fn put_u32(a: &mut Attr, off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(a: &mut Attr, off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn bpf(cmd: libc::c_long, attr: &Attr) -> io::Result<i64> {
    // SAFETY: bpf(2) reads `size` bytes of a zero-padded attribute union we own; pointers in
    // it (instructions, license, log, key, value) point at live locals of the caller.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len() as u32) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn fd(r: i64) -> OwnedFd {
    // SAFETY: a descriptor bpf(2) just returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// One eBPF instruction.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8, // dst in the low nibble, src in the high nibble
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | dst, off, imm }
}

/// An XDP program with its XSKMAP, attached to one interface while this value lives.
pub struct XdpRedirect {
    map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl XdpRedirect {
    /// Loads the program and attaches it to `ifindex` with `flags` (SKB or DRV mode).
    pub fn attach(ifindex: u32, flags: u32, max_queues: u32) -> io::Result<XdpRedirect> {
        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, BPF_MAP_TYPE_XSKMAP);
        put_u32(&mut a, 4, 4); // key: queue index
        put_u32(&mut a, 8, 4); // value: socket fd
        put_u32(&mut a, 12, max_queues.max(1));
        let map = fd(bpf(BPF_MAP_CREATE, &a)?);

        let prog = [
            insn(0x61, 2, 1, 16, 0),                                 // r2 = *(u32 *)(r1 + 16)
            insn(0x18, 1, 1, 0, map.as_raw_fd()),                    // r1 = map (pseudo fd)
            insn(0, 0, 0, 0, 0),                                     //   second half of ld_imm64
            insn(0xb7, 3, 0, 0, XDP_PASS),                           // r3 = XDP_PASS
            insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),              // call bpf_redirect_map
            insn(0x95, 0, 0, 0, 0),                                  // exit
        ];
        let license = c"GPL";
        let mut log = vec![0u8; 4096];
        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, BPF_PROG_TYPE_XDP);
        put_u32(&mut a, 4, prog.len() as u32);
        put_u64(&mut a, 8, prog.as_ptr() as u64);
        put_u64(&mut a, 16, license.as_ptr() as u64);
        put_u32(&mut a, 24, 1); // log level
        put_u32(&mut a, 28, log.len() as u32);
        put_u64(&mut a, 32, log.as_mut_ptr() as u64);
        a[48..48 + 12].copy_from_slice(b"knitter_xsk\0");
        put_u32(&mut a, 68, BPF_XDP); // expected attach type
        let prog_fd = match bpf(BPF_PROG_LOAD, &a) {
            Ok(r) => fd(r),
            Err(e) => {
                let msg = String::from_utf8_lossy(&log);
                return Err(io::Error::other(format!("XDP program refused: {e}: {}", msg.trim_end_matches('\0'))));
            }
        };

        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, prog_fd.as_raw_fd() as u32);
        put_u32(&mut a, 4, ifindex);
        put_u32(&mut a, 8, BPF_XDP);
        put_u32(&mut a, 12, flags);
        let link = fd(bpf(BPF_LINK_CREATE, &a)?);
        Ok(XdpRedirect { map, _prog: prog_fd, _link: link })
    }

    /// Directs rx queue `queue` to the AF_XDP socket `xsk`.
    pub fn register(&self, queue: u32, xsk: RawFd) -> io::Result<()> {
        let (key, value) = (queue, xsk as u32);
        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, self.map.as_raw_fd() as u32);
        put_u64(&mut a, 8, &key as *const u32 as u64);
        put_u64(&mut a, 16, &value as *const u32 as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &a).map(drop)
    }
}
