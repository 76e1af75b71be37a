//! The C ABI's table of live managers. A manager handle names a slot and a generation; calls
//! hold the slot's read lock while they run, so destroying a manager waits for calls in flight
//! and every later call sees `KMM_ERROR_INVALID_HANDLE`. Slots sit on separate cache lines so
//! threads with managers of their own never contend. The Rust API needs none of this: a
//! `Manager` made with `Manager::new` is an ordinary value.
//!
//! Each slot keeps one set of lane cells (`LaneCells`) for good, made at the slot's first use and
//! lent to every manager made in it (`Manager::with_cells`). The calls that need nothing but a
//! lane's state (allocate, free, map, unmap) lock that lane through the slot's own `Arc`, in
//! `with_alloc_state` and `with_buffer_state`: one lock, no reference count touched, instead of
//! the slot's read lock plus the lane's. The slot's generation, checked under the lane's lock,
//! turns them away once the manager is destroyed.
//!
//! The slot holds its manager as an `Arc<Registered>`; the drop of the last one tears the
//! manager down (taking its states out of the cells) and only then gives the slot back, so a
//! later manager of the slot never finds its predecessor's states in the cells.

use crate::error::{lock, Result};
use crate::fail;
use crate::manager::cells::{alloc_lane, LaneCells};
use crate::manager::handles::{lane_of, next_serial, TAG_MANAGER};
use crate::manager::{Config, Manager, MemoryKind, State};
use std::ops::Deref;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub const MAX_MANAGERS: usize = 4096;

#[repr(align(64))]
struct Slot {
    generation: AtomicU32,
    manager: RwLock<Option<Arc<Registered>>>,
    /// Made at the slot's first use and kept for the managers that reuse it. A lane the manager
    /// uses holds Some from the manager's creation until the end of its teardown.
    lanes: OnceLock<Arc<LaneCells>>,
}

/// A manager as its slot holds it. Fields drop in declaration order: the manager's teardown,
/// which takes its states out of the slot's cells, ends before the lease gives the slot back.
/// Nothing else holds the manager: `with_manager` lends it for the call under the slot's read
/// lock, and `unregister` hands the slot's `Arc` to the destroy, which drops it.
pub struct Registered {
    manager: Manager,
    _slot: SlotLease,
}

impl Deref for Registered {
    type Target = Manager;
    fn deref(&self) -> &Manager {
        &self.manager
    }
}

/// Gives its slot back when dropped, once the slot's cells hold no state. A teardown that
/// panicked midway may have left states there: the slot is then never reused (a leaked slot,
/// where reusing it would hand a new manager cells that are not empty).
struct SlotLease(u16);

impl Drop for SlotLease {
    fn drop(&mut self) {
        let reg = registry();
        if reg.slots[self.0 as usize].lanes.get().is_some_and(|lanes| lanes.is_vacant()) {
            lock(&reg.free).insert(0, self.0);
        }
    }
}

struct Registry {
    slots: Box<[Slot]>,
    free: Mutex<Vec<u16>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        slots: (0..MAX_MANAGERS)
            .map(|_| Slot { generation: AtomicU32::new(1), manager: RwLock::new(None), lanes: OnceLock::new() })
            .collect(),
        free: Mutex::new((0..MAX_MANAGERS as u16).rev().collect()),
    })
}

fn encode(slot: u16, generation: u32) -> u64 {
    (TAG_MANAGER << 60) | ((generation as u64) << 12) | slot as u64
}

/// Managers alive in this process: created and not yet torn down (a deferred teardown still
/// running counts).
pub fn live_managers() -> usize {
    let reg = registry();
    reg.slots.len() - lock(&reg.free).len()
}

/// Creates a manager with `config` in a free slot, its lanes in the slot's cells.
pub fn register(config: Config) -> Result<u64> {
    let reg = registry();
    let Some(slot) = lock(&reg.free).pop() else {
        fail!(KMM_ERROR_OUT_OF_MEMORY, "more than {MAX_MANAGERS} managers are alive at once");
    };
    let cell = &reg.slots[slot as usize];
    let lanes = cell.lanes.get_or_init(|| Arc::new(LaneCells::new())).clone();
    let manager = match Manager::with_cells(config, lanes, slot, next_serial()) {
        Ok(m) => m,
        Err(e) => {
            // A manager that fails to be made puts nothing in the cells.
            lock(&reg.free).push(slot);
            return Err(e);
        }
    };
    let mut guard = cell.manager.write().unwrap_or_else(|e| e.into_inner());
    *guard = Some(Arc::new(Registered { manager, _slot: SlotLease(slot) }));
    Ok(encode(slot, cell.generation.load(Ordering::Acquire)))
}

/// As `decode`, turning away a handle whose manager is destroyed before any lock is taken: a
/// deferred destroy's teardown thread may be waiting for the slot's write lock behind calls in
/// flight, and a call with the dead handle would queue behind it. (Checked again under the lock.)
fn decode_live(handle: u64) -> Result<(&'static Slot, u32)> {
    let (cell, generation) = decode(handle)?;
    if cell.generation.load(Ordering::Acquire) != generation {
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");
    }
    Ok((cell, generation))
}

fn decode(handle: u64) -> Result<(&'static Slot, u32)> {
    if handle >> 60 != TAG_MANAGER || (handle >> 44) & 0xFFFF != 0 {
        fail!(KMM_ERROR_INVALID_HANDLE, "{handle:#x} is not a manager handle");
    }
    let slot = (handle & 0xFFF) as usize;
    Ok((&registry().slots[slot], (handle >> 12) as u32))
}

/// Runs `f` on the lane of the live manager `handle` names where a new buffer of `kind` goes,
/// under that lane's lock only; with its result, whether the manager's queues of upstream frees
/// may hold a block (read once the lock is dropped, for the caller to flush them).
pub fn with_alloc_state<R>(handle: u64, kind: MemoryKind, f: impl FnOnce(&mut State) -> Result<R>) -> Result<(R, bool)> {
    let r = with_lane(handle, |mask| alloc_lane(kind, mask), f)?;
    // Read through the slot again rather than returned by `with_lane`: returning the cells from
    // it cost about 3 ns per allocation (trace S, host backend, four alternations).
    let pending = registry().slots[(handle & 0xFFF) as usize].lanes.get().is_some_and(|lanes| lanes.frees_pending());
    Ok((r, pending))
}

/// Runs `f` on the lane of the manager `handle` names that holds `buffer`, by the lane bits of
/// its handle (any lane for a forged one, whose table then turns it away).
pub fn with_buffer_state<R>(handle: u64, buffer: u64, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    with_lane(handle, |mask| lane_of(buffer) & mask, f)
}

fn with_lane<R>(handle: u64, lane: impl FnOnce(usize) -> usize, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    let (cell, generation) = decode(handle)?;
    // A slot never used has no cells, and no manager.
    let Some(lanes) = cell.lanes.get() else {
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");
    };
    let mut state = lanes.lane(lane(lanes.lane_mask())).lock();
    match state.as_mut() {
        Some(st) if cell.generation.load(Ordering::Acquire) == generation => f(st),
        _ => fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)"),
    }
}

/// Whether `handle` names a live manager (not yet destroyed). Racy by itself: callers order it
/// with what the destroy does after `unregister` (see `by_address`).
pub fn is_live(handle: u64) -> bool {
    decode(handle).is_ok_and(|(cell, generation)| cell.generation.load(Ordering::Acquire) == generation)
}

/// Runs `f` on the live manager `handle` names.
pub fn with_manager<R>(handle: u64, f: impl FnOnce(&Manager) -> Result<R>) -> Result<R> {
    let (cell, generation) = decode_live(handle)?;
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

/// Takes the manager out of the registry; later calls with its handle fail. Waits for the calls
/// in flight on it (the slot's write lock). Its slot is reused once its teardown (the drop of the
/// returned `Arc`, the last one) has ended.
pub fn unregister(handle: u64) -> Result<Arc<Registered>> {
    let (cell, generation) = decode_live(handle)?;
    let mut guard = cell.manager.write().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");
    }
    end_generation(cell, handle, generation)?;
    Ok(guard.take().expect("checked live"))
}

/// For a deferred destroy, which must not wait for the calls in flight (one may be waiting for
/// the device): ends the handle at once, under the slot's read lock beside those calls, and
/// runs `last` on the manager there. The returned `Retired` hands the manager over later (on
/// the teardown thread), once those calls have returned.
pub fn retire(handle: u64, last: impl FnOnce(&Manager)) -> Result<Retired> {
    let (cell, generation) = decode_live(handle)?;
    let guard = cell.manager.read().unwrap_or_else(|e| e.into_inner());
    let Some(m) = guard.as_ref() else {
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");
    };
    end_generation(cell, handle, generation)?;
    last(m);
    Ok(Retired(Some(cell)))
}

/// A manager whose handle has ended and whose slot still holds it (see `retire`). Dropped
/// without `take` (its teardown thread could not start), it tears the manager down in place.
pub struct Retired(Option<&'static Slot>);

impl Retired {
    /// Waits for the calls that were in flight when the handle ended and takes the manager out
    /// of its slot; the slot is not reused before the drop of what this returns.
    pub fn take(mut self) -> Arc<Registered> {
        self.take_out().expect("a retired slot keeps its manager")
    }

    fn take_out(&mut self) -> Option<Arc<Registered>> {
        let slot = self.0.take()?;
        let manager = slot.manager.write().unwrap_or_else(|e| e.into_inner()).take();
        manager
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        drop(self.take_out());
    }
}

/// Moves the slot past `generation`, once: of two destroys of one handle (one of them deferred,
/// under the read lock only) one ends it, the other is turned away.
fn end_generation(cell: &Slot, handle: u64, generation: u32) -> Result<()> {
    let next = generation.wrapping_add(1).max(1);
    if cell.generation.compare_exchange(generation, next, Ordering::AcqRel, Ordering::Acquire).is_err() {
        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");
    }
    Ok(())
}
