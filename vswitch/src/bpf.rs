//! Classic BPF (the filters `tcpdump -ddd` compiles): a checker that refuses what the
//! kernel's `sk_chk_filter` refuses, and an interpreter for the programs it accepted.
//!
//! A packet capture's filter ([`crate::capture`]) comes from the operator's tool as
//! instructions; they are checked once, when the capture starts, so that running one cannot
//! fail: every jump lands inside the program and only forward (a program ends in at most
//! as many steps as it has instructions), every scratch-memory index is below 16, no
//! division by a constant zero, the last instruction returns. A load beyond the frame
//! returns 0 (no match), as in the kernel. Safe code only: bounds are checked by slices.

use thiserror::Error;

/// The most instructions a program may have (the kernel's `BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;
/// Scratch memory words (`BPF_MEMWORDS`).
const MEMWORDS: usize = 16;

/// One instruction, as `struct sock_filter` and `tcpdump -ddd` print it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BpfError {
    #[error("a filter has 1 to {MAX_INSNS} instructions, this one {0}")]
    Length(usize),
    #[error("instruction {at}: unknown opcode {code:#06x}")]
    Opcode { at: usize, code: u16 },
    #[error("instruction {at}: jumps past the end of the program")]
    Jump { at: usize },
    #[error("instruction {at}: scratch memory index {k} (0-15)")]
    Memory { at: usize, k: u32 },
    #[error("instruction {at}: divides by a constant zero")]
    DivideByZero { at: usize },
    #[error("the last instruction does not return")]
    NoReturn,
}

// Instruction classes, sizes, modes, operations and sources (linux/bpf_common.h).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ST: u16 = 0x02;
const STX: u16 = 0x03;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const MEM: u16 = 0x60;
const LEN: u16 = 0x80;
const MSH: u16 = 0xa0;
const K: u16 = 0x00;
const X: u16 = 0x08;
const RET_A: u16 = 0x10;
const TAX: u16 = 0x00;
const TXA: u16 = 0x80;
const ALU_OPS: [u16; 11] = [0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0];
const NEG: u16 = 0x80;
const DIV: u16 = 0x30;
const MOD: u16 = 0x90;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;

/// A checked program: [`Program::run`] cannot fail or loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program(Vec<Insn>);

impl Program {
    /// Checks `insns` the way the kernel does before attaching a socket filter.
    pub fn new(insns: Vec<Insn>) -> Result<Program, BpfError> {
        if insns.is_empty() || insns.len() > MAX_INSNS {
            return Err(BpfError::Length(insns.len()));
        }
        let n = insns.len();
        for (at, i) in insns.iter().enumerate() {
            let (class, code) = (i.code & 0x07, i.code);
            let known = match class {
                LD => {
                    matches!(code & !0x07, c if [W | ABS, H | ABS, B | ABS, W | IND, H | IND, B | IND, W | MEM, W | LEN, W | IMM].contains(&c))
                }
                LDX => {
                    matches!(code & !0x07, c if [W | IMM, W | MEM, W | LEN, B | MSH].contains(&c))
                }
                ST | STX => code & !0x07 == 0,
                ALU => {
                    ALU_OPS.contains(&(code & 0xf0))
                        && code & !0xff == 0
                        && (code & 0xf0 != NEG || code & X == 0)
                }
                JMP => {
                    [JA, JEQ, JGT, JGE, JSET].contains(&(code & 0xf0))
                        && code & !0xff == 0
                        && (code & 0xf0 != JA || code & X == 0)
                }
                RET => [K, X, RET_A].contains(&(code & 0x18)) && code & !0x1f == 0,
                MISC => code == MISC | TAX || code == MISC | TXA,
                _ => false,
            };
            if !known {
                return Err(BpfError::Opcode { at, code });
            }
            let memory =
                matches!(class, ST | STX) || (class == LD || class == LDX) && code & 0xe0 == MEM;
            if memory && i.k as usize >= MEMWORDS {
                return Err(BpfError::Memory { at, k: i.k });
            }
            if class == ALU && matches!(code & 0xf0, DIV | MOD) && code & X == 0 && i.k == 0 {
                return Err(BpfError::DivideByZero { at });
            }
            if class == JMP {
                let targets: [u64; 2] =
                    if code & 0xf0 == JA { [i.k as u64; 2] } else { [i.jt as u64, i.jf as u64] };
                if targets.iter().any(|&t| at as u64 + 1 + t >= n as u64) {
                    return Err(BpfError::Jump { at });
                }
            }
        }
        if insns[n - 1].code & 0x07 != RET {
            return Err(BpfError::NoReturn);
        }
        Ok(Program(insns))
    }

    /// Runs the program over `frame` (the bytes at hand; `wire_len` the frame's whole
    /// length, what `len` loads): the value it returns, 0 meaning "not this frame".
    pub fn run(&self, frame: &[u8], wire_len: u32) -> u32 {
        let (mut a, mut x) = (0u32, 0u32);
        let mut mem = [0u32; MEMWORDS];
        let mut pc = 0usize;
        // Every jump is forward and lands in the program (checked in `new`): at most one
        // pass over it.
        while let Some(i) = self.0.get(pc) {
            pc += 1;
            let src = |x: u32| if i.code & X != 0 { x } else { i.k };
            match i.code & 0x07 {
                LD => {
                    a = match i.code & 0xe0 {
                        IMM => i.k,
                        LEN => wire_len,
                        MEM => mem[i.k as usize % MEMWORDS],
                        mode => {
                            let at = if mode == IND { x.wrapping_add(i.k) } else { i.k };
                            match load(frame, at, i.code & 0x18) {
                                Some(v) => v,
                                None => return 0,
                            }
                        }
                    }
                }
                LDX => {
                    x = match i.code & 0xe0 {
                        IMM => i.k,
                        LEN => wire_len,
                        MEM => mem[i.k as usize % MEMWORDS],
                        _ => match frame.get(i.k as usize) {
                            Some(&b) => 4 * (b & 0x0f) as u32,
                            None => return 0,
                        },
                    }
                }
                ST => mem[i.k as usize % MEMWORDS] = a,
                STX => mem[i.k as usize % MEMWORDS] = x,
                ALU => {
                    let s = src(x);
                    a = match i.code & 0xf0 {
                        0x00 => a.wrapping_add(s),
                        0x10 => a.wrapping_sub(s),
                        0x20 => a.wrapping_mul(s),
                        DIV => match a.checked_div(s) {
                            Some(v) => v,
                            None => return 0,
                        },
                        MOD => match a.checked_rem(s) {
                            Some(v) => v,
                            None => return 0,
                        },
                        0x40 => a | s,
                        0x50 => a & s,
                        0x60 => a.checked_shl(s).unwrap_or(0),
                        0x70 => a.checked_shr(s).unwrap_or(0),
                        NEG => a.wrapping_neg(),
                        _ => a ^ s,
                    }
                }
                JMP => {
                    let s = src(x);
                    let skip = match i.code & 0xf0 {
                        JA => i.k as usize,
                        op => {
                            let taken = match op {
                                JEQ => a == s,
                                JGT => a > s,
                                JGE => a >= s,
                                _ => a & s != 0,
                            };
                            if taken { i.jt as usize } else { i.jf as usize }
                        }
                    };
                    pc += skip;
                }
                RET => {
                    return match i.code & 0x18 {
                        RET_A => a,
                        X => x,
                        _ => i.k,
                    };
                }
                _ => {
                    if i.code & 0xf8 == TXA {
                        a = x
                    } else {
                        x = a
                    }
                }
            }
        }
        0
    }

    /// Whether the program takes `frame`.
    pub fn matches(&self, frame: &[u8], wire_len: u32) -> bool {
        self.run(frame, wire_len) != 0
    }

    pub fn insns(&self) -> &[Insn] {
        &self.0
    }
}

/// A big-endian load of 4, 2 or 1 bytes at `at`; `None` past the frame's end.
fn load(frame: &[u8], at: u32, size: u16) -> Option<u32> {
    let at = at as usize;
    Some(match size {
        W => u32::from_be_bytes(frame.get(at..at.checked_add(4)?)?.try_into().ok()?),
        H => u16::from_be_bytes(frame.get(at..at.checked_add(2)?)?.try_into().ok()?) as u32,
        _ => *frame.get(at)? as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn udp4(dport: u16, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f[23] = 17;
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn a_tcpdump_program_matches_what_tcpdump_would() {
        let p = Program::new(crate::testkit::UDP_53.to_vec()).unwrap();
        assert!(p.matches(&udp4(53, 0), 42));
        assert!(!p.matches(&udp4(54, 0), 42));
        assert!(!p.matches(&udp4(53, 1), 42), "a later fragment has no port");
        let mut tcp = udp4(53, 0);
        tcp[23] = 6;
        assert!(!p.matches(&tcp, 42));
        assert!(!p.matches(&udp4(53, 0)[..30], 42), "a load past the end is no match");
        assert_eq!(p.run(&udp4(53, 0), 42), 262_144);
    }

    #[test]
    fn what_the_kernel_refuses_is_refused() {
        let ret = Insn { code: RET | K, jt: 0, jf: 0, k: 1 };
        assert_eq!(Program::new(vec![]), Err(BpfError::Length(0)));
        assert_eq!(Program::new(vec![ret; MAX_INSNS + 1]), Err(BpfError::Length(MAX_INSNS + 1)));
        assert_eq!(
            Program::new(vec![Insn { code: JMP | JEQ, jt: 1, jf: 0, k: 0 }, ret]),
            Err(BpfError::Jump { at: 0 })
        );
        assert_eq!(
            Program::new(vec![Insn { code: JMP | JA, jt: 0, jf: 0, k: u32::MAX }, ret]),
            Err(BpfError::Jump { at: 0 })
        );
        assert_eq!(
            Program::new(vec![Insn { code: ST, jt: 0, jf: 0, k: 16 }, ret]),
            Err(BpfError::Memory { at: 0, k: 16 })
        );
        assert_eq!(
            Program::new(vec![Insn { code: ALU | DIV | K, jt: 0, jf: 0, k: 0 }, ret]),
            Err(BpfError::DivideByZero { at: 0 })
        );
        assert_eq!(
            Program::new(vec![Insn { code: 0xff, jt: 0, jf: 0, k: 0 }, ret]),
            Err(BpfError::Opcode { at: 0, code: 0xff })
        );
        assert_eq!(
            Program::new(vec![Insn { code: LD | W | IMM, jt: 0, jf: 0, k: 0 }]),
            Err(BpfError::NoReturn)
        );
    }

    #[test]
    fn division_by_a_zero_register_is_no_match() {
        let p = Program::new(vec![
            Insn { code: LD | W | IMM, jt: 0, jf: 0, k: 7 },
            Insn { code: ALU | DIV | X, jt: 0, jf: 0, k: 0 },
            Insn { code: RET | RET_A, jt: 0, jf: 0, k: 0 },
        ])
        .unwrap();
        assert_eq!(p.run(&[], 0), 0);
    }

    proptest! {
        /// Whatever the instructions, a program is either refused or runs to an answer over
        /// any frame, without a panic.
        #[test]
        fn any_program_is_refused_or_runs(insns in prop::collection::vec((any::<u16>(), 0u8..4, 0u8..4, prop_oneof![0u32..64, any::<u32>()]), 1..24), frame in prop::collection::vec(any::<u8>(), 0..80)) {
            // Opcodes drawn mostly from the known ones, so that many programs pass the check.
            let insns: Vec<Insn> = insns.into_iter().map(|(c, jt, jf, k)| Insn { code: if c % 4 == 0 { c } else { c & 0xff }, jt, jf, k }).collect();
            if let Ok(p) = Program::new(insns) {
                let _ = p.run(&frame, frame.len() as u32);
            }
        }
    }
}
