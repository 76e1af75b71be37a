//! A manager's allocation trace: off by default; once started, every allocation, free, map,
//! unmap, move, trim and failed allocation becomes one record, in bounded rings (the default)
//! or a CSV file written as the events happen. A record is made under the lock of the lane whose
//! state the event changed, with a time from one clock for all threads: for each address the
//! records come in the order the events happened, and reading merges the lanes' rings by time.
//! With the trace off an event costs one test of a field its lane already holds.

use super::csv;
use super::MemoryKind;
use crate::error::Result;
use crate::fail;
use crate::pool::limit::Limit;
use crate::pool::lane_gauge::LaneGauge;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::mem::MaybeUninit;
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
    /// A buffer went to host memory: `address` is the device place it left, `from` the host one.
    Spill = 8,
    /// A spilled buffer came back: `address` is its new device place, `from` the host one.
    Restore = 9,
}

impl Action {
    const ALL: [Action; 10] = [
        Action::Allocate,
        Action::Free,
        Action::AllocateFailure,
        Action::Map,
        Action::Unmap,
        Action::Move,
        Action::Trim,
        Action::Wrap,
        Action::Spill,
        Action::Restore,
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
            Action::Spill => c"spill",
            Action::Restore => c"restore",
        }
    }

    /// Whether the action moves a buffer's bytes (on the manager's stream), from an old place.
    pub fn moves(self) -> bool {
        matches!(self, Action::Move | Action::Spill | Action::Restore)
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
    /// A move's old address, a spill's or restore's host address (else 0).
    pub moved_from: u64,
    /// A failed allocation's `KmmStatus` (else 0).
    pub status: u32,
    pub in_use: u64,
    pub reserved: u64,
}

/// A record as a ring keeps it: one cache line (a traced operation writes one line, not two).
/// The time is the clock's raw reading; a move's old address takes the stream's place (a move
/// is always on the manager's stream).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
struct Entry {
    ticks: u64,
    thread: u32,
    action: u8,
    kind: u8,
    status: u16,
    address: u64,
    bytes: u64,
    stream_or_moved_from: u64,
    buffer: u64,
    in_use: u64,
    reserved: u64,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 64);

/// Where records go.
pub enum Sink {
    /// A ring per lane (and one for the manager's own events), each keeping its last `capacity`
    /// records; older ones are dropped (and counted).
    Ring { capacity: usize },
    /// A CSV file written as events happen (see `csv`).
    File { path: std::path::PathBuf, rmm_only: bool },
}

/// The last records of one lane (or of the manager's own events).
pub(super) struct Ring {
    /// Room for every record the ring keeps, allocated once when the trace starts: a record
    /// is one store, with no test of a length and no reallocation midway through a run (the
    /// pages are touched as records arrive).
    slots: Box<[MaybeUninit<Entry>]>,
    /// Where the next record goes; once the ring is full, also its oldest record.
    next: usize,
    recorded: u64,
}

/// How many slots ahead of the next record `Ring::push` prefetches for writing. A record
/// writes a cache line that no recent operation touched, and a lane's lock, released right
/// after, waits for that store: fetched a few operations early, the line is in the cache by
/// then (about 4 ns of a traced operation on an H200 host).
const PREFETCH_AHEAD: usize = 4;

impl Ring {
    /// A ring for `capacity` records; out of memory where the process cannot reserve them.
    fn new(capacity: usize) -> Result<Ring> {
        let mut slots = Vec::new();
        if slots.try_reserve_exact(capacity).is_err() {
            let bytes = capacity as u64 * std::mem::size_of::<Entry>() as u64;
            fail!(KMM_ERROR_OUT_OF_MEMORY, "capacity = {capacity} records: cannot reserve {bytes} bytes of host memory for a ring");
        }
        // SAFETY: the room is reserved, and uninitialised slots are valid `MaybeUninit`s (no
        // slot is written here: the pages stay untouched until records arrive).
        unsafe { slots.set_len(capacity) };
        Ok(Ring { slots: slots.into_boxed_slice(), next: 0, recorded: 0 })
    }

    #[inline(always)]
    fn push(&mut self, record: Entry) {
        let capacity = self.slots.len();
        self.slots[self.next].write(record);
        self.recorded += 1;
        // A compare, not a division: this runs on every traced operation.
        self.next += 1;
        if self.next == capacity {
            self.next = 0;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let mut ahead = self.next + PREFETCH_AHEAD;
            if ahead >= capacity {
                ahead -= capacity;
            }
            if ahead < capacity {
                // (not so only in a ring of fewer than PREFETCH_AHEAD slots)
                // SAFETY: a slot of the ring; a prefetch changes no memory and cannot fault.
                unsafe {
                    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
                    _mm_prefetch::<_MM_HINT_ET0>(self.slots.as_ptr().add(ahead).cast());
                }
            }
        }
    }

    /// The records the ring holds, in slot order.
    fn filled(&self) -> &[Entry] {
        let len = self.recorded.min(self.slots.len() as u64) as usize;
        // SAFETY: slots 0..len have been written (records fill the ring from slot 0 before it
        // wraps), and MaybeUninit<Entry> has Entry's layout.
        unsafe { std::slice::from_raw_parts(self.slots.as_ptr().cast::<Entry>(), len) }
    }

    fn counts(&self) -> TraceCounts {
        TraceCounts { recorded: self.recorded, dropped: self.recorded - self.filled().len() as u64 }
    }

    fn tally(&self, tally: &mut (usize, TraceCounts)) {
        let counts = self.counts();
        tally.0 += (counts.recorded - counts.dropped) as usize;
        tally.1.recorded += counts.recorded;
        tally.1.dropped += counts.dropped;
    }

    /// Adds its records, oldest first, to `out` (as one more ring) and its counts to `counts`.
    fn collect(&self, tracer: &Tracer, out: &mut Vec<Vec<Record>>, counts: &mut TraceCounts) {
        let records = self.filled();
        // A full ring's oldest record is where the next one goes.
        let start = if records.len() == self.slots.len() { self.next } else { 0 };
        let (newer, older) = records.split_at(start);
        out.push(older.iter().chain(newer).map(|e| tracer.record_of(e)).collect());
        let own = self.counts();
        counts.recorded += own.recorded;
        counts.dropped += own.dropped;
    }
}

struct FileStore {
    out: BufWriter<File>,
    path: std::path::PathBuf,
    /// The file's device and inode: whether two traces write one file (by any path).
    id: Option<(u64, u64)>,
    writer: csv::Writer,
    failed: Option<String>,
    /// Set when the trace stops: a record made by a call still holding the trace is dropped,
    /// so nothing is written after the stop has flushed the file.
    closed: bool,
    /// Whether this trace counts in `files_in_use` (see `Tracer::claim_file`).
    claimed: bool,
}

/// The files file traces write, by device and inode, with how many traces hold each: traces of
/// two managers writing one file would overwrite each other's rows.
fn files_in_use() -> &'static Mutex<HashMap<(u64, u64), usize>> {
    static FILES: std::sync::OnceLock<Mutex<HashMap<(u64, u64), usize>>> = std::sync::OnceLock::new();
    FILES.get_or_init(Default::default)
}

/// A regular file's device and inode (others, like `/dev/null` or a pipe, may be written by
/// any number of traces: no rows can be overwritten there).
fn file_id(file: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().filter(|m| m.is_file()).map(|m| (m.dev(), m.ino()))
}

/// Refuses `path` while a file trace writes it (for a save, which empties the file it writes).
pub fn check_not_traced(path: &std::path::Path) -> Result<()> {
    if let Ok(file) = File::open(path) {
        if file_id(&file).is_some_and(|id| files_in_use().lock().contains_key(&id)) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: a recording trace writes this file (stop it first, or save into another file)", path.display());
        }
    }
    Ok(())
}

impl FileStore {
    /// Writes the rows held in memory; the first error is kept for the stop to report.
    fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            self.failed.get_or_insert(e.to_string());
        }
    }
}

impl FileStore {
    /// Stops counting the file as written by this trace (once: at the stop, or at the drop of a
    /// trace that never stopped).
    fn release_claim(&mut self) {
        if let (true, Some(id)) = (std::mem::take(&mut self.claimed), self.id) {
            let mut files = files_in_use().lock();
            if let Some(n) = files.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    files.remove(&id);
                }
            }
        }
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        self.release_claim();
    }
}

/// A started trace, shared by the manager's lanes. A ring trace gives each lane a ring of its
/// own (`LaneTrace`), written under the lane's lock: threads that share a manager record in
/// parallel, and a record takes no lock of its own. A file trace writes under one lock.
pub struct Tracer {
    clock: Clock,
    capacity: usize,
    file: Option<Mutex<FileStore>>,
    /// The manager's own events (trims, failed allocations), and the rings of lanes the trace
    /// stopped recording in.
    kept: Mutex<(Ring, Vec<Ring>)>,
    in_use: Arc<[LaneGauge; 2]>,
    limits: [Arc<Limit>; 2],
    /// What the pinned limit counts beyond the pools' chunks (the spill store's), left out of
    /// the pinned `reserved`.
    spill_pinned: Arc<Limit>,
    /// Device memory comes from CUDA's pool, which counts its own reservation.
    device_reserve_uncounted: bool,
    /// The manager's raw stream (a move's).
    home: u64,
}

/// How many records a trace made and dropped (ring overflow).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TraceCounts {
    pub recorded: u64,
    pub dropped: u64,
}

/// One event as the recording calls pass it on: `extra` is the moved-from address of a move,
/// spill or restore, and the status of a failed allocation.
#[derive(Debug, Clone, Copy)]
pub(super) struct TracedEvent {
    pub action: Action,
    pub kind: MemoryKind,
    pub address: u64,
    pub bytes: u64,
    pub stream: u64,
    pub buffer: u64,
    pub extra: u64,
}

/// What a lane holds while a trace records: the trace, and the lane's ring (a ring trace).
pub(super) struct LaneTrace {
    tracer: Arc<Tracer>,
    ring: Option<Ring>,
}

impl LaneTrace {
    pub(super) fn new(tracer: &Arc<Tracer>) -> Result<LaneTrace> {
        let ring = match tracer.file {
            None => Some(Ring::new(tracer.capacity)?),
            Some(_) => None,
        };
        Ok(LaneTrace { tracer: tracer.clone(), ring })
    }

    /// Adds a record of an event of this lane (its lock is held) that changed no bytes in use.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn record(&mut self, action: Action, kind: MemoryKind, address: u64, bytes: u64, stream: u64, buffer: u64, extra: u64) {
        self.record_after(|| None, TracedEvent { action, kind, address, bytes, stream, buffer, extra })
    }

    /// Makes `change` of the manager's bytes in use (it returns the figure after it) and records
    /// the event with that figure. A file trace holds its lock across both: rows come in the
    /// order of the changes, so each row's figure is the sum of the rows before it and a replay
    /// of the file meets the run's peak (lanes changing the figure at once wrote their rows in
    /// another order, 3% under the peak with six threads).
    #[inline(always)]
    pub(super) fn record_after(&mut self, change: impl FnOnce() -> Option<u64>, event: TracedEvent) {
        match &mut self.ring {
            Some(ring) => {
                let in_use = change();
                ring.push(self.tracer.make(in_use, event))
            }
            None => self.tracer.record_after(change, event),
        }
    }

    /// Ends the lane's part in the trace; its ring stays readable with the trace.
    pub(super) fn stop(self) {
        if let Some(ring) = self.ring {
            self.tracer.kept.lock().1.push(ring);
        }
    }

    /// Adds the records its ring holds and its counts (none for a file trace) to `tally`.
    pub(super) fn tally(&self, tally: &mut (usize, TraceCounts)) {
        if let Some(r) = &self.ring {
            r.tally(tally);
        }
    }

    /// Adds the lane's ring, if it has one (see `Ring::collect`).
    pub(super) fn collect(&self, out: &mut Vec<Vec<Record>>, counts: &mut TraceCounts) {
        if let Some(ring) = &self.ring {
            ring.collect(&self.tracer, out, counts);
        }
    }
}

impl Tracer {
    pub(super) fn start(
        sink: Sink,
        in_use: Arc<[LaneGauge; 2]>,
        limits: [Arc<Limit>; 2],
        spill_pinned: Arc<Limit>,
        device_reserve_uncounted: bool,
        home: u64,
    ) -> Result<Tracer> {
        let (capacity, file) = match sink {
            Sink::Ring { capacity } => {
                if capacity == 0 || capacity > MAX_RING_RECORDS {
                    fail!(KMM_ERROR_INVALID_ARGUMENT, "capacity = {capacity} records must be in 1..={MAX_RING_RECORDS}");
                }
                (capacity, None)
            }
            Sink::File { path, rmm_only } => {
                // Opened, not yet truncated and nothing written: a trace still recording may
                // write this very file until it stops, and a start that fails leaves the file as
                // it was (`begin` empties it and writes the header).
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: cannot create the trace file: {e}", path.display()))?;
                let id = file_id(&file);
                let (out, writer) = (BufWriter::new(file), csv::Writer::new(rmm_only));
                (0, Some(Mutex::new(FileStore { out, path, id, writer, failed: None, closed: false, claimed: false })))
            }
        };
        Ok(Tracer {
            clock: Clock::start(),
            capacity,
            file,
            kept: Mutex::new((Ring::new(capacity.max(1))?, Vec::new())),
            in_use,
            limits,
            spill_pinned,
            device_reserve_uncounted,
            home,
        })
    }

    /// A record of an event now, with the manager's figures after it; its time is the clock's
    /// raw reading (see `Clock`).
    #[inline(always)]
    fn make(&self, in_use: Option<u64>, event: TracedEvent) -> Entry {
        let TracedEvent { action, kind, address, bytes, stream, buffer, extra } = event;
        let k = kind as usize;
        let held = match kind {
            MemoryKind::Device => self.limits[k].used().current(),
            MemoryKind::Pinned => self.limits[k].used().current().saturating_sub(self.spill_pinned.used().current()),
        };
        let reserved = match held {
            _ if k == 0 && self.device_reserve_uncounted => u64::MAX,
            // A trim is recorded just before its chunk goes back: the figure after it.
            held if action == Action::Trim => held.saturating_sub(bytes),
            held => held,
        };
        Entry {
            ticks: self.clock.now(),
            thread: thread_id(),
            action: action as u8,
            kind: k as u8,
            status: if action == Action::AllocateFailure { extra as u16 } else { 0 },
            address,
            bytes,
            stream_or_moved_from: if action.moves() { extra } else { stream },
            buffer,
            in_use: in_use.unwrap_or_else(|| self.in_use[k].current()),
            reserved,
        }
    }

    /// The record an entry keeps, its time in nanoseconds.
    fn record_of(&self, e: &Entry) -> Record {
        let moved = Action::from_u32(e.action as u32).is_some_and(Action::moves);
        Record {
            time_ns: self.clock.to_ns(e.ticks),
            thread: e.thread as u64,
            action: e.action as u32,
            kind: e.kind as u32,
            address: e.address,
            bytes: e.bytes,
            stream: if moved { self.home } else { e.stream_or_moved_from },
            buffer: e.buffer,
            moved_from: if moved { e.stream_or_moved_from } else { 0 },
            status: e.status as u32,
            in_use: e.in_use,
            reserved: e.reserved,
        }
    }

    /// Adds a record of an event of the manager's own (no lane's lock held), or of any event of
    /// a file trace; the time is read under the lock, so file rows come in time order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(&self, action: Action, kind: MemoryKind, address: u64, bytes: u64, stream: u64, buffer: u64, extra: u64) {
        self.record_after(|| None, TracedEvent { action, kind, address, bytes, stream, buffer, extra })
    }

    /// `LaneTrace::record_after` for a file trace, or an event of the manager's own.
    fn record_after(&self, change: impl FnOnce() -> Option<u64>, event: TracedEvent) {
        match &self.file {
            Some(file) => {
                let mut f = file.lock();
                let in_use = change();
                let record = self.record_of(&self.make(in_use, event));
                let FileStore { out, writer, failed, closed, .. } = &mut *f;
                if failed.is_none() && !*closed {
                    if let Err(e) = writer.row(out, &record) {
                        *failed = Some(e.to_string());
                    }
                }
            }
            None => {
                let mut kept = self.kept.lock();
                let in_use = change();
                let record = self.make(in_use, event);
                kept.0.push(record);
            }
        }
    }

    /// Adds the records of the rings the trace keeps, and their counts, to `tally`.
    pub(super) fn tally_kept(&self, tally: &mut (usize, TraceCounts)) {
        let kept = self.kept.lock();
        for ring in std::iter::once(&kept.0).chain(kept.1.iter()) {
            ring.tally(tally);
        }
    }

    /// The records of the lanes still recording (`out`, `counts`: see `Ring::collect`) with
    /// those of every ring the trace keeps, merged in time order.
    pub(super) fn records(&self, mut rings: Vec<Vec<Record>>, mut counts: TraceCounts) -> (Vec<Record>, TraceCounts) {
        let kept = self.kept.lock();
        for ring in std::iter::once(&kept.0).chain(kept.1.iter()) {
            ring.collect(self, &mut rings, &mut counts);
        }
        (merge(rings), counts)
    }

    /// Flushes and closes a file trace; the first write error, if any, names the file's
    /// problem (as a bad `path`, the argument that chose the file).
    /// Empties a file trace's file, for the header and records to come: the last step of a
    /// start, once the trace before it has stopped (and flushed, perhaps into the same file).
    pub(super) fn begin(&self) -> Result<()> {
        if let Some(file) = &self.file {
            let mut f = file.lock();
            let FileStore { out, path, writer, .. } = &mut *f;
            // Only a regular file has a length to cut (`/dev/null` and pipes have none).
            let file = out.get_ref();
            if file.metadata().is_ok_and(|m| m.is_file()) {
                file.set_len(0)
                    .map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: cannot truncate the trace file: {e}", path.display()))?;
            }
            writer
                .header(out)
                .map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: cannot write the trace file: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Counts a file trace's file as written by it; refused while another trace writes that
    /// file, unless `shared` (the manager's own recording trace, which stops first).
    pub(super) fn claim_file(&self, shared: bool) -> Result<()> {
        if let Some(file) = &self.file {
            let mut f = file.lock();
            if let Some(id) = f.id {
                let mut files = files_in_use().lock();
                let n = files.entry(id).or_insert(0);
                if *n > 0 && !shared {
                    fail!(
                        KMM_ERROR_INVALID_ARGUMENT,
                        "path = {}: another manager's trace writes this file (stop it first, or trace into another file)",
                        f.path.display()
                    );
                }
                *n += 1;
                f.claimed = true;
            }
        }
        Ok(())
    }

    /// Writes what a file trace holds in memory to its file, the trace going on (before a
    /// deferred destroy, whose teardown may not finish before the process exits).
    pub(super) fn flush(&self) {
        if let Some(file) = &self.file {
            file.lock().flush();
        }
    }

    /// Whether both traces write one regular file (whatever paths named it).
    pub(super) fn shares_file_with(&self, other: &Tracer) -> bool {
        let id = |t: &Tracer| t.file.as_ref().and_then(|f| f.lock().id);
        id(self).is_some_and(|a| Some(a) == id(other))
    }

    /// The write error a recording file trace ran into, if any (kept for `finish` to report).
    pub(super) fn write_failure(&self) -> Option<String> {
        let f = self.file.as_ref()?.lock();
        f.failed.as_ref().map(|e| format!("path = {}: writing the trace file failed: {e}", f.path.display()))
    }

    /// Stops a file trace: its file flushed and written no more (a write error is reported here).
    pub(super) fn finish(&self) -> Result<()> {
        if let Some(file) = &self.file {
            let mut f = file.lock();
            f.closed = true;
            f.flush();
            // Written no more: a new trace (of any manager) may take the file now, though a call
            // still holding this trace (a trim, an allocation) keeps the store a little longer.
            f.release_claim();
            if let Some(e) = f.failed.take() {
                fail!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: writing the trace file failed: {e}", f.path.display());
            }
        }
        Ok(())
    }

    pub fn is_ring(&self) -> bool {
        self.file.is_none()
    }
}

/// Rings merged by time, each ring's records kept in the order it made them (those of one lane
/// are ordered by its lock, whatever clock skew between cores the time-stamp counter has).
fn merge(rings: Vec<Vec<Record>>) -> Vec<Record> {
    use std::cmp::Reverse;
    let mut out = Vec::with_capacity(rings.iter().map(Vec::len).sum());
    // The head of each ring, smallest time first (ties: the lower ring).
    let mut heads: std::collections::BinaryHeap<Reverse<(u64, usize, usize)>> =
        rings.iter().enumerate().filter(|(_, r)| !r.is_empty()).map(|(i, r)| Reverse((r[0].time_ns, i, 0))).collect();
    while let Some(Reverse((_, ring, at))) = heads.pop() {
        out.push(rings[ring][at]);
        if let Some(next) = rings[ring].get(at + 1) {
            heads.push(Reverse((next.time_ns, ring, at + 1)));
        }
    }
    out
}

/// Time since a trace started. Where the processor's time-stamp counter runs at one rate on
/// every core whatever the power state (Linux on x86-64 with `constant_tsc` and `nonstop_tsc`),
/// it is read directly: a read costs a third of the system clock's (11 ns against 30 ns on the
/// build machine), and a traced operation reads it once. Readings are kept raw (ticks) and
/// turned into nanoseconds when read.
struct Clock {
    start: Instant,
    tsc: Option<(u64, f64)>,
}

impl Clock {
    fn start() -> Clock {
        let tsc = tsc_rate().map(|ns_per_tick| (read_tsc(), ns_per_tick));
        Clock { start: Instant::now(), tsc }
    }

    #[inline]
    fn now(&self) -> u64 {
        match self.tsc {
            Some((start, _)) => read_tsc().wrapping_sub(start),
            None => self.start.elapsed().as_nanos() as u64,
        }
    }

    fn to_ns(&self, raw: u64) -> u64 {
        match self.tsc {
            Some((_, ns_per_tick)) => (raw as f64 * ns_per_tick) as u64,
            None => raw,
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

/// The largest ring a trace may keep (each record is 64 bytes: 2^24 records are 1 GiB).
pub(crate) const MAX_RING_RECORDS: usize = 1 << 24;

/// The calling thread's id as the operating system knows it (what profilers and RMM's logs show;
/// Linux's fit in 32 bits).
fn thread_id() -> u32 {
    // A constant initializer: no lazy-initialisation state to test on each record (Linux gives
    // no thread the id 0).
    thread_local! {
        static ID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    ID.with(|id| match id.get() {
        0 => {
            let new = os_thread_id() as u32;
            id.set(new);
            new
        }
        known => known,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(sink: Sink) -> Tracer {
        let limits = [Arc::new(Limit::new(0, "hard limit")), Arc::new(Limit::new(0, "pinned limit"))];
        let t = Tracer::start(sink, Arc::new([LaneGauge::default(), LaneGauge::default()]), limits, Arc::new(Limit::new(0, "spill store")), false, 0).unwrap();
        t.begin().unwrap();
        t
    }

    #[test]
    fn a_stopped_file_trace_writes_nothing_more() {
        let path = std::env::temp_dir().join(format!("kmm-trace-unit-{}.csv", std::process::id()));
        let t = tracer(Sink::File { path: path.clone(), rmm_only: false });
        t.record(Action::Allocate, MemoryKind::Device, 0x1000, 64, 0, 1, 0);
        t.finish().unwrap();
        // A call that took the trace before the stop records after it.
        t.record(Action::Free, MemoryKind::Device, 0x1000, 64, 0, 1, 0);
        drop(t);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "the header and the one record before the stop:\n{text}");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn rings_merge_by_time_and_keep_each_ring_in_its_order() {
        let at = |t: u64, buffer: u64| Record { time_ns: t, buffer, ..Record::default() };
        // The second ring's records carry a skewed time; its own order still holds.
        let merged = merge(vec![vec![at(1, 1), at(5, 2)], vec![at(3, 3), at(2, 4)], vec![], vec![at(4, 5)]]);
        assert_eq!(merged.iter().map(|r| r.buffer).collect::<Vec<_>>(), [1, 3, 4, 5, 2]);
    }
}
