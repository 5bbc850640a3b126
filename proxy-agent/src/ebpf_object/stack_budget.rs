// SPDX-License-Identifier: Apache-2.0
//! The programs' combined stack stays within what every kernel we support accepts.
//!
//! A BPF program and the functions it calls share 512 bytes of stack: the verifier adds up
//! the frames along the deepest call chain, each rounded up to 32 bytes, and refuses the
//! program beyond that ("combined stack size of N calls is M. Too large"). Kernels from
//! about 6.8 on accepted programs that 6.1 refused (sock_connect6 at 544 bytes made ebpf
//! mode fall back on Debian 12), so the host kernel's verifier is no guard: this test adds
//! the frames up itself, from the object's instructions, for every program.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind, SymbolKind};

/// The verifier's limit (MAX_BPF_STACK).
const MAX_STACK: u64 = 512;

#[derive(Clone, Debug)]
struct Function {
    name: String,
    section: object::SectionIndex,
    start: u64,
    size: u64,
    is_program: bool,
}

/// Frames (deepest stack offset used) and callees of every function of the object.
struct CallGraph {
    functions: Vec<Function>,
    frames: Vec<u64>,
    calls: Vec<Vec<usize>>,
}

fn call_graph(elf: &[u8]) -> CallGraph {
    let file = object::File::parse(elf).expect("the embedded object parses as ELF");
    let mut functions: Vec<Function> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| {
            let section = s.section_index()?;
            let section_name = file
                .section_by_index(section)
                .ok()?
                .name()
                .ok()?
                .to_string();
            Some(Function {
                name: s.name().ok()?.to_string(),
                section,
                start: s.address(),
                size: s.size(),
                is_program: section_name != ".text",
            })
        })
        .collect();
    functions.sort_by_key(|f| (f.section.0, f.start));
    let at = |section: object::SectionIndex, address: u64| {
        functions
            .iter()
            .position(|f| f.section == section && f.start <= address && address < f.start + f.size)
    };
    let mut frames = vec![0u64; functions.len()];
    let mut calls = vec![Vec::new(); functions.len()];
    for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
        let data = section.data().expect("section data");
        let relocations: HashMap<u64, RelocationTarget> = section
            .relocations()
            .map(|(offset, r)| (offset, r.target()))
            .collect();
        for (index, function) in functions.iter().enumerate() {
            if function.section != section.index() {
                continue;
            }
            let mut offset = function.start;
            while offset + 8 <= function.start + function.size {
                let insn = &data[offset as usize..offset as usize + 8];
                let (code, dst, src) = (insn[0], insn[1] & 0xf, insn[1] >> 4);
                let off = i16::from_le_bytes([insn[2], insn[3]]);
                let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
                let class = code & 0x7;
                // ST/STX through r10, LDX from r10: the frame pointer's negative offsets.
                let through_fp = match class {
                    0x2 | 0x3 => dst == 10,
                    0x1 => src == 10,
                    _ => false,
                };
                if through_fp && off < 0 {
                    frames[index] = frames[index].max(u64::from(off.unsigned_abs()));
                }
                if code == 0x85 && src == 1 {
                    // A BPF-to-BPF call: relocated against a symbol, or pc-relative.
                    let target = match relocations.get(&offset) {
                        Some(RelocationTarget::Symbol(sym)) => {
                            let sym = file.symbol_by_index(*sym).expect("relocation symbol");
                            let sec = sym.section_index().expect("call target section");
                            let address = if sym.kind() == SymbolKind::Section {
                                (i64::from(imm) + 1) as u64 * 8
                            } else {
                                sym.address()
                            };
                            at(sec, address)
                        }
                        _ => at(
                            section.index(),
                            (offset as i64 + (i64::from(imm) + 1) * 8) as u64,
                        ),
                    };
                    let callee = target.unwrap_or_else(|| {
                        panic!("call at {}+{offset:#x} to no known function", function.name)
                    });
                    calls[index].push(callee);
                }
                // lddw takes two slots.
                offset += if code == 0x18 { 16 } else { 8 };
            }
        }
    }
    CallGraph {
        functions,
        frames,
        calls,
    }
}

impl CallGraph {
    /// The deepest chain from `f`: combined stack as the verifier counts it, and the path.
    fn deepest(&self, f: usize, seen: &mut Vec<usize>) -> (u64, Vec<String>) {
        assert!(
            !seen.contains(&f),
            "recursion through {}",
            self.functions[f].name
        );
        seen.push(f);
        let own = self.frames[f].max(1).div_ceil(32) * 32;
        let mut best = (0, Vec::new());
        for &callee in &self.calls[f] {
            let below = self.deepest(callee, seen);
            if below.0 > best.0 {
                best = below;
            }
        }
        seen.pop();
        let mut path = vec![format!("{} ({} B)", self.functions[f].name, self.frames[f])];
        path.extend(best.1);
        (own + best.0, path)
    }
}

#[test]
fn every_program_fits_the_verifiers_combined_stack() {
    if let Some(why) = super::unavailable_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let graph = call_graph(super::bytes());
    let programs: Vec<usize> = (0..graph.functions.len())
        .filter(|&i| graph.functions[i].is_program)
        .collect();
    assert!(programs.len() >= 10, "programs found: {programs:?}");
    let mut report = Vec::new();
    for &p in &programs {
        let (total, path) = graph.deepest(p, &mut Vec::new());
        report.push((total, path));
    }
    report.sort();
    for (total, path) in &report {
        eprintln!("{total:>4} B  {}", path.join(" -> "));
    }
    let over: Vec<_> = report.iter().filter(|(t, _)| *t > MAX_STACK).collect();
    assert!(
        over.is_empty(),
        "over {MAX_STACK} bytes of combined stack: {over:#?}"
    );
}
