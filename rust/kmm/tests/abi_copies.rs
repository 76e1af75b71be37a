//! Every copy path through the C ABI, with odd sizes and offsets, checked byte for byte.
mod common;
use common::*;
use std::ptr::null_mut;

const SIZES: [usize; 8] = [1, 3, 255, 4097, 65_537, 262_145, 3_000_001, 17_000_003];

#[test]
fn host_device_round_trips_with_offsets() {
    let m = Mgr::with(|c| c.staging_chunk_size = 1 << 20);
    for (i, &len) in SIZES.iter().enumerate() {
        let off = (i * 37) as u64;
        let b = m.alloc(len as u64 + off + 13, DEVICE);
        let data = pattern(len, i as u64);
        m.upload(b, off, &data);
        assert_eq!(m.download(b, off, len), data, "len {len} offset {off}");
        // Sub-range of the host buffer read back from the middle.
        let mid = len / 3;
        assert_eq!(m.download(b, off + mid as u64, len - mid), &data[mid..], "tail of len {len}");
        m.free(b);
    }
}

#[test]
fn async_copies_complete_through_events() {
    let m = Mgr::with(|c| c.staging_chunk_size = 1 << 20);
    for &len in &SIZES {
        let b = m.alloc(len as u64, DEVICE);
        let data = pattern(len, 77);
        let mut ev = 0;
        ok(kmm_copy_to_device_async(m.0, b, 0, data.as_ptr().cast(), len as u64, &mut ev));
        ok(kmm_event_wait(m.0, ev));
        let mut done = false;
        ok(kmm_event_query(m.0, ev, &mut done));
        assert!(done);
        ok(kmm_event_destroy(m.0, ev));
        let mut back = vec![0u8; len];
        ok(kmm_copy_to_host_async(m.0, back.as_mut_ptr().cast(), b, 0, len as u64, &mut ev));
        ok(kmm_event_wait(m.0, ev));
        ok(kmm_event_destroy(m.0, ev));
        assert_eq!(back, data, "len {len}");
        // Without an event the caller synchronizes.
        let mut again = vec![0u8; len];
        ok(kmm_copy_to_host_async(m.0, again.as_mut_ptr().cast(), b, 0, len as u64, null_mut()));
        m.sync();
        assert_eq!(again, data);
        m.free(b);
    }
}

#[test]
fn pinned_and_registered_sources_go_direct() {
    let m = Mgr::new();
    let len = 8 << 20;
    let data = pattern(len, 5);
    // Kmm's own pinned buffer as the host side of a copy.
    let pin = m.alloc(len as u64, PINNED);
    let mut p = 0u64;
    ok(kmm_buffer_map(m.0, pin, &mut p));
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, len) };
    let d = m.alloc(len as u64, DEVICE);
    ok(kmm_copy_to_device(m.0, d, 0, p as *const _, len as u64));
    assert_eq!(m.download(d, 0, len), data);
    // Registered user memory.
    let mut user = pattern(len, 6);
    ok(kmm_host_register(m.0, user.as_mut_ptr().cast(), len as u64));
    m.upload(d, 0, &user);
    let mut back = vec![0u8; len];
    ok(kmm_host_register(m.0, back.as_mut_ptr().cast(), len as u64));
    ok(kmm_copy_to_host(m.0, back.as_mut_ptr().cast(), d, 0, len as u64));
    assert_eq!(back, user);
    ok(kmm_host_unregister(m.0, user.as_mut_ptr().cast()));
    ok(kmm_host_unregister(m.0, back.as_mut_ptr().cast()));
    expect_err(kmm_host_unregister(m.0, back.as_mut_ptr().cast()), KMM_ERROR_INVALID_ARGUMENT, &["not registered through this manager"]);
    expect_err(kmm_host_register(m.0, null_mut(), 10), KMM_ERROR_NULL_POINTER, &["ptr"]);
    ok(kmm_buffer_unmap(m.0, pin));
    m.free(pin);
    m.free(d);
    user.clear();
}

#[test]
fn device_to_device_within_and_between_managers() {
    let a = Mgr::new();
    let b = Mgr::new();
    let len = 5_000_011usize;
    let data = pattern(len, 11);
    let x = a.alloc(len as u64, DEVICE);
    a.upload(x, 0, &data);
    let y = a.alloc(len as u64 + 100, DEVICE);
    ok(kmm_copy_buffer(a.0, y, 100, a.0, x, 0, len as u64));
    assert_eq!(a.download(y, 100, len), data);
    // Non-overlapping ranges of one buffer are fine; overlapping ones are refused.
    ok(kmm_copy_buffer(a.0, x, 0, a.0, x, 1000, 1000));
    assert_eq!(a.download(x, 0, 1000), &data[1000..2000]);
    expect_err(kmm_copy_buffer(a.0, x, 0, a.0, x, 500, 1000), KMM_ERROR_INVALID_ARGUMENT, &["overlap"]);
    // Between managers: queued on b's stream after a's work; a waits for it before reuse.
    let z = b.alloc(len as u64, DEVICE);
    a.upload(x, 0, &data);
    ok(kmm_copy_buffer(b.0, z, 0, a.0, x, 0, len as u64));
    a.free(x);
    let reuse = a.alloc(len as u64, DEVICE);
    ok(kmm_fill(a.0, reuse, 0, len as u64, [0xEEu8].as_ptr().cast(), 1));
    assert_eq!(b.download(z, 0, len), data);
    expect_err(kmm_copy_buffer(b.0, z, 1, a.0, y, 0, len as u64), KMM_ERROR_OUT_OF_RANGE, &["dst_offset = 1", "bytes = 5000011"]);
    expect_err(kmm_copy_buffer(b.0, z, 0, a.0, z, 0, 10), KMM_ERROR_INVALID_HANDLE, &["another manager"]);
    for h in [y, reuse] {
        a.free(h);
    }
    b.free(z);
}

#[test]
fn fills_with_patterns_of_every_width_and_alignment() {
    let m = Mgr::new();
    let len = 300_000usize;
    let b = m.alloc(len as u64 + 64, DEVICE);
    for width in [1usize, 2, 3, 4, 8, 16, 12, 100] {
        for offset in [0usize, 1, 8] {
            let pat: Vec<u8> = (0..width).map(|i| (i * 31 + width + offset) as u8).collect();
            let n = len / width * width;
            ok(kmm_fill(m.0, b, 0, len as u64 + 64, [0u8].as_ptr().cast(), 1));
            ok(kmm_fill(m.0, b, offset as u64, n as u64, pat.as_ptr().cast(), width));
            let got = m.download(b, 0, len + 64);
            assert!(got[..offset].iter().all(|&x| x == 0), "width {width} offset {offset}: bytes before");
            for (i, chunk) in got[offset..offset + n].chunks(width).enumerate() {
                assert_eq!(chunk, &pat[..], "width {width} offset {offset} element {i}");
            }
            assert!(got[offset + n..].iter().all(|&x| x == 0), "width {width} offset {offset}: bytes after");
        }
    }
    expect_err(kmm_fill(m.0, b, 0, 10, [1u8; 4].as_ptr().cast(), 4), KMM_ERROR_INVALID_ARGUMENT, &["bytes = 10", "pattern_size = 4"]);
    expect_err(kmm_fill(m.0, b, 0, 8, [1u8; 4].as_ptr().cast(), 0), KMM_ERROR_INVALID_ARGUMENT, &["pattern_size = 0"]);
    expect_err(kmm_fill(m.0, b, 0, 8, std::ptr::null(), 4), KMM_ERROR_NULL_POINTER, &["pattern"]);
    expect_err(kmm_fill(m.0, b, len as u64 + 60, 8, [1u8; 4].as_ptr().cast(), 4), KMM_ERROR_OUT_OF_RANGE, &["offset = ", "the buffer's size"]);
    m.free(b);
}

#[test]
fn out_of_range_and_null_copies_leave_data_intact() {
    let m = Mgr::new();
    let b = m.alloc(1000, DEVICE);
    let data = pattern(1000, 2);
    m.upload(b, 0, &data);
    let junk = vec![0xAAu8; 2000];
    let mut out = vec![0u8; 2000];
    expect_err(kmm_copy_to_device(m.0, b, 0, junk.as_ptr().cast(), 1001), KMM_ERROR_OUT_OF_RANGE, &["dst_offset = 0", "bytes = 1001", "1000 bytes"]);
    expect_err(kmm_copy_to_device(m.0, b, 999, junk.as_ptr().cast(), 2), KMM_ERROR_OUT_OF_RANGE, &["dst_offset = 999"]);
    expect_err(kmm_copy_to_device(m.0, b, u64::MAX, junk.as_ptr().cast(), 2), KMM_ERROR_OUT_OF_RANGE, &[]);
    expect_err(kmm_copy_to_host(m.0, out.as_mut_ptr().cast(), b, 1, 1000), KMM_ERROR_OUT_OF_RANGE, &["src_offset = 1"]);
    expect_err(kmm_copy_to_device(m.0, b, 0, std::ptr::null(), 10), KMM_ERROR_NULL_POINTER, &["src"]);
    expect_err(kmm_copy_to_host(m.0, null_mut(), b, 0, 10), KMM_ERROR_NULL_POINTER, &["dst"]);
    expect_err(kmm_copy_to_host_async(m.0, out.as_mut_ptr().cast(), b, 0, 2000, null_mut()), KMM_ERROR_OUT_OF_RANGE, &[]);
    assert_eq!(m.download(b, 0, 1000), data);
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, b, &mut info));
    assert_eq!(info.pins, 0, "a failed copy must not leave the buffer pinned");
    m.free(b);
}

#[test]
fn copies_between_a_host_and_a_cuda_manager_go_through_host_memory() {
    if !gpu() {
        return;
    }
    let cuda = Mgr::new();
    let host = Mgr::with(|c| c.backend = KmmBackend::KMM_BACKEND_HOST as u32);
    let len = 20_000_003usize;
    let data = pattern(len, 21);
    let h = host.alloc(len as u64, DEVICE);
    host.upload(h, 0, &data);
    let d = cuda.alloc(len as u64 + 8, DEVICE);
    ok(kmm_copy_buffer(cuda.0, d, 8, host.0, h, 0, len as u64));
    assert_eq!(cuda.download(d, 8, len), data);
    ok(kmm_fill(host.0, h, 0, len as u64, [0u8].as_ptr().cast(), 1));
    ok(kmm_copy_buffer(host.0, h, 0, cuda.0, d, 8, len as u64));
    assert_eq!(host.download(h, 0, len), data);
    expect_err(kmm_copy_buffer(host.0, h, 1, cuda.0, d, 0, len as u64), KMM_ERROR_OUT_OF_RANGE, &["dst_offset = 1"]);
    host.free(h);
    cuda.free(d);
}

/// Starts a copy of `n` bytes of `byte` into `b` on another thread and returns once it is
/// inside the copy, waiting behind the manager's closed `Gate` (for staging slots).
fn copy_behind_the_gate(m: &Mgr, b: u64, n: usize, byte: u8) -> std::thread::JoinHandle<KmmStatus> {
    let (handle, started) = (m.0, std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let flag = started.clone();
    let copier = std::thread::spawn(move || {
        let src = vec![byte; n];
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        kmm_copy_to_device(handle, b, 0, src.as_ptr().cast(), n as u64)
    });
    while !started.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(std::time::Duration::from_millis(50)); // inside the copy, behind the gate
    copier
}

/// A forced free while another thread's copy into the buffer is still being queued (here: waiting
/// for a staging slot behind a blocked stream) must not release the memory under it: what the
/// copy queues after the free would land in the next buffer at that address. Found through the
/// Python binding (2026-11-29): `Buffer.close()` beside a `copy_from_host` in another thread
/// filled the next buffer with the old copy's bytes, and `copy_to_host` read the next buffer's.
#[test]
fn a_free_during_a_copy_releases_the_memory_after_the_copy() {
    let m = std::sync::Arc::new(Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.staging_chunk_size = 64 << 10;
        c.staging_chunks = 2;
    }));
    const N: usize = 1 << 20; // 16 staging slots' worth: the copy waits for slots mid-way
    let b = m.alloc(N as u64, DEVICE);
    let gate = Gate::close(&m);
    let copier = copy_behind_the_gate(&m, b, N, 0xAA);
    ok(kmm_buffer_free(m.0, b, KMM_FREE_FORCE));
    expect_err(kmm_buffer_free(m.0, b, KMM_FREE_FORCE), KMM_ERROR_INVALID_HANDLE, &[]);
    let c = m.alloc(N as u64, DEVICE);
    let zero = 0u8;
    ok(kmm_fill(m.0, c, 0, N as u64, (&zero as *const u8).cast(), 1));
    gate.open();
    ok(copier.join().unwrap());
    m.sync();
    assert!(m.download(c, 0, N).iter().all(|&x| x == 0), "the freed buffer's copy wrote into the next buffer");
    m.free(c);
    // Every byte is accounted for once the copy ended.
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers), (0, 0));
}

/// Another thread's copy pins the buffer for itself while it queues, but that pin is not the
/// caller's map: `kmm_buffer_info` does not count it, and a plain free (no `KMM_FREE_FORCE`) is
/// not refused as "mapped". It was (round 13, 2026-11-29: a finalizer's free beside a copy in
/// another thread failed, and the buffer leaked), while `kmm_buffer_unmap` said "not mapped".
#[test]
fn another_threads_copy_neither_maps_the_buffer_nor_refuses_its_free() {
    let m = std::sync::Arc::new(Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.staging_chunk_size = 64 << 10;
        c.staging_chunks = 2;
    }));
    const N: usize = 1 << 20;
    let b = m.alloc(N as u64, DEVICE);
    let gate = Gate::close(&m);
    let copier = copy_behind_the_gate(&m, b, N, 0x55);
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, b, &mut info));
    assert_eq!(info.pins, 0, "another thread's copy counted as the caller's map");
    expect_err(kmm_buffer_unmap(m.0, b), KMM_ERROR_INVALID_ARGUMENT, &["not mapped"]);
    ok(kmm_buffer_free(m.0, b, 0));
    gate.open();
    ok(copier.join().unwrap());
    m.sync();
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers), (0, 0), "the freed buffer was not released after the copy");
}
