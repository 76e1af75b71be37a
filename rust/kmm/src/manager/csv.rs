//! Traces as CSV: RMM's logging columns first (Thread, Time, Action, Pointer, Size, Stream), so
//! RMM's log parser and replay benchmark read the file, Kmm's own columns after (rapidcsv reads
//! columns by name and ignores the others).
//!
//! The full form has a row per record. The RMM form (`rmm_only`) keeps what RMM's replay
//! accepts: only "allocate", "free" and "allocate failure" rows, every stream written as 0 (its
//! replay refuses other streams, and runs on the default stream anyway), a move as a free at the
//! old address and an allocation at the new one (RMM knows no moves, and matches a free to its
//! allocation by address), and no row for buffers it did not see allocated (zero-byte buffers,
//! wrapped memory, buffers older than the trace), whose frees its replay could not match, and no
//! pinned rows (its replay allocates every row as device memory).

use super::trace::{Action, Record};
use crate::error::{KmmStatus, Result};
use crate::fail;
use std::collections::HashMap;
use std::io::{self, Write};

pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream,Buffer,Kind,From,Status,InUse,Reserved";

pub struct Writer {
    rmm_only: bool,
    /// RMM form: the buffers with an allocate row and no free row yet, by handle, at their
    /// address in the file.
    live: HashMap<u64, u64>,
}

impl Writer {
    pub fn new(rmm_only: bool) -> Writer {
        Writer { rmm_only, live: HashMap::new() }
    }

    pub fn header(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{HEADER}")
    }

    pub fn row(&mut self, out: &mut dyn Write, r: &Record) -> io::Result<()> {
        let Some(action) = Action::from_u32(r.action) else {
            return Ok(());
        };
        if !self.rmm_only {
            return line(out, r, action, r.address, r.stream);
        }
        if r.kind != 0 {
            return Ok(());
        }
        match action {
            Action::Allocate if r.bytes > 0 => {
                self.live.insert(r.buffer, r.address);
                line(out, r, action, r.address, 0)
            }
            Action::Free => match self.live.remove(&r.buffer) {
                Some(address) => line(out, r, action, address, 0),
                None => Ok(()),
            },
            Action::Move => match self.live.get_mut(&r.buffer) {
                Some(address) => {
                    let old = std::mem::replace(address, r.address);
                    // Between the two halves the buffer is in use at neither address.
                    let freed = Record { in_use: r.in_use.saturating_sub(r.bytes), ..*r };
                    line(out, &freed, Action::Free, old, 0)?;
                    line(out, r, Action::Allocate, r.address, 0)
                }
                None => Ok(()),
            },
            // Device memory given up and taken again: RMM's free and allocate.
            Action::Spill => match self.live.remove(&r.buffer) {
                Some(address) => line(out, r, Action::Free, address, 0),
                None => Ok(()),
            },
            Action::Restore => {
                self.live.insert(r.buffer, r.address);
                line(out, r, Action::Allocate, r.address, 0)
            }
            Action::AllocateFailure => line(out, r, action, 0, 0),
            _ => Ok(()),
        }
    }
}

fn line(out: &mut dyn Write, r: &Record, action: Action, address: u64, stream: u64) -> io::Result<()> {
    let secs = r.time_ns / 1_000_000_000;
    let nanos = r.time_ns % 1_000_000_000;
    let kind = if r.kind == 0 { "device" } else { "pinned" };
    let from = if action.moves() { format!("{:#x}", r.moved_from) } else { String::new() };
    let status = match KmmStatus::from_u32(r.status) {
        Some(s) if action == Action::AllocateFailure => s.name().to_str().unwrap_or_default().to_string(),
        _ => String::new(),
    };
    let reserved = if r.reserved == u64::MAX { String::new() } else { r.reserved.to_string() };
    let buffer = if r.buffer == 0 { String::new() } else { format!("{:#x}", r.buffer) };
    // One write of the whole row: a buffered file then holds whole rows only, so a process that
    // ends before the trace's last flush leaves no torn row behind.
    let row = format!(
        "{},{secs}.{nanos:09},{},{address:#x},{},{stream:#x},{buffer},{kind},{from},{status},{},{reserved}\n",
        r.thread,
        action.name(),
        r.bytes,
        r.in_use
    );
    out.write_all(row.as_bytes())
}

/// Reads a trace in either form, or a log of RMM's logging adaptor (its columns only: "free"
/// or "deallocate" rows become frees; times it wrote as a clock time read as 0). Columns are
/// found by name; Action, Pointer and Size are required in the header and in every row, and every
/// row has the header's count of fields. Anything else that is not what the writer writes (a
/// size past `KMM_MAX_BUFFER_BYTES` too, except in an `allocate failure` row, which records the
/// refused size) is an error naming the line and the value. A field may
/// be quoted (as Python's `csv.QUOTE_ALL` writes every one): no value of a trace holds a comma.
pub fn read(text: &str) -> Result<Vec<Record>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "the trace is empty (no header line)");
    };
    let names: Vec<&str> = header.split(',').map(unquoted).collect();
    let col = |name: &str| names.iter().position(|n| *n == name);
    let (Some(action_col), Some(pointer_col), Some(size_col)) = (col("Action"), col("Pointer"), col("Size")) else {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "line 1: the trace's header `{header}` lacks one of Action, Pointer, Size");
    };
    let optional = ["Thread", "Time", "Stream", "Buffer", "Kind", "From", "Status", "InUse", "Reserved"].map(col);
    let mut records = Vec::new();
    for (n, line) in lines {
        let fields: Vec<&str> = line.split(',').map(unquoted).collect();
        if fields.len() != names.len() {
            // Every writer writes every column: fewer is a line cut off (perhaps mid-field); more,
            // a field that holds a comma, which no trace value does.
            let why = if fields.len() < names.len() { "a cut-off line?" } else { "a field holding a comma? no trace value does" };
            fail!(KMM_ERROR_INVALID_ARGUMENT, "line {}: {} fields where the header has {} ({why})", n + 1, fields.len(), names.len());
        }
        let bad = |what: &str, value: &str| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "line {}: {what} `{value}` is not valid", n + 1);
        let required = |i: usize, what: &str| match fields.get(i) {
            Some(v) if !v.is_empty() => Ok(*v),
            _ => Err(crate::err!(KMM_ERROR_INVALID_ARGUMENT, "line {}: the {what} is missing (a cut-off line?)", n + 1)),
        };
        let get = |c: Option<usize>| c.and_then(|i| fields.get(i).copied()).unwrap_or("");
        let number = |s: &str, what: &str| -> Result<u64> {
            let parsed = match s {
                "" | "(nil)" => Ok(0),
                _ => match s.strip_prefix("0x") {
                    Some(hex) if hex.bytes().all(|b| b.is_ascii_hexdigit()) => u64::from_str_radix(hex, 16).map_err(|_| ()),
                    Some(_) => Err(()),
                    None if s.bytes().all(|b| b.is_ascii_digit()) => s.parse().map_err(|_| ()),
                    None => Err(()),
                },
            };
            parsed.map_err(|_| bad(what, s))
        };
        let action = match required(action_col, "action")? {
            "deallocate" => Action::Free,
            name => Action::from_name(name).ok_or_else(|| bad("action", name))?,
        };
        let [thread, time, stream, buffer, kind, from, status, in_use, reserved] = optional;
        let time_ns = match get(time) {
            "" => 0,
            // RMM's logging adaptor writes a clock time (10:00:00.000001): no offset to read.
            t if t.contains(':') => 0,
            t => match t.parse::<f64>() {
                Ok(secs) if secs.is_finite() && (0.0..1.8e10).contains(&secs) => (secs * 1e9).round() as u64,
                _ => return Err(bad("time", t)),
            },
        };
        let status = match get(status) {
            "" => 0,
            name => KmmStatus::from_name(name).ok_or_else(|| bad("status", name))? as u32,
        };
        let kind = match get(kind) {
            "" | "device" => 0,
            "pinned" => 1,
            other => return Err(bad("kind", other)),
        };
        records.push(Record {
            time_ns,
            thread: number(get(thread), "thread")?,
            action: action as u32,
            kind,
            address: number(required(pointer_col, "pointer")?, "pointer")?,
            bytes: match number(required(size_col, "size")?, "size")? {
                // A failure row carries the size that was refused, often for being past the
                // limit (2^49, or SIZE_MAX): it allocated nothing, and replays skip and count it.
                b if action == Action::AllocateFailure => b,
                b if b > super::config::MAX_BUFFER_BYTES => {
                    fail!(KMM_ERROR_INVALID_ARGUMENT, "line {}: size {b} is past KMM_MAX_BUFFER_BYTES ({})", n + 1, super::config::MAX_BUFFER_BYTES)
                }
                b => b,
            },
            stream: number(get(stream), "stream")?,
            buffer: number(get(buffer), "buffer")?,
            moved_from: number(get(from), "from")?,
            status,
            in_use: number(get(in_use), "in use")?,
            reserved: match get(reserved) {
                "" => u64::MAX,
                s => number(s, "reserved")?,
            },
        });
    }
    Ok(records)
}

/// A field without its surrounding spaces and one pair of surrounding double quotes.
fn unquoted(field: &str) -> &str {
    let field = field.trim();
    field.strip_prefix('"').and_then(|f| f.strip_suffix('"')).map_or(field, str::trim)
}
