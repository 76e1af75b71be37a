//! The bookkeeping of one lane of a manager: its buffers, its resources and how their freed
//! blocks become reusable. It lives in the manager's lane cells (see `cells`), so the calls that
//! need only this lock it without going through the manager (the C ABI's registry does, by
//! handle). Nothing here waits for the device: what must wait is returned to the caller, who
//! waits after unlocking.

use super::cells::LaneCells;
use super::config::{MemoryKind, MAX_BUFFER_BYTES};
use super::handles::HandleTable;
use super::order::{self, Reuse, StreamSet};
use super::spill_store::{HostPlace, Spill};
use super::trace::{Action, LaneTrace, TracedEvent};
use crate::backend::{Backend, BackendKind, Event, Stream};
use crate::error::{KmmStatus, Result};
use crate::pool::deferred::Deferred;
use crate::pool::direct::DirectResource;
use crate::pool::limit::Limit;
use crate::pool::lane_gauge::LaneGauge;
use crate::pool::stats::UsageCounters;
use crate::pool::{Block, MemoryResource, Owner, Relocation, Relocator, NO_OWNER};
use crate::{err, fail};
use std::sync::{Arc, Weak};

#[derive(Debug, Clone, Copy)]
pub(super) enum Origin {
    Empty,
    Resource(Block),
    Borrowed,
    Adopted(Block),
    /// Spilled to host memory (see `spill`): no device memory until restored.
    Spilled(HostPlace),
    /// Restored into a free block of another lane's pool (its own had no room): the block goes
    /// back to that lane, which never moves it.
    Lent { lane: usize, block: Block },
}

pub(super) struct BufferRecord {
    pub kind: MemoryKind,
    pub addr: u64,
    pub bytes: u64,
    pub origin: Origin,
    pub pins: u32,
    /// Of the pins, Kmm's own: copies being queued and kernels' arguments (`map_for_own_work`).
    /// A free meanwhile waits in `State::dying` until the last of them ends: what they queue
    /// after the free must still find the memory theirs.
    pub leases: u32,
    /// The streams that may use the memory; its free is ordered after all of them.
    pub users: StreamSet,
    /// The buffer was moved, or placed while a compaction's copies may still be queued (perhaps
    /// where a moved buffer was): the next `map` waits for them.
    pub settling: bool,
    /// The spill clock at its last use: the least recent spills first.
    pub last_use: u64,
    /// Set by the user: the buffer stays on the device.
    pub never_spill: bool,
}

impl BufferRecord {
    /// The caller's maps: the pins less Kmm's own (`leases`), which a free, a figure or a
    /// message must not take for the caller's.
    pub fn callers_pins(&self) -> u32 {
        self.pins - self.leases
    }
}

/// What a `map` of a settling buffer waits for: the event after a compaction's copies, or (when
/// none could be recorded) the manager's stream itself.
#[derive(Clone)]
pub(crate) enum MovesFence {
    Event(Arc<dyn Event>),
    Stream(Arc<dyn Stream>),
}

impl MovesFence {
    pub fn wait(&self) -> Result<()> {
        match self {
            MovesFence::Event(e) => e.synchronize(),
            MovesFence::Stream(s) => s.synchronize(),
        }
    }
}

/// How far an allocation in a lane may go when the lane's free blocks do not serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// Take the other lanes' spare chunks, then compact or grow.
    Allow,
    /// As `Allow`, unless the other lanes together hold enough free bytes to serve the request:
    /// then decline (`try_alloc_in` gives `None`), for the manager to try their free blocks first.
    /// Lanes whose threads' needs peak at different times then share one set of chunks instead
    /// of each keeping its own peak's.
    Defer,
    /// Free blocks only: another lane's allocation is borrowing this lane's free space.
    Never,
    /// As `Never`, but this lane may compact (move its unmapped buffers) to make room: the
    /// manager would otherwise grow past its compaction ratio.
    Lend,
}

/// Where a lane is in its manager, for taking spare chunks from the other lanes. The cells are
/// held weakly: the state lives in them, so a strong reference would be a cycle that keeps them
/// alive. It is upgraded only when the lane's free blocks miss, before its pool would grow
/// (`spare_chunks`), so the allocations they serve touch no reference count; and it cannot fail
/// while the state is in the cells, since whoever locked the state holds them.
#[derive(Clone)]
pub(super) struct Place {
    pub cells: Weak<LaneCells>,
    pub lane: usize,
    /// The lanes that hold device buffers, minus one.
    pub lane_mask: usize,
}

pub struct State {
    pub(super) buffers: HandleTable<BufferRecord>,
    pub(super) events: HandleTable<Arc<dyn Event>>,
    /// Indexed by `MemoryKind`.
    pub(super) resources: [Box<dyn MemoryResource>; 2],
    /// How each kind's freed blocks become reusable (see `order`).
    pub(super) reuse: [Reuse; 2],
    /// Memory adopted through `wrap`, freed through the backend once the stream passes.
    pub(super) adopted: [Deferred<DirectResource>; 2],
    pub(super) usage: [UsageCounters; 2],
    /// The manager's bytes in use per kind, shared by its lanes.
    pub(super) in_use: Arc<[LaneGauge; 2]>,
    /// What the manager's lanes together reserve of device memory (its device upstream's count).
    pub(super) reserved: Arc<Limit>,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) stream: Arc<dyn Stream>,
    /// The manager's own raw stream.
    pub(super) home: u64,
    pub(super) place: Place,
    /// Completes when the copies of the latest compaction have run.
    pub(super) moves_fence: Option<MovesFence>,
    /// While the fence has not been seen complete: device allocations to go before it is queried
    /// again. A query costs as much as many allocations, and a buffer wrongly taken as settling
    /// costs one wait on a completed event at its first map.
    pub(super) fence_query_in: Option<u32>,
    /// The manager's trace while one records (see `trace`).
    pub(super) trace: Option<LaneTrace>,
    /// The manager's spill store and use clock, shared by its lanes.
    pub(super) spill: Arc<Spill>,
    /// Buffers freed while Kmm's own work still held them (`BufferRecord::leases`): their
    /// handles are dead, their memory is released when the last lease ends.
    pub(super) dying: Vec<(u64, BufferRecord)>,
}

/// What the first try of a plugin's allocation in a lane gave (`State::try_alloc_mapped`).
pub(crate) enum MappedTry {
    /// A buffer, pinned at `addr`; with `settle`, once the copies it may be the target of ran.
    Mapped { handle: u64, addr: u64, settle: Option<Settle> },
    /// What `try_alloc_in` gave, not mapped: a buffer to map the long way, none (the lane
    /// declined to grow), or a failure.
    Unmapped(Result<Option<u64>>),
}

/// The fence a new buffer's address waits for, carried out of its lane's lock (`MappedTry`). It
/// holds the backend too, dropped after the fence: should the manager be torn down before the
/// fence is dropped (a destroy between the lane's lock and the manager's), the device context
/// its event or stream lives in is still there for their drop.
pub(crate) struct Settle {
    pub fence: MovesFence,
    _backend: Arc<dyn Backend>,
}

/// Device allocations between two queries of the moves' fence.
const FENCE_QUERY_INTERVAL: u32 = 64;

/// The pool's caller during one allocation: takes spare chunks from the other lanes and moves
/// unmapped device buffers for a compacting pool. Moves are copies on the manager's stream, after
/// the stream has waited for every stream that used the buffer, so work queued before a move
/// still finds the old place and work queued after it finds the new one.
struct LaneCaller<'a> {
    buffers: &'a mut HandleTable<BufferRecord>,
    reuse: &'a mut Reuse,
    backend: &'a dyn Backend,
    stream: &'a dyn Stream,
    home: u64,
    /// For spare chunks: device memory of a pool-mode manager.
    place: Option<&'a Place>,
    growth: Growth,
    /// For `Growth::Defer`: the manager's device bytes in use and reserved.
    in_use: &'a LaneGauge,
    reserved: &'a Limit,
    /// This lane's bytes in use.
    in_use_here: u64,
    /// The pool asked `may_grow` and was told no.
    declined: bool,
    moved: usize,
    trace: Option<&'a mut LaneTrace>,
}

impl Relocator for LaneCaller<'_> {
    /// Free chunks of the other lanes (those not busy now, and with no compaction's copies in
    /// flight, whose chunks may still be read), ordered for this lane's stream.
    fn spare_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let Some(place) = self.place.filter(|_| matches!(self.growth, Growth::Allow | Growth::Defer)) else {
            return Vec::new();
        };
        let Some(cells) = place.cells.upgrade() else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        let mut total = 0u64;
        for lane in (0..=place.lane_mask).filter(|&l| l != place.lane) {
            if total >= bytes {
                break;
            }
            let Some(mut cell) = cells.lane(lane).try_lock() else {
                continue;
            };
            let Some(other) = cell.as_mut().filter(|o| o.fence_query_in.is_none()) else {
                continue;
            };
            let device = MemoryKind::Device as usize;
            let chunks = other.resources[device].give_chunks(bytes - total);
            if chunks.is_empty() {
                continue;
            }
            let from = other.reuse[device].free_stream(other.home);
            if let Err(_) = self.backend.order_streams(from, self.reuse.free_stream(self.home)) {
                other.resources[device].take_chunks(&chunks);
                continue;
            }
            total += chunks.iter().map(|c| c.1).sum::<u64>();
            taken.extend(chunks);
        }
        taken
    }

    fn may_grow(&mut self, size: u64, reserved: u64) -> bool {
        let elsewhere = match self.growth {
            Growth::Allow => false,
            Growth::Never | Growth::Lend => true,
            // What the other lanes reserve and do not use. Bytes in use are the requests, not
            // their rounded blocks, so this may promise a little more than there is: a wasted
            // search at worst.
            Growth::Defer => {
                let reserved_elsewhere = self.reserved.used().current().saturating_sub(reserved);
                let used_elsewhere = self.in_use.current().saturating_sub(self.in_use_here);
                self.place.is_some() && reserved_elsewhere.saturating_sub(used_elsewhere) >= size
            }
        };
        self.declined |= elsewhere;
        !elsewhere
    }

    fn may_compact_instead(&mut self) -> bool {
        self.growth == Growth::Lend
    }

    fn movable(&mut self, owner: Owner) -> bool {
        self.buffers.at(owner).is_some_and(|r| r.pins == 0)
    }

    fn relocate(&mut self, r: &Relocation) -> Result<()> {
        // The copies run on the manager's stream: the lane's free blocks must be ordered there.
        order::take_over(self.backend, self.reuse, self.home)?;
        let Some(record) = self.buffers.at_mut(r.owner) else {
            fail!(KMM_ERROR_INTERNAL, "relocation of block {:#x} names no live buffer (slot {})", r.from.addr, r.owner);
        };
        order::order_free(self.backend, self.home, &record.users)?;
        // SAFETY: both blocks are live pool memory of this manager until the stream passes the
        // copy: the old one is freed only after it is queued, stream-ordered.
        unsafe { self.stream.copy_d2d(r.to.addr, r.from.addr, record.bytes.min(r.from.size))? };
        record.addr = r.to.addr;
        record.origin = Origin::Resource(r.to);
        // Recorded streams stay recorded: they may use the new place too (after a map).
        record.users.insert(self.home);
        record.settling = true;
        self.moved += 1;
        let bytes = record.bytes;
        if let Some(t) = self.trace.as_deref_mut() {
            t.record(Action::Move, MemoryKind::Device, r.to.addr, bytes, self.home, self.buffers.handle_at(r.owner), r.from.addr);
        }
        Ok(())
    }
}

impl State {
    /// Allocates a buffer from the pool as it stands, ready for work on the raw `stream`. Out of
    /// memory is returned without counting a failure, for `Manager::alloc` to release cached
    /// memory and retry; other errors count.
    pub fn try_alloc(&mut self, bytes: u64, kind: MemoryKind, stream: u64) -> Result<u64> {
        let served = self.try_alloc_in(bytes, kind, stream, Growth::Allow)?;
        served.ok_or_else(|| err!(KMM_ERROR_INTERNAL, "an allocation that may grow declined to"))
    }

    /// `try_alloc` that compacts and grows only as far as `growth` lets it: `None` when the lane
    /// declined to (see `Growth`).
    pub fn try_alloc_in(&mut self, bytes: u64, kind: MemoryKind, stream: u64, growth: Growth) -> Result<Option<u64>> {
        let k = kind as usize;
        if bytes > MAX_BUFFER_BYTES {
            self.usage[k].on_failure();
            fail!(KMM_ERROR_SIZE_OVERFLOW, "bytes = {bytes} exceeds the largest buffer, 2^48 bytes");
        }
        if bytes == 0 {
            let record = BufferRecord::new(kind, 0, 0, Origin::Empty, StreamSet::empty());
            return self.insert_traced(Action::Allocate, record, stream).map(Some);
        }
        // Device buffers may be moved while unmapped; they are known to the pool by their slot.
        // Pinned blocks have no owner, and the pinned pool never compacts.
        let device = kind == MemoryKind::Device;
        let owner = if device { self.buffers.next_index() } else { NO_OWNER };
        let Some(block) = self.allocate_block(bytes, kind, owner, growth)? else {
            return Ok(None);
        };
        if let Err(e) = order::order_alloc(self.backend.as_ref(), &mut self.reuse[k], stream, self.home) {
            // Unused: back as it came.
            self.resources[k].deallocate(block)?;
            self.usage[k].on_failure();
            return Err(e);
        }
        // Until the moves' copies have run, any new device block may lie where a moved buffer
        // was (the request's own room, or what a window left over or gave back).
        let mut record = BufferRecord::new(kind, block.addr, bytes, Origin::Resource(block), StreamSet::of(stream));
        record.settling = device && self.moves_in_flight();
        record.last_use = self.spill.now();
        self.insert_traced(Action::Allocate, record, stream).map(Some)
    }

    /// A block of `bytes` from the lane's resource of `kind`, held by `owner`, compacting and
    /// growing as far as `growth` lets it: `None` when the lane declined to. Out of memory is
    /// returned without counting a failure (the manager's rungs come next); other errors count.
    #[inline]
    pub(super) fn allocate_block(&mut self, bytes: u64, kind: MemoryKind, owner: u32, growth: Growth) -> Result<Option<Block>> {
        let k = kind as usize;
        // A free block that fits: no caller to build, nothing to move or grow.
        if let Some(block) = self.resources[k].allocate_free(bytes, owner) {
            return Ok(Some(block));
        }
        let device = kind == MemoryKind::Device;
        let mut caller = LaneCaller {
            buffers: &mut self.buffers,
            reuse: &mut self.reuse[k],
            backend: self.backend.as_ref(),
            stream: self.stream.as_ref(),
            home: self.home,
            place: (device && self.place.lane_mask > 0).then_some(&self.place),
            growth,
            in_use: &self.in_use[k],
            reserved: &self.reserved,
            in_use_here: self.usage[k].in_use,
            declined: false,
            moved: 0,
            trace: self.trace.as_mut(),
        };
        let allocated = self.resources[k].allocate(bytes, owner, &mut caller);
        let declined = caller.declined;
        // Moves stay made even when the allocation then fails: fence them either way.
        if caller.moved > 0 {
            self.fence_moves();
        }
        match allocated {
            Ok(block) => Ok(Some(block)),
            Err(_) if declined => Ok(None),
            Err(e) => {
                if e.status != KmmStatus::KMM_ERROR_OUT_OF_MEMORY {
                    self.usage[k].on_failure();
                }
                Err(e)
            }
        }
    }

    /// Adds a live buffer, counts it in use and records `action` (an allocation or a wrap) in
    /// the trace; its resource's block goes back when no handle can be had.
    #[inline]
    pub(super) fn insert_traced(&mut self, action: Action, record: BufferRecord, stream: u64) -> Result<u64> {
        let (kind, addr, bytes, origin) = (record.kind, record.addr, record.bytes, record.origin);
        match self.buffers.insert(record) {
            Ok(handle) => {
                self.usage[kind as usize].on_alloc(bytes);
                self.change_in_use(false, bytes, action, kind, addr, bytes, stream, handle, 0);
                Ok(handle)
            }
            Err(e) => {
                if let Origin::Resource(block) = origin {
                    self.resources[kind as usize].deallocate(block)?;
                }
                Err(e)
            }
        }
    }

    /// Changes the manager's bytes in use of `kind` by `delta` (taken away with `take`) and
    /// records `action` with the figure after the change (`LaneTrace::record_after`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn change_in_use(&mut self, take: bool, delta: u64, action: Action, kind: MemoryKind, address: u64, bytes: u64, stream: u64, handle: u64, extra: u64) {
        let (gauge, lane) = (&self.in_use[kind as usize], self.place.lane);
        let change = || Some(if take { gauge.sub(delta, lane) } else { gauge.add(delta, lane) });
        match &mut self.trace {
            Some(t) => t.record_after(change, TracedEvent { action, kind, address, bytes, stream, buffer: handle, extra }),
            None => {
                change();
            }
        }
    }

    /// The first try of an allocation for work on the manager's own stream, in the caller's
    /// lane: `None` when the other lanes' free blocks should be tried before this lane grows
    /// (`Manager::alloc_rest` goes on from there).
    pub fn try_alloc_own(&mut self, bytes: u64, kind: MemoryKind) -> Result<Option<u64>> {
        self.try_alloc_in(bytes, kind, self.home, Growth::Defer)
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
        let done = match &self.moves_fence {
            Some(MovesFence::Event(e)) => e.query().unwrap_or(false),
            _ => false,
        };
        self.fence_query_in = if done { None } else { Some(FENCE_QUERY_INTERVAL) };
        !done
    }

    /// Marks the end of a compaction's copies on the stream, for `map` to wait on. The last
    /// fence's event is recorded again unless a `map` still waits on it; without an event, maps
    /// wait for the stream.
    pub(super) fn fence_moves(&mut self) {
        let reusable = match self.moves_fence.take() {
            Some(MovesFence::Event(e)) if Arc::strong_count(&e) == 1 => Some(e),
            _ => None,
        };
        let event = match reusable {
            Some(e) => Ok(e),
            None => self.backend.create_event().map(Arc::from),
        };
        self.moves_fence = Some(match event.and_then(|e| self.stream.record(e.as_ref()).map(|_| e)) {
            Ok(event) => MovesFence::Event(event),
            Err(_) => MovesFence::Stream(self.stream.clone()),
        });
        self.fence_query_in = Some(FENCE_QUERY_INTERVAL);
    }

    /// Frees a buffer once its memory's reuse is ordered after every stream that used it. When
    /// that ordering fails the buffer stays allocated (and the error says why).
    pub fn free(&mut self, handle: u64, force: bool) -> Result<()> {
        let (backend, reuse, home) = (self.backend.as_ref(), &self.reuse, self.home);
        // One lookup: the checks and the ordering run on the record before it is removed.
        let record = self.buffers.remove_if(handle, |record| {
            // Kmm's own pins (another thread's copy, fill or kernel) do not refuse the free:
            // the buffer then waits in `dying` until they end.
            let callers_pins = record.callers_pins();
            if callers_pins > 0 && !force {
                fail!(
                    KMM_ERROR_BUFFER_MAPPED,
                    "buffer {handle:#x} is mapped ({callers_pins} pin(s)); unmap it first or free it with KMM_FREE_FORCE"
                );
            }
            order_reuse(backend, reuse, home, record)
        })?;
        if record.leases > 0 {
            // Its pool block keeps the slot as owner until released: a new buffer in the slot
            // would be taken for the block's owner (a compaction would move the block for it).
            self.buffers.hold_slot(handle);
            self.dying.push((handle, record));
            return Ok(());
        }
        self.release_freed(handle, record)
    }

    /// Gives a freed buffer's memory back and counts it freed.
    fn release_freed(&mut self, handle: u64, record: BufferRecord) -> Result<()> {
        let k = record.kind as usize;
        // A spilled buffer's bytes left the counts of bytes in use when it spilled.
        let resident = if record.is_spilled() { 0 } else { record.bytes };
        self.usage[k].on_free(resident);
        self.change_in_use(true, resident, Action::Free, record.kind, record.addr, record.bytes, self.home, handle, 0);
        match record.origin {
            Origin::Resource(block) => self.resources[k].deallocate(block),
            Origin::Adopted(block) => self.adopted[k].deallocate(block),
            Origin::Spilled(place) => {
                self.spill.give_back(place, record.bytes, true);
                Ok(())
            }
            Origin::Lent { lane, block } => {
                self.return_lent(lane, block, false);
                Ok(())
            }
            Origin::Empty | Origin::Borrowed => Ok(()),
        }
    }

    /// Gives a block lent by `lane` back (its reuse already ordered on the manager's stream): at
    /// once when that lane is not busy, else through its inbox. Never waits for its lock.
    /// `copied_out`: Kmm's own copy out of the block may still be queued (a spill), so a new
    /// buffer there settles (its map waits for the copy), as after a compaction move.
    pub(super) fn return_lent(&self, lane: usize, block: Block, copied_out: bool) {
        let Some(cells) = self.place.cells.upgrade() else {
            return;
        };
        if let Some(mut cell) = cells.lane(lane).try_lock() {
            if let Some(other) = cell.as_mut() {
                if order::take_over(self.backend.as_ref(), &mut other.reuse[0], self.home).is_ok()
                    && other.resources[0].deallocate(block).is_ok()
                {
                    if copied_out {
                        other.fence_moves();
                    }
                    return;
                }
            }
        }
        cells.inbox(lane).lock().push(block);
    }

    /// Takes back the blocks other lanes returned through the inbox while this lane was busy.
    pub(super) fn take_inbox(&mut self) -> Result<()> {
        let Some(cells) = self.place.cells.upgrade() else {
            return Ok(());
        };
        let blocks = std::mem::take(&mut *cells.inbox(self.place.lane).lock());
        if blocks.is_empty() {
            return Ok(());
        }
        let taken = order::take_over(self.backend.as_ref(), &mut self.reuse[0], self.home);
        // A spill's copy out of a block may still be queued: new buffers there settle.
        self.fence_moves();
        for (i, &block) in blocks.iter().enumerate() {
            if let Err(e) = taken.clone().and_then(|_| self.resources[0].deallocate(block)) {
                cells.inbox(self.place.lane).lock().extend_from_slice(&blocks[i..]);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Records that work on the raw `stream` may use the buffer's memory; `None` when the
    /// buffer is spilled (the manager restores it first). A stream the backend refuses is
    /// refused whether or not the buffer is spilled.
    pub fn record_stream(&mut self, handle: u64, stream: u64) -> Result<Option<()>> {
        let record = self.buffers.get_mut(handle)?;
        if stream != self.home {
            self.backend.check_stream(stream)?;
        }
        if record.is_spilled() {
            return Ok(None);
        }
        record.users.insert(stream);
        Ok(Some(()))
    }

    /// Frees a buffer that work on the caller's `stream` (see `order::stream_arg`) may still
    /// use: its reuse waits for that stream too. A spilled buffer's streams were waited for
    /// before its copy out, and no stream can have used it since, so it is freed as it is.
    pub fn free_used_on(&mut self, handle: u64, stream: u64, force: bool) -> Result<()> {
        let stream = self.stream_arg(stream);
        if let Err(e) = self.record_stream(handle, stream) {
            // A stream that has ended (its manager closed) has run its work, or the free's
            // ordering waits for what it still runs (`order_free`): the free of memory last used
            // there goes on, where refusing it would leak the buffer for good. A stream that
            // never was is refused.
            if !self.backend.stream_ended(stream) {
                return Err(e);
            }
            let record = self.buffers.get_mut(handle)?;
            if !record.is_spilled() {
                record.users.insert(stream);
            }
        }
        self.free(handle, force)
    }

    /// The raw stream a caller's `stream` names (see `order::stream_arg`).
    pub fn stream_arg(&self, stream: u64) -> u64 {
        order::stream_arg(stream, self.home, self.backend.kind() == BackendKind::Cuda)
    }

    /// The raw stream a plugin's `stream` names, checked: a plugin buffer's free is ordered after
    /// it, whatever the memory's kind.
    pub fn plugin_stream(&self, stream: u64) -> Result<u64> {
        let stream = self.stream_arg(stream);
        if stream != self.home {
            self.backend.check_stream(stream)?;
        }
        Ok(stream)
    }

    /// The first try of a plugin's allocation under this lane's lock (then
    /// `Manager::alloc_mapped_rest`): a buffer of the lane's free blocks for work on the raw
    /// `stream`, pinned; both under one lock.
    pub(crate) fn try_alloc_mapped(&mut self, bytes: u64, kind: MemoryKind, stream: u64) -> MappedTry {
        match self.try_alloc_in(bytes, kind, stream, Growth::Defer) {
            // A new buffer is resident, so `map` pins it (or fails, and the long way retries).
            Ok(Some(handle)) => match self.map_stamped(handle, false, false) {
                Ok(Some((addr, settle))) => {
                    let settle = settle.map(|fence| Settle { fence, _backend: self.backend.clone() });
                    MappedTry::Mapped { handle, addr, settle }
                }
                _ => MappedTry::Unmapped(Ok(Some(handle))),
            },
            first => MappedTry::Unmapped(first),
        }
    }

    /// Whether the buffer is spilled now, and whether it is marked never to spill.
    pub fn spill_flags(&self, handle: u64) -> Result<(bool, bool)> {
        let r = self.buffers.get(handle)?;
        Ok((r.is_spilled(), r.never_spill))
    }

    /// Whether the buffer is memory allocated elsewhere (`wrap`), which no pool owns.
    pub fn is_wrapped(&self, handle: u64) -> Result<bool> {
        Ok(matches!(self.buffers.get(handle)?.origin, Origin::Borrowed | Origin::Adopted(_)))
    }

    /// (address, bytes, kind, the caller's pins): Kmm's own pins (`leases`) are not counted.
    pub fn buffer_info(&self, handle: u64) -> Result<(u64, u64, MemoryKind, u32)> {
        let r = self.buffers.get(handle)?;
        Ok((r.addr, r.bytes, r.kind, r.callers_pins()))
    }

    /// Pins the buffer; returns its address and, when a compaction's copies that involve it may
    /// still be queued, the fence to wait for (outside the lock) before the address is used
    /// outside the stream. With `own_work`, Kmm queues work on it on the manager's stream.
    /// `None` when the buffer is spilled: the manager restores it first.
    pub(super) fn map(&mut self, handle: u64, own_work: bool) -> Result<Option<(u64, Option<MovesFence>)>> {
        self.map_stamped(handle, own_work, true)
    }

    /// `map`; `new_use`: stamp the map as a use. A buffer allocated under the same hold of the
    /// lane's lock keeps its allocation's stamp instead (one atomic add less on the plugins'
    /// path): no spill candidate list can have seen it between the two.
    fn map_stamped(&mut self, handle: u64, own_work: bool, new_use: bool) -> Result<Option<(u64, Option<MovesFence>)>> {
        let fence = &self.moves_fence;
        let r = self.buffers.get_mut(handle)?;
        if r.is_spilled() {
            return Ok(None);
        }
        if new_use {
            r.last_use = self.spill.tick();
        }
        r.pins = r.pins.checked_add(1).ok_or_else(|| err!(KMM_ERROR_SIZE_OVERFLOW, "buffer {handle:#x} pin count overflow"))?;
        if own_work {
            r.users.insert(self.home);
            r.leases += 1;
        }
        let wait = if r.settling { fence.clone() } else { None };
        if wait.is_none() {
            r.settling = false;
        }
        if let Some(t) = &mut self.trace {
            t.record(Action::Map, r.kind, r.addr, r.bytes, self.home, handle, 0);
        }
        Ok(Some((r.addr, wait)))
    }

    /// After a `map`'s wait for the moves' fence succeeded: the buffer's bytes are in place.
    pub(super) fn settled(&mut self, handle: u64) {
        if let Ok(r) = self.buffers.get_mut(handle) {
            r.settling = false;
        }
    }

    pub fn unmap(&mut self, handle: u64) -> Result<()> {
        let r = self.buffers.get_mut(handle)?;
        // Kmm's own pins are not the caller's to end.
        if r.pins <= r.leases {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "buffer {handle:#x} is not mapped");
        }
        r.pins -= 1;
        if let Some(t) = &mut self.trace {
            t.record(Action::Unmap, r.kind, r.addr, r.bytes, self.home, handle, 0);
        }
        Ok(())
    }

    /// Ends a pin of Kmm's own (`BufferRecord::leases`): a kernel argument's map (`traced`: an
    /// unmap row, as its map made a map row), or a copy's lease, unrecorded (a trace's maps and
    /// unmaps are the callers'). A buffer freed meanwhile is released when its last one ends.
    pub(super) fn end_lease(&mut self, handle: u64, traced: bool) -> Result<()> {
        let record = match self.buffers.get_mut(handle) {
            Ok(r) => r,
            Err(e) => match self.dying.iter_mut().find(|(h, _)| *h == handle) {
                Some((_, r)) => r,
                None => return Err(e),
            },
        };
        if record.leases == 0 || record.pins == 0 {
            fail!(KMM_ERROR_INTERNAL, "buffer {handle:#x} has no lease to end");
        }
        record.leases -= 1;
        record.pins -= 1;
        if let (true, Some(t)) = (traced, &mut self.trace) {
            t.record(Action::Unmap, record.kind, record.addr, record.bytes, self.home, handle, 0);
        }
        if record.leases == 0 {
            if let Some(at) = self.dying.iter().position(|(h, _)| *h == handle) {
                let (_, record) = self.dying.swap_remove(at);
                self.buffers.release_slot(handle);
                // Ordered again: the lease's work was queued after the free's ordering.
                order_reuse(self.backend.as_ref(), &self.reuse, self.home, &record)?;
                return self.release_freed(handle, record);
            }
        }
        Ok(())
    }
}

/// Orders the reuse of a freed buffer's memory after the streams that may still use it.
fn order_reuse(backend: &dyn Backend, reuse: &[Reuse; 2], home: u64, record: &BufferRecord) -> Result<()> {
    let on = match record.origin {
        // A spilled buffer's streams were waited for before its copy out.
        Origin::Empty | Origin::Spilled(_) => return Ok(()),
        Origin::Resource(_) => reuse[record.kind as usize].free_stream(home),
        // The lending lane's pool takes it back ordered on the manager's stream.
        Origin::Lent { .. } => home,
        // Kmm's adopted memory goes back once the manager's stream passed the free, and a
        // borrowed buffer's owner waits for that stream (`kmm_buffer_wrap`).
        Origin::Adopted(_) | Origin::Borrowed => home,
    };
    order::order_free(backend, on, &record.users)
}

impl BufferRecord {
    pub(super) fn new(kind: MemoryKind, addr: u64, bytes: u64, origin: Origin, users: StreamSet) -> Self {
        BufferRecord { kind, addr, bytes, origin, pins: 0, leases: 0, users, settling: false, last_use: 0, never_spill: false }
    }
}
