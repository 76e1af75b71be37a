//! `replay TRACE.csv [--host] [--repeat N]`: replays an allocation trace (Kmm's CSV, either
//! form, or a log of RMM's logging adaptor) through Kmm's allocation modes and through CUDA's
//! own allocators, `cuMemAllocAsync` and `cuMemAlloc`, in one run, and prints time per
//! operation and peak reserved against the trace's peak in use, so a user can pick a policy for
//! their own workload. Device rows only; one thread, in the trace's row order.

use cudarc::driver::sys;
use kmm::ffi::buffer::*;
use kmm::ffi::manager::*;
use kmm::ffi::types::*;
use kmm::KmmStatus;
use kmm_bench::replay::{plan, run, Allocator, Plan, Step};

const DEVICE: u32 = KmmMemoryKind::KMM_MEMORY_DEVICE as u32;

fn check(s: KmmStatus) -> Result<(), String> {
    if s == KmmStatus::KMM_OK {
        return Ok(());
    }
    let msg = unsafe { std::ffi::CStr::from_ptr(kmm::ffi::kmm_last_error()) };
    Err(format!("{s:?}: {}", msg.to_string_lossy()))
}

struct Kmm(KmmManager);
impl Allocator for Kmm {
    fn alloc(&mut self, bytes: u64) -> Result<u64, String> {
        let mut b = 0;
        check(kmm_buffer_alloc(self.0, bytes, DEVICE, &mut b)).map(|_| b)
    }
    fn free(&mut self, h: u64) {
        check(kmm_buffer_free(self.0, h, 0)).expect("a replayed free");
    }
    /// As `cuMemAllocAsync`'s: the run ends when its frees are done. Without it, direct mode's
    /// frees (stream-ordered) of one run were still pending when the next run allocated, and
    /// the peak reserved grew with `--repeat`.
    fn finish(&mut self) {
        check(kmm_manager_synchronize(self.0)).expect("a replayed run's synchronize");
    }
}

/// CUDA's stream-ordered allocator on the device's default pool, kept whole between runs.
struct CudaAsync(sys::CUstream);
impl Allocator for CudaAsync {
    fn alloc(&mut self, bytes: u64) -> Result<u64, String> {
        let mut p = 0;
        // CUDA refuses zero bytes; a zero-byte buffer holds nothing.
        if bytes == 0 {
            return Ok(0);
        }
        match unsafe { sys::cuMemAllocAsync(&mut p, bytes as usize, self.0) } {
            sys::CUresult::CUDA_SUCCESS => Ok(p),
            e => Err(format!("{e:?}")),
        }
    }
    fn free(&mut self, h: u64) {
        if h != 0 {
            unsafe { sys::cuMemFreeAsync(h, self.0) };
        }
    }
    fn finish(&mut self) {
        unsafe { sys::cuStreamSynchronize(self.0) };
    }
}

struct CudaDirect;
impl Allocator for CudaDirect {
    fn alloc(&mut self, bytes: u64) -> Result<u64, String> {
        let mut p = 0;
        if bytes == 0 {
            return Ok(0);
        }
        match unsafe { sys::cuMemAlloc_v2(&mut p, bytes as usize) } {
            sys::CUresult::CUDA_SUCCESS => Ok(p),
            e => Err(format!("{e:?}")),
        }
    }
    fn free(&mut self, h: u64) {
        if h != 0 {
            unsafe { sys::cuMemFree_v2(h) };
        }
    }
}

/// The device memory `cuMemAlloc` holds when the plan's bytes in use peak (one untimed replay;
/// the device's free memory is read at each new high of the bytes in use).
unsafe fn direct_peak_reserved(plan: &Plan) -> u64 {
    let free_now = || {
        let (mut free, mut total) = (0usize, 0usize);
        sys::cuMemGetInfo_v2(&mut free, &mut total);
        free as u64
    };
    let before = free_now();
    let mut slots = vec![(0u64, 0u64); plan.slots];
    let (mut in_use, mut high, mut peak) = (0u64, 0u64, 0u64);
    for step in &plan.steps {
        match *step {
            Step::Alloc { bytes, slot } => {
                let Ok(p) = CudaDirect.alloc(bytes) else { break };
                slots[slot] = (p, bytes);
                in_use += bytes;
                if in_use > high {
                    high = in_use;
                    peak = peak.max(before.saturating_sub(free_now()));
                }
            }
            Step::Free { slot } => {
                let (p, bytes) = std::mem::take(&mut slots[slot]);
                CudaDirect.free(p);
                in_use -= bytes;
            }
        }
    }
    for (p, _) in slots {
        CudaDirect.free(p);
    }
    peak
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The median of `repeat` runs after one warm-up run.
fn timed(plan: &Plan, a: &mut dyn Allocator, repeat: usize) -> Result<f64, String> {
    run(plan, a)?;
    Ok(median((0..repeat).map(|_| run(plan, a)).collect::<Result<Vec<_>, _>>()?))
}

fn gib(bytes: u64) -> String {
    kmm::manager::human_bytes(bytes)
}

/// The command line: one trace file, `--host`, `--repeat N`.
struct Args {
    /// As the OS gave it: a file name need not be UTF-8 (a trace's path need not be).
    path: std::ffi::OsString,
    host: bool,
    repeat: usize,
}

const USAGE: &str = "usage: replay TRACE.csv [--host] [--repeat N]";

/// Parses the command line; anything it does not know is an error naming it.
fn parse_args(args: &[std::ffi::OsString]) -> Result<Args, String> {
    let (mut path, mut host, mut repeat) = (None::<std::ffi::OsString>, false, 5usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        // What is not UTF-8 can only be a path.
        match a.to_str().unwrap_or("") {
            "--host" => host = true,
            "--repeat" => {
                let v = it.next().ok_or("--repeat needs a number")?.to_string_lossy();
                repeat = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| format!("--repeat {v}: the number of timed runs must be an integer in 1..=1000"))?;
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            _ => match &path {
                None => path = Some(a.clone()),
                Some(first) => return Err(format!("one trace at a time: {} after {}", a.to_string_lossy(), first.to_string_lossy())),
            },
        }
    }
    Ok(Args { path: path.ok_or("no trace file given")?, host, repeat })
}

fn main() {
    // A reader that stops early (`replay t.csv | head`) ends the program as it ends `cat`, not
    // with a panic at the next println.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Args { path, host, repeat } = parse_args(&args).unwrap_or_else(|e| {
        eprintln!("replay: {e}\n{USAGE}");
        std::process::exit(2);
    });
    let text = std::fs::read_to_string(&path);
    let path = path.to_string_lossy();
    let fail = |what: String| -> ! {
        eprintln!("replay: {path}: {what}");
        std::process::exit(1);
    };
    let text = text.unwrap_or_else(|e| fail(e.to_string()));
    let records = kmm::manager::csv::read(&text).unwrap_or_else(|e| fail(e.message));
    let plan = plan(&records).unwrap_or_else(|e| fail(e));
    let cuda = !host
        && unsafe { sys::is_culib_present() }
        && unsafe { sys::cuInit(0) } == sys::CUresult::CUDA_SUCCESS;
    println!(
        "# replay of {path}: {} allocations, {} frees ({} frees of older buffers and {} failed allocations skipped; {} of the allocations wrapped memory allocated elsewhere), peak in use {}",
        plan.allocs,
        plan.frees,
        plan.unmatched_frees,
        plan.failures,
        plan.wraps,
        gib(plan.peak_in_use)
    );
    println!("| allocator | ns per operation | peak reserved | peak reserved / peak in use |\n|---|---|---|---|");
    let backend = if cuda { KmmBackend::KMM_BACKEND_CUDA } else { KmmBackend::KMM_BACKEND_HOST } as u32;
    let modes: [(&str, u32, Option<u32>); 4] = [
        ("Kmm pool, binned (default)", KmmAllocMode::KMM_ALLOC_POOL as u32, None),
        ("Kmm pool, heap", KmmAllocMode::KMM_ALLOC_POOL as u32, Some(KmmSuballocator::KMM_SUBALLOC_HEAP as u32)),
        ("Kmm cuda_async", KmmAllocMode::KMM_ALLOC_CUDA_ASYNC as u32, None),
        ("Kmm direct", KmmAllocMode::KMM_ALLOC_DIRECT as u32, None),
    ];
    for (name, mode, sub) in modes {
        if mode == KmmAllocMode::KMM_ALLOC_CUDA_ASYNC as u32 && !cuda {
            continue;
        }
        let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
        check(kmm_config_default(&mut c)).unwrap();
        c.backend = backend;
        c.alloc_mode = mode;
        if let Some(s) = sub {
            c.suballocator = s;
        }
        let mut m = 0;
        check(kmm_manager_create(&c, &mut m)).unwrap();
        let result = timed(&plan, &mut Kmm(m), repeat);
        let mut s = KmmMemoryStats::default();
        check(kmm_manager_stats(m, DEVICE, &mut s)).unwrap();
        check(kmm_manager_destroy(m, 0)).unwrap();
        match result {
            Ok(ns) => println!(
                "| {name} | {ns:.1} | {} | {:.3} |",
                gib(s.peak_reserved),
                s.peak_reserved as f64 / plan.peak_in_use.max(1) as f64
            ),
            Err(e) => println!("| {name} | failed: {} | | |", e.lines().next().unwrap_or("")),
        }
    }
    if !cuda {
        return;
    }
    unsafe {
        let mut dev = 0;
        sys::cuDeviceGet(&mut dev, 0);
        let mut ctx = std::ptr::null_mut();
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev);
        sys::cuCtxSetCurrent(ctx);
        let mut stream = std::ptr::null_mut();
        sys::cuStreamCreate(&mut stream, 1);
        let mut pool = std::ptr::null_mut();
        sys::cuDeviceGetDefaultMemPool(&mut pool, dev);
        let mut max = u64::MAX;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        sys::cuMemPoolSetAttribute(pool, attr, &mut max as *mut u64 as *mut _);
        let mut zero = 0u64;
        let high = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
        sys::cuMemPoolSetAttribute(pool, high, &mut zero as *mut u64 as *mut _);
        let ns = timed(&plan, &mut CudaAsync(stream), repeat);
        let mut peak = 0u64;
        sys::cuMemPoolGetAttribute(pool, high, &mut peak as *mut u64 as *mut _);
        match ns {
            Ok(ns) => println!("| cuMemAllocAsync | {ns:.1} | {} | {:.3} |", gib(peak), peak as f64 / plan.peak_in_use.max(1) as f64),
            Err(e) => println!("| cuMemAllocAsync | failed: {} | | |", e.lines().next().unwrap_or("")),
        }
        // cuMemAlloc reserves what it hands out, rounded to the driver's granularity: its peak
        // is what the device's free memory fell by when the replay's bytes in use peaked.
        match timed(&plan, &mut CudaDirect, repeat.min(1)) {
            Ok(ns) => {
                let peak = direct_peak_reserved(&plan);
                println!("| cuMemAlloc | {ns:.1} | {} | {:.3} |", gib(peak), peak as f64 / plan.peak_in_use.max(1) as f64);
            }
            Err(e) => println!("| cuMemAlloc | failed: {e} | | |"),
        }
    }
}
