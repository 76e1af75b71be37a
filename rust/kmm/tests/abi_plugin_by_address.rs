//! The by-address tables of the allocator-plugin exports (`kmm_plugin_malloc`, CuPy's and
//! PyTorch's) across a manager's destruction: defects found by `plugin_model.rs` (an independent
//! review, 2026-11-28), each a minimal reproduction that failed before its fix. Host backend.
mod common;
use common::*;
use kmm::ffi::cupy::*;
use kmm::ffi::plugin::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

const MIB: u64 = 1 << 20;

/// CuPy's table is process-wide: the tests of this file take turns.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn create() -> KmmManager {
    let mut m = 0;
    ok(kmm_manager_create(&default_config(), &mut m));
    m
}

/// `kmm_manager_destroy`: "Later calls with its handles return `KMM_ERROR_INVALID_HANDLE`", and
/// `KMM_ERROR_INVALID_HANDLE` covers a handle "never issued, ..., forged, ... or of a destroyed
/// manager". `kmm_plugin_free_address` never checks its manager: through a destroyed manager, 0
/// or a forged handle it answers `KMM_ERROR_INVALID_ARGUMENT` ("not allocated by
/// kmm_plugin_malloc"), unless the address happens to be one the destroyed manager handed out.
#[test]
fn free_address_through_a_dead_manager_is_invalid_handle() {
    let _serial = serial();
    let m = create();
    let p = kmm_plugin_malloc(m, 4096, 0);
    assert_ne!(p, 0, "{}", last_error());
    ok(kmm_plugin_free_address(m, p, 0));
    ok(kmm_manager_destroy(m, 0));
    // The late (double) free of an address through the destroyed manager.
    expect_err(kmm_plugin_free_address(m, p, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    // Handle 0 is never valid, and a forged one is not live.
    expect_err(kmm_plugin_free_address(0, p, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    expect_err(kmm_plugin_free_address(0x1234_5678_9abc_def0, p, 0), KMM_ERROR_INVALID_HANDLE, &[]);
}

/// The same defect seen from the late free the header describes: a destroyed manager's
/// `kmm_plugin_malloc` allocation is remembered (as an "orphan") so that its late free answers
/// `KMM_ERROR_INVALID_HANDLE`; but a free of that address through any *other*, live manager
/// consumes the orphan (answering `KMM_ERROR_INVALID_HANDLE` for a live handle), and the genuine
/// late free through the dead manager then gets `KMM_ERROR_INVALID_ARGUMENT`.
#[test]
fn a_free_through_another_manager_steals_the_late_free() {
    let _serial = serial();
    let (a, b) = (create(), create());
    let p = kmm_plugin_malloc(a, 4096, 0);
    assert_ne!(p, 0, "{}", last_error());
    ok(kmm_manager_destroy(a, 0));
    // p was never `b`'s: not its allocation (either error code is fair here).
    let s = kmm_plugin_free_address(b, p, 0);
    assert!(s == KMM_ERROR_INVALID_ARGUMENT || s == KMM_ERROR_INVALID_HANDLE, "{s:?}");
    // The late free through the destroyed manager: "Later calls with its handles return
    // KMM_ERROR_INVALID_HANDLE".
    expect_err(kmm_plugin_free_address(a, p, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    ok(kmm_manager_destroy(b, 0));
}

/// A by-address allocation (`kmm_plugin_malloc`, `kmm_cupy_malloc`) whose first placement lands
/// on an address a destroyed manager's by-address allocation had (its late free still to come) is
/// held back inside the new manager, unseen, and the request served a second time elsewhere. The
/// manager's stats count both: `live_buffers` 2 and twice the bytes `in_use` for one request
/// (KmmMemoryStats: "in use" is "what callers asked for"), and after the caller frees all it
/// holds the manager still reports one live buffer and its bytes, until a late free of the old
/// address arrives, which for `kmm_plugin_malloc` (whose caller knows the manager is gone) need
/// never happen. For `kmm_plugin_free_address` the hold-back is not even needed: its frees name
/// the manager, so a late free through the dead one can never match the new allocation.
#[test]
fn held_back_allocation_shows_in_another_managers_stats() {
    let _serial = serial();
    const BYTES: u64 = 5 * MIB;
    let direct = |c: &mut KmmConfig| c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32;
    // Direct mode: one host allocation per buffer, so the next one of the same size usually
    // lands where the last one was freed. A few tries make the landing all but certain.
    for _ in 0..20 {
        let a = Mgr::with(direct);
        let p = kmm_plugin_malloc(a.0, BYTES, 0);
        assert_ne!(p, 0, "{}", last_error());
        drop(a); // destroyed with the allocation out; no late free follows.
        let b = Mgr::with(direct);
        let q = kmm_plugin_malloc(b.0, BYTES, 0);
        assert_ne!(q, 0, "{}", last_error());
        let s = b.stats(DEVICE);
        assert_eq!(
            (s.live_buffers, s.in_use),
            (1, BYTES),
            "one kmm_plugin_malloc of {BYTES} bytes (at {q:#x}; the destroyed manager's was at {p:#x})"
        );
        ok(kmm_plugin_free_address(b.0, q, 0));
        let s = b.stats(DEVICE);
        assert_eq!((s.live_buffers, s.in_use), (0, 0), "after the caller freed all it holds");
    }
}

/// CuPy's frees name only the address, so a manager destroyed with CuPy allocations out must
/// keep their late frees from freeing a newer allocation at the same address: one that lands
/// there is held back (counted in its manager's stats, as `kmm_manager_destroy` says) and the
/// request served elsewhere, until that late free comes; then the stats hold the caller's
/// allocations alone again.
#[test]
fn held_back_cupy_allocations_count_until_their_late_free() {
    let _serial = serial();
    const BYTES: u64 = 5 * MIB;
    let direct = |c: &mut KmmConfig| c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32;
    let mut stale = Vec::new();
    let b = Mgr::with(direct);
    let mut most_held = 0;
    for _ in 0..20 {
        let a = Mgr::with(direct);
        ok(kmm_cupy_set_manager(0, a.0));
        let p = kmm_cupy_malloc(null_mut(), BYTES as usize, 0);
        assert!(!p.is_null(), "{}", last_error());
        ok(kmm_cupy_set_manager(0, 0));
        drop(a);
        stale.push(p);
        ok(kmm_cupy_set_manager(0, b.0));
        let q = kmm_cupy_malloc(null_mut(), BYTES as usize, 0);
        assert!(!q.is_null(), "{}", last_error());
        assert!(!stale.contains(&q), "handed out {q:?}, whose late free is still to come");
        kmm_cupy_free(null_mut(), q, 0);
        ok(kmm_cupy_set_manager(0, 0));
        let s = b.stats(DEVICE);
        assert_eq!(s.in_use, s.live_buffers * BYTES, "only held-back allocations are left");
        assert!(s.live_buffers as usize <= stale.len(), "at most one held back per late free to come");
        most_held = most_held.max(s.live_buffers);
    }
    // Direct mode maps each buffer on its own: a new one lands where a freed one was, except
    // under AddressSanitizer (tools/asan.sh), whose quarantine keeps freed addresses unused.
    if std::env::var_os("ASAN_OPTIONS").is_none() {
        assert!(most_held > 0, "no allocation landed on a dead manager's address: the test tested nothing");
    }
    // CuPy's late frees: each gives back what it held back.
    for p in stale {
        kmm_cupy_free(null_mut(), p as *mut c_void, 0);
    }
    let s = b.stats(DEVICE);
    assert_eq!((s.live_buffers, s.in_use), (0, 0), "held-back allocations left after every late free came");
}
