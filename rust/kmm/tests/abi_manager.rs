//! Managers through the C ABI: allocation modes and suballocators, statistics, limits, trim,
//! coexistence and backend choice.
mod common;
use common::*;
use std::sync::{Arc, Barrier};

/// The mode whose pools, suballocators and chunks some tests here are about (a suite run with
/// KMM_TEST_ALLOC_MODE=cuda_async or direct still runs them in it).
const POOL: u32 = KmmAllocMode::KMM_ALLOC_POOL as u32;

fn modes() -> Vec<(&'static str, Box<dyn Fn(&mut KmmConfig)>)> {
    let sub = |s: KmmSuballocator| -> Box<dyn Fn(&mut KmmConfig)> { Box::new(move |c: &mut KmmConfig| c.suballocator = s as u32) };
    vec![
        ("pool/binned", sub(KmmSuballocator::KMM_SUBALLOC_BINNED)),
        ("pool/heap", sub(KmmSuballocator::KMM_SUBALLOC_HEAP)),
        ("pool/ring", sub(KmmSuballocator::KMM_SUBALLOC_RING)),
        (
            "pool/fixed",
            Box::new(|c: &mut KmmConfig| {
                c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
                c.fixed_block_size = 1 << 20;
            }),
        ),
        ("direct", Box::new(|c: &mut KmmConfig| c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32)),
        ("cuda_async", Box::new(|c: &mut KmmConfig| c.alloc_mode = KmmAllocMode::KMM_ALLOC_CUDA_ASYNC as u32)),
    ]
}

#[test]
fn every_mode_round_trips_and_balances_to_zero() {
    for (name, edit) in modes() {
        let m = Mgr::with(|c| edit(c));
        let max = if name == "pool/fixed" { 1 << 20 } else { 3 << 20 };
        let mut live = Vec::new();
        for i in 0..200u64 {
            let len = 1 + (i * 7919) % max;
            let b = m.alloc(len, DEVICE);
            let data = pattern(len as usize, i);
            m.upload(b, 0, &data);
            live.push((b, data));
            if i % 3 == 0 {
                let (b, data) = live.remove((i as usize * 13) % live.len());
                assert_eq!(m.download(b, 0, data.len()), data, "{name}");
                m.free(b);
            }
        }
        for (b, data) in live.drain(..) {
            assert_eq!(m.download(b, 0, data.len()), data, "{name}");
            m.free(b);
        }
        let s = m.stats(DEVICE);
        assert_eq!((s.in_use, s.live_buffers), (0, 0), "{name}");
        assert_eq!(s.allocs, 200, "{name}");
        assert_eq!(s.frees, 200, "{name}");
        assert!(s.peak_in_use > 0 && s.peak_reserved >= s.peak_in_use.min(s.peak_reserved), "{name}");
        ok(kmm_manager_trim(m.0, 0));
        assert_eq!(m.stats(DEVICE).reserved, 0, "{name}: trim(0) gives everything back");
        let mut info = KmmManagerInfo::default();
        ok(kmm_manager_info(m.0, &mut info));
        assert_ne!(info.backend, KmmBackend::KMM_BACKEND_AUTO as u32);
    }
}

#[test]
fn fixed_suballocator_refuses_requests_above_its_block() {
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL; // suballocators are the pool's
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
        c.fixed_block_size = 4096;
    });
    let mut b = 0;
    expect_err(kmm_buffer_alloc(m.0, 4097, DEVICE, &mut b), KMM_ERROR_INVALID_ARGUMENT, &["bytes = 4097", "block size 4096"]);
    assert_eq!(m.stats(DEVICE).failed_allocs, 1);
}

/// Found by adversarial round 15: a block size under the alignment served requests past it, and
/// the refusal named a bound the caller never set. The header now says the block size is
/// rounded up to the alignment, and the refusal says where its bound comes from.
#[test]
fn fixed_block_size_rounds_up_to_the_alignment_and_the_refusal_says_so() {
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL;
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
        c.fixed_block_size = 100; // alignment 256
    });
    let a = m.alloc(256, DEVICE);
    let mut b = 0;
    expect_err(
        kmm_buffer_alloc(m.0, 257, DEVICE, &mut b),
        KMM_ERROR_INVALID_ARGUMENT,
        &["bytes = 257", "block size 256", "fixed_block_size rounded up to config.alignment"],
    );
    assert_eq!(m.stats(DEVICE).in_use, 256);
    m.free(a);
}

/// Found by adversarial round 15: a `chunk_size` under 2 MiB was accepted and grew the pool by
/// 2 MiB, which the header did not say; it does now (chunks are whole 2 MiB pages), and the
/// fixed suballocator's chunks are whole blocks of `chunk_size` instead.
#[test]
fn chunks_are_whole_two_mib_pages_except_the_fixed_suballocators() {
    for sub in [KmmSuballocator::KMM_SUBALLOC_BINNED, KmmSuballocator::KMM_SUBALLOC_HEAP] {
        let m = Mgr::with(|c| {
            c.alloc_mode = POOL;
            c.suballocator = sub as u32;
            c.chunk_size = 4096;
        });
        let a = m.alloc(1000, DEVICE);
        let b = m.alloc(3 << 20, DEVICE);
        let s = m.stats(DEVICE);
        assert_eq!((s.reserved, s.upstream_allocs), ((2 << 20) + (4 << 20), 2), "{sub:?}");
        m.free(a);
        m.free(b);
    }
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL;
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
        c.fixed_block_size = 4096;
        c.chunk_size = 10000;
    });
    let a = m.alloc(1000, DEVICE);
    assert_eq!(m.stats(DEVICE).reserved, 12288);
    m.free(a);
}

#[test]
fn stats_count_hits_misses_peaks_and_reset() {
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL; // hits, misses and chunks are the pool's
        c.chunk_size = 4 << 20;
    });
    let a = m.alloc(1 << 20, DEVICE);
    let b = m.alloc(1 << 20, DEVICE);
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.reserved, s.pool_misses, s.pool_hits, s.upstream_allocs), (2 << 20, 4 << 20, 1, 1, 1));
    assert_eq!(s.largest_free_block, 2 << 20);
    m.free(a);
    m.free(b);
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.peak_in_use, s.peak_reserved), (0, 2 << 20, 4 << 20));
    ok(kmm_manager_reset_peaks(m.0));
    let s = m.stats(DEVICE);
    assert_eq!((s.peak_in_use, s.peak_reserved), (0, 4 << 20));
    let mut needed = 0usize;
    ok(kmm_manager_summary(m.0, std::ptr::null_mut(), 0, &mut needed));
    let mut text = vec![0u8; needed];
    ok(kmm_manager_summary(m.0, text.as_mut_ptr().cast(), needed, std::ptr::null_mut()));
    let text = String::from_utf8(text[..needed - 1].to_vec()).unwrap();
    for word in ["in use", "reserved", "peak", "largest free", "device", "pinned", "4.00 MiB"] {
        assert!(text.contains(word), "summary lacks {word:?}:\n{text}");
    }
    let mut small = [0xFFu8; 8];
    ok(kmm_manager_summary(m.0, small.as_mut_ptr().cast(), 8, std::ptr::null_mut()));
    assert_eq!(small[7], 0, "truncated summary is NUL-terminated");
}

#[test]
fn hard_limit_holds_under_eight_threads() {
    for mode in [KmmAllocMode::KMM_ALLOC_POOL, KmmAllocMode::KMM_ALLOC_DIRECT] {
        let limit = 64u64 << 20;
        let m = Arc::new(Mgr::with(|c| {
            c.alloc_mode = mode as u32;
            c.hard_limit = limit;
            c.chunk_size = 2 << 20;
        }));
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (m, barrier) = (m.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut got = Vec::new();
                    for _ in 0..16 {
                        let mut b = 0;
                        match kmm_buffer_alloc(m.0, 2 << 20, DEVICE, &mut b) {
                            KMM_OK => got.push(b),
                            status => {
                                assert_eq!(status, KMM_ERROR_OUT_OF_MEMORY);
                                let msg = last_error();
                                assert!(msg.contains("hard limit") && msg.contains(&limit.to_string()), "{msg}");
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        let granted: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let s = m.stats(DEVICE);
        assert!(s.reserved <= limit && s.peak_reserved <= limit, "{mode:?}: reserved {} above the limit", s.peak_reserved);
        assert_eq!(granted.len() as u64, limit / (2 << 20), "{mode:?}: the limit is reached exactly");
        assert_eq!(s.failed_allocs, 8 * 16 - granted.len() as u64);
        for b in granted {
            m.free(b);
        }
    }
}

#[test]
fn out_of_memory_gives_cached_chunks_back_and_retries() {
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL; // cached chunks are the pool's
        c.hard_limit = 16 << 20;
        c.chunk_size = 4 << 20;
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_HEAP as u32;
    });
    // Fill the limit with 4 MiB chunks, free them: cached, so reserved stays at the limit.
    let bufs: Vec<u64> = (0..4).map(|_| m.alloc(4 << 20, DEVICE)).collect();
    for b in bufs {
        m.free(b);
    }
    assert_eq!(m.stats(DEVICE).reserved, 16 << 20);
    // 12 MiB needs a chunk of its own: only possible once the cached chunks are released.
    let big = m.alloc(12 << 20, DEVICE);
    let s = m.stats(DEVICE);
    assert_eq!(s.reserved, 12 << 20);
    assert!(s.upstream_frees >= 4);
    let mut b = 0;
    expect_err(kmm_buffer_alloc(m.0, 8 << 20, DEVICE, &mut b), KMM_ERROR_OUT_OF_MEMORY, &["8388608", "hard limit"]);
    m.free(big);
}

#[test]
fn release_threshold_applies_at_synchronize() {
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL; // the threshold of the pool's chunks (cuda_async: CUDA's pool's own)
        c.chunk_size = 4 << 20;
        c.release_threshold = 4 << 20;
    });
    let bufs: Vec<u64> = (0..4).map(|_| m.alloc(4 << 20, DEVICE)).collect();
    for b in bufs {
        m.free(b);
    }
    assert_eq!(m.stats(DEVICE).reserved, 16 << 20, "cached until a synchronization point");
    m.sync();
    assert_eq!(m.stats(DEVICE).reserved, 4 << 20);
}

#[test]
fn many_managers_coexist_on_several_devices() {
    // Every device the backend offers (the host backend: KMM_HOST_DEVICES, default 1;
    // tests/multi_device.rs runs 2 and 4).
    let mut n = 0;
    ok(kmm_device_count(default_config().backend, &mut n));
    let devices = n as i32;
    let managers: Vec<Mgr> = (0..32).map(|i| Mgr::with(|c| c.device = i % devices)).collect();
    let bufs: Vec<u64> = managers.iter().enumerate().map(|(i, m)| {
        let b = m.alloc(1000 + i as u64, DEVICE);
        m.upload(b, 0, &pattern(1000 + i, i as u64));
        b
    }).collect();
    for (i, (m, b)) in managers.iter().zip(&bufs).enumerate() {
        assert_eq!(m.download(*b, 0, 1000 + i), pattern(1000 + i, i as u64));
        let mut info = KmmManagerInfo::default();
        ok(kmm_manager_info(m.0, &mut info));
        assert_eq!(info.device, i as i32 % devices);
    }
    let mut streams: Vec<u64> = managers.iter().map(|m| {
        let mut info = KmmManagerInfo::default();
        ok(kmm_manager_info(m.0, &mut info));
        info.stream
    }).collect();
    streams.sort();
    streams.dedup();
    assert_eq!(streams.len(), 32, "each manager has a stream of its own");
    // Destroying a manager with live buffers frees them all.
    drop(managers);
}

#[test]
fn backend_choice_follows_config() {
    if gpu() {
        let m = Mgr::with(|c| c.backend = KmmBackend::KMM_BACKEND_AUTO as u32);
        let mut info = KmmManagerInfo::default();
        ok(kmm_manager_info(m.0, &mut info));
        assert_eq!(info.backend, KmmBackend::KMM_BACKEND_CUDA as u32, "auto picks CUDA when a device is usable");
        return;
    }
    let mut c = default_config();
    c.backend = KmmBackend::KMM_BACKEND_CUDA as u32;
    let mut m = 0;
    expect_err(kmm_manager_create(&c, &mut m), KMM_ERROR_BACKEND_UNAVAILABLE, &["CUDA"]);
    c.backend = KmmBackend::KMM_BACKEND_AUTO as u32;
    ok(kmm_manager_create(&c, &mut m));
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(m, &mut info));
    assert_eq!(info.backend, KmmBackend::KMM_BACKEND_HOST as u32, "auto falls back to host without a GPU");
    ok(kmm_manager_destroy(m, 0));
}

#[test]
fn version_and_status_names() {
    let v = unsafe { std::ffi::CStr::from_ptr(kmm_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
    assert_eq!(kmm_abi_version(), KMM_ABI_VERSION);
    let name = |s: u32| unsafe { std::ffi::CStr::from_ptr(kmm_status_name(s)) }.to_str().unwrap().to_string();
    assert_eq!(name(0), "KMM_OK");
    assert_eq!(name(3001), "KMM_ERROR_OUT_OF_MEMORY");
    assert_eq!(name(42), "KMM_UNKNOWN_STATUS");
}

#[test]
fn a_limit_below_the_chunk_size_still_serves_what_fits_under_it() {
    // The pool grows by the least chunk that serves a request when a whole chunk would pass the
    // limit: every pool suballocator, and the pinned pool under pinned_limit.
    for (name, edit) in modes().into_iter().filter(|(n, _)| n.starts_with("pool/")) {
        let m = Mgr::with(|c| {
            edit(c);
            c.alloc_mode = POOL;
            c.chunk_size = 64 << 20;
            c.hard_limit = 4 << 20;
            c.pinned_chunk_size = 32 << 20;
            c.pinned_limit = 4 << 20;
        });
        let small = m.alloc(1024, DEVICE);
        let big = m.alloc(1 << 20, DEVICE);
        let pinned = m.alloc(1024, PINNED);
        let data = pattern(1024, 7);
        m.upload(small, 0, &data);
        assert_eq!(m.download(small, 0, 1024), data, "{name}");
        let s = m.stats(DEVICE);
        assert!(s.reserved <= 4 << 20, "{name}: reserved {} past the limit", s.reserved);
        assert!(m.stats(PINNED).reserved <= 4 << 20, "{name}: pinned past its limit");
        // What cannot fit under the limit is still refused, and nothing stored is lost.
        let mut b = 0;
        if name != "pool/fixed" {
            expect_err(kmm_buffer_alloc(m.0, 8 << 20, DEVICE, &mut b), KMM_ERROR_OUT_OF_MEMORY, &["limit"]);
        }
        assert_eq!(m.download(small, 0, 1024), data, "{name}");
        for b in [small, big, pinned] {
            m.free(b);
        }
    }
    // Limits below 2 MiB, and what is left of one: the pool grows by the room the limit leaves.
    for (name, edit) in modes().into_iter().filter(|(n, _)| n.starts_with("pool/")) {
        for (limit, chunk, request) in [(1u64 << 20, 64u64 << 20, 1024u64), (3 << 20, 8 << 20, 9 << 18), (1 << 20, 1 << 20, 1024)] {
            let request = if name == "pool/fixed" { request.min(1 << 20) } else { request };
            let m = Mgr::with(|c| {
                edit(c);
                c.alloc_mode = POOL;
                c.chunk_size = chunk;
                c.hard_limit = limit;
                c.pinned_chunk_size = chunk;
                c.pinned_limit = limit;
            });
            let bufs = [m.alloc(request, DEVICE), m.alloc(1024, PINNED)];
            assert!(m.stats(DEVICE).reserved <= limit && m.stats(PINNED).reserved <= limit, "{name}");
            for b in bufs {
                m.free(b);
            }
        }
    }
    // Small fixed blocks under a limit still pool: the pool grows by the room left, not by one
    // block at a time.
    let m = Mgr::with(|c| {
        c.alloc_mode = POOL;
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
        c.fixed_block_size = 256;
        c.chunk_size = 8 << 20;
        c.hard_limit = 4 << 20;
    });
    let bufs: Vec<u64> = (0..4096).map(|_| m.alloc(256, DEVICE)).collect();
    assert!(m.stats(DEVICE).upstream_allocs <= 2, "{} upstream allocations for 4096 blocks", m.stats(DEVICE).upstream_allocs);
    for b in bufs {
        m.free(b);
    }
}

#[test]
fn a_config_is_checked_without_making_a_manager() {
    // SAFETY: KmmConfig is plain data; kmm_config_default fills it.
    let mut c: KmmConfig = unsafe { std::mem::zeroed() };
    ok(kmm_config_default(&mut c));
    ok(kmm_config_check(&c));
    expect_err(kmm_config_check(std::ptr::null()), KMM_ERROR_NULL_POINTER, &["config"]);
    for (edit, word) in [
        (Box::new(|c: &mut KmmConfig| c.alignment = 3) as Box<dyn Fn(&mut KmmConfig)>, "alignment"),
        (Box::new(|c: &mut KmmConfig| c.chunk_size = 0), "chunk_size"),
        (Box::new(|c: &mut KmmConfig| c.staging_chunks = 0), "staging_chunks"),
        (Box::new(|c: &mut KmmConfig| c.alloc_mode = 9), "alloc_mode"),
        // A pool that could never be reserved: `kmm_config_check` passed it, and the create's
        // out-of-memory error did not name the option.
        (
            Box::new(|c: &mut KmmConfig| {
                c.hard_limit = 1 << 20;
                c.initial_pool_size = 2 << 20;
            }),
            "config.initial_pool_size = 2097152 exceeds config.hard_limit = 1048576",
        ),
    ] {
        let mut bad = c;
        edit(&mut bad);
        expect_err(kmm_config_check(&bad), KMM_ERROR_INVALID_ARGUMENT, &[word]);
        let mut m = 0;
        expect_err(kmm_manager_create(&bad, &mut m), KMM_ERROR_INVALID_ARGUMENT, &[word]);
    }
    // Within the limit it is reserved; a direct-mode manager reserves no pool and ignores it.
    let within = KmmConfig { hard_limit: 4 << 20, initial_pool_size: 2 << 20, ..c };
    let m = Mgr::with(|x| *x = within);
    assert_eq!(m.stats(DEVICE).reserved, 2 << 20);
    ok(kmm_config_check(&KmmConfig { alloc_mode: KmmAllocMode::KMM_ALLOC_DIRECT as u32, initial_pool_size: 2 << 20, hard_limit: 1 << 20, ..c }));
}

/// A deferred destroy (the finalizers' call) returns at once even while another thread is in a
/// call on the manager that waits for the device: the handle ends now, and the teardown waits for
/// that call on its own thread. It used to take the slot's write lock first, waiting as long as
/// the device did.
#[test]
fn a_deferred_destroy_does_not_wait_for_calls_in_flight() {
    let m = Mgr::new();
    let gate = Gate::close(&m);
    let handle = m.0;
    let (entered, entered_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        entered.send(()).unwrap();
        kmm_manager_synchronize(handle)
    });
    entered_rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50)); // inside the synchronize, behind the gate
    let status = within(10, "deferred destroy beside a waiting synchronize", move || kmm_manager_destroy(handle, KMM_DESTROY_DEFERRED));
    ok(status);
    assert!(!waiter.is_finished(), "the synchronize returned before the gate opened");
    // The teardown thread now waits for the write lock behind the synchronize: calls with the
    // dead handle are turned away at once, not queued behind it (they deadlocked the test).
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (sync_dead, destroy_dead) = within(10, "calls with the ended handle", move || {
        (kmm_manager_synchronize(handle), kmm_manager_destroy(handle, KMM_DESTROY_DEFERRED))
    });
    expect_err(sync_dead, KMM_ERROR_INVALID_HANDLE, &[]);
    expect_err(destroy_dead, KMM_ERROR_INVALID_HANDLE, &[]);
    gate.open();
    // The call in flight ends normally; the teardown then runs.
    ok(waiter.join().unwrap());
}
