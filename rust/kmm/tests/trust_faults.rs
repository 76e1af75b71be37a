//! Fault injection: managers run on a FaultyBackend whose every k-th upstream allocation, copy
//! or stream operation fails. Every failure must surface as a status (never a panic, never
//! KMM_ERROR_INTERNAL), leave every other buffer's bytes intact and the statistics consistent,
//! and the manager must work normally once the fault clears. Nothing may leak.
//!
//! KMM_TRUST_FAULT_ROUNDS scales the number of operations per scenario (default 400).
mod common;
mod trust_support;
use common::*;
use kmm::backend::faulty::{self, FaultPlan};
use std::sync::Arc;
use std::time::Duration;
use trust_support::*;

fn rounds() -> usize {
    std::env::var("KMM_TRUST_FAULT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(400)
}

/// Installs a fresh plan for the test's lifetime; removes it (and checks for leaks) on drop.
struct Faulty {
    plan: Arc<FaultPlan>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Faulty {
    fn new() -> Faulty {
        let serial = plan_lock();
        let plan = FaultPlan::new();
        faulty::install(Some(plan.clone()));
        Faulty { plan, _serial: serial }
    }
    /// Waits (deferred teardowns) until the backend's books show nothing live.
    fn assert_no_leak(&self, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.plan.live().0 != 0 {
            assert!(std::time::Instant::now() < deadline, "{what}: leak: {:?} (allocations, bytes) still live", self.plan.live());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        faulty::install(None);
    }
}

/// A failure must be one of the statuses a failing device can cause.
#[track_caller]
fn acceptable(st: KmmStatus, what: &str) -> bool {
    match st {
        KMM_OK => true,
        KMM_ERROR_OUT_OF_MEMORY | KMM_ERROR_BACKEND => {
            let msg = last_error();
            assert!(!msg.is_empty(), "{what}: {st:?} without a message");
            false
        }
        other => panic!("{what}: a device fault surfaced as {other:?}: {}", last_error()),
    }
}

struct Tracked {
    handle: KmmBuffer,
    data: Vec<u8>,
    /// False where a failed write may have left the bytes undefined.
    known: Vec<bool>,
}

fn configs() -> Vec<(&'static str, KmmConfig)> {
    let base = {
        let mut c = default_config();
        c.chunk_size = 1 << 20;
        c.pinned_chunk_size = 1 << 20;
        c.staging_chunk_size = 64 << 10;
        c.staging_chunks = 2;
        c
    };
    let mut heap = base;
    heap.suballocator = KmmSuballocator::KMM_SUBALLOC_HEAP as u32;
    let mut direct = base;
    direct.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32;
    let mut async_pool = base;
    async_pool.alloc_mode = KmmAllocMode::KMM_ALLOC_CUDA_ASYNC as u32;
    let mut limited = base;
    limited.hard_limit = 4 << 20;
    limited.release_threshold = 0;
    vec![("binned", base), ("heap", heap), ("direct", direct), ("cuda_async", async_pool), ("limited", limited)]
}

/// One scenario: sentinels written while healthy, then `rounds` random operations under the
/// fault period (alloc, copy, stream), then the fault clears and everything is checked.
fn scenario(f: &Faulty, name: &str, cfg: KmmConfig, periods: (u64, u64, u64), seed: u64) -> u64 {
    let mut rng = Rng::new(seed);
    f.plan.clear();
    let m = Mgr::with(|c| *c = cfg);
    let sentinels: Vec<(KmmBuffer, u32, Vec<u8>)> = [(DEVICE, 3000usize), (DEVICE, 300 << 10), (PINNED, 5000)]
        .iter()
        .enumerate()
        .map(|(i, &(kind, len))| {
            let b = m.alloc(len as u64, kind);
            let data = pattern(len, seed * 10 + i as u64);
            m.upload(b, 0, &data);
            (b, kind, data)
        })
        .collect();
    let mut bufs: Vec<Tracked> = Vec::new();
    let mut injected_ops = 0u64;
    f.plan.set(periods.0, periods.1, periods.2);
    let before = f.plan.counts().injected;
    for step in 0..rounds() {
        let what = format!("{name} {periods:?} step {step}");
        match rng.below(9) {
            0 | 1 => {
                let len = [100u64, 5000, 70 << 10, 600 << 10][rng.below(4) as usize];
                let kind = if rng.below(4) == 0 { PINNED } else { DEVICE };
                let mut b = 0;
                if acceptable(kmm_buffer_alloc(m.0, len, kind, &mut b), &what) {
                    bufs.push(Tracked { handle: b, data: vec![0; len as usize], known: vec![false; len as usize] });
                }
            }
            2 if !bufs.is_empty() => {
                let t = bufs.swap_remove(rng.below(bufs.len() as u64) as usize);
                let st = kmm_buffer_free(m.0, t.handle, 0);
                if !acceptable(st, &what) {
                    // A failed free either kept the buffer or freed it; the handle says which.
                    let mut info = KmmBufferInfo::default();
                    if kmm_buffer_info(m.0, t.handle, &mut info) == KMM_OK {
                        bufs.push(t);
                    }
                }
            }
            3 | 4 if !bufs.is_empty() => {
                let i = rng.below(bufs.len() as u64) as usize;
                let len = bufs[i].data.len();
                let data = pattern(len, rng.next());
                let st = if rng.below(2) == 0 {
                    kmm_copy_to_device(m.0, bufs[i].handle, 0, data.as_ptr().cast(), len as u64)
                } else {
                    let st = kmm_copy_to_device_async(m.0, bufs[i].handle, 0, data.as_ptr().cast(), len as u64, std::ptr::null_mut());
                    // The source must outlive the copy: wait (a failed wait is retried healthy below).
                    let _ = kmm_manager_synchronize(m.0);
                    st
                };
                let t = &mut bufs[i];
                if acceptable(st, &what) {
                    t.data = data;
                    t.known.iter_mut().for_each(|k| *k = true);
                } else {
                    t.known.iter_mut().for_each(|k| *k = false);
                }
                // Any failed synchronize above may have left the copy queued: drain it healthy.
                drain(f, &m);
            }
            5 if !bufs.is_empty() => {
                let i = rng.below(bufs.len() as u64) as usize;
                let t = &bufs[i];
                let mut out = vec![0u8; t.data.len()];
                if acceptable(kmm_copy_to_host(m.0, out.as_mut_ptr().cast(), t.handle, 0, out.len() as u64), &what) {
                    for j in 0..out.len() {
                        assert!(!t.known[j] || out[j] == t.data[j], "{what}: byte {j} of a buffer read back wrong");
                    }
                    drain(f, &m);
                } else {
                    // A failed synchronous copy has returned: it must never write `out` again.
                    let snapshot = out.clone();
                    drain(f, &m);
                    std::thread::sleep(Duration::from_micros(200));
                    assert!(out == snapshot, "{what}: a failed synchronous copy_to_host wrote the caller's memory after returning");
                }
            }
            6 if bufs.len() >= 2 => {
                let (a, b) = (rng.below(bufs.len() as u64) as usize, rng.below(bufs.len() as u64) as usize);
                let len = bufs[a].data.len().min(bufs[b].data.len());
                if a != b {
                    let st = kmm_copy_buffer(m.0, bufs[a].handle, 0, m.0, bufs[b].handle, 0, len as u64);
                    if acceptable(st, &what) {
                        let (d, k) = (bufs[b].data[..len].to_vec(), bufs[b].known[..len].to_vec());
                        bufs[a].data[..len].copy_from_slice(&d);
                        bufs[a].known[..len].copy_from_slice(&k);
                    } else {
                        bufs[a].known[..len].iter_mut().for_each(|k| *k = false);
                    }
                }
            }
            7 if !bufs.is_empty() => {
                let i = rng.below(bufs.len() as u64) as usize;
                let width = [1usize, 3, 4][rng.below(3) as usize];
                let pat = pattern(width, rng.next());
                let len = bufs[i].data.len() / width * width;
                let st = kmm_fill(m.0, bufs[i].handle, 0, len as u64, pat.as_ptr().cast(), width);
                let t = &mut bufs[i];
                if acceptable(st, &what) {
                    for j in 0..len {
                        t.data[j] = pat[j % width];
                        t.known[j] = true;
                    }
                } else {
                    t.known[..len].iter_mut().for_each(|k| *k = false);
                }
            }
            _ => {
                let st = match rng.below(4) {
                    0 => kmm_manager_synchronize(m.0),
                    1 => kmm_manager_trim(m.0, 0),
                    2 => {
                        let mut e = 0;
                        let st = kmm_manager_record_event(m.0, &mut e);
                        if st == KMM_OK {
                            let _ = acceptable(kmm_event_wait(m.0, e), &what);
                            ok(kmm_event_destroy(m.0, e));
                        }
                        st
                    }
                    _ => {
                        let mut s = KmmMemoryStats::default();
                        kmm_manager_stats(m.0, DEVICE, &mut s)
                    }
                };
                acceptable(st, &what);
            }
        }
        check_stats(&m, &bufs, &sentinels, &what);
    }
    injected_ops += f.plan.counts().injected - before;
    // The fault clears: everything works again and nothing stored was disturbed.
    f.plan.clear();
    m.sync();
    for (b, _, data) in &sentinels {
        assert_eq!(&m.download(*b, 0, data.len()), data, "{name} {periods:?}: a sentinel buffer was disturbed by faults");
    }
    for t in &bufs {
        let out = m.download(t.handle, 0, t.data.len());
        for j in 0..out.len() {
            assert!(!t.known[j] || out[j] == t.data[j], "{name} {periods:?}: byte {j} of a surviving buffer is wrong after the fault cleared");
        }
    }
    for t in bufs.drain(..) {
        m.free(t.handle);
    }
    for len in [1usize, 4096, 300 << 10, 1 << 20] {
        for kind in [DEVICE, PINNED] {
            let b = m.alloc(len as u64, kind);
            let data = pattern(len, len as u64 + kind as u64);
            m.upload(b, 0, &data);
            assert_eq!(m.download(b, 0, len), data, "{name} {periods:?}: healthy round trip of {len} bytes after the fault");
            let pat = [7u8, 8, 9];
            ok(kmm_fill(m.0, b, 0, (len / 3 * 3) as u64, pat.as_ptr().cast(), 3));
            m.free(b);
        }
    }
    for (b, _, _) in sentinels {
        m.free(b);
    }
    m.sync();
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers), (0, 0), "{name} {periods:?}: device stats after freeing everything");
    assert_eq!(m.stats(PINNED).in_use, 0);
    drop(m);
    f.assert_no_leak(&format!("{name} {periods:?}"));
    injected_ops
}

/// Waits for the stream with faults off, so host memory of a copy may be dropped.
fn drain(f: &Faulty, m: &Mgr) {
    let _ = f;
    // Only an injected fault can fail it, and faults come every k-th call: retrying succeeds.
    while kmm_manager_synchronize(m.0) != KMM_OK {}
}

fn check_stats(m: &Mgr, bufs: &[Tracked], sentinels: &[(KmmBuffer, u32, Vec<u8>)], what: &str) {
    let mut want = [(0u64, 0u64); 2];
    for t in bufs {
        let mut info = KmmBufferInfo::default();
        ok(kmm_buffer_info(m.0, t.handle, &mut info));
        want[info.kind as usize].0 += info.bytes;
        want[info.kind as usize].1 += 1;
    }
    for (_, kind, data) in sentinels {
        want[*kind as usize].0 += data.len() as u64;
        want[*kind as usize].1 += 1;
    }
    for kind in [DEVICE, PINNED] {
        let s = m.stats(kind);
        assert_eq!((s.in_use, s.live_buffers), want[kind as usize], "{what}: stats of kind {kind} disagree with the live buffers");
        assert!(s.reserved >= s.in_use, "{what}: reserved {} < in use {}", s.reserved, s.in_use);
    }
}

#[test]
fn faults_surface_as_statuses_and_spare_everything_else() {
    let _wd = Watchdog::arm("fault scenarios", Duration::from_secs(300));
    let f = Faulty::new();
    let mut total = 0;
    let mut seed = 1;
    for (name, cfg) in configs() {
        for periods in [(3, 0, 0), (0, 4, 0), (0, 0, 5), (0, 0, 2), (7, 5, 11), (2, 3, 3)] {
            total += scenario(&f, name, cfg, periods, seed);
            seed += 1;
        }
    }
    let c = f.plan.counts();
    eprintln!(
        "trust_faults: {total} faults injected over {} allocations, {} copies, {} stream operations",
        c.alloc_ops, c.copy_ops, c.stream_ops
    );
}

/// The out-of-memory ladder: when the upstream refuses once, the manager synchronizes, gives
/// its cached chunks back and retries; when it keeps refusing, the caller gets OUT_OF_MEMORY,
/// the failure is counted, and the cache has been trimmed.
#[test]
fn allocation_failure_trims_and_retries() {
    let f = Faulty::new();
    let m = Mgr::with(|c| {
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32; // the cache is the pool's
        c.chunk_size = 1 << 20;
    });
    // Fill the cache: allocate and free one chunk's worth.
    let b = m.alloc(512 << 10, DEVICE);
    m.free(b);
    let reserved = m.stats(DEVICE).reserved;
    assert!(reserved >= 1 << 20);
    // A request the cache cannot serve; the first upstream call fails, the retry succeeds.
    f.plan.set(1, 0, 0);
    let mut b = 0;
    expect_err(kmm_buffer_alloc(m.0, 3 << 20, DEVICE, &mut b), KMM_ERROR_OUT_OF_MEMORY, &["injected fault"]);
    let s = m.stats(DEVICE);
    assert_eq!(s.failed_allocs, 1);
    assert_eq!(s.reserved, 0, "the out-of-memory path gives cached chunks back before failing");
    f.plan.set(2, 0, 0);
    let b = m.alloc(3 << 20, DEVICE);
    assert_eq!(m.stats(DEVICE).failed_allocs, 1, "the retry rung served it");
    f.plan.clear();
    let data = pattern(3 << 20, 5);
    m.upload(b, 0, &data);
    assert_eq!(m.download(b, 0, data.len()), data);
    m.free(b);
    drop(m);
    f.assert_no_leak("ladder");
}

/// Manager creation under faults: fails with a status or succeeds; either way nothing leaks.
#[test]
fn manager_creation_and_teardown_under_faults() {
    let f = Faulty::new();
    for k in 1..6 {
        f.plan.set(k, k, k);
        for _ in 0..20 {
            let mut c = default_config();
            c.initial_pool_size = 1 << 20;
            let mut m = 0;
            let st = kmm_manager_create(&c, &mut m);
            if acceptable(st, "create") {
                let mut b = 0;
                if acceptable(kmm_buffer_alloc(m, 1000, PINNED, &mut b), "alloc") {
                    let d = pattern(1000, 1);
                    let _ = acceptable(kmm_copy_to_device(m, b, 0, d.as_ptr().cast(), 1000), "copy");
                }
                // Destroy heals itself: it must not need a healthy device to free everything.
                f.plan.clear();
                ok(kmm_manager_destroy(m, 0));
                f.plan.set(k, k, k);
            }
        }
    }
    f.plan.clear();
    f.assert_no_leak("create/destroy under faults");
}

/// Waits for the work queued on `m`'s stream so far without `kmm_manager_synchronize` (which
/// also gives memory back).
fn wait_for_stream(m: &Mgr) {
    let mut event = 0;
    ok(kmm_manager_record_event(m.0, &mut event));
    ok(kmm_event_wait(m.0, event));
    ok(kmm_event_destroy(m.0, event));
}

const MIB: u64 = 1 << 20;

/// Device memory from a backend of the installed plan (so its books count it), for adoption.
fn raw_device(bytes: u64) -> u64 {
    let backend = kmm::backend::open(kmm::backend::BackendChoice::Auto, 0).unwrap();
    backend.alloc_device(bytes).unwrap()
}

/// A buffer's free never frees memory upstream: `cuMemFree` waits for the whole device, and the
/// lane's lock, which every free of the lane needs, would be held across that wait. Memory of
/// whole allocations (direct mode, adopted memory) whose free the stream has passed goes back
/// at the next allocation or adoption, after the lane's lock is dropped.
#[test]
fn frees_never_free_upstream() {
    let f = Faulty::new();
    {
        let m = Mgr::with(|c| c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32);
        let a = m.alloc(MIB, DEVICE);
        let b = m.alloc(MIB, DEVICE);
        m.free(a);
        wait_for_stream(&m); // a's free is passed: the next free may reclaim it
        let live = f.plan.live().0;
        m.free(b);
        assert_eq!(f.plan.live().0, live, "a free gave memory back upstream (direct mode)");
        let c = m.alloc(MIB, DEVICE);
        assert!(f.plan.live().0 < live + 1, "the allocation after the frees did not give a's memory back: {:?}", f.plan.live());
        m.free(c);

        // Adopted memory: an adopt-and-free loop returns it without synchronize or trim.
        let mut adopted = Vec::new();
        for _ in 0..2 {
            let raw = raw_device(MIB);
            let mut buffer = 0;
            ok(kmm_buffer_wrap(m.0, raw as *mut std::ffi::c_void, MIB, DEVICE, 1, &mut buffer));
            adopted.push(buffer);
        }
        m.free(adopted[0]);
        wait_for_stream(&m);
        let live = f.plan.live().0;
        m.free(adopted[1]);
        assert_eq!(f.plan.live().0, live, "a free gave adopted memory back upstream");
        let raw = raw_device(MIB);
        let mut buffer = 0;
        ok(kmm_buffer_wrap(m.0, raw as *mut std::ffi::c_void, MIB, DEVICE, 1, &mut buffer));
        assert!(f.plan.live().0 <= live, "the adoption after the frees did not give memory back: {:?}", f.plan.live());
        m.free(buffer);
    }
    f.assert_no_leak("direct and adopted memory");
}
