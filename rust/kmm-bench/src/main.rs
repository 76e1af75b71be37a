//! Allocation, copy and pinned-memory benchmarks of Kmm's C ABI against the CUDA driver's own
//! allocators, all in one run so figures are compared as ratios on one machine.
//!
//! `kmm-bench [--quick] [--traces] [--pairs] [--scaling] [--threads N] [--host]`: on a machine without CUDA,
//! or with `--host`, only Kmm's host backend is measured; `--traces` stops after the
//! single-thread traces; `--pairs` measures only the 1 MiB alloc+free pairs; `--scaling` only the rows of threads; `--threads` sets the thread count of the multi-thread rows (16).

use cudarc::driver::sys;
use kmm::ffi::buffer::*;
use kmm::ffi::copy::*;
use kmm::ffi::cupy::{kmm_cupy_free, kmm_cupy_malloc, kmm_cupy_set_manager};
use kmm::ffi::manager::*;
use kmm::ffi::plugin::{kmm_plugin_alloc, kmm_plugin_free};
use kmm::ffi::types::*;
use kmm::KmmStatus;
use std::time::Instant;

const DEVICE: u32 = KmmMemoryKind::KMM_MEMORY_DEVICE as u32;
const PINNED: u32 = KmmMemoryKind::KMM_MEMORY_PINNED as u32;

fn ok(s: KmmStatus) {
    if s != KmmStatus::KMM_OK {
        let msg = unsafe { std::ffi::CStr::from_ptr(kmm::ffi::kmm_last_error()) };
        panic!("{s:?}: {}", msg.to_string_lossy());
    }
}

fn cu(r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA call failed");
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy)]
enum Op {
    Alloc(u64),
    /// Free the live block at this position (the trace knows the live count, so the timed loop
    /// does no division).
    Free(usize),
}

/// RMM's random_allocations shape: alloc or free with equal chance, at most `max_live` blocks,
/// sizes log-uniform in [min, max].
fn trace(n: usize, max_live: usize, min: u64, max: u64, seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed | 1);
    let (lmin, lmax) = ((min as f64).ln(), (max as f64).ln());
    let mut live = 0usize;
    (0..n)
        .map(|_| {
            let alloc = live == 0 || (live < max_live && rng.next() & 1 == 0);
            if alloc {
                live += 1;
                Op::Alloc((lmin + rng.unit() * (lmax - lmin)).exp() as u64)
            } else {
                let pos = (rng.next() % live as u64) as usize;
                live -= 1;
                Op::Free(pos)
            }
        })
        .collect()
}

trait Allocator {
    fn alloc(&mut self, bytes: u64) -> u64;
    fn free(&mut self, h: u64);
    fn finish(&mut self) {}
}

struct KmmAlloc(KmmManager);
impl Allocator for KmmAlloc {
    fn alloc(&mut self, bytes: u64) -> u64 {
        let mut b = 0;
        ok(kmm_buffer_alloc(self.0, bytes, DEVICE, &mut b));
        b
    }
    fn free(&mut self, h: u64) {
        ok(kmm_buffer_free(self.0, h, 0));
    }
}

struct CuAsync(sys::CUstream);
impl Allocator for CuAsync {
    fn alloc(&mut self, bytes: u64) -> u64 {
        let mut p = 0;
        cu(unsafe { sys::cuMemAllocAsync(&mut p, bytes as usize, self.0) });
        p
    }
    fn free(&mut self, h: u64) {
        cu(unsafe { sys::cuMemFreeAsync(h, self.0) });
    }
    fn finish(&mut self) {
        cu(unsafe { sys::cuStreamSynchronize(self.0) });
    }
}

struct CuDirect;
impl Allocator for CuDirect {
    fn alloc(&mut self, bytes: u64) -> u64 {
        let mut p = 0;
        cu(unsafe { sys::cuMemAlloc_v2(&mut p, bytes as usize) });
        p
    }
    fn free(&mut self, h: u64) {
        cu(unsafe { sys::cuMemFree_v2(h) });
    }
}

/// Runs the trace; returns nanoseconds per operation.
fn run(ops: &[Op], a: &mut dyn Allocator) -> f64 {
    let mut live: Vec<u64> = Vec::with_capacity(1024);
    let start = Instant::now();
    for op in ops {
        match *op {
            Op::Alloc(bytes) => live.push(a.alloc(bytes)),
            Op::Free(pos) => {
                let h = live.swap_remove(pos);
                a.free(h);
            }
        }
    }
    for h in live.drain(..) {
        a.free(h);
    }
    a.finish();
    start.elapsed().as_nanos() as f64 / (ops.len() as f64)
}

fn manager(backend: u32, f: impl FnOnce(&mut KmmConfig)) -> KmmManager {
    let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
    ok(kmm_config_default(&mut c));
    c.backend = backend;
    f(&mut c);
    let mut m = 0;
    ok(kmm_manager_create(&c, &mut m));
    m
}

fn stats(m: KmmManager, kind: u32) -> KmmMemoryStats {
    let mut s = KmmMemoryStats::default();
    ok(kmm_manager_stats(m, kind, &mut s));
    s
}

struct Report {
    lines: Vec<String>,
}
impl Report {
    fn row(&mut self, what: &str, figure: String, target: &str) {
        let line = format!("| {what} | {figure} | {target} |");
        println!("{line}");
        self.lines.push(line);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The number after `name` on the command line, if given.
fn arg_value(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    Some(args.get(at + 1)?.parse().unwrap_or_else(|_| panic!("{name} needs a number")))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let traces_only = std::env::args().any(|a| a == "--traces");
    let pairs_only = std::env::args().any(|a| a == "--pairs");
    // Only the rows of threads (one thread, own managers, one shared manager, free latency):
    // repeated alternately with another build where those rows move between runs.
    let scaling_only = std::env::args().any(|a| a == "--scaling");
    let cuda = !std::env::args().any(|a| a == "--host")
        && unsafe { sys::is_culib_present() }
        && unsafe { sys::cuInit(0) } == sys::CUresult::CUDA_SUCCESS;
    let backend = if cuda { KmmBackend::KMM_BACKEND_CUDA } else { KmmBackend::KMM_BACKEND_HOST } as u32;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    if cuda {
        unsafe {
            let mut dev = 0;
            cu(sys::cuDeviceGet(&mut dev, 0));
            let mut ctx = std::ptr::null_mut();
            cu(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev));
            cu(sys::cuCtxSetCurrent(ctx));
            cu(sys::cuStreamCreate(&mut stream, 1));
            // Default pool keeps everything (release threshold at its maximum), as in the issue.
            let mut pool = std::ptr::null_mut();
            cu(sys::cuDeviceGetDefaultMemPool(&mut pool, dev));
            let mut max = u64::MAX;
            cu(sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut max as *mut u64 as *mut _,
            ));
        }
    }
    let probe = manager(backend, |_| {});
    let mut needed = 0;
    ok(kmm_manager_summary(probe, std::ptr::null_mut(), 0, &mut needed));
    let mut text = vec![0u8; needed];
    ok(kmm_manager_summary(probe, text.as_mut_ptr().cast(), needed, std::ptr::null_mut()));
    let device_line = String::from_utf8_lossy(&text).lines().next().unwrap_or("").to_string();
    ok(kmm_manager_destroy(probe, 0));
    println!("# kmm-bench: {device_line}");
    let mut r = Report { lines: Vec::new() };
    println!("| measure | figure | target |\n|---|---|---|");
    if pairs_only {
        pair_1mib(backend, &mut r);
        return;
    }

    let n = if quick { 20_000 } else { 100_000 };
    let trace_rows = [("R", 256u64, 4u64 << 20, "<= 100 ns, >= 8x cuMemAllocAsync"), ("S", 8, 4096, "<= 60 ns")];
    for (name, min, max, target) in trace_rows.into_iter().filter(|_| !scaling_only) {
        let ops = trace(n, 1000, min, max, 42);
        // The default manager, then the same without compaction (its peer for what moving costs).
        // A traced manager records every operation into rings of the default size (65,536
        // records), or of KMM_BENCH_TRACE_CAPACITY records.
        let capacity: u64 = std::env::var("KMM_BENCH_TRACE_CAPACITY").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        // Kmm's time (median of RUNS runs after a warm-up) and, with a peer, the peer's runs
        // alternating with Kmm's: a host's speed drifts between and within processes (core.md),
        // and the ratio of each adjacent pair cancels that drift where two separate medians
        // would not.
        const RUNS: usize = 7;
        let timed = |ratio_pct: Option<u32>, mut peer: Option<&mut dyn Allocator>| {
            let m = manager(backend, |c| {
                if let Some(pct) = ratio_pct {
                    c.compaction_ratio_pct = pct;
                }
            });
            let mut kmm = KmmAlloc(m);
            run(&ops, &mut kmm); // warm-up: chunks reserved once, as a long-running pool would be
            if let Some(p) = peer.as_deref_mut() {
                run(&ops, p);
            }
            ok(kmm_manager_reset_peaks(m));
            let (mut own, mut ratios, mut peers) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..RUNS {
                let ns = run(&ops, &mut kmm);
                own.push(ns);
                if let Some(p) = peer.as_deref_mut() {
                    let peer_ns = run(&ops, p);
                    peers.push(peer_ns);
                    ratios.push(peer_ns / ns);
                }
            }
            let s = stats(m, DEVICE);
            ok(kmm_manager_destroy(m, 0));
            (median(own), s, (!ratios.is_empty()).then(|| (median(peers), median(ratios))))
        };
        let mut async_peer = CuAsync(stream);
        let (kmm_ns, s, async_figures) = timed(None, if cuda { Some(&mut async_peer as &mut dyn Allocator) } else { None });
        r.row(&format!("trace {name}: Kmm pool (C ABI)"), format!("{kmm_ns:.1} ns/op (median of {RUNS} runs)"), target);
        // Tracing's cost: one manager runs the trace with its trace off and recording to rings,
        // alternately, so that the machine's drift between runs cancels in each pair. A new
        // trace's rings are fresh memory: the first run after the start also pays for the
        // pages (`first`); a trace that runs on (`on`, after that first run) does not.
        let m = manager(backend, |_| {});
        let mut kmm = KmmAlloc(m);
        run(&ops, &mut kmm);
        let (mut off, mut first, mut on) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..7 {
            off.push(run(&ops, &mut kmm));
            ok(kmm::ffi::trace::kmm_manager_trace_start(m, capacity, std::ptr::null(), 0));
            first.push(run(&ops, &mut kmm));
            on.push(run(&ops, &mut kmm));
            ok(kmm::ffi::trace::kmm_manager_trace_stop(m));
        }
        ok(kmm_manager_destroy(m, 0));
        let added = |traced: &[f64]| median(off.iter().zip(traced).map(|(a, b)| b - a).collect());
        r.row(
            &format!("trace {name}: Kmm pool, recording a ring trace"),
            format!(
                "{:.1} ns/op, {:.1} with the trace off: {:+.1} ns per operation (median of 7 pairs; the first run of a new trace {:+.1})",
                median(on.clone()),
                median(off.clone()),
                added(&on),
                added(&first)
            ),
            "<= 50 ns added",
        );
        if name == "R" {
            // Spill's cost with no pressure: the same build with spill on (a limit no run
            // reaches) and off, two managers in alternation (median of 7 pairs).
            let (off_m, on_m) = (manager(backend, |_| {}), manager(backend, |c| c.spill_limit = 64 << 30));
            let (mut off, mut on) = (KmmAlloc(off_m), KmmAlloc(on_m));
            run(&ops, &mut off);
            run(&ops, &mut on);
            let pairs: Vec<(f64, f64)> = (0..7).map(|_| (run(&ops, &mut off), run(&ops, &mut on))).collect();
            ok(kmm_manager_destroy(off_m, 0));
            ok(kmm_manager_destroy(on_m, 0));
            let ratio = median(pairs.iter().map(|(a, b)| b / a).collect());
            r.row(
                "trace R: spill on (spill_limit = 64 GiB, never reached) / spill off",
                format!(
                    "{ratio:.3} ({:.1} vs {:.1} ns/op, medians of 7 alternating pairs)",
                    median(pairs.iter().map(|p| p.1).collect()),
                    median(pairs.iter().map(|p| p.0).collect())
                ),
                "<= 1.05",
            );
            let frag = |s: &KmmMemoryStats| s.peak_reserved as f64 / s.peak_in_use as f64;
            r.row(
                "trace R: peak reserved / peak in use",
                format!("{:.3} ({} / {} bytes)", frag(&s), s.peak_reserved, s.peak_in_use),
                "<= 1.10",
            );
            let runs = (RUNS + 1) as f64 * n as f64; // the warm-up and the timed runs
            r.row(
                "trace R: compactions (moving unmapped buffers instead of growing)",
                format!(
                    "{} in {} runs: {:.2} per 1000 ops, {:.1} KiB moved per op",
                    s.compactions,
                    RUNS + 1,
                    s.compactions as f64 * 1000.0 / runs,
                    s.relocated_bytes as f64 / 1024.0 / runs
                ),
                "",
            );
            let (still_ns, still, _) = timed(Some(0), None);
            r.row(
                "trace R: Kmm pool without compaction (compaction_ratio_pct = 0)",
                format!("{still_ns:.1} ns/op ({:.2}x the default's time), peak reserved / in use {:.3}", kmm_ns / still_ns, frag(&still)),
                "peer",
            );
        }
        if let Some((async_ns, speedup)) = async_figures {
            r.row(
                &format!("trace {name}: cuMemAllocAsync"),
                format!("{async_ns:.1} ns/op (Kmm {speedup:.1}x faster: median of {RUNS} alternating pairs' ratios)"),
                "",
            );
            let direct_ns = run(&ops[..ops.len().min(20_000)], &mut CuDirect);
            r.row(&format!("trace {name}: cuMemAlloc"), format!("{direct_ns:.1} ns/op (Kmm {:.1}x faster)", direct_ns / kmm_ns), "");
        }
    }

    if traces_only {
        return;
    }

    // Threads: each with its own manager, then all sharing one.
    let threads = arg_value("--threads").unwrap_or(16);
    let ops_per_thread = if quick { 10_000 } else { 200_000 };
    let traces: Vec<Vec<Op>> = (0..threads).map(|t| trace(ops_per_thread, 1000, 256, 4 << 20, 100 + t as u64)).collect();
    // One thread's operations per second (median of three runs after a warm-up).
    let one_thread = || {
        let m = manager(backend, |_| {});
        let mut a = KmmAlloc(m);
        run(&traces[0], &mut a);
        let ns = median((0..3).map(|_| run(&traces[0], &mut a)).collect());
        ok(kmm_manager_destroy(m, 0));
        1e9 / ns
    };
    let parallel_once = |shared: bool, threads: usize| -> (f64, (u64, u64), KmmMemoryStats, KmmMemoryStats) {
        let common = if shared { manager(backend, |_| {}) } else { 0 };
        let managers: Vec<KmmManager> = (0..threads).map(|_| if shared { common } else { manager(backend, |_| {}) }).collect();
        let traces = &traces[..threads];
        // Each thread warms up where it then runs (its own lane of a shared manager); timed from
        // the release of the second barrier to the last thread's end, so neither spawning nor
        // warming up is counted.
        let warmed = std::sync::Barrier::new(threads + 1);
        let go = std::sync::Barrier::new(threads + 1);
        let mut before = KmmMemoryStats::default();
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let workers: Vec<_> = managers
                .iter()
                .zip(traces)
                .map(|(m, t)| {
                    let (warmed, go) = (&warmed, &go);
                    s.spawn(move || {
                        run(t, &mut KmmAlloc(*m));
                        warmed.wait();
                        go.wait();
                        let start = Instant::now();
                        run(t, &mut KmmAlloc(*m));
                        (start, Instant::now())
                    })
                })
                .collect();
            warmed.wait();
            before = stats(managers[0], DEVICE);
            if shared {
                ok(kmm_manager_reset_peaks(managers[0]));
            }
            go.wait();
            workers.into_iter().map(|w| w.join().expect("benchmark thread")).collect()
        });
        let start = spans.iter().map(|s| s.0).min().expect("threads");
        let end = spans.iter().map(|s| s.1).max().expect("threads");
        let secs = (end - start).as_secs_f64();
        let after = stats(managers[0], DEVICE);
        let growth = (after.upstream_allocs - before.upstream_allocs, after.compactions - before.compactions);
        let mut destroyed = managers.clone();
        destroyed.dedup();
        for m in destroyed {
            ok(kmm_manager_destroy(m, 0));
        }
        ((threads * ops_per_thread) as f64 / secs, growth, after, before)
    };
    // Median of three runs: one run of a few tens of milliseconds moves by a third on a shared
    // machine.
    let parallel = |shared: bool, threads: usize| {
        let mut runs: Vec<(f64, (u64, u64), KmmMemoryStats, KmmMemoryStats)> = (0..3).map(|_| parallel_once(shared, threads)).collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        runs[1]
    };
    // Threads with managers of their own against one thread: three rounds, each timing one
    // thread right before the threads, and the median of the rounds' ratios (the host's speed
    // drifts between runs; adjacent runs drift least).
    let own_managers = |threads: usize| {
        let rounds: Vec<(f64, f64)> = (0..3).map(|_| (one_thread(), parallel_once(false, threads).0)).collect();
        (median(rounds.iter().map(|r| r.0).collect()), median(rounds.iter().map(|r| r.1).collect()), median(rounds.iter().map(|r| r.1 / r.0).collect()))
    };
    let (one, separate, speedup) = own_managers(threads);
    let (_, separate8, speedup8) = own_managers(threads / 2);
    let (shared, (shared_grown, shared_compacted), shared_stats, warmed_stats) = parallel(true, threads);
    let machine = machine_scaling(threads);
    r.row("1 thread, trace R", format!("{:.2} Mops/s", one / 1e6), "");
    let half = threads / 2;
    let own_row = |ops: f64, speedup: f64| format!("{:.2} Mops/s ({speedup:.1}x one thread: median of 3 rounds' ratios to one thread timed just before)", ops / 1e6);
    r.row(&format!("{half} threads, own managers"), own_row(separate8, speedup8), "context");
    r.row(&format!("{threads} threads, own managers"), own_row(separate, speedup), ">= 8x at 16");
    r.row(
        &format!("{threads} threads, one shared manager"),
        format!(
            "{:.2} Mops/s ({:.1}x one thread; {shared_grown} chunks reserved and {shared_compacted} compactions while timed)",
            shared / 1e6,
            shared / one
        ),
        "report",
    );
    // Both peaks over one interval, the warm-up and the timed run: threads interleave differently
    // in each, and the reserve the warm-up's peak set is still held in the timed run, so the
    // timed run's own peak in use alone would not be the peak that reserve served.
    let (whole_reserved, whole_in_use) =
        (shared_stats.peak_reserved.max(warmed_stats.peak_reserved), shared_stats.peak_in_use.max(warmed_stats.peak_in_use));
    r.row(
        &format!("{threads} threads, one shared manager: peak reserved / peak in use (warm-up and timed run)"),
        format!(
            "{:.3} ({whole_reserved} / {whole_in_use} bytes; timed run alone: {:.3}, its peak in use {:.3} of the warm-up's)",
            whole_reserved as f64 / whole_in_use as f64,
            shared_stats.peak_reserved as f64 / shared_stats.peak_in_use as f64,
            shared_stats.peak_in_use as f64 / warmed_stats.peak_in_use as f64
        ),
        "<= 1.10",
    );
    let (p50, p99) = free_latency(backend, &traces[1..threads]);
    r.row(
        &format!("free latency of one thread while {} others allocate on its manager", threads - 1),
        format!("p50 {p50:.0} ns, p99 {p99:.0} ns"),
        "report",
    );
    r.row(
        &format!("{threads} threads of integer arithmetic, no Kmm"),
        format!("{machine:.1}x one thread ({} logical CPUs)", std::thread::available_parallelism().map_or(0, |n| n.get())),
        "the machine's own scaling",
    );
    if scaling_only {
        return;
    }

    copies(backend, cuda, quick, &mut r);
    pinned_alloc(backend, cuda, &mut r);
    pair_1mib(backend, &mut r);
}

/// Latency of `kmm_buffer_free` (p50, p99 in ns) from one thread that allocates and frees 64 KiB
/// buffers while one thread per trace in `others` runs it on the same manager.
fn free_latency(backend: u32, others: &[Vec<Op>]) -> (f64, f64) {
    let m = manager(backend, |_| {});
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut samples: Vec<u64> = std::thread::scope(|s| {
        for t in others {
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    run(t, &mut KmmAlloc(m));
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut samples = Vec::with_capacity(50_000);
        for i in 0..50_000usize {
            let mut b = 0;
            ok(kmm_buffer_alloc(m, 64 << 10, DEVICE, &mut b));
            if i % 7 == 0 {
                ok(kmm_fill(m, b, 0, 4096, [1u8].as_ptr().cast(), 1));
            }
            let t = Instant::now();
            ok(kmm_buffer_free(m, b, 0));
            samples.push(t.elapsed().as_nanos() as u64);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        samples
    });
    ok(kmm_manager_destroy(m, 0));
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize] as f64;
    (at(0.5), at(0.99))
}

/// The peer of bench/julia_alloc.jl: one 1 MiB device buffer allocated and freed through the
/// C ABI, on the default manager configuration.
fn pair_1mib(backend: u32, r: &mut Report) {
    let m = manager(backend, |_| {});
    let ns = alloc_free_ns(m, 1 << 20, DEVICE, 1000, 200_000);
    ok(kmm_manager_destroy(m, 0));
    r.row("1 MiB device alloc+free pair, C ABI from Rust", format!("{ns:.0} ns"), "peer of bench/julia_alloc.jl");
    // What the Python plugins add under Python: Numba's and PyTorch's calls (by handle, on the
    // stream the memory is for) and CuPy's (by address, the device's manager looked up).
    let m = manager(backend, |_| {});
    let plugin = timed_pairs(1000, 200_000, || {
        let (mut b, mut p) = (0, 0);
        ok(kmm_plugin_alloc(m, 1 << 20, DEVICE, 0, &mut b, &mut p));
        ok(kmm_plugin_free(m, b, 0));
    });
    ok(kmm_cupy_set_manager(0, m));
    let cupy = timed_pairs(1000, 200_000, || {
        let p = kmm_cupy_malloc(std::ptr::null_mut(), 1 << 20, 0);
        assert!(!p.is_null(), "kmm_cupy_malloc failed");
        kmm_cupy_free(std::ptr::null_mut(), p, 0);
    });
    ok(kmm_manager_destroy(m, 0));
    r.row(
        "1 MiB device alloc+free pair, plugin calls from Rust",
        format!("{plugin:.0} ns (kmm_plugin_alloc/free), {cupy:.0} ns (kmm_cupy_malloc/free)"),
        "peer of bench/python_alloc.py",
    );
}

/// Nanoseconds per allocate+free pair of one `bytes` buffer of `kind`, after `warmup` pairs.
fn alloc_free_ns(m: KmmManager, bytes: u64, kind: u32, warmup: usize, n: usize) -> f64 {
    timed_pairs(warmup, n, || {
        let mut b = 0;
        ok(kmm_buffer_alloc(m, bytes, kind, &mut b));
        ok(kmm_buffer_free(m, b, 0));
    })
}

/// Nanoseconds per call of `pair`, over `n` calls after `warmup`.
fn timed_pairs(warmup: usize, n: usize, mut pair: impl FnMut()) -> f64 {
    (0..warmup).for_each(|_| pair());
    let t = Instant::now();
    (0..n).for_each(|_| pair());
    t.elapsed().as_nanos() as f64 / n as f64
}

/// How much faster `threads` threads run a fixed amount of integer arithmetic than one thread
/// (median of three): what the machine's cores, SMT siblings and clocks allow any per-thread
/// work, for the multi-thread rows to be read against.
fn machine_scaling(threads: usize) -> f64 {
    const STEPS: u64 = 20_000_000;
    let spin = |seed: u64| {
        let mut rng = Rng(seed | 1);
        (0..STEPS).fold(0u64, |acc, _| acc.wrapping_add(rng.next()))
    };
    let timed = |n: usize| {
        let t = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..n).map(|i| s.spawn(move || spin(i as u64 + 1))).collect();
            workers.into_iter().map(|w| w.join().expect("arithmetic thread")).fold(0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        (n as f64 * STEPS as f64) / t.elapsed().as_secs_f64()
    };
    median((0..3).map(|_| timed(threads) / timed(1)).collect())
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn copies(backend: u32, cuda: bool, quick: bool, r: &mut Report) {
    let bytes: u64 = if quick { 64 << 20 } else { 256 << 20 };
    let reps = if quick { 2 } else { 5 };
    let m = manager(backend, |_| {});
    let mut d = 0;
    ok(kmm_buffer_alloc(m, bytes, DEVICE, &mut d));
    let mut pageable = vec![1u8; bytes as usize];
    let mut pin = 0;
    ok(kmm_buffer_alloc(m, bytes, PINNED, &mut pin));
    let mut pin_ptr = 0;
    ok(kmm_buffer_map(m, pin, &mut pin_ptr));
    let h2d_pageable = best_of(reps, || ok(kmm_copy_to_device(m, d, 0, pageable.as_ptr().cast(), bytes)));
    let d2h_pageable = best_of(reps, || ok(kmm_copy_to_host(m, pageable.as_mut_ptr().cast(), d, 0, bytes)));
    let h2d_pinned = best_of(reps, || ok(kmm_copy_to_device(m, d, 0, pin_ptr as *const _, bytes)));
    let d2h_pinned = best_of(reps, || ok(kmm_copy_to_host(m, pin_ptr as *mut _, d, 0, bytes)));
    let mut dptr = 0;
    ok(kmm_buffer_map(m, d, &mut dptr));
    let (mut ref_h2d, mut ref_d2h, mut raw_h2d) = (f64::NAN, f64::NAN, f64::NAN);
    if cuda {
        unsafe {
            let mut host = std::ptr::null_mut();
            cu(sys::cuMemHostAlloc(&mut host, bytes as usize, 0));
            ref_h2d = best_of(reps, || cu(sys::cuMemcpyHtoD_v2(dptr, host, bytes as usize)));
            ref_d2h = best_of(reps, || cu(sys::cuMemcpyDtoH_v2(host, dptr, bytes as usize)));
            raw_h2d = best_of(reps, || cu(sys::cuMemcpyHtoD_v2(dptr, pageable.as_ptr().cast(), bytes as usize)));
            cu(sys::cuMemFreeHost(host));
        }
    }
    let mib = bytes >> 20;
    let rate = |secs: f64| gbps(bytes, secs);
    let vs = |secs: f64, reference: f64| if reference.is_nan() { String::new() } else { format!(" ({:.2}x pinned cuMemcpy)", reference / secs) };
    r.row(&format!("H2D {mib} MiB pageable via Kmm"), format!("{:.1} GB/s{}", rate(h2d_pageable), vs(h2d_pageable, ref_h2d)), ">= 0.8x");
    r.row(&format!("D2H {mib} MiB pageable via Kmm"), format!("{:.1} GB/s{}", rate(d2h_pageable), vs(d2h_pageable, ref_d2h)), ">= 0.8x");
    r.row(&format!("H2D {mib} MiB from Kmm pinned"), format!("{:.1} GB/s{}", rate(h2d_pinned), vs(h2d_pinned, ref_h2d)), ">= 0.95x");
    r.row(&format!("D2H {mib} MiB into Kmm pinned"), format!("{:.1} GB/s{}", rate(d2h_pinned), vs(d2h_pinned, ref_d2h)), ">= 0.95x");
    if cuda {
        r.row("H2D pinned cuMemcpyHtoD (reference)", format!("{:.1} GB/s", rate(ref_h2d)), "");
        r.row("D2H pinned cuMemcpyDtoH (reference)", format!("{:.1} GB/s", rate(ref_d2h)), "");
        r.row("H2D pageable cuMemcpyHtoD (no staging)", format!("{:.1} GB/s", rate(raw_h2d)), "");
    }
    ok(kmm_buffer_unmap(m, d));
    ok(kmm_buffer_unmap(m, pin));
    ok(kmm_manager_destroy(m, 0));
}

fn pinned_alloc(backend: u32, cuda: bool, r: &mut Report) {
    let bytes = 64u64 << 20;
    let m = manager(backend, |c| c.pinned_chunk_size = 64 << 20);
    let kmm_ns = alloc_free_ns(m, bytes, PINNED, 1, 10_000);
    ok(kmm_manager_destroy(m, 0));
    r.row("pinned 64 MiB alloc+free from Kmm's pool", format!("{:.0} ns", kmm_ns), "<= 2 us");
    if cuda {
        let t = Instant::now();
        for _ in 0..3 {
            unsafe {
                let mut p = std::ptr::null_mut();
                cu(sys::cuMemHostAlloc(&mut p, bytes as usize, 0));
                cu(sys::cuMemFreeHost(p));
            }
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / 3.0;
        r.row("pinned 64 MiB cuMemHostAlloc+cuMemFreeHost", format!("{ms:.1} ms"), "");
    }
}
