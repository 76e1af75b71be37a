//! The buffers of one qMRI call, checked for shared memory before any work is queued.
//!
//! Kernels read their inputs while they write their outputs, and the host reference writes one
//! output before it reads or writes the next: an output that shares memory with another argument
//! gives a wrong result with `KMM_OK` (a simulation that overwrites the parameters of atoms it
//! has not simulated yet). So every call refuses it, on both backends alike.

use crate::error::Result;
use crate::fail;
use crate::manager::Manager;

/// One buffer argument: the byte range `offset .. offset + bytes` of `handle` the call touches.
/// `handle` 0 (an output left out) is skipped.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub handle: u64,
    pub offset: u64,
    pub bytes: u64,
    pub name: &'a str,
    pub written: bool,
}

impl<'a> Operand<'a> {
    pub fn input(name: &'a str, handle: u64, bytes: u64) -> Self {
        Operand { handle, offset: 0, bytes, name, written: false }
    }
    pub fn output(name: &'a str, handle: u64, bytes: u64) -> Self {
        Operand { handle, offset: 0, bytes, name, written: true }
    }
    pub fn at(self, offset: u64) -> Self {
        Operand { offset, ..self }
    }
}

/// Refuses an output whose range overlaps another argument's: the same buffer at overlapping
/// offsets, or memory that overlaps where one of the two buffers is wrapped memory (which may lie
/// inside another buffer). Two buffers of the pools never share memory, and their addresses are
/// not compared: read one after the other (unpinned, on the host path), a compaction or a spill
/// and restore between the reads could show one at the address the other just left. Ranges are
/// cut at each buffer's end, so a buffer too small for the call is left to the size check that
/// names it.
pub fn check_disjoint(m: &Manager, operands: &[Operand]) -> Result<()> {
    let mut placed = Vec::with_capacity(operands.len());
    for o in operands.iter().filter(|o| o.handle != 0 && o.bytes > 0) {
        let (address, size, _, _) = m.buffer_info(o.handle)?;
        let end = o.offset.saturating_add(o.bytes).min(size);
        if o.offset < end {
            // Wrapped memory never moves or spills; a pool buffer's address counts only against it.
            let wrapped = m.is_wrapped(o.handle)?;
            let resident = if !wrapped && m.is_spilled(o.handle)? { None } else { Some(address) };
            placed.push((o, o.offset, end, resident, wrapped));
        }
    }
    for (i, &(a, a_start, a_end, a_addr, a_wrapped)) in placed.iter().enumerate() {
        for &(b, b_start, b_end, b_addr, b_wrapped) in &placed[..i] {
            if !(a.written || b.written) {
                continue;
            }
            let overlaps = if a.handle == b.handle {
                a_start < b_end && b_start < a_end
            } else if a_wrapped || b_wrapped {
                a_addr.zip(b_addr).is_some_and(|(x, y)| x + a_start < y + b_end && y + b_start < x + a_end)
            } else {
                false
            };
            if overlaps {
                let (out, other) = if a.written { (a, b) } else { (b, a) };
                let how = if a.handle == b.handle { format!("both are buffer {:#x}", a.handle) } else { "their memory overlaps".to_string() };
                fail!(
                    KMM_ERROR_INVALID_ARGUMENT,
                    "{} and {} share memory ({how}): an output may not overlap another argument (the result would be wrong)",
                    out.name,
                    other.name
                );
            }
        }
    }
    Ok(())
}
