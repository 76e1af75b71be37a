//! Allocations handed to libraries that free by address (PyTorch's pluggable allocator, CuPy's
//! C function allocator, `kmm_plugin_malloc`): the manager serving each device and every live
//! allocation, keyed by address.

use super::plugin::{plugin_alloc, plugin_free};
use super::registry::with_manager;
use crate::error::{lock, Result};
use crate::fail;
use crate::manager::MemoryKind;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// Hashes the u64 keys of the tables below (handles, addresses) with one multiply and shift:
/// they are looked up at every allocation and free of these libraries, where SipHash (the default) cost as
/// much as the pool. The shift brings the mixed high bits down, because aligned addresses have
/// zero low bits and the table indexes by low bits.
#[derive(Default)]
pub(super) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, key: u64) {
        let h = (self.0 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

pub(super) type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// The allocations of one library.
pub(super) struct ByAddress {
    /// Device ordinal -> the manager serving the library on that device.
    pub managers: HashMap<i32, u64>,
    /// Address -> (manager, buffer, stream it was allocated for) of every live allocation.
    pub live: U64Map<(u64, u64, u64)>,
    /// Addresses of allocations whose manager was destroyed before the library freed them (a
    /// forced close): the library's late free of such an address must not free a new
    /// allocation there. A new allocation that lands on one is held back here until that late
    /// free comes (and the request is served again elsewhere).
    pub orphans: U64Map<Option<(u64, u64, u64)>>,
}

impl ByAddress {
    pub fn new() -> Mutex<ByAddress> {
        Mutex::new(ByAddress { managers: HashMap::new(), live: U64Map::default(), orphans: U64Map::default() })
    }
}

/// Allocates `bytes` (at least 1) of device memory from `mgr` for work on `stream` and records
/// it by address.
pub(super) fn alloc_by_address(table: &Mutex<ByAddress>, mgr: u64, bytes: u64, stream: u64) -> Result<u64> {
    if bytes == 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "bytes = 0: an empty allocation has no address to be freed by");
    }
    loop {
        let (b, p) = plugin_alloc(mgr, bytes, MemoryKind::Device, stream)?;
        let mut t = lock(table);
        match t.orphans.get_mut(&p) {
            // Each orphaned address holds back at most one allocation: the loop ends.
            Some(held @ None) => *held = Some((mgr, b, stream)),
            _ => {
                t.live.insert(p, (mgr, b, stream));
                return Ok(p);
            }
        }
    }
}

/// `orphan` in the tables of every library that frees by address (CuPy's C function allocator,
/// PyTorch's pluggable allocator, `kmm_plugin_malloc`).
pub(super) fn orphan_everywhere(manager: u64) {
    for table in [super::cupy::cupy_state(), super::torch::torch_state(), super::plugin::plugin_table()] {
        orphan(table, manager);
    }
}

/// At the destruction of `manager`, before its memory can be handed out again: its allocations
/// the library has not freed become orphans (see `ByAddress::orphans`).
pub(super) fn orphan(table: &Mutex<ByAddress>, manager: u64) {
    let mut t = lock(table);
    let dead: Vec<u64> = t.live.iter().filter(|(_, v)| v.0 == manager).map(|(&address, _)| address).collect();
    for address in dead {
        t.live.remove(&address);
        t.orphans.insert(address, None);
    }
}

/// Frees what `alloc_by_address` recorded at `ptr`, after the work queued so far on `stream`
/// (`None`: the stream it was allocated for). With `manager`, only an allocation of that manager
/// matches (so a late free through a destroyed manager cannot hit a newer allocation). A free
/// that fails leaves the allocation recorded.
pub(super) fn free_by_address(table: &Mutex<ByAddress>, ptr: u64, manager: Option<u64>, stream: Option<u64>, owner: &str) -> Result<()> {
    let found = {
        let mut t = lock(table);
        match t.live.get(&ptr) {
            Some(&(mgr, _, _)) if manager.is_none_or(|m| m == mgr) => t.live.remove(&ptr),
            _ => None,
        }
    };
    let Some((mgr, b, alloc_stream)) = found else {
        // The late free of an allocation of a destroyed manager: its memory went with it; an
        // allocation held back at its address goes back now.
        let orphan = lock(table).orphans.remove(&ptr);
        if let Some(held) = orphan {
            if let Some((mgr, b, stream)) = held {
                let _ = plugin_free(mgr, b, stream);
            }
            return Ok(());
        }
        fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:#x} was not allocated by {owner} (or is freed)");
    };
    let freed = plugin_free(mgr, b, stream.unwrap_or(alloc_stream));
    if freed.as_ref().is_err_and(|e| e.status != crate::KmmStatus::KMM_ERROR_INVALID_HANDLE) {
        lock(table).live.insert(ptr, (mgr, b, alloc_stream));
    }
    freed
}

/// Records that work on `stream` may use the allocation at `ptr` (see `kmm_buffer_record_stream`).
pub(super) fn record_by_address(table: &Mutex<ByAddress>, ptr: u64, stream: u64, owner: &str) -> Result<()> {
    let found = lock(table).live.get(&ptr).copied();
    let Some((mgr, b, _)) = found else {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:#x} was not allocated by {owner} (or is freed)");
    };
    with_manager(mgr, |m| m.record_stream(b, stream))
}
