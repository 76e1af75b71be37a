//! Model-based, multi-stream test of `kmm_buffer_record_stream` on the host backend, whose
//! streams keep CUDA's semantics (queued work runs later, in order, on the stream's thread).
//!
//! One pool-mode manager, its stream and three foreign host streams; three threads each own some
//! device buffers (256 B to 1 MiB) and do random allocations, frees, recorded "foreign work",
//! Kmm copies and fills, copies between buffers, trims, and plugin allocations and frees on
//! foreign streams. A model holds every live buffer's expected bytes. Foreign work (map, record
//! the stream, queue, unmap) sleeps up to 2 ms on its stream, then checks that the buffer still
//! holds what the model expected when the work was queued, and may write new bytes. Variants:
//! the default pool; a tight compacting pool (buffers move often); a hard limit without
//! compaction (allocations run out of memory and cached chunks go back).
//!
//! The test orders data dependencies itself, as a user must: the manager's stream waits for the
//! foreign streams that touched a buffer before Kmm reads or writes it, and a foreign stream is
//! ordered after the manager's stream (and after the other foreign streams that touched the
//! buffer) before its work is queued. It orders nothing before a free, a trim or an allocation:
//! that memory is not freed, moved, given back or handed out again while recorded foreign work
//! (or a plugin's work on its stream) still uses it is Kmm's job. A fence Kmm drops shows up as
//! bytes that foreign work or a later read finds changed; when Kmm's own queued work writes
//! memory it gave back, glibc may abort the process instead.
//!
//! Each thread draws its operations from its own generator and touches only its own buffers, so
//! the operations are the same for a seed; the interleaving is not (nor, under a hard limit,
//! which allocations run out of memory). The test always uses the host backend.
//!
//! KMM_STREAM_SEED (replay one seed: failures print it), KMM_STREAM_SEEDS (seeds per variant,
//! default 4), KMM_STREAM_OPS (operations per thread, default 500).
mod common;
mod trust_support;
use common::*;
use kmm::backend::host::HostBackend;
use kmm::backend::Stream;
use kmm::ffi::plugin::{kmm_plugin_alloc, kmm_plugin_free};
use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};
use trust_support::{Rng, Watchdog};

const THREADS: usize = 3;
const FOREIGN_STREAMS: usize = 3;
/// Longest sleep of a foreign work item: long enough for Kmm's stream to overtake it.
const MAX_DELAY_US: u64 = 2000;

/// One configuration of the manager and of the operations.
struct Variant {
    name: &'static str,
    threads: usize,
    /// Plugin allocations (mapped for as long as they live) take part.
    plugins: bool,
    /// The smallest buffer is 256 B << this.
    min_shift: u64,
    /// Allocations may run out of memory (and so give cached memory back).
    limited: bool,
    /// Threads trim (kmm_manager_trim).
    trims: bool,
    /// Live buffers per thread: few enough that freed blocks are reused soon.
    max_live: usize,
    /// The largest allocation that makes room (see `make_room_around`); others are 1 MiB at most.
    largest: u64,
    config: fn(&mut KmmConfig),
}

#[test]
fn pool() {
    run_variant(&Variant { name: "pool", threads: THREADS, plugins: true, min_shift: 0, limited: false, trims: true, max_live: 8, largest: 1 << 20, config: |_| {} });
}

/// Small chunks, a ratio of 100 and a hard limit that keeps the pool tight: an allocation that
/// misses moves unmapped buffers (with foreign work perhaps still queued on them) to make room.
#[test]
fn compaction() {
    run_variant(&Variant {
        name: "compaction",
        threads: THREADS, plugins: true, min_shift: 0,
        limited: true,
        trims: false,
        max_live: 8,
        largest: 1 << 20,
        config: |c| {
            c.chunk_size = 2 << 20;
            c.compaction_ratio_pct = 100;
            c.hard_limit = 6 << 20;
        },
    });
}

/// A hard limit and no compaction: allocations run out of memory, which waits for the stream and
/// gives every cached chunk back (the trim path) before trying again. Large requests (up to
/// 3 MiB) need chunks larger than those cached, so cached chunks do go back.
#[test]
fn hard_limit() {
    run_variant(&Variant {
        name: "hard_limit",
        threads: THREADS, plugins: true, min_shift: 0,
        limited: true,
        trims: false,
        max_live: 4,
        largest: 3 << 20,
        config: |c| {
            c.chunk_size = 2 << 20;
            c.hard_limit = 8 << 20;
            c.compaction_ratio_pct = 0;
        },
    });
}

/// Eight threads, a hard limit well under their live set (8 threads x up to 32 buffers of 64 KiB
/// to 1 MiB; no plugin allocations, which stay mapped) and spill to host: allocations and uses find the device full,
/// unmapped buffers (some with foreign work still queued on them) spill, and come back on their
/// next use, into their own lane's pool or a free block another lane lends. Nothing may run out of
/// memory (the spill limit holds the live set), and every byte must survive the trips.
#[test]
fn spill() {
    run_variant(&Variant {
        name: "spill",
        threads: 8,
        plugins: false,
        min_shift: 8,
        limited: false,
        trims: true,
        max_live: 32,
        largest: 1 << 20,
        config: |c| {
            c.chunk_size = 2 << 20;
            c.hard_limit = 16 << 20;
            c.spill_limit = 256 << 20;
            // The pinned pool takes part of the spill; the rest goes to pageable memory.
            c.pinned_limit = 2 << 20;
            c.pinned_chunk_size = 2 << 20;
        },
    });
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run_variant(variant: &'static Variant) {
    keep_freed_memory_mapped();
    let seeds: Vec<u64> = match std::env::var("KMM_STREAM_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => vec![seed],
        None => (1..=env_u64("KMM_STREAM_SEEDS", 4)).collect(),
    };
    let ops = env_u64("KMM_STREAM_OPS", 500) as usize;
    // A variant that never reached the path it is for tested nothing (a single seed may not).
    let check_coverage = seeds.len() >= 3;
    let _watchdog = Watchdog::arm("stream_model", Duration::from_secs(120));
    let started = Instant::now();
    let mut totals = BTreeMap::new();
    for seed in seeds {
        let counts = run_seed(variant, seed, ops);
        for (k, v) in counts {
            *totals.entry(k).or_insert(0) += v;
        }
    }
    eprintln!("stream_model {}: {:.1} s, {totals:?}", variant.name, started.elapsed().as_secs_f64());
    // Other allocation modes (KMM_TEST_ALLOC_MODE) neither compact nor keep chunks.
    let pool_mode = std::env::var("KMM_TEST_ALLOC_MODE").map_or(true, |m| m.is_empty() || m == "pool");
    if check_coverage && pool_mode {
        let count = |k: &str| totals.get(k).copied().unwrap_or(0);
        match variant.name {
            "compaction" => assert!(count("compactions") > 0, "the compaction variant moved no buffer"),
            "hard_limit" => assert!(count("chunks_given_back") > 0, "the hard limit variant gave no chunk back"),
            "spill" => {
                assert!(count("spills") > 0 && count("restores") > 0, "the spill variant spilled or restored nothing");
                assert!(count("spilled_past_pinned") > 0, "the spill variant never overflowed into pageable memory");
            }
            _ => {}
        }
        assert!(!variant.limited || count("alloc_oom") > 0, "the hard limit was never reached");
    }
}

/// Freed device memory must read as wrong bytes, not fault: keep glibc from returning the pool's
/// chunks (a few MiB) to the kernel, so memory that Kmm gives back while foreign work still uses
/// it stays mapped (and is soon handed out again) instead of crashing the stream's thread.
fn keep_freed_memory_mapped() {
    static ONCE: Once = Once::new();
    // Best effort: an allocator that ignores mallopt (AddressSanitizer's) catches such reads
    // itself, as use after free.
    ONCE.call_once(|| unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    });
}

/// What the threads of one seed share.
struct Ctx {
    variant: &'static Variant,
    seed: u64,
    m: KmmManager,
    own_stream: u64,
    streams: Vec<Arc<dyn Stream>>,
    failures: Arc<Failures>,
}

impl Ctx {
    fn raw(&self, s: usize) -> u64 {
        self.streams[s].raw()
    }
}

/// Failures seen by any thread, stream workers included (they cannot panic the test).
#[derive(Default)]
struct Failures(Mutex<Vec<String>>);

impl Failures {
    fn add(&self, what: String) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() < 20 {
            all.push(what);
        }
    }
    fn any(&self) -> bool {
        !self.0.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
    fn report(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).join("\n  ")
    }
}

fn run_seed(variant: &'static Variant, seed: u64, ops: usize) -> BTreeMap<&'static str, u64> {
    let mut config = default_config();
    config.backend = KmmBackend::KMM_BACKEND_HOST as u32;
    (variant.config)(&mut config);
    let mut m = 0;
    ok(kmm_manager_create(&config, &mut m));
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(m, &mut info));
    let host = HostBackend::get(0).unwrap();
    let streams = (0..FOREIGN_STREAMS).map(|_| host.create_stream().unwrap()).collect();
    let ctx = Arc::new(Ctx { variant, seed, m, own_stream: info.stream, streams, failures: Arc::default() });
    let workers: Vec<_> = (0..variant.threads)
        .map(|id| {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                let mut w = Worker::new(id, ctx);
                w.run(ops);
                w
            })
        })
        .collect();
    let joined: Vec<_> = workers.into_iter().map(|h| h.join()).collect();
    drain(&ctx);
    let mut counts = BTreeMap::new();
    let mut logs = String::new();
    for (id, result) in joined.into_iter().enumerate() {
        match result {
            Ok(mut w) => {
                w.verify_all();
                logs += &w.log_text();
                w.free_all();
                for (k, v) in w.counts {
                    *counts.entry(k).or_insert(0) += v;
                }
            }
            Err(_) => ctx.failures.add(format!("thread {id} panicked (its message is above)")),
        }
    }
    let stats = device_stats(m);
    // Every buffer is freed: nothing stays counted on the device or on the host.
    assert_eq!((stats.in_use, stats.spilled_bytes, stats.live_buffers), (0, 0, 0), "{}: stats after every free: {stats:?}", variant.name);
    assert!(stats.spilled_out_bytes >= stats.restored_in_bytes && stats.spills >= stats.restores, "{stats:?}");
    *counts.entry("spills").or_insert(0) += stats.spills;
    *counts.entry("restores").or_insert(0) += stats.restores;
    // More on the host than the pinned limit holds: pageable memory took the rest.
    *counts.entry("spilled_past_pinned").or_insert(0) += u64::from(stats.peak_spilled_bytes > 2 << 20);
    *counts.entry("peak_spilled_kib").or_insert(0) += stats.peak_spilled_bytes >> 10;
    *counts.entry("compactions").or_insert(0) += stats.compactions;
    *counts.entry("chunks_given_back").or_insert(0) += stats.upstream_frees;
    *counts.entry("pool_misses").or_insert(0) += stats.pool_misses;
    *counts.entry("relocated_kib").or_insert(0) += stats.relocated_bytes >> 10;
    drain(&ctx);
    ok(kmm_manager_destroy(m, 0));
    if ctx.failures.any() {
        panic!(
            "stream_model {name}, seed {seed}: Kmm let memory change under queued work:\n  {}\n{logs}\
             replay with KMM_STREAM_SEED={seed} KMM_STREAM_OPS={ops} \
             cargo test --release -p kmm --test stream_model {name} -- --nocapture",
            ctx.failures.report(),
            name = variant.name
        );
    }
    counts
}

fn device_stats(m: KmmManager) -> KmmMemoryStats {
    let mut s = KmmMemoryStats::default();
    ok(kmm_manager_stats(m, DEVICE, &mut s));
    s
}

/// Waits until every stream is idle. Nothing queues any more, so one pass over the manager's
/// stream, each foreign stream, and the manager's stream again (for its waits on them) is enough.
fn drain(ctx: &Ctx) {
    ok(kmm_manager_synchronize(ctx.m));
    for s in &ctx.streams {
        let (tx, rx) = channel();
        s.launch_host_fn(Box::new(move || {
            let _ = tx.send(());
        }))
        .unwrap();
        rx.recv().unwrap();
    }
    ok(kmm_manager_synchronize(ctx.m));
}

/// A live buffer of one thread, as the model sees it.
struct Buf {
    h: KmmBuffer,
    /// The bytes it holds once all work queued so far has run.
    data: Vec<u8>,
    /// The stream a plugin allocation was made for (freed with `kmm_plugin_free` on it); plugin
    /// buffers get no queued Kmm work, as a plugin's memory is used on its own streams.
    plugin: Option<usize>,
    /// Foreign streams (bits) with work on this buffer that the manager's stream has not been
    /// ordered after: Kmm work on it must wait for them first.
    touched: u8,
}

struct Worker {
    id: usize,
    ctx: Arc<Ctx>,
    rng: Rng,
    bufs: Vec<Buf>,
    step: usize,
    log: VecDeque<String>,
    counts: BTreeMap<&'static str, u64>,
}

impl Worker {
    fn new(id: usize, ctx: Arc<Ctx>) -> Worker {
        let rng = Rng::new(ctx.seed.wrapping_mul(1_000_003).wrapping_add(id as u64));
        Worker { id, ctx, rng, bufs: Vec::new(), step: 0, log: VecDeque::new(), counts: BTreeMap::new() }
    }

    fn run(&mut self, ops: usize) {
        for step in 0..ops {
            self.step = step;
            match self.rng.below(100) {
                0..=15 => self.op_alloc(),
                16..=23 => self.op_free(),
                24..=45 => self.op_foreign_work(),
                46..=49 => self.op_record_only(),
                50..=56 => self.op_upload(),
                57..=65 => self.op_download(),
                66..=72 => self.op_fill(),
                73..=79 => self.op_copy_buffer(),
                80..=82 if self.ctx.variant.trims => self.op_trim(),
                80..=82 => self.op_download(),
                83..=92 if self.ctx.variant.plugins => self.op_plugin_alloc(),
                93..=97 if self.ctx.variant.plugins => self.op_plugin_free(),
                83..=97 => self.op_foreign_work(),
                _ => self.op_free_all(),
            }
            // A failure is reported with the steps that led to it: stop adding more.
            if self.ctx.failures.any() {
                break;
            }
        }
    }

    fn note(&mut self, op: &'static str, text: String) {
        *self.counts.entry(op).or_insert(0) += 1;
        if self.log.len() == 30 {
            self.log.pop_front();
        }
        self.log.push_back(format!("#{} {text}", self.step));
    }

    fn log_text(&self) -> String {
        let lines: Vec<&str> = self.log.iter().map(String::as_str).collect();
        format!("thread {} last steps:\n    {}\n", self.id, lines.join("\n    "))
    }

    fn who(&self) -> String {
        format!("{} seed {} thread {} step {}", self.ctx.variant.name, self.ctx.seed, self.id, self.step)
    }

    /// 256 B to 1 MiB, spread evenly over the powers of two.
    fn size(&mut self) -> u64 {
        let shift = self.ctx.variant.min_shift;
        let base = 256u64 << (shift + self.rng.below(12 - shift));
        base + self.rng.below(base)
    }

    /// A non-empty range of a buffer of `len` bytes whose length is a multiple of `unit`; the
    /// whole buffer a third of the time.
    fn range(&mut self, len: usize, unit: usize) -> (usize, usize) {
        if self.rng.below(3) == 0 {
            return (0, len / unit * unit);
        }
        let n = (1 + self.rng.below((len / unit) as u64) as usize) * unit;
        (self.rng.below((len - n + 1) as u64) as usize, n)
    }

    fn pick(&mut self) -> Option<usize> {
        (!self.bufs.is_empty()).then(|| self.rng.below(self.bufs.len() as u64) as usize)
    }

    /// A buffer that queued Kmm work may touch (not a plugin allocation).
    fn pick_own(&mut self) -> Option<usize> {
        let own: Vec<usize> = (0..self.bufs.len()).filter(|&i| self.bufs[i].plugin.is_none()).collect();
        (!own.is_empty()).then(|| own[self.rng.below(own.len() as u64) as usize])
    }

    /// Out of memory is expected under the hard limit only.
    fn out_of_memory(&mut self, st: KmmStatus, op: &'static str) -> bool {
        if st == KMM_ERROR_OUT_OF_MEMORY && self.ctx.variant.limited {
            self.note(op, format!("{op}: out of memory"));
            return true;
        }
        assert_eq!(st, KMM_OK, "{}: {op}: {}", self.who(), last_error());
        false
    }

    // ---- user-side ordering (data dependencies) ----

    /// Orders the manager's stream after the foreign streams in `bits`.
    fn wait_for(&self, bits: u8) {
        for s in (0..FOREIGN_STREAMS).filter(|s| bits & (1 << s) != 0) {
            ok(kmm_manager_wait_stream(self.ctx.m, self.ctx.raw(s)));
        }
    }

    /// Before Kmm's stream reads or writes buffer `i`.
    fn before_kmm_work(&mut self, i: usize) {
        let bits = std::mem::take(&mut self.bufs[i].touched);
        self.wait_for(bits);
    }

    /// Before foreign stream `s` reads or writes buffer `i`: after the other foreign streams' work
    /// on it (ordered stream to stream, as users do with events: ordering them through the
    /// manager's stream would also order Kmm's own work after them and hide missing fences), and
    /// after Kmm's work on it.
    fn before_foreign_work(&mut self, i: usize, s: usize) {
        let others = self.bufs[i].touched & !(1 << s);
        for t in (0..FOREIGN_STREAMS).filter(|t| others & (1 << t) != 0) {
            self.ctx.streams[s].wait_raw_stream(self.ctx.raw(t)).unwrap();
        }
        ok(kmm_manager_signal_stream(self.ctx.m, self.ctx.raw(s)));
        // Stream `s` now comes after the others' work on the buffer: waiting for it is enough.
        self.bufs[i].touched = 1 << s;
    }

    // ---- allocation and free ----

    fn op_alloc(&mut self) {
        if self.bufs.len() >= self.ctx.variant.max_live {
            return self.op_free();
        }
        let bytes = self.size();
        self.alloc_and_write(bytes);
    }

    /// Allocates and writes the whole buffer at once (by a copy or a fill on Kmm's stream), so
    /// that reused memory is written right away.
    fn alloc_and_write(&mut self, bytes: u64) {
        let mut h = 0;
        let st = kmm_buffer_alloc(self.ctx.m, bytes, DEVICE, &mut h);
        if self.out_of_memory(st, "alloc_oom") {
            return;
        }
        self.note("alloc", format!("alloc {bytes} -> {h:#x}"));
        self.bufs.push(Buf { h, data: vec![0; bytes as usize], plugin: None, touched: 0 });
        let i = self.bufs.len() - 1;
        if self.rng.below(2) == 0 {
            self.upload(i, 0, bytes as usize);
        } else {
            let width = 1 << bytes.trailing_zeros().min(3);
            self.fill(i, 0, bytes as usize, width);
        }
    }

    /// Drops every buffer at once (a cache cleared): whole chunks become free while foreign work
    /// on them may still be queued, for a trim or another thread's out-of-memory path to take.
    fn op_free_all(&mut self) {
        self.free_all();
    }

    fn op_free(&mut self) {
        if let Some(i) = self.pick() {
            self.free_at(i);
        }
    }

    /// Frees without waiting for anything: the frees that foreign work still uses are Kmm's to
    /// fence.
    fn free_at(&mut self, i: usize) {
        let b = self.bufs.swap_remove(i);
        let st = match b.plugin {
            Some(s) => kmm_plugin_free(self.ctx.m, b.h, self.ctx.raw(s)),
            None => kmm_buffer_free(self.ctx.m, b.h, 0),
        };
        assert_eq!(st, KMM_OK, "{}: free {:#x}: {}", self.who(), b.h, last_error());
        self.note("free", format!("free {:#x} (plugin {:?}, touched {:#b})", b.h, b.plugin, b.touched));
        // A freed handle is stale for every call, record_stream included.
        if self.rng.below(8) == 0 {
            let st = kmm_buffer_record_stream(self.ctx.m, b.h, self.ctx.raw(0));
            assert_eq!(st, KMM_ERROR_INVALID_HANDLE, "{}: record_stream of freed {:#x}", self.who(), b.h);
        }
    }

    // ---- foreign work ----

    fn op_foreign_work(&mut self) {
        let Some(i) = self.pick() else { return };
        self.foreign_work_on(i);
        self.after_foreign_work(i);
    }

    /// Maps buffer `i`, records a foreign stream, queues on it work that sleeps, checks the
    /// buffer's bytes and perhaps writes new ones, and unmaps at once: from then on only the
    /// record keeps Kmm from moving, freeing or reusing the memory under that work.
    fn foreign_work_on(&mut self, i: usize) {
        let s = self.rng.below(FOREIGN_STREAMS as u64) as usize;
        self.before_foreign_work(i, s);
        let (m, h) = (self.ctx.m, self.bufs[i].h);
        let mut addr = 0;
        ok(kmm_buffer_map(m, h, &mut addr));
        ok(kmm_buffer_record_stream(m, h, self.ctx.raw(s)));
        let expect = self.bufs[i].data.clone();
        let write = (self.rng.below(2) == 0).then(|| {
            let (off, len) = self.range(expect.len(), 1);
            (off, random_bytes(len, self.rng.next()))
        });
        if let Some((off, bytes)) = &write {
            self.bufs[i].data[*off..*off + bytes.len()].copy_from_slice(bytes);
        }
        let delay = Duration::from_micros(self.rng.below(MAX_DELAY_US + 1));
        let who = format!("{} on stream {s}, buffer {h:#x} at {addr:#x}", self.who());
        let work = foreign_work(self.ctx.failures.clone(), who, addr, expect, write, delay);
        self.ctx.streams[s].launch_host_fn(work).unwrap();
        ok(kmm_buffer_unmap(m, h));
        self.note("foreign_work", format!("foreign work on stream {s}: {h:#x} at {addr:#x}, delay {delay:?}"));
    }

    /// What often follows while the foreign work is still queued: the buffer is dropped (freed,
    /// and its memory perhaps asked for again or trimmed), or kept while a large allocation may
    /// move it.
    fn after_foreign_work(&mut self, i: usize) {
        match self.rng.below(8) {
            0 | 1 => self.free_at(i),
            2 | 3 => {
                let bytes = self.bufs[i].data.len() as u64;
                self.free_at(i);
                self.alloc_and_write(bytes);
            }
            4 => {
                self.free_at(i);
                if self.ctx.variant.trims {
                    self.op_trim();
                } else {
                    self.alloc_large();
                }
            }
            5 | 6 => self.make_room_around(i),
            _ => {}
        }
    }

    /// Frees another buffer (a hole next to buffer `i`, perhaps), queues foreign work on the rest
    /// too and asks for a large buffer, which a compacting pool that misses serves by moving
    /// unmapped buffers: whichever it moves has foreign work queued. (The free comes first: a
    /// correct free orders Kmm's stream after the streams recorded for the freed buffer, which
    /// would order the moves after the work queued so far on them as well.)
    fn make_room_around(&mut self, i: usize) {
        let h = self.bufs[i].h;
        if self.bufs.len() > 1 {
            let j = (i + 1 + self.rng.below(self.bufs.len() as u64 - 1) as usize) % self.bufs.len();
            self.free_at(j);
        }
        for j in 0..self.bufs.len() {
            if self.bufs[j].h != h {
                self.foreign_work_on(j);
            }
        }
        self.alloc_large();
    }

    /// A request that often misses: it makes a compacting pool move buffers, and one under a hard
    /// limit give cached chunks back (a request above 2 MiB needs a chunk of its own).
    fn alloc_large(&mut self) {
        let bytes = (256 << 10) + self.rng.below(self.ctx.variant.largest - (256 << 10));
        self.alloc_and_write(bytes);
    }

    /// Records a stream without queueing work: the manager's own (a no-op) or a foreign one.
    fn op_record_only(&mut self) {
        let Some(i) = self.pick() else { return };
        let s = self.rng.below(FOREIGN_STREAMS as u64 + 1) as usize;
        let raw = if s == FOREIGN_STREAMS { self.ctx.own_stream } else { self.ctx.raw(s) };
        let h = self.bufs[i].h;
        ok(kmm_buffer_record_stream(self.ctx.m, h, raw));
        self.note("record_only", format!("record_stream {h:#x} on {raw:#x}"));
    }

    // ---- Kmm's own work ----

    fn upload(&mut self, i: usize, off: usize, len: usize) {
        self.before_kmm_work(i);
        let bytes = random_bytes(len, self.rng.next());
        ok(kmm_copy_to_device(self.ctx.m, self.bufs[i].h, off as u64, bytes.as_ptr().cast(), len as u64));
        self.bufs[i].data[off..off + len].copy_from_slice(&bytes);
        self.note("upload", format!("upload {:#x} [{off}, +{len})", self.bufs[i].h));
    }

    fn op_upload(&mut self) {
        let Some(i) = self.pick() else { return };
        let (off, len) = self.range(self.bufs[i].data.len(), 1);
        self.upload(i, off, len);
    }

    fn op_download(&mut self) {
        let Some(i) = self.pick() else { return };
        let (off, len) = self.range(self.bufs[i].data.len(), 1);
        self.before_kmm_work(i);
        self.download_and_check(i, off, len, "download");
        self.note("download", format!("download {:#x} [{off}, +{len})", self.bufs[i].h));
    }

    fn download_and_check(&mut self, i: usize, off: usize, len: usize, what: &str) {
        let mut got = vec![0u8; len];
        let b = &self.bufs[i];
        ok(kmm_copy_to_host(self.ctx.m, got.as_mut_ptr().cast(), b.h, off as u64, len as u64));
        if let Some(j) = mismatch(&got, &b.data[off..off + len]) {
            let want = b.data[off + j];
            let msg = format!("{}: {what} of {:#x}: byte {} is {:#04x}, the model says {want:#04x}", self.who(), b.h, off + j, got[j]);
            self.ctx.failures.add(msg);
        }
    }

    fn fill(&mut self, i: usize, off: usize, len: usize, width: usize) {
        self.before_kmm_work(i);
        let value = random_bytes(width, self.rng.next());
        let (m, h) = (self.ctx.m, self.bufs[i].h);
        ok(kmm_fill(m, h, off as u64, len as u64, value.as_ptr().cast(), width));
        for chunk in self.bufs[i].data[off..off + len].chunks_exact_mut(width) {
            chunk.copy_from_slice(&value);
        }
        self.note("fill", format!("fill {h:#x} [{off}, +{len}) width {width}"));
    }

    fn op_fill(&mut self) {
        let Some(i) = self.pick_own() else { return };
        let width = 1 << self.rng.below(4);
        let (off, len) = self.range(self.bufs[i].data.len(), width);
        self.fill(i, off, len, width);
    }

    fn op_copy_buffer(&mut self) {
        let (Some(d), Some(s)) = (self.pick_own(), self.pick_own()) else { return };
        if d == s {
            return;
        }
        let (dlen, slen) = (self.bufs[d].data.len(), self.bufs[s].data.len());
        let (doff, len) = self.range(dlen.min(slen), 1);
        let soff = self.rng.below((slen - len + 1) as u64) as usize;
        self.before_kmm_work(d);
        self.before_kmm_work(s);
        let (dh, sh) = (self.bufs[d].h, self.bufs[s].h);
        ok(kmm_copy_buffer(self.ctx.m, dh, doff as u64, self.ctx.m, sh, soff as u64, len as u64));
        let src = self.bufs[s].data[soff..soff + len].to_vec();
        self.bufs[d].data[doff..doff + len].copy_from_slice(&src);
        self.note("copy_buffer", format!("copy_buffer {dh:#x}[{doff}] <- {sh:#x}[{soff}], {len}"));
    }

    fn op_trim(&mut self) {
        let keep = [0, 2 << 20][self.rng.below(2) as usize];
        ok(kmm_manager_trim(self.ctx.m, keep));
        self.note("trim", format!("trim keep {keep}"));
    }

    // ---- plugin allocations ----

    /// Allocates for a foreign stream and writes the memory at once on that stream, with no
    /// ordering by the test: the memory is to be ready for work on that stream.
    fn op_plugin_alloc(&mut self) {
        if self.bufs.len() >= self.ctx.variant.max_live {
            return self.op_free();
        }
        let bytes = self.size();
        let s = self.rng.below(FOREIGN_STREAMS as u64) as usize;
        let (mut h, mut addr) = (0, 0);
        let st = kmm_plugin_alloc(self.ctx.m, bytes, DEVICE, self.ctx.raw(s), &mut h, &mut addr);
        if self.out_of_memory(st, "plugin_alloc_oom") {
            return;
        }
        let data = random_bytes(bytes as usize, self.rng.next());
        let write = Some((0, data.clone()));
        let who = format!("{} on stream {s}, plugin buffer {h:#x} at {addr:#x}", self.who());
        let work = foreign_work(self.ctx.failures.clone(), who, addr, Vec::new(), write, Duration::ZERO);
        self.ctx.streams[s].launch_host_fn(work).unwrap();
        self.bufs.push(Buf { h, data, plugin: Some(s), touched: 1 << s });
        self.note("plugin_alloc", format!("plugin_alloc {bytes} on stream {s} -> {h:#x} at {addr:#x}"));
    }

    fn op_plugin_free(&mut self) {
        let plugins: Vec<usize> = (0..self.bufs.len()).filter(|&i| self.bufs[i].plugin.is_some()).collect();
        if !plugins.is_empty() {
            let i = plugins[self.rng.below(plugins.len() as u64) as usize];
            self.free_at(i);
        }
    }

    // ---- the end ----

    /// Every live buffer holds what the model says (the streams are idle).
    fn verify_all(&mut self) {
        for i in 0..self.bufs.len() {
            let len = self.bufs[i].data.len();
            self.download_and_check(i, 0, len, "final check");
        }
    }

    fn free_all(&mut self) {
        while !self.bufs.is_empty() {
            self.free_at(self.bufs.len() - 1);
        }
    }
}

/// Work for a foreign stream: after `delay`, the `len(expect)` bytes at `addr` must equal
/// `expect`; then `write` (offset, bytes), if any, goes there. Memory found wrong is not written.
fn foreign_work(
    failures: Arc<Failures>,
    who: String,
    addr: u64,
    expect: Vec<u8>,
    write: Option<(usize, Vec<u8>)>,
    delay: Duration,
) -> Box<dyn FnOnce() + Send> {
    Box::new(move || {
        std::thread::sleep(delay);
        // SAFETY: Kmm keeps the memory for the recorded stream until this has run (the property
        // under test; a test run with mallopt above keeps even wrongly freed memory mapped).
        let got = unsafe { std::slice::from_raw_parts(addr as *const u8, expect.len()) };
        if let Some(j) = mismatch(got, &expect) {
            let n = got.iter().zip(&expect).filter(|(a, b)| a != b).count();
            failures.add(format!(
                "{who}: queued foreign work found byte {j} = {:#04x}, expected {:#04x} ({n} of {} bytes differ)",
                got[j],
                expect[j],
                expect.len()
            ));
            return;
        }
        if let Some((off, bytes)) = write {
            // SAFETY: as above; the range lies inside the buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (addr as usize + off) as *mut u8, bytes.len()) };
        }
    })
}

fn mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    if got == want {
        return None;
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

/// `len` pseudo-random bytes, eight at a time (buffers reach 1 MiB).
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}
