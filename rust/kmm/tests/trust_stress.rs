//! Concurrency stress: 16 threads mix allocations, frees, copies (sync, async, staged, between
//! managers), fills and statistics on two shared managers and on managers of their own, with
//! every byte verified, while two "finalizer" threads free buffers the owners dropped. Owners
//! also destroy their managers with buffers still live. A watchdog turns a deadlock into a
//! failure. At the end every manager is empty and nothing made through the backend is live.
//!
//! KMM_TRUST_STRESS_SECS bounds the run (default 8 seconds).
mod common;
mod trust_support;
use common::*;
use kmm::backend::faulty::{self, FaultPlan};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trust_support::*;

const THREADS: usize = 16;

fn secs() -> u64 {
    std::env::var("KMM_TRUST_STRESS_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(8)
}

fn make_manager(sub: u32, staging: u64) -> KmmManager {
    let mut c = default_config();
    c.suballocator = sub;
    c.chunk_size = 2 << 20;
    c.staging_chunk_size = staging;
    let mut m = 0;
    ok(kmm_manager_create(&c, &mut m));
    m
}

struct Owned {
    mgr: KmmManager,
    handle: KmmBuffer,
    data: Vec<u8>,
}

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    bytes: AtomicU64,
    finalized: AtomicU64,
    destroyed: AtomicU64,
}

fn download(m: KmmManager, b: KmmBuffer, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    ok(kmm_copy_to_host(m, out.as_mut_ptr().cast(), b, 0, len as u64));
    out
}

fn worker(id: usize, shared: [KmmManager; 2], to_finalizer: Sender<(KmmManager, KmmBuffer)>, counts: Arc<Counts>, deadline: Instant) {
    let mut rng = Rng::new(1000 + id as u64);
    let mut own = make_manager(KmmSuballocator::KMM_SUBALLOC_HEAP as u32, 64 << 10);
    let mut bufs: Vec<Owned> = Vec::new();
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let op = rng.below(100);
        let verify_bytes = |o: &Owned, what: &str| {
            let got = download(o.mgr, o.handle, o.data.len());
            assert!(got == o.data, "thread {id} op {n}: {what}: buffer {:#x} of manager {:#x} read back wrong", o.handle, o.mgr);
            counts.bytes.fetch_add(o.data.len() as u64, Ordering::Relaxed);
        };
        match op {
            0..=29 => {
                let mgr = if rng.below(2) == 0 { own } else { shared[rng.below(2) as usize] };
                let len = match rng.below(10) {
                    0 => (256 << 10) + rng.below(600 << 10) as usize,
                    1..=3 => rng.below(64 << 10) as usize,
                    _ => 1 + rng.below(4096) as usize,
                };
                let kind = if rng.below(5) == 0 { PINNED } else { DEVICE };
                let mut b = 0;
                ok(kmm_buffer_alloc(mgr, len as u64, kind, &mut b));
                let data = pattern(len, (id as u64) << 32 | n);
                ok(kmm_copy_to_device(mgr, b, 0, data.as_ptr().cast(), len as u64));
                bufs.push(Owned { mgr, handle: b, data });
            }
            30..=44 if !bufs.is_empty() => {
                let o = bufs.swap_remove(rng.below(bufs.len() as u64) as usize);
                // Own buffers are freed here so the exact statistics check below stays exact.
                if rng.below(2) == 0 || o.mgr == own {
                    ok(kmm_buffer_free(o.mgr, o.handle, 0));
                } else {
                    // Dropped: a finalizer thread frees it later, while we go on allocating.
                    to_finalizer.send((o.mgr, o.handle)).unwrap();
                }
            }
            45..=59 if !bufs.is_empty() => {
                let o = &bufs[rng.below(bufs.len() as u64) as usize];
                verify_bytes(o, "sync read");
            }
            60..=69 if !bufs.is_empty() => {
                let o = &bufs[rng.below(bufs.len() as u64) as usize];
                let mut out = vec![0u8; o.data.len()];
                let mut ev = 0;
                ok(kmm_copy_to_host_async(o.mgr, out.as_mut_ptr().cast(), o.handle, 0, out.len() as u64, &mut ev));
                ok(kmm_event_wait(o.mgr, ev));
                ok(kmm_event_destroy(o.mgr, ev));
                assert!(out == o.data, "thread {id} op {n}: async read after event wait is wrong");
            }
            70..=79 if bufs.len() >= 2 => {
                // Copy one buffer into another (same or different managers), then verify.
                let (a, b) = (rng.below(bufs.len() as u64) as usize, rng.below(bufs.len() as u64) as usize);
                if a != b {
                    let len = bufs[a].data.len().min(bufs[b].data.len());
                    let (dm, d, sm, s) = (bufs[a].mgr, bufs[a].handle, bufs[b].mgr, bufs[b].handle);
                    ok(kmm_copy_buffer(dm, d, 0, sm, s, 0, len as u64));
                    let src = bufs[b].data[..len].to_vec();
                    bufs[a].data[..len].copy_from_slice(&src);
                    // Free the source right away: the queued copy must still see its bytes.
                    if rng.below(3) == 0 {
                        let o = bufs.swap_remove(b);
                        ok(kmm_buffer_free(o.mgr, o.handle, 0));
                        let a = if a == bufs.len() { b } else { a };
                        verify_bytes(&bufs[a], "copy_buffer then free of the source");
                    }
                }
            }
            80..=86 if !bufs.is_empty() => {
                let i = rng.below(bufs.len() as u64) as usize;
                let width = [1usize, 2, 3, 4, 8][rng.below(5) as usize];
                let pat = pattern(width, n);
                let len = bufs[i].data.len() / width * width;
                ok(kmm_fill(bufs[i].mgr, bufs[i].handle, 0, len as u64, pat.as_ptr().cast(), width));
                for j in 0..len {
                    bufs[i].data[j] = pat[j % width];
                }
                if rng.below(3) == 0 {
                    verify_bytes(&bufs[i], "fill");
                }
            }
            87..=93 => {
                // Statistics: exact for our own manager, plausible for the shared ones.
                let mut s = KmmMemoryStats::default();
                let mine: Vec<&Owned> = bufs.iter().filter(|o| o.mgr == own).collect();
                let (mut dev, mut count) = (0u64, 0u64);
                for o in &mine {
                    let mut info = KmmBufferInfo::default();
                    ok(kmm_buffer_info(own, o.handle, &mut info));
                    if info.kind == DEVICE {
                        dev += o.data.len() as u64;
                        count += 1;
                    }
                }
                ok(kmm_manager_stats(own, DEVICE, &mut s));
                assert_eq!((s.in_use, s.live_buffers), (dev, count), "thread {id}: own manager's stats");
                ok(kmm_manager_stats(shared[rng.below(2) as usize], PINNED, &mut s));
                assert!(s.allocs >= s.frees && s.reserved >= s.in_use, "shared stats inconsistent: {s:?}");
            }
            94..=96 => ok(kmm_manager_synchronize(shared[rng.below(2) as usize])),
            97 => ok(kmm_manager_trim(own, 0)),
            98 => {
                // Destroy our manager with live buffers (sometimes deferred), then start anew.
                let flags = if rng.below(2) == 0 { KMM_DESTROY_DEFERRED } else { 0 };
                ok(kmm_manager_destroy(own, flags));
                for o in bufs.iter().filter(|o| o.mgr == own) {
                    assert_eq!(kmm_buffer_free(own, o.handle, 0), KMM_ERROR_INVALID_HANDLE);
                }
                bufs.retain(|o| o.mgr != own);
                counts.destroyed.fetch_add(1, Ordering::Relaxed);
                own = make_manager(KmmSuballocator::KMM_SUBALLOC_BINNED as u32, 64 << 10);
            }
            _ => {}
        }
        if bufs.len() > 40 {
            let o = bufs.swap_remove(0);
            if o.mgr == own {
                ok(kmm_buffer_free(o.mgr, o.handle, 0));
            } else {
                to_finalizer.send((o.mgr, o.handle)).unwrap();
            }
        }
        counts.ops.fetch_add(1, Ordering::Relaxed);
    }
    for o in &bufs {
        let got = download(o.mgr, o.handle, o.data.len());
        assert!(got == o.data, "thread {id}: final read of {:#x} is wrong", o.handle);
    }
    for o in bufs {
        if o.mgr == own {
            ok(kmm_buffer_free(o.mgr, o.handle, 0));
        } else {
            to_finalizer.send((o.mgr, o.handle)).unwrap();
        }
    }
    ok(kmm_manager_destroy(own, 0));
}

#[test]
fn sixteen_threads_on_shared_and_own_managers() {
    let _serial = plan_lock();
    let plan = FaultPlan::new(); // no faults: keeps the books for the leak check
    faulty::install(Some(plan.clone()));
    let secs = secs();
    let _wd = Watchdog::arm("trust_stress", Duration::from_secs(secs * 6 + 60));
    let shared = [make_manager(KmmSuballocator::KMM_SUBALLOC_BINNED as u32, 64 << 10), make_manager(KmmSuballocator::KMM_SUBALLOC_HEAP as u32, 4096)];
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs(secs);
    // Finalizers: free what owners dropped, from threads that allocate nothing.
    let (tx, rx) = channel::<(KmmManager, KmmBuffer)>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let finalizers: Vec<_> = (0..2)
        .map(|_| {
            let rx = rx.clone();
            let counts = counts.clone();
            std::thread::spawn(move || loop {
                let next = rx.lock().unwrap().recv();
                let Ok((m, b)) = next else { break };
                let st = kmm_buffer_free(m, b, 0);
                // The owner may have destroyed its manager since: that handle is dead, not an error.
                assert!(st == KMM_OK || st == KMM_ERROR_INVALID_HANDLE, "finalizer free: {st:?} {}", last_error());
                counts.finalized.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let tx = tx.clone();
            let counts = counts.clone();
            std::thread::spawn(move || worker(id, shared, tx, counts, deadline))
        })
        .collect();
    drop(tx);
    let mut failed = None;
    for w in workers {
        if let Err(e) = w.join() {
            failed.get_or_insert(e);
        }
    }
    for f in finalizers {
        f.join().unwrap();
    }
    if let Some(e) = failed {
        faulty::install(None);
        std::panic::resume_unwind(e);
    }
    for m in shared {
        ok(kmm_manager_synchronize(m));
        for kind in [DEVICE, PINNED] {
            let mut s = KmmMemoryStats::default();
            ok(kmm_manager_stats(m, kind, &mut s));
            assert_eq!((s.in_use, s.live_buffers), (0, 0), "shared manager not empty at the end: {s:?}");
            assert_eq!(s.allocs, s.frees);
        }
        ok(kmm_manager_destroy(m, 0));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while plan.live().0 != 0 {
        assert!(Instant::now() < deadline, "leak after stress: {:?}", plan.live());
        std::thread::sleep(Duration::from_millis(5));
    }
    faulty::install(None);
    eprintln!(
        "trust_stress: {THREADS} threads, {} s: {} operations, {} bytes verified, {} finalizer frees, {} managers destroyed with live buffers",
        secs,
        counts.ops.load(Ordering::Relaxed),
        counts.bytes.load(Ordering::Relaxed),
        counts.finalized.load(Ordering::Relaxed),
        counts.destroyed.load(Ordering::Relaxed)
    );
}

/// Many threads race to free the same handles: exactly one free of each succeeds.
#[test]
fn racing_double_frees_succeed_exactly_once() {
    let _serial = plan_lock();
    let _wd = Watchdog::arm("double-free race", Duration::from_secs(120));
    let m = make_manager(KmmSuballocator::KMM_SUBALLOC_BINNED as u32, 64 << 10);
    for round in 0..50 {
        let handles: Vec<KmmBuffer> = (0..64)
            .map(|i| {
                let mut b = 0;
                ok(kmm_buffer_alloc(m, 64 + i * 8, DEVICE, &mut b));
                b
            })
            .collect();
        let handles = Arc::new(handles);
        let wins = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (handles, wins) = (handles.clone(), wins.clone());
                std::thread::spawn(move || {
                    for k in 0..handles.len() {
                        let b = handles[(k + t * 7) % handles.len()];
                        match kmm_buffer_free(m, b, 0) {
                            KMM_OK => {
                                wins.fetch_add(1, Ordering::SeqCst);
                            }
                            KMM_ERROR_INVALID_HANDLE => {}
                            other => panic!("racing free: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(wins.load(Ordering::SeqCst), 64, "round {round}: frees that succeeded");
        let mut s = KmmMemoryStats::default();
        ok(kmm_manager_stats(m, DEVICE, &mut s));
        assert_eq!((s.in_use, s.live_buffers), (0, 0));
    }
    ok(kmm_manager_destroy(m, 0));
}

/// Destroying a manager while other threads are calling into it: calls either complete or
/// see INVALID_HANDLE; nothing crashes or hangs.
#[test]
fn destroy_races_with_calls_in_flight() {
    let _serial = plan_lock();
    let _wd = Watchdog::arm("destroy race", Duration::from_secs(120));
    for round in 0..30u64 {
        let m = make_manager(KmmSuballocator::KMM_SUBALLOC_BINNED as u32, 64 << 10);
        let threads: Vec<_> = (0..6)
            .map(|t| {
                std::thread::spawn(move || {
                    let data = pattern(300 << 10, t);
                    for _ in 0..200 {
                        let mut b = 0;
                        match kmm_buffer_alloc(m, data.len() as u64, DEVICE, &mut b) {
                            KMM_OK => {}
                            KMM_ERROR_INVALID_HANDLE => return,
                            other => panic!("alloc during destroy: {other:?}"),
                        }
                        for st in [
                            kmm_copy_to_device(m, b, 0, data.as_ptr().cast(), data.len() as u64),
                            kmm_buffer_free(m, b, 0),
                        ] {
                            assert!(st == KMM_OK || st == KMM_ERROR_INVALID_HANDLE, "call during destroy: {st:?}");
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(round % 7));
        ok(kmm_manager_destroy(m, if round % 2 == 0 { KMM_DESTROY_DEFERRED } else { 0 }));
        for t in threads {
            t.join().unwrap();
        }
    }
}
