//! Buffers through the C ABI: lifetimes, handles, mapping, wrapping, and every bad input.
mod common;
use common::*;
use std::ptr::null_mut;

#[test]
fn zero_size_buffers_are_valid() {
    let m = Mgr::new();
    let b = m.alloc(0, DEVICE);
    let mut ptr = 1u64;
    ok(kmm_buffer_map(m.0, b, &mut ptr));
    assert_eq!(ptr, 0);
    ok(kmm_buffer_unmap(m.0, b));
    ok(kmm_copy_to_device(m.0, b, 0, std::ptr::null(), 0));
    ok(kmm_copy_to_host(m.0, null_mut(), b, 0, 0));
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, b, &mut info));
    assert_eq!((info.bytes, info.kind, info.pins), (0, DEVICE, 0));
    assert_eq!(m.stats(DEVICE).live_buffers, 1);
    m.free(b);
    assert_eq!(m.stats(DEVICE).live_buffers, 0);
}

#[test]
fn stale_double_freed_forged_foreign_and_mistyped_handles() {
    let a = Mgr::new();
    let other = Mgr::new();
    let keep = a.alloc(4096, DEVICE);
    let data = pattern(4096, 1);
    a.upload(keep, 0, &data);
    let b = a.alloc(100, DEVICE);
    a.free(b);
    expect_err(kmm_buffer_free(a.0, b, 0), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    let mut out = 0;
    expect_err(kmm_buffer_map(a.0, b, &mut out), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    // The slot is reused by a new buffer; the stale handle still fails.
    let c = a.alloc(100, DEVICE);
    expect_err(kmm_buffer_free(a.0, b, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    let foreign = other.alloc(64, DEVICE);
    expect_err(kmm_buffer_free(a.0, foreign, 0), KMM_ERROR_INVALID_HANDLE, &["another manager"]);
    for forged in [0u64, 1, u64::MAX, 0xB000_0000_0000_0000, keep ^ (1 << 30), keep + 1] {
        expect_err(kmm_buffer_free(a.0, forged, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    }
    let mut ev = 0;
    ok(kmm_manager_record_event(a.0, &mut ev));
    expect_err(kmm_buffer_free(a.0, ev, 0), KMM_ERROR_INVALID_HANDLE, &["not a buffer handle"]);
    expect_err(kmm_buffer_free(keep, keep, 0), KMM_ERROR_INVALID_HANDLE, &["not a manager handle"]);
    // Nothing stored was disturbed.
    assert_eq!(a.download(keep, 0, 4096), data);
    a.free(c);
    a.free(keep);
    other.free(foreign);
    ok(kmm_event_destroy(a.0, ev));
}

#[test]
fn use_after_manager_destroy_is_invalid_handle() {
    let mut c = default_config();
    c.chunk_size = 1 << 20;
    let mut m = 0;
    ok(kmm_manager_create(&c, &mut m));
    let mut b = 0;
    ok(kmm_buffer_alloc(m, 1000, DEVICE, &mut b));
    let mut ev = 0;
    ok(kmm_manager_record_event(m, &mut ev));
    ok(kmm_manager_destroy(m, 0));
    expect_err(kmm_buffer_free(m, b, 0), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    expect_err(kmm_manager_synchronize(m), KMM_ERROR_INVALID_HANDLE, &["manager"]);
    expect_err(kmm_event_wait(m, ev), KMM_ERROR_INVALID_HANDLE, &[]);
    expect_err(kmm_manager_destroy(m, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    // A new manager in the same registry slot does not revive the old handles.
    let n = Mgr::new();
    expect_err(kmm_buffer_free(n.0, b, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    expect_err(kmm_manager_synchronize(m), KMM_ERROR_INVALID_HANDLE, &[]);
}

#[test]
fn deferred_destroy_returns_at_once_and_invalidates() {
    let mut m = 0;
    ok(kmm_manager_create(&default_config(), &mut m));
    let mut b = 0;
    ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut b));
    ok(kmm_manager_destroy(m, KMM_DESTROY_DEFERRED));
    expect_err(kmm_buffer_free(m, b, 0), KMM_ERROR_INVALID_HANDLE, &[]);
    expect_err(kmm_manager_destroy(m, 0x80), KMM_ERROR_INVALID_ARGUMENT, &["flags", "0x80"]);
}

#[test]
fn mapping_pins_and_freeing_a_mapped_buffer_needs_force() {
    let m = Mgr::new();
    let b = m.alloc(1 << 16, DEVICE);
    let (mut p1, mut p2) = (0u64, 0u64);
    ok(kmm_buffer_map(m.0, b, &mut p1));
    ok(kmm_buffer_map(m.0, b, &mut p2));
    assert_eq!(p1, p2);
    assert_ne!(p1, 0);
    assert_eq!(p1 % 256, 0, "default alignment is 256 bytes");
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, b, &mut info));
    assert_eq!(info.pins, 2);
    expect_err(kmm_buffer_free(m.0, b, 0), KMM_ERROR_BUFFER_MAPPED, &["mapped", "2 pin"]);
    ok(kmm_buffer_unmap(m.0, b));
    expect_err(kmm_buffer_free(m.0, b, 0), KMM_ERROR_BUFFER_MAPPED, &["1 pin"]);
    ok(kmm_buffer_free(m.0, b, KMM_FREE_FORCE));
    expect_err(kmm_buffer_unmap(m.0, b), KMM_ERROR_INVALID_HANDLE, &[]);
    let c = m.alloc(10, DEVICE);
    expect_err(kmm_buffer_unmap(m.0, c), KMM_ERROR_INVALID_ARGUMENT, &["not mapped"]);
    expect_err(kmm_buffer_free(m.0, c, 2), KMM_ERROR_INVALID_ARGUMENT, &["flags"]);
    m.free(c);
}

#[test]
fn pinned_buffers_are_host_addressable() {
    let m = Mgr::new();
    let b = m.alloc(1 << 20, PINNED);
    let mut p = 0u64;
    ok(kmm_buffer_map(m.0, b, &mut p));
    let host = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 1 << 20) };
    host.copy_from_slice(&pattern(1 << 20, 9));
    let d = m.alloc(1 << 20, DEVICE);
    ok(kmm_copy_buffer(m.0, d, 0, m.0, b, 0, 1 << 20));
    assert_eq!(m.download(d, 0, 1 << 20), pattern(1 << 20, 9));
    ok(kmm_buffer_unmap(m.0, b));
    let s = m.stats(PINNED);
    assert_eq!((s.in_use, s.live_buffers), (1 << 20, 1));
    assert!(s.reserved >= 1 << 20);
    m.free(b);
    m.free(d);
    assert_eq!(m.stats(PINNED).in_use, 0);
}

#[test]
fn bad_inputs_name_the_argument_and_the_bound() {
    let m = Mgr::new();
    let mut b = 0;
    expect_err(kmm_buffer_alloc(m.0, 10, DEVICE, null_mut()), KMM_ERROR_NULL_POINTER, &["out"]);
    expect_err(kmm_buffer_alloc(m.0, 10, 7, &mut b), KMM_ERROR_INVALID_ARGUMENT, &["kind = 7", "KmmMemoryKind"]);
    expect_err(kmm_buffer_alloc(m.0, u64::MAX, DEVICE, &mut b), KMM_ERROR_SIZE_OVERFLOW, &["bytes", "2^48"]);
    expect_err(kmm_buffer_alloc(m.0, KMM_MAX_BUFFER_BYTES + 1, DEVICE, &mut b), KMM_ERROR_SIZE_OVERFLOW, &["2^48"]);
    assert_eq!(m.stats(DEVICE).failed_allocs, 2);
    let mut s = KmmMemoryStats::default();
    expect_err(kmm_manager_stats(m.0, 2, &mut s), KMM_ERROR_INVALID_ARGUMENT, &["kind = 2"]);
    expect_err(kmm_manager_stats(m.0, DEVICE, null_mut()), KMM_ERROR_NULL_POINTER, &["out"]);
    expect_err(kmm_manager_create(&default_config(), null_mut()), KMM_ERROR_NULL_POINTER, &["out"]);
    expect_err(kmm_config_default(null_mut()), KMM_ERROR_NULL_POINTER, &["config"]);
    expect_err(kmm_buffer_wrap(m.0, null_mut(), 10, DEVICE, 0, &mut b), KMM_ERROR_NULL_POINTER, &["ptr"]);
    let mut x = [0u8; 16];
    expect_err(kmm_buffer_wrap(m.0, x.as_mut_ptr().cast(), 16, DEVICE, 5, &mut b), KMM_ERROR_INVALID_ARGUMENT, &["ownership = 5"]);
    expect_err(kmm_manager_summary(m.0, null_mut(), 10, null_mut()), KMM_ERROR_NULL_POINTER, &["buf"]);
    expect_err(kmm_manager_memory_info(m.0, null_mut(), null_mut()), KMM_ERROR_NULL_POINTER, &["free"]);
    let mut info = KmmManagerInfo::default();
    expect_err(kmm_manager_info(0, &mut info), KMM_ERROR_INVALID_HANDLE, &[]);
}

#[test]
fn config_is_validated() {
    let cases: Vec<(Box<dyn Fn(&mut KmmConfig)>, &str)> = vec![
        (Box::new(|c| c.backend = 9), "config.backend = 9"),
        (Box::new(|c| c.alloc_mode = 3), "config.alloc_mode = 3"),
        (Box::new(|c| c.suballocator = 4), "config.suballocator = 4"),
        (Box::new(|c| c.alignment = 3), "config.alignment = 3"),
        (Box::new(|c| c.alignment = 1 << 30), "power of two up to 2 MiB"),
        (Box::new(|c| c.chunk_size = 0), "config.chunk_size = 0"),
        (Box::new(|c| c.staging_chunks = 1), "config.staging_chunks = 1"),
        (Box::new(|c| c.staging_chunk_size = 1), "config.staging_chunk_size = 1"),
        (Box::new(|c| c.compaction_ratio_pct = 99), "config.compaction_ratio_pct = 99"),
        (Box::new(|c| c.compaction_ratio_pct = 1001), "in 100..=1000"),
        // A device that cannot exist is a bad argument, not a backend that is unavailable.
        (Box::new(|c| c.device = -1), "config.device = -1 must be >= 0"),
        (
            Box::new(|c| {
                c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
                c.fixed_block_size = 0
            }),
            "config.fixed_block_size = 0",
        ),
    ];
    for (edit, words) in cases {
        let mut c = default_config();
        edit(&mut c);
        let mut m = 0;
        expect_err(kmm_manager_create(&c, &mut m), KMM_ERROR_INVALID_ARGUMENT, &[words]);
        assert_eq!(m, 0, "out written on failure");
    }
    let mut c = default_config();
    c.device = 99;
    let mut m = 0;
    expect_err(kmm_manager_create(&c, &mut m), KMM_ERROR_BACKEND_UNAVAILABLE, &["device 99"]);
}

#[test]
fn wrap_borrows_or_adopts_foreign_memory() {
    let m = Mgr::new();
    // Borrowed: Kmm reads and writes it but never frees it.
    let mut host_owned = vec![0u8; 4096];
    if !gpu() {
        let mut b = 0;
        ok(kmm_buffer_wrap(m.0, host_owned.as_mut_ptr().cast(), 4096, DEVICE, KmmOwnership::KMM_BORROW as u32, &mut b));
        m.upload(b, 100, &[7u8; 50]);
        assert_eq!(m.download(b, 100, 50), vec![7u8; 50]);
        m.free(b);
        m.sync();
        assert_eq!(&host_owned[100..150], &[7u8; 50]);
        // Adopted: memory from malloc on the host backend, freed by Kmm.
        let p = unsafe { libc::malloc(1 << 20) };
        ok(kmm_buffer_wrap(m.0, p, 1 << 20, DEVICE, KmmOwnership::KMM_ADOPT as u32, &mut b));
        let s = m.stats(DEVICE);
        assert_eq!((s.in_use, s.live_buffers), (1 << 20, 1));
        assert!(s.reserved >= 1 << 20, "adopted memory counts as reserved");
        m.free(b);
        m.sync();
        ok(kmm_manager_trim(m.0, 0));
        assert_eq!(m.stats(DEVICE).reserved, 0);
    } else {
        // Another manager's device memory, borrowed.
        let src = Mgr::new();
        let sb = src.alloc(4096, DEVICE);
        src.upload(sb, 0, &pattern(4096, 3));
        let mut ptr = 0;
        ok(kmm_buffer_map(src.0, sb, &mut ptr));
        let mut b = 0;
        ok(kmm_buffer_wrap(m.0, ptr as *mut _, 4096, DEVICE, KmmOwnership::KMM_BORROW as u32, &mut b));
        assert_eq!(m.download(b, 0, 4096), pattern(4096, 3));
        m.free(b);
        ok(kmm_buffer_unmap(src.0, sb));
        src.free(sb);
    }
    host_owned.clear();
}

#[test]
fn a_buffer_handle_of_a_destroyed_manager_is_refused_by_the_next_manager_of_its_slot() {
    // A later manager in the same registry slot started its handle generations at a seed of its
    // own: after enough frees and allocations in one table slot it issued the very handle the
    // destroyed manager had, and kmm_buffer_free(new manager, stale handle) freed a live buffer.
    let m1 = Mgr::new();
    let stale = m1.alloc(64, DEVICE);
    let slot = m1.0 & 0xFFF;
    drop(m1);
    let mut m2 = None;
    for _ in 0..20_000 {
        let m = Mgr::new();
        if m.0 & 0xFFF == slot {
            m2 = Some(m);
            break;
        }
    }
    let m2 = m2.expect("the registry slot came back");
    let mut cur = m2.alloc(64, DEVICE);
    assert_ne!(cur, stale);
    // As many frees and allocations of one table slot as the generations take to come around.
    let distance = ((stale >> 28).wrapping_sub(cur >> 28) & 0xF_FFFF) as u32;
    for _ in 0..distance {
        m2.free(cur);
        cur = m2.alloc(64, DEVICE);
        assert_ne!(cur, stale, "the destroyed manager's handle was issued again");
    }
    expect_err(kmm_buffer_free(m2.0, stale, 0), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m2.0, cur, &mut info));
    m2.free(cur);
}
