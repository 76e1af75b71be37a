//! The process-wide table of live managers. A manager handle names a slot and a generation;
//! calls hold the slot's read lock while they run, so destroying a manager waits for calls in
//! flight and every later call sees `KMM_ERROR_INVALID_HANDLE`. Slots sit on separate cache
//! lines so threads with managers of their own never contend.
//!
//! A manager's bookkeeping (`State`) lives in its slot, not in the manager: the calls that need
//! nothing else (allocate, free, map, unmap) lock it directly through `with_state`, one lock
//! instead of the slot's read lock plus the manager's. The slot's generation, checked under that
//! lock, turns them away once the manager is destroyed; the slot is reused only after the
//! manager's teardown has taken its state out.

use super::handles::TAG_MANAGER;
use super::{Manager, State};
use crate::error::{lock, Result};
use crate::fail;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub const MAX_MANAGERS: usize = 4096;

#[repr(align(64))]
struct Slot {
    generation: AtomicU32,
    manager: RwLock<Option<Arc<Manager>>>,
    /// Some from the manager's creation until the end of its teardown.
    state: parking_lot::Mutex<Option<State>>,
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
            .map(|_| Slot { generation: AtomicU32::new(1), manager: RwLock::new(None), state: parking_lot::Mutex::new(None) })
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

/// Where the manager in `slot` keeps its state (`Manager::new` puts it there, the manager's
/// teardown takes it out and then gives the slot back with `release_slot`).
pub(super) fn state_cell(slot: u16) -> &'static parking_lot::Mutex<Option<State>> {
    &registry().slots[slot as usize].state
}

/// Runs `f` on the state of the live manager `handle` names, under the state's lock only.
pub fn with_state<R>(handle: u64, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    let (cell, generation) = decode(handle)?;
    let mut state = cell.state.lock();
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
