//! The process-wide table of live managers. A manager handle names a slot and a generation;
//! calls hold the slot's read lock while they run, so destroying a manager waits for calls in
//! flight and every later call sees `KMM_ERROR_INVALID_HANDLE`. Slots sit on separate cache
//! lines so threads with managers of their own never contend.
//!
//! A manager's bookkeeping (`State`) lives in its slot, not in the manager: the calls that need
//! nothing else (allocate, free, map, unmap) lock it directly through `with_alloc_state` and
//! `with_buffer_state`, one lock instead of the slot's read lock plus the manager's. The slot's
//! generation, checked under that lock, turns them away once the manager is destroyed; the slot
//! is reused only after the manager's teardown has taken its state out.
//!
//! A pool-mode manager's state is split into lanes, each behind its own lock and on its own
//! cache lines: every thread is dealt a lane at its first call, its device allocations go to
//! that lane, and a buffer's handle names the lane that holds it. Threads sharing one manager
//! then seldom touch the same lock or the same memory; one thread alone uses one lane.

use super::handles::{lane_of, LANE_BITS, TAG_MANAGER};
use super::{AllocMode, Manager, MemoryKind, State};
use crate::error::{lock, Result};
use crate::fail;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub const MAX_MANAGERS: usize = 4096;
/// Lanes of a pool-mode manager (other modes use one: the driver's allocators lock anyway).
pub const LANES: usize = 1 << LANE_BITS;

#[repr(align(64))]
struct Lane(parking_lot::Mutex<Option<State>>);

#[repr(align(64))]
struct Slot {
    generation: AtomicU32,
    /// The lanes the slot's manager uses, minus one: 0 or `LANES - 1`.
    lane_mask: AtomicUsize,
    manager: RwLock<Option<Arc<Manager>>>,
    /// Made at the slot's first use and kept for the managers that reuse it. A lane the manager
    /// uses holds Some from the manager's creation until the end of its teardown.
    lanes: OnceLock<Box<[Lane]>>,
}

impl Slot {
    fn lane(&self, lane: usize) -> &parking_lot::Mutex<Option<State>> {
        &self.lanes.get_or_init(|| (0..LANES).map(|_| Lane(parking_lot::Mutex::new(None))).collect())[lane].0
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

struct Registry {
    slots: Box<[Slot]>,
    free: Mutex<Vec<u16>>,
    serial: AtomicU64,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        slots: (0..MAX_MANAGERS)
            .map(|_| Slot { generation: AtomicU32::new(1), lane_mask: AtomicUsize::new(0), manager: RwLock::new(None), lanes: OnceLock::new() })
            .collect(),
        free: Mutex::new((0..MAX_MANAGERS as u16).rev().collect()),
        serial: AtomicU64::new(1),
    })
}

fn encode(slot: u16, generation: u32) -> u64 {
    (TAG_MANAGER << 60) | ((generation as u64) << 12) | slot as u64
}

/// Creates a manager in a free slot; `make` receives the slot and a serial number.
pub fn register(make: impl FnOnce(u16, u64) -> Result<Manager>) -> Result<u64> {
    let reg = registry();
    let Some(slot) = lock(&reg.free).pop() else {
        fail!(KMM_ERROR_OUT_OF_MEMORY, "more than {MAX_MANAGERS} managers are alive at once");
    };
    let serial = reg.serial.fetch_add(1, Ordering::Relaxed);
    let manager = match make(slot, serial) {
        Ok(m) => m,
        Err(e) => {
            lock(&reg.free).push(slot);
            return Err(e);
        }
    };
    let cell = &reg.slots[slot as usize];
    let mut guard = cell.manager.write().unwrap_or_else(|e| e.into_inner());
    *guard = Some(Arc::new(manager));
    Ok(encode(slot, cell.generation.load(Ordering::Acquire)))
}

fn decode(handle: u64) -> Result<(&'static Slot, u32)> {
    if handle >> 60 != TAG_MANAGER || (handle >> 44) & 0xFFFF != 0 {
        fail!(KMM_ERROR_INVALID_HANDLE, "{handle:#x} is not a manager handle");
    }
    let slot = (handle & 0xFFF) as usize;
    Ok((&registry().slots[slot], (handle >> 12) as u32))
}

/// Where the manager in `slot` keeps the state of `lane` (`Manager::new` puts it there, the
/// manager's teardown takes it out and then gives the slot back with `release_slot`).
pub(super) fn state_cell(slot: u16, lane: usize) -> &'static parking_lot::Mutex<Option<State>> {
    registry().slots[slot as usize].lane(lane)
}

/// Set by `Manager::new` before its handle exists.
pub(super) fn set_lane_mask(slot: u16, mask: usize) {
    registry().slots[slot as usize].lane_mask.store(mask, Ordering::Relaxed);
}

/// Runs `f` on the lane of the live manager `handle` names where a new buffer of `kind` goes,
/// under that lane's lock only.
pub fn with_alloc_state<R>(handle: u64, kind: MemoryKind, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    with_lane(handle, |mask| alloc_lane(kind, mask), f)
}

/// Runs `f` on the lane of the manager `handle` names that holds `buffer`, by the lane bits of
/// its handle (any lane for a forged one, whose table then turns it away).
pub fn with_buffer_state<R>(handle: u64, buffer: u64, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    with_lane(handle, |mask| lane_of(buffer) & mask, f)
}

fn with_lane<R>(handle: u64, lane: impl FnOnce(usize) -> usize, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    let (cell, generation) = decode(handle)?;
    let mut state = cell.lane(lane(cell.lane_mask.load(Ordering::Relaxed))).lock();
    match state.as_mut() {
        Some(st) if cell.generation.load(Ordering::Acquire) == generation => f(st),
        _ => fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)"),
    }
}

/// Makes the slot of a torn-down manager available again.
pub(super) fn release_slot(slot: u16) {
    lock(&registry().free).insert(0, slot);
}

/// Runs `f` on the live manager `handle` names.
pub fn with_manager<R>(handle: u64, f: impl FnOnce(&Manager) -> Result<R>) -> Result<R> {
    let (cell, generation) = decode(handle)?;
    let guard = cell.manager.read().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(m) if cell.generation.load(Ordering::Acquire) == generation => f(m),
        _ => fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)"),
    }
}

/// Runs `f` on two live managers (the same one twice when the handles are equal). Their slots'
/// locks are taken in slot order, so calls on the same pair in both directions and destroys of
/// either cannot deadlock; two handles of one slot that differ name one dead manager, which is
/// turned away before any lock is taken twice.
pub fn with_two_managers<R>(a: u64, b: u64, f: impl FnOnce(&Manager, &Manager) -> Result<R>) -> Result<R> {
    if a == b {
        return with_manager(a, |m| f(m, m));
    }
    let ((slot_a, _), (slot_b, _)) = (decode(a)?, decode(b)?);
    if std::ptr::eq(slot_a, slot_b) {
        let stale = if with_manager(a, |_| Ok(())).is_err() { a } else { b };
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {stale:#x} is not live (destroyed or never created)");
    }
    if (a & 0xFFF) < (b & 0xFFF) {
        with_manager(a, |ma| with_manager(b, |mb| f(ma, mb)))
    } else {
        with_manager(b, |mb| with_manager(a, |ma| f(ma, mb)))
    }
}

/// Takes the manager out of the registry; later calls with its handle fail. Its slot is reused
/// once its teardown (the drop of the last `Arc`) has ended.
pub fn unregister(handle: u64) -> Result<Arc<Manager>> {
    let (cell, generation) = decode(handle)?;
    let mut guard = cell.manager.write().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() || cell.generation.load(Ordering::Acquire) != generation {
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");
    }
    cell.generation.store(generation.wrapping_add(1).max(1), Ordering::Release);
    Ok(guard.take().expect("checked live"))
}
