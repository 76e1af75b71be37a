//! A manager owns a stream, device and pinned memory resources, and the buffers and events it
//! handed out. Its bookkeeping sits in lanes behind short-held locks (see `cells` and `lane`);
//! no lock is held while waiting for the device, so frees never block on GPU work. Every path
//! that frees, trims or moves memory goes through the ordering rule of `order`.

pub mod cells;
mod config;
mod events;
pub mod copy;
pub mod csv;
pub mod handles;
mod lane;
mod observe;
pub mod order;
mod peer;
mod release;
mod report;
mod spill;
mod spill_store;
mod staging;
#[cfg(test)]
mod tests;
pub mod trace;

pub use config::{AllocMode, Config, MemoryKind, MAX_BUFFER_BYTES};
pub use lane::{Growth, State};
pub(crate) use lane::MappedTry;
pub use observe::{Figure, MapSegment, MemoryMap, SegmentState};
pub use report::{human_bytes, KindStats};
pub use spill_store::SpillStats;

use crate::backend::{self, Backend, BackendKind, Stream};
use crate::error::{lock, KmmStatus, Result};
use crate::pool::deferred::Deferred;
use crate::pool::direct::DirectResource;
use crate::pool::limit::{Limit, LimitedUpstream};
use crate::pool::pooled::PoolResource;
use crate::pool::lane_gauge::LaneGauge;
use crate::pool::stats::UsageCounters;
use crate::pool::stream_async::AsyncResource;
use crate::pool::upstream::{DeviceUpstream, FreeQueues, PinnedUpstream};
use crate::pool::{new_suballocator, Block, MemoryResource, ResourceCounters, SuballocatorKind, Upstream};
use crate::{err, fail};
use handles::{HandleTable, TAG_BUFFER, TAG_EVENT};
use lane::{BufferRecord, Origin, Place};
use order::{Reuse, StreamSet};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// How `free` treats a mapped buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeMode {
    Checked,
    Force,
}

pub struct Manager {
    backend: Arc<dyn Backend>,
    stream: Arc<dyn Stream>,
    config: Config,
    /// Where its lanes' `State`s live: its own, or lent by the C ABI's registry slot.
    cells: Arc<cells::LaneCells>,
    staging: Mutex<staging::Staging>,
    /// Per kind: where the pools' chunks come from and go back to, and what that upstream holds
    /// (the manager's reserved bytes, with their exact peak).
    upstreams: [Arc<dyn Upstream>; 2],
    limits: [Arc<Limit>; 2],
    /// Of the pinned limit's bytes, those the spill store holds (no pool's chunks).
    spill_pinned: Arc<Limit>,
    /// Bytes in use per kind, shared by the lanes.
    in_use: Arc<[LaneGauge; 2]>,
    /// Host ranges this manager registered (start -> bytes): only it may unregister them.
    registered: Mutex<BTreeMap<u64, u64>>,
    /// Chunks (kind, base, size) taken out of a pool whose fence could not be waited for: given
    /// back at teardown, after the stream.
    unfenced: Mutex<Vec<(usize, u64, u64)>>,
    /// Frees of whole allocations waiting for a moment with no lock held.
    free_queues: Arc<FreeQueues>,
    /// Whether its device pools compact (pool mode, a suballocator that relocates, a non-zero
    /// ratio): only then may a lane compact to lend room to another (`borrow`).
    pools_compact: bool,
    /// The trace recording now, or the last one (kept for reading); see `observe`.
    trace: Mutex<observe::TraceSlot>,
    /// Spilled buffers' host memory and the clock of buffers' last uses (see `spill`).
    spill: Arc<spill_store::Spill>,
}

impl Manager {
    /// A manager of its own, for Rust callers: dropping it tears it down.
    pub fn new(config: Config) -> Result<Manager> {
        let serial = handles::next_serial();
        Manager::with_cells(config, Arc::new(cells::LaneCells::new()), handles::owner_of(serial), serial)
    }

    /// A manager whose lanes go into `cells`, which no manager may be using (the C ABI's registry
    /// lends its slot's); `owner` goes into its buffer and event handles, `serial` seeds them.
    pub(crate) fn with_cells(config: Config, cells: Arc<cells::LaneCells>, owner: u16, serial: u64) -> Result<Manager> {
        config.validate()?;
        let backend = backend::open(config.backend, config.device)?;
        let stream = backend.create_stream()?;
        let home = stream.raw();
        // One limit and one upstream for every lane: the hard limit counts the manager.
        let limits = [
            Arc::new(Limit::new(config.hard_limit, "hard limit")),
            Arc::new(Limit::new(config.pinned_limit, "pinned limit (KmmConfig.pinned_limit)")),
        ];
        let upstreams: [Arc<dyn Upstream>; 2] = [
            Arc::new(LimitedUpstream { inner: Arc::new(DeviceUpstream(backend.clone())), limit: limits[0].clone() }),
            Arc::new(LimitedUpstream { inner: Arc::new(PinnedUpstream(backend.clone())), limit: limits[1].clone() }),
        ];
        let in_use: Arc<[LaneGauge; 2]> = Arc::new([LaneGauge::default(), LaneGauge::default()]);
        let lane_mask = cells::lane_mask_for(config.alloc_mode);
        let seed = (serial.wrapping_mul(0x9E37_79B9) >> 7) as u32;
        // Frees of whole allocations (direct mode, adopted memory) wait in these queues for a
        // moment with no lock held (see `QueuedFrees`).
        // (The cells keep the queues' flag; a cycle through the lanes' states that the teardown
        // breaks when it takes them out.)
        let mut free_queues = FreeQueues::new(cells.clone());
        let direct_upstream: Arc<dyn Upstream> = free_queues.add(upstreams[0].clone());
        let adopted_upstreams: [Arc<dyn Upstream>; 2] = [
            free_queues.add(Arc::new(DeviceUpstream(backend.clone()))),
            free_queues.add(Arc::new(PinnedUpstream(backend.clone()))),
        ];
        let free_queues = Arc::new(free_queues);
        // The spill store's pinned chunks count against the pinned limit but are no pool's
        // chunks: counted apart as well, for a trace's pinned `reserved` (the pools' chunks).
        // Its count is taken after the pinned limit's and given back before it: never more than
        // its share of the limit's count, which a trace subtracts it from.
        let spill_pinned = Arc::new(Limit::new(0, "spill store"));
        let spill_upstream =
            Arc::new(LimitedUpstream { inner: Arc::new(PinnedUpstream(backend.clone())), limit: spill_pinned.clone() });
        let spill = Arc::new(spill_store::Spill::new(
            config.spill_limit,
            Arc::new(LimitedUpstream { inner: spill_upstream, limit: limits[1].clone() }),
            config.pinned_chunk_size,
            backend.clone(),
            stream.clone(),
        ));
        let mut lanes = Vec::with_capacity(lane_mask + 1);
        let mut pools_compact = false;
        for lane in 0..=lane_mask {
            let (device, device_reuse): (Box<dyn MemoryResource>, Reuse) = match config.alloc_mode {
                AllocMode::Pool => {
                    let sub = new_suballocator(config.suballocator, config.alignment, config.fixed_block_size);
                    pools_compact = sub.relocates() && config.compaction_ratio_pct != 0;
                    let mut pool = PoolResource::new(upstreams[0].clone(), sub, config.chunk_size, config.alignment)
                        .with_compaction(config.compaction_ratio_pct);
                    if lane == cells::alloc_lane(MemoryKind::Device, lane_mask) {
                        pool.reserve(config.initial_pool_size).map_err(|mut e| {
                            e.message = format!("config.initial_pool_size = {}: {}", config.initial_pool_size, e.message);
                            e
                        })?;
                    }
                    (Box::new(pool), Reuse::Ordered { stream: home, follows: true })
                }
                AllocMode::Direct => {
                    let direct = DirectResource::new(direct_upstream.clone(), config.alignment);
                    (Box::new(Deferred::new(direct, backend.clone(), stream.clone())), Reuse::Completed)
                }
                AllocMode::CudaAsync => {
                    let max = if config.hard_limit == 0 { u64::MAX } else { config.hard_limit };
                    let pool = backend.create_async_pool(config.release_threshold, max)?;
                    (Box::new(AsyncResource::new(pool, stream.clone())), Reuse::Ordered { stream: home, follows: false })
                }
            };
            // Every lane has a pinned pool, but only lane 0's is ever asked for memory.
            let pinned_pool = PoolResource::new(
                upstreams[1].clone(),
                new_suballocator(SuballocatorKind::Binned, config.alignment, 0),
                config.pinned_chunk_size,
                config.alignment,
            );
            let pinned = Box::new(Deferred::new(pinned_pool, backend.clone(), stream.clone()));
            let adopted = |up: &Arc<dyn Upstream>| Deferred::new(DirectResource::new(up.clone(), 1), backend.clone(), stream.clone());
            let [buffer_history, event_history] = cells.history(lane);
            lanes.push(State {
                buffers: HandleTable::resume(TAG_BUFFER, owner, lane, seed, buffer_history),
                events: HandleTable::resume(TAG_EVENT, owner, lane, seed, event_history),
                resources: [device, pinned],
                reuse: [device_reuse, Reuse::Completed],
                adopted: [adopted(&adopted_upstreams[0]), adopted(&adopted_upstreams[1])],
                usage: [UsageCounters::default(); 2],
                in_use: in_use.clone(),
                reserved: limits[0].clone(),
                backend: backend.clone(),
                stream: stream.clone(),
                home,
                place: Place { cells: Arc::downgrade(&cells), lane, lane_mask },
                moves_fence: None,
                fence_query_in: None,
                trace: None,
                spill: spill.clone(),
                dying: Vec::new(),
            });
        }
        let staging = staging::Staging::new(backend.clone(), config.staging_chunk_size, config.staging_chunks);
        cells.occupy(lane_mask, lanes)?;
        Ok(Manager {
            backend,
            stream,
            config,
            cells,
            staging: Mutex::new(staging),
            upstreams,
            limits,
            spill_pinned,
            in_use,
            registered: Mutex::new(BTreeMap::new()),
            unfenced: Mutex::new(Vec::new()),
            free_queues,
            pools_compact,
            trace: Mutex::new(observe::TraceSlot::default()),
            spill,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The state of `lane`.
    fn lane(&self, lane: usize) -> parking_lot::MappedMutexGuard<'_, State> {
        parking_lot::MutexGuard::map(self.cells.lane(lane).lock(), |s| {
            s.as_mut().expect("a manager's state stays in its cell until its teardown ends")
        })
    }

    /// The state of the lane that holds `buffer`, by the lane bits of its handle (any lane for a
    /// forged one, whose table then turns it away).
    fn state_of(&self, buffer: u64) -> parking_lot::MappedMutexGuard<'_, State> {
        self.lane(handles::lane_of(buffer) & self.lane_mask())
    }

    /// Events and other manager-wide records live in lane 0.
    fn first_lane(&self) -> parking_lot::MappedMutexGuard<'_, State> {
        self.lane(0)
    }

    /// The lanes in use, minus one (see `cells::lane_mask_for`).
    fn lane_mask(&self) -> usize {
        cells::lane_mask_for(self.config.alloc_mode)
    }

    fn lanes(&self) -> std::ops::RangeInclusive<usize> {
        0..=self.lane_mask()
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.backend.kind()
    }
    pub fn device(&self) -> i32 {
        self.backend.device()
    }
    pub fn device_name(&self) -> String {
        self.backend.device_name()
    }
    pub fn raw_stream(&self) -> u64 {
        self.stream.raw()
    }
    /// The manager's stream, for layers that queue their own work on it (kernels, tests).
    pub fn stream(&self) -> &Arc<dyn Stream> {
        &self.stream
    }
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// A raw stream as callers name it: on the host backend 0 stands for the manager's own
    /// (there is no default stream there).
    pub fn stream_arg(&self, stream: u64) -> u64 {
        order::stream_arg(stream, self.raw_stream(), self.backend.kind() == BackendKind::Cuda)
    }

    /// Allocates a buffer in the calling thread's lane for work on the manager's stream.
    pub fn alloc(&self, bytes: u64, kind: MemoryKind) -> Result<u64> {
        self.alloc_for(bytes, kind, self.raw_stream())
    }

    /// Allocates a buffer in the calling thread's lane, ready for work on the raw `stream`; see
    /// `alloc_rest` for what happens when that lane's free blocks do not serve it.
    pub fn alloc_for(&self, bytes: u64, kind: MemoryKind, stream: u64) -> Result<u64> {
        let own = cells::alloc_lane(kind, self.lane_mask());
        let first = self.lane(own).try_alloc_in(bytes, kind, stream, Growth::Defer);
        self.alloc_rest(first, bytes, kind, stream)
    }

    /// Frees upstream what the lanes queued (see `QueuedFrees`), with no lock held. Housekeeping
    /// of earlier frees: what fails stays queued for the next flush, and teardown.
    pub(crate) fn flush_frees(&self) {
        let _ = self.free_queues.flush();
    }

    /// Goes on from the first try of an allocation in the calling thread's lane (`first`, with
    /// `Growth::Defer`). When the lane declined to grow because the other lanes hold enough free
    /// bytes: their free blocks (lanes busy now are passed over), then the own lane, compacting
    /// or growing. Out of memory: see `alloc_after_release`.
    pub fn alloc_rest(&self, first: Result<Option<u64>>, bytes: u64, kind: MemoryKind, stream: u64) -> Result<u64> {
        self.flush_frees();
        let own = cells::alloc_lane(kind, self.lane_mask());
        let grown = match first {
            Ok(Some(buffer)) => return Ok(buffer),
            Ok(None) => match self.borrow(own, bytes, kind, stream) {
                Some(buffer) => return Ok(buffer),
                None => self.lane(own).try_alloc(bytes, kind, stream),
            },
            Err(e) => Err(e),
        };
        let result = match grown {
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => self.alloc_after_release(bytes, kind, stream),
            done => done,
        };
        if let (Err(e), Some(t)) = (&result, self.recording()) {
            t.record(trace::Action::AllocateFailure, kind, 0, bytes, stream, 0, e.status as u64);
        }
        result
    }

    /// A buffer from the free blocks of a lane other than `own` that is not busy now, starting
    /// with the next one (so that borrowers spread), or `None`. When no free block fits and
    /// growing would take the manager past its compaction ratio, a lane with enough free bytes
    /// compacts to make room: lanes whose threads peak at different times then share one
    /// reserve instead of each keeping its own peak's (without this, 16 threads sharing a manager
    /// reserved 1.2-1.3x their peak in use).
    fn borrow(&self, own: usize, bytes: u64, kind: MemoryKind, stream: u64) -> Option<u64> {
        let mask = cells::kind_lane_mask(kind, self.lane_mask());
        (1..=mask).map(|i| (own + i) & mask).find_map(|lane| {
            let mut cell = self.cells.lane(lane).try_lock()?;
            cell.as_mut()?.try_alloc_in(bytes, kind, stream, Growth::Never).ok().flatten()
        })
        .or_else(|| {
            // No free block anywhere fits: growing would pass the manager's compaction ratio, so
            // a lane with room enough compacts to lend it. Each lane is waited for here (no lane
            // lock is held): the lanes busy now are those of the threads holding the memory, and
            // passing them over grew the manager instead, past its ratio, with frees to the
            // growing lane waiting behind the upstream allocation (16 threads sharing a manager,
            // H200: peak reserved / in use 1.079-1.096 and free p99 4.9-13.5 us with try_lock,
            // 1.076-1.079 and 0.8-1.0 us with lock, three alternating runs each).
            let pct = self.config.compaction_ratio_pct as u128;
            let reserved = self.limits[0].used().current();
            let held = self.in_use[0].current() + bytes;
            if kind != MemoryKind::Device || !self.pools_compact || (reserved + self.config.chunk_size) as u128 * 100 <= held as u128 * pct {
                return None;
            }
            (1..=mask).map(|i| (own + i) & mask).find_map(|lane| {
                let mut cell = self.cells.lane(lane).lock();
                cell.as_mut()?.try_alloc_in(bytes, kind, stream, Growth::Lend).ok().flatten()
            })
        })
    }

    /// The out-of-memory rungs of `alloc`, for a caller whose `try_alloc` in its own lane ran
    /// out of memory: the other lanes (a buffer may live in any), then the rungs of `climb`
    /// (cached chunks given back, then spill), trying all lanes after each.
    pub fn alloc_after_release(&self, bytes: u64, kind: MemoryKind, stream: u64) -> Result<u64> {
        let own = cells::alloc_lane(kind, self.lane_mask());
        let last = cells::kind_lane_mask(kind, self.lane_mask());
        let others = move || (0..=last).filter(move |&lane| lane != own);
        let before = self.stats(kind).resource;
        let mut spilled = 0;
        let retried = match self.alloc_in_lanes(others(), bytes, kind, stream) {
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => self.climb(bytes, kind, false, &mut spilled, || {
                self.alloc_in_lanes(std::iter::once(own).chain(others()), bytes, kind, stream)
            }),
            done => done,
        };
        retried.map_err(|e| {
            self.lane(own).usage[kind as usize].on_failure();
            let explained = self.explain_out_of_memory(bytes, kind, &before, spilled, &e.message);
            err!(KMM_ERROR_OUT_OF_MEMORY, "{explained}")
        })
    }

    /// The first buffer one of `lanes` gives, else the error that ended the search (out of
    /// memory when every lane was).
    fn alloc_in_lanes(&self, lanes: impl Iterator<Item = usize>, bytes: u64, kind: MemoryKind, stream: u64) -> Result<u64> {
        let mut result = Err(err!(KMM_ERROR_OUT_OF_MEMORY, "no other lane"));
        for lane in lanes {
            result = self.lane(lane).try_alloc(bytes, kind, stream);
            if !matches!(&result, Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY) {
                break;
            }
        }
        result
    }

    /// Adopts (`adopt = true`: Kmm frees it) or borrows memory allocated elsewhere.
    pub fn wrap(&self, ptr: u64, bytes: u64, kind: MemoryKind, adopt: bool) -> Result<u64> {
        if ptr == 0 && bytes > 0 {
            fail!(KMM_ERROR_NULL_POINTER, "ptr is NULL but bytes = {bytes}");
        }
        if bytes > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_SIZE_OVERFLOW, "bytes = {bytes} exceeds the largest buffer, 2^48 bytes");
        }
        if ptr.checked_add(bytes).is_none() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:#x} + bytes = {bytes} wraps around the address space");
        }
        let mut st = self.lane(cells::alloc_lane(kind, self.lane_mask()));
        let origin = if adopt {
            let block = Block { addr: ptr, size: bytes, token: 0 };
            st.adopted[kind as usize].inner_mut().adopt(block);
            Origin::Adopted(block)
        } else {
            Origin::Borrowed
        };
        let record = BufferRecord::new(kind, ptr, bytes, origin, StreamSet::of(self.raw_stream()));
        let buffer = st.insert_traced(trace::Action::Wrap, record, self.raw_stream());
        drop(st);
        self.flush_frees();
        buffer
    }

    pub fn free(&self, handle: u64, mode: FreeMode) -> Result<()> {
        self.state_of(handle).free(handle, mode == FreeMode::Force)
    }

    /// Records that work on the raw `stream` may use the buffer (`kmm_buffer_record_stream`).
    pub fn record_stream(&self, handle: u64, stream: u64) -> Result<()> {
        let stream = self.stream_arg(stream);
        self.resident(handle, |st| st.record_stream(handle, stream))
    }

    /// (address, bytes, kind, pins) of a live buffer.
    pub fn buffer_info(&self, handle: u64) -> Result<(u64, u64, MemoryKind, u32)> {
        self.state_of(handle).buffer_info(handle)
    }

    /// Pins the buffer and returns its address, valid until the matching `unmap`. The content is
    /// in place for any user of the address, on the stream or not.
    pub fn map(&self, handle: u64) -> Result<u64> {
        self.map_pinned(handle, false)
    }

    /// As `map`, for Kmm's own work on the manager's stream (kernels): the buffer's free then
    /// waits for that stream too, and a free before `end_own_work` waits for that call (its
    /// memory is released after it). End it with `end_own_work`, not `unmap`.
    pub fn map_for_own_work(&self, handle: u64) -> Result<u64> {
        self.map_pinned(handle, true)
    }

    /// Ends a `map_for_own_work` once the work is queued.
    pub fn end_own_work(&self, handle: u64) -> Result<()> {
        self.state_of(handle).end_lease(handle, true)
    }

    fn map_pinned(&self, handle: u64, own_work: bool) -> Result<u64> {
        let (addr, settle) = self.resident(handle, |st| st.map(handle, own_work))?;
        self.settle_mapped(handle, addr, settle, own_work)
    }

    /// After a buffer was pinned: when copies that moved data away from where it lies (a
    /// compaction's, a spill's copy out) may still be queued, waits for them (no lock held)
    /// before its address is handed out; unpins it if that fails.
    fn settle_mapped(&self, handle: u64, addr: u64, settle: Option<lane::MovesFence>, own_work: bool) -> Result<u64> {
        if let Some(fence) = settle {
            if let Err(e) = fence.wait() {
                let _ = if own_work { self.end_own_work(handle) } else { self.unmap(handle) };
                return Err(e);
            }
            self.state_of(handle).settled(handle);
        }
        Ok(addr)
    }

    /// `alloc_for` and `map` in one, for allocator plugins (their libraries keep the address),
    /// going on from the first try in the calling thread's lane (`State::try_alloc_mapped`, for
    /// work on the checked raw `stream`): waits for the copies a new block may still be the
    /// target of, or takes the long way (`alloc_rest`) and maps what it gives; (handle,
    /// address). Nothing stays allocated on failure.
    pub(crate) fn alloc_mapped_rest(&self, first: MappedTry, bytes: u64, kind: MemoryKind, stream: u64) -> Result<(u64, u64)> {
        let handle = match first {
            MappedTry::Mapped { handle, addr, settle } => {
                self.flush_frees();
                return match self.settle_mapped(handle, addr, settle.map(|s| s.fence), false) {
                    Ok(addr) => Ok((handle, addr)),
                    Err(e) => Err(self.free_failed_alloc(handle, e)),
                };
            }
            MappedTry::Unmapped(Ok(Some(handle))) => handle,
            MappedTry::Unmapped(first) => self.alloc_rest(first, bytes, kind, stream)?,
        };
        match self.map(handle) {
            Ok(addr) => Ok((handle, addr)),
            Err(e) => Err(self.free_failed_alloc(handle, e)),
        }
    }

    /// Frees a buffer allocated for a caller that then failed with `e`; returns `e`.
    fn free_failed_alloc(&self, handle: u64, e: crate::error::Error) -> crate::error::Error {
        let _ = self.free(handle, FreeMode::Force);
        e
    }

    pub fn unmap(&self, handle: u64) -> Result<()> {
        self.state_of(handle).unmap(handle)
    }

    /// Waits for the stream; then memory whose free the stream has now passed goes back:
    /// adopted memory is freed and device chunks above the release threshold are released. That
    /// second part is housekeeping: memory it cannot fence (a failing device) stays cached for the
    /// next synchronize or trim, and the wait's own outcome is what is returned.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()?;
        let threshold = match self.config.alloc_mode {
            AllocMode::Pool => self.config.release_threshold,
            _ => u64::MAX,
        };
        let _ = self.release(MemoryKind::Device, threshold);
        let _ = self.release(MemoryKind::Pinned, u64::MAX);
        Ok(())
    }

    /// Sums over the lanes; bytes in use and reserved, and their peaks, are the manager's own.
    pub fn stats(&self, kind: MemoryKind) -> KindStats {
        let k = kind as usize;
        let mut usage = UsageCounters::default();
        let mut resource = ResourceCounters::default();
        let mut adopted = ResourceCounters::default();
        for lane in self.lanes() {
            let st = self.lane(lane);
            usage.merge(&st.usage[k]);
            resource.merge(&st.resources[k].counters());
            adopted.merge(&st.adopted[k].counters());
        }
        // A snapshot's peak is never below its figure: an add that the figure's read saw may
        // not have raised the peak yet when the peak is read.
        usage.in_use = self.in_use[k].current();
        usage.peak_in_use = self.in_use[k].peak().max(usage.in_use);
        // CUDA's pool counts its own reservation; the others reserve through the limited upstream.
        if !(kind == MemoryKind::Device && self.config.alloc_mode == AllocMode::CudaAsync) {
            let upstream = self.limits[k].used();
            resource.reserved = upstream.current();
            resource.peak_reserved = upstream.peak().max(resource.reserved);
        }
        resource.reserved += adopted.reserved;
        resource.peak_reserved += adopted.peak_reserved;
        if kind == MemoryKind::Pinned {
            let staged = lock(&self.staging).reserved();
            resource.reserved += staged;
            resource.peak_reserved += staged;
        }
        let spill = if kind == MemoryKind::Device { self.spill.stats() } else { SpillStats::default() };
        KindStats { usage, resource, spill }
    }

    pub fn reset_peaks(&self) {
        self.spill.reset_peak();
        for k in 0..2 {
            self.in_use[k].reset_peak();
            self.limits[k].used().reset_peak();
        }
        for lane in self.lanes() {
            let mut st = self.lane(lane);
            for k in 0..2 {
                st.resources[k].reset_peak();
                st.adopted[k].reset_peak();
            }
        }
    }

    /// # Safety
    /// `ptr..ptr+bytes` is valid host memory until `unregister_host`.
    pub unsafe fn register_host(&self, ptr: *mut u8, bytes: u64) -> Result<()> {
        let start = ptr as u64;
        if ptr.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "ptr is NULL");
        }
        if bytes == 0 || bytes > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "bytes = {bytes} must be in 1..=2^48");
        }
        if start.checked_add(bytes).is_none() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {start:#x} + bytes = {bytes} wraps around the address space");
        }
        let mut registered = lock(&self.registered);
        // The backend refuses ranges that overlap another registration (any manager's).
        self.backend.register_host(ptr, bytes)?;
        registered.insert(start, bytes);
        Ok(())
    }

    /// # Safety
    /// `ptr` was registered through this manager and no queued copy still reads it.
    pub unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        if ptr.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "ptr is NULL");
        }
        let mut registered = lock(&self.registered);
        if !registered.contains_key(&(ptr as u64)) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:?} was not registered through this manager");
        }
        self.backend.unregister_host(ptr)?;
        registered.remove(&(ptr as u64));
        Ok(())
    }

    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.backend.memory_info()
    }

    pub fn live_buffers(&self) -> usize {
        self.lanes().map(|lane| self.lane(lane).buffers.len()).sum()
    }
}

impl Drop for Manager {
    /// Frees what is still held: every buffer and event (their frees make the stream wait for
    /// every stream that used them), then waits for the stream and gives every chunk back.
    /// Registrations made through the manager end with it. Errors here cannot be returned; the
    /// device is left as clean as it lets us.
    fn drop(&mut self) {
        for lane in self.lanes() {
            let handles = self.lane(lane).buffers.handles();
            for h in handles {
                let _ = self.free(h, FreeMode::Force);
            }
        }
        let _ = self.stream.synchronize();
        for kind in [MemoryKind::Device, MemoryKind::Pinned] {
            let _ = self.release(kind, 0);
        }
        let _ = lock(&self.staging).release();
        let _ = self.release_spill();
        for (k, base, size) in lock(&self.unfenced).drain(..) {
            // SAFETY: taken out of a pool of this upstream, and the stream has run all its work.
            let _ = unsafe { self.upstreams[k].deallocate(base, size) };
        }
        for (&start, _) in lock(&self.registered).iter() {
            // SAFETY: registered through this manager, and the stream has run every copy.
            let _ = unsafe { self.backend.unregister_host(start as *mut u8) };
        }
        // The resources go last (their own drop returns what release could not).
        self.cells.vacate();
        self.flush_frees();
    }
}
