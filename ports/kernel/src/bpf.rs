//! The little of `bpf(2)` the AF_XDP port needs, without a C toolchain: an XSKMAP, a counter
//! of the frames a program drops, Knitter's XDP programs (assembled here) and their
//! attachment through a BPF link, which the kernel removes when the link's descriptor is
//! closed.
//!
//! Two programs. [`XdpRedirect::attach`] redirects every frame of an rx queue to the AF_XDP
//! socket registered for that queue and passes frames of queues without a socket to the
//! kernel (pod veths). [`XdpRedirect::attach_underlay`] takes only what the VTEP owns (VXLAN
//! to its address, ARP/ND asking for it, ICMP to it; in the underlay's VLAN when it has
//! one) and passes everything else, so the node keeps its own traffic on a shared
//! interface. Attached natively where the kernel and the device's driver have the rx VLAN
//! hint, either is bound to its device and first writes back an 802.1Q tag the driver holds out of band ([`restore_tag`]).
//! The first, without that:
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
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
/// `prog_flags`: the XDP program handles frames in several buffers.
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
/// `prog_flags`: bound to one device (`prog_ifindex`), which its metadata kfuncs need.
const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const BPF_FUNC_XDP_ADJUST_HEAD: i32 = 44;
/// The rx VLAN metadata hint (Linux ≥ 6.8): the outer tag a driver took out of the frame.
const VLAN_TAG_KFUNC: &str = "bpf_xdp_metadata_rx_vlan_tag";
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

/// A tiny assembler: instructions with symbolic jump targets resolved at the end.
struct Asm {
    insns: Vec<Insn>,
    fixups: Vec<(usize, &'static str)>,
    labels: Vec<(&'static str, usize)>,
}

impl Asm {
    fn new() -> Asm {
        Asm { insns: Vec::new(), fixups: Vec::new(), labels: Vec::new() }
    }
    fn op(&mut self, i: Insn) -> &mut Self {
        self.insns.push(i);
        self
    }
    fn jump(&mut self, i: Insn, to: &'static str) -> &mut Self {
        self.fixups.push((self.insns.len(), to));
        self.insns.push(i);
        self
    }
    fn label(&mut self, name: &'static str) -> &mut Self {
        self.labels.push((name, self.insns.len()));
        self
    }
    fn finish(mut self) -> Vec<Insn> {
        for (at, to) in &self.fixups {
            let target =
                self.labels.iter().find(|(n, _)| n == to).map(|(_, p)| *p).expect("label defined");
            self.insns[*at].off = (target as isize - *at as isize - 1) as i16;
        }
        self.insns
    }
}

// Opcodes (linux/bpf.h): loads, 64-bit moves/adds, 32-bit conditional jumps, call, exit.
const LDXW: u8 = 0x61;
const LDXH: u8 = 0x69;
const LDXB: u8 = 0x71;
const STXW: u8 = 0x63;
const STXH: u8 = 0x6b;
const STW: u8 = 0x62;
/// `lock *(u64 *)(dst + off) += src` (BPF_STX | BPF_DW | BPF_ATOMIC, imm BPF_ADD).
const ATOMIC_ADD64: u8 = 0xdb;
const BE: u8 = 0xdc;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const AND32_K: u8 = 0x54;
const JGT_X: u8 = 0x2d;
const JA: u8 = 0x05;
const JEQ32_K: u8 = 0x16;
const JEQ_K: u8 = 0x15;
const JNE32_K: u8 = 0x56;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const PSEUDO_MAP_FD: u8 = 1;
const PSEUDO_KFUNC_CALL: u8 = 2;

/// Appends "redirect to the queue's socket, or pass" (r6 holds the context).
fn redirect_tail(a: &mut Asm, map: RawFd) {
    a.op(insn(LDXW, 2, 6, 16, 0)) // r2 = ctx->rx_queue_index
        .op(insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map))
        .op(insn(0, 0, 0, 0, 0))
        .op(insn(MOV64_K, 3, 0, 0, XDP_PASS))
        .op(insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP))
        .op(insn(EXIT, 0, 0, 0, 0));
}

/// The program: with `vlan_hint` (the BTF id of the rx VLAN hint), first the tag
/// restore ([`restore_tag`]); then the underlay filter for `f` (or nothing: every frame);
/// then the redirect to the queue's socket.
fn assemble(
    map: RawFd,
    f: Option<&UnderlayFilter>,
    vlan_hint: Option<u32>,
    drops: RawFd,
) -> Vec<Insn> {
    let mut a = Asm::new();
    if let Some(id) = vlan_hint {
        restore_tag(&mut a, id);
    }
    match f {
        None => {
            a.op(insn(MOV64_X, 6, 1, 0, 0));
        }
        Some(f) => underlay_head(&mut a, f),
    }
    redirect_tail(&mut a, map);
    if vlan_hint.is_some() {
        a.label("tag_drop");
        drop_counted(&mut a, drops);
    }
    a.finish()
}

/// Appends "count the frame in `drops` (an array of one u64), then drop it":
///
/// ```text
/// *(u32 *)(fp - 8) = 0
/// r0 = bpf_map_lookup_elem(drops, fp - 8)
/// if r0 != 0: lock *(u64 *)r0 += 1
/// return XDP_DROP
/// ```
fn drop_counted(a: &mut Asm, drops: RawFd) {
    a.op(insn(STW, 10, 0, -8, 0))
        .op(insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, drops))
        .op(insn(0, 0, 0, 0, 0))
        .op(insn(MOV64_X, 2, 10, 0, 0))
        .op(insn(ADD64_K, 2, 0, 0, -8))
        .op(insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM))
        .jump(insn(JEQ_K, 0, 0, 0, 0), "counted")
        .op(insn(MOV64_K, 1, 0, 0, 1))
        .op(insn(ATOMIC_ADD64, 0, 1, 0, 0))
        .label("counted")
        .op(insn(MOV64_K, 0, 0, 0, XDP_DROP))
        .op(insn(EXIT, 0, 0, 0, 0));
}

/// Puts back an 802.1Q tag the driver holds out of band (`kfunc`: the BTF id of the rx
/// VLAN hint), so that what follows reads it from the frame. A veth hands its peer's tag
/// over that way when the sender had tx VLAN offload on, a NIC when it strips tags; read
/// from the bytes alone, the frame would look untagged. Jumps to "tag_drop" when there is no
/// headroom for the tag (veth has 256 bytes); ends with r1 = r6 = ctx.
///
/// ```text
/// *(u32 *)(fp - 4) = 0                       ; proto at fp-4, TCI at fp-2
/// r0 = bpf_xdp_metadata_rx_vlan_tag(ctx, fp - 4, fp - 2)
/// if r0 != 0 goto done                        ; no tag out of band (or no hint here)
/// if bpf_xdp_adjust_head(ctx, -4) != 0 goto tag_drop
/// move both MACs 4 bytes forward; write TPID (as given) and TCI (to network order)
/// ```
fn restore_tag(a: &mut Asm, kfunc: u32) {
    a.op(insn(MOV64_X, 6, 1, 0, 0))
        .op(insn(STW, 10, 0, -4, 0))
        .op(insn(MOV64_X, 2, 10, 0, 0))
        .op(insn(ADD64_K, 2, 0, 0, -4))
        .op(insn(MOV64_X, 3, 10, 0, 0))
        .op(insn(ADD64_K, 3, 0, 0, -2))
        .op(insn(CALL, 0, PSEUDO_KFUNC_CALL, 0, kfunc as i32))
        .jump(insn(JNE32_K, 0, 0, 0, 0), "tag_done")
        .op(insn(MOV64_X, 1, 6, 0, 0))
        .op(insn(MOV64_K, 2, 0, 0, -4))
        .op(insn(CALL, 0, 0, 0, BPF_FUNC_XDP_ADJUST_HEAD))
        .jump(insn(JNE32_K, 0, 0, 0, 0), "tag_drop")
        .op(insn(LDXW, 2, 6, 0, 0)) // r2 = data
        .op(insn(LDXW, 3, 6, 4, 0)) // r3 = data_end
        .op(insn(MOV64_X, 4, 2, 0, 0))
        .op(insn(ADD64_K, 4, 0, 0, 18))
        .jump(insn(JGT_X, 4, 3, 0, 0), "tag_drop");
    for at in [0, 4, 8] {
        a.op(insn(LDXW, 5, 2, at + 4, 0)).op(insn(STXW, 2, 5, at, 0));
    }
    a.op(insn(LDXH, 5, 10, -4, 0))
        .op(insn(STXH, 2, 5, 12, 0))
        .op(insn(LDXH, 5, 10, -2, 0))
        .op(insn(BE, 5, 0, 0, 16))
        .op(insn(STXH, 2, 5, 14, 0))
        .label("tag_done")
        .op(insn(MOV64_X, 1, 6, 0, 0));
}

/// The BTF id of the rx VLAN hint in the running kernel, looked up once.
fn vlan_tag_kfunc() -> io::Result<u32> {
    static ID: std::sync::OnceLock<Result<u32, String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| crate::btf::kernel_func_id(VLAN_TAG_KFUNC).map_err(|e| e.to_string()))
        .clone()
        .map_err(io::Error::other)
}

/// The underlay filter's checks; frames it passes jump to "pass", the rest fall through to
/// the redirect (r6 holds the context).
fn underlay_head(a: &mut Asm, f: &UnderlayFilter) {
    let (arp, icmp, nd) =
        if f.shared { ("pass", "pass", "pass") } else { ("arp", "redirect", "nd") };
    // Loads are in host byte order: compare against the wire bytes read the same way.
    let be = |t: u16| u16::from_ne_bytes(t.to_be_bytes()) as i32;
    let port = be(f.udp_port);
    // Offsets below are from the network header: after the tag when there is one.
    let l2: i16 = if f.vlan.is_some() { 18 } else { 14 };
    a.op(insn(MOV64_X, 6, 1, 0, 0)) // r6 = ctx
        .op(insn(LDXW, 2, 6, 0, 0)) // r2 = data
        .op(insn(LDXW, 3, 6, 4, 0)) // r3 = data_end
        .op(insn(MOV64_X, 4, 2, 0, 0));
    let tag_check = |a: &mut Asm| {
        if let Some(vid) = f.vlan {
            a.op(insn(LDXH, 5, 2, 12, 0)) // TPID
                .jump(insn(JNE32_K, 5, 0, 0, be(0x8100)), "pass")
                .op(insn(LDXH, 5, 2, 14, 0)) // TCI: the VLAN ID, priority and DEI masked off
                .op(insn(AND32_K, 5, 0, 0, be(0x0fff)))
                .jump(insn(JNE32_K, 5, 0, 0, be(vid & 0x0fff)), "pass");
        }
    };
    match f.vtep {
        std::net::IpAddr::V4(ip) => {
            let ip = i32::from_ne_bytes(ip.octets());
            a.op(insn(ADD64_K, 4, 0, 0, (l2 + 28) as i32)) // IPv4 + UDP, or ARP
                .jump(insn(JGT_X, 4, 3, 0, 0), "pass");
            tag_check(a);
            a.op(insn(LDXH, 5, 2, l2 - 2, 0)) // EtherType
                .jump(insn(JEQ32_K, 5, 0, 0, be(0x0806)), arp)
                .jump(insn(JNE32_K, 5, 0, 0, be(0x0800)), "pass")
                .op(insn(LDXB, 5, 2, l2, 0)) // version and IHL
                .jump(insn(JNE32_K, 5, 0, 0, 0x45), "pass")
                .op(insn(LDXW, 5, 2, l2 + 16, 0)) // destination address
                .jump(insn(JNE32_K, 5, 0, 0, ip), "pass")
                .op(insn(LDXB, 5, 2, l2 + 9, 0)) // protocol: ICMP to the VTEP is ours
                .jump(insn(JEQ32_K, 5, 0, 0, 1), icmp)
                .jump(insn(JNE32_K, 5, 0, 0, 17), "pass")
                .op(insn(LDXH, 5, 2, l2 + 22, 0)) // UDP destination port
                .jump(insn(JNE32_K, 5, 0, 0, port), "pass")
                .jump(insn(JA, 0, 0, 0, 0), "redirect");
            // (The verifier refuses unreachable code: the ARP block only when used.)
            if !f.shared {
                a.label("arp")
                    .op(insn(LDXW, 5, 2, l2 + 24, 0)) // target protocol address
                    .jump(insn(JNE32_K, 5, 0, 0, ip), "pass")
                    .jump(insn(JA, 0, 0, 0, 0), "redirect");
            }
        }
        std::net::IpAddr::V6(ip) => {
            let o = ip.octets();
            let words: Vec<i32> =
                o.chunks(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
            // IPv6 + the larger of UDP (8) and a solicitation up to its target (24).
            a.op(insn(ADD64_K, 4, 0, 0, (l2 + 40 + 24) as i32))
                .jump(insn(JGT_X, 4, 3, 0, 0), "pass");
            tag_check(a);
            a.op(insn(LDXH, 5, 2, l2 - 2, 0))
                .jump(insn(JNE32_K, 5, 0, 0, be(0x86dd)), "pass")
                .op(insn(LDXB, 5, 2, l2 + 6, 0)) // next header
                .jump(insn(JEQ32_K, 5, 0, 0, 58), nd)
                .jump(insn(JNE32_K, 5, 0, 0, 17), "pass");
            let address_is_vtep = |a: &mut Asm, at: i16| {
                for (k, w) in words.iter().enumerate() {
                    a.op(insn(LDXW, 5, 2, at + 4 * k as i16, 0))
                        .jump(insn(JNE32_K, 5, 0, 0, *w), "pass");
                }
            };
            address_is_vtep(a, l2 + 24); // destination address
            a.op(insn(LDXH, 5, 2, l2 + 42, 0)) // UDP destination port
                .jump(insn(JNE32_K, 5, 0, 0, port), "pass")
                .jump(insn(JA, 0, 0, 0, 0), "redirect");
            if !f.shared {
                a.label("nd")
                    .op(insn(LDXB, 5, 2, l2 + 40, 0)) // ICMPv6 type
                    .jump(insn(JEQ32_K, 5, 0, 0, 136), "na")
                    .jump(insn(JNE32_K, 5, 0, 0, 135), "pass");
                address_is_vtep(a, l2 + 48); // solicited target
                a.jump(insn(JA, 0, 0, 0, 0), "redirect").label("na");
                // Advertisements sent to the VTEP's address: answers to its solicitations.
                address_is_vtep(a, l2 + 24);
                a.jump(insn(JA, 0, 0, 0, 0), "redirect");
            }
        }
    }
    a.label("pass")
        .op(insn(MOV64_K, 0, 0, 0, XDP_PASS))
        .op(insn(EXIT, 0, 0, 0, 0))
        .label("redirect");
}

/// Loads an XDP program, frags-aware where the kernel knows the flag (Linux ≥ 5.18: it
/// then runs on frames in several buffers, so multi-buffer AF_XDP and jumbo MTUs on veth
/// work; the programs read only the first buffer's headers, which the kernel guarantees
/// are in it); the verifier's log is the error when it refuses.
fn load_program(prog: &[Insn]) -> io::Result<OwnedFd> {
    load_program_with(prog, BPF_F_XDP_HAS_FRAGS, 0).or_else(|_| load_program_with(prog, 0, 0))
}

/// [`load_program`] for a program bound to device `ifindex` (it may call the device's
/// metadata kfuncs; it attaches to that device only, natively).
fn load_bound_program(prog: &[Insn], ifindex: u32) -> io::Result<OwnedFd> {
    let bound = BPF_F_XDP_DEV_BOUND_ONLY;
    load_program_with(prog, bound | BPF_F_XDP_HAS_FRAGS, ifindex)
        .or_else(|_| load_program_with(prog, bound, ifindex))
}

fn load_program_with(prog: &[Insn], flags: u32, ifindex: u32) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 16384];
    let mut a: Attr = [0; 128];
    put_u32(&mut a, 0, BPF_PROG_TYPE_XDP);
    put_u32(&mut a, 4, prog.len() as u32);
    put_u64(&mut a, 8, prog.as_ptr() as u64);
    put_u64(&mut a, 16, license.as_ptr() as u64);
    put_u32(&mut a, 24, 1); // log level
    put_u32(&mut a, 28, log.len() as u32);
    put_u64(&mut a, 32, log.as_mut_ptr() as u64);
    put_u32(&mut a, 44, flags); // prog_flags
    a[48..48 + 12].copy_from_slice(b"knitter_xsk\0");
    put_u32(&mut a, 64, ifindex); // prog_ifindex (with DEV_BOUND_ONLY: bound, not offloaded)
    put_u32(&mut a, 68, BPF_XDP); // expected attach type
    match bpf(BPF_PROG_LOAD, &a) {
        Ok(r) => Ok(fd(r)),
        Err(e) => {
            let msg = String::from_utf8_lossy(&log);
            Err(io::Error::other(format!(
                "XDP program refused: {e}: {}",
                msg.trim_end_matches('\0')
            )))
        }
    }
}

/// Loads the program for `f` (`None`: every frame) to attach to `ifindex` in mode `flags`:
/// natively, bound to the device with the tag restore where the kernel and the device's
/// driver have the rx VLAN hint; otherwise without it, and why.
fn program(
    map: RawFd,
    ifindex: u32,
    flags: u32,
    f: Option<&UnderlayFilter>,
    drops: RawFd,
) -> io::Result<(OwnedFd, Option<String>)> {
    if flags & XDP_FLAGS_DRV_MODE == 0 {
        return Ok((
            load_program(&assemble(map, f, None, drops))?,
            Some("generic XDP has no metadata hints".into()),
        ));
    }
    let restoring = vlan_tag_kfunc().and_then(|id| {
        let hints = plumbing::netdev::xdp_rx_metadata(ifindex)
            .map_err(|e| io::Error::other(format!("the driver's hints unknown: {e}")))?;
        if hints & plumbing::netdev::RX_METADATA_VLAN_TAG == 0 {
            return Err(io::Error::other("the device's driver has none"));
        }
        load_bound_program(&assemble(map, f, Some(id), drops), ifindex)
    });
    match restoring {
        Ok(prog) => Ok((prog, None)),
        Err(e) => Ok((
            load_program(&assemble(map, f, None, drops))?,
            Some(format!("no rx VLAN hint: {e}")),
        )),
    }
}

/// An XSKMAP for `max_queues` queues (key: queue index, value: socket).
fn xskmap(max_queues: u32) -> io::Result<OwnedFd> {
    let mut a: Attr = [0; 128];
    put_u32(&mut a, 0, BPF_MAP_TYPE_XSKMAP);
    put_u32(&mut a, 4, 4);
    put_u32(&mut a, 8, 4);
    put_u32(&mut a, 12, max_queues.max(1));
    Ok(fd(bpf(BPF_MAP_CREATE, &a)?))
}

/// An array of one u64: frames a program dropped (a tag it could not put back).
fn drop_counter() -> io::Result<OwnedFd> {
    let mut a: Attr = [0; 128];
    put_u32(&mut a, 0, BPF_MAP_TYPE_ARRAY);
    put_u32(&mut a, 4, 4);
    put_u32(&mut a, 8, 8);
    put_u32(&mut a, 12, 1);
    Ok(fd(bpf(BPF_MAP_CREATE, &a)?))
}

/// The count in a [`drop_counter`].
fn read_counter(map: &OwnedFd) -> io::Result<u64> {
    let (key, mut value) = (0u32, 0u64);
    let mut a: Attr = [0; 128];
    put_u32(&mut a, 0, map.as_raw_fd() as u32);
    put_u64(&mut a, 8, &key as *const u32 as u64);
    put_u64(&mut a, 16, &mut value as *mut u64 as u64);
    bpf(BPF_MAP_LOOKUP_ELEM, &a)?;
    Ok(value)
}

/// Attaches `prog` to `ifindex` in mode `flags` through a BPF link (gone when it closes).
fn link(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut a: Attr = [0; 128];
    put_u32(&mut a, 0, prog.as_raw_fd() as u32);
    put_u32(&mut a, 4, ifindex);
    put_u32(&mut a, 8, BPF_XDP);
    put_u32(&mut a, 12, flags);
    Ok(fd(bpf(BPF_LINK_CREATE, &a)?))
}

/// What an underlay port's XDP program takes from its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnderlayFilter {
    /// The VTEP's address (IPv4 or IPv6).
    pub vtep: std::net::IpAddr,
    /// The VXLAN UDP destination port.
    pub udp_port: u16,
    /// The underlay's 802.1Q VLAN, when VXLAN travels tagged (`VtepConfig::underlay_vlan`).
    pub vlan: Option<u16>,
    /// The node's kernel owns the VTEP address: ARP, ND and ICMP for it stay with the kernel.
    pub shared: bool,
}

/// An XDP program with its XSKMAP, attached to one interface while this value lives.
///
/// Attached natively where the kernel and the device's driver have the rx VLAN hint, each
/// program is bound to its device and first puts back an 802.1Q tag the driver holds out of band ([`restore_tag`]); see
/// [`XdpRedirect::restores_vlan_tags`].
pub struct XdpRedirect {
    map: OwnedFd,
    /// Frames the program dropped ([`XdpRedirect::dropped`]); kept across [`XdpRedirect::set_filter`].
    drops: OwnedFd,
    _prog: OwnedFd,
    link: OwnedFd,
    ifindex: u32,
    flags: u32,
    /// The network namespace `ifindex` belongs to (a bound program names its device by it).
    netns: std::fs::File,
    /// Why the program cannot put back 802.1Q tags the driver holds out of band, if it can't.
    tags_hidden: Option<String>,
}

impl XdpRedirect {
    /// Loads the redirect-everything program and attaches it to `ifindex` with `flags`.
    pub fn attach(ifindex: u32, flags: u32, max_queues: u32) -> io::Result<XdpRedirect> {
        Self::load(ifindex, flags, max_queues, None)
    }

    /// Whether frames whose outer 802.1Q tag the driver holds out of band (a veth peer
    /// sending with tx VLAN offload on; a NIC stripping tags) reach the program, and so the
    /// socket, tagged; the reason when they would look untagged.
    pub fn restores_vlan_tags(&self) -> Result<(), &str> {
        self.tags_hidden.as_deref().map_or(Ok(()), Err)
    }

    /// Loads the underlay filter (see [`UnderlayFilter`]): VXLAN (UDP to the VTEP's port;
    /// IPv4 without options or IPv6 without extension headers), ARP targeting the VTEP
    /// (requests for it and replies to it), neighbor solicitations for it and advertisements
    /// sent to it, and ICMP to an IPv4 VTEP go to the socket; everything else to the kernel.
    /// With `shared` only VXLAN is taken: ARP, ND and ICMP for the address stay with the
    /// kernel. With `vlan`, only frames carrying that 802.1Q tag are considered.
    pub fn attach_underlay(
        ifindex: u32,
        flags: u32,
        max_queues: u32,
        f: &UnderlayFilter,
    ) -> io::Result<XdpRedirect> {
        Self::load(ifindex, flags, max_queues, Some(f))
    }

    /// Replaces the attached program (the sockets and their map stay): the underlay filter
    /// for `f`, or redirect-everything. The kernel swaps it atomically: no frame goes
    /// through neither.
    pub fn set_filter(&mut self, f: Option<&UnderlayFilter>) -> io::Result<()> {
        let (map, ifindex, flags, f, drops) =
            (self.map.as_raw_fd(), self.ifindex, self.flags, f.copied(), self.drops.as_raw_fd());
        // Loaded in the device's namespace: the caller may be elsewhere (the daemon's control
        // thread, for a device in a pod's or a node's namespace).
        let netns = format!("/proc/self/fd/{}", self.netns.as_raw_fd());
        let (prog, tags_hidden) = plumbing::link::in_netns(&netns, move || {
            program(map, ifindex, flags, f.as_ref(), drops)
        })?;
        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, self.link.as_raw_fd() as u32);
        put_u32(&mut a, 4, prog.as_raw_fd() as u32);
        bpf(BPF_LINK_UPDATE, &a)?;
        self._prog = prog;
        self.tags_hidden = tags_hidden;
        Ok(())
    }

    /// Creates the XSKMAP, loads the program for `f` and attaches it.
    fn load(
        ifindex: u32,
        flags: u32,
        max_queues: u32,
        f: Option<&UnderlayFilter>,
    ) -> io::Result<XdpRedirect> {
        let (map, drops) = (xskmap(max_queues)?, drop_counter()?);
        let (prog, tags_hidden) = program(map.as_raw_fd(), ifindex, flags, f, drops.as_raw_fd())?;
        let link = link(&prog, ifindex, flags)?;
        let netns = std::fs::File::open("/proc/thread-self/ns/net")?;
        Ok(XdpRedirect { map, drops, _prog: prog, link, ifindex, flags, netns, tags_hidden })
    }

    /// Frames the program dropped: frames whose out-of-band 802.1Q tag it could not put
    /// back (no headroom, or shorter than an Ethernet header). 0 when the counter cannot
    /// be read.
    pub fn dropped(&self) -> u64 {
        read_counter(&self.drops).unwrap_or(0)
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

    /// Takes queue `queue`'s socket out of the XSKMAP: nothing more is redirected to it.
    pub fn unregister(&self, queue: u32) -> io::Result<()> {
        let key = queue;
        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, self.map.as_raw_fd() as u32);
        put_u64(&mut a, 8, &key as *const u32 as u64);
        bpf(BPF_MAP_DELETE_ELEM, &a).map(drop)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const BPF_PROG_TEST_RUN: libc::c_long = 10;

    /// Runs `prog` once on `frame` (BPF_PROG_TEST_RUN); its return value.
    fn run(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
        let mut out = vec![0u8; frame.len() + 256];
        let mut a: Attr = [0; 128];
        put_u32(&mut a, 0, prog.as_raw_fd() as u32);
        put_u32(&mut a, 8, frame.len() as u32);
        put_u32(&mut a, 12, out.len() as u32);
        put_u64(&mut a, 16, frame.as_ptr() as u64);
        put_u64(&mut a, 24, out.as_mut_ptr() as u64);
        put_u32(&mut a, 32, 1);
        // SAFETY: as in `bpf`, and the kernel writes the result back into `a`, which is
        // mutable here; `frame` and `out` outlive the call.
        let r = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, a.as_mut_ptr(), a.len() as u32)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u32::from_ne_bytes([a[4], a[5], a[6], a[7]]))
    }

    /// The tail the tag restore jumps to when it cannot put a tag back: the frame is
    /// dropped and counted, and the count reads back.
    #[test]
    fn dropped_frames_are_counted() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !vswitch::testkit::peer_available(root, "root (for bpf(2))", "running the tests as root")
        {
            return;
        }
        let drops = drop_counter().expect("an array map");
        let mut a = Asm::new();
        drop_counted(&mut a, drops.as_raw_fd());
        let prog = load_program(&a.finish()).expect("the verifier takes the counting tail");
        assert_eq!(read_counter(&drops).unwrap(), 0);
        for n in 1..=3 {
            assert_eq!(run(&prog, &[0u8; 64]).unwrap(), XDP_DROP as u32);
            assert_eq!(read_counter(&drops).unwrap(), n);
        }
    }
}
