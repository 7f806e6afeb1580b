//! Classic BPF programs as `tcpdump -ddd` prints them: the instruction count on the first
//! line, then `code jt jf k` in decimal per instruction. knitterctl compiles a capture
//! filter with the host's tcpdump and sends the instructions in the node API's
//! `BpfInstruction`s; the daemon checks them before they run (`vswitch::bpf`).

use crate::node::BpfInstruction;

/// Why `tcpdump -ddd` output was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DddError {
    #[error("expected the instruction count on the first line")]
    NoCount,
    #[error("not an instruction: {0:?}")]
    NotAnInstruction(String),
    #[error("{announced} instructions announced, {given} given")]
    Count { announced: usize, given: usize },
}

/// Reads `tcpdump -ddd` output; every field is in its classic BPF range (a 16-bit code,
/// 8-bit jumps, a 32-bit constant).
pub fn parse_ddd(text: &str) -> Result<Vec<BpfInstruction>, DddError> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let announced: usize = lines.next().and_then(|l| l.parse().ok()).ok_or(DddError::NoCount)?;
    let insns = lines
        .map(|l| {
            let fields: Result<Vec<u64>, _> = l.split_whitespace().map(str::parse::<u64>).collect();
            match fields.as_deref() {
                Ok(&[code, jt, jf, k])
                    if code <= u16::MAX as u64
                        && jt <= 255
                        && jf <= 255
                        && k <= u32::MAX as u64 =>
                {
                    Ok(BpfInstruction {
                        code: code as u32,
                        jt: jt as u32,
                        jf: jf as u32,
                        k: k as u32,
                    })
                }
                _ => Err(DddError::NotAnInstruction(l.to_string())),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if insns.len() != announced {
        return Err(DddError::Count { announced, given: insns.len() });
    }
    Ok(insns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcpdumps_output_is_read_and_anything_else_refused() {
        let p = parse_ddd("2\n40 0 0 12\n6 0 0 262144\n").unwrap();
        assert_eq!(p[0], BpfInstruction { code: 40, jt: 0, jf: 0, k: 12 });
        assert_eq!(parse_ddd("2\n6 0 0 1\n"), Err(DddError::Count { announced: 2, given: 1 }));
        assert!(matches!(parse_ddd("1\n6 0 0 1 9\n"), Err(DddError::NotAnInstruction(_))));
        assert!(
            matches!(parse_ddd("1\n6 0 256 1\n"), Err(DddError::NotAnInstruction(_))),
            "a jump past 255"
        );
        assert!(
            matches!(parse_ddd("1\n65536 0 0 1\n"), Err(DddError::NotAnInstruction(_))),
            "a code past 16 bits"
        );
        assert_eq!(parse_ddd(""), Err(DddError::NoCount));
    }
}
