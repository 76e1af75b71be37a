//! Model-based test of the allocator-plugin exports of the C ABI, written from the header's
//! contract (gen/kmm.h) alone: `kmm_plugin_alloc`/`kmm_plugin_free`,
//! `kmm_plugin_malloc`/`kmm_plugin_free_address`, PyTorch's `kmm_torch_*` and CuPy's
//! `kmm_cupy_*`, mixed with manager creation and destruction (also with plugin allocations
//! still out), `kmm_buffer_record_stream`, trims, stats and summaries.
//!
//! On the host backend device memory is host memory, so every address these calls hand out is
//! written with a byte pattern at allocation and read back by the test: no live allocation may
//! overlap another (of any manager, kind or library), and no call may change a live
//! allocation's bytes.
//!
//! `random_walks_match_the_model`: seeded single-threaded walks, valid and invalid arguments
//! mixed (zero and absurd sizes, double frees, foreign, interior and unknown addresses, frees
//! through the wrong manager, stale and forged handles, NULL outs, negative devices, unknown
//! kinds, dead streams). After every step the call's status equals the model's (a set of
//! acceptable errors where the header names several), `kmm_torch_live_allocations` and
//! `kmm_cupy_live_allocations` equal the model's counts, and the touched managers' stats
//! (`in_use`, `live_buffers` of both kinds) equal the sums of the model's live allocations.
//!
//! `threads_share_managers`: four seeded walks on threads of their own over shared managers
//! while a fifth thread destroys and recreates a manager they also use (and CuPy's manager of
//! one device). Checks: no crash, no deadlock (watchdog), no address handed to two live
//! allocations, every allocation's bytes intact, nothing leaked once all is freed.
//!
//! KMM_PLUGIN_SEED=N replays one walk (the failure message prints the seed and the last calls);
//! KMM_PLUGIN_CASES (walks, default 24), KMM_PLUGIN_STEPS (steps per walk, default 2000);
//! KMM_PLUGIN_MT_SEED (default 1) and KMM_PLUGIN_MT_STEPS (steps per thread, default 20000) for
//! the threads. The defects it found are reproduced one by one in abi_plugin_by_address.rs.
//! Host backend only: skipped under KMM_TEST_GPU=1 (device addresses cannot be read there).
mod common;
use common::*;
use kmm::ffi::cupy::*;
use kmm::ffi::plugin::*;
use kmm::ffi::torch::*;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// `KMM_MAX_BUFFER_BYTES`: the largest request; larger is `KMM_ERROR_SIZE_OVERFLOW`.
const MAX_BYTES: u64 = 1 << 48;
/// Calls kept for the failure message.
const HISTORY: usize = 40;

// ---------------------------------------------------------------------------------------------
// Shared set-up
// ---------------------------------------------------------------------------------------------

/// PyTorch's and CuPy's tables, CuPy's stream source and the OOM policy are process-wide: the
/// tests of this file take turns.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    // Two host stand-in devices, so that PyTorch and CuPy have a manager per device. Read once
    // by the library, at its first look: every test of this file sets it before any call.
    if std::env::var_os("KMM_HOST_DEVICES").is_none() {
        std::env::set_var("KMM_HOST_DEVICES", "2");
    }
    // The default policy aborts the process on any failed `kmm_torch_malloc`.
    ok(kmm_torch_set_oom_policy(KMM_TORCH_OOM_NULL));
    ok(kmm_cupy_set_stream_source(None, None));
    guard
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn host_devices() -> i32 {
    let mut n = 0;
    ok(kmm_device_count(KmmBackend::KMM_BACKEND_HOST as u32, &mut n));
    n as i32
}

fn live_managers() -> u32 {
    let mut n = 0;
    ok(kmm_live_managers(&mut n));
    n
}

/// Waits (5 s at most) for deferred teardowns until `want` managers are alive.
fn await_live_managers(want: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = live_managers();
        if n == want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn torch_live() -> u64 {
    let mut n = 0;
    ok(kmm_torch_live_allocations(&mut n));
    n
}

fn cupy_live() -> u64 {
    let mut n = 0;
    ok(kmm_cupy_live_allocations(&mut n));
    n
}

fn stats_of(m: KmmManager, kind: u32) -> KmmMemoryStats {
    let mut s = KmmMemoryStats::default();
    ok(kmm_manager_stats(m, kind, &mut s));
    s
}

fn stream_of(m: KmmManager) -> u64 {
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(m, &mut info));
    info.stream
}

fn create_manager(device: i32, f: impl FnOnce(&mut KmmConfig)) -> KmmManager {
    let mut c = default_config();
    c.device = device;
    f(&mut c);
    let mut m = 0;
    ok(kmm_manager_create(&c, &mut m));
    m
}

fn torch_manager(device: i32) -> KmmManager {
    let mut m = 0;
    ok(kmm_torch_manager(device, &mut m));
    m
}

/// A stream no backend knows.
fn bogus_stream(r: &mut Rng) -> u64 {
    0x7f00_0000_0000_0000 | (r.next() & 0xffff_fff0)
}

// CuPy's stream source: returns what `CUPY_STREAM` holds (-1 makes it fail), and counts the
// calls of its error hook.
static CUPY_STREAM: AtomicIsize = AtomicIsize::new(0);
static CUPY_HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);
unsafe extern "C" fn cupy_stream_source() -> isize {
    CUPY_STREAM.load(SeqCst)
}
unsafe extern "C" fn cupy_error_hook() {
    CUPY_HOOK_CALLS.fetch_add(1, SeqCst);
}


/// xorshift64*: small, seedable, good enough for walks.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03 | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `pct` percent.
    fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// A request size: mostly small, some above a chunk, a few absurd.
fn request_size(r: &mut Rng) -> u64 {
    match r.below(100) {
        0..=4 => 0,
        5..=29 => r.range(1, 256),
        30..=69 => r.range(257, 64 * KIB),
        70..=89 => r.range(64 * KIB + 1, 2 * MIB),
        90..=94 => r.range(2 * MIB + 1, 12 * MIB),
        95 => 1 << 47,
        96 => MAX_BYTES,
        97 => MAX_BYTES + 1,
        98 => u64::MAX,
        _ => u64::MAX / 2 + 3,
    }
}

/// The statuses an allocation of `bytes` may fail with for its size alone, or none when the
/// size is fine. The machine has far less than 2^47 bytes.
fn size_errors(bytes: u64) -> Option<KmmStatus> {
    if bytes > MAX_BYTES {
        Some(KMM_ERROR_SIZE_OVERFLOW)
    } else if bytes >= 1 << 47 {
        Some(KMM_ERROR_OUT_OF_MEMORY)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Byte patterns
// ---------------------------------------------------------------------------------------------

fn word(seed: u64, i: u64) -> u64 {
    let x = (seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 31)
}

fn pattern_byte(seed: u64, offset: u64) -> u8 {
    (word(seed, offset / 8) >> ((offset % 8) * 8)) as u8
}

/// Writes the pattern of `seed` over `bytes` at `addr`.
fn write_pattern(addr: u64, bytes: u64, seed: u64) {
    let p = addr as *mut u8;
    let words = bytes / 8;
    for i in 0..words {
        // SAFETY: the caller owns `bytes` of host-accessible memory at `addr`.
        unsafe { (p.add(i as usize * 8) as *mut u64).write_unaligned(word(seed, i)) };
    }
    for o in words * 8..bytes {
        unsafe { p.add(o as usize).write(pattern_byte(seed, o)) };
    }
}

/// The first offset in [from, to) of the allocation at `addr` whose byte is not the pattern's.
fn first_bad_byte(addr: u64, from: u64, to: u64, seed: u64) -> Option<u64> {
    let p = addr as *const u8;
    let mut o = from;
    while o < to {
        if o % 8 == 0 && o + 8 <= to {
            // SAFETY: within a live allocation the caller owns.
            let w = unsafe { (p.add(o as usize) as *const u64).read_unaligned() };
            if w != word(seed, o / 8) {
                return (o..o + 8).find(|&b| unsafe { p.add(b as usize).read() } != pattern_byte(seed, b));
            }
            o += 8;
        } else {
            if unsafe { p.add(o as usize).read() } != pattern_byte(seed, o) {
                return Some(o);
            }
            o += 1;
        }
    }
    None
}

/// Checks the pattern: all of it up to 256 KiB, else the head, the tail and a stretch in the middle.
fn pattern_damage(addr: u64, bytes: u64, seed: u64) -> Option<u64> {
    const WINDOW: u64 = 16 * KIB;
    if bytes <= 256 * KIB {
        return first_bad_byte(addr, 0, bytes, seed);
    }
    let mid = (bytes / 2) & !7;
    first_bad_byte(addr, 0, WINDOW, seed)
        .or_else(|| first_bad_byte(addr, mid, mid + WINDOW, seed))
        .or_else(|| first_bad_byte(addr, bytes - WINDOW, bytes, seed))
}

// ---------------------------------------------------------------------------------------------
// The model of the single-threaded walk
// ---------------------------------------------------------------------------------------------

/// Which export made an allocation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Api {
    /// `kmm_plugin_alloc` (freed by handle).
    Plugin,
    /// `kmm_plugin_malloc` (freed by address and manager).
    Malloc,
    /// `kmm_torch_malloc` (freed by address).
    Torch,
    /// `kmm_cupy_malloc` (freed by address).
    Cupy,
}

#[derive(Clone, Debug)]
struct Alloc {
    api: Api,
    manager: KmmManager,
    /// The buffer handle (`Api::Plugin` only).
    buffer: KmmBuffer,
    addr: u64,
    bytes: u64,
    kind: u32,
    seed: u64,
}

/// An allocation that is gone: freed, or its manager destroyed. Kept to try stale frees.
#[derive(Clone, Debug)]
struct Ghost {
    a: Alloc,
    /// Its manager was destroyed while it was live, and the library has not freed it since (a
    /// "late free" is still to come).
    late_free_pending: bool,
}

struct MgrModel {
    handle: KmmManager,
    device: i32,
    stream: u64,
    /// PyTorch's default manager of `device` (Kmm owns it: never destroyed).
    torch: bool,
    alive: bool,
    /// (live_buffers, in_use) per kind at the start of the walk, for the torch managers that
    /// outlive walks.
    base: [(u64, u64); 2],
}

/// What a call may return: OK when no reason to fail applies, else one of the errors listed.
/// Some reasons are the header's to leave open (the call may also succeed): `maybe` lists
/// their errors without making a failure required.
#[derive(Default)]
struct Expect {
    errors: Vec<KmmStatus>,
    /// How many of the reasons require a failure.
    required: usize,
}

impl Expect {
    fn one(s: KmmStatus) -> Expect {
        let mut e = Expect::default();
        e.err(s);
        e
    }
    fn err(&mut self, s: KmmStatus) {
        self.maybe(s);
        self.required += 1;
    }
    fn maybe(&mut self, s: KmmStatus) {
        if !self.errors.contains(&s) {
            self.errors.push(s);
        }
    }
    /// A stream argument: one that never existed must be refused ("it must still be alive"); the
    /// stream of a destroyed manager may be refused or waited for (its work has run).
    fn stream(&mut self, pick: StreamPick) {
        match pick {
            StreamPick::Bogus => self.err(KMM_ERROR_INVALID_ARGUMENT),
            StreamPick::Dead => self.maybe(KMM_ERROR_INVALID_ARGUMENT),
            _ => {}
        }
    }
    fn admits(&self, s: KmmStatus) -> bool {
        if s == KMM_OK {
            self.required == 0
        } else {
            self.errors.contains(&s)
        }
    }
}

impl std::fmt::Debug for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match (self.errors.is_empty(), self.required) {
            (true, _) => write!(f, "KMM_OK"),
            (false, 0) => write!(f, "KMM_OK or one of {:?}", self.errors),
            (false, _) => write!(f, "one of {:?}", self.errors),
        }
    }
}

/// Which stream a call names.
#[derive(Clone, Copy, Debug, PartialEq)]
enum StreamPick {
    /// 0: the manager's own stream on the host backend.
    Zero,
    /// The manager's stream, by its raw value.
    Own,
    /// A live stream of another manager of the same device (a "foreign" stream).
    Foreign,
    /// A stream that never existed.
    Bogus,
    /// The stream of a destroyed manager.
    Dead,
}

struct Walk {
    seed: u64,
    r: Rng,
    step: usize,
    history: VecDeque<String>,
    managers: Vec<MgrModel>,
    live: Vec<Alloc>,
    ghosts: Vec<Ghost>,
    /// addr -> (end, index-free id) of every live allocation with memory.
    ranges: BTreeMap<u64, (u64, u64)>,
    /// CuPy's manager per device, as set (maybe destroyed since).
    cupy: HashMap<i32, KmmManager>,
    /// What CuPy's stream source returns now: None when no source is set.
    cupy_source: Option<isize>,
    /// One long-lived manager per device whose stream serves as the "foreign" stream.
    stream_hosts: Vec<KmmManager>,
    /// Their streams, by device.
    foreign_streams: Vec<u64>,
    /// Streams of destroyed managers.
    dead_streams: Vec<u64>,
    torch_base: u64,
    cupy_base: u64,
    devices: i32,
    next_seed: u64,
    /// The status `kmm_last_status` must report: the last failure's.
    last_status: KmmStatus,
    calls: u64,
    bad_calls: u64,
}

macro_rules! check {
    ($w:expr, $cond:expr, $($fmt:tt)*) => {
        if !$cond {
            $w.fail(format!($($fmt)*));
        }
    };
}

impl Walk {
    fn new(seed: u64) -> Walk {
        let devices = host_devices().min(2);
        let stream_hosts: Vec<KmmManager> = (0..devices).map(|d| create_manager(d, |_| {})).collect();
        let mut managers = Vec::new();
        for d in 0..devices {
            let h = torch_manager(d);
            let base = [DEVICE, PINNED].map(|k| {
                let s = stats_of(h, k);
                (s.live_buffers, s.in_use)
            });
            managers.push(MgrModel { handle: h, device: d, stream: stream_of(h), torch: true, alive: true, base });
        }
        // CuPy starts with no managers.
        for d in 0..=devices {
            ok(kmm_cupy_set_manager(d, 0));
        }
        Walk {
            seed,
            r: Rng::new(seed),
            step: 0,
            history: VecDeque::new(),
            managers,
            live: Vec::new(),
            ghosts: Vec::new(),
            ranges: BTreeMap::new(),
            cupy: HashMap::new(),
            cupy_source: None,
            foreign_streams: stream_hosts.iter().map(|&h| stream_of(h)).collect(),
            stream_hosts,
            dead_streams: Vec::new(),
            torch_base: torch_live(),
            cupy_base: cupy_live(),
            devices,
            next_seed: seed << 32,
            last_status: kmm_last_status(),
            calls: 0,
            bad_calls: 0,
        }
    }

    fn note(&mut self, call: String) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(format!("#{} {call}", self.step));
        self.calls += 1;
    }

    fn fail(&self, msg: String) -> ! {
        let history: Vec<&str> = self.history.iter().map(String::as_str).collect();
        panic!(
            "plugin_model seed {} step {}: {msg}\nlast error: {}\nlast {} calls:\n  {}",
            self.seed,
            self.step,
            last_error(),
            history.len(),
            history.join("\n  ")
        );
    }

    /// Checks a status against the model, and keeps `kmm_last_status` in step.
    fn expect(&mut self, what: &str, got: KmmStatus, want: &Expect) {
        check!(self, want.admits(got), "{what}: got {got:?}, the header says {want:?}");
        if got != KMM_OK {
            self.last_status = got;
            self.bad_calls += 1;
        }
        let last = kmm_last_status();
        check!(self, last == self.last_status, "{what}: kmm_last_status is {last:?}, the last failure was {:?}", self.last_status);
    }

    // --- picks -------------------------------------------------------------------------------

    fn live_managers(&self) -> Vec<usize> {
        (0..self.managers.len()).filter(|&i| self.managers[i].alive).collect()
    }

    /// A manager handle: mostly live, sometimes destroyed, 0 or forged. With its index when known.
    fn pick_manager(&mut self) -> (KmmManager, Option<usize>) {
        let live = self.live_managers();
        let dead: Vec<usize> = (0..self.managers.len()).filter(|&i| !self.managers[i].alive).collect();
        match self.r.below(100) {
            0..=84 => {
                let i = self.r.pick(&live);
                (self.managers[i].handle, Some(i))
            }
            85..=92 if !dead.is_empty() => {
                let i = self.r.pick(&dead);
                (self.managers[i].handle, Some(i))
            }
            93..=95 => (0, None),
            _ => (self.r.next() | (1 << 50), None),
        }
    }

    fn alive(&self, m: KmmManager) -> bool {
        self.managers.iter().any(|x| x.handle == m && x.alive)
    }

    fn device_of(&self, m: KmmManager) -> i32 {
        self.managers.iter().find(|x| x.handle == m).map_or(0, |x| x.device)
    }

    fn pick_stream(&mut self, m: KmmManager, valid_pct: u64) -> (u64, StreamPick) {
        let pick = if self.r.pct(valid_pct) {
            self.r.pick(&[StreamPick::Zero, StreamPick::Own, StreamPick::Foreign])
        } else if !self.dead_streams.is_empty() && self.r.pct(50) {
            StreamPick::Dead
        } else {
            StreamPick::Bogus
        };
        let device = self.device_of(m);
        let raw = match pick {
            StreamPick::Zero => 0,
            StreamPick::Own => self.managers.iter().find(|x| x.handle == m).map_or(0, |x| x.stream),
            StreamPick::Foreign => self.foreign_streams[device as usize],
            StreamPick::Bogus => bogus_stream(&mut self.r),
            StreamPick::Dead => {
                let d = self.dead_streams.clone();
                self.r.pick(&d)
            }
        };
        // A manager unknown to the model has no stream of its own: 0 stands in.
        let pick = if pick == StreamPick::Own && raw == 0 { StreamPick::Zero } else { pick };
        (raw, pick)
    }

    fn pick_live(&mut self, api: Api) -> Option<usize> {
        let idx: Vec<usize> = (0..self.live.len()).filter(|&i| self.live[i].api == api).collect();
        (!idx.is_empty()).then(|| self.r.pick(&idx))
    }

    fn live_at(&self, api: Api, addr: u64) -> Option<usize> {
        (addr != 0).then(|| self.live.iter().position(|a| a.api == api && a.addr == addr)).flatten()
    }

    /// An address that is no allocation's start of `api`: interior, of another library, freed,
    /// NULL or random. With a description.
    fn foreign_address(&mut self, api: Api) -> (u64, String) {
        for _ in 0..8 {
            let (addr, what) = match self.r.below(6) {
                0 if !self.live.is_empty() => {
                    let a = self.live[self.r.below(self.live.len() as u64) as usize].clone();
                    if a.bytes < 2 {
                        continue;
                    }
                    let off = self.r.range(1, a.bytes - 1);
                    (a.addr + off, format!("interior +{off} of {:?} {:#x}", a.api, a.addr))
                }
                1 if !self.live.is_empty() => {
                    let a = self.live[self.r.below(self.live.len() as u64) as usize].clone();
                    (a.addr, format!("{:?} allocation", a.api))
                }
                2 if !self.ghosts.is_empty() => {
                    let g = self.ghosts[self.r.below(self.ghosts.len() as u64) as usize].clone();
                    if g.late_free_pending {
                        continue;
                    }
                    (g.a.addr, format!("gone {:?} allocation", g.a.api))
                }
                3 => (0, "NULL".to_string()),
                _ => (self.r.next() & !0xff & 0x0000_7fff_ffff_ffff, "random".to_string()),
            };
            if self.live_at(api, addr).is_none() {
                return (addr, what);
            }
        }
        (0, "NULL".to_string())
    }

    // --- model updates -----------------------------------------------------------------------

    /// Records a new allocation: checks it overlaps no live one, then writes its pattern.
    fn add(&mut self, mut a: Alloc) {
        self.next_seed += 1;
        a.seed = self.next_seed;
        if a.bytes > 0 {
            check!(self, a.addr != 0, "{:?} allocation of {} bytes at address 0", a.api, a.bytes);
            check!(self, a.addr % 256 == 0, "{:?} allocation at {:#x}: not aligned to 256 bytes (the default alignment)", a.api, a.addr);
            let end = a.addr + a.bytes;
            if let Some((&start, &(other_end, other))) = self.ranges.range(..end).next_back() {
                check!(
                    self,
                    other_end <= a.addr,
                    "{:?} allocation [{:#x}, {end:#x}) overlaps live allocation [{start:#x}, {other_end:#x}) (seed {other})",
                    a.api,
                    a.addr
                );
            }
            self.ranges.insert(a.addr, (end, a.seed));
            write_pattern(a.addr, a.bytes, a.seed);
        }
        self.live.push(a);
    }

    /// Takes a live allocation out of the model (freed, or its manager destroyed).
    fn remove(&mut self, i: usize, late_free_pending: bool) -> Alloc {
        let a = self.live.swap_remove(i);
        if a.bytes > 0 {
            self.ranges.remove(&a.addr);
        }
        if self.ghosts.len() >= 64 {
            // Keep the ghosts whose late free is still to come.
            if let Some(j) = self.ghosts.iter().position(|g| !g.late_free_pending) {
                self.ghosts.swap_remove(j);
            }
        }
        self.ghosts.push(Ghost { a: a.clone(), late_free_pending });
        a
    }

    /// Checks one live allocation's bytes.
    fn verify(&self, i: usize) {
        let a = &self.live[i];
        if a.bytes > 0 {
            if let Some(off) = pattern_damage(a.addr, a.bytes, a.seed) {
                self.fail(format!(
                    "{:?} allocation of {} bytes at {:#x} (manager {:#x}, buffer {:#x}): byte {off} changed behind its owner's back",
                    a.api, a.bytes, a.addr, a.manager, a.buffer
                ));
            }
        }
    }

    fn verify_sample(&mut self, n: usize) {
        for _ in 0..n.min(self.live.len()) {
            let i = self.r.below(self.live.len() as u64) as usize;
            self.verify(i);
        }
    }

    fn verify_all(&self) {
        (0..self.live.len()).for_each(|i| self.verify(i));
    }

    /// The library's live counters and the managers' stats equal the model's.
    fn check_counts(&self, managers: &[KmmManager]) {
        let torch = self.live.iter().filter(|a| a.api == Api::Torch).count() as u64 + self.torch_base;
        let cupy = self.live.iter().filter(|a| a.api == Api::Cupy).count() as u64 + self.cupy_base;
        let (got_torch, got_cupy) = (torch_live(), cupy_live());
        check!(self, got_torch == torch, "kmm_torch_live_allocations = {got_torch}, the model has {torch}");
        check!(self, got_cupy == cupy, "kmm_cupy_live_allocations = {got_cupy}, the model has {cupy}");
        for &h in managers {
            let Some(m) = self.managers.iter().find(|m| m.handle == h && m.alive) else { continue };
            for (k, kind) in [DEVICE, PINNED].into_iter().enumerate() {
                let mine = self.live.iter().filter(|a| a.manager == h && a.kind == kind);
                let live = m.base[k].0 + mine.clone().count() as u64;
                let in_use = m.base[k].1 + mine.map(|a| a.bytes).sum::<u64>();
                let s = stats_of(h, kind);
                // As `kmm_manager_destroy` says: a CuPy or PyTorch allocation that lands where a
                // destroyed manager's allocation awaits its late free is held back (counted
                // here) until that free, one per late free to come at most.
                let pending = self.ghosts.iter().filter(|g| g.late_free_pending && matches!(g.a.api, Api::Torch | Api::Cupy)).count() as u64;
                let held = s.live_buffers.saturating_sub(live);
                if kind == DEVICE && held <= pending && s.live_buffers >= live && s.in_use >= in_use {
                    continue;
                }
                check!(
                    self,
                    (s.live_buffers, s.in_use) == (live, in_use),
                    "manager {h:#x} kind {kind}: stats say {} live buffers, {} bytes in use; the model has {live}, {in_use}",
                    s.live_buffers,
                    s.in_use
                );
            }
        }
    }

    // --- the walk ----------------------------------------------------------------------------

    fn run(&mut self, steps: usize) {
        for _ in 0..4 {
            self.create();
        }
        while self.step < steps {
            self.step += 1;
            let touched = self.one_step();
            self.verify_sample(3);
            self.check_counts(&touched);
            if self.step % 100 == 0 {
                self.verify_all();
                let all: Vec<KmmManager> = self.managers.iter().map(|m| m.handle).collect();
                self.check_counts(&all);
            }
        }
    }

    /// One random call; returns the managers whose stats it may have changed.
    fn one_step(&mut self) -> Vec<KmmManager> {
        // Frees become likelier as allocations pile up.
        let crowded = self.live.len() > 120;
        let op = self.r.below(if crowded { 60 } else { 100 });
        let op = if crowded { op + 40 } else { op };
        match op {
            0..=1 => self.create(),
            2 => self.destroy(),
            3..=14 => self.plugin_alloc(),
            15..=21 => self.plugin_malloc(),
            22..=29 => self.torch_malloc(),
            30..=35 => self.cupy_malloc(),
            36 => self.cupy_set_manager(),
            37 => self.cupy_stream_source(),
            38..=39 => self.misc(),
            40..=53 => self.plugin_free(),
            54..=63 => self.plugin_free_address(),
            64..=75 => self.torch_free(),
            76..=83 => self.cupy_free(),
            84..=86 => self.record_stream(),
            87..=89 => self.trim(),
            90..=92 => self.buffer_calls(),
            93..=94 => self.late_frees(),
            _ => self.bad_nulls(),
        }
    }

    fn create(&mut self) -> Vec<KmmManager> {
        if self.managers.iter().filter(|m| m.alive && !m.torch).count() >= 5 {
            return self.destroy();
        }
        let device = self.r.below(self.devices as u64) as i32;
        let mode = self.r.pick(&[KmmAllocMode::KMM_ALLOC_POOL, KmmAllocMode::KMM_ALLOC_POOL, KmmAllocMode::KMM_ALLOC_DIRECT, KmmAllocMode::KMM_ALLOC_CUDA_ASYNC]);
        let sub = self.r.pick(&[KmmSuballocator::KMM_SUBALLOC_BINNED, KmmSuballocator::KMM_SUBALLOC_HEAP]);
        let chunk = self.r.pick(&[MIB, 2 * MIB, 8 * MIB]);
        let h = create_manager(device, |c| {
            c.alloc_mode = mode as u32;
            c.suballocator = sub as u32;
            c.chunk_size = chunk;
        });
        self.note(format!("kmm_manager_create(device {device}, {mode:?}, {sub:?}, chunk {chunk}) -> {h:#x}"));
        self.managers.push(MgrModel { handle: h, device, stream: stream_of(h), torch: false, alive: true, base: [(0, 0); 2] });
        vec![h]
    }

    /// Destroys a user manager, often with plugin allocations of every kind still out. The
    /// header: the destroy "frees every buffer and event it still holds", later calls with its
    /// handles are `KMM_ERROR_INVALID_HANDLE`; CuPy's and PyTorch's frees of unknown pointers
    /// are ignored.
    fn destroy(&mut self) -> Vec<KmmManager> {
        let users: Vec<usize> = (0..self.managers.len()).filter(|&i| self.managers[i].alive && !self.managers[i].torch).collect();
        if users.len() <= 1 {
            return self.create();
        }
        let i = self.r.pick(&users);
        let h = self.managers[i].handle;
        // As the header asks, CuPy forgets a manager before it is closed (mostly).
        let registered: Vec<i32> = self.cupy.iter().filter(|(_, &m)| m == h).map(|(&d, _)| d).collect();
        for d in registered {
            if self.r.pct(80) {
                let s = kmm_cupy_set_manager(d, 0);
                self.note(format!("kmm_cupy_set_manager({d}, 0) = {s:?}"));
                self.expect("kmm_cupy_set_manager(d, 0)", s, &Expect::default());
                self.cupy.remove(&d);
            }
        }
        let flags = self.r.pick(&[0, KMM_DESTROY_DEFERRED, 0]);
        let out = self.live.iter().filter(|a| a.manager == h).count();
        let s = kmm_manager_destroy(h, flags);
        self.note(format!("kmm_manager_destroy({h:#x}, flags {flags}) = {s:?} with {out} allocations out"));
        self.expect("kmm_manager_destroy", s, &Expect::default());
        self.managers[i].alive = false;
        self.dead_streams.push(self.managers[i].stream);
        while let Some(j) = self.live.iter().position(|a| a.manager == h) {
            // Plugin buffers die with their handles; allocations freed by address await the
            // library's late free.
            let pending = self.live[j].api != Api::Plugin;
            self.remove(j, pending);
        }
        // A second destroy, and one with unknown flags.
        let s = kmm_manager_destroy(h, 0);
        self.note(format!("kmm_manager_destroy({h:#x}) again = {s:?}"));
        self.expect("second kmm_manager_destroy", s, &Expect::one(KMM_ERROR_INVALID_HANDLE));
        if self.r.pct(20) {
            let users: Vec<usize> = self.live_managers().into_iter().filter(|&i| !self.managers[i].torch).collect();
            let other = self.managers[self.r.pick(&users)].handle;
            let s = kmm_manager_destroy(other, 0x80);
            self.note(format!("kmm_manager_destroy({other:#x}, flags 0x80) = {s:?}"));
            self.expect("kmm_manager_destroy with unknown flags", s, &Expect::one(KMM_ERROR_INVALID_ARGUMENT));
        }
        vec![]
    }

    fn plugin_alloc(&mut self) -> Vec<KmmManager> {
        let (m, _) = self.pick_manager();
        let bytes = request_size(&mut self.r);
        let kind = match self.r.below(20) {
            0 => self.r.pick(&[2, 7, u32::MAX]),
            1..=5 => PINNED,
            _ => DEVICE,
        };
        let (stream, pick) = self.pick_stream(m, 92);
        let (null_buffer, null_ptr) = (self.r.pct(3), self.r.pct(3));
        let mut want = Expect::default();
        if null_buffer || null_ptr {
            want.err(KMM_ERROR_NULL_POINTER);
        }
        if kind > PINNED {
            want.err(KMM_ERROR_INVALID_ARGUMENT);
        }
        if !self.alive(m) {
            want.err(KMM_ERROR_INVALID_HANDLE);
        }
        if let Some(e) = size_errors(bytes) {
            want.err(e);
        }
        want.stream(pick);
        let (mut buffer, mut ptr) = (0xAAAA_u64, 0xBBBB_u64);
        let s = kmm_plugin_alloc(
            m,
            bytes,
            kind,
            stream,
            if null_buffer { null_mut() } else { &mut buffer },
            if null_ptr { null_mut() } else { &mut ptr },
        );
        self.note(format!(
            "kmm_plugin_alloc({m:#x}, {bytes}, kind {kind}, {pick:?} {stream:#x}, buffer{}, ptr{}) = {s:?} -> buffer {buffer:#x} ptr {ptr:#x}",
            if null_buffer { " NULL" } else { "" },
            if null_ptr { " NULL" } else { "" }
        ));
        self.expect("kmm_plugin_alloc", s, &want);
        if s == KMM_OK {
            check!(self, buffer != 0, "kmm_plugin_alloc wrote buffer handle 0");
            check!(self, (ptr == 0) == (bytes == 0), "kmm_plugin_alloc of {bytes} bytes wrote ptr {ptr:#x} (0 only for zero bytes)");
            if self.r.pct(30) {
                let mut info = KmmBufferInfo::default();
                let s = kmm_buffer_info(m, buffer, &mut info);
                self.note(format!("kmm_buffer_info({m:#x}, {buffer:#x}) = {s:?} {info:?}"));
                self.expect("kmm_buffer_info of a plugin buffer", s, &Expect::default());
                // "maps it ... the buffer stays mapped until then".
                check!(
                    self,
                    (info.bytes, info.kind, info.pins) == (bytes, kind, 1),
                    "a plugin buffer of {bytes} bytes of kind {kind} reports {info:?} (one pin expected)"
                );
            }
            self.add(Alloc { api: Api::Plugin, manager: m, buffer, addr: ptr, bytes, kind, seed: 0 });
        } else {
            check!(self, (buffer, ptr) == (0xAAAA, 0xBBBB), "failed kmm_plugin_alloc wrote its outs: buffer {buffer:#x}, ptr {ptr:#x}");
        }
        vec![m]
    }

    fn plugin_free(&mut self) -> Vec<KmmManager> {
        let mut want = Expect::default();
        // The buffer: a live one (through its manager or another), a gone one, or a forged one.
        let (m, buffer, target, what) = match self.r.below(10) {
            0..=6 if self.pick_live(Api::Plugin).is_some() => {
                let i = self.pick_live(Api::Plugin).expect("live plugin buffer");
                let a = self.live[i].clone();
                if self.r.pct(8) {
                    let (m, _) = self.pick_manager();
                    if m != a.manager {
                        want.err(KMM_ERROR_INVALID_HANDLE);
                        (m, a.buffer, None, "through another manager")
                    } else {
                        (m, a.buffer, Some(a), "live")
                    }
                } else {
                    (a.manager, a.buffer, Some(a), "live")
                }
            }
            7..=8 if self.ghosts.iter().any(|g| g.a.api == Api::Plugin) => {
                let gs: Vec<Ghost> = self.ghosts.iter().filter(|g| g.a.api == Api::Plugin).cloned().collect();
                let g = gs[self.r.below(gs.len() as u64) as usize].clone();
                want.err(KMM_ERROR_INVALID_HANDLE);
                (g.a.manager, g.a.buffer, None, "freed or of a destroyed manager")
            }
            _ => {
                let (m, _) = self.pick_manager();
                want.err(KMM_ERROR_INVALID_HANDLE);
                let b = if self.r.pct(30) { 0 } else { self.r.next() | 1 };
                (m, b, None, "forged")
            }
        };
        if !self.alive(m) {
            want.err(KMM_ERROR_INVALID_HANDLE);
        }
        let (stream, pick) = self.pick_stream(m, 93);
        want.stream(pick);
        let s = kmm_plugin_free(m, buffer, stream);
        self.note(format!("kmm_plugin_free({m:#x}, {buffer:#x} {what}, {pick:?} {stream:#x}) = {s:?}"));
        self.expect("kmm_plugin_free", s, &want);
        if let (KMM_OK, Some(a)) = (s, target) {
            let i = self.live.iter().position(|x| x.api == Api::Plugin && x.buffer == a.buffer && x.manager == a.manager).expect("target");
            self.remove(i, false);
        }
        vec![m]
    }

    fn plugin_malloc(&mut self) -> Vec<KmmManager> {
        let (m, _) = self.pick_manager();
        let bytes = request_size(&mut self.r);
        let (stream, pick) = self.pick_stream(m, 92);
        let mut want = Expect::default();
        if bytes == 0 {
            // "`bytes` (at least 1)".
            want.err(KMM_ERROR_INVALID_ARGUMENT);
        }
        if !self.alive(m) {
            want.err(KMM_ERROR_INVALID_HANDLE);
        }
        if let Some(e) = size_errors(bytes) {
            want.err(e);
        }
        want.stream(pick);
        let addr = kmm_plugin_malloc(m, bytes, stream);
        // The status of a call that returns an address: `kmm_last_status` after a failure.
        let s = if addr == 0 { kmm_last_status() } else { KMM_OK };
        self.note(format!("kmm_plugin_malloc({m:#x}, {bytes}, {pick:?} {stream:#x}) = {addr:#x} ({s:?})"));
        self.expect("kmm_plugin_malloc", s, &want);
        if addr != 0 {
            self.add(Alloc { api: Api::Malloc, manager: m, buffer: 0, addr, bytes, kind: DEVICE, seed: 0 });
        }
        vec![m]
    }

    fn plugin_free_address(&mut self) -> Vec<KmmManager> {
        let mut want = Expect::default();
        let (m, addr, what) = match self.r.below(10) {
            0..=6 if self.pick_live(Api::Malloc).is_some() => {
                let i = self.pick_live(Api::Malloc).expect("live malloc");
                let a = self.live[i].clone();
                if self.r.pct(8) {
                    let (m, _) = self.pick_manager();
                    (m, a.addr, "through a random manager".to_string())
                } else {
                    (a.manager, a.addr, "live".to_string())
                }
            }
            7 if self.ghosts.iter().any(|g| g.a.api == Api::Malloc) => {
                let gs: Vec<Ghost> = self.ghosts.iter().filter(|g| g.a.api == Api::Malloc).cloned().collect();
                let g = gs[self.r.below(gs.len() as u64) as usize].clone();
                if g.late_free_pending {
                    // The late free of an allocation whose manager is gone.
                    let j = self.ghosts.iter().position(|x| x.a.addr == g.a.addr && x.late_free_pending && x.a.api == Api::Malloc).expect("ghost");
                    self.ghosts[j].late_free_pending = false;
                }
                (g.a.manager, g.a.addr, format!("gone (late free: {})", g.late_free_pending))
            }
            _ => {
                let (m, _) = self.pick_manager();
                let (addr, what) = self.foreign_address(Api::Malloc);
                (m, addr, what)
            }
        };
        let target = self.live.iter().position(|a| a.api == Api::Malloc && a.addr == addr && a.manager == m && addr != 0);
        if !self.alive(m) {
            want.err(KMM_ERROR_INVALID_HANDLE);
        } else if target.is_none() {
            // Not an allocation of this manager's `kmm_plugin_malloc`: the header names no
            // status; an argument out of bounds or a dead handle both read right.
            want.err(KMM_ERROR_INVALID_ARGUMENT);
            want.err(KMM_ERROR_INVALID_HANDLE);
        }
        let (stream, pick) = self.pick_stream(m, 95);
        want.stream(pick);
        let s = kmm_plugin_free_address(m, addr, stream);
        self.note(format!("kmm_plugin_free_address({m:#x}, {addr:#x} {what}, {pick:?} {stream:#x}) = {s:?}"));
        self.expect("kmm_plugin_free_address", s, &want);
        if let (KMM_OK, Some(i)) = (s, target) {
            self.remove(i, false);
        }
        vec![m]
    }

    /// A stream for PyTorch's calls on `device`: mostly live, sometimes not (`valid_pct`).
    fn torch_stream(&mut self, device: i32, valid_pct: u64) -> (u64, StreamPick) {
        let tm = self.managers.iter().find(|m| m.torch && m.device == device).map_or(0, |m| m.handle);
        self.pick_stream(tm, valid_pct)
    }

    fn torch_malloc(&mut self) -> Vec<KmmManager> {
        let bytes = request_size(&mut self.r);
        let device = match self.r.below(20) {
            0 => -1,
            1 => self.devices,
            _ => self.r.below(self.devices as u64) as i32,
        };
        let (stream, pick) = if (0..self.devices).contains(&device) { self.torch_stream(device, 95) } else { (0, StreamPick::Zero) };
        let mut want = Expect::default();
        if device < 0 {
            want.err(KMM_ERROR_INVALID_ARGUMENT);
        } else if device >= self.devices {
            // No such device: creating its default manager fails.
            want.err(KMM_ERROR_INVALID_ARGUMENT);
            want.err(KMM_ERROR_BACKEND_UNAVAILABLE);
        }
        if let Some(e) = size_errors(bytes) {
            want.err(e);
        }
        want.stream(pick);
        let p = kmm_torch_malloc(bytes as usize, device, stream as *mut c_void) as u64;
        // NULL for zero bytes is no failure; else NULL says a failure, its status readable.
        let s = if p == 0 && bytes != 0 { kmm_last_status() } else { KMM_OK };
        self.note(format!("kmm_torch_malloc({bytes}, device {device}, {pick:?} {stream:#x}) = {p:#x} ({s:?})"));
        if bytes == 0 {
            check!(self, p == 0, "kmm_torch_malloc(0) = {p:#x}: \"NULL for zero bytes\"");
            return vec![];
        }
        self.expect("kmm_torch_malloc", s, &want);
        let tm = self.managers.iter().find(|m| m.torch && m.device == device).map(|m| m.handle);
        if p != 0 {
            self.add(Alloc { api: Api::Torch, manager: tm.expect("torch manager"), buffer: 0, addr: p, bytes, kind: DEVICE, seed: 0 });
        }
        tm.into_iter().collect()
    }

    fn torch_free(&mut self) -> Vec<KmmManager> {
        let live = self.pick_live(Api::Torch);
        let (addr, size, device, target, what) = match live {
            Some(i) if self.r.pct(75) => {
                let a = self.live[i].clone();
                (a.addr, a.bytes, self.device_of(a.manager), Some(i), "live".to_string())
            }
            _ => {
                if let Some(j) = self.ghosts.iter().position(|g| g.a.api == Api::Torch && g.late_free_pending) {
                    // (PyTorch's managers are never destroyed, so none are pending.)
                    self.ghosts[j].late_free_pending = false;
                }
                let (addr, what) = self.foreign_address(Api::Torch);
                (addr, self.r.range(1, 4096), 0, None, what)
            }
        };
        // PyTorch frees on a live stream: the free has no status to refuse another with.
        let (stream, pick) = self.torch_stream(device, 100);
        kmm_torch_free(addr as *mut c_void, size as usize, device, stream as *mut c_void);
        self.note(format!("kmm_torch_free({addr:#x} {what}, {size}, device {device}, {pick:?} {stream:#x})"));
        match target {
            Some(i) => {
                self.remove(i, false);
            }
            None => {
                // "Unknown pointers and NULL are ignored (the error is readable with
                // kmm_last_error)": nothing is freed; the counts check that.
                self.last_status = kmm_last_status();
            }
        }
        vec![]
    }

    fn cupy_malloc(&mut self) -> Vec<KmmManager> {
        let bytes = request_size(&mut self.r);
        let device = match self.r.below(20) {
            0 => -1,
            1 => 5,
            _ => self.r.below(self.devices as u64) as i32,
        };
        let registered = self.cupy.get(&device).copied();
        let mut want = Expect::default();
        match registered {
            // "kmm_cupy_malloc then fails there until one is set"; the header names no status.
            None => {
                want.err(KMM_ERROR_INVALID_ARGUMENT);
                want.err(KMM_ERROR_INVALID_HANDLE);
            }
            // A manager destroyed while registered (the caller broke its promise).
            Some(m) if !self.alive(m) => want.err(KMM_ERROR_INVALID_HANDLE),
            Some(_) => {}
        }
        if let Some(e) = size_errors(bytes) {
            want.err(e);
        }
        let source_stream = match self.cupy_source {
            Some(-1) => {
                want.err(KMM_ERROR_BACKEND);
                Some(-1)
            }
            Some(s) => {
                if !self.foreign_streams.contains(&(s as u64)) {
                    // A stream that never existed.
                    want.err(KMM_ERROR_INVALID_ARGUMENT);
                } else if Some(self.stream_host_device(s as u64)) != registered.map(|m| self.device_of(m)) {
                    // A live stream of another stand-in device: the header leaves it open.
                    want.maybe(KMM_ERROR_INVALID_ARGUMENT);
                }
                Some(s)
            }
            None => None,
        };
        let hooks = CUPY_HOOK_CALLS.load(SeqCst);
        let p = kmm_cupy_malloc(null_mut(), bytes as usize, device) as u64;
        let s = if p == 0 && bytes != 0 { kmm_last_status() } else { KMM_OK };
        self.note(format!("kmm_cupy_malloc({bytes}, device {device} -> {registered:?}, source {source_stream:?}) = {p:#x} ({s:?})"));
        if bytes == 0 {
            // CuPy never asks for zero bytes; an address would have to be freed, NULL is fine.
            if p != 0 {
                let m = registered.expect("a manager served it");
                self.add(Alloc { api: Api::Cupy, manager: m, buffer: 0, addr: p, bytes: 0, kind: DEVICE, seed: 0 });
            }
            return registered.into_iter().collect();
        }
        self.expect("kmm_cupy_malloc", s, &want);
        if p != 0 {
            self.add(Alloc { api: Api::Cupy, manager: registered.expect("registered"), buffer: 0, addr: p, bytes, kind: DEVICE, seed: 0 });
        }
        if source_stream == Some(-1) && registered.is_some_and(|m| self.alive(m)) && size_errors(bytes).is_none() {
            let calls = CUPY_HOOK_CALLS.load(SeqCst) - hooks;
            check!(self, calls == 1, "a failing CuPy stream source: its error hook ran {calls} times (once expected)");
        }
        registered.into_iter().collect()
    }

    fn stream_host_device(&self, s: u64) -> i32 {
        self.foreign_streams.iter().position(|&h| h == s).map_or(-1, |d| d as i32)
    }

    fn cupy_free(&mut self) -> Vec<KmmManager> {
        let live = self.pick_live(Api::Cupy);
        let (addr, target, what) = match live {
            Some(i) if self.r.pct(75) => (self.live[i].addr, Some(i), "live".to_string()),
            _ => {
                let pending: Vec<usize> = (0..self.ghosts.len()).filter(|&j| self.ghosts[j].a.api == Api::Cupy && self.ghosts[j].late_free_pending).collect();
                if !pending.is_empty() && self.r.pct(50) {
                    let j = self.r.pick(&pending);
                    self.ghosts[j].late_free_pending = false;
                    (self.ghosts[j].a.addr, None, "late free after its manager's destroy".to_string())
                } else {
                    let (addr, what) = self.foreign_address(Api::Cupy);
                    (addr, None, what)
                }
            }
        };
        kmm_cupy_free(null_mut(), addr as *mut c_void, 0);
        self.note(format!("kmm_cupy_free({addr:#x} {what})"));
        match target {
            Some(i) => {
                let m = self.live[i].manager;
                self.remove(i, false);
                vec![m]
            }
            None => {
                self.last_status = kmm_last_status();
                vec![]
            }
        }
    }

    fn cupy_set_manager(&mut self) -> Vec<KmmManager> {
        let device = if self.r.pct(10) { -1 } else { self.r.below(self.devices as u64) as i32 };
        let mut want = Expect::default();
        let m = if self.r.pct(25) {
            0
        } else {
            // A manager of the device (or a dead or forged handle).
            let (m, _) = self.pick_manager();
            let of_device: Vec<KmmManager> = self.managers.iter().filter(|x| x.alive && x.device == device).map(|x| x.handle).collect();
            if self.alive(m) && !of_device.is_empty() {
                self.r.pick(&of_device)
            } else {
                m
            }
        };
        if device < 0 {
            want.err(KMM_ERROR_INVALID_ARGUMENT);
        }
        if m != 0 && !self.alive(m) {
            want.err(KMM_ERROR_INVALID_HANDLE);
        }
        let s = kmm_cupy_set_manager(device, m);
        self.note(format!("kmm_cupy_set_manager({device}, {m:#x}) = {s:?}"));
        self.expect("kmm_cupy_set_manager", s, &want);
        if s == KMM_OK {
            if m == 0 {
                self.cupy.remove(&device);
            } else {
                self.cupy.insert(device, m);
            }
        }
        vec![]
    }

    fn cupy_stream_source(&mut self) -> Vec<KmmManager> {
        let choice = self.r.below(5);
        let (source, value): (KmmStreamSource, Option<isize>) = match choice {
            0 | 1 => (None, None),
            2 => (Some(cupy_stream_source), Some(-1)),
            3 => {
                let d = self.r.below(self.devices as u64) as usize;
                (Some(cupy_stream_source), Some(self.foreign_streams[d] as isize))
            }
            _ => (Some(cupy_stream_source), Some(bogus_stream(&mut self.r) as isize)),
        };
        CUPY_STREAM.store(value.unwrap_or(0), SeqCst);
        let s = kmm_cupy_set_stream_source(source, Some(cupy_error_hook));
        self.note(format!("kmm_cupy_set_stream_source(returning {value:?}) = {s:?}"));
        self.expect("kmm_cupy_set_stream_source", s, &Expect::default());
        self.cupy_source = value;
        vec![]
    }

    /// `kmm_buffer_record_stream` on plugin buffers and `kmm_torch_record_stream`.
    fn record_stream(&mut self) -> Vec<KmmManager> {
        if self.r.pct(50) {
            let Some(i) = self.pick_live(Api::Plugin) else { return vec![] };
            let a = self.live[i].clone();
            let (stream, pick) = self.pick_stream(a.manager, 85);
            let mut want = Expect::default();
            want.stream(pick);
            let s = kmm_buffer_record_stream(a.manager, a.buffer, stream);
            self.note(format!("kmm_buffer_record_stream({:#x}, {:#x}, {pick:?} {stream:#x}) = {s:?}", a.manager, a.buffer));
            self.expect("kmm_buffer_record_stream on a plugin buffer", s, &want);
            vec![]
        } else {
            let live = self.pick_live(Api::Torch);
            let (addr, device, what) = match live {
                Some(i) if self.r.pct(70) => (self.live[i].addr, self.device_of(self.live[i].manager), "live".to_string()),
                _ => {
                    let (addr, what) = self.foreign_address(Api::Torch);
                    (addr, 0, what)
                }
            };
            let (stream, pick) = self.torch_stream(device, 90);
            let mut want = Expect::default();
            if self.live_at(Api::Torch, addr).is_none() {
                want.err(KMM_ERROR_INVALID_ARGUMENT);
                want.err(KMM_ERROR_NULL_POINTER);
                want.err(KMM_ERROR_INVALID_HANDLE);
            }
            want.stream(pick);
            let s = kmm_torch_record_stream(addr as *mut c_void, stream as *mut c_void);
            self.note(format!("kmm_torch_record_stream({addr:#x} {what}, {pick:?} {stream:#x}) = {s:?}"));
            self.expect("kmm_torch_record_stream", s, &want);
            vec![]
        }
    }

    fn trim(&mut self) -> Vec<KmmManager> {
        let (m, _) = self.pick_manager();
        let keep = self.r.pick(&[0, MIB, u64::MAX]);
        let mut want = Expect::default();
        if !self.alive(m) {
            want.err(KMM_ERROR_INVALID_HANDLE);
        }
        let s = if self.r.pct(30) { kmm_manager_synchronize(m) } else { kmm_manager_trim(m, keep) };
        self.note(format!("kmm_manager_trim/synchronize({m:#x}, keep {keep}) = {s:?}"));
        self.expect("kmm_manager_trim", s, &want);
        // Trims give free memory back, never a live allocation's: check them all.
        self.verify_all();
        vec![m]
    }

    /// Calls on plugin buffers through the buffer API: a plain free of a mapped plugin buffer is
    /// refused; stats and summaries.
    fn buffer_calls(&mut self) -> Vec<KmmManager> {
        match self.r.below(3) {
            0 => {
                let Some(i) = self.pick_live(Api::Plugin) else { return vec![] };
                let a = self.live[i].clone();
                let s = kmm_buffer_free(a.manager, a.buffer, 0);
                self.note(format!("kmm_buffer_free({:#x}, plugin buffer {:#x}, 0) = {s:?}", a.manager, a.buffer));
                // "the buffer stays mapped until" `kmm_plugin_free`; "A mapped buffer is
                // KMM_ERROR_BUFFER_MAPPED unless flags has KMM_FREE_FORCE".
                self.expect("kmm_buffer_free of a mapped plugin buffer", s, &Expect::one(KMM_ERROR_BUFFER_MAPPED));
                vec![a.manager]
            }
            1 => {
                let (m, _) = self.pick_manager();
                let kind = if self.r.pct(90) { self.r.pick(&[DEVICE, PINNED]) } else { 9 };
                let mut want = Expect::default();
                if !self.alive(m) {
                    want.err(KMM_ERROR_INVALID_HANDLE);
                }
                if kind > PINNED {
                    want.err(KMM_ERROR_INVALID_ARGUMENT);
                }
                let mut st = KmmMemoryStats::default();
                let s = kmm_manager_stats(m, kind, &mut st);
                self.note(format!("kmm_manager_stats({m:#x}, {kind}) = {s:?}"));
                self.expect("kmm_manager_stats", s, &want);
                vec![m]
            }
            _ => {
                let (m, _) = self.pick_manager();
                let mut want = Expect::default();
                if !self.alive(m) {
                    want.err(KMM_ERROR_INVALID_HANDLE);
                }
                let mut needed = 0usize;
                let s = kmm_manager_summary(m, null_mut(), 0, &mut needed);
                self.note(format!("kmm_manager_summary({m:#x}, NULL, 0) = {s:?} needed {needed}"));
                self.expect("kmm_manager_summary (length)", s, &want);
                if s == KMM_OK {
                    let mut buf = vec![0u8; needed];
                    let s = kmm_manager_summary(m, buf.as_mut_ptr().cast(), needed, null_mut());
                    self.expect("kmm_manager_summary", s, &Expect::default());
                    check!(self, needed > 0 && buf[needed - 1] == 0, "kmm_manager_summary: no NUL at needed - 1 = {}", needed as i64 - 1);
                }
                vec![m]
            }
        }
    }

    /// The late frees of allocations whose manager was destroyed: through the dead manager
    /// (`kmm_plugin_free`, `kmm_plugin_free_address`: INVALID_HANDLE) or by address (ignored).
    fn late_frees(&mut self) -> Vec<KmmManager> {
        let pending: Vec<usize> = (0..self.ghosts.len()).filter(|&j| self.ghosts[j].late_free_pending).collect();
        if pending.is_empty() {
            // A plugin buffer of a destroyed manager.
            let gs: Vec<Ghost> = self.ghosts.iter().filter(|g| g.a.api == Api::Plugin && !self.alive(g.a.manager)).cloned().collect();
            if gs.is_empty() {
                return vec![];
            }
            let g = gs[self.r.below(gs.len() as u64) as usize].clone();
            let s = kmm_plugin_free(g.a.manager, g.a.buffer, 0);
            self.note(format!("kmm_plugin_free({:#x} destroyed, {:#x}, 0) = {s:?}", g.a.manager, g.a.buffer));
            self.expect("late kmm_plugin_free", s, &Expect::one(KMM_ERROR_INVALID_HANDLE));
            return vec![];
        }
        let j = self.r.pick(&pending);
        self.ghosts[j].late_free_pending = false;
        let a = self.ghosts[j].a.clone();
        match a.api {
            Api::Malloc => {
                let s = kmm_plugin_free_address(a.manager, a.addr, 0);
                self.note(format!("kmm_plugin_free_address({:#x} destroyed, {:#x}, 0) = {s:?}", a.manager, a.addr));
                self.expect("late kmm_plugin_free_address", s, &Self::dead_manager_free_address());
            }
            Api::Cupy => {
                kmm_cupy_free(null_mut(), a.addr as *mut c_void, 0);
                self.note(format!("kmm_cupy_free({:#x} of destroyed {:#x})", a.addr, a.manager));
                self.last_status = kmm_last_status();
            }
            Api::Torch => {
                kmm_torch_free(a.addr as *mut c_void, a.bytes as usize, 0, null_mut());
                self.note(format!("kmm_torch_free({:#x} of destroyed {:#x})", a.addr, a.manager));
                self.last_status = kmm_last_status();
            }
            Api::Plugin => unreachable!("plugin buffers await no late free by address"),
        }
        vec![]
    }

    /// `kmm_plugin_free_address` through a destroyed manager: "Later calls with its handles
    /// return KMM_ERROR_INVALID_HANDLE".
    fn dead_manager_free_address() -> Expect {
        Expect::one(KMM_ERROR_INVALID_HANDLE)
    }

    /// NULL outs and other arguments every call must refuse without effect.
    fn bad_nulls(&mut self) -> Vec<KmmManager> {
        let (what, s, want) = match self.r.below(7) {
            0 => ("kmm_torch_live_allocations(NULL)", kmm_torch_live_allocations(null_mut()), KMM_ERROR_NULL_POINTER),
            1 => ("kmm_cupy_live_allocations(NULL)", kmm_cupy_live_allocations(null_mut()), KMM_ERROR_NULL_POINTER),
            2 => ("kmm_torch_manager(0, NULL)", kmm_torch_manager(0, null_mut()), KMM_ERROR_NULL_POINTER),
            3 => {
                let mut out = 0;
                ("kmm_torch_manager(-1)", kmm_torch_manager(-1, &mut out), KMM_ERROR_INVALID_ARGUMENT)
            }
            4 => ("kmm_torch_set_oom_policy(7)", kmm_torch_set_oom_policy(7), KMM_ERROR_INVALID_ARGUMENT),
            5 => {
                let m = self.managers[0].handle;
                ("kmm_manager_stats(torch, DEVICE, NULL)", kmm_manager_stats(m, DEVICE, null_mut()), KMM_ERROR_NULL_POINTER)
            }
            _ => {
                let mut out = 0;
                let d = self.devices;
                let s = kmm_torch_manager(d, &mut out);
                self.note(format!("kmm_torch_manager({d}) = {s:?} -> {out:#x}"));
                let mut want = Expect::default();
                want.err(KMM_ERROR_INVALID_ARGUMENT);
                want.err(KMM_ERROR_BACKEND_UNAVAILABLE);
                self.expect("kmm_torch_manager of a device that does not exist", s, &want);
                return vec![];
            }
        };
        self.note(format!("{what} = {s:?}"));
        self.expect(what, s, &Expect::one(want));
        vec![]
    }

    /// Rarely: `kmm_torch_manager` is stable, and the plugin calls on PyTorch's managers.
    fn misc(&mut self) -> Vec<KmmManager> {
        let d = self.r.below(self.devices as u64) as i32;
        let h = torch_manager(d);
        self.note(format!("kmm_torch_manager({d}) = {h:#x}"));
        let known = self.managers.iter().find(|m| m.torch && m.device == d).map(|m| m.handle);
        check!(self, Some(h) == known, "kmm_torch_manager({d}) = {h:#x}, earlier {known:?}");
        vec![]
    }

    /// Frees everything, destroys the walk's managers, and checks that nothing leaked.
    fn finish(mut self, managers_before: u32) {
        self.step += 1;
        self.verify_all();
        while let Some(a) = self.live.last().cloned() {
            match a.api {
                Api::Plugin => {
                    let s = kmm_plugin_free(a.manager, a.buffer, 0);
                    self.note(format!("final kmm_plugin_free({:#x}, {:#x}) = {s:?}", a.manager, a.buffer));
                    self.expect("final kmm_plugin_free", s, &Expect::default());
                }
                Api::Malloc => {
                    let s = kmm_plugin_free_address(a.manager, a.addr, 0);
                    self.note(format!("final kmm_plugin_free_address({:#x}, {:#x}) = {s:?}", a.manager, a.addr));
                    self.expect("final kmm_plugin_free_address", s, &Expect::default());
                }
                Api::Torch => {
                    kmm_torch_free(a.addr as *mut c_void, a.bytes as usize, self.device_of(a.manager), null_mut());
                    self.note(format!("final kmm_torch_free({:#x})", a.addr));
                }
                Api::Cupy => {
                    kmm_cupy_free(null_mut(), a.addr as *mut c_void, 0);
                    self.note(format!("final kmm_cupy_free({:#x})", a.addr));
                }
            }
            let i = self.live.len() - 1;
            self.remove(i, false);
            self.verify_sample(2);
        }
        let all: Vec<KmmManager> = self.managers.iter().map(|m| m.handle).collect();
        self.check_counts(&all);
        // The late frees still due (PyTorch and CuPy may send them long after).
        let pending: Vec<Ghost> = self.ghosts.iter().filter(|g| g.late_free_pending).cloned().collect();
        for g in pending {
            match g.a.api {
                Api::Malloc => {
                    let s = kmm_plugin_free_address(g.a.manager, g.a.addr, 0);
                    self.note(format!("final late kmm_plugin_free_address({:#x}, {:#x}) = {s:?}", g.a.manager, g.a.addr));
                    self.expect("final late kmm_plugin_free_address", s, &Self::dead_manager_free_address());
                }
                Api::Cupy => kmm_cupy_free(null_mut(), g.a.addr as *mut c_void, 0),
                _ => {}
            }
        }
        self.check_counts(&all);
        for d in 0..self.devices {
            ok(kmm_cupy_set_manager(d, 0));
        }
        ok(kmm_cupy_set_stream_source(None, None));
        for m in self.managers.iter().filter(|m| m.alive && !m.torch) {
            ok(kmm_manager_destroy(m.handle, 0));
        }
        for &h in &self.stream_hosts {
            ok(kmm_manager_destroy(h, 0));
        }
        let (torch, cupy) = (torch_live(), cupy_live());
        check!(self, (torch, cupy) == (self.torch_base, self.cupy_base), "after the walk: {torch} torch and {cupy} cupy allocations live");
        let n = await_live_managers(managers_before);
        check!(self, n == managers_before, "after the walk: {n} managers alive, {managers_before} before it");
    }
}

#[test]
fn random_walks_match_the_model() {
    let _serial = serial();
    if gpu() {
        eprintln!("plugin_model: host backend only (device addresses are read directly); skipped");
        return;
    }
    let steps = env_u64("KMM_PLUGIN_STEPS", 2000) as usize;
    let seeds: Vec<u64> = match std::env::var("KMM_PLUGIN_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => vec![seed],
        None => (1..=env_u64("KMM_PLUGIN_CASES", 24)).collect(),
    };
    // PyTorch's managers are created once per process; count them in before the walks.
    for d in 0..host_devices().min(2) {
        torch_manager(d);
    }
    let started = Instant::now();
    let (mut calls, mut bad) = (0, 0);
    for seed in seeds {
        let before = live_managers();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut walk = Walk::new(seed);
            walk.run(steps);
            let counts = (walk.calls, walk.bad_calls);
            walk.finish(before);
            counts
        }));
        match result {
            Ok((c, b)) => {
                calls += c;
                bad += b;
            }
            Err(panic) => {
                eprintln!(
                    "plugin_model: walk with seed {seed} failed; replay with\n  KMM_PLUGIN_SEED={seed} KMM_PLUGIN_STEPS={steps} \
                     cargo test -p kmm --release --test plugin_model random_walks -- --nocapture"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("plugin_model: {calls} calls ({bad} refused) in {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// Threads sharing managers
// ---------------------------------------------------------------------------------------------

/// What the threads share: managers that live through the test ("stable": two of the walk's,
/// PyTorch's), one that a fifth thread destroys and recreates ("volatile"; CuPy's manager of
/// device 1), and the address ranges of every live allocation of a stable manager.
struct Shared {
    stable: Vec<(KmmManager, i32)>,
    volatile: AtomicU64,
    foreign_stream: u64,
    devices: i32,
    /// addr -> (end, thread) of every live allocation of a stable manager.
    ranges: Mutex<BTreeMap<u64, (u64, usize)>>,
    stop: AtomicBool,
}

/// One allocation of a worker thread.
struct Held {
    api: Api,
    manager: KmmManager,
    buffer: KmmBuffer,
    addr: u64,
    bytes: u64,
    seed: u64,
    /// Of the volatile manager: it may be gone any time, so its bytes are never touched.
    volatile: bool,
}

/// A worker's walk: its own allocations, its own last calls.
struct Worker {
    id: usize,
    seed: u64,
    r: Rng,
    shared: Arc<Shared>,
    held: Vec<Held>,
    history: VecDeque<String>,
    next_seed: u64,
}

impl Worker {
    fn note(&mut self, call: String) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(call);
    }

    fn fail(&self, msg: String) -> ! {
        let history: Vec<&str> = self.history.iter().map(String::as_str).collect();
        panic!(
            "plugin_model threads: worker {} (seed {}): {msg}\nlast error: {}\nits last {} calls:\n  {}",
            self.id,
            self.seed,
            last_error(),
            history.len(),
            history.join("\n  ")
        );
    }

    fn want(&self, what: &str, got: KmmStatus, allowed: &[KmmStatus]) {
        check!(self, allowed.contains(&got), "{what}: got {got:?}, expected one of {allowed:?}");
    }

    /// Records a stable allocation: no live one may overlap it; then its pattern is written.
    fn hold(&mut self, mut h: Held) {
        self.next_seed += 1;
        h.seed = self.next_seed;
        if !h.volatile && h.bytes > 0 {
            let end = h.addr + h.bytes;
            let mut ranges = self.shared.ranges.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((&start, &(other_end, owner))) = ranges.range(..end).next_back() {
                if other_end > h.addr {
                    drop(ranges);
                    self.fail(format!(
                        "{:?} allocation [{:#x}, {end:#x}) handed out while [{start:#x}, {other_end:#x}) of worker {owner} is live",
                        h.api, h.addr
                    ));
                }
            }
            ranges.insert(h.addr, (end, self.id));
            drop(ranges);
            write_pattern(h.addr, h.bytes, h.seed);
        }
        self.held.push(h);
    }

    fn verify(&self, h: &Held) {
        if !h.volatile && h.bytes > 0 {
            if let Some(off) = pattern_damage(h.addr, h.bytes, h.seed) {
                self.fail(format!("{:?} allocation of {} bytes at {:#x}: byte {off} changed behind its owner's back", h.api, h.bytes, h.addr));
            }
        }
    }

    /// Takes the allocation out of the shared ranges (before its free: once freed, its memory
    /// may go to another thread at once).
    fn release(&mut self, i: usize) -> Held {
        let h = self.held.swap_remove(i);
        self.verify(&h);
        if !h.volatile && h.bytes > 0 {
            self.shared.ranges.lock().unwrap_or_else(|p| p.into_inner()).remove(&h.addr);
        }
        h
    }

    fn size(&mut self) -> u64 {
        match self.r.below(100) {
            0..=39 => self.r.range(1, 512),
            40..=89 => self.r.range(513, 128 * KIB),
            90..=98 => self.r.range(128 * KIB, 3 * MIB),
            _ => self.r.pick(&[1 << 47, u64::MAX]),
        }
    }

    /// A manager: stable mostly, the volatile one sometimes (with whether it is).
    fn manager(&mut self) -> (KmmManager, i32, bool) {
        if self.r.pct(25) {
            (self.shared.volatile.load(SeqCst), 0, true)
        } else {
            let (m, d) = self.r.pick(&self.shared.stable);
            (m, d, false)
        }
    }

    fn stream(&mut self, m: KmmManager, device: i32, volatile: bool) -> u64 {
        match self.r.below(3) {
            0 => 0,
            1 if !volatile => stream_of(m),
            _ if device == 0 => self.shared.foreign_stream,
            _ => 0,
        }
    }

    fn step(&mut self) {
        let crowded = self.held.len() > 60;
        match self.r.below(if crowded { 50 } else { 100 }) + if crowded { 50 } else { 0 } {
            0..=19 => {
                let (m, d, volatile) = self.manager();
                let bytes = self.size();
                let kind = if self.r.pct(20) { PINNED } else { DEVICE };
                let stream = self.stream(m, d, volatile);
                let (mut buffer, mut ptr) = (0, 0);
                let s = kmm_plugin_alloc(m, bytes, kind, stream, &mut buffer, &mut ptr);
                self.note(format!("kmm_plugin_alloc({m:#x}, {bytes}, {kind}, {stream:#x}) = {s:?} {buffer:#x} {ptr:#x}"));
                let mut allowed = vec![size_errors(bytes).unwrap_or(KMM_OK)];
                if volatile {
                    allowed.push(KMM_ERROR_INVALID_HANDLE);
                }
                self.want("kmm_plugin_alloc", s, &allowed);
                if s == KMM_OK {
                    self.hold(Held { api: Api::Plugin, manager: m, buffer, addr: ptr, bytes, seed: 0, volatile });
                }
            }
            20..=34 => {
                let (m, d, volatile) = self.manager();
                let bytes = self.size();
                let stream = self.stream(m, d, volatile);
                let p = kmm_plugin_malloc(m, bytes, stream);
                let s = if p == 0 { kmm_last_status() } else { KMM_OK };
                self.note(format!("kmm_plugin_malloc({m:#x}, {bytes}, {stream:#x}) = {p:#x} {s:?}"));
                let mut allowed = vec![size_errors(bytes).unwrap_or(KMM_OK)];
                if volatile {
                    allowed.push(KMM_ERROR_INVALID_HANDLE);
                }
                self.want("kmm_plugin_malloc", s, &allowed);
                if p != 0 {
                    self.hold(Held { api: Api::Malloc, manager: m, buffer: 0, addr: p, bytes, seed: 0, volatile });
                }
            }
            35..=44 => {
                let device = self.r.below(self.shared.devices as u64) as i32;
                let bytes = self.size();
                let p = kmm_torch_malloc(bytes as usize, device, null_mut()) as u64;
                let s = if p == 0 { kmm_last_status() } else { KMM_OK };
                self.note(format!("kmm_torch_malloc({bytes}, {device}) = {p:#x} {s:?}"));
                self.want("kmm_torch_malloc", s, &[size_errors(bytes).unwrap_or(KMM_OK)]);
                if p != 0 {
                    self.hold(Held { api: Api::Torch, manager: torch_manager(device), buffer: 0, addr: p, bytes, seed: 0, volatile: false });
                }
            }
            45..=49 => {
                // Device 0: a stable manager of the walk; device 1: the volatile one (or none).
                let device = self.r.below(2) as i32;
                let bytes = self.size();
                let p = kmm_cupy_malloc(null_mut(), bytes as usize, device) as u64;
                self.note(format!("kmm_cupy_malloc({bytes}, {device}) = {p:#x}"));
                if device == 0 && size_errors(bytes).is_none() {
                    check!(self, p != 0, "kmm_cupy_malloc({bytes}) on device 0, whose manager lives: NULL");
                }
                if p != 0 {
                    let manager = if device == 0 { self.shared.stable[0].0 } else { 0 };
                    self.hold(Held { api: Api::Cupy, manager, buffer: 0, addr: p, bytes, seed: 0, volatile: device == 1 });
                }
            }
            50..=51 => {
                let (m, _) = self.r.pick(&self.shared.stable);
                let s = if self.r.pct(50) { kmm_manager_trim(m, self.r.pick(&[0, MIB])) } else { kmm_manager_synchronize(m) };
                self.note(format!("kmm_manager_trim/synchronize({m:#x}) = {s:?}"));
                self.want("kmm_manager_trim", s, &[KMM_OK]);
            }
            52..=53 => {
                let (m, _) = self.r.pick(&self.shared.stable);
                let mut st = KmmMemoryStats::default();
                let s = kmm_manager_stats(m, self.r.pick(&[DEVICE, PINNED]), &mut st);
                self.want("kmm_manager_stats", s, &[KMM_OK]);
            }
            54..=56 => {
                // A torch allocation's record_stream, or a stale handle's free.
                if let Some(i) = (0..self.held.len()).find(|&i| self.held[i].api == Api::Torch) {
                    let p = self.held[i].addr;
                    let s = kmm_torch_record_stream(p as *mut c_void, self.shared.foreign_stream as *mut c_void);
                    self.note(format!("kmm_torch_record_stream({p:#x}) = {s:?}"));
                    self.want("kmm_torch_record_stream", s, &[KMM_OK]);
                }
            }
            _ if self.held.is_empty() => {}
            _ => {
                let i = self.r.below(self.held.len() as u64) as usize;
                let h = self.release(i);
                self.free(&h);
                // A double free of a plugin buffer is refused.
                if h.api == Api::Plugin && self.r.pct(10) {
                    let s = kmm_plugin_free(h.manager, h.buffer, 0);
                    self.note(format!("second kmm_plugin_free({:#x}, {:#x}) = {s:?}", h.manager, h.buffer));
                    self.want("second kmm_plugin_free", s, &[KMM_ERROR_INVALID_HANDLE]);
                }
            }
        }
        // A few of its own allocations checked each step.
        for _ in 0..2.min(self.held.len()) {
            let i = self.r.below(self.held.len() as u64) as usize;
            self.verify(&self.held[i]);
        }
    }

    fn free(&mut self, h: &Held) {
        // The volatile manager may be gone: then its handles are dead.
        let allowed: &[KmmStatus] = if h.volatile { &[KMM_OK, KMM_ERROR_INVALID_HANDLE] } else { &[KMM_OK] };
        match h.api {
            Api::Plugin => {
                let s = kmm_plugin_free(h.manager, h.buffer, 0);
                self.note(format!("kmm_plugin_free({:#x}, {:#x}) = {s:?}", h.manager, h.buffer));
                self.want("kmm_plugin_free", s, allowed);
            }
            Api::Malloc => {
                let s = kmm_plugin_free_address(h.manager, h.addr, 0);
                self.note(format!("kmm_plugin_free_address({:#x}, {:#x}) = {s:?}", h.manager, h.addr));
                self.want("kmm_plugin_free_address", s, allowed);
            }
            Api::Torch => {
                kmm_torch_free(h.addr as *mut c_void, h.bytes as usize, 0, null_mut());
                self.note(format!("kmm_torch_free({:#x})", h.addr));
            }
            Api::Cupy => {
                kmm_cupy_free(null_mut(), h.addr as *mut c_void, 0);
                self.note(format!("kmm_cupy_free({:#x})", h.addr));
            }
        }
    }

    fn run(mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
        }
        while !self.held.is_empty() {
            let h = self.release(self.held.len() - 1);
            self.free(&h);
        }
    }
}

/// The fifth thread: makes a manager, lends it to the workers and to CuPy's device 1, then
/// destroys it (mostly after CuPy forgets it, as the header asks), over and over.
fn destroyer(shared: Arc<Shared>, seed: u64) -> u64 {
    let mut r = Rng::new(seed);
    let mut rounds = 0;
    while !shared.stop.load(SeqCst) {
        let device = r.below(shared.devices as u64) as i32;
        let m = create_manager(device, |c| c.chunk_size = r.pick(&[MIB, 8 * MIB]));
        ok(kmm_cupy_set_manager(1, m));
        let old = shared.volatile.swap(m, SeqCst);
        std::thread::sleep(Duration::from_micros(r.range(100, 3000)));
        if r.pct(90) {
            ok(kmm_cupy_set_manager(1, 0));
        }
        ok(kmm_manager_destroy(old, if r.pct(50) { KMM_DESTROY_DEFERRED } else { 0 }));
        rounds += 1;
    }
    ok(kmm_cupy_set_manager(1, 0));
    ok(kmm_manager_destroy(shared.volatile.load(SeqCst), 0));
    rounds
}

#[test]
fn threads_share_managers() {
    const WORKERS: usize = 4;
    let _serial = serial();
    if gpu() {
        eprintln!("plugin_model: host backend only (device addresses are read directly); skipped");
        return;
    }
    let steps = env_u64("KMM_PLUGIN_MT_STEPS", 20000) as usize;
    let seed = env_u64("KMM_PLUGIN_MT_SEED", 1);
    let devices = host_devices().min(2);
    let torch: Vec<(KmmManager, i32)> = (0..devices).map(|d| (torch_manager(d), d)).collect();
    let before = live_managers();
    let mut stable: Vec<(KmmManager, i32)> = (0..2).map(|i| (create_manager(i % devices, |_| {}), i % devices)).collect();
    stable.extend(torch.iter().copied());
    let foreign = create_manager(0, |_| {});
    // Baselines: PyTorch's managers outlive the test.
    let base: Vec<[(u64, u64); 2]> = stable
        .iter()
        .map(|&(m, _)| {
            [DEVICE, PINNED].map(|k| {
                let s = stats_of(m, k);
                (s.live_buffers, s.in_use)
            })
        })
        .collect();
    let (torch_base, cupy_base) = (torch_live(), cupy_live());
    ok(kmm_cupy_set_manager(0, stable[0].0));
    let first_volatile = create_manager(0, |_| {});
    let shared = Arc::new(Shared {
        stable: stable.clone(),
        volatile: AtomicU64::new(first_volatile),
        foreign_stream: stream_of(foreign),
        devices,
        ranges: Mutex::new(BTreeMap::new()),
        stop: AtomicBool::new(false),
    });
    let started = Instant::now();
    let sh = shared.clone();
    let rounds = within(90, "threads sharing managers", move || {
        let d = {
            let sh = sh.clone();
            std::thread::spawn(move || destroyer(sh, seed ^ 0xDE57))
        };
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let sh = sh.clone();
                let seed = seed * 16 + id as u64;
                std::thread::spawn(move || {
                    let w = Worker { id, seed, r: Rng::new(seed), shared: sh, held: Vec::new(), history: VecDeque::new(), next_seed: seed << 40 };
                    w.run(steps)
                })
            })
            .collect();
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        sh.stop.store(true, SeqCst);
        let rounds = d.join();
        for r in results {
            r.unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
        rounds.unwrap_or_else(|p| std::panic::resume_unwind(p))
    });
    // Everything was freed: nothing may be left live, in the libraries' tables or the managers.
    assert_eq!(shared.ranges.lock().expect("ranges").len(), 0);
    assert_eq!((torch_live(), cupy_live()), (torch_base, cupy_base), "torch and cupy allocations left live");
    for (i, &(m, _)) in stable.iter().enumerate() {
        for (k, kind) in [DEVICE, PINNED].into_iter().enumerate() {
            let s = stats_of(m, kind);
            assert_eq!((s.live_buffers, s.in_use), base[i][k], "manager {m:#x} kind {kind}: live buffers and bytes in use after all was freed");
        }
    }
    ok(kmm_cupy_set_manager(0, 0));
    for &(m, _) in &stable[..2] {
        ok(kmm_manager_destroy(m, 0));
    }
    ok(kmm_manager_destroy(foreign, 0));
    let n = await_live_managers(before);
    assert_eq!(n, before, "managers alive after the test");
    eprintln!("plugin_model threads: {WORKERS} x {steps} steps, {rounds} manager lifetimes, in {:.1} s", started.elapsed().as_secs_f64());
}
