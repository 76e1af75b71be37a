//! The spill store: the host memory spilled buffers live in (a pinned pool while the pinned
//! upstream and limit have room, pageable memory after it) and the counts of what is spilled.
//! Which buffers go and when is `spill.rs`'s job; this file only hands out, takes back and
//! counts host places. Its lock is a leaf: taken under a lane's lock, never the other way round.

use crate::backend::{Backend, Stream};
use crate::error::{lock, KmmStatus, Result};
use crate::fail;
use crate::pool::deferred::Deferred;
use crate::pool::direct::DirectResource;
use crate::pool::pooled::PoolResource;
use crate::pool::upstream::PageableUpstream;
use crate::pool::{new_suballocator, Block, MemoryResource, Owner, Relocation, Relocator, SuballocatorKind, Upstream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Where a spilled buffer's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HostPlace {
    pub block: Block,
    pub pinned: bool,
}

/// What spilling did, for the manager's device stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpillStats {
    /// Bytes of buffers on the host now, and the most there have been.
    pub spilled_bytes: u64,
    pub peak_spilled_bytes: u64,
    /// Of `spilled_bytes`, those in pageable memory (the pinned pool was full).
    pub pageable_bytes: u64,
    /// Buffers on the host now.
    pub buffers: u64,
    /// Buffers moved out, and back in.
    pub spills: u64,
    pub restores: u64,
    /// Bytes copied out, and back in.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Host time spent spilling and restoring: choosing buffers, queuing the copies, and waiting
    /// for copies out before their device memory is given back.
    pub time_ns: u64,
}

struct Store {
    pinned: Deferred<PoolResource>,
    pageable: Deferred<DirectResource>,
    /// Bytes of the host places handed out, spills in progress included: what the spill limit
    /// counts. The stats count a spill only once it is made.
    taken: u64,
    stats: SpillStats,
}

impl Store {
    /// Pageable host memory for `bytes`; `None` when the host has none.
    fn pageable_place(&mut self, bytes: u64) -> Result<Option<HostPlace>> {
        match self.pageable.allocate(bytes, crate::pool::NO_OWNER, &mut NoMoves { grow: true }) {
            Ok(block) => Ok(Some(HostPlace { block, pinned: false })),
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A manager's spill: its host store and the clock that orders buffers by their last use. Every
/// lane holds it (frees of spilled buffers give their host memory back).
pub(super) struct Spill {
    /// Most bytes of buffers on the host; 0: never spill.
    pub limit: u64,
    store: Mutex<Store>,
    /// Bumped by every use; a buffer remembers the value at its last one.
    clock: AtomicU64,
}

/// Allocations from the store never move anything; they grow the pool only when `grow` says so.
struct NoMoves {
    grow: bool,
}

/// Pinned places given back (each its own batch) whose copies in may still be queued before a
/// spill waits for the oldest rather than growing the pinned pool: two keep the copies in
/// flight back to back, and a new pinned chunk costs more than the wait.
const PINNED_IN_FLIGHT: usize = 2;

impl Relocator for NoMoves {
    fn may_grow(&mut self, _size: u64, _reserved: u64) -> bool {
        self.grow
    }
    fn movable(&mut self, _owner: Owner) -> bool {
        false
    }
    fn relocate(&mut self, r: &Relocation) -> Result<()> {
        fail!(KMM_ERROR_INTERNAL, "the spill store was asked to move block {:#x}", r.from.addr)
    }
}

impl Spill {
    pub fn new(limit: u64, pinned_upstream: Arc<dyn Upstream>, pinned_chunk: u64, backend: Arc<dyn Backend>, stream: Arc<dyn Stream>) -> Spill {
        let pool = PoolResource::new(pinned_upstream, new_suballocator(SuballocatorKind::Binned, 4096, 0), pinned_chunk, 4096);
        let pageable = DirectResource::new(Arc::new(PageableUpstream), 4096);
        let store = Store {
            pinned: Deferred::new(pool, backend.clone(), stream.clone()),
            pageable: Deferred::new(pageable, backend, stream),
            taken: 0,
            stats: SpillStats::default(),
        };
        Spill { limit, store: Mutex::new(store), clock: AtomicU64::new(1) }
    }

    /// A use now: the stamp a buffer keeps until its next one (newer than every stamp before,
    /// allocations' included, so a use after an allocation changes the buffer's stamp).
    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The stamp of an allocation: no newer than the uses after it (a read, not a write, on the
    /// allocation path).
    pub fn now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Bytes of the host places handed out now (what the limit bounds).
    pub(super) fn taken(&self) -> u64 {
        lock(&self.store).taken
    }

    /// Host memory for `bytes` of a buffer about to spill, counted against the limit plus
    /// `headroom`; `None` when it would pass them or the host has none.
    pub(super) fn take(&self, bytes: u64, headroom: u64) -> Result<Option<HostPlace>> {
        let mut store = lock(&self.store);
        if store.taken.checked_add(bytes).map_or(true, |total| total > self.limit.saturating_add(headroom)) {
            return Ok(None);
        }
        // Pinned memory that restores gave back comes back as the stream passes their copies:
        // with enough of it in flight, wait for the oldest rather than grow.
        let mut pinned = store.pinned.allocate(bytes, crate::pool::NO_OWNER, &mut NoMoves { grow: false });
        if pinned.is_err() {
            if let (n, Some(fence)) = store.pinned.oldest_pending() {
                if n >= PINNED_IN_FLIGHT {
                    drop(store);
                    fence.synchronize()?;
                    store = lock(&self.store);
                    if store.taken.saturating_add(bytes) > self.limit.saturating_add(headroom) {
                        return Ok(None);
                    }
                    pinned = store.pinned.allocate(bytes, crate::pool::NO_OWNER, &mut NoMoves { grow: false });
                }
            }
        }
        if pinned.is_err() {
            pinned = store.pinned.allocate(bytes, crate::pool::NO_OWNER, &mut NoMoves { grow: true });
        }
        let place = match pinned {
            Ok(block) => HostPlace { block, pinned: true },
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => match store.pageable_place(bytes)? {
                Some(place) => place,
                None => return Ok(None),
            },
            Err(e) => return Err(e),
        };
        // The stats count the spill when it is made (`made`), not a place taken in vain.
        store.taken += bytes;
        Ok(Some(place))
    }

    /// A buffer of `bytes` spilled into `place` (from `take`).
    pub(super) fn made(&self, place: HostPlace, bytes: u64) {
        let s = &mut lock(&self.store).stats;
        s.spills += 1;
        s.buffers += 1;
        s.bytes_out += bytes;
        s.spilled_bytes += bytes;
        if !place.pinned {
            s.pageable_bytes += bytes;
        }
        s.peak_spilled_bytes = s.peak_spilled_bytes.max(s.spilled_bytes);
    }

    /// Pageable memory for `bytes` of a spilled buffer leaving pinned memory (`unpin_spilled`);
    /// `None` when the host has none. Not counted: the buffer's bytes stay counted as spilled
    /// throughout (a move is no new spill, so the limit is not asked either).
    pub(super) fn take_pageable(&self, bytes: u64) -> Result<Option<HostPlace>> {
        lock(&self.store).pageable_place(bytes)
    }

    /// A place `take_pageable` gave for a move that did not happen (the buffer was restored,
    /// freed or spilled anew meanwhile): nothing was copied into it, nothing was counted.
    pub(super) fn untake_pageable(&self, place: HostPlace) {
        let _ = lock(&self.store).pageable.deallocate(place.block);
    }

    /// `bytes` of a spilled buffer moved from pinned `from` to pageable memory: they count as
    /// pageable from now on, and the pinned block goes back, reused once the stream passes the
    /// work queued so far (as every block of the store).
    pub(super) fn moved_to_pageable(&self, from: HostPlace, bytes: u64) {
        let mut store = lock(&self.store);
        // Deferred: never fails, never loses the block.
        let _ = store.pinned.deallocate(from.block);
        store.stats.pageable_bytes += bytes;
    }

    /// Gives back the host memory of `bytes` of a spilled buffer that was restored or freed
    /// (`spilled`), or of a place `take` gave for a spill not made after all: reused once the
    /// manager's stream has passed the work queued so far.
    pub fn give_back(&self, place: HostPlace, bytes: u64, spilled: bool) {
        let mut store = lock(&self.store);
        // Deferred: never fails, never loses the block.
        let _ = if place.pinned { store.pinned.deallocate(place.block) } else { store.pageable.deallocate(place.block) };
        store.taken -= bytes;
        if spilled {
            let s = &mut store.stats;
            s.spilled_bytes -= bytes;
            s.buffers -= 1;
            if !place.pinned {
                s.pageable_bytes -= bytes;
            }
        }
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut SpillStats)) {
        f(&mut lock(&self.store).stats)
    }

    pub fn stats(&self) -> SpillStats {
        lock(&self.store).stats
    }

    /// Pinned bytes the store holds of its upstream (and counts against the pinned limit).
    pub fn pinned_reserved(&self) -> u64 {
        lock(&self.store).pinned.counters().reserved
    }

    pub fn reset_peak(&self) {
        let s = &mut lock(&self.store).stats;
        s.peak_spilled_bytes = s.spilled_bytes;
    }

    /// Gives the store's free pinned chunks back (pageable memory goes back as it is freed),
    /// once the work that used them has run; the wait holds no lock.
    pub fn release(&self, upstream: &dyn Upstream) -> Result<()> {
        let fences: Vec<_> = {
            let store = lock(&self.store);
            store.pinned.pending_fence().into_iter().chain(store.pageable.pending_fence()).collect()
        };
        for fence in fences {
            fence.synchronize()?;
        }
        let chunks = {
            let mut store = lock(&self.store);
            store.pageable.detach_free(0)?;
            store.pinned.detach_free(0)?
        };
        for (base, size) in chunks {
            // SAFETY: out of the store's pool, which reclaims a block only once the stream has
            // passed its free.
            unsafe { upstream.deallocate(base, size)? };
        }
        Ok(())
    }
}
