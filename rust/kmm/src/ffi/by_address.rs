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

    fn write_i32(&mut self, key: i32) {
        self.write_u64(u64::from(key as u32));
    }

    fn write_u64(&mut self, key: u64) {
        let h = (self.0 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

pub(super) type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// The allocations of one library.
pub(super) struct ByAddress {
    /// Whether the library's frees name the manager (`kmm_plugin_free_address`): then a late free
    /// through a destroyed manager is told apart by its handle, and no orphans are kept. CuPy's
    /// and PyTorch's frees name only the address.
    frees_name_manager: bool,
    /// Device ordinal -> the manager serving the library on that device.
    pub managers: HashMap<i32, u64, BuildHasherDefault<U64Hasher>>,
    /// Address -> (manager, buffer, stream it was allocated for) of every live allocation.
    pub live: U64Map<(u64, u64, u64)>,
    /// Addresses of allocations whose manager was destroyed before the library freed them (a
    /// forced close): the library's late free of such an address must not free a new
    /// allocation there. A new allocation that lands on one is held back here until that late
    /// free comes (and the request is served again elsewhere): one allocation per orphan at
    /// most, of the size that was asked for; it counts in the stats of its manager, which holds
    /// its memory. Only for libraries whose frees do not name the manager.
    pub orphans: U64Map<Option<(u64, u64, u64)>>,
    /// Entries of `live` and held-back allocations per manager: a destroy of a manager with
    /// none here scans nothing. A count that drops to 0 stays (`orphan` removes it at the
    /// manager's destroy), so an allocation and free in turn touch no entry of this map twice.
    held: U64Map<usize>,
}

impl ByAddress {
    /// The table of a library whose frees name only the address (CuPy's, PyTorch's).
    pub fn by_address_alone() -> Mutex<ByAddress> {
        ByAddress::new(false)
    }

    /// The table of a library whose frees name the manager too (`kmm_plugin_free_address`).
    pub fn naming_the_manager() -> Mutex<ByAddress> {
        ByAddress::new(true)
    }

    fn new(frees_name_manager: bool) -> Mutex<ByAddress> {
        Mutex::new(ByAddress {
            frees_name_manager,
            managers: HashMap::default(),
            live: U64Map::default(),
            orphans: U64Map::default(),
            held: U64Map::default(),
        })
    }

    fn count(&mut self, manager: u64, delta: isize) {
        let n = self.held.entry(manager).or_insert(0);
        *n = n.saturating_add_signed(delta);
    }

    fn insert_live(&mut self, address: u64, entry: (u64, u64, u64)) {
        self.count(entry.0, 1);
        self.live.insert(address, entry);
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
        // A destroy since the allocation: its teardown frees the buffer, and `orphan` (which
        // runs after the manager is unregistered, under this lock) has passed or will not see
        // this entry, so none is made. Checked under the lock: an entry made before that
        // `orphan` runs is orphaned by it.
        if !super::registry::is_live(mgr) {
            fail!(KMM_ERROR_INVALID_HANDLE, "manager {mgr:#x} was destroyed during the allocation");
        }
        match t.orphans.get_mut(&p) {
            // Each orphaned address holds back at most one allocation: the loop ends.
            Some(held @ None) => {
                *held = Some((mgr, b, stream));
                t.count(mgr, 1);
            }
            _ => {
                t.insert_live(p, (mgr, b, stream));
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
    if t.held.remove(&manager).unwrap_or(0) == 0 {
        return;
    }
    let dead: Vec<u64> = t.live.iter().filter(|(_, v)| v.0 == manager).map(|(&address, _)| address).collect();
    for address in dead {
        t.live.remove(&address);
        // A late free that names the dead manager is refused by its handle: nothing to keep.
        if !t.frees_name_manager {
            t.orphans.insert(address, None);
        }
    }
    // Its held-back allocations go with its teardown: their orphans wait for their late frees
    // as before.
    for held in t.orphans.values_mut() {
        if held.is_some_and(|(m, _, _)| m == manager) {
            *held = None;
        }
    }
}

/// Frees what `alloc_by_address` recorded at `ptr`, after the work queued so far on `stream`
/// (`None`: the stream it was allocated for). With `manager`, the manager must be live and only
/// its allocation matches (so a late free through a destroyed manager cannot hit a newer
/// allocation). A free that fails leaves the allocation recorded.
pub(super) fn free_by_address(table: &Mutex<ByAddress>, ptr: u64, manager: Option<u64>, stream: Option<u64>, owner: &str) -> Result<()> {
    let found = {
        let mut t = lock(table);
        // Checked under the lock: a destroy unregisters the manager before `orphan` takes its
        // entries out under this lock, so a live manager here still has them.
        if let Some(m) = manager.filter(|&m| !super::registry::is_live(m)) {
            fail!(KMM_ERROR_INVALID_HANDLE, "manager = {m:#x} is not a live manager (destroyed, or never made)");
        }
        // One lookup in the common case: a free through another manager puts the entry back.
        match t.live.remove(&ptr) {
            Some(entry) if manager.is_none_or(|m| m == entry.0) => {
                t.count(entry.0, -1);
                Some(entry)
            }
            Some(entry) => {
                t.live.insert(ptr, entry);
                None
            }
            None => None,
        }
    };
    let Some((mgr, b, alloc_stream)) = found else {
        // The late free of an allocation of a destroyed manager: its memory went with it; an
        // allocation held back at its address goes back now.
        let orphan = {
            let mut t = lock(table);
            let orphan = t.orphans.remove(&ptr);
            if let Some(Some((mgr, _, _))) = orphan {
                t.count(mgr, -1);
            }
            orphan
        };
        if let Some(held) = orphan {
            if let Some((mgr, b, stream)) = held {
                let _ = plugin_free(mgr, b, stream);
            }
            fail!(KMM_ERROR_INVALID_HANDLE, "ptr = {ptr:#x} was allocated by a manager since destroyed: its memory went with it");
        }
        match manager {
            Some(m) => fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:#x} was not allocated by {owner} on manager {m:#x} (or is freed)"),
            None => fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:#x} was not allocated by {owner} (or is freed)"),
        }
    };
    let freed = plugin_free(mgr, b, stream.unwrap_or(alloc_stream));
    if freed.as_ref().is_err_and(|e| e.status != crate::KmmStatus::KMM_ERROR_INVALID_HANDLE) {
        let mut t = lock(table);
        // Not for a manager destroyed meanwhile: its `orphan` has run (or runs after this, under
        // the lock, and sees the entry), and its teardown frees the buffer.
        if super::registry::is_live(mgr) {
            t.insert_live(ptr, (mgr, b, alloc_stream));
        }
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
