//! Replays an allocation trace (Kmm's CSV, either form, or a log of RMM's logging adaptor)
//! through any allocator: the device allocations and frees, in the trace's row order, on one
//! thread. A free is matched to its allocation by the buffer column when the trace has one
//! (Kmm's traces: moves then do not matter), else by address (RMM's logs). Frees of buffers the
//! trace never saw allocated (older than the trace) and failed allocations are skipped, and
//! counted. A spill gives the buffer's device memory up and its restore takes it again (a free
//! and an allocation of the replay, not counted as the caller's), so the replay's device memory
//! in use follows the run's, as the RMM form's rows do; a restore of a buffer older than the
//! trace takes memory too (the RMM form writes it as an allocation), and its free, counted as a
//! free of an older buffer, gives it back. A wrap (memory allocated elsewhere that
//! became a buffer) is replayed as an allocation: the run counted it in use and as an
//! allocation, and an allocator under test would have to give that memory.

use kmm::manager::trace::{Action, Record};
use std::collections::HashMap;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Alloc { bytes: u64, slot: usize },
    Free { slot: usize },
}

/// A trace made ready to replay: each live buffer has a slot, reused once it is freed.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub slots: usize,
    pub allocs: usize,
    /// Of `allocs`, the wraps of memory allocated elsewhere.
    pub wraps: usize,
    pub frees: usize,
    /// Frees of buffers allocated before the trace started (those restored during the trace
    /// give back the memory their restore took).
    pub unmatched_frees: usize,
    pub failures: usize,
    /// Spills and restores of the trace's buffers, replayed as frees and allocations.
    pub spills: usize,
    pub restores: usize,
    /// The bytes the trace's live buffers held at their peak, and at its end.
    pub peak_in_use: u64,
    pub in_use_at_end: u64,
}

/// A plan being made: the live buffers' slots, the slots free for reuse, the bytes in use.
#[derive(Default)]
struct Planner {
    plan: Plan,
    live: HashMap<u64, (usize, u64)>,
    free_slots: Vec<usize>,
    in_use: u64,
}

impl Planner {
    /// Allocates `bytes` for `key` in a slot; an older buffer still live under `key` (an address
    /// allocated twice without a free between: a log with lost rows) is freed first, and
    /// counted as a free. Refuses (None) live bytes past 2^64 - 1: no run had them.
    fn alloc(&mut self, key: u64, bytes: u64) -> Option<()> {
        if self.free(key) {
            self.plan.frees += 1;
        }
        self.in_use = self.in_use.checked_add(bytes)?;
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.plan.slots += 1;
            self.plan.slots - 1
        });
        self.live.insert(key, (slot, bytes));
        self.plan.steps.push(Step::Alloc { bytes, slot });
        self.plan.peak_in_use = self.plan.peak_in_use.max(self.in_use);
        Some(())
    }

    /// Frees the buffer live under `key`; false when there is none.
    fn free(&mut self, key: u64) -> bool {
        let Some((slot, bytes)) = self.live.remove(&key) else {
            return false;
        };
        self.plan.steps.push(Step::Free { slot });
        self.free_slots.push(slot);
        self.in_use -= bytes;
        true
    }
}

/// The plan of a trace's device rows; an error names the row (after the header, counted from
/// 1) where the live buffers' bytes would pass 2^64 - 1.
pub fn plan(records: &[Record]) -> Result<Plan, String> {
    let by_buffer = records.iter().any(|r| r.buffer != 0);
    // A row of a buffer-keyed trace without a buffer (edited by hand) goes by its address: key 0
    // would make every such row the same buffer.
    let key = |r: &Record| if by_buffer && r.buffer != 0 { r.buffer } else { r.address };
    let mut p = Planner::default();
    // Buffers spilled (their device memory given up) and not yet restored or freed.
    let mut spilled: std::collections::HashSet<u64> = std::collections::HashSet::new();
    // Buffers older than the trace that a restore brought into the replay.
    let mut older: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for (i, r) in records.iter().enumerate().filter(|(_, r)| r.kind == 0) {
        let too_many = || format!("row {} after the header: {} bytes more in use pass 2^64 - 1 bytes (the live buffers' sizes add up past what any run holds)", i + 1, r.bytes);
        match Action::from_u32(r.action) {
            Some(Action::Allocate) | Some(Action::Wrap) => {
                p.alloc(key(r), r.bytes).ok_or_else(too_many)?;
                p.plan.allocs += 1;
                p.plan.wraps += (r.action == Action::Wrap as u32) as usize;
            }
            Some(Action::Free) => {
                if older.remove(&key(r)) {
                    // The caller freed a buffer older than the trace (counted so), whose
                    // restore the replay allocated: its memory goes back (spilled: it went).
                    p.free(key(r));
                    spilled.remove(&key(r));
                    p.plan.unmatched_frees += 1;
                } else if p.free(key(r)) {
                    p.plan.frees += 1;
                } else if by_buffer && spilled.remove(&key(r)) {
                    // A buffer freed while spilled: its device memory went at the spill.
                    p.plan.frees += 1;
                } else {
                    p.plan.unmatched_frees += 1;
                }
            }
            Some(Action::Spill) if by_buffer => {
                if p.free(key(r)) {
                    spilled.insert(key(r));
                    p.plan.spills += 1;
                }
            }
            // A restore takes device memory whatever the buffer's age: one allocated before the
            // trace (its spill unseen, or before the trace too) is live from here on, as the RMM
            // form writes it (an allocation), and its later spill or free gives the memory back.
            Some(Action::Restore) if by_buffer && !p.live.contains_key(&key(r)) => {
                if !spilled.remove(&key(r)) {
                    older.insert(key(r));
                }
                p.alloc(key(r), r.bytes).ok_or_else(too_many)?;
                p.plan.restores += 1;
            }
            Some(Action::Move) if !by_buffer => {
                if let Some(v) = p.live.remove(&r.moved_from) {
                    p.live.insert(r.address, v);
                }
            }
            Some(Action::AllocateFailure) => p.plan.failures += 1,
            _ => {}
        }
    }
    p.plan.in_use_at_end = p.in_use;
    Ok(p.plan)
}

/// What a replay needs of an allocator; `alloc` of zero bytes must give something `free` takes.
pub trait Allocator {
    fn alloc(&mut self, bytes: u64) -> Result<u64, String>;
    fn free(&mut self, handle: u64);
    /// Waits for queued frees (stream-ordered allocators), inside the timed run.
    fn finish(&mut self) {}
}

/// Replays the plan once (buffers still live at its end are freed, untimed); returns
/// nanoseconds per allocation and free.
pub fn run(plan: &Plan, a: &mut dyn Allocator) -> Result<f64, String> {
    let mut slots = vec![None::<u64>; plan.slots];
    let start = Instant::now();
    for (i, step) in plan.steps.iter().enumerate() {
        match *step {
            Step::Alloc { bytes, slot } => {
                let h = a.alloc(bytes).map_err(|e| format!("step {i}: allocating {bytes} bytes: {e}"))?;
                slots[slot] = Some(h);
            }
            Step::Free { slot } => {
                if let Some(h) = slots[slot].take() {
                    a.free(h);
                }
            }
        }
    }
    a.finish();
    let ns = start.elapsed().as_nanos() as f64 / plan.steps.len().max(1) as f64;
    for h in slots.into_iter().flatten() {
        a.free(h);
    }
    a.finish();
    Ok(ns)
}
