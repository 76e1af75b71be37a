//! What a manager shows of its memory beyond its counters: its trace (started and stopped at any
//! time), a map of every chunk and block, and an out-of-memory error that explains itself.

use super::lane::Origin;
use super::trace::{LaneTrace, Record, Sink, TraceCounts, Tracer};
use super::{human_bytes, AllocMode, Manager, MemoryKind};
use crate::error::{lock, Result};
use crate::pool::{MemoryResource, ResourceCounters};
use std::sync::Arc;

/// The manager's trace: the one recording now, or the last one, kept for reading.
#[derive(Default)]
pub(super) struct TraceSlot {
    tracer: Option<Arc<Tracer>>,
    recording: bool,
    /// The write error of a file trace a start replaced, found only as it was closed (rows
    /// recorded by other threads during the start): the next stop reports it.
    replaced_failure: Option<String>,
}

/// What a stretch of a chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SegmentState {
    Free = 0,
    InUse = 1,
    /// In use and pinned in place: mapped by the caller (`kmm_buffer_map`, an export), or held by
    /// a call of Kmm's in progress (a copy, fill or kernel being queued). Its address is out, so
    /// it does not move.
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
        // A chunk's first segment starts at its base: two chunks of one base (wraps of the same
        // memory) follow each other apart.
        self.segments.chunk_by(|a, b| a.chunk == b.chunk && b.address != b.chunk)
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

/// Whether one of `chunks` (base, size), sorted by base, holds all of `[addr, addr + size)`.
fn holds(chunks: &[(u64, u64)], addr: u64, size: u64) -> bool {
    let i = chunks.partition_point(|c| c.0 <= addr);
    i > 0 && addr + size <= chunks[i - 1].0 + chunks[i - 1].1
}

/// Whether `addr` lies in one of `chunks` (base, size), sorted by base.
fn in_chunks(chunks: &[(u64, u64)], addr: u64) -> bool {
    let i = chunks.partition_point(|c| c.0 <= addr);
    i > 0 && addr < chunks[i - 1].0 + chunks[i - 1].1
}

/// A figure of a manager's memory (see `crate::figures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    DeviceMap,
    PinnedMap,
    /// From the ring trace.
    Timeline,
    /// What a status shows: the device map, the pinned map when pinned memory is reserved, and
    /// the timeline when there is a ring trace.
    Overview,
}

/// What `Manager::holdings` read of one kind's buffers, in one pass.
#[derive(Default)]
struct Holdings {
    /// Bytes of the pools' chunks, and of the blocks in them.
    chunk_bytes: u64,
    held: u64,
    /// The three largest buffers: (handle, bytes asked, mapped).
    top: Vec<(u64, u64, bool)>,
    /// Bytes asked by the buffers holding memory of the kind, and how many (spilled ones left out).
    in_use: u64,
    buffers: u64,
    /// The largest block one lane's pool could serve.
    largest_free: u64,
    /// Bytes the lanes hold of their upstream (chunks or allocations, and adopted memory).
    reserved: u64,
}

impl Manager {
    /// A figure as SVG; the timeline needs a ring trace.
    pub fn figure_svg(&self, figure: Figure) -> Result<String> {
        let title = |what: &str| format!("{what}: {} (device {}), {:?} mode", self.device_name(), self.device(), self.config.alloc_mode);
        let map = |kind: MemoryKind, map: &MemoryMap| {
            let what = if kind == MemoryKind::Device { "Device memory map" } else { "Pinned memory map" };
            crate::figures::memory_map_svg(map, &title(what))
        };
        let timeline = || {
            self.trace_records().map(|(records, counts, _)| {
                let what = if counts.dropped > 0 {
                    format!("Memory timeline (last {} of {} records)", records.len(), counts.recorded)
                } else {
                    "Memory timeline".to_string()
                };
                crate::figures::timeline_svg(&records, &title(&what))
            })
        };
        Ok(match figure {
            Figure::DeviceMap => map(MemoryKind::Device, &self.memory_map(MemoryKind::Device)),
            Figure::PinnedMap => map(MemoryKind::Pinned, &self.memory_map(MemoryKind::Pinned)),
            Figure::Timeline => match timeline() {
                Some(svg) => svg,
                None => crate::fail!(
                    KMM_ERROR_INVALID_ARGUMENT,
                    "figure = 2 (the timeline) needs a ring trace: start one with kmm_manager_trace_start, path NULL"
                ),
            },
            Figure::Overview => {
                let mut figures = vec![map(MemoryKind::Device, &self.memory_map(MemoryKind::Device))];
                let pinned = self.memory_map(MemoryKind::Pinned);
                if !pinned.segments.is_empty() {
                    figures.push(map(MemoryKind::Pinned, &pinned));
                }
                figures.extend(timeline());
                crate::figures::stack(&figures)
            }
        })
    }

    /// The trace while it records.
    pub(super) fn recording(&self) -> Option<Arc<Tracer>> {
        let slot = lock(&self.trace);
        slot.tracer.clone().filter(|_| slot.recording)
    }

    /// Starts a trace into `sink`, replacing the last one (a trace still recording is stopped
    /// first). Every lane records into it from its next event on. A start that fails (a file
    /// that cannot be made, a ring that cannot be had, a recording file trace whose writing
    /// failed) changes nothing: the trace before records on.
    pub fn trace_start(&self, sink: Sink) -> Result<()> {
        let cuda_pool = self.config.alloc_mode == AllocMode::CudaAsync;
        let tracer = Arc::new(Tracer::start(sink, self.in_use.clone(), self.limits.clone(), self.spill_pinned.clone(), cuda_pool, self.raw_stream())?);
        // Every lane's ring first: a ring that cannot be had starts no part of the trace.
        let traces = self.lanes().map(|_| LaneTrace::new(&tracer)).collect::<Result<Vec<_>>>()?;
        let mut slot = lock(&self.trace);
        // Replaced, a file trace's write error would be lost (its stop is the one call that
        // reports it): its rows so far are written out first, and where that failed the caller
        // stops it first, and learns that rows are missing.
        if let Some(before) = slot.tracer.as_ref().filter(|_| slot.recording) {
            before.flush();
            if let Some(failure) = before.write_failure().or_else(|| slot.replaced_failure.clone()) {
                crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "{failure}; the trace recording lost rows: stop it first (kmm_manager_trace_stop reports this and ends it)");
            }
        }
        // The new file is emptied before the trace recording stops, so that a refusal changes
        // nothing; unless that trace writes the same file: then once it has flushed.
        let shares_file = slot.recording && slot.tracer.as_ref().is_some_and(|before| tracer.shares_file_with(before));
        tracer.claim_file(shares_file)?;
        if !shares_file {
            tracer.begin()?;
        }
        let replaced_failure = match self.stop_recording(&mut slot).map(|before| before.finish()) {
            Some(Err(e)) => Some(e.message),
            _ => slot.replaced_failure.take(),
        };
        if shares_file {
            tracer.begin()?;
        }
        for (lane, trace) in self.lanes().zip(traces) {
            self.lane(lane).trace = Some(trace);
        }
        *slot = TraceSlot { tracer: Some(tracer), recording: true, replaced_failure };
        Ok(())
    }

    /// Stops the trace (a file trace is flushed and closed); a ring's records stay readable
    /// until the next start. Stopping with no trace recording does nothing.
    pub fn trace_stop(&self) -> Result<()> {
        let mut slot = lock(&self.trace);
        // Flushed under the trace's lock: a start into the same file empties it only after.
        let stopped = self.stop_recording(&mut slot).map_or(Ok(()), |tracer| tracer.finish());
        match (slot.replaced_failure.take(), stopped) {
            (Some(failure), Ok(())) => crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "{failure} (the trace a start replaced)"),
            (Some(failure), Err(e)) => crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "{}; and {failure} (the trace a start replaced)", e.message),
            (None, stopped) => stopped,
        }
    }

    /// Writes a recording file trace's rows to its file (see `Tracer::flush`).
    pub fn trace_flush(&self) {
        if let Some(tracer) = lock(&self.trace).tracer.as_ref() {
            tracer.flush();
        }
    }

    /// Takes the recording trace out of every lane (under the trace's lock, `slot`): the trace,
    /// for the caller to finish, or `None` when none was recording.
    fn stop_recording(&self, slot: &mut TraceSlot) -> Option<Arc<Tracer>> {
        if !slot.recording {
            return None;
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
        Some(tracer)
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

    /// How many records `trace_records` would give, and the counts, without copying them;
    /// `None` as there.
    pub fn trace_len(&self) -> Option<(usize, TraceCounts)> {
        let slot = lock(&self.trace);
        let tracer = slot.tracer.as_ref().filter(|t| t.is_ring())?;
        let mut tally = (0, TraceCounts::default());
        for lane in self.lanes() {
            if let Some(lane_trace) = &self.lane(lane).trace {
                lane_trace.tally(&mut tally);
            }
        }
        tracer.tally_kept(&mut tally);
        Some(tally)
    }

    /// The map of `kind`'s memory now: every chunk, its buffers' blocks and the free space
    /// between them.
    pub fn memory_map(&self, kind: MemoryKind) -> MemoryMap {
        let k = kind as usize;
        let mut chunks: Vec<(u64, u64)> = Vec::new();
        // (address, block size, buffer, requested, mapped, wrapped)
        let mut blocks: Vec<(u64, u64, u64, u64, bool, bool)> = Vec::new();
        for lane in self.lanes() {
            let st = self.lane(lane);
            chunks.extend(st.resources[k].chunks());
            // Buffers freed under a copy (`State::dying`) still hold their blocks: drawn as held.
            let dying = st.dying.iter().map(|(h, r)| (*h, r));
            for (handle, r) in st.buffers.iter().chain(dying).filter(|(_, r)| r.kind == kind) {
                let (size, wrapped) = match r.origin {
                    Origin::Resource(b) | Origin::Lent { block: b, .. } => (b.size, false),
                    Origin::Adopted(b) => (b.size, true),
                    Origin::Borrowed => (r.bytes, true),
                    Origin::Empty | Origin::Spilled(_) => continue,
                };
                // A zero-byte wrap holds no memory.
                if size > 0 {
                    blocks.push((r.addr, size, handle, r.bytes, r.pins > 0, wrapped));
                }
            }
        }
        chunks.sort_unstable();
        blocks.sort_unstable();
        // A block of a pool chunk goes to it. Every other block is a chunk of its own: an
        // allocation outside the pools (direct and CUDA-pool modes), and every wrap, wherever
        // its memory is (inside or across a pool chunk, or the same memory as another wrap):
        // each buffer shows, and a pool chunk's segments stay its own blocks.
        let pool = chunks.len();
        let mut owned: Vec<Vec<(u64, u64, u64, u64, bool)>> = vec![Vec::new(); pool];
        for (addr, size, buffer, requested, mapped, wrapped) in blocks {
            if !wrapped && holds(&chunks[..pool], addr, size) {
                owned[chunks[..pool].partition_point(|c| c.0 <= addr) - 1].push((addr, size, buffer, requested, mapped));
            } else {
                chunks.push((addr, size));
                owned.push(vec![(addr, size, buffer, requested, mapped)]);
            }
        }
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        order.sort_by_key(|&i| chunks[i]);
        let mut segments = Vec::new();
        for i in order {
            let (base, size) = chunks[i];
            let end = base + size;
            let mut at = base;
            for &(addr, bytes, buffer, requested, mapped) in &owned[i] {
                if addr > at {
                    segments.push(MapSegment { chunk: base, address: at, bytes: addr - at, state: SegmentState::Free, buffer: 0, requested: 0 });
                }
                // Blocks of one chunk never overlap (wraps are chunks of their own); clamped all
                // the same, so that segments could never overlap or leave their chunk.
                let (start, stop) = (addr.max(at), (addr + bytes).min(end));
                if stop > start {
                    let state = if mapped { SegmentState::Mapped } else { SegmentState::InUse };
                    segments.push(MapSegment { chunk: base, address: start, bytes: stop - start, state, buffer, requested });
                    at = stop;
                }
            }
            if at < end {
                segments.push(MapSegment { chunk: base, address: at, bytes: end - at, state: SegmentState::Free, buffer: 0, requested: 0 });
            }
        }
        MemoryMap { segments }
    }

    /// What the buffers of `kind` hold, in one pass over them (no map is built: an
    /// out-of-memory error's cost must not grow with the buffers by more than a pass). Every
    /// figure of a lane is read under that lane's one lock, so that the message's figures agree
    /// with each other while other threads allocate and free (read in two passes, they showed a
    /// largest free block of 0 B beside 16 MiB free).
    fn holdings(&self, kind: MemoryKind) -> Holdings {
        let k = kind as usize;
        let mut h = Holdings::default();
        let mut chunks: Vec<(u64, u64)> = Vec::new();
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        for lane in self.lanes() {
            let st = self.lane(lane);
            chunks.extend(st.resources[k].chunks());
            let counters = st.resources[k].counters();
            h.largest_free = h.largest_free.max(counters.largest_free);
            // What the lane holds of its upstream: its pool's chunks, or (direct mode) its
            // buffers' allocations, and adopted memory.
            h.reserved += counters.reserved + st.adopted[k].counters().reserved;
            // Buffers freed under a copy (`State::dying`) hold their blocks until it ends.
            let dying = st.dying.iter().map(|(handle, r)| (*handle, r));
            for (handle, r) in st.buffers.iter().chain(dying).filter(|(_, r)| r.kind == kind) {
                match r.origin {
                    Origin::Resource(b) | Origin::Lent { block: b, .. } => blocks.push((b.addr, b.size)),
                    // On the host: it holds no device memory.
                    Origin::Spilled(_) => continue,
                    _ => {}
                }
                h.buffers += 1;
                h.in_use += r.bytes;
                if r.bytes > h.top.last().map_or(0, |t| t.1) || h.top.len() < 3 {
                    h.top.push((handle, r.bytes, r.callers_pins() > 0));
                    h.top.sort_by_key(|t| std::cmp::Reverse(t.1));
                    h.top.truncate(3);
                }
            }
        }
        chunks.sort_unstable();
        h.held = blocks.iter().filter(|b| in_chunks(&chunks, b.0)).map(|b| b.1).sum();
        h.chunk_bytes = chunks.iter().map(|c| c.1).sum();
        h
    }

    /// The message of an allocation that failed after every rung: the request, what the manager
    /// holds and where the free space is, the largest holders, what was tried (`before`: the
    /// resource counters before the rungs), and where to see the whole map.
    pub(super) fn explain_out_of_memory(&self, bytes: u64, kind: MemoryKind, before: &ResourceCounters, spilled: u64, cause: &str) -> String {
        let Holdings { chunk_bytes, held, top, in_use, buffers: n, largest_free, reserved } = self.holdings(kind);
        let stats = self.stats(kind);
        let name = format!("{kind:?}").to_lowercase();
        let mut text = format!("allocating {} ({bytes} bytes) of {name} memory failed: {cause}\n", human_bytes(bytes));
        let (limit, limit_name) = match kind {
            MemoryKind::Device => (self.config.hard_limit, "hard limit"),
            MemoryKind::Pinned => (self.config.pinned_limit, "pinned limit (KmmConfig.pinned_limit)"),
        };
        let limit = if limit == 0 { format!("no {limit_name}") } else { format!("{limit_name} {}", human_bytes(limit)) };
        let device = match (kind, self.backend.memory_info()) {
            (MemoryKind::Device, Ok((free, total))) => format!("; the device has {} free of {}", human_bytes(free), human_bytes(total)),
            _ => String::new(),
        };
        // Reserved as the pass read it (what the lanes held), so that it holds the bytes in use
        // and free beside it; pinned memory adds the staging slots and the spill store's, as
        // `stats` does. CUDA's own pool (cuda_async mode) counts its reservation itself.
        let reserved = match kind {
            MemoryKind::Device if self.config.alloc_mode == AllocMode::CudaAsync => stats.resource.reserved,
            MemoryKind::Device => reserved,
            MemoryKind::Pinned => reserved + lock(&self.staging).reserved() + self.spill.pinned_reserved(),
        };
        // Spilled buffers hold no device memory: counted apart.
        let on_host = match stats.spill.buffers {
            0 => String::new(),
            k => format!(" ({k} more on the host, {})", human_bytes(stats.spill.spilled_bytes)),
        };
        text += &format!(
            "  in use: {} in {n} buffer{}{on_host}; reserved: {} ({limit}{device})\n",
            human_bytes(in_use),
            if n == 1 { "" } else { "s" },
            human_bytes(reserved)
        );
        let pooled = kind == MemoryKind::Pinned || self.config.alloc_mode == AllocMode::Pool;
        if pooled {
            // The largest block the pool could serve (a binned pool serves a slab's free slots
            // to their own size only, so it may be less than the largest free range of the map).
            let free = chunk_bytes.saturating_sub(held);
            let largest = largest_free.min(free);
            let fragmentation = if free == 0 { 0.0 } else { 1.0 - largest as f64 / free as f64 };
            text += &format!(
                "  free in the pool: {}; largest free block: {}; fragmentation {fragmentation:.2} (1 - largest free block / free bytes)\n",
                human_bytes(free),
                human_bytes(largest),
            );
        } else {
            text += &format!("  no pool: each buffer is an allocation of its own ({:?} mode)\n", self.config.alloc_mode);
        }
        if !top.is_empty() {
            let list: Vec<String> = top
                .iter()
                .map(|&(buffer, asked, mapped)| format!("buffer {buffer:#x} {}{}", human_bytes(asked), if mapped { ", mapped" } else { "" }))
                .collect();
            text += &format!("  largest holders: {}\n", list.join("; "));
        }
        let released = before.reserved.saturating_sub(stats.resource.reserved);
        let tried = if pooled {
            let moved = stats.resource.compactions.saturating_sub(before.compactions);
            let moved_bytes = stats.resource.relocated_bytes.saturating_sub(before.relocated_bytes);
            let compaction = if kind == MemoryKind::Device && self.pools_compact {
                format!("compaction (moved {} into place, {moved} allocation(s) served so)", human_bytes(moved_bytes))
            } else if kind == MemoryKind::Device
                && self.config.compaction_ratio_pct == 0
                && matches!(self.config.suballocator, crate::pool::SuballocatorKind::Binned | crate::pool::SuballocatorKind::Heap)
            {
                "no compaction (KmmConfig.compaction_ratio_pct is 0)".to_string()
            } else {
                "no compaction (this pool does not move buffers)".to_string()
            };
            format!("the other lanes' free blocks; giving cached memory back once the work that used it had run ({} released); {compaction}", human_bytes(released))
        } else {
            format!("giving back memory whose frees the stream had passed ({} released)", human_bytes(released))
        };
        let spill = if kind != MemoryKind::Device && self.config.spill_limit == 0 {
            "no spill (only device buffers spill)".to_string()
        } else if kind != MemoryKind::Device {
            let s = self.spill_stats();
            format!(
                "moving spilled buffers from pinned to pageable memory ({} moved now; {} of spilled buffers still in pinned memory)",
                human_bytes(spilled),
                human_bytes(s.spilled_bytes.saturating_sub(s.pageable_bytes))
            )
        } else if self.config.spill_limit == 0 {
            "no spill (KmmConfig.spill_limit is 0)".to_string()
        } else if let Some((room, what)) = self.never_fits_device(bytes) {
            format!("no spill (the request alone is larger than {what}, {}: spilling cannot make room for it)", human_bytes(room))
        } else {
            let s = self.spill_stats();
            format!(
                "spill to host ({} spilled now; {} on the host of a spill limit of {}: the device and the limit together cannot hold the live buffers, or what is left on the device is mapped, in use by the failing call itself (a copy's other buffer) or marked never to spill)",
                human_bytes(spilled),
                human_bytes(s.spilled_bytes),
                human_bytes(self.config.spill_limit)
            )
        };
        text += &format!("  tried: {tried}; {spill}\n");
        text += "  the map of every chunk: kmm_manager_memory_map (C), Kmm.memory_map(manager) (Julia), Manager.memory_map() (Python)";
        text
    }
}
