//! Spill to host through the C ABI: live sets larger than the limit run, bytes survive every
//! trip, mapped and never-spill buffers stay put, out of memory comes only past the spill limit,
//! eviction waits for the streams that used a buffer, and the stats balance. On the host backend
//! (device memory bounded by `hard_limit`, spilled buffers in separate host memory); with
//! KMM_TEST_GPU=1 the tests that read no device address from the host run on CUDA.
mod common;
mod trust_support;
use common::*;
use kmm::backend::host::HostBackend;
use kmm::backend::Stream;
use kmm::ffi::trace::*;
use std::sync::Arc;
use trust_support::Rng;

const MIB: u64 = 1 << 20;

/// A pool-mode manager on the suite's backend (CUDA with KMM_TEST_GPU=1).
fn spill_manager(hard_limit: u64, spill_limit: u64) -> Mgr {
    Mgr::with(|c| {
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.chunk_size = 2 * MIB;
        c.hard_limit = hard_limit;
        c.spill_limit = spill_limit;
    })
}

/// As `spill_manager`, always on the host backend: for tests that read device addresses from
/// the host or block its stream.
fn host_spill_manager(hard_limit: u64, spill_limit: u64) -> Mgr {
    Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.chunk_size = 2 * MIB;
        c.hard_limit = hard_limit;
        c.spill_limit = spill_limit;
    })
}


fn map(m: &Mgr, b: KmmBuffer) -> u64 {
    let mut p = 0;
    ok(kmm_buffer_map(m.0, b, &mut p));
    p
}

/// Allocates `n` buffers of `bytes` each, writing each its own pattern; returns them.
fn fill_set(m: &Mgr, n: usize, bytes: u64) -> Vec<(KmmBuffer, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let b = m.alloc(bytes, DEVICE);
            let data = pattern(bytes as usize, i as u64 + 1);
            m.upload(b, 0, &data);
            (b, data)
        })
        .collect()
}

#[test]
fn a_live_set_three_times_the_hard_limit_runs_and_reads_back_exactly() {
    let m = spill_manager(8 * MIB, 64 * MIB);
    let set = fill_set(&m, 48, 512 << 10);
    let s = m.stats(DEVICE);
    assert!(s.spills > 0 && s.spilled_bytes >= 16 * MIB, "{s:?}");
    assert!(s.reserved <= 8 * MIB, "the hard limit holds: {s:?}");
    assert_eq!(s.in_use + s.spilled_bytes, 48 * (512 << 10), "every live byte is on the device or the host: {s:?}");
    // Random order: every read brings its buffer back, spilling others.
    let mut rng = Rng::new(7);
    for _ in 0..3 {
        for _ in 0..set.len() {
            let (b, data) = &set[rng.below(set.len() as u64) as usize];
            assert_eq!(&m.download(*b, 0, data.len()), data);
        }
    }
    let s = m.stats(DEVICE);
    assert!(s.restores > 0 && s.restored_in_bytes > 0 && s.spill_time_ns > 0, "{s:?}");
    assert_eq!(s.in_use + s.spilled_bytes, 48 * (512 << 10), "{s:?}");
    let summary = {
        let mut needed = 0usize;
        kmm_manager_summary(m.0, std::ptr::null_mut(), 0, &mut needed);
        let mut buf = vec![0u8; needed];
        ok(kmm_manager_summary(m.0, buf.as_mut_ptr().cast(), needed, std::ptr::null_mut()));
        String::from_utf8_lossy(&buf).to_string()
    };
    assert!(summary.contains("spill:") && summary.contains("restores"), "{summary}");
    for (b, _) in &set {
        m.free(*b);
    }
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.spilled_bytes, s.live_buffers), (0, 0, 0), "{s:?}");
}

#[test]
fn without_a_spill_limit_the_same_workload_runs_out_of_memory() {
    let m = spill_manager(8 * MIB, 0);
    let mut held = Vec::new();
    let mut failed = None;
    for _ in 0..48 {
        let mut b = 0;
        let st = kmm_buffer_alloc(m.0, 512 << 10, DEVICE, &mut b);
        if st != KMM_OK {
            failed = Some((st, last_error()));
            break;
        }
        held.push(b);
    }
    let (st, msg) = failed.expect("the hard limit must stop a live set three times its size");
    assert_eq!(st, KMM_ERROR_OUT_OF_MEMORY);
    assert!(msg.contains("no spill (KmmConfig.spill_limit is 0)"), "{msg}");
    assert_eq!(m.stats(DEVICE).spills, 0);
    for b in held {
        m.free(b);
    }
}

#[test]
fn out_of_memory_comes_past_the_spill_limit_with_both_figures_and_nothing_is_lost() {
    let m = spill_manager(4 * MIB, 4 * MIB);
    let mut set = Vec::new();
    let err = loop {
        let mut b = 0;
        let st = kmm_buffer_alloc(m.0, MIB, DEVICE, &mut b);
        if st != KMM_OK {
            break (st, last_error());
        }
        let data = pattern(MIB as usize, set.len() as u64 + 100);
        m.upload(b, 0, &data);
        set.push((b, data));
        assert!(set.len() <= 8, "device (4 MiB) plus spill limit (4 MiB) hold 8 buffers of 1 MiB");
    };
    assert_eq!(err.0, KMM_ERROR_OUT_OF_MEMORY, "{}", err.1);
    assert!(set.len() >= 6, "at least device plus limit minus a chunk's slack fit: {}", set.len());
    assert!(err.1.contains("hard limit 4.00 MiB") && err.1.contains("spill limit of 4.00 MiB"), "{}", err.1);
    for (b, data) in &set {
        assert_eq!(&m.download(*b, 0, data.len()), data, "a failed allocation lost nothing");
    }
}

#[test]
fn mapped_and_never_spill_buffers_stay_on_the_device() {
    let m = host_spill_manager(4 * MIB, 64 * MIB);
    let mapped = m.alloc(MIB, DEVICE);
    let keep = m.alloc(MIB, DEVICE);
    m.upload(keep, 0, &pattern(MIB as usize, 5));
    let addr = map(&m, mapped);
    // SAFETY: host backend: the device address is host memory, mapped for this test.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0xAB, MIB as usize) };
    ok(kmm_buffer_never_spill(m.0, keep, true));
    let keep_addr = {
        let a = map(&m, keep);
        ok(kmm_buffer_unmap(m.0, keep));
        a
    };
    let others = fill_set(&m, 8, MIB);
    assert!(m.stats(DEVICE).spills >= 6);
    assert_eq!((m.info(mapped).spilled, m.info(keep).spilled, m.info(keep).never_spill), (0, 0, 1));
    let again = map(&m, keep);
    assert_eq!(again, keep_addr, "a never-spill buffer did not move");
    ok(kmm_buffer_unmap(m.0, keep));
    // SAFETY: still mapped.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, MIB as usize) };
    assert!(bytes.iter().all(|&b| b == 0xAB), "a mapped buffer never moves");
    assert!(others.iter().any(|(b, _)| m.info(*b).spilled == 1));
    // Marking a spilled buffer never-spill brings it back.
    let (spilled, data) = others.iter().find(|(b, _)| m.info(*b).spilled == 1).unwrap();
    ok(kmm_buffer_unmap(m.0, mapped));
    ok(kmm_buffer_never_spill(m.0, *spilled, true));
    assert_eq!(m.info(*spilled).spilled, 0);
    assert_eq!(&m.download(*spilled, 0, data.len()), data);
}

#[test]
fn a_spill_waits_for_work_queued_on_a_recorded_stream() {
    // Another manager's stream stands for a foreign stream (CUDA.jl's, PyTorch's).
    let m = host_spill_manager(4 * MIB, 64 * MIB);
    let host = HostBackend::get(0).unwrap();
    let foreign: Arc<dyn Stream> = host.create_stream().unwrap();
    let b = m.alloc(MIB, DEVICE);
    m.upload(b, 0, &vec![1u8; MIB as usize]);
    m.sync();
    let addr = map(&m, b);
    ok(kmm_buffer_record_stream(m.0, b, foreign.raw()));
    // Foreign work that writes the buffer late, after Kmm's stream could have copied it out.
    let gate = Arc::new(std::sync::Barrier::new(2));
    let g = gate.clone();
    foreign
        .launch_host_fn(Box::new(move || {
            g.wait();
            std::thread::sleep(std::time::Duration::from_millis(50));
            // SAFETY: the buffer is recorded on this stream, so Kmm keeps it until this ran.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 7, MIB as usize) };
        }))
        .unwrap();
    ok(kmm_buffer_unmap(m.0, b));
    gate.wait();
    // Pressure: the buffer (least recently used) spills while the foreign write is queued.
    let others = fill_set(&m, 4, MIB);
    assert_eq!(m.info(b).spilled, 1, "the oldest buffer spilled");
    assert_eq!(m.download(b, 0, MIB as usize), vec![7u8; MIB as usize], "the spill copied the bytes after the foreign write");
    drop(others);
    foreign.synchronize().unwrap();
}

/// Holds the manager's stream back (queued work stays queued) until a thread opens it 100 ms
/// later; join the thread before the test ends.
fn hold_stream_for_100ms(m: &Mgr) -> std::thread::JoinHandle<()> {
    let gate = Gate::shut(m);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        gate.open();
    })
}

#[test]
fn a_map_after_a_restore_waits_for_the_copy_in() {
    let m = host_spill_manager(4 * MIB, 64 * MIB);
    let b = m.alloc(MIB, DEVICE);
    let data = pattern(MIB as usize, 77);
    m.upload(b, 0, &data);
    let others = fill_set(&m, 4, MIB);
    assert_eq!(m.info(b).spilled, 1);
    // Room on the device, so the restore needs no rung that waits; then the stream is held
    // back: the copy in stays queued until the gate opens.
    m.free(others[0].0);
    m.sync();
    let opener = hold_stream_for_100ms(&m);
    let p = map(&m, b);
    // SAFETY: host backend, mapped.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, MIB as usize) };
    assert!(bytes == &data[..], "the map returned before the restored bytes were in place");
    ok(kmm_buffer_unmap(m.0, b));
    opener.join().unwrap();
}

#[test]
fn a_new_buffer_in_a_spilled_place_waits_for_the_copy_out() {
    let m = host_spill_manager(4 * MIB, 64 * MIB);
    let x = m.alloc(4 * MIB, DEVICE);
    let data = pattern(4 * MIB as usize, 9);
    m.upload(x, 0, &data);
    m.sync();
    // The copy out of `x` stays queued until the gate opens; `y` takes `x`'s place at once.
    let opener = hold_stream_for_100ms(&m);
    let y = m.alloc(4 * MIB, DEVICE);
    assert_eq!(m.info(x).spilled, 1);
    let p = map(&m, y);
    // SAFETY: host backend, mapped; the map waited for the copy out of this place.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0x5A, 4 * MIB as usize) };
    ok(kmm_buffer_unmap(m.0, y));
    opener.join().unwrap();
    m.free(y);
    assert!(m.download(x, 0, data.len()) == data, "the spilled bytes were overwritten before the copy out read them");
}

#[test]
fn spills_and_restores_are_traced_and_the_rmm_form_pairs_them() {
    let m = spill_manager(4 * MIB, 64 * MIB);
    ok(kmm_manager_trace_start(m.0, 0, std::ptr::null(), 0));
    let set = fill_set(&m, 8, MIB);
    for (b, data) in &set {
        assert_eq!(&m.download(*b, 0, data.len()), data);
    }
    let mut n = 0usize;
    ok(kmm_manager_trace_records(m.0, std::ptr::null_mut(), 0, &mut n, std::ptr::null_mut()));
    let mut v = vec![KmmTraceRecord::default(); n];
    ok(kmm_manager_trace_records(m.0, v.as_mut_ptr(), n, &mut n, std::ptr::null_mut()));
    let spills: Vec<_> = v.iter().filter(|r| r.action == KmmTraceAction::KMM_TRACE_SPILL as u32).collect();
    let restores: Vec<_> = v.iter().filter(|r| r.action == KmmTraceAction::KMM_TRACE_RESTORE as u32).collect();
    let s = m.stats(DEVICE);
    assert_eq!((spills.len() as u64, restores.len() as u64), (s.spills, s.restores));
    assert!(spills.iter().all(|r| r.moved_from != 0 && r.address != 0 && r.bytes == MIB));
    let name = unsafe { std::ffi::CStr::from_ptr(kmm_trace_action_name(KmmTraceAction::KMM_TRACE_SPILL as u32)) };
    assert_eq!(name.to_str().unwrap(), "spill");
    // RMM's form: a spill is a free of the device place, a restore an allocation.
    let path = std::env::temp_dir().join(format!("kmm-spill-{}.csv", std::process::id()));
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    ok(kmm_manager_trace_save(m.0, c.as_ptr(), KMM_TRACE_RMM_ONLY));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    let allocs = rows.iter().filter(|l| l.contains(",allocate,")).count() as u64;
    let frees = rows.iter().filter(|l| l.contains(",free,")).count() as u64;
    assert_eq!(allocs, 8 + s.restores, "{text}");
    assert_eq!(frees, s.spills, "{text}");
    // The timeline draws the bytes on the host beside those on the device.
    let mut needed = 0usize;
    let timeline = KmmFigure::KMM_FIGURE_TIMELINE as u32;
    ok(kmm_manager_figure_svg(m.0, timeline, std::ptr::null_mut(), 0, &mut needed));
    let mut svg = vec![0u8; needed];
    ok(kmm_manager_figure_svg(m.0, timeline, svg.as_mut_ptr().cast(), needed, std::ptr::null_mut()));
    let svg = String::from_utf8_lossy(&svg);
    assert!(svg.contains("device spilled to host") && svg.contains("device in use"), "{svg}");
}

/// Eight threads, each with 24 buffers of 64 to 192 KiB (about 24 MiB in all, three times the
/// hard limit) in a compacting heap pool: random maps (reading and writing through the address),
/// uploads, downloads, fills, copies between buffers, frees and reallocations of other sizes, and
/// trims. A byte-exact model of every buffer.
#[test]
fn eight_threads_with_three_times_the_hard_limit_keep_every_byte() {
    const UNIT: u64 = 64 << 10;
    let m = Arc::new(Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_HEAP as u32;
        c.compaction_ratio_pct = 100;
        c.chunk_size = 2 * MIB;
        c.hard_limit = 8 * MIB;
        c.spill_limit = 64 * MIB;
    }));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 1);
                let mut set = fill_set(&m, 24, 2 * UNIT);
                for step in 0..400 {
                    let i = rng.below(set.len() as u64) as usize;
                    let b = set[i].0;
                    let len = set[i].1.len();
                    match rng.below(7) {
                        0 => {
                            let p = map(&m, b);
                            // Fills and copies are stream-ordered: the host reads after them.
                            m.sync();
                            // SAFETY: host backend, mapped until the unmap below.
                            let bytes = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
                            assert!(bytes == &set[i].1[..], "thread {t} step {step}: the mapped bytes differ from the model");
                            let v = rng.below(256) as u8;
                            bytes[..4096].fill(v);
                            set[i].1[..4096].fill(v);
                            ok(kmm_buffer_unmap(m.0, b));
                        }
                        1 => {
                            let new = pattern(len, rng.below(1 << 30));
                            m.upload(b, 0, &new);
                            set[i].1 = new;
                        }
                        2 => assert!(m.download(b, 0, len) == set[i].1, "thread {t} step {step}: the download differs from the model"),
                        3 => {
                            let v = rng.below(256) as u8;
                            ok(kmm_fill(m.0, b, 0, len as u64, (&v as *const u8).cast(), 1));
                            set[i].1.fill(v);
                        }
                        4 => {
                            let j = rng.below(set.len() as u64) as usize;
                            let n = len.min(set[j].1.len());
                            if j != i {
                                ok(kmm_copy_buffer(m.0, set[j].0, 0, m.0, b, 0, n as u64));
                                let head = set[i].1[..n].to_vec();
                                set[j].1[..n].copy_from_slice(&head);
                            }
                        }
                        5 => {
                            m.free(b);
                            let bytes = UNIT * (1 + rng.below(3));
                            let nb = m.alloc(bytes, DEVICE);
                            let new = pattern(bytes as usize, rng.below(1 << 30));
                            m.upload(nb, 0, &new);
                            set[i] = (nb, new);
                        }
                        _ => {
                            if rng.below(8) == 0 {
                                ok(kmm_manager_trim(m.0, 0));
                            }
                        }
                    }
                }
                for (b, data) in &set {
                    assert!(&m.download(*b, 0, data.len()) == data, "thread {t}: the final read differs from the model");
                }
                for (b, _) in set {
                    m.free(b);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a worker failed");
    }
    let s = m.stats(DEVICE);
    assert!(s.spills > 100 && s.restores > 100, "{s:?}");
    assert!(s.compactions > 0, "the pool never compacted: {s:?}");
    assert_eq!((s.in_use, s.spilled_bytes, s.spilled_buffers, s.live_buffers), (0, 0, 0, 0), "the stats balance: {s:?}");
    assert_eq!(s.failed_allocs, 0, "{s:?}");
}

fn mode_manager(mode: KmmAllocMode, hard_limit: u64, spill_limit: u64, f: impl FnOnce(&mut KmmConfig)) -> Mgr {
    Mgr::with(|c| {
        c.alloc_mode = mode as u32;
        c.chunk_size = 2 * MIB;
        c.hard_limit = hard_limit;
        c.spill_limit = spill_limit;
        f(c);
    })
}

/// Ten buffers of a quarter of the limit, read back twice in reverse, then freed.
fn round_trip(m: &Mgr, bytes: u64) {
    let set = fill_set(m, 10, bytes);
    for _ in 0..2 {
        for (b, data) in set.iter().rev() {
            assert_eq!(&m.download(*b, 0, data.len()), data);
        }
    }
    assert!(m.stats(DEVICE).spills > 0, "{:?}", m.stats(DEVICE));
    for (b, _) in set {
        m.free(b);
    }
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.spilled_bytes, s.spilled_buffers, s.live_buffers), (0, 0, 0, 0), "{s:?}");
}

#[test]
fn direct_and_cuda_async_modes_spill_too() {
    // CUDA's pools keep their own granularity: a limit of a few MiB is not one there.
    let bytes = if gpu() { 32 * MIB } else { MIB };
    round_trip(&mode_manager(KmmAllocMode::KMM_ALLOC_DIRECT, 4 * bytes, 16 * bytes, |_| {}), bytes);
    round_trip(&mode_manager(KmmAllocMode::KMM_ALLOC_CUDA_ASYNC, 4 * bytes, 16 * bytes, |_| {}), bytes);
}

/// The spill store's pinned chunks count against the pinned limit: once its buffers are gone,
/// a pinned allocation that needs them gets them back.
#[test]
fn pinned_memory_the_spill_store_cached_goes_to_pinned_allocations() {
    let m = mode_manager(KmmAllocMode::KMM_ALLOC_POOL, 4 * MIB, 64 * MIB, |c| {
        c.pinned_limit = 4 * MIB;
        c.pinned_chunk_size = 2 * MIB;
    });
    let set = fill_set(&m, 8, MIB);
    assert!(m.stats(DEVICE).spills >= 4);
    for (b, _) in set {
        m.free(b);
    }
    m.sync();
    let mut p = 0;
    ok(kmm_buffer_alloc(m.0, 2 * MIB, PINNED, &mut p));
    m.free(p);
}

#[test]
fn a_failed_never_spill_leaves_the_setting_as_it_was() {
    let m = mode_manager(KmmAllocMode::KMM_ALLOC_POOL, 2 * MIB, 64 * MIB, |_| {});
    let a = m.alloc(MIB, DEVICE);
    m.upload(a, 0, &vec![3u8; MIB as usize]);
    let b = m.alloc(2 * MIB, DEVICE);
    assert_eq!(m.info(a).spilled, 1);
    map(&m, b); // the device is held: `a` cannot come back
    let st = kmm_buffer_never_spill(m.0, a, true);
    assert_eq!(st, KMM_ERROR_OUT_OF_MEMORY);
    let msg = last_error();
    assert!(msg.contains("restoring spilled buffer") && msg.contains("1 more on the host"), "{msg}");
    assert_eq!((m.info(a).spilled, m.info(a).never_spill), (1, 0));
    ok(kmm_buffer_unmap(m.0, b));
    ok(kmm_buffer_never_spill(m.0, a, true));
    assert_eq!(m.download(a, 0, MIB as usize), vec![3u8; MIB as usize]);
}

/// With `pinned_limit` set, spilled buffers take pinned memory while it has room. A pinned
/// allocation that needs that room moves them on to pageable memory (a rung of its out-of-memory
/// ladder) and gets it: the spilled bytes stay counted exactly, now as pageable, and every
/// buffer comes back byte for byte.
#[test]
fn a_pinned_allocation_moves_spilled_buffers_from_pinned_to_pageable_memory() {
    let m = mode_manager(KmmAllocMode::KMM_ALLOC_POOL, 4 * MIB, 64 * MIB, |c| {
        c.pinned_limit = 4 * MIB;
        c.pinned_chunk_size = 2 * MIB;
    });
    let set = fill_set(&m, 8, MIB);
    let s = m.stats(DEVICE);
    eprintln!(
        "after the fill: spilled {} (pageable {}) in {} buffers; pinned reserved {}",
        s.spilled_bytes,
        s.spilled_pageable_bytes,
        s.spilled_buffers,
        m.stats(PINNED).reserved
    );
    assert_eq!((s.spilled_bytes, s.spilled_pageable_bytes), (4 * MIB, 0), "the spills filled the pinned limit: {s:?}");
    // Each of these fits only once spilled buffers left pinned memory: the first half of it,
    // then all of it.
    let mut pinned = Vec::new();
    for i in 0..2 {
        let mut p = 0;
        let st = kmm_buffer_alloc(m.0, 2 * MIB, PINNED, &mut p);
        let s = m.stats(DEVICE);
        eprintln!("pinned allocation {i}: {st:?}; spilled {} (pageable {})", s.spilled_bytes, s.spilled_pageable_bytes);
        assert_eq!(st, KMM_OK, "pinned allocation {i} of 2 MiB with buffers spilled in pinned memory: {}", last_error());
        assert_eq!(s.spilled_bytes, 4 * MIB, "moving spilled bytes neither loses nor adds any: {s:?}");
        assert!(s.spilled_pageable_bytes >= 2 * MIB * (i + 1), "{s:?}");
        pinned.push(p);
    }
    let s = m.stats(DEVICE);
    assert_eq!((s.spilled_bytes, s.spilled_pageable_bytes, s.spilled_buffers), (4 * MIB, 4 * MIB, 4), "{s:?}");
    assert_eq!(s.in_use + s.spilled_bytes, 8 * MIB, "{s:?}");
    for (b, data) in &set {
        assert!(m.download(*b, 0, data.len()) == *data, "buffer {b:#x} came back with other bytes");
    }
    let s = m.stats(DEVICE);
    assert_eq!(s.in_use + s.spilled_bytes, 8 * MIB, "{s:?}");
    assert!(s.spilled_pageable_bytes <= s.spilled_bytes, "{s:?}");
    for p in pinned {
        m.free(p);
    }
    for (b, _) in set {
        m.free(b);
    }
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.spilled_bytes, s.spilled_pageable_bytes, s.spilled_buffers, s.live_buffers), (0, 0, 0, 0, 0), "{s:?}");
}

/// A pinned request larger than the pinned limit can never be served, nor one the pool's
/// alignment rounds past it: neither moves a spilled buffer to pageable memory (slower to restore
/// from) for nothing. Found by the reviewers.
#[test]
fn a_pinned_request_past_the_pinned_limit_moves_no_spilled_buffer() {
    for (limit, request) in [(4 * MIB, 8 * MIB), (4 * MIB + 100, 4 * MIB + 100)] {
        let m = mode_manager(KmmAllocMode::KMM_ALLOC_POOL, 4 * MIB, 64 * MIB, |c| {
            c.pinned_limit = limit;
            c.pinned_chunk_size = 2 * MIB;
        });
        let set = fill_set(&m, 8, MIB);
        let before = m.stats(DEVICE);
        assert_eq!((before.spilled_bytes, before.spilled_pageable_bytes), (4 * MIB, 0), "{before:?}");
        let mut p = 0;
        assert_eq!(kmm_buffer_alloc(m.0, request, PINNED, &mut p), KMM_ERROR_OUT_OF_MEMORY);
        let after = m.stats(DEVICE);
        assert_eq!(
            after.spilled_pageable_bytes, 0,
            "limit {limit}, request {request}: spilled buffers left pinned memory for a request that cannot fit: {after:?}"
        );
        for (b, data) in &set {
            assert!(m.download(*b, 0, data.len()) == *data, "buffer {b:#x} came back with other bytes");
        }
        for (b, _) in set {
            m.free(b);
        }
    }
}

/// Moving spilled data out of pinned memory gives back the spill store's pinned chunks only: a
/// pinned request that fits the limit but not beside the user's own pinned buffers moves nothing
/// (found in review), and one that fits beside them still gets that room.
#[test]
fn a_pinned_request_that_fits_only_without_the_users_pinned_buffers_moves_no_spilled_buffer() {
    for (request, served) in [(3 * MIB, false), (2 * MIB, true)] {
        let m = mode_manager(KmmAllocMode::KMM_ALLOC_POOL, 4 * MIB, 64 * MIB, |c| {
            c.pinned_limit = 4 * MIB;
            c.pinned_chunk_size = 2 * MIB;
        });
        let users = m.alloc(2 * MIB, PINNED);
        let set = fill_set(&m, 8, MIB);
        let before = m.stats(DEVICE);
        assert_eq!((before.spilled_bytes, before.spilled_pageable_bytes), (4 * MIB, 2 * MIB), "{before:?}");
        let mut p = 0;
        let st = kmm_buffer_alloc(m.0, request, PINNED, &mut p);
        let after = m.stats(DEVICE);
        if served {
            assert_eq!(st, KMM_OK, "a pinned request that fits beside the user's: {}", last_error());
            assert_eq!(after.spilled_pageable_bytes, 4 * MIB, "{after:?}");
            m.free(p);
        } else {
            assert_eq!(st, KMM_ERROR_OUT_OF_MEMORY);
            assert_eq!(
                after.spilled_pageable_bytes, before.spilled_pageable_bytes,
                "request {request} beside 2 MiB of the user's under a 4 MiB limit: spilled buffers left pinned memory for a request that cannot fit: {after:?}"
            );
        }
        for (b, data) in &set {
            assert!(m.download(*b, 0, data.len()) == *data, "buffer {b:#x} came back with other bytes");
        }
        for (b, _) in set {
            m.free(b);
        }
        m.free(users);
    }
}

/// The move to pageable memory reads a spilled buffer's pinned place only once the copy out that
/// writes it has run: here the copies out are queued behind a held stream when the pinned
/// allocation needs their room.
#[test]
fn a_move_to_pageable_memory_waits_for_the_copy_out() {
    let m = Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.chunk_size = 2 * MIB;
        c.hard_limit = 4 * MIB;
        c.spill_limit = 64 * MIB;
        c.pinned_limit = 4 * MIB;
        c.pinned_chunk_size = 2 * MIB;
    });
    let set = fill_set(&m, 4, MIB);
    m.sync();
    let opener = hold_stream_for_100ms(&m);
    // Each spills one of the set; the copies out stay queued until the gate opens.
    let more: Vec<_> = (0..4).map(|_| m.alloc(MIB, DEVICE)).collect();
    assert!(set.iter().all(|(b, _)| m.info(*b).spilled == 1));
    assert_eq!(m.stats(DEVICE).spilled_pageable_bytes, 0);
    let mut p = 0;
    let st = kmm_buffer_alloc(m.0, 4 * MIB, PINNED, &mut p);
    assert_eq!(st, KMM_OK, "a pinned allocation of the whole pinned limit: {}", last_error());
    opener.join().unwrap();
    assert_eq!(m.stats(DEVICE).spilled_pageable_bytes, 4 * MIB);
    for b in more {
        m.free(b);
    }
    for (b, data) in &set {
        assert!(m.download(*b, 0, data.len()) == *data, "the move read buffer {b:#x}'s pinned place before its copy out wrote it");
    }
    m.free(p);
}

/// A restore that fails is a failed allocation of device memory (its message says so): counted
/// in `failed_allocs` and traced as an allocate failure naming the buffer, as a failed
/// `kmm_buffer_alloc` is. Adversarial run 10: neither happened, so a trace of a workload whose
/// reads failed showed no failure at all.
#[test]
fn a_failed_restore_is_counted_and_traced_as_a_failed_allocation() {
    const K: u64 = 256 << 10;
    let m = Mgr::with(|c| {
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32;
        c.hard_limit = 4 * K;
        c.spill_limit = 4 * MIB;
    });
    let set = fill_set(&m, 5, K); // the fifth spills the first
    assert_eq!(m.info(set[0].0).spilled, 1);
    for (b, _) in &set[1..] {
        map(&m, *b); // nothing left on the device may go
    }
    ok(kmm_manager_trace_start(m.0, 0, std::ptr::null(), 0));
    let before = m.stats(DEVICE).failed_allocs;
    let mut out = [0u8; 16];
    expect_err(
        kmm_copy_to_host(m.0, out.as_mut_ptr().cast(), set[0].0, 0, 16),
        KmmStatus::KMM_ERROR_OUT_OF_MEMORY,
        &["restoring spilled buffer"],
    );
    assert_eq!(m.stats(DEVICE).failed_allocs, before + 1, "the failed restore is counted");
    let mut n = 0usize;
    ok(kmm_manager_trace_records(m.0, std::ptr::null_mut(), 0, &mut n, std::ptr::null_mut()));
    let mut v = vec![KmmTraceRecord::default(); n];
    ok(kmm_manager_trace_records(m.0, v.as_mut_ptr(), n, &mut n, std::ptr::null_mut()));
    let failures: Vec<_> = v.iter().filter(|r| r.action == KmmTraceAction::KMM_TRACE_ALLOCATE_FAILURE as u32).collect();
    assert_eq!(failures.len(), 1, "one allocate failure traced: {v:?}");
    assert_eq!((failures[0].bytes, failures[0].buffer), (K, set[0].0));
    assert_eq!(failures[0].status, KmmStatus::KMM_ERROR_OUT_OF_MEMORY as u32);
    // Nothing lost: once a buffer is unmapped, the read goes through and returns its bytes.
    ok(kmm_buffer_unmap(m.0, set[1].0));
    assert_eq!(m.download(set[0].0, 0, 16), set[0].1[..16]);
}

/// A request larger than the hard limit on its own can never be served: spilling must not move
/// every live buffer to the host for it (adversarial run 10: all 15 went, and stayed there, so
/// each later use paid a restore), and the message says why nothing spilled.
#[test]
fn a_request_larger_than_the_hard_limit_spills_nothing() {
    let m = Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.chunk_size = 64 << 10;
        c.hard_limit = MIB;
        c.spill_limit = 4 * MIB;
    });
    let set = fill_set(&m, 15, 60_000);
    let mut b = 0;
    expect_err(
        kmm_buffer_alloc(m.0, 2 * MIB, DEVICE, &mut b),
        KmmStatus::KMM_ERROR_OUT_OF_MEMORY,
        &["the request alone is larger than the hard limit"],
    );
    let s = m.stats(DEVICE);
    assert_eq!((s.spilled_buffers, s.spills), (0, 0), "buffers spilled for a request that cannot fit");
    assert_eq!(s.in_use, 15 * 60_000);
    // Nor one whose block (its bytes rounded up to the alignment) is larger than the limit,
    // in pool and direct modes (the review of the first version: 8 MiB + 50 bytes against a
    // limit of 8 MiB + 100 spilled every buffer).
    for mode in [KmmAllocMode::KMM_ALLOC_POOL, KmmAllocMode::KMM_ALLOC_DIRECT] {
        let r = Mgr::with(|c| {
            c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
            c.alloc_mode = mode as u32;
            c.chunk_size = 2 * MIB;
            c.hard_limit = 8 * MIB + 100;
            c.spill_limit = 64 * MIB;
        });
        let _live = fill_set(&r, 4, 2 * MIB);
        let mut x = 0;
        expect_err(kmm_buffer_alloc(r.0, 8 * MIB + 50, DEVICE, &mut x), KmmStatus::KMM_ERROR_OUT_OF_MEMORY, &["the request alone"]);
        assert_eq!(r.stats(DEVICE).spilled_buffers, 0, "{mode:?}: buffers spilled for a block larger than the limit");
    }
    // A request that fits once others spill still spills them.
    let b = m.alloc(MIB - 64 * 1024, DEVICE);
    assert!(m.stats(DEVICE).spills > 0);
    m.free(b);
    for (x, data) in &set {
        assert_eq!(m.download(*x, 0, data.len()), *data);
    }
}
