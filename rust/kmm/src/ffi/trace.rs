//! Exported functions that show a manager's memory: its allocation trace, its memory map and
//! the figures drawn from them.

use super::registry::with_manager;
use super::types::memory_kind;
use super::types::KmmManager;
use super::{boundary, check_flags, check_out, write_out, write_text};
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::manager::csv;
use crate::manager::trace::{Action, Record, Sink, MAX_RING_RECORDS};
use crate::manager::{Figure, MapSegment};
use std::ffi::{c_char, CStr};
use std::io::Write;
use std::path::PathBuf;

/// `kmm_manager_trace_start` and `kmm_manager_trace_save` flag: write only what RMM's replay
/// benchmark accepts (allocate, free and allocate failure rows, streams as 0, a move as a free
/// and an allocation; see docs/observability.md).
pub const KMM_TRACE_RMM_ONLY: u32 = 1;

/// The ring's size when `kmm_manager_trace_start` is given a capacity of 0.
pub const KMM_TRACE_DEFAULT_RECORDS: u64 = 65_536;

/// The largest ring `kmm_manager_trace_start` makes (records of 64 bytes: 1 GiB a ring).
pub const KMM_TRACE_MAX_RECORDS: u64 = 16_777_216;
const _: () = assert!(KMM_TRACE_MAX_RECORDS as usize == MAX_RING_RECORDS);

/// What a trace record says happened (`KmmTraceRecord.action`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmTraceAction {
    KMM_TRACE_ALLOCATE = 0,
    KMM_TRACE_FREE = 1,
    /// An allocation that failed; `status` holds its `KmmStatus`.
    KMM_TRACE_ALLOCATE_FAILURE = 2,
    KMM_TRACE_MAP = 3,
    KMM_TRACE_UNMAP = 4,
    /// Compaction moved an unmapped buffer from `moved_from` to `address`.
    KMM_TRACE_MOVE = 5,
    /// A free chunk of `bytes` at `address` went back to the device (or the host).
    KMM_TRACE_TRIM = 6,
    /// Memory allocated elsewhere became a buffer (`kmm_buffer_wrap`).
    KMM_TRACE_WRAP = 7,
    /// A buffer spilled to host memory: `address` is the device place it left, `moved_from` its
    /// host place.
    KMM_TRACE_SPILL = 8,
    /// A spilled buffer came back: `address` is its new device place, `moved_from` its host place.
    KMM_TRACE_RESTORE = 9,
}

/// One event of a trace (`kmm_manager_trace_records`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KmmTraceRecord {
    /// Nanoseconds since the trace started.
    pub time_ns: u64,
    /// The operating system's id of the thread that made the call.
    pub thread: u64,
    /// A `KmmTraceAction`.
    pub action: u32,
    /// A `KmmMemoryKind`.
    pub kind: u32,
    pub address: u64,
    /// Bytes asked for; for a move the bytes moved, for a trim the chunk's size.
    pub bytes: u64,
    /// The stream the event is ordered on: an allocation's (or a failed one's) own stream; the
    /// manager's for frees, maps, unmaps, moves, trims and wraps.
    pub stream: u64,
    /// The buffer (0 for a trim and a failed allocation).
    pub buffer: u64,
    /// A move's old address; a spill's or restore's host address (else 0).
    pub moved_from: u64,
    /// A failed allocation's `KmmStatus` (else 0).
    pub status: u32,
    pub _reserved: u32,
    /// The manager's bytes in use of this kind just after the event.
    pub in_use: u64,
    /// The manager's reserved bytes of this kind just after the event; `UINT64_MAX` where CUDA's
    /// own pool holds them (`KMM_ALLOC_CUDA_ASYNC`, device memory).
    pub reserved: u64,
}

/// What a stretch of a chunk holds (`KmmMapSegment.state`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmSegmentState {
    KMM_SEGMENT_FREE = 0,
    KMM_SEGMENT_IN_USE = 1,
    /// In use and pinned in place: mapped by the caller (`kmm_buffer_map`, an export), or held by
    /// a call of Kmm's in progress (a copy, fill or kernel being queued). Its address is out, so
    /// it does not move.
    KMM_SEGMENT_MAPPED = 2,
}

/// A stretch of a chunk in a memory map (`kmm_manager_memory_map`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KmmMapSegment {
    /// The base of the chunk it lies in. Memory not carved from chunks (direct and CUDA-pool
    /// modes, wrapped memory) is a chunk of its own. A chunk's segments come one after another in
    /// address order, the first at the chunk's base: chunks of one base (every wrap is a chunk,
    /// also of memory another chunk holds) are told apart that way.
    pub chunk: u64,
    pub address: u64,
    /// The block's size (the request rounded up), or the free stretch's.
    pub bytes: u64,
    /// A `KmmSegmentState`.
    pub state: u32,
    pub _reserved: u32,
    /// The buffer (0 for free space).
    pub buffer: u64,
    /// What the buffer's caller asked for (0 for free space).
    pub requested: u64,
}

/// Which figure `kmm_manager_figure_svg` draws.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmFigure {
    /// The device memory map: each chunk a row, blocks coloured free, in use and mapped.
    KMM_FIGURE_DEVICE_MAP = 0,
    /// The same for pinned host memory.
    KMM_FIGURE_PINNED_MAP = 1,
    /// Bytes in use and reserved over time, per kind, from the ring trace.
    KMM_FIGURE_TIMELINE = 2,
    /// What a status shows: the device map, the pinned map when pinned buffers or pinned pool
    /// chunks exist (the copy staging ring and the spill store are in no map), and the timeline
    /// when the manager has a ring trace.
    KMM_FIGURE_OVERVIEW = 3,
}

impl From<&Record> for KmmTraceRecord {
    fn from(r: &Record) -> Self {
        KmmTraceRecord {
            time_ns: r.time_ns,
            thread: r.thread,
            action: r.action,
            kind: r.kind,
            address: r.address,
            bytes: r.bytes,
            stream: r.stream,
            buffer: r.buffer,
            moved_from: r.moved_from,
            status: r.status,
            _reserved: 0,
            in_use: r.in_use,
            reserved: r.reserved,
        }
    }
}

impl From<&MapSegment> for KmmMapSegment {
    fn from(s: &MapSegment) -> Self {
        KmmMapSegment {
            chunk: s.chunk,
            address: s.address,
            bytes: s.bytes,
            state: s.state as u32,
            _reserved: 0,
            buffer: s.buffer,
            requested: s.requested,
        }
    }
}

fn path_arg(path: *const c_char, name: &str) -> Result<PathBuf> {
    if path.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "{name} is NULL");
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    if bytes.is_empty() {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} is empty");
    }
    // A path is bytes on Unix (Python passes os.fsencode's); elsewhere it must be UTF-8.
    #[cfg(unix)]
    return Ok(PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes)));
    #[cfg(not(unix))]
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(PathBuf::from(s)),
        Err(_) => fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} is not UTF-8"),
    }
}

/// Copies `items` into the caller's array `out` of `capacity` entries (the first ones when it
/// is too small) and writes how many there are to `*count`; `out` may be NULL when `capacity`
/// is 0, to ask for the count.
fn write_items<T, C: for<'a> From<&'a T>>(items: &[T], out: *mut C, capacity: usize, count: *mut usize) -> Result<()> {
    check_out(count, "count")?;
    if out.is_null() && capacity > 0 {
        fail!(KMM_ERROR_NULL_POINTER, "out is NULL but capacity = {capacity}");
    }
    for (i, item) in items.iter().take(capacity).enumerate() {
        // SAFETY: out holds `capacity` entries and i < capacity.
        unsafe { out.add(i).write(C::from(item)) };
    }
    write_out(count, "count", items.len())
}

/// Starts recording every allocation, free, map, unmap, move, spill, restore, trim and failed allocation of the
/// manager (a trace already recording is stopped first; the last trace's records are dropped).
/// A start that fails (a file that cannot be made, a ring that cannot be reserved, a bad
/// argument, a file trace recording whose writing failed: its stop reports that) changes
/// nothing: a trace recording goes on, and an existing file at `path` is emptied only once the
/// start succeeds.
/// With `path` NULL the records go to rings of the last `capacity` records (0: 65,536; at most
/// `KMM_TRACE_MAX_RECORDS`): one per lane of the manager, so that threads sharing it record in
/// parallel, and one for the manager's own events (each reserves `capacity` x 64 bytes of
/// address space at the start, `KMM_ERROR_OUT_OF_MEMORY` where it cannot; pages are used as
/// records arrive);
/// read them, merged in time order, with `kmm_manager_trace_records` or `kmm_manager_trace_save`; else they are
/// written to the CSV file `path` as they happen (`capacity` is not used; `flags` may hold
/// `KMM_TRACE_RMM_ONLY`). A regular file that another manager's trace writes is refused
/// (`KMM_ERROR_INVALID_ARGUMENT`) until that trace stops or its manager's teardown ends (a
/// deferred destroy's may wait for its stream); the manager's own recording file may be named
/// again. Off by default; while off, tracing costs nothing measurable.
#[no_mangle]
pub extern "C" fn kmm_manager_trace_start(manager: KmmManager, capacity: u64, path: *const c_char, flags: u32) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_TRACE_RMM_ONLY, "flags")?;
        let sink = if path.is_null() {
            if flags != 0 {
                fail!(KMM_ERROR_INVALID_ARGUMENT, "flags = {flags:#x} applies to a file trace only, and path is NULL");
            }
            let capacity = if capacity == 0 { KMM_TRACE_DEFAULT_RECORDS } else { capacity };
            if capacity > MAX_RING_RECORDS as u64 {
                fail!(KMM_ERROR_INVALID_ARGUMENT, "capacity = {capacity} records exceeds the largest ring, {MAX_RING_RECORDS}");
            }
            Sink::Ring { capacity: capacity as usize }
        } else {
            Sink::File { path: path_arg(path, "path")?, rmm_only: flags & KMM_TRACE_RMM_ONLY != 0 }
        };
        with_manager(manager, |m| m.trace_start(sink))
    })
}

/// Stops the trace; a file trace is flushed and closed (a write that failed while recording is
/// reported here). A ring's records stay readable until the next start. Without a trace
/// recording it does nothing.
#[no_mangle]
pub extern "C" fn kmm_manager_trace_stop(manager: KmmManager) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.trace_stop()))
}

/// Copies the ring trace's records, oldest first (the rings merged in time order), into `out`
/// (`capacity` entries; the oldest ones when it is too small), and writes how many there are to
/// `*count` and, when `dropped` is not NULL, how many older ones the rings let go. `out` may be NULL when `capacity` is 0.
/// `KMM_ERROR_INVALID_ARGUMENT` when the manager has no ring trace.
#[no_mangle]
pub extern "C" fn kmm_manager_trace_records(
    manager: KmmManager,
    out: *mut KmmTraceRecord,
    capacity: usize,
    count: *mut usize,
    dropped: *mut u64,
) -> KmmStatus {
    boundary(|| {
        let no_ring = || crate::err!(KMM_ERROR_INVALID_ARGUMENT, "manager {manager:#x} has no ring trace (start one with kmm_manager_trace_start, path NULL)");
        // Asked for the count only: counted without copying the rings.
        let counts = if capacity == 0 {
            let (len, counts) = with_manager(manager, |m| Ok(m.trace_len()))?.ok_or_else(no_ring)?;
            write_out(count, "count", len)?;
            counts
        } else {
            let (records, counts, _) = with_manager(manager, |m| Ok(m.trace_records()))?.ok_or_else(no_ring)?;
            write_items(&records, out, capacity, count)?;
            counts
        };
        if !dropped.is_null() {
            write_out(dropped, "dropped", counts.dropped)?;
        }
        Ok(())
    })
}

/// Writes the ring trace's records to the CSV file `path` (RMM's columns first; `flags` may hold
/// `KMM_TRACE_RMM_ONLY`). `KMM_ERROR_INVALID_ARGUMENT` when the manager has no ring trace, the
/// file cannot be written, or a recording file trace (of any manager) writes it.
#[no_mangle]
pub extern "C" fn kmm_manager_trace_save(manager: KmmManager, path: *const c_char, flags: u32) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_TRACE_RMM_ONLY, "flags")?;
        let path = path_arg(path, "path")?;
        let Some((records, ..)) = with_manager(manager, |m| Ok(m.trace_records()))? else {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "manager {manager:#x} has no ring trace (start one with kmm_manager_trace_start, path NULL)");
        };
        crate::manager::trace::check_not_traced(&path)?;
        let write = || -> std::io::Result<()> {
            let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
            let mut writer = csv::Writer::new(flags & KMM_TRACE_RMM_ONLY != 0);
            writer.header(&mut out)?;
            for r in &records {
                writer.row(&mut out, r)?;
            }
            out.flush()
        };
        write().map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "path = {}: cannot write the trace: {e}", path.display()))
    })
}

/// The name of a `KmmTraceAction` as the CSV writes it ("allocate", "allocate failure", ...), or
/// "unknown". Static string; never NULL; do not free.
#[no_mangle]
pub extern "C" fn kmm_trace_action_name(action: u32) -> *const c_char {
    Action::from_u32(action).map_or(c"unknown", Action::c_name).as_ptr()
}

/// Copies the map of the manager's memory of `kind` (a `KmmMemoryKind`) into `out`
/// (`capacity` entries; the first ones when it is too small) and writes how many segments it has
/// to `*count`: every chunk in address order, cut into its buffers' blocks and the free space
/// between them. `out` may be NULL when `capacity` is 0.
#[no_mangle]
pub extern "C" fn kmm_manager_memory_map(manager: KmmManager, kind: u32, out: *mut KmmMapSegment, capacity: usize, count: *mut usize) -> KmmStatus {
    boundary(|| {
        let kind = memory_kind(kind, "kind")?;
        let map = with_manager(manager, |m| Ok(m.memory_map(kind)))?;
        write_items(&map.segments, out, capacity, count)
    })
}

/// Draws a figure (a `KmmFigure`) as SVG into `buf` as a NUL-terminated string, truncated to
/// `len` bytes, and writes the length the whole text needs (with its NUL) to `*needed` when
/// `needed` is not NULL; `buf` may be NULL when `len` is 0. The timeline needs a ring trace
/// (`KMM_ERROR_INVALID_ARGUMENT` without one).
#[no_mangle]
pub extern "C" fn kmm_manager_figure_svg(manager: KmmManager, figure: u32, buf: *mut c_char, len: usize, needed: *mut usize) -> KmmStatus {
    boundary(|| {
        let figure = match figure {
            0 => Figure::DeviceMap,
            1 => Figure::PinnedMap,
            2 => Figure::Timeline,
            3 => Figure::Overview,
            v => fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "figure = {v} is not a KmmFigure (0 = device map, 1 = pinned map, 2 = timeline, 3 = overview)"
            ),
        };
        let svg = with_manager(manager, |m| m.figure_svg(figure))?;
        write_text(&svg, buf, len, needed)
    })
}
