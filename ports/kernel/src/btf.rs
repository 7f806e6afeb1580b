//! The kernel's own type information (`/sys/kernel/btf/vmlinux`), read just far enough to
//! find a kernel function's BTF id: an eBPF program calls a kfunc (such as the XDP rx
//! metadata hints) by that id. Bounds are checked on every read: a truncated or foreign
//! file is an error, never a panic.

use std::io;

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// The BTF id of the kernel function `name` in the running kernel, or `NotFound`.
pub fn kernel_func_id(name: &str) -> io::Result<u32> {
    let data = std::fs::read("/sys/kernel/btf/vmlinux")?;
    func_id(&data, name)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("kernel BTF: {what}"))
}

/// The id of the `BTF_KIND_FUNC` called `name` in the BTF blob `data` (native byte order,
/// as the kernel exports it).
pub fn func_id(data: &[u8], name: &str) -> io::Result<u32> {
    let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let u32_at =
        |o: usize| data.get(o..o + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    if u16_at(0) != Some(MAGIC) {
        return Err(bad("not a BTF blob (or not in this machine's byte order)"));
    }
    let header =
        |i: usize| u32_at(4 + 4 * i).map(|v| v as usize).ok_or_else(|| bad("short header"));
    let (hdr_len, type_off, type_len, str_off, str_len) =
        (header(0)?, header(1)?, header(2)?, header(3)?, header(4)?);
    let types = data
        .get(hdr_len + type_off..hdr_len + type_off + type_len)
        .ok_or_else(|| bad("type section out of bounds"))?;
    let strings = data
        .get(hdr_len + str_off..hdr_len + str_off + str_len)
        .ok_or_else(|| bad("string section out of bounds"))?;
    let name_at =
        |off: usize| strings.get(off..).map(|s| s.split(|&c| c == 0).next().unwrap_or(&[]));
    let t32 = |o: usize| types.get(o..o + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    let (mut at, mut id) = (0usize, 1u32);
    while at < types.len() {
        let (name_off, info) = (
            t32(at).ok_or_else(|| bad("short type"))?,
            t32(at + 4).ok_or_else(|| bad("short type"))?,
        );
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        if kind == KIND_FUNC && name_at(name_off as usize) == Some(name.as_bytes()) {
            return Ok(id);
        }
        at += 12 + trailer_len(kind, vlen).ok_or_else(|| bad("unknown type kind"))?;
        id += 1;
    }
    Err(io::Error::new(io::ErrorKind::NotFound, format!("kernel BTF has no function {name}")))
}

/// Bytes following a type's 12-byte common part, by kind (linux/btf.h).
fn trailer_len(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
        3 => 12,                      // ARRAY
        4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
        2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with an INT, a FUNC_PROTO with one parameter and two FUNCs.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0f_one\0f_two\0".to_vec();
        let mut types = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, extra: &[u32]| {
            for w in [name, (kind << 24) | vlen, 0].iter().chain(extra) {
                types.extend_from_slice(&w.to_ne_bytes());
            }
        };
        ty(1, 1, 0, &[32]); // [1] int
        ty(0, 13, 1, &[0, 1]); // [2] proto (int)
        ty(5, 12, 0, &[]); // [3] f_one
        ty(11, 12, 0, &[]); // [4] f_two
        let mut d = Vec::new();
        d.extend_from_slice(&MAGIC.to_ne_bytes());
        d.extend_from_slice(&[1, 0]);
        for w in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            d.extend_from_slice(&w.to_ne_bytes());
        }
        d.extend_from_slice(&types);
        d.extend_from_slice(&strings);
        d
    }

    #[test]
    fn functions_are_found_by_name() {
        let d = blob();
        assert_eq!(func_id(&d, "f_one").unwrap(), 3);
        assert_eq!(func_id(&d, "f_two").unwrap(), 4);
        assert_eq!(
            func_id(&d, "int").unwrap_err().kind(),
            io::ErrorKind::NotFound,
            "an INT is not a function"
        );
    }

    #[test]
    fn truncated_blobs_are_errors() {
        let d = blob();
        for n in 0..d.len() {
            assert!(func_id(&d[..n], "f_two").is_err(), "cut at {n}");
        }
    }
}
