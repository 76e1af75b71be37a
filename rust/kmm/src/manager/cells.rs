//! Where a manager's lanes live. A pool-mode manager's state is split into lanes, each behind its
//! own lock and on its own cache lines: every thread is dealt a lane at its first call, its
//! device allocations go to that lane, and a buffer's handle names the lane that holds it.
//! Threads sharing one manager then seldom touch the same lock or the same memory; one thread
//! alone uses one lane.
//!
//! The cells are shared (`Arc`) so that their owner need not be the manager: the C ABI's registry
//! keeps one set per slot and reaches a lane through it without touching the manager at all. A
//! lane the manager uses holds `Some` from the manager's creation until the end of its teardown,
//! which takes the states out; the cells may then serve a later manager.

use super::handles::{History, LANE_BITS};
use super::{AllocMode, MemoryKind, State};
use crate::error::Result;
use crate::fail;
use crate::pool::upstream::PendingFrees;
use crate::pool::Block;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Lanes of a pool-mode manager (other modes use one: the driver's allocators lock anyway).
pub const LANES: usize = 1 << LANE_BITS;

/// A lane's state; the blocks of its pool that other lanes' buffers held (see `lane`'s
/// `Origin::Lent`) and gave back while it was busy: it takes them back at its next release; and
/// the generations its last manager's buffer and event tables left, for the next manager's.
#[repr(align(64))]
struct Lane(parking_lot::Mutex<Option<State>>, parking_lot::Mutex<Vec<Block>>, parking_lot::Mutex<[History; 2]>);

/// The lane cells of one manager at a time. The lanes sit inline, one pointer hop from an
/// `Arc<LaneCells>` (as from the boxed slice the registry's slots once held); the mask sits on
/// its own cache line ahead of them (the lanes are 64-byte aligned), apart from the `Arc`'s
/// counts too, and is written once per manager, so reading it never contends with the lanes.
/// Crate-private: only a manager's constructor (`Manager::new`, or `with_cells` for the
/// registry) fills cells, and only its teardown empties them.
pub(crate) struct LaneCells {
    /// The lanes the current manager uses, minus one: 0 or `LANES - 1`.
    lane_mask: AtomicUsize,
    /// Whether the manager's queues of upstream frees may hold a block (`PendingFrees`): on the
    /// mask's cache line, which every call reads, so the allocation path's check is one load.
    frees_pending: AtomicBool,
    lanes: [Lane; LANES],
}

impl LaneCells {
    /// Empty cells: no lane holds a state yet.
    pub(crate) fn new() -> LaneCells {
        LaneCells {
            lane_mask: AtomicUsize::new(0),
            frees_pending: AtomicBool::new(false),
            lanes: std::array::from_fn(|_| {
                Lane(parking_lot::Mutex::new(None), parking_lot::Mutex::new(Vec::new()), parking_lot::Mutex::new(Default::default()))
            }),
        }
    }

    /// The cell of `lane` (below `LANES`).
    pub(crate) fn lane(&self, lane: usize) -> &parking_lot::Mutex<Option<State>> {
        &self.lanes[lane].0
    }

    /// The blocks given back to `lane`'s pool by other lanes while it was busy.
    pub(super) fn inbox(&self, lane: usize) -> &parking_lot::Mutex<Vec<Block>> {
        &self.lanes[lane].1
    }

    /// The buffer and event tables' generations the last manager in these cells left in `lane`:
    /// a new manager's tables go on from them, so no handle of an earlier manager of the same
    /// owner id (the registry's slot) is issued again. A copy: a manager that fails to be made
    /// leaves them for the next.
    pub(super) fn history(&self, lane: usize) -> [History; 2] {
        self.lanes[lane].2.lock().clone()
    }

    /// Puts a new manager's lane states in (`states[i]` into lane i) and sets its lane mask. All
    /// lanes are locked at once, in order (nothing else waits for a second lane while holding
    /// one), so cells that another manager still uses are refused, never overwritten.
    pub(super) fn occupy(&self, lane_mask: usize, states: Vec<State>) -> Result<()> {
        let mut cells: Vec<_> = self.lanes.iter().map(|lane| lane.0.lock()).collect();
        if cells.iter().any(|cell| cell.is_some()) {
            fail!(KMM_ERROR_INTERNAL, "the lane cells lent to a new manager hold another manager's state");
        }
        self.lane_mask.store(lane_mask, Ordering::Relaxed);
        self.frees_pending.store(false, Ordering::Relaxed);
        for (cell, state) in cells.iter_mut().zip(states) {
            **cell = Some(state);
        }
        Ok(())
    }

    /// Takes every state out, ending the manager's use of the cells: the last step of its
    /// teardown. Each state is dropped with its lane unlocked (its resources' drop gives memory
    /// back upstream).
    pub(super) fn vacate(&self) {
        for lane in self.lanes.iter() {
            let mut state = lane.0.lock().take();
            if let Some(st) = state.as_mut() {
                let mut history = lane.2.lock();
                // Dropped first: the tables then update the history they share in place.
                *history = Default::default();
                *history = [st.buffers.take_history(), st.events.take_history()];
            }
            // Blocks of the pool dropped with the state.
            lane.1.lock().clear();
            drop(state);
        }
    }

    /// The lanes the current manager uses, minus one. Relaxed: a reader that needs the manager
    /// to be live checks that under the lane's lock (the registry's generation), and a stale
    /// mask only picks another lane of the same cells.
    pub(crate) fn lane_mask(&self) -> usize {
        self.lane_mask.load(Ordering::Relaxed)
    }

    /// Whether the manager's queues of upstream frees may hold a block (read after an allocation,
    /// to flush them once no lock is held).
    pub(crate) fn frees_pending(&self) -> bool {
        self.frees_pending.load(Ordering::Acquire)
    }

    /// Whether no lane holds a state: no manager uses the cells, or its teardown has ended.
    pub(crate) fn is_vacant(&self) -> bool {
        self.lanes.iter().all(|lane| lane.0.lock().is_none())
    }
}

impl PendingFrees for LaneCells {
    fn raise(&self) {
        self.frees_pending.store(true, Ordering::Release);
    }
    fn take(&self) -> bool {
        // A load first: the swap would write the cache line every call of every thread reads.
        self.frees_pending.load(Ordering::Acquire) && self.frees_pending.swap(false, Ordering::AcqRel)
    }
}

/// The calling thread's lane: threads are dealt lanes in turn at their first call.
pub fn thread_lane() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static LANE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % LANES;
    }
    LANE.with(|lane| *lane)
}

/// The lanes, minus one, of a manager in `mode`.
pub fn lane_mask_for(mode: AllocMode) -> usize {
    if mode == AllocMode::Pool {
        LANES - 1
    } else {
        0
    }
}

/// The lanes, minus one, that hold buffers of `kind`: pinned memory stays in lane 0, whose
/// pinned pool is the only one that reserves chunks.
pub fn kind_lane_mask(kind: MemoryKind, lane_mask: usize) -> usize {
    match kind {
        MemoryKind::Device => lane_mask,
        MemoryKind::Pinned => 0,
    }
}

/// The lane a new buffer of `kind` goes to.
pub fn alloc_lane(kind: MemoryKind, lane_mask: usize) -> usize {
    thread_lane() & kind_lane_mask(kind, lane_mask)
}
