//! A manager owns a stream, device and pinned memory resources, and the buffers and events it
//! handed out. Its bookkeeping sits behind short-held locks, one per lane (see `registry`);
//! none is held while waiting for the device, so frees never block on GPU work.

pub mod copy;
pub mod handles;
pub mod registry;
mod staging;

use crate::backend::{self, Backend, BackendChoice, BackendKind, Event, Stream};
use crate::error::{lock, KmmStatus, Result};
use crate::pool::deferred::Deferred;
use crate::pool::direct::DirectResource;
use crate::pool::limit::{Limit, LimitedUpstream};
use crate::pool::pooled::PoolResource;
use crate::pool::stats::UsageCounters;
use crate::pool::stream_async::AsyncResource;
use crate::pool::upstream::{DeviceUpstream, PinnedUpstream};
use crate::pool::{
    new_suballocator, Block, MemoryResource, Owner, Relocation, Relocator, ResourceCounters, SuballocatorKind,
    Upstream, NO_OWNER,
};
use crate::{err, fail};
use handles::{HandleTable, TAG_BUFFER, TAG_EVENT};
use std::sync::{Arc, Mutex};

pub use crate::ffi::types::KMM_MAX_BUFFER_BYTES as MAX_BUFFER_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    Device = 0,
    Pinned = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocMode {
    Pool,
    CudaAsync,
    Direct,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub backend: BackendChoice,
    pub device: i32,
    pub alloc_mode: AllocMode,
    pub suballocator: SuballocatorKind,
    pub alignment: u64,
    pub chunk_size: u64,
    pub initial_pool_size: u64,
    pub fixed_block_size: u64,
    pub hard_limit: u64,
    pub release_threshold: u64,
    pub pinned_chunk_size: u64,
    pub pinned_limit: u64,
    pub staging_chunk_size: u64,
    pub staging_chunks: u32,
    pub compaction_ratio_pct: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendChoice::Auto,
            device: 0,
            alloc_mode: AllocMode::Pool,
            suballocator: SuballocatorKind::Binned,
            alignment: 256,
            chunk_size: 8 << 20,
            initial_pool_size: 0,
            fixed_block_size: 1 << 20,
            hard_limit: 0,
            release_threshold: u64::MAX,
            pinned_chunk_size: 32 << 20,
            pinned_limit: 0,
            staging_chunk_size: 16 << 20,
            staging_chunks: 4,
            compaction_ratio_pct: 108,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<()> {
        if !self.alignment.is_power_of_two() || self.alignment > (1 << 21) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.alignment = {} must be a power of two up to 2 MiB", self.alignment);
        }
        if self.chunk_size == 0 || self.chunk_size > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.chunk_size = {} must be in 1..=2^48", self.chunk_size);
        }
        if self.pinned_chunk_size == 0 || self.pinned_chunk_size > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.pinned_chunk_size = {} must be in 1..=2^48", self.pinned_chunk_size);
        }
        if self.suballocator == SuballocatorKind::Fixed && (self.fixed_block_size == 0 || self.fixed_block_size > self.chunk_size) {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "config.fixed_block_size = {} must be in 1..=chunk_size ({})",
                self.fixed_block_size,
                self.chunk_size
            );
        }
        if self.staging_chunk_size < 4096 || self.staging_chunk_size > (1 << 30) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.staging_chunk_size = {} must be in 4096..=2^30", self.staging_chunk_size);
        }
        if !(2..=64).contains(&self.staging_chunks) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.staging_chunks = {} must be in 2..=64", self.staging_chunks);
        }
        if self.compaction_ratio_pct != 0 && !(100..=1000).contains(&self.compaction_ratio_pct) {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "config.compaction_ratio_pct = {} must be 0 (never move buffers) or in 100..=1000",
                self.compaction_ratio_pct
            );
        }
        if self.initial_pool_size > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.initial_pool_size = {} exceeds 2^48", self.initial_pool_size);
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Origin {
    Empty,
    Resource(Block),
    Borrowed,
    Adopted(Block),
}

struct BufferRecord {
    kind: MemoryKind,
    addr: u64,
    bytes: u64,
    origin: Origin,
    pins: u32,
    /// The buffer was moved, or placed while a compaction's copies may still be queued (perhaps
    /// where a moved buffer was): the next `map` waits for them.
    settling: bool,
}

/// Moves unmapped device buffers for a compacting pool. The copies go on the manager's stream,
/// so work queued before a move still finds the old place, and work queued after it finds the
/// new one.
struct BufferMover<'a> {
    buffers: &'a mut HandleTable<BufferRecord>,
    stream: &'a dyn Stream,
    moved: usize,
}

impl Relocator for BufferMover<'_> {
    fn movable(&mut self, owner: Owner) -> bool {
        self.buffers.at(owner).is_some_and(|r| r.pins == 0)
    }

    fn relocate(&mut self, r: &Relocation) -> Result<()> {
        let Some(record) = self.buffers.at_mut(r.owner) else {
            fail!(KMM_ERROR_INTERNAL, "relocation of block {:#x} names no live buffer (slot {})", r.from.addr, r.owner);
        };
        // SAFETY: both blocks are live pool memory of this manager until the stream passes the
        // copy: the old one is freed only after it is queued, stream-ordered.
        unsafe { self.stream.copy_d2d(r.to.addr, r.from.addr, record.bytes.min(r.from.size))? };
        record.addr = r.to.addr;
        record.origin = Origin::Resource(r.to);
        record.settling = true;
        self.moved += 1;
        Ok(())
    }
}

/// Per-kind figures: what callers hold and what the resources reserve.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KindStats {
    pub usage: UsageCounters,
    pub resource: ResourceCounters,
}

/// The bookkeeping of one lane of a manager. It lives in the manager's registry slot (see
/// `registry`), so the calls that need only this lock it without going through the manager.
pub struct State {
    buffers: HandleTable<BufferRecord>,
    events: HandleTable<Arc<dyn Event>>,
    /// Indexed by `MemoryKind`.
    resources: [Box<dyn MemoryResource>; 2],
    /// Memory adopted through `wrap`, freed through the backend once the stream passes.
    adopted: [Deferred<DirectResource>; 2],
    usage: [UsageCounters; 2],
    backend: Arc<dyn Backend>,
    stream: Arc<dyn Stream>,
    /// Completes when the copies of the latest compaction have run.
    moves_fence: Option<Arc<dyn Event>>,
    /// While the fence has not been seen complete: device allocations to go before it is queried
    /// again. A query costs as much as many allocations, and a buffer wrongly taken as settling
    /// costs one wait on a completed event at its first map.
    fence_query_in: Option<u32>,
}

/// Device allocations between two queries of the moves' fence.
const FENCE_QUERY_INTERVAL: u32 = 64;

impl State {
    /// Allocates a buffer from the pool as it stands. Out of memory is returned without counting
    /// a failure, for `Manager::alloc` to release cached memory and retry; other errors count.
    pub fn try_alloc(&mut self, bytes: u64, kind: MemoryKind) -> Result<u64> {
        if bytes > MAX_BUFFER_BYTES {
            self.usage[kind as usize].on_failure();
            fail!(KMM_ERROR_SIZE_OVERFLOW, "bytes = {bytes} exceeds the largest buffer, 2^48 bytes");
        }
        if bytes == 0 {
            return self.insert_buffer(BufferRecord { kind, addr: 0, bytes, origin: Origin::Empty, pins: 0, settling: false });
        }
        // Device buffers may be moved while unmapped; they are known to the pool by their slot.
        // Pinned blocks have no owner, and the pinned pool never compacts.
        let owner = if kind == MemoryKind::Device { self.buffers.next_index() } else { NO_OWNER };
        let mut mover = BufferMover { buffers: &mut self.buffers, stream: self.stream.as_ref(), moved: 0 };
        let allocated = self.resources[kind as usize].allocate(bytes, owner, &mut mover);
        // Moves stay made even when the allocation then fails: fence them either way.
        if mover.moved > 0 {
            self.fence_moves();
        }
        let block = match allocated {
            Ok(block) => block,
            Err(e) => {
                if e.status != KmmStatus::KMM_ERROR_OUT_OF_MEMORY {
                    self.usage[kind as usize].on_failure();
                }
                return Err(e);
            }
        };
        // Until the moves' copies have run, any new device block may lie where a moved buffer
        // was (the request's own room, or what a window left over or gave back).
        let settling = kind == MemoryKind::Device && self.moves_in_flight();
        self.insert_buffer(BufferRecord { kind, addr: block.addr, bytes, origin: Origin::Resource(block), pins: 0, settling })
    }

    /// Whether the copies of the latest compaction may still be queued.
    fn moves_in_flight(&mut self) -> bool {
        let Some(countdown) = self.fence_query_in.as_mut() else {
            return false;
        };
        if *countdown > 0 {
            *countdown -= 1;
            return true;
        }
        let done = self.moves_fence.as_ref().is_some_and(|e| e.query().unwrap_or(false));
        self.fence_query_in = if done { None } else { Some(FENCE_QUERY_INTERVAL) };
        !done
    }

    /// Marks the end of a compaction's copies on the stream, for `map` to wait on. The last
    /// fence's event is recorded again unless a `map` still waits on it.
    fn fence_moves(&mut self) {
        let reusable = self.moves_fence.take().filter(|e| Arc::strong_count(e) == 1);
        let recorded = match reusable {
            Some(event) => self.stream.record(event.as_ref()).map(|_| event),
            None => backend::record_reusing(self.backend.as_ref(), self.stream.as_ref(), &mut Vec::new()).map(Arc::from),
        };
        self.moves_fence = match recorded {
            Ok(event) => Some(event),
            Err(_) => {
                // No event: wait for the copies here instead (a failing device; rare).
                let _ = self.stream.synchronize();
                None
            }
        };
        self.fence_query_in = self.moves_fence.as_ref().map(|_| FENCE_QUERY_INTERVAL);
    }

    fn insert_buffer(&mut self, record: BufferRecord) -> Result<u64> {
        let (kind, bytes, origin) = (record.kind, record.bytes, record.origin);
        match self.buffers.insert(record) {
            Ok(h) => {
                self.usage[kind as usize].on_alloc(bytes);
                Ok(h)
            }
            Err(e) => {
                if let Origin::Resource(block) = origin {
                    self.resources[kind as usize].deallocate(block)?;
                }
                Err(e)
            }
        }
    }

    pub fn free(&mut self, handle: u64, mode: FreeMode) -> Result<()> {
        let record = self.buffers.remove_if(handle, |record| {
            if record.pins > 0 && mode == FreeMode::Checked {
                fail!(
                    KMM_ERROR_BUFFER_MAPPED,
                    "buffer {handle:#x} is mapped ({} pin(s)); unmap it first or free it with KMM_FREE_FORCE",
                    record.pins
                );
            }
            Ok(())
        })?;
        self.usage[record.kind as usize].on_free(record.bytes);
        match record.origin {
            Origin::Resource(block) => self.resources[record.kind as usize].deallocate(block),
            Origin::Adopted(block) => self.adopted[record.kind as usize].deallocate(block),
            Origin::Empty | Origin::Borrowed => Ok(()),
        }
    }

    pub fn buffer_info(&self, handle: u64) -> Result<(u64, u64, MemoryKind, u32)> {
        let r = self.buffers.get(handle)?;
        Ok((r.addr, r.bytes, r.kind, r.pins))
    }

    /// Pins the buffer; returns its address and, when a compaction's copies that involve it may
    /// still be queued, the event to wait for (outside the lock) before the address is used
    /// outside the stream.
    fn map(&mut self, handle: u64) -> Result<(u64, Option<Arc<dyn Event>>)> {
        let fence = &self.moves_fence;
        let r = self.buffers.get_mut(handle)?;
        r.pins = r.pins.checked_add(1).ok_or_else(|| err!(KMM_ERROR_SIZE_OVERFLOW, "buffer {handle:#x} pin count overflow"))?;
        let wait = if r.settling { fence.clone() } else { None };
        if wait.is_none() {
            r.settling = false;
        }
        Ok((r.addr, wait))
    }

    /// After a `map`'s wait for the moves' fence succeeded: the buffer's bytes are in place.
    fn settled(&mut self, handle: u64) {
        if let Ok(r) = self.buffers.get_mut(handle) {
            r.settling = false;
        }
    }

    pub fn unmap(&mut self, handle: u64) -> Result<()> {
        let r = self.buffers.get_mut(handle)?;
        if r.pins == 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "buffer {handle:#x} is not mapped");
        }
        r.pins -= 1;
        Ok(())
    }
}

pub struct Manager {
    backend: Arc<dyn Backend>,
    stream: Arc<dyn Stream>,
    config: Config,
    /// The registry slot holding this manager and its lanes' `State`s.
    slot: u16,
    staging: Mutex<staging::Staging>,
}

/// How `free` treats a mapped buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeMode {
    Checked,
    Force,
}

impl Manager {
    /// Called by `registry::register` only: the new manager's state goes into `slot`.
    pub fn new(config: Config, slot: u16, serial: u64) -> Result<Manager> {
        config.validate()?;
        let backend = backend::open(config.backend, config.device)?;
        let stream = backend.create_stream()?;
        // One limit and one upstream for every lane: the hard limit counts the manager.
        let device_upstream: Arc<dyn Upstream> = Arc::new(LimitedUpstream {
            inner: Arc::new(DeviceUpstream(backend.clone())),
            limit: Arc::new(Limit::new(config.hard_limit)),
        });
        let pinned_upstream: Arc<dyn Upstream> = Arc::new(LimitedUpstream {
            inner: Arc::new(PinnedUpstream(backend.clone())),
            limit: Arc::new(Limit::new(config.pinned_limit)),
        });
        let lane_mask = registry::lane_mask_for(config.alloc_mode);
        let seed = (serial.wrapping_mul(0x9E37_79B9) >> 7) as u32;
        let mut lanes = Vec::with_capacity(lane_mask + 1);
        for lane in 0..=lane_mask {
            let device: Box<dyn MemoryResource> = match config.alloc_mode {
                AllocMode::Pool => {
                    let sub = new_suballocator(config.suballocator, config.alignment, config.fixed_block_size);
                    let mut pool = PoolResource::new(device_upstream.clone(), sub, config.chunk_size, config.alignment)
                        .with_compaction(config.compaction_ratio_pct);
                    if lane == registry::alloc_lane(MemoryKind::Device, lane_mask) {
                        pool.reserve(config.initial_pool_size)?;
                    }
                    Box::new(pool)
                }
                AllocMode::Direct => Box::new(Deferred::new(
                    DirectResource::new(device_upstream.clone(), config.alignment),
                    backend.clone(),
                    stream.clone(),
                )),
                AllocMode::CudaAsync => {
                    let max = if config.hard_limit == 0 { u64::MAX } else { config.hard_limit };
                    Box::new(AsyncResource::new(backend.create_async_pool(config.release_threshold, max)?, stream.clone()))
                }
            };
            // Every lane has a pinned pool, but only lane 0's is ever asked for memory.
            let pinned = Box::new(Deferred::new(
                PoolResource::new(
                    pinned_upstream.clone(),
                    new_suballocator(SuballocatorKind::Binned, config.alignment, 0),
                    config.pinned_chunk_size,
                    config.alignment,
                ),
                backend.clone(),
                stream.clone(),
            ));
            let adopted = |up: Arc<dyn Upstream>| Deferred::new(DirectResource::new(up, 1), backend.clone(), stream.clone());
            lanes.push(State {
                buffers: HandleTable::new(TAG_BUFFER, slot, lane, seed),
                events: HandleTable::new(TAG_EVENT, slot, lane, seed),
                resources: [device, pinned],
                adopted: [
                    adopted(Arc::new(DeviceUpstream(backend.clone()))),
                    adopted(Arc::new(PinnedUpstream(backend.clone()))),
                ],
                usage: [UsageCounters::default(); 2],
                backend: backend.clone(),
                stream: stream.clone(),
                moves_fence: None,
                fence_query_in: None,
            });
        }
        let staging = staging::Staging::new(backend.clone(), config.staging_chunk_size, config.staging_chunks);
        if backend.kind() == BackendKind::Cuda {
            *lock(live_cuda_managers()).entry(backend.device()).or_insert(0) += 1;
        }
        registry::set_lane_mask(slot, lane_mask);
        for (lane, state) in lanes.into_iter().enumerate() {
            let mut cell = registry::state_cell(slot, lane).lock();
            debug_assert!(cell.is_none(), "slot {slot} lane {lane} still holds a manager's state");
            *cell = Some(state);
        }
        Ok(Manager { backend, stream, config, slot, staging: Mutex::new(staging) })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The state of `lane`.
    fn lane(&self, lane: usize) -> parking_lot::MappedMutexGuard<'static, State> {
        parking_lot::MutexGuard::map(registry::state_cell(self.slot, lane).lock(), |s| {
            s.as_mut().expect("a manager's state stays in its slot until its teardown ends")
        })
    }

    /// The state of the lane that holds `buffer`, by the lane bits of its handle (any lane for a
    /// forged one, whose table then turns it away).
    fn state_of(&self, buffer: u64) -> parking_lot::MappedMutexGuard<'static, State> {
        self.lane(handles::lane_of(buffer) & self.lane_mask())
    }

    /// Events and other manager-wide records live in lane 0.
    fn first_lane(&self) -> parking_lot::MappedMutexGuard<'static, State> {
        self.lane(0)
    }

    /// The lanes in use, minus one (see `registry::lane_mask_for`).
    fn lane_mask(&self) -> usize {
        registry::lane_mask_for(self.config.alloc_mode)
    }

    fn lanes(&self) -> std::ops::RangeInclusive<usize> {
        0..=self.lane_mask()
    }

    /// Gives free chunks of `kind` back, lane by lane, until the lanes together reserve at most
    /// `keep_bytes` (or hold no free chunk).
    fn trim_lanes(&self, kind: MemoryKind, keep_bytes: u64) -> Result<()> {
        let mut budget = keep_bytes;
        for lane in self.lanes() {
            let mut st = self.lane(lane);
            let resource = &mut st.resources[kind as usize];
            resource.trim(budget)?;
            budget = budget.saturating_sub(resource.counters().reserved);
        }
        Ok(())
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

    /// Allocates a buffer in the calling thread's lane. When that is out of memory, see
    /// `alloc_after_release`.
    pub fn alloc(&self, bytes: u64, kind: MemoryKind) -> Result<u64> {
        let first = self.lane(registry::alloc_lane(kind, self.lane_mask())).try_alloc(bytes, kind);
        match first {
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => self.alloc_after_release(bytes, kind),
            done => done,
        }
    }

    /// The out-of-memory rungs of `alloc`, for a caller whose `try_alloc` in its own lane ran
    /// out of memory: the other lanes (a buffer may live in any), then, after waiting for the
    /// stream and giving every lane's cached chunks back, all lanes once more.
    pub fn alloc_after_release(&self, bytes: u64, kind: MemoryKind) -> Result<u64> {
        let own = registry::alloc_lane(kind, self.lane_mask());
        let last = registry::kind_lane_mask(kind, self.lane_mask());
        let others = move || (0..=last).filter(move |&lane| lane != own);
        let retried = match self.alloc_in_lanes(others(), bytes, kind) {
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => self
                .release_cached(kind)
                .and_then(|_| self.alloc_in_lanes(std::iter::once(own).chain(others()), bytes, kind)),
            done => done,
        };
        retried.map_err(|e| {
            self.lane(own).usage[kind as usize].on_failure();
            err!(KMM_ERROR_OUT_OF_MEMORY, "allocating {bytes} bytes of {kind:?} memory: {e}")
        })
    }

    /// The first buffer one of `lanes` gives, else the error that ended the search (out of
    /// memory when every lane was).
    fn alloc_in_lanes(&self, lanes: impl Iterator<Item = usize>, bytes: u64, kind: MemoryKind) -> Result<u64> {
        let mut result = Err(err!(KMM_ERROR_OUT_OF_MEMORY, "no other lane"));
        for lane in lanes {
            result = self.lane(lane).try_alloc(bytes, kind);
            if !matches!(&result, Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY) {
                break;
            }
        }
        result
    }

    /// The out-of-memory ladder's last rung inside Kmm: wait for the stream, then give every
    /// lane's cached chunks back so the retry sees all the device has.
    fn release_cached(&self, kind: MemoryKind) -> Result<()> {
        self.stream.synchronize()?;
        self.trim_lanes(kind, 0)
    }

    /// Adopts (`adopt = true`: Kmm frees it) or borrows memory allocated elsewhere.
    pub fn wrap(&self, ptr: u64, bytes: u64, kind: MemoryKind, adopt: bool) -> Result<u64> {
        if ptr == 0 && bytes > 0 {
            fail!(KMM_ERROR_NULL_POINTER, "ptr is NULL but bytes = {bytes}");
        }
        if bytes > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_SIZE_OVERFLOW, "bytes = {bytes} exceeds the largest buffer, 2^48 bytes");
        }
        let mut st = self.lane(registry::alloc_lane(kind, self.lane_mask()));
        let origin = if adopt {
            let block = Block { addr: ptr, size: bytes, token: 0 };
            st.adopted[kind as usize].inner_mut().adopt(block);
            Origin::Adopted(block)
        } else {
            Origin::Borrowed
        };
        st.insert_buffer(BufferRecord { kind, addr: ptr, bytes, origin, pins: 0, settling: false })
    }

    pub fn free(&self, handle: u64, mode: FreeMode) -> Result<()> {
        self.state_of(handle).free(handle, mode)
    }

    /// (address, bytes, kind, pins) of a live buffer.
    pub fn buffer_info(&self, handle: u64) -> Result<(u64, u64, MemoryKind, u32)> {
        self.state_of(handle).buffer_info(handle)
    }

    /// Pins the buffer and returns its address, valid until the matching `unmap`. The content is
    /// in place for any user of the address, on the stream or not.
    pub fn map(&self, handle: u64) -> Result<u64> {
        let (addr, settle) = self.state_of(handle).map(handle)?;
        if let Some(event) = settle {
            if let Err(e) = event.synchronize() {
                let _ = self.unmap(handle);
                return Err(e);
            }
            self.state_of(handle).settled(handle);
        }
        Ok(addr)
    }

    pub fn unmap(&self, handle: u64) -> Result<()> {
        self.state_of(handle).unmap(handle)
    }

    /// Waits for the stream; then memory whose free the stream has now passed goes back:
    /// adopted memory is freed and device chunks above the release threshold are released.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()?;
        for lane in self.lanes() {
            for adopted in self.lane(lane).adopted.iter_mut() {
                adopted.trim(u64::MAX)?;
            }
        }
        if self.config.release_threshold != u64::MAX && self.config.alloc_mode == AllocMode::Pool {
            self.trim_lanes(MemoryKind::Device, self.config.release_threshold)?;
        }
        Ok(())
    }

    /// Gives cached memory back until each pool reserves at most `keep_bytes`.
    pub fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.stream.synchronize()?;
        for kind in [MemoryKind::Device, MemoryKind::Pinned] {
            self.trim_lanes(kind, keep_bytes)?;
        }
        for lane in self.lanes() {
            for adopted in self.lane(lane).adopted.iter_mut() {
                adopted.trim(u64::MAX)?;
            }
        }
        lock(&self.staging).release()
    }

    /// Sums over the lanes. Each lane keeps its own peaks, so with one thread allocating they are
    /// the manager's, and with several an upper bound of it.
    pub fn stats(&self, kind: MemoryKind) -> KindStats {
        let k = kind as usize;
        let mut usage = UsageCounters::default();
        let mut resource = ResourceCounters::default();
        for lane in self.lanes() {
            let st = self.lane(lane);
            let mut lane_resource = st.resources[k].counters();
            lane_resource.reserved += st.adopted[k].counters().reserved;
            lane_resource.peak_reserved = lane_resource.peak_reserved.max(lane_resource.reserved);
            usage.merge(&st.usage[k]);
            resource.merge(&lane_resource);
        }
        if kind == MemoryKind::Pinned {
            let staged = lock(&self.staging).reserved();
            resource.reserved += staged;
            resource.peak_reserved += staged;
        }
        KindStats { usage, resource }
    }

    pub fn reset_peaks(&self) {
        for lane in self.lanes() {
            let mut st = self.lane(lane);
            for k in 0..2 {
                st.usage[k].reset_peak();
                st.resources[k].reset_peak();
            }
        }
    }

    pub fn summary(&self) -> String {
        let mut out = format!(
            "Kmm manager on {} ({:?} backend, device {}), {:?} mode, {:?} suballocator\n",
            self.device_name(),
            self.backend_kind(),
            self.device(),
            self.config.alloc_mode,
            self.config.suballocator
        );
        out += &format!(
            "{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12}\n",
            "kind", "in use", "peak use", "reserved", "peak resv", "live", "allocs", "frees", "misses", "failed", "largest free"
        );
        for kind in [MemoryKind::Device, MemoryKind::Pinned] {
            let s = self.stats(kind);
            out += &format!(
                "{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12}\n",
                format!("{kind:?}").to_lowercase(),
                human_bytes(s.usage.in_use),
                human_bytes(s.usage.peak_in_use),
                human_bytes(s.resource.reserved),
                human_bytes(s.resource.peak_reserved),
                s.usage.live_buffers,
                s.usage.allocs,
                s.usage.frees,
                s.resource.pool_misses,
                s.usage.failed_allocs,
                human_bytes(s.resource.largest_free)
            );
        }
        let device = self.stats(MemoryKind::Device).resource;
        if device.compactions > 0 {
            out += &format!(
                "compactions: {} (unmapped device buffers moved instead of growing the pool; {} copied)\n",
                device.compactions,
                human_bytes(device.relocated_bytes)
            );
        }
        out
    }

    pub fn record_event(&self) -> Result<u64> {
        let event: Arc<dyn Event> = Arc::from(self.backend.create_event()?);
        self.stream.record(event.as_ref())?;
        self.first_lane().events.insert(event)
    }

    fn event(&self, handle: u64) -> Result<Arc<dyn Event>> {
        self.first_lane().events.get(handle).cloned()
    }

    pub fn event_query(&self, handle: u64) -> Result<bool> {
        self.event(handle)?.query()
    }

    /// Waits without holding the manager's lock.
    pub fn event_wait(&self, handle: u64) -> Result<()> {
        self.event(handle)?.synchronize()
    }

    pub fn event_destroy(&self, handle: u64) -> Result<()> {
        self.first_lane().events.remove(handle).map(drop)
    }

    /// The manager's stream waits for the work queued so far on `foreign`.
    pub fn wait_for_stream(&self, foreign: u64) -> Result<()> {
        self.stream.wait_raw_stream(foreign)
    }

    /// `foreign` waits for the work queued so far on the manager's stream.
    pub fn order_stream_after(&self, foreign: u64) -> Result<()> {
        self.stream.signal_raw_stream(foreign)
    }

    /// # Safety
    /// `ptr..ptr+bytes` is valid host memory until `unregister_host`.
    pub unsafe fn register_host(&self, ptr: *mut u8, bytes: u64) -> Result<()> {
        if ptr.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "ptr is NULL");
        }
        if bytes == 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "bytes = 0: nothing to register");
        }
        self.backend.register_host(ptr, bytes)
    }

    /// # Safety
    /// `ptr` was registered and no queued copy still reads it.
    pub unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        if ptr.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "ptr is NULL");
        }
        self.backend.unregister_host(ptr)
    }

    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.backend.memory_info()
    }

    pub fn live_buffers(&self) -> usize {
        self.lanes().map(|lane| self.lane(lane).buffers.len()).sum()
    }
}

impl Drop for Manager {
    /// Frees what is still held: waits for the stream, frees every buffer and event, and gives
    /// every chunk back. Errors here cannot be returned; the device is left as clean as it lets us.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        for lane in self.lanes() {
            let handles = self.lane(lane).buffers.handles();
            for h in handles {
                let _ = self.free(h, FreeMode::Force);
            }
        }
        let _ = self.stream.synchronize();
        for lane in self.lanes() {
            let mut st = self.lane(lane);
            for r in st.resources.iter_mut() {
                let _ = r.trim(0);
            }
            for a in st.adopted.iter_mut() {
                let _ = a.trim(0);
            }
        }
        let _ = lock(&self.staging).release();
        if self.backend.kind() == BackendKind::Cuda {
            let device = self.backend.device();
            let mut live = lock(live_cuda_managers());
            let count = live.entry(device).or_insert(1);
            *count -= 1;
            if *count == 0 {
                live.remove(&device);
                // Device-wide helpers (the cuBLAS handle) live while some manager of the device does.
                crate::qmri::gpu::release_device(device);
            }
        }
        // The resources go last (their own drop returns what trim could not), then the slot.
        for lane in self.lanes() {
            let state = registry::state_cell(self.slot, lane).lock().take();
            drop(state);
        }
        registry::release_slot(self.slot);
    }
}

/// How many CUDA managers are alive per device.
fn live_cuda_managers() -> &'static Mutex<std::collections::HashMap<i32, usize>> {
    static LIVE: std::sync::OnceLock<Mutex<std::collections::HashMap<i32, usize>>> = std::sync::OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(std::collections::HashMap::new()))
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
