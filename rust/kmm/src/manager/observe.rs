//! What a manager shows of its memory beyond its counters: its trace (started and stopped at any
//! time), a map of every chunk and block, and an out-of-memory error that explains itself.

use super::lane::Origin;
use super::trace::{LaneTrace, Record, Sink, TraceCounts, Tracer};
use super::{human_bytes, AllocMode, Manager, MemoryKind};
use crate::error::{lock, Result};
use crate::pool::ResourceCounters;
use std::sync::Arc;

/// The manager's trace: the one recording now, or the last one, kept for reading.
#[derive(Default)]
pub(super) struct TraceSlot {
    tracer: Option<Arc<Tracer>>,
    recording: bool,
}

/// What a stretch of a chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SegmentState {
    Free = 0,
    InUse = 1,
    /// In use and mapped: its address is out, so it never moves.
    Mapped = 2,
}

/// A stretch of a chunk: a buffer's block, or free space between blocks. Memory that is not
/// carved from chunks (direct and CUDA-pool modes, wrapped memory) is a chunk of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSegment {
    /// The base of the chunk the segment lies in.
    pub chunk: u64,
    pub address: u64,
    /// The block's size (a request rounded up), or the free stretch's.
    pub bytes: u64,
    pub state: SegmentState,
    /// The buffer's handle (0 for free space).
    pub buffer: u64,
    /// What the buffer's caller asked for (0 for free space).
    pub requested: u64,
}

/// Every chunk of one kind of memory, in address order, cut into segments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryMap {
    pub segments: Vec<MapSegment>,
}

impl MemoryMap {
    pub fn chunks(&self) -> impl Iterator<Item = &[MapSegment]> {
        self.segments.chunk_by(|a, b| a.chunk == b.chunk)
    }

    pub fn free_bytes(&self) -> u64 {
        self.segments.iter().filter(|s| s.state == SegmentState::Free).map(|s| s.bytes).sum()
    }

    pub fn largest_free(&self) -> u64 {
        self.segments.iter().filter(|s| s.state == SegmentState::Free).map(|s| s.bytes).max().unwrap_or(0)
    }

    /// 1 - largest free range / free bytes: 0 when the free space is one range (or none).
    pub fn fragmentation(&self) -> f64 {
        let free = self.free_bytes();
        if free == 0 {
            0.0
        } else {
            1.0 - self.largest_free() as f64 / free as f64
        }
    }
}

impl Manager {
    /// The trace while it records.
    pub(super) fn recording(&self) -> Option<Arc<Tracer>> {
        let slot = lock(&self.trace);
        slot.tracer.clone().filter(|_| slot.recording)
    }

    /// Starts a trace into `sink`, replacing the last one (a trace still recording is stopped
    /// first). Every lane records into it from its next event on.
    pub fn trace_start(&self, sink: Sink) -> Result<()> {
        self.trace_stop()?;
        let cuda_pool = self.config.alloc_mode == AllocMode::CudaAsync;
        let tracer = Arc::new(Tracer::start(sink, self.in_use.clone(), self.limits.clone(), cuda_pool)?);
        let mut slot = lock(&self.trace);
        for lane in self.lanes() {
            self.lane(lane).trace = Some(LaneTrace::new(&tracer));
        }
        *slot = TraceSlot { tracer: Some(tracer), recording: true };
        Ok(())
    }

    /// Stops the trace (a file trace is flushed and closed); a ring's records stay readable
    /// until the next start. Stopping with no trace recording does nothing.
    pub fn trace_stop(&self) -> Result<()> {
        let mut slot = lock(&self.trace);
        if !slot.recording {
            return Ok(());
        }
        for lane in self.lanes() {
            if let Some(lane_trace) = self.lane(lane).trace.take() {
                lane_trace.stop();
            }
        }
        slot.recording = false;
        let tracer = slot.tracer.clone().expect("a recording trace is kept");
        if !tracer.is_ring() {
            slot.tracer = None;
        }
        drop(slot);
        tracer.finish()
    }

    /// The records of the ring trace (recording or stopped), oldest first, with the counts;
    /// `None` when there is no ring trace to read.
    pub fn trace_records(&self) -> Option<(Vec<Record>, TraceCounts, bool)> {
        let slot = lock(&self.trace);
        let tracer = slot.tracer.as_ref().filter(|t| t.is_ring())?;
        let (mut live, mut counts) = (Vec::new(), TraceCounts::default());
        for lane in self.lanes() {
            if let Some(lane_trace) = &self.lane(lane).trace {
                lane_trace.collect(&mut live, &mut counts);
            }
        }
        let (records, counts) = tracer.records(live, counts);
        Some((records, counts, slot.recording))
    }

    /// The map of `kind`'s memory now: every chunk, its buffers' blocks and the free space
    /// between them.
    pub fn memory_map(&self, kind: MemoryKind) -> MemoryMap {
        let k = kind as usize;
        let mut chunks: Vec<(u64, u64)> = Vec::new();
        // (address, block size, buffer, requested, mapped)
        let mut blocks: Vec<(u64, u64, u64, u64, bool)> = Vec::new();
        for lane in self.lanes() {
            let st = self.lane(lane);
            chunks.extend(st.resources[k].chunks());
            for (handle, r) in st.buffers.iter().filter(|(_, r)| r.kind == kind) {
                let size = match r.origin {
                    Origin::Resource(b) | Origin::Adopted(b) => b.size,
                    Origin::Borrowed => r.bytes,
                    Origin::Empty => continue,
                };
                blocks.push((r.addr, size, handle, r.bytes, r.pins > 0));
            }
        }
        chunks.sort_unstable();
        blocks.sort_unstable();
        // Blocks outside every chunk are whole allocations: each is a chunk of its own.
        let within = |chunks: &[(u64, u64)], addr: u64| {
            let i = chunks.partition_point(|c| c.0 <= addr);
            i > 0 && addr < chunks[i - 1].0 + chunks[i - 1].1
        };
        let whole: Vec<(u64, u64)> = blocks.iter().filter(|b| !within(&chunks, b.0)).map(|b| (b.0, b.1)).collect();
        chunks.extend(whole);
        chunks.sort_unstable();
        let mut segments = Vec::with_capacity(blocks.len() * 2 + chunks.len());
        let mut next_block = blocks.iter().peekable();
        for &(base, size) in &chunks {
            let end = base + size;
            let mut at = base;
            while let Some(&&(addr, bytes, buffer, requested, mapped)) = next_block.peek() {
                if addr >= end {
                    break;
                }
                next_block.next();
                if addr > at {
                    segments.push(MapSegment { chunk: base, address: at, bytes: addr - at, state: SegmentState::Free, buffer: 0, requested: 0 });
                }
                let state = if mapped { SegmentState::Mapped } else { SegmentState::InUse };
                segments.push(MapSegment { chunk: base, address: addr, bytes, state, buffer, requested });
                at = at.max(addr + bytes);
            }
            if at < end {
                segments.push(MapSegment { chunk: base, address: at, bytes: end - at, state: SegmentState::Free, buffer: 0, requested: 0 });
            }
        }
        MemoryMap { segments }
    }

    /// The message of an allocation that failed after every rung: the request, what the manager
    /// holds and where the free space is, the largest holders, what was tried (`before`: the
    /// resource counters before the rungs), and where to see the whole map.
    pub(super) fn explain_out_of_memory(&self, bytes: u64, kind: MemoryKind, before: &ResourceCounters, cause: &str) -> String {
        let stats = self.stats(kind);
        let map = self.memory_map(kind);
        let name = format!("{kind:?}").to_lowercase();
        let mut text = format!("allocating {} ({bytes} bytes) of {name} memory failed: {cause}\n", human_bytes(bytes));
        let limit = match kind {
            MemoryKind::Device => self.config.hard_limit,
            MemoryKind::Pinned => self.config.pinned_limit,
        };
        let limit = if limit == 0 { "no hard limit".to_string() } else { format!("hard limit {}", human_bytes(limit)) };
        let device = match (kind, self.backend.memory_info()) {
            (MemoryKind::Device, Ok((free, total))) => format!("; the device has {} free of {}", human_bytes(free), human_bytes(total)),
            _ => String::new(),
        };
        text += &format!(
            "  in use: {} in {} buffers; reserved: {} ({limit}{device})\n",
            human_bytes(stats.usage.in_use),
            stats.usage.live_buffers,
            human_bytes(stats.resource.reserved)
        );
        // The largest block the pool could serve (a binned pool serves a slab's free slots to
        // their own size only, so it may be less than the largest free range of the map).
        let free = map.free_bytes();
        let largest = stats.resource.largest_free.min(map.largest_free());
        let fragmentation = if free == 0 { 0.0 } else { 1.0 - largest as f64 / free as f64 };
        text += &format!(
            "  free in the pool: {}; largest free block: {}; fragmentation {fragmentation:.2} (1 - largest free block / free bytes)\n",
            human_bytes(free),
            human_bytes(largest),
        );
        let mut holders: Vec<_> = map.segments.iter().filter(|s| s.state != SegmentState::Free).collect();
        holders.sort_by_key(|s| std::cmp::Reverse(s.requested));
        if !holders.is_empty() {
            let list: Vec<String> = holders
                .iter()
                .take(3)
                .map(|s| {
                    let mapped = if s.state == SegmentState::Mapped { ", mapped" } else { "" };
                    format!("buffer {:#x} {}{mapped}", s.buffer, human_bytes(s.requested))
                })
                .collect();
            text += &format!("  largest holders: {}\n", list.join("; "));
        }
        let released = before.reserved.saturating_sub(stats.resource.reserved);
        let moved = stats.resource.compactions.saturating_sub(before.compactions);
        let moved_bytes = stats.resource.relocated_bytes.saturating_sub(before.relocated_bytes);
        let compaction = if kind == MemoryKind::Device && self.pools_compact {
            format!("compaction (moved {} into place, {moved} allocation(s) served so)", human_bytes(moved_bytes))
        } else {
            "no compaction (this pool does not move buffers)".to_string()
        };
        text += &format!(
            "  tried: the other lanes' free blocks; giving cached memory back once the work that used it had run ({} released); {compaction}; no spill (Kmm does not spill to host)\n",
            human_bytes(released)
        );
        text += "  the map of every chunk: kmm_manager_memory_map (C), Kmm.memory_map(manager) (Julia), Manager.memory_map() (Python)";
        text
    }
}
