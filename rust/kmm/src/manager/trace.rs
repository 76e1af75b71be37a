//! A manager's allocation trace: off by default; once started, every allocation, free, map,
//! unmap, move, trim and failed allocation becomes one record, in a bounded ring (the default)
//! or a CSV file written as the events happen. A record is made under the lock of the lane whose
//! state the event changed, so for each address the records come in the order the events
//! happened; records of one trace are ordered by one lock, and their times come from inside it.
//! With the trace off an event costs one test of a field its lane already holds.

use super::csv;
use super::MemoryKind;
use crate::error::Result;
use crate::fail;
use crate::pool::limit::Limit;
use crate::pool::stats::Gauge;
use parking_lot::Mutex;
use std::ffi::CStr;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::time::Instant;

/// What a record says happened. The first three are RMM's actions (its logging adaptor's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    Allocate = 0,
    Free = 1,
    /// An allocation the caller saw fail (out of memory after every rung, or a bad request).
    AllocateFailure = 2,
    Map = 3,
    Unmap = 4,
    /// Compaction moved an unmapped buffer: `address` is its new place, `from` the old one.
    Move = 5,
    /// A free chunk went back to the device (or the host's pinned memory).
    Trim = 6,
    /// Memory allocated elsewhere became a buffer (`kmm_buffer_wrap`).
    Wrap = 7,
}

impl Action {
    pub const ALL: [Action; 8] = [
        Action::Allocate,
        Action::Free,
        Action::AllocateFailure,
        Action::Map,
        Action::Unmap,
        Action::Move,
        Action::Trim,
        Action::Wrap,
    ];

    /// The name in the CSV's Action column.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("the names are ASCII")
    }

    pub fn c_name(self) -> &'static CStr {
        match self {
            Action::Allocate => c"allocate",
            Action::Free => c"free",
            Action::AllocateFailure => c"allocate failure",
            Action::Map => c"map",
            Action::Unmap => c"unmap",
            Action::Move => c"move",
            Action::Trim => c"trim",
            Action::Wrap => c"wrap",
        }
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn from_u32(v: u32) -> Option<Action> {
        Action::ALL.get(v as usize).copied()
    }
}

/// One event. `extra` of `Tracer::record` is a move's old address and a failure's status.
/// `bytes` is what the caller asked for (allocate, free, map, unmap, wrap, failure),
/// the bytes moved (move) or the chunk's size (trim); `in_use` and `reserved` are the manager's
/// figures for `kind` just after the event (other threads' events of that moment may be in
/// them); `reserved` is `u64::MAX` where the manager does not count it (CUDA's own pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    /// Nanoseconds since the trace started.
    pub time_ns: u64,
    /// The operating system's id of the calling thread.
    pub thread: u64,
    pub action: u32,
    pub kind: u32,
    pub address: u64,
    pub bytes: u64,
    pub stream: u64,
    /// The buffer's handle (0 for a trim, and for a failed allocation).
    pub buffer: u64,
    /// A move's old address (else 0).
    pub moved_from: u64,
    /// A failed allocation's `KmmStatus` (else 0).
    pub status: u32,
    pub in_use: u64,
    pub reserved: u64,
}

/// Where records go.
pub enum Sink {
    /// The last `capacity` records; older ones are dropped (and counted).
    Ring { capacity: usize },
    /// A CSV file written as events happen (see `csv`).
    File { path: std::path::PathBuf, rmm_only: bool },
}

enum Store {
    Ring { records: Vec<Record>, next: usize, capacity: usize },
    File { out: BufWriter<File>, writer: csv::Writer, failed: Option<String> },
}

/// A started trace; lanes hold it while it records.
pub struct Tracer {
    clock: Clock,
    store: Mutex<(Store, TraceCounts)>,
    in_use: Arc<[Gauge; 2]>,
    limits: [Arc<Limit>; 2],
    /// Device memory comes from CUDA's pool, which counts its own reservation.
    device_reserve_uncounted: bool,
}

/// How many records a trace made and dropped (ring overflow).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TraceCounts {
    pub recorded: u64,
    pub dropped: u64,
}

impl Tracer {
    pub(super) fn start(
        sink: Sink,
        in_use: Arc<[Gauge; 2]>,
        limits: [Arc<Limit>; 2],
        device_reserve_uncounted: bool,
    ) -> Result<Tracer> {
        let store = match sink {
            Sink::Ring { capacity } => {
                if capacity == 0 || capacity > MAX_RING_RECORDS {
                    fail!(KMM_ERROR_INVALID_ARGUMENT, "capacity = {capacity} records must be in 1..={MAX_RING_RECORDS}");
                }
                Store::Ring { records: Vec::with_capacity(capacity.min(1 << 16)), next: 0, capacity }
            }
            Sink::File { path, rmm_only } => {
                let file = File::create(&path)
                    .map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: cannot create the trace file: {e}", path.display()))?;
                let mut out = BufWriter::new(file);
                let writer = csv::Writer::new(rmm_only);
                writer
                    .header(&mut out)
                    .map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: cannot write the trace file: {e}", path.display()))?;
                Store::File { out, writer, failed: None }
            }
        };
        Ok(Tracer {
            clock: Clock::start(),
            store: Mutex::new((store, TraceCounts::default())),
            in_use,
            limits,
            device_reserve_uncounted,
        })
    }

    /// Adds one record; its time, and the manager's figures, are read under the trace's lock.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(&self, action: Action, kind: MemoryKind, address: u64, bytes: u64, stream: u64, buffer: u64, extra: u64) {
        let k = kind as usize;
        let thread = thread_id();
        let mut guard = self.store.lock();
        let (store, counts) = &mut *guard;
        let reserved = if k == 0 && self.device_reserve_uncounted { u64::MAX } else { self.limits[k].used().current() };
        let record = Record {
            time_ns: self.clock.elapsed_ns(),
            thread,
            action: action as u32,
            kind: k as u32,
            address,
            bytes,
            stream,
            buffer,
            moved_from: if action == Action::Move { extra } else { 0 },
            status: if action == Action::AllocateFailure { extra as u32 } else { 0 },
            in_use: self.in_use[k].current(),
            reserved,
        };
        counts.recorded += 1;
        match store {
            Store::Ring { records, next, capacity } => {
                if records.len() < *capacity {
                    records.push(record);
                } else {
                    records[*next] = record;
                    counts.dropped += 1;
                }
                // A compare, not a division: this runs on every traced operation.
                *next += 1;
                if *next == *capacity {
                    *next = 0;
                }
            }
            Store::File { out, writer, failed } => {
                if failed.is_none() {
                    if let Err(e) = writer.row(out, &record) {
                        *failed = Some(e.to_string());
                    }
                }
            }
        }
    }

    /// The ring's records, oldest first (none for a file trace), and the counts.
    pub fn records(&self) -> (Vec<Record>, TraceCounts) {
        let guard = self.store.lock();
        let (store, counts) = &*guard;
        let records = match store {
            Store::Ring { records, next, capacity } if records.len() == *capacity => {
                let mut v = records[*next..].to_vec();
                v.extend_from_slice(&records[..*next]);
                v
            }
            Store::Ring { records, .. } => records.clone(),
            Store::File { .. } => Vec::new(),
        };
        (records, *counts)
    }

    /// Flushes a file trace; the first write error, if any, names the file's problem.
    pub(super) fn finish(&self) -> Result<()> {
        let mut guard = self.store.lock();
        if let Store::File { out, failed, .. } = &mut guard.0 {
            if let Err(e) = out.flush() {
                failed.get_or_insert(e.to_string());
            }
            if let Some(e) = failed.take() {
                fail!(KMM_ERROR_INTERNAL, "writing the trace file failed: {e}");
            }
        }
        Ok(())
    }

    pub fn is_ring(&self) -> bool {
        matches!(self.store.lock().0, Store::Ring { .. })
    }
}

/// Time since a trace started. Where the processor's time-stamp counter runs at one rate on
/// every core whatever the power state (Linux on x86-64 with `constant_tsc` and `nonstop_tsc`),
/// it is read directly: a read costs a third of the system clock's (11 ns against 30 ns on the
/// build machine), and a traced operation reads it once.
struct Clock {
    start: Instant,
    tsc: Option<(u64, f64)>,
}

impl Clock {
    fn start() -> Clock {
        let tsc = tsc_rate().map(|ns_per_tick| (read_tsc(), ns_per_tick));
        Clock { start: Instant::now(), tsc }
    }

    fn elapsed_ns(&self) -> u64 {
        match self.tsc {
            Some((start, ns_per_tick)) => (read_tsc().wrapping_sub(start) as f64 * ns_per_tick) as u64,
            None => self.start.elapsed().as_nanos() as u64,
        }
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    // SAFETY: rdtsc reads a counter; it has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn read_tsc() -> u64 {
    0
}

/// Nanoseconds per tick of an invariant time-stamp counter, measured once per process against
/// the system clock over 5 ms; `None` where there is no such counter.
fn tsc_rate() -> Option<f64> {
    static RATE: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            return None;
        }
        let flags = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let flags = flags.lines().find(|l| l.starts_with("flags"))?;
        let has = |f: &str| flags.split_whitespace().any(|w| w == f);
        if !(has("constant_tsc") && has("nonstop_tsc")) {
            return None;
        }
        let (t0, c0) = (Instant::now(), read_tsc());
        while t0.elapsed() < std::time::Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        let (ns, ticks) = (t0.elapsed().as_nanos() as f64, read_tsc().wrapping_sub(c0) as f64);
        (ticks > 0.0).then(|| ns / ticks)
    })
}

/// The largest ring a trace may keep (each record is 96 bytes: 2^24 records are 1.5 GiB).
pub(crate) const MAX_RING_RECORDS: usize = 1 << 24;

/// The calling thread's id as the operating system knows it (what profilers and RMM's logs show).
fn thread_id() -> u64 {
    thread_local! {
        static ID: u64 = os_thread_id();
    }
    ID.with(|id| *id)
}

#[cfg(target_os = "linux")]
fn os_thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

#[cfg(not(target_os = "linux"))]
fn os_thread_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
