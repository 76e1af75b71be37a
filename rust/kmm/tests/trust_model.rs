//! Model-based test of the C ABI: seeded random walks over every exported call of the core
//! (managers, buffers, copies, fills, events, streams, stats), with valid and invalid arguments
//! mixed (forged, stale, foreign and mistyped handles, absurd sizes and offsets, NULL pointers),
//! checked step by step against a reference model of what each call must return and what each
//! buffer must contain. After every step: statuses match the model, the manager statistics
//! equal the model's sums; at synchronization points every live buffer's bytes (read through
//! copies and, on the host, through mapped pointers) match the model; at the end nothing leaks
//! (every allocation made through the backend has been freed).
//!
//! KMM_TRUST_CASES (walks, default 64), KMM_TRUST_STEPS (steps per walk, default 2000),
//! KMM_TRUST_SEED (replay one walk: the failure message prints it).
mod common;
use common::*;
use kmm::backend::faulty::{self, FaultPlan};
use std::collections::BTreeMap;
use std::ptr::{null, null_mut};
use std::sync::Arc;

mod trust_support;
use trust_support::*;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_walks_match_the_model() {
    let _serial = plan_lock();
    let plan = FaultPlan::new();
    faulty::install(Some(plan.clone()));
    let steps = env_u64("KMM_TRUST_STEPS", 2000) as usize;
    let seeds: Vec<u64> = match std::env::var("KMM_TRUST_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => vec![seed],
        None => {
            let base = env_u64("KMM_TRUST_SEED_BASE", 1);
            (0..env_u64("KMM_TRUST_CASES", 64)).map(|i| base + i).collect()
        }
    };
    let mut totals = Tally::default();
    let started = std::time::Instant::now();
    for seed in seeds {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut walk = Walk::new(seed, plan.clone());
            walk.run(steps);
            walk.finish();
            walk.tally
        }));
        match result {
            Ok(t) => totals.add(&t),
            Err(panic) => {
                faulty::install(None);
                eprintln!(
                    "trust_model: walk with seed {seed} failed; replay with\n  KMM_TRUST_SEED={seed} KMM_TRUST_STEPS={steps} \
                     cargo test -p kmm --release --test trust_model -- --nocapture"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    faulty::install(None);
    eprintln!("trust_model: {totals} in {:.1} s", started.elapsed().as_secs_f64());
    // A quarter of the managers compact; a default run whose walks never made one moved nothing.
    assert!(totals.walks < 32 || totals.compactions > 0, "{} walks and not one compaction", totals.walks);
}

/// Counts for the reliability report.
#[derive(Default, Debug)]
struct Tally {
    walks: u64,
    calls: u64,
    bad_inputs: u64,
    bytes_checked: u64,
    /// Device allocations served by moving unmapped buffers (seen at stats checks).
    compactions: u64,
    by_op: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.walks += o.walks;
        self.calls += o.calls;
        self.bad_inputs += o.bad_inputs;
        self.bytes_checked += o.bytes_checked;
        self.compactions += o.compactions;
        for (k, v) in &o.by_op {
            *self.by_op.entry(k).or_default() += v;
        }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} walks, {} ABI calls ({} with invalid arguments), {} bytes verified, {} compactions; per op: {:?}",
            self.walks, self.calls, self.bad_inputs, self.bytes_checked, self.compactions, self.by_op
        )
    }
}

struct Buf {
    handle: u64,
    kind: u32,
    bytes: u64,
    data: Vec<u8>,
    known: Vec<bool>,
    pins: u32,
    borrowed: bool,
    /// Memory from `wrap` (its address is the caller's even when empty).
    wrapped: bool,
}

#[derive(Default, Clone, Copy)]
struct Usage {
    in_use: u64,
    peak: u64,
    allocs: u64,
    frees: u64,
    failed: u64,
    live: u64,
    borrowed: u64,
}

struct Pending {
    seq: u64,
    dst: Box<[u8]>,
    expect: Vec<u8>,
    known: Vec<bool>,
}

struct Mgr {
    handle: u64,
    alive: bool,
    cfg: KmmConfig,
    buffers: Vec<Buf>,
    /// Event handle -> the sequence number it was recorded at.
    events: Vec<(u64, u64)>,
    usage: [Usage; 2],
    pending: Vec<Pending>,
    /// Host memory an async copy reads; kept until the manager has synchronized.
    sources: Vec<Box<[u8]>>,
    stream: u64,
    compactions_seen: u64,
}

impl Mgr {
    fn limited(&self) -> bool {
        self.cfg.hard_limit != 0 || self.cfg.pinned_limit != 0
    }
    fn find(&self, h: u64) -> Option<usize> {
        self.buffers.iter().position(|b| b.handle == h)
    }
}

struct Walk {
    seed: u64,
    rng: Rng,
    plan: Arc<FaultPlan>,
    mgrs: Vec<Mgr>,
    seq: u64,
    log: Vec<String>,
    tally: Tally,
    /// Host memory lent to Kmm (borrowed buffers, pending copies of destroyed managers).
    keep_alive: Vec<Box<[u8]>>,
    /// Registered host memory and the manager it was registered through (its only owner).
    registered: Option<(Box<[u8]>, u64)>,
    gpu: bool,
}

macro_rules! check {
    ($walk:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $walk.fail(format!($($fmt)+));
        }
    };
}

impl Walk {
    fn new(seed: u64, plan: Arc<FaultPlan>) -> Walk {
        let mut w = Walk {
            seed,
            rng: Rng::new(seed),
            plan,
            mgrs: Vec::new(),
            seq: 0,
            log: Vec::new(),
            tally: Tally { walks: 1, ..Tally::default() },
            keep_alive: Vec::new(),
            registered: None,
            gpu: gpu(),
        };
        for _ in 0..3 {
            w.create_manager();
        }
        w
    }

    fn fail(&self, what: String) -> ! {
        let tail = self.log.iter().rev().take(40).rev().cloned().collect::<Vec<_>>().join("\n  ");
        panic!("seed {}: {what}\nlast steps:\n  {tail}\nlast kmm error: {}", self.seed, last_error());
    }

    fn note(&mut self, op: &'static str, bad: bool, text: String) {
        self.tally.calls += 1;
        if bad {
            self.tally.bad_inputs += 1;
        }
        *self.tally.by_op.entry(op).or_default() += 1;
        if self.log.len() > 400 {
            self.log.drain(..200);
        }
        self.log.push(format!("#{} {text}", self.seq));
        self.seq += 1;
    }

    fn expect(&self, got: KmmStatus, want: KmmStatus, what: &str) {
        check!(self, got == want, "{what}: got {got:?}, the model expects {want:?}");
    }

    fn random_config(&mut self) -> KmmConfig {
        let mut c = default_config();
        let r = &mut self.rng;
        c.chunk_size = [256 << 10, 1 << 20, 4 << 20][r.below(3) as usize];
        c.pinned_chunk_size = [256 << 10, 1 << 20][r.below(2) as usize];
        c.staging_chunk_size = [4096, 64 << 10][r.below(2) as usize];
        c.staging_chunks = 2 + r.below(3) as u32;
        c.alignment = [256, 256, 512, 4096][r.below(4) as usize];
        match r.below(8) {
            0 | 1 => c.suballocator = KmmSuballocator::KMM_SUBALLOC_BINNED as u32,
            2 => c.suballocator = KmmSuballocator::KMM_SUBALLOC_HEAP as u32,
            3 => {
                c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
                c.fixed_block_size = 64 << 10;
            }
            4 => c.suballocator = KmmSuballocator::KMM_SUBALLOC_RING as u32,
            5 => c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32,
            6 => c.alloc_mode = KmmAllocMode::KMM_ALLOC_CUDA_ASYNC as u32,
            _ => c.release_threshold = 0,
        }
        // Moving unmapped buffers: never, whenever fragmentation blocks a request, or by default.
        c.compaction_ratio_pct = [0, 100, 108][r.below(3) as usize];
        if r.below(5) == 0 {
            c.hard_limit = 3 << 20;
            c.pinned_limit = 2 << 20;
        }
        c
    }

    fn create_manager(&mut self) {
        let cfg = self.random_config();
        let mut h = 0;
        let st = kmm_manager_create(&cfg, &mut h);
        self.note("manager_create", false, format!("manager_create(mode {}, sub {}, limit {}) = {st:?} {h:#x}", cfg.alloc_mode, cfg.suballocator, cfg.hard_limit));
        self.expect(st, KMM_OK, "manager_create");
        let mut info = KmmManagerInfo::default();
        ok(kmm_manager_info(h, &mut info));
        self.mgrs.push(Mgr {
            handle: h,
            alive: true,
            cfg,
            buffers: Vec::new(),
            events: Vec::new(),
            usage: [Usage::default(); 2],
            pending: Vec::new(),
            sources: Vec::new(),
            stream: info.stream,
            compactions_seen: 0,
        });
    }

    fn live_indices(&self) -> Vec<usize> {
        (0..self.mgrs.len()).filter(|&i| self.mgrs[i].alive).collect()
    }

    /// A manager to call: mostly live, sometimes destroyed or forged (index None).
    fn pick_manager(&mut self) -> (Option<usize>, u64, bool) {
        let live = self.live_indices();
        let roll = self.rng.below(100);
        if roll < 92 {
            let i = live[self.rng.below(live.len() as u64) as usize];
            return (Some(i), self.mgrs[i].handle, false);
        }
        if roll < 96 {
            let dead: Vec<usize> = (0..self.mgrs.len()).filter(|&i| !self.mgrs[i].alive).collect();
            if let Some(&i) = dead.get(self.rng.below(dead.len().max(1) as u64) as usize) {
                return (None, self.mgrs[i].handle, true);
            }
        }
        let forged = self.forge_from(self.mgrs[live[0]].handle);
        // A forged value may happen to name a live manager (a flipped generation bit).
        let hit = self.mgrs.iter().position(|m| m.alive && m.handle == forged);
        (hit, forged, hit.is_none())
    }

    fn forge_from(&mut self, h: u64) -> u64 {
        match self.rng.below(7) {
            0 => 0,
            1 => u64::MAX,
            2 => self.rng.next(),
            3 => h ^ (1 << (self.rng.below(60) as u32)),
            4 => h.wrapping_add(1),
            5 => (h & ((1 << 60) - 1)) | (0xE << 60),
            _ => h & ((1 << 60) - 1),
        }
    }

    /// A buffer handle for manager `mi` (index into `mgrs`, None = not a live manager):
    /// mostly one of its live buffers, sometimes stale, foreign, forged or mistyped.
    fn pick_buffer(&mut self, mi: Option<usize>) -> (u64, bool) {
        let own: Vec<u64> = mi.map(|i| self.mgrs[i].buffers.iter().map(|b| b.handle).collect()).unwrap_or_default();
        let roll = self.rng.below(100);
        if roll < 88 && !own.is_empty() {
            return (own[self.rng.below(own.len() as u64) as usize], false);
        }
        let others: Vec<u64> = self
            .mgrs
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != mi)
            .flat_map(|(_, m)| m.buffers.iter().map(|b| b.handle))
            .collect();
        if roll < 93 && !others.is_empty() {
            return (others[self.rng.below(others.len() as u64) as usize], true);
        }
        let base = own.first().copied().or(others.first().copied()).unwrap_or(0xB000_0000_1000_0000);
        (self.forge_from(base), true)
    }

    fn is_live(&self, mi: Option<usize>, h: u64) -> Option<usize> {
        mi.and_then(|i| self.mgrs[i].find(h))
    }

    fn size(&mut self) -> u64 {
        match self.rng.below(20) {
            0 => 0,
            1..=10 => 1 + self.rng.below(4096),
            11..=16 => 1 + self.rng.below(64 << 10),
            17 | 18 => 1 + self.rng.below(300 << 10),
            _ => (256 << 10) + self.rng.below(1200 << 10),
        }
    }

    /// An (offset, length) inside `bytes` most of the time, out of range or overflowing otherwise.
    fn range(&mut self, bytes: u64) -> (u64, u64, bool) {
        match self.rng.below(20) {
            0 => (bytes, 1, true),
            1 => (self.rng.below(bytes + 1), bytes + 1, true),
            2 => (u64::MAX, 2, true),
            3 => (1, u64::MAX, true),
            4 => (0, 0, false),
            _ => {
                let off = self.rng.below(bytes + 1);
                let len = self.rng.below(bytes - off + 1);
                (off, len, false)
            }
        }
    }

    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            match self.rng.below(100) {
                0..=13 => self.op_alloc(),
                14..=22 => self.op_free(),
                23..=32 => self.op_copy_to_device(),
                33..=42 => self.op_copy_to_host(),
                43..=50 => self.op_copy_buffer(),
                51..=56 => self.op_fill(),
                57..=61 => self.op_map_unmap(),
                62..=64 => self.op_info(),
                65..=68 => self.op_events(),
                69..=71 => self.op_sync_or_trim(),
                72..=73 => self.op_peek_poke(),
                74..=75 => self.op_streams(),
                76..=77 => self.op_misc(),
                78 => self.op_destroy_and_replace(),
                79 => self.op_bad_create(),
                80..=81 => self.op_wrap(),
                82 => self.op_register(),
                83..=84 => self.op_cross_manager_race(),
                85 => self.op_fragment(),
                _ => self.op_alloc_then_write(),
            }
            self.check_stats();
        }
    }

    fn op_alloc(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let kind = match self.rng.below(30) {
            0 => 2 + self.rng.below(5) as u32,
            1..=8 => PINNED,
            _ => DEVICE,
        };
        let bytes = match self.rng.below(40) {
            0 => KMM_MAX_BUFFER_BYTES + 1,
            1 => u64::MAX,
            2 => 1 << 47,
            _ => self.size(),
        };
        let null_out = self.rng.below(40) == 0;
        let mut out = 0u64;
        let st = kmm_buffer_alloc(m, bytes, kind, if null_out { null_mut() } else { &mut out });
        let bad = bad_m || null_out || kind > 1 || bytes > (8 << 20);
        self.note("buffer_alloc", bad, format!("buffer_alloc({m:#x}, {bytes}, kind {kind}, null_out {null_out}) = {st:?} {out:#x}"));
        if null_out {
            return self.expect(st, KMM_ERROR_NULL_POINTER, "alloc with NULL out");
        }
        if kind > 1 {
            return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "alloc of unknown kind");
        }
        let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "alloc on a dead manager") };
        let k = kind as usize;
        let cfg = self.mgrs[i].cfg;
        let want = if bytes > KMM_MAX_BUFFER_BYTES {
            KMM_ERROR_SIZE_OVERFLOW
        } else if bytes > 0
            && kind == DEVICE
            && cfg.alloc_mode == KmmAllocMode::KMM_ALLOC_POOL as u32
            && cfg.suballocator == KmmSuballocator::KMM_SUBALLOC_FIXED as u32
            && round_up(bytes, cfg.alignment) > cfg.fixed_block_size
        {
            KMM_ERROR_INVALID_ARGUMENT
        } else if bytes == 1 << 47 {
            KMM_ERROR_OUT_OF_MEMORY
        } else if st == KMM_ERROR_OUT_OF_MEMORY && self.mgrs[i].limited() {
            KMM_ERROR_OUT_OF_MEMORY
        } else {
            KMM_OK
        };
        self.expect(st, want, "buffer_alloc");
        let mgr = &mut self.mgrs[i];
        if st != KMM_OK {
            mgr.usage[k].failed += 1;
            return;
        }
        mgr.usage[k].on_alloc(bytes);
        mgr.buffers.push(Buf {
            handle: out,
            kind,
            bytes,
            data: vec![0; bytes as usize],
            known: vec![false; bytes as usize],
            pins: 0,
            borrowed: false,
            wrapped: false,
        });
        if mgr.buffers.len() > 48 {
            self.free_one(i, 0);
        }
    }

    fn free_one(&mut self, i: usize, index: usize) {
        let b = &self.mgrs[i].buffers[index];
        let (h, pinned) = (b.handle, b.pins > 0);
        let st = kmm_buffer_free(self.mgrs[i].handle, h, if pinned { KMM_FREE_FORCE } else { 0 });
        self.note("buffer_free", false, format!("buffer_free({:#x}, {h:#x}) = {st:?}", self.mgrs[i].handle));
        self.expect(st, KMM_OK, "free of a live buffer");
        self.model_free(i, index);
    }

    fn model_free(&mut self, i: usize, index: usize) {
        let b = self.mgrs[i].buffers.remove(index);
        let u = &mut self.mgrs[i].usage[b.kind as usize];
        u.in_use -= b.bytes;
        u.frees += 1;
        u.live -= 1;
        if b.borrowed {
            u.borrowed -= b.bytes;
        }
    }

    fn op_free(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let (h, bad_h) = self.pick_buffer(mi);
        let flags = match self.rng.below(20) {
            0 => 2 + self.rng.below(100) as u32,
            1..=3 => KMM_FREE_FORCE,
            _ => 0,
        };
        let st = kmm_buffer_free(m, h, flags);
        let live = self.is_live(mi, h);
        self.note("buffer_free", bad_m || bad_h || flags > 1, format!("buffer_free({m:#x}, {h:#x}, {flags}) = {st:?}"));
        if flags > 1 {
            return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "free with unknown flags");
        }
        let Some(index) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "free of a handle that is not live") };
        let i = mi.unwrap();
        if self.mgrs[i].buffers[index].pins > 0 && flags == 0 {
            return self.expect(st, KMM_ERROR_BUFFER_MAPPED, "free of a mapped buffer");
        }
        self.expect(st, KMM_OK, "free");
        self.model_free(i, index);
        // A double free must fail and disturb nothing.
        if self.rng.below(4) == 0 {
            let st = kmm_buffer_free(m, h, 0);
            self.note("buffer_free", true, format!("double buffer_free({m:#x}, {h:#x}) = {st:?}"));
            self.expect(st, KMM_ERROR_INVALID_HANDLE, "double free");
        }
    }

    /// Host memory for a copy: pageable, or the registered region when it fits.
    fn host_block(&mut self, len: u64) -> (Box<[u8]>, bool) {
        let data = pattern(len as usize, self.rng.next()).into_boxed_slice();
        (data, false)
    }

    fn op_copy_to_device(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let (h, bad_h) = self.pick_buffer(mi);
        let live = self.is_live(mi, h);
        let bytes = live.map(|x| self.mgrs[mi.unwrap()].buffers[x].bytes).unwrap_or(4096);
        let (off, len, bad_r) = self.range(bytes);
        let alloc_len = if bad_r { 16 } else { len };
        let null_src = self.rng.below(30) == 0;
        let mode = self.rng.below(3); // 0 sync, 1 async with event, 2 async without
        let use_registered = !null_src && !bad_r && self.registered.as_ref().is_some_and(|(r, _)| r.len() as u64 >= len) && self.rng.below(3) == 0;
        let (src, _) = self.host_block(alloc_len);
        let src_ptr = if null_src {
            null()
        } else if use_registered {
            let r = &mut self.registered.as_mut().unwrap().0;
            r[..len as usize].copy_from_slice(&src[..len as usize]);
            r.as_ptr()
        } else {
            src.as_ptr()
        };
        let mut ev = 0u64;
        let st = match mode {
            0 => kmm_copy_to_device(m, h, off, src_ptr.cast(), len),
            1 => kmm_copy_to_device_async(m, h, off, src_ptr.cast(), len, &mut ev),
            _ => kmm_copy_to_device_async(m, h, off, src_ptr.cast(), len, null_mut()),
        };
        self.note(
            "copy_to_device",
            bad_m || bad_h || bad_r || null_src,
            format!("copy_to_device[{mode}]({m:#x}, {h:#x}, off {off}, len {len}, null {null_src}, reg {use_registered}) = {st:?}"),
        );
        let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy on a dead manager") };
        if null_src && len > 0 {
            return self.expect(st, KMM_ERROR_NULL_POINTER, "copy from NULL");
        }
        let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy into a dead buffer") };
        if bad_r && off.checked_add(len).is_none_or(|e| e > bytes) {
            return self.expect(st, KMM_ERROR_OUT_OF_RANGE, "copy out of range");
        }
        self.expect(st, KMM_OK, "copy_to_device");
        if len > 0 && !null_src {
            let b = &mut self.mgrs[i].buffers[x];
            let r = off as usize..(off + len) as usize;
            b.data[r.clone()].copy_from_slice(&src[..len as usize]);
            b.known[r].iter_mut().for_each(|k| *k = true);
        }
        if mode == 0 {
            self.resolve(i, u64::MAX);
        } else {
            if use_registered {
                // The registered region is reused by later copies: wait before touching it.
                self.sync_manager(i);
            }
            self.mgrs[i].sources.push(src);
            if mode == 1 {
                let seq = self.seq;
                self.mgrs[i].events.push((ev, seq));
            }
        }
    }

    fn op_copy_to_host(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let (h, bad_h) = self.pick_buffer(mi);
        let live = self.is_live(mi, h);
        let bytes = live.map(|x| self.mgrs[mi.unwrap()].buffers[x].bytes).unwrap_or(4096);
        let (off, len, bad_r) = self.range(bytes);
        let null_dst = self.rng.below(30) == 0;
        let mode = self.rng.below(3);
        let alloc_len = if bad_r { 16 } else { len };
        let mut dst = vec![0xA5u8; alloc_len as usize].into_boxed_slice();
        let dst_ptr = if null_dst { null_mut() } else { dst.as_mut_ptr() };
        let mut ev = 0u64;
        let st = match mode {
            0 => kmm_copy_to_host(m, dst_ptr.cast(), h, off, len),
            1 => kmm_copy_to_host_async(m, dst_ptr.cast(), h, off, len, &mut ev),
            _ => kmm_copy_to_host_async(m, dst_ptr.cast(), h, off, len, null_mut()),
        };
        self.note(
            "copy_to_host",
            bad_m || bad_h || bad_r || null_dst,
            format!("copy_to_host[{mode}]({m:#x}, {h:#x}, off {off}, len {len}, null {null_dst}) = {st:?}"),
        );
        let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy on a dead manager") };
        if null_dst && len > 0 {
            return self.expect(st, KMM_ERROR_NULL_POINTER, "copy to NULL");
        }
        let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy from a dead buffer") };
        if bad_r && off.checked_add(len).is_none_or(|e| e > bytes) {
            return self.expect(st, KMM_ERROR_OUT_OF_RANGE, "copy out of range");
        }
        self.expect(st, KMM_OK, "copy_to_host");
        if mode == 1 {
            // Even an empty copy hands out an event.
            let seq = self.seq;
            self.mgrs[i].events.push((ev, seq));
        }
        if null_dst || len == 0 {
            return;
        }
        let b = &self.mgrs[i].buffers[x];
        let r = off as usize..(off + len) as usize;
        let pending = Pending { seq: self.seq, dst, expect: b.data[r.clone()].to_vec(), known: b.known[r].to_vec() };
        if mode == 0 {
            self.verify(pending, "copy_to_host");
            self.resolve(i, u64::MAX);
        } else {
            self.mgrs[i].pending.push(pending);
        }
    }

    fn verify(&mut self, p: Pending, what: &str) {
        self.tally.bytes_checked += p.dst.len() as u64;
        for (j, ((&got, &want), &known)) in p.dst.iter().zip(&p.expect).zip(&p.known).enumerate() {
            if known && got != want {
                self.fail(format!("{what} (queued at #{}): byte {j} is {got:#x}, the model says {want:#x}", p.seq));
            }
        }
    }

    /// Checks the async copies of manager `i` queued before `seq` (their work has run).
    fn resolve(&mut self, i: usize, seq: u64) {
        let pending = std::mem::take(&mut self.mgrs[i].pending);
        let (done, waiting): (Vec<Pending>, Vec<Pending>) = pending.into_iter().partition(|p| p.seq <= seq);
        self.mgrs[i].pending = waiting;
        for p in done {
            self.verify(p, "async copy_to_host");
        }
        if seq == u64::MAX {
            self.mgrs[i].sources.clear();
        }
    }

    fn sync_manager(&mut self, i: usize) {
        let st = kmm_manager_synchronize(self.mgrs[i].handle);
        self.note("manager_synchronize", false, format!("manager_synchronize({:#x}) = {st:?}", self.mgrs[i].handle));
        self.expect(st, KMM_OK, "synchronize");
        self.resolve(i, u64::MAX);
    }

    fn sync_all(&mut self) {
        for i in self.live_indices() {
            self.sync_manager(i);
        }
    }

    fn op_copy_buffer(&mut self) {
        let (dmi, dm, bad_dm) = self.pick_manager();
        let (smi, sm, bad_sm) = if self.rng.below(2) == 0 { (dmi, dm, bad_dm) } else { self.pick_manager() };
        let (d, bad_d) = self.pick_buffer(dmi);
        let (s, bad_s) = if self.rng.below(8) == 0 { (d, bad_d) } else { self.pick_buffer(smi) };
        let dlive = self.is_live(dmi, d);
        let slive = self.is_live(smi, s);
        let dbytes = dlive.map(|x| self.mgrs[dmi.unwrap()].buffers[x].bytes).unwrap_or(4096);
        let sbytes = slive.map(|x| self.mgrs[smi.unwrap()].buffers[x].bytes).unwrap_or(4096);
        let (doff, len, bad_r1) = self.range(dbytes);
        let soff = if bad_r1 { self.rng.below(sbytes + 1) } else { self.rng.below(sbytes.saturating_sub(len) + 1) };
        let st = kmm_copy_buffer(dm, d, doff, sm, s, soff, len);
        let bad_r = bad_r1 || soff.checked_add(len).is_none_or(|e| e > sbytes) || doff.checked_add(len).is_none_or(|e| e > dbytes);
        self.note(
            "copy_buffer",
            bad_dm || bad_sm || bad_d || bad_s || bad_r,
            format!("copy_buffer({dm:#x}, {d:#x}, {doff}, {sm:#x}, {s:#x}, {soff}, {len}) = {st:?}"),
        );
        let (Some(di), Some(si)) = (dmi, smi) else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy_buffer on a dead manager") };
        if di == si && d == s && len > 0 && doff < soff.saturating_add(len) && soff < doff.saturating_add(len) {
            return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "overlapping copy_buffer");
        }
        let Some(dx) = dlive else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy_buffer into a dead buffer") };
        if doff.checked_add(len).is_none_or(|e| e > dbytes) {
            return self.expect(st, KMM_ERROR_OUT_OF_RANGE, "copy_buffer past the destination");
        }
        let Some(sx) = slive else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "copy_buffer from a dead buffer") };
        if soff.checked_add(len).is_none_or(|e| e > sbytes) {
            return self.expect(st, KMM_ERROR_OUT_OF_RANGE, "copy_buffer past the source");
        }
        self.expect(st, KMM_OK, "copy_buffer");
        let (sr, dr) = (soff as usize..(soff + len) as usize, doff as usize..(doff + len) as usize);
        let src = &self.mgrs[si].buffers[sx];
        let (data, known) = (src.data[sr.clone()].to_vec(), src.known[sr].to_vec());
        let dst = &mut self.mgrs[di].buffers[dx];
        dst.data[dr.clone()].copy_from_slice(&data);
        dst.known[dr].copy_from_slice(&known);
    }

    fn op_fill(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let (h, bad_h) = self.pick_buffer(mi);
        let live = self.is_live(mi, h);
        let bytes = live.map(|x| self.mgrs[mi.unwrap()].buffers[x].bytes).unwrap_or(4096);
        let width = match self.rng.below(12) {
            0 => 0,
            1 => 4097,
            2 => 3,
            3 => 8,
            4 => 4096,
            5 | 6 => 2,
            7 | 8 => 4,
            _ => 1,
        };
        let pat = pattern(width.max(1), self.rng.next());
        let null_pat = self.rng.below(30) == 0;
        let (off, len0, bad_r) = self.range(bytes);
        let len = if width > 0 && self.rng.below(10) != 0 { len0 - len0 % width as u64 } else { len0 };
        let st = kmm_fill(m, h, off, len, if null_pat { null() } else { pat.as_ptr().cast() }, width);
        let bad_w = width == 0 || width > 4096 || len % width.max(1) as u64 != 0;
        self.note(
            "fill",
            bad_m || bad_h || bad_r || null_pat || bad_w,
            format!("fill({m:#x}, {h:#x}, off {off}, len {len}, width {width}, null {null_pat}) = {st:?}"),
        );
        if null_pat {
            return self.expect(st, KMM_ERROR_NULL_POINTER, "fill with a NULL pattern");
        }
        if width == 0 || width > 4096 {
            return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "fill with a bad pattern size");
        }
        let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "fill on a dead manager") };
        if len % width as u64 != 0 {
            return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "fill with a length not a multiple of the pattern");
        }
        let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "fill of a dead buffer") };
        if off.checked_add(len).is_none_or(|e| e > bytes) {
            return self.expect(st, KMM_ERROR_OUT_OF_RANGE, "fill out of range");
        }
        self.expect(st, KMM_OK, "fill");
        let b = &mut self.mgrs[i].buffers[x];
        for j in 0..len as usize {
            b.data[off as usize + j] = pat[j % width];
            b.known[off as usize + j] = true;
        }
    }

    fn op_map_unmap(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let (h, bad_h) = self.pick_buffer(mi);
        let live = self.is_live(mi, h);
        let unmap = self.rng.below(2) == 0;
        if unmap {
            let st = kmm_buffer_unmap(m, h);
            self.note("buffer_unmap", bad_m || bad_h, format!("buffer_unmap({m:#x}, {h:#x}) = {st:?}"));
            let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "unmap of a dead buffer") };
            let b = &mut self.mgrs[mi.unwrap()].buffers[x];
            if b.pins == 0 {
                return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "unmap of an unmapped buffer");
            }
            b.pins -= 1;
            return self.expect(st, KMM_OK, "unmap");
        }
        let null_out = self.rng.below(20) == 0;
        let mut ptr = 0u64;
        let st = kmm_buffer_map(m, h, if null_out { null_mut() } else { &mut ptr });
        self.note("buffer_map", bad_m || bad_h || null_out, format!("buffer_map({m:#x}, {h:#x}, null {null_out}) = {st:?} {ptr:#x}"));
        if null_out {
            return self.expect(st, KMM_ERROR_NULL_POINTER, "map with NULL out");
        }
        let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "map of a dead buffer") };
        self.expect(st, KMM_OK, "map");
        let b = &mut self.mgrs[mi.unwrap()].buffers[x];
        b.pins += 1;
        let (bytes, wrapped) = (b.bytes, b.wrapped);
        check!(self, (ptr == 0) == (bytes == 0) || wrapped, "map of a {bytes}-byte buffer gave {ptr:#x}");
    }

    fn op_info(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let (h, bad_h) = self.pick_buffer(mi);
        let null_out = self.rng.below(20) == 0;
        let mut info = KmmBufferInfo::default();
        let st = kmm_buffer_info(m, h, if null_out { null_mut() } else { &mut info });
        self.note("buffer_info", bad_m || bad_h || null_out, format!("buffer_info({m:#x}, {h:#x}) = {st:?}"));
        if null_out {
            return self.expect(st, KMM_ERROR_NULL_POINTER, "info with NULL out");
        }
        let Some(x) = self.is_live(mi, h) else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "info of a dead buffer") };
        self.expect(st, KMM_OK, "info");
        let b = &self.mgrs[mi.unwrap()].buffers[x];
        check!(self, (info.bytes, info.kind, info.pins) == (b.bytes, b.kind, b.pins), "buffer_info {:?} vs model ({}, {}, {})", (info.bytes, info.kind, info.pins), b.bytes, b.kind, b.pins);
    }

    fn op_events(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let evs: Vec<(u64, u64)> = mi.map(|i| self.mgrs[i].events.clone()).unwrap_or_default();
        let (e, bad_e) = if !evs.is_empty() && self.rng.below(10) < 8 {
            (evs[self.rng.below(evs.len() as u64) as usize].0, false)
        } else {
            let other: Vec<u64> = self.mgrs.iter().flat_map(|m| m.events.iter().map(|e| e.0)).collect();
            let base = other.first().copied().unwrap_or(0xE000_0000_0000_0001);
            let e = if self.rng.below(2) == 0 { other.get(self.rng.below(other.len().max(1) as u64) as usize).copied().unwrap_or(base) } else { self.forge_from(base) };
            (e, true)
        };
        let live = mi.and_then(|i| self.mgrs[i].events.iter().position(|x| x.0 == e));
        match self.rng.below(4) {
            0 => {
                let null_out = self.rng.below(20) == 0;
                let mut out = 0;
                let st = kmm_manager_record_event(m, if null_out { null_mut() } else { &mut out });
                self.note("record_event", bad_m || null_out, format!("record_event({m:#x}) = {st:?} {out:#x}"));
                if null_out {
                    return self.expect(st, KMM_ERROR_NULL_POINTER, "record with NULL out");
                }
                let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "record on a dead manager") };
                self.expect(st, KMM_OK, "record_event");
                let seq = self.seq;
                self.mgrs[i].events.push((out, seq));
            }
            1 => {
                let st = kmm_event_wait(m, e);
                self.note("event_wait", bad_m || bad_e, format!("event_wait({m:#x}, {e:#x}) = {st:?}"));
                let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "wait on a dead event") };
                self.expect(st, KMM_OK, "event_wait");
                let (i, seq) = (mi.unwrap(), self.mgrs[mi.unwrap()].events[x].1);
                self.resolve(i, seq);
            }
            2 => {
                let null_out = self.rng.below(20) == 0;
                let mut done = false;
                let st = kmm_event_query(m, e, if null_out { null_mut() } else { &mut done });
                self.note("event_query", bad_m || bad_e || null_out, format!("event_query({m:#x}, {e:#x}) = {st:?} {done}"));
                if null_out {
                    return self.expect(st, KMM_ERROR_NULL_POINTER, "query with NULL out");
                }
                let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "query of a dead event") };
                self.expect(st, KMM_OK, "event_query");
                if done {
                    let (i, seq) = (mi.unwrap(), self.mgrs[mi.unwrap()].events[x].1);
                    self.resolve(i, seq);
                }
            }
            _ => {
                let st = kmm_event_destroy(m, e);
                self.note("event_destroy", bad_m || bad_e, format!("event_destroy({m:#x}, {e:#x}) = {st:?}"));
                let Some(x) = live else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "destroy of a dead event") };
                self.expect(st, KMM_OK, "event_destroy");
                self.mgrs[mi.unwrap()].events.remove(x);
            }
        }
    }

    fn op_sync_or_trim(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let trim = self.rng.below(3) == 0;
        let keep = [0, 1 << 20, u64::MAX][self.rng.below(3) as usize];
        let st = if trim { kmm_manager_trim(m, keep) } else { kmm_manager_synchronize(m) };
        self.note(if trim { "manager_trim" } else { "manager_synchronize" }, bad_m, format!("trim {trim} keep {keep} ({m:#x}) = {st:?}"));
        let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "sync of a dead manager") };
        self.expect(st, KMM_OK, "synchronize/trim");
        self.resolve(i, u64::MAX);
    }

    /// Reads and writes buffers through mapped pointers: host memory on the host backend
    /// (device and pinned), pinned memory on CUDA. Every manager synchronizes first, as a
    /// caller must before touching memory the streams may still use.
    fn op_peek_poke(&mut self) {
        let live = self.live_indices();
        let i = live[self.rng.below(live.len() as u64) as usize];
        let candidates: Vec<usize> = (0..self.mgrs[i].buffers.len())
            .filter(|&x| {
                let b = &self.mgrs[i].buffers[x];
                b.bytes > 0 && (!self.gpu || b.kind == PINNED)
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let x = candidates[self.rng.below(candidates.len() as u64) as usize];
        self.sync_all();
        let (m, h) = (self.mgrs[i].handle, self.mgrs[i].buffers[x].handle);
        let mut ptr = 0u64;
        ok(kmm_buffer_map(m, h, &mut ptr));
        self.note("buffer_map", false, format!("peek/poke map({m:#x}, {h:#x}) = {ptr:#x}"));
        let b = &mut self.mgrs[i].buffers[x];
        // SAFETY: the buffer is mapped and every stream is idle.
        let mem = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, b.bytes as usize) };
        let mut bad = None;
        for j in 0..mem.len() {
            if b.known[j] && mem[j] != b.data[j] {
                bad = Some((j, mem[j], b.data[j]));
                break;
            }
        }
        if self.rng.below(2) == 0 {
            let len = 1 + self.rng.below(b.bytes.min(8192)) as usize;
            let off = self.rng.below(b.bytes - len as u64 + 1) as usize;
            let bytes = pattern(len, self.seq);
            mem[off..off + len].copy_from_slice(&bytes);
            b.data[off..off + len].copy_from_slice(&bytes);
            b.known[off..off + len].iter_mut().for_each(|k| *k = true);
        }
        let n = mem.len() as u64;
        ok(kmm_buffer_unmap(m, h));
        self.tally.bytes_checked += n;
        if let Some((j, got, want)) = bad {
            self.fail(format!("mapped buffer {h:#x}: byte {j} is {got:#x}, the model says {want:#x}"));
        }
    }

    fn op_streams(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        let live = self.live_indices();
        let other = live[self.rng.below(live.len() as u64) as usize];
        let forged = !self.gpu && self.rng.below(5) == 0;
        let stream = if forged { [0, 1, 42, u64::MAX][self.rng.below(4) as usize] } else { self.mgrs[other].stream };
        let signal = self.rng.below(2) == 0;
        let st = if signal { kmm_manager_signal_stream(m, stream) } else { kmm_manager_wait_stream(m, stream) };
        self.note("wait/signal_stream", bad_m || forged, format!("signal {signal} ({m:#x}, stream {stream:#x}) = {st:?}"));
        if mi.is_none() {
            return self.expect(st, KMM_ERROR_INVALID_HANDLE, "stream order on a dead manager");
        }
        if forged && mi.is_some_and(|i| self.mgrs[i].stream != stream) {
            return self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "forged stream");
        }
        self.expect(st, KMM_OK, "wait/signal stream");
    }

    fn op_misc(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        match self.rng.below(5) {
            0 => {
                let null_out = self.rng.below(10) == 0;
                let kind = if self.rng.below(10) == 0 { 9 } else { self.rng.below(2) as u32 };
                let mut s = KmmMemoryStats::default();
                let st = kmm_manager_stats(m, kind, if null_out { null_mut() } else { &mut s });
                self.note("manager_stats", bad_m || null_out || kind > 1, format!("stats({m:#x}, {kind}) = {st:?}"));
                let want = if null_out {
                    KMM_ERROR_NULL_POINTER
                } else if kind > 1 {
                    KMM_ERROR_INVALID_ARGUMENT
                } else if mi.is_none() {
                    KMM_ERROR_INVALID_HANDLE
                } else {
                    KMM_OK
                };
                self.expect(st, want, "stats");
            }
            1 => {
                let st = kmm_manager_reset_peaks(m);
                self.note("manager_reset_peaks", bad_m, format!("reset_peaks({m:#x}) = {st:?}"));
                let Some(i) = mi else { return self.expect(st, KMM_ERROR_INVALID_HANDLE, "reset_peaks on a dead manager") };
                self.expect(st, KMM_OK, "reset_peaks");
                for u in self.mgrs[i].usage.iter_mut() {
                    u.peak = u.in_use;
                }
            }
            2 => {
                let len = [0usize, 1, 7, 4096][self.rng.below(4) as usize];
                let null_buf = self.rng.below(6) == 0;
                let mut buf = vec![0x55u8; len.max(1)];
                let mut needed = 0usize;
                let st = kmm_manager_summary(m, if null_buf { null_mut() } else { buf.as_mut_ptr().cast() }, len, &mut needed);
                self.note("manager_summary", bad_m || (null_buf && len > 0), format!("summary({m:#x}, len {len}, null {null_buf}) = {st:?}"));
                if null_buf && len > 0 {
                    return self.expect(st, KMM_ERROR_NULL_POINTER, "summary into NULL");
                }
                if mi.is_none() {
                    return self.expect(st, KMM_ERROR_INVALID_HANDLE, "summary of a dead manager");
                }
                self.expect(st, KMM_OK, "summary");
                check!(self, needed > 1, "summary needs {needed} bytes");
                if len > 0 {
                    let nul = buf.iter().position(|&c| c == 0);
                    check!(self, nul == Some((needed - 1).min(len - 1)), "summary NUL at {nul:?}, needed {needed}, len {len}");
                }
            }
            3 => {
                let null_out = self.rng.below(8) == 0;
                let (mut f, mut t) = (0u64, 0u64);
                let st = kmm_manager_memory_info(m, if null_out { null_mut() } else { &mut f }, &mut t);
                self.note("manager_memory_info", bad_m || null_out, format!("memory_info({m:#x}) = {st:?}"));
                let want = if null_out {
                    KMM_ERROR_NULL_POINTER
                } else if mi.is_none() {
                    KMM_ERROR_INVALID_HANDLE
                } else {
                    KMM_OK
                };
                self.expect(st, want, "memory_info");
            }
            _ => {
                let null_out = self.rng.below(8) == 0;
                let mut info = KmmManagerInfo::default();
                let st = kmm_manager_info(m, if null_out { null_mut() } else { &mut info });
                self.note("manager_info", bad_m || null_out, format!("manager_info({m:#x}) = {st:?}"));
                let want = if null_out {
                    KMM_ERROR_NULL_POINTER
                } else if mi.is_none() {
                    KMM_ERROR_INVALID_HANDLE
                } else {
                    KMM_OK
                };
                self.expect(st, want, "manager_info");
                if let (KMM_OK, Some(i)) = (st, mi) {
                    check!(self, info.stream == self.mgrs[i].stream && info.alloc_mode == self.mgrs[i].cfg.alloc_mode, "manager_info disagrees");
                }
            }
        }
    }

    /// Destroys a manager that still holds buffers, mapped buffers, events and queued copies,
    /// checks its handles are dead, and creates a new one in its place.
    fn op_destroy_and_replace(&mut self) {
        let live = self.live_indices();
        let i = live[self.rng.below(live.len() as u64) as usize];
        let deferred = self.rng.below(3) == 0;
        let bad_flags = self.rng.below(10) == 0;
        let m = self.mgrs[i].handle;
        if bad_flags {
            let st = kmm_manager_destroy(m, 6);
            self.note("manager_destroy", true, format!("manager_destroy({m:#x}, 6) = {st:?}"));
            self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "destroy with unknown flags");
        }
        let st = kmm_manager_destroy(m, if deferred { KMM_DESTROY_DEFERRED } else { 0 });
        self.note("manager_destroy", false, format!("manager_destroy({m:#x}, deferred {deferred}) = {st:?}"));
        self.expect(st, KMM_OK, "destroy");
        if deferred {
            // The teardown runs later: keep host memory its queued copies use.
            let mgr = &mut self.mgrs[i];
            let lent: Vec<Box<[u8]>> = mgr.pending.drain(..).map(|p| p.dst).chain(mgr.sources.drain(..)).collect();
            self.keep_alive.extend(lent);
        } else {
            self.resolve(i, u64::MAX);
        }
        self.mgrs[i].alive = false;
        let st = kmm_manager_destroy(m, 0);
        self.note("manager_destroy", true, format!("second manager_destroy({m:#x}) = {st:?}"));
        self.expect(st, KMM_ERROR_INVALID_HANDLE, "second destroy");
        if let Some(b) = self.mgrs[i].buffers.first().map(|b| b.handle) {
            let st = kmm_buffer_free(m, b, 0);
            self.note("buffer_free", true, format!("free after destroy({m:#x}, {b:#x}) = {st:?}"));
            self.expect(st, KMM_ERROR_INVALID_HANDLE, "free after destroy");
        }
        self.create_manager();
        // Keep the list short: forget the oldest dead managers.
        while self.mgrs.len() > 8 {
            let Some(dead) = self.mgrs.iter().position(|m| !m.alive) else { break };
            let gone = self.mgrs.remove(dead);
            self.keep_alive.extend(gone.pending.into_iter().map(|p| p.dst).chain(gone.sources));
        }
    }

    fn op_bad_create(&mut self) {
        let mut c = default_config();
        let (want, what) = match self.rng.below(9) {
            0 => {
                c.alignment = 3;
                (KMM_ERROR_INVALID_ARGUMENT, "alignment 3")
            }
            1 => {
                c.chunk_size = 0;
                (KMM_ERROR_INVALID_ARGUMENT, "chunk 0")
            }
            2 => {
                c.staging_chunks = 1;
                (KMM_ERROR_INVALID_ARGUMENT, "1 staging chunk")
            }
            3 => {
                c.compaction_ratio_pct = 50;
                (KMM_ERROR_INVALID_ARGUMENT, "compaction ratio 50%")
            }
            4 => {
                c.backend = 7;
                (KMM_ERROR_INVALID_ARGUMENT, "backend 7")
            }
            5 => {
                c.device = 99;
                (KMM_ERROR_BACKEND_UNAVAILABLE, "device 99")
            }
            6 => {
                c.suballocator = KmmSuballocator::KMM_SUBALLOC_FIXED as u32;
                c.fixed_block_size = c.chunk_size + 1;
                (KMM_ERROR_INVALID_ARGUMENT, "fixed block > chunk")
            }
            7 => {
                c.initial_pool_size = KMM_MAX_BUFFER_BYTES + 1;
                (KMM_ERROR_INVALID_ARGUMENT, "initial pool > 2^48")
            }
            _ => {
                let st = kmm_manager_create(&c, null_mut());
                self.note("manager_create", true, format!("manager_create(NULL out) = {st:?}"));
                return self.expect(st, KMM_ERROR_NULL_POINTER, "create with NULL out");
            }
        };
        let mut out = 0;
        let st = kmm_manager_create(&c, &mut out);
        self.note("manager_create", true, format!("manager_create({what}) = {st:?}"));
        self.expect(st, want, what);
        check!(self, out == 0, "a failed create wrote {out:#x}");
    }

    /// Wraps host memory the model owns (borrow) or malloc'd memory Kmm frees (adopt). Host
    /// backend only: on CUDA the memory would have to come from the driver.
    fn op_wrap(&mut self) {
        if self.gpu {
            return self.op_alloc();
        }
        let (mi, m, bad_m) = self.pick_manager();
        let bytes = self.size().min(64 << 10);
        let adopt = self.rng.below(2) == 0;
        let kind = if self.rng.below(3) == 0 { PINNED } else { DEVICE };
        let ownership = if self.rng.below(20) == 0 { 5 } else { adopt as u32 };
        let null_ptr = self.rng.below(20) == 0 && bytes > 0;
        let mut mem: Option<Box<[u8]>> = None;
        let ptr: *mut u8 = if null_ptr {
            null_mut()
        } else if ownership == 1 {
            // SAFETY: malloc of a non-zero size; Kmm frees it with free().
            unsafe { libc::malloc(bytes.max(1) as usize) as *mut u8 }
        } else {
            let mut b = vec![0u8; bytes.max(1) as usize].into_boxed_slice();
            let p = b.as_mut_ptr();
            mem = Some(b);
            p
        };
        let mut out = 0;
        let st = kmm_buffer_wrap(m, ptr.cast(), bytes, kind, ownership, &mut out);
        self.note("buffer_wrap", bad_m || null_ptr || ownership > 1, format!("buffer_wrap({m:#x}, {bytes}, kind {kind}, own {ownership}, null {null_ptr}) = {st:?}"));
        if let Some(b) = mem {
            self.keep_alive.push(b);
        }
        let want = if ownership > 1 {
            KMM_ERROR_INVALID_ARGUMENT
        } else if mi.is_none() {
            KMM_ERROR_INVALID_HANDLE
        } else if null_ptr {
            KMM_ERROR_NULL_POINTER
        } else {
            KMM_OK
        };
        if st != KMM_OK && ownership == 1 && !ptr.is_null() {
            // SAFETY: Kmm did not take it.
            unsafe { libc::free(ptr.cast()) };
        }
        self.expect(st, want, "buffer_wrap");
        if st != KMM_OK {
            return;
        }
        let i = mi.unwrap();
        let u = &mut self.mgrs[i].usage[kind as usize];
        u.on_alloc(bytes);
        if ownership == 0 {
            u.borrowed += bytes;
        }
        self.mgrs[i].buffers.push(Buf {
            handle: out,
            kind,
            bytes,
            data: vec![0; bytes as usize],
            known: vec![ownership == 0; bytes as usize],
            pins: 0,
            borrowed: ownership == 0,
            wrapped: true,
        });
    }

    /// Registers a region of pageable memory (later copies through it go direct), or
    /// unregisters it; double registration and unknown pointers are errors on the host backend.
    /// Only the manager that registered a region may unregister it, and its destruction does.
    fn op_register(&mut self) {
        let (mi, m, bad_m) = self.pick_manager();
        if let Some((_, owner)) = self.registered {
            if !self.mgrs.iter().any(|x| x.alive && x.handle == owner) {
                // The owner's destroy ended the registration.
                let (r, _) = self.registered.take().unwrap();
                self.keep_alive.push(r);
                return;
            }
        }
        match &self.registered {
            None => {
                let mut region = vec![0u8; 512 << 10].into_boxed_slice();
                let null_ptr = self.rng.below(10) == 0;
                let zero = !null_ptr && self.rng.below(10) == 0;
                let ptr = if null_ptr { null_mut() } else { region.as_mut_ptr() };
                let st = kmm_host_register(m, ptr.cast(), if zero { 0 } else { region.len() as u64 });
                self.note("host_register", bad_m || null_ptr || zero, format!("host_register({m:#x}, null {null_ptr}, zero {zero}) = {st:?}"));
                let want = if mi.is_none() {
                    KMM_ERROR_INVALID_HANDLE
                } else if null_ptr {
                    KMM_ERROR_NULL_POINTER
                } else if zero {
                    KMM_ERROR_INVALID_ARGUMENT
                } else {
                    KMM_OK
                };
                self.expect(st, want, "host_register");
                if st == KMM_OK {
                    if !self.gpu {
                        let st = kmm_host_register(m, ptr.cast(), 64);
                        self.note("host_register", true, format!("second host_register = {st:?}"));
                        self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "double registration");
                    }
                    self.registered = Some((region, m));
                }
            }
            Some((r, owner)) => {
                let (ptr, owner) = (r.as_ptr() as *mut u8, *owner);
                if mi.is_none() {
                    let st = kmm_host_unregister(m, ptr.cast());
                    self.note("host_unregister", true, format!("host_unregister on a dead manager = {st:?}"));
                    return self.expect(st, KMM_ERROR_INVALID_HANDLE, "unregister on a dead manager");
                }
                self.sync_all();
                if !self.gpu {
                    let mut other = [0u8; 8];
                    let st = kmm_host_unregister(m, other.as_mut_ptr().cast());
                    self.note("host_unregister", true, format!("host_unregister(unknown) = {st:?}"));
                    self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "unregister of unknown memory");
                }
                let st = kmm_host_unregister(m, null_mut());
                self.note("host_unregister", true, format!("host_unregister(NULL) = {st:?}"));
                self.expect(st, KMM_ERROR_NULL_POINTER, "unregister NULL");
                if m != owner {
                    let st = kmm_host_unregister(m, ptr.cast());
                    self.note("host_unregister", true, format!("host_unregister by another manager = {st:?}"));
                    self.expect(st, KMM_ERROR_INVALID_ARGUMENT, "unregister through a manager that did not register");
                }
                let st = kmm_host_unregister(owner, ptr.cast());
                self.note("host_unregister", false, format!("host_unregister = {st:?}"));
                self.expect(st, KMM_OK, "unregister");
                let (r, _) = self.registered.take().unwrap();
                self.keep_alive.push(r);
            }
        }
    }

    /// Work queued on one manager's stream, then at once a copy from that buffer on another
    /// manager's stream: the copy must wait for the first stream (a missing wait reads stale
    /// bytes), and the source's later writes must wait for the copy.
    fn op_cross_manager_race(&mut self) {
        let live = self.live_indices();
        let (i, j) = (live[self.rng.below(live.len() as u64) as usize], live[self.rng.below(live.len() as u64) as usize]);
        if i == j || self.mgrs[i].limited() || self.mgrs[j].limited() {
            return;
        }
        let len = 48 << 10;
        let mut h = [0u64; 2];
        for (k, &mi) in [i, j].iter().enumerate() {
            let st = kmm_buffer_alloc(self.mgrs[mi].handle, len, DEVICE, &mut h[k]);
            self.note("buffer_alloc", false, format!("race alloc({:#x}, {len}) = {st:?} {:#x}", self.mgrs[mi].handle, h[k]));
            self.expect(st, KMM_OK, "race alloc");
            let m = &mut self.mgrs[mi];
            m.usage[0].on_alloc(len);
            m.buffers.push(Buf { handle: h[k], kind: DEVICE, bytes: len, data: vec![0; len as usize], known: vec![false; len as usize], pins: 0, borrowed: false, wrapped: false });
        }
        // A slow chain on i: a 3-byte fill is a host seed plus doubling copies.
        let pat = pattern(3, self.rng.next());
        let n = len / 3 * 3;
        let st = kmm_fill(self.mgrs[i].handle, h[0], 0, n, pat.as_ptr().cast(), 3);
        self.note("fill", false, format!("race fill({:#x}, {:#x}, {n}) = {st:?}", self.mgrs[i].handle, h[0]));
        self.expect(st, KMM_OK, "race fill");
        let st = kmm_copy_buffer(self.mgrs[j].handle, h[1], 0, self.mgrs[i].handle, h[0], 0, n);
        self.note("copy_buffer", false, format!("race copy_buffer({:#x} <- {:#x}, {n}) = {st:?}", h[1], h[0]));
        self.expect(st, KMM_OK, "race copy_buffer");
        // The source is overwritten at once: the copy must already have read it.
        let junk = vec![0xEEu8; n as usize];
        let st = kmm_copy_to_device_async(self.mgrs[i].handle, h[0], 0, junk.as_ptr().cast(), n, null_mut());
        self.note("copy_to_device", false, format!("race overwrite({:#x}) = {st:?}", h[0]));
        self.expect(st, KMM_OK, "race overwrite");
        self.mgrs[i].sources.push(junk.into_boxed_slice());
        let filled: Vec<u8> = (0..n as usize).map(|k| pat[k % 3]).collect();
        let xi = self.mgrs[i].find(h[0]).unwrap();
        self.mgrs[i].buffers[xi].data[..n as usize].fill(0xEE);
        self.mgrs[i].buffers[xi].known[..n as usize].iter_mut().for_each(|k| *k = true);
        let xj = self.mgrs[j].find(h[1]).unwrap();
        self.mgrs[j].buffers[xj].data[..n as usize].copy_from_slice(&filled);
        self.mgrs[j].buffers[xj].known[..n as usize].iter_mut().for_each(|k| *k = true);
        let mut out = vec![0u8; n as usize];
        let st = kmm_copy_to_host(self.mgrs[j].handle, out.as_mut_ptr().cast(), h[1], 0, n);
        self.note("copy_to_host", false, format!("race read({:#x}) = {st:?}", h[1]));
        self.expect(st, KMM_OK, "race read");
        self.verify(Pending { seq: self.seq, dst: out.into_boxed_slice(), expect: filled, known: vec![true; n as usize] }, "copy_buffer across managers");
        self.resolve(j, u64::MAX);
    }

    /// A valid allocation followed at once by a full write: keeps most buffers fully known.
    fn op_alloc_then_write(&mut self) {
        let live = self.live_indices();
        let i = live[self.rng.below(live.len() as u64) as usize];
        let kind = if self.rng.below(4) == 0 { PINNED } else { DEVICE };
        let bytes = self.size();
        if self.alloc_written(i, kind, bytes).is_some() && self.mgrs[i].buffers.len() > 48 {
            self.free_one(i, 0);
        }
    }

    /// Fragments a device pool on purpose: pieces of an eighth of a chunk, every other one freed
    /// again, then a request larger than any hole they leave. A compacting pool serves it by
    /// moving buffers, whose bytes are checked like every other buffer's.
    fn op_fragment(&mut self) {
        let live = self.live_indices();
        let i = live[self.rng.below(live.len() as u64) as usize];
        let piece = (self.mgrs[i].cfg.chunk_size / 8).max(4096) - self.rng.below(2048);
        let mut placed = Vec::new();
        for _ in 0..8 {
            if let Some(h) = self.alloc_written(i, DEVICE, piece) {
                placed.push(h);
            }
        }
        for h in placed.into_iter().step_by(2) {
            if let Some(x) = self.mgrs[i].find(h) {
                self.free_one(i, x);
            }
        }
        self.alloc_written(i, DEVICE, piece * 5 / 2);
        while self.mgrs[i].buffers.len() > 48 {
            self.free_one(i, 0);
        }
    }

    /// Allocates `bytes` (capped to what a fixed-size pool serves) and writes all of them;
    /// returns the handle, or None when a limited manager is out of memory.
    fn alloc_written(&mut self, i: usize, kind: u32, mut bytes: u64) -> Option<u64> {
        let cfg = self.mgrs[i].cfg;
        if cfg.suballocator == KmmSuballocator::KMM_SUBALLOC_FIXED as u32 && cfg.alloc_mode == 0 {
            bytes = bytes.min(cfg.fixed_block_size - cfg.alignment);
        }
        let mut h = 0;
        let st = kmm_buffer_alloc(self.mgrs[i].handle, bytes, kind, &mut h);
        self.note("buffer_alloc", false, format!("buffer_alloc({:#x}, {bytes}, {kind}) = {st:?} {h:#x}", self.mgrs[i].handle));
        if st == KMM_ERROR_OUT_OF_MEMORY && self.mgrs[i].limited() {
            self.mgrs[i].usage[kind as usize].failed += 1;
            return None;
        }
        self.expect(st, KMM_OK, "buffer_alloc");
        let data = pattern(bytes as usize, self.seq);
        let st = kmm_copy_to_device(self.mgrs[i].handle, h, 0, data.as_ptr().cast(), bytes);
        self.note("copy_to_device", false, format!("copy_to_device({h:#x}, {bytes}) = {st:?}"));
        self.expect(st, KMM_OK, "copy_to_device");
        self.resolve(i, u64::MAX);
        let mgr = &mut self.mgrs[i];
        mgr.usage[kind as usize].on_alloc(bytes);
        mgr.buffers.push(Buf { handle: h, kind, bytes, data, known: vec![true; bytes as usize], pins: 0, borrowed: false, wrapped: false });
        Some(h)
    }

    fn check_stats(&mut self) {
        for i in self.live_indices() {
            for kind in [DEVICE, PINNED] {
                let mut s = KmmMemoryStats::default();
                ok(kmm_manager_stats(self.mgrs[i].handle, kind, &mut s));
                let u = self.mgrs[i].usage[kind as usize];
                let got = (s.in_use, s.peak_in_use, s.allocs, s.frees, s.failed_allocs, s.live_buffers);
                let want = (u.in_use, u.peak, u.allocs, u.frees, u.failed, u.live);
                check!(self, got == want, "manager {:#x} kind {kind}: stats (in_use, peak, allocs, frees, failed, live) = {got:?}, model {want:?}", self.mgrs[i].handle);
                check!(self, s.reserved >= u.in_use - u.borrowed, "manager {:#x} kind {kind}: reserved {} < owned bytes in use {}", self.mgrs[i].handle, s.reserved, u.in_use - u.borrowed);
                if kind == DEVICE {
                    self.tally.compactions += s.compactions - self.mgrs[i].compactions_seen;
                    self.mgrs[i].compactions_seen = s.compactions;
                }
            }
        }
    }

    /// Every live buffer's bytes are read back and compared; then everything is destroyed and
    /// the backend's books must show no live allocation.
    fn finish(&mut self) {
        self.sync_all();
        for i in self.live_indices() {
            let m = self.mgrs[i].handle;
            for x in 0..self.mgrs[i].buffers.len() {
                let b = &self.mgrs[i].buffers[x];
                let mut out = vec![0u8; b.bytes as usize];
                let st = kmm_copy_to_host(m, out.as_mut_ptr().cast(), b.handle, 0, b.bytes);
                let p = Pending { seq: self.seq, dst: out.into_boxed_slice(), expect: b.data.clone(), known: b.known.clone() };
                self.note("copy_to_host", false, format!("final read-back of {:#x} = {st:?}", p.dst.len()));
                self.expect(st, KMM_OK, "final read-back");
                self.verify(p, "final read-back");
            }
            // Buffers still mapped are freed by the destroy.
            let st = kmm_manager_destroy(m, 0);
            self.note("manager_destroy", false, format!("final manager_destroy({m:#x}) = {st:?}"));
            self.expect(st, KMM_OK, "final destroy");
            self.mgrs[i].alive = false;
        }
        // A deferred destroy's teardown (which ends its registrations) may still run: wait for
        // every teardown before the registration is tried again (under load it lost the race).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut managers = u32::MAX;
        while managers != 0 && std::time::Instant::now() < deadline {
            ok(kmm_live_managers(&mut managers));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if let Some((r, _)) = self.registered.take() {
            // Its owner's destroy ended the registration: another manager may register it anew.
            let mut m = 0;
            ok(kmm_manager_create(&default_config(), &mut m));
            expect_err(kmm_host_unregister(m, r.as_ptr() as *mut _), KMM_ERROR_INVALID_ARGUMENT, &["not registered through this manager"]);
            ok(kmm_host_register(m, r.as_ptr() as *mut _, r.len() as u64));
            ok(kmm_host_unregister(m, r.as_ptr() as *mut _));
            ok(kmm_manager_destroy(m, 0));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (n, bytes) = self.plan.live();
            if n == 0 {
                break;
            }
            if std::time::Instant::now() > deadline {
                self.fail(format!("leak: {n} allocations ({bytes} bytes) made through the backend are still live after every manager was destroyed"));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Usage {
    fn on_alloc(&mut self, bytes: u64) {
        self.in_use += bytes;
        self.peak = self.peak.max(self.in_use);
        self.allocs += 1;
        self.live += 1;
    }
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}
