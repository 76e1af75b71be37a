//! Adversarial tests (sixth run): each test here failed on the code it was written against.
mod common;
mod trust_support;
use trust_support::{Rng, Watchdog};
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// `kmm_manager_reset_peaks` "resets the peak counters to their current values". Racing an
/// allocation on another thread, the reset can store the bytes in use it read *before* the
/// allocation after the allocation raised the peak: the peak then stays below the bytes in use
/// (a single allocating thread checks its own stats right after each allocation returned, so no
/// transient is seen: only the allocating thread changes `in_use`).
#[test]
fn reset_peaks_racing_an_allocation_never_leaves_the_peak_below_in_use() {
    let m = Arc::new(Mgr::new());
    let stop = Arc::new(AtomicBool::new(false));
    let resets = Arc::new(AtomicU64::new(0));
    let resetter = {
        let (m, stop, resets) = (m.clone(), stop.clone(), resets.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                ok(kmm_manager_reset_peaks(m.0));
                resets.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut bad = None;
    let mut rounds = 0u64;
    while Instant::now() < deadline {
        rounds += 1;
        let b = m.alloc(4096, DEVICE);
        let s = m.stats(DEVICE);
        m.free(b);
        if s.peak_in_use < s.in_use {
            bad = Some(s);
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    resetter.join().unwrap();
    if let Some(s) = bad {
        panic!(
            "after {rounds} allocations ({} resets): peak_in_use {} < in_use {} (the only allocating thread's buffer is live)",
            resets.load(Ordering::Relaxed),
            s.peak_in_use,
            s.in_use
        );
    }
}

/// `kmm_fill`'s arguments are `buffer` and `offset`; an out-of-range fill must name them (the
/// message names `dst_offset` and "the dst buffer", arguments kmm_fill does not have).
#[test]
fn an_out_of_range_fill_names_its_own_arguments() {
    let m = Mgr::new();
    let b = m.alloc(4096, DEVICE);
    let p = [7u8; 8];
    let st = kmm_fill(m.0, b, 4088, 16, p.as_ptr().cast(), 8);
    let msg = last_error();
    assert_eq!(st, KMM_ERROR_OUT_OF_RANGE);
    assert!(
        msg.contains("offset = 4088") && !msg.contains("dst_offset") && !msg.contains("dst buffer"),
        "kmm_fill(buffer, offset = 4088, bytes = 16): the message names arguments kmm_fill does not have: {msg:?}"
    );
    m.free(b);
}

/// Spill under four threads with a pinned limit: device buffers spill into pinned memory and
/// pinned allocations take it back (moving spilled data to pageable memory), while a fifth
/// thread reads the stats. Every snapshot must be consistent (pageable part of the spilled
/// bytes, spilled bytes not above their peak, live bytes in use or spilled), every byte must
/// come back, and the stats must balance at the end.
#[test]
fn spill_with_pinned_allocations_under_threads_keeps_bytes_and_consistent_stats() {
    const UNIT: u64 = 256 << 10;
    let _dog = Watchdog::arm("spill_with_pinned_allocations_under_threads", Duration::from_secs(240));
    let m = Arc::new(Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.chunk_size = 2 * MIB;
        c.hard_limit = 6 * MIB;
        c.spill_limit = 256 * MIB;
        c.pinned_limit = 6 * MIB;
        c.pinned_chunk_size = 2 * MIB;
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || -> Option<String> {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                reads += 1;
                let s = m.stats(DEVICE);
                if s.spilled_pageable_bytes > s.spilled_bytes {
                    return Some(format!("read {reads}: spilled_pageable_bytes > spilled_bytes: {s:?}"));
                }
                if s.peak_spilled_bytes < s.spilled_bytes {
                    return Some(format!("read {reads}: peak_spilled_bytes {} < spilled_bytes {}: {s:?}", s.peak_spilled_bytes, s.spilled_bytes));
                }
                std::thread::yield_now();
            }
            None
        })
    };
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 11);
                let mut set: Vec<(KmmBuffer, Vec<u8>)> = (0..8)
                    .map(|i| {
                        let b = m.alloc(2 * UNIT, DEVICE);
                        let d = pattern(2 * UNIT as usize, t * 100 + i);
                        m.upload(b, 0, &d);
                        (b, d)
                    })
                    .collect();
                for step in 0..1500 {
                    let i = rng.below(set.len() as u64) as usize;
                    let (b, len) = (set[i].0, set[i].1.len());
                    match rng.below(6) {
                        0 => {
                            let d = pattern(len, rng.next());
                            m.upload(b, 0, &d);
                            set[i].1 = d;
                        }
                        1 => assert!(m.download(b, 0, len) == set[i].1, "thread {t} step {step}: download differs"),
                        2 => {
                            let v = rng.below(256) as u8;
                            ok(kmm_fill(m.0, b, 0, len as u64, (&v as *const u8).cast(), 1));
                            set[i].1.fill(v);
                        }
                        3 => {
                            // A pinned buffer of 1-3 MiB: takes pinned memory back from spilled data.
                            let bytes = MIB * (1 + rng.below(3));
                            let mut p = 0;
                            let st = kmm_buffer_alloc(m.0, bytes, PINNED, &mut p);
                            if st == KMM_OK {
                                let d = pattern(bytes as usize, rng.next());
                                m.upload(p, 0, &d);
                                assert!(m.download(p, 0, bytes as usize) == d, "thread {t}: pinned round trip");
                                m.free(p);
                            } else {
                                assert_eq!(st, KMM_ERROR_OUT_OF_MEMORY, "{}", last_error());
                            }
                        }
                        4 => {
                            m.free(b);
                            let bytes = UNIT * (1 + rng.below(3));
                            let nb = m.alloc(bytes, DEVICE);
                            let d = pattern(bytes as usize, rng.next());
                            m.upload(nb, 0, &d);
                            set[i] = (nb, d);
                        }
                        _ => {
                            let j = rng.below(set.len() as u64) as usize;
                            let n = len.min(set[j].1.len());
                            if j != i {
                                ok(kmm_copy_buffer(m.0, set[j].0, 0, m.0, b, 0, n as u64));
                                let head = set[i].1[..n].to_vec();
                                set[j].1[..n].copy_from_slice(&head);
                            }
                        }
                    }
                }
                for (b, d) in &set {
                    assert!(&m.download(*b, 0, d.len()) == d, "thread {t}: final read differs");
                }
                for (b, _) in set {
                    m.free(b);
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for w in workers {
        if let Err(e) = w.join() {
            failed.push(format!("{:?}", e.downcast_ref::<String>()));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let seen = reader.join().unwrap();
    assert!(failed.is_empty(), "workers failed: {failed:?}");
    let s = m.stats(DEVICE);
    assert!(s.spills > 0, "{s:?}");
    assert_eq!((s.in_use, s.spilled_bytes, s.spilled_pageable_bytes, s.spilled_buffers, s.live_buffers), (0, 0, 0, 0, 0), "{s:?}");
    if let Some(msg) = seen {
        panic!("{msg}");
    }
}
