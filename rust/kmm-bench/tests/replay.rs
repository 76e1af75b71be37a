//! A trace recorded during a run replays to the same peak in use and the same count of
//! operations, from either CSV form (host backend).

use kmm::ffi::buffer::*;
use kmm::ffi::manager::*;
use kmm::ffi::trace::*;
use kmm::ffi::types::*;
use kmm::KmmStatus;
use kmm_bench::replay::{plan, run, Allocator};
use std::ffi::CString;

const DEVICE: u32 = KmmMemoryKind::KMM_MEMORY_DEVICE as u32;

fn ok(s: KmmStatus) {
    assert_eq!(s, KmmStatus::KMM_OK, "{}", unsafe { std::ffi::CStr::from_ptr(kmm::ffi::kmm_last_error()) }.to_string_lossy());
}

fn manager() -> KmmManager {
    manager_with(|_| {})
}

/// A host-backend manager of the default configuration changed by `f`.
fn manager_with(f: impl FnOnce(&mut KmmConfig)) -> KmmManager {
    let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
    ok(kmm_config_default(&mut c));
    c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
    f(&mut c);
    let mut m = 0;
    ok(kmm_manager_create(&c, &mut m));
    m
}

fn stats(m: KmmManager) -> KmmMemoryStats {
    let mut s = KmmMemoryStats::default();
    ok(kmm_manager_stats(m, DEVICE, &mut s));
    s
}

/// A trace file of `rows` under RMM's six columns, removed when dropped.
struct TraceFile(std::path::PathBuf);
impl TraceFile {
    fn new(name: &str, rows: &str) -> TraceFile {
        let path = std::env::temp_dir().join(format!("kmm-replay-{}-{name}.csv", std::process::id()));
        std::fs::write(&path, format!("Thread,Time,Action,Pointer,Size,Stream\n{rows}")).unwrap();
        TraceFile(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}
impl Drop for TraceFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The replay command with `args`: (exit status, stdout, stderr).
fn replay_command(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_replay")).args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

struct Host(KmmManager);
impl Allocator for Host {
    fn alloc(&mut self, bytes: u64) -> Result<u64, String> {
        let mut b = 0;
        ok(kmm_buffer_alloc(self.0, bytes, DEVICE, &mut b));
        Ok(b)
    }
    fn free(&mut self, h: u64) {
        ok(kmm_buffer_free(self.0, h, 0));
    }
}

#[test]
fn a_recorded_trace_replays_to_the_same_peak_and_counts() {
    let m = manager();
    ok(kmm_manager_trace_start(m, 1 << 20, std::ptr::null(), 0));
    let base = stats(m);
    let mut live = Vec::new();
    let mut x = 7u64;
    for i in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.is_empty() || (live.len() < 300 && x % 2 == 0) {
            let mut b = 0;
            let bytes = if i % 500 == 0 { 0 } else { (x >> 44) % (1 << 20) };
            ok(kmm_buffer_alloc(m, bytes, DEVICE, &mut b));
            live.push(b);
        } else {
            let b = live.swap_remove((x >> 8) as usize % live.len());
            if i % 7 == 0 {
                let mut p = 0;
                ok(kmm_buffer_map(m, b, &mut p));
                ok(kmm_buffer_unmap(m, b));
            }
            ok(kmm_buffer_free(m, b, 0));
        }
    }
    let after = stats(m);
    let dir = std::env::temp_dir();
    let full = dir.join(format!("kmm-replay-{}-full.csv", std::process::id()));
    let rmm = dir.join(format!("kmm-replay-{}-rmm.csv", std::process::id()));
    for (path, flags) in [(&full, 0), (&rmm, KMM_TRACE_RMM_ONLY)] {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        ok(kmm_manager_trace_save(m, c.as_ptr(), flags));
    }
    let allocs = (after.allocs - base.allocs) as usize;
    let frees = (after.frees - base.frees) as usize;
    for path in [&full, &rmm] {
        let records = kmm::manager::csv::read(&std::fs::read_to_string(path).unwrap()).unwrap();
        let p = plan(&records).unwrap();
        let what = path.display();
        // The RMM form leaves out zero-byte buffers: the same counts of buffers with memory.
        let zero = records.iter().filter(|r| r.action == 0 && r.bytes == 0).count();
        if path == &rmm {
            assert_eq!(zero, 0, "{what}: the RMM form has no zero-byte rows");
        } else {
            assert!(zero > 0, "the workload made zero-byte buffers");
            assert_eq!((p.allocs, p.frees), (allocs, frees), "{what}: every operation is replayed");
        }
        assert_eq!(p.unmatched_frees, 0, "{what}");
        assert_eq!(p.peak_in_use, after.peak_in_use, "{what}: the trace peaks where the manager did");
        let r = manager();
        run(&p, &mut Host(r)).unwrap();
        let s = stats(r);
        assert_eq!(s.peak_in_use, p.peak_in_use, "{what}: the replay peaks where the trace did");
        assert_eq!(s.allocs as usize, p.allocs, "{what}");
        assert_eq!((s.frees, s.live_buffers, s.in_use), (s.allocs, 0, 0), "{what}: the replay frees what it allocated");
        ok(kmm_manager_destroy(r, 0));
        std::fs::remove_file(path).unwrap();
    }
    ok(kmm_manager_destroy(m, 0));
}

#[test]
fn an_rmm_log_replays_by_address() {
    let log = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,10:00:00.000001,allocate,0x1000,256,0x0\n\
               1,10:00:00.000002,allocate,0x2000,512,0x0\n\
               2,10:00:00.000003,free,0x1000,256,0x0\n\
               2,10:00:00.000004,allocate failure,0x0,1073741824,0x0\n\
               1,10:00:00.000005,allocate,0x1000,128,0x0\n\
               1,10:00:00.000006,deallocate,0x2000,512,0x0\n\
               1,10:00:00.000007,free,0x9000,64,0x0\n";
    let p = plan(&kmm::manager::csv::read(log).unwrap()).unwrap();
    assert_eq!((p.allocs, p.frees, p.unmatched_frees, p.failures), (3, 2, 1, 1));
    assert_eq!((p.peak_in_use, p.in_use_at_end), (768, 128));
    let r = manager();
    run(&p, &mut Host(r)).unwrap();
    assert_eq!(stats(r).peak_in_use, 768);
    ok(kmm_manager_destroy(r, 0));
    // What is not a trace is refused with the line and the value.
    let e = kmm::manager::csv::read("Thread,Action,Pointer,Size\n1,grow,0x10,5\n").unwrap_err();
    assert!(e.message.contains("line 2: action `grow`"), "{}", e.message);
    let e = kmm::manager::csv::read("Thread,Time\n").unwrap_err();
    assert!(e.message.contains("lacks one of Action, Pointer, Size"), "{}", e.message);
}

#[test]
fn a_trace_of_a_run_that_spilled_replays_to_its_device_peak_in_either_form() {
    // Found by an adversarial review (2026-11-28): the full form kept spilled buffers in use
    // (12 MiB where the run's device peak was 4 MiB) while the RMM form, whose spills are frees,
    // replayed to 4 MiB. Both now follow the device memory, as the run's stats do.
    let m = manager_with(|c| {
        c.chunk_size = 1 << 20;
        c.hard_limit = 4 << 20;
        c.spill_limit = 64 << 20;
    });
    ok(kmm_manager_trace_start(m, 0, std::ptr::null(), 0));
    let mut bufs = Vec::new();
    for _ in 0..12 {
        let mut b = 0;
        ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut b));
        bufs.push(b);
    }
    // Two spilled buffers come back (restores), then everything is freed, some while spilled.
    for &b in &bufs[..2] {
        let mut p = 0;
        ok(kmm_buffer_map(m, b, &mut p));
        ok(kmm_buffer_unmap(m, b));
    }
    for b in bufs {
        ok(kmm_buffer_free(m, b, 0));
    }
    let run = stats(m);
    assert!(run.spills > 0, "the run spilled");
    let dir = std::env::temp_dir();
    for (name, flags) in [("full", 0), ("rmm", KMM_TRACE_RMM_ONLY)] {
        let path = dir.join(format!("kmm-replay-{}-spill-{name}.csv", std::process::id()));
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        ok(kmm_manager_trace_save(m, cpath.as_ptr(), flags));
        let p = plan(&kmm::manager::csv::read(&std::fs::read_to_string(&path).unwrap()).unwrap()).unwrap();
        assert_eq!(p.peak_in_use, run.peak_in_use, "{name}: the trace peaks where the run's device memory did");
        assert_eq!(p.unmatched_frees, 0, "{name}");
        if name == "full" {
            assert_eq!((p.allocs, p.frees), (12, 12), "{name}: the caller's operations");
            assert!(p.spills > 0 && p.restores > 0, "{name}: spills {} restores {}", p.spills, p.restores);
        }
        let r = manager();
        run_plan_through(r, &p);
        std::fs::remove_file(path).unwrap();
    }
    ok(kmm_manager_destroy(m, 0));
}

/// Replays `p` through the manager `r` (then destroyed): it ends with nothing in use.
fn run_plan_through(r: KmmManager, p: &kmm_bench::replay::Plan) {
    run(p, &mut Host(r)).unwrap();
    let s = stats(r);
    assert_eq!(s.peak_in_use, p.peak_in_use, "the replay peaks where the trace did");
    assert_eq!((s.live_buffers, s.in_use), (0, 0));
    ok(kmm_manager_destroy(r, 0));
}

#[test]
fn the_replay_command_refuses_bad_input_with_a_message_not_a_panic() {
    // Found by an adversarial review (2026-11-28): `--repeat 0` panicked, `--repeat abc` and
    // unknown options were ignored, and every bad file ended in a panic (exit 101).
    let good = TraceFile::new("cli-good", "1,0.1,allocate,0x1000,256,0x0\n1,0.2,free,0x1000,256,0x0\n");
    let cut = TraceFile::new("cli-cut", "1,0.1,allocate,0x1000,2");
    let (g, c) = (good.path(), cut.path());
    for (args, code, words) in [
        (vec![g, "--host", "--repeat", "0"], 2, "--repeat 0: the number of timed runs must be an integer in 1..=1000"),
        (vec![g, "--host", "--repeat", "abc"], 2, "--repeat abc"),
        (vec!["--repeat", "3"], 2, "no trace file given"),
        (vec![g, "--hsot"], 2, "unknown option --hsot"),
        (vec![g, g, "--host"], 2, "one trace at a time"),
        (vec!["/nonexistent/kmm-trace.csv", "--host"], 1, "replay: /nonexistent/kmm-trace.csv: No such file"),
        (vec![c, "--host"], 1, "line 2: 5 fields where the header has 6 (a cut-off line?)"),
    ] {
        let (status, _, err) = replay_command(&args);
        assert_eq!(status, Some(code), "{args:?}: {err}");
        assert!(err.contains(words) && !err.contains("panicked"), "{args:?}: {err}");
    }
    let (status, out, err) = replay_command(&[g, "--host", "--repeat", "1"]);
    assert_eq!(status, Some(0), "{err}");
    assert!(out.contains("1 allocations, 1 frees") && out.contains("| Kmm pool, binned (default) |"), "{out}");
}

#[test]
fn a_trace_with_wrapped_memory_replays_to_the_runs_peak_and_counts() {
    // Memory allocated elsewhere and wrapped counts in use and as an allocation in the run's
    // statistics; its replay allocates it (an allocator under test would have to give it).
    let m = manager();
    ok(kmm_manager_trace_start(m, 1 << 10, std::ptr::null(), 0));
    let base = stats(m);
    let mut foreign = vec![0u8; 4 << 20];
    let (mut a, mut w) = (0, 0);
    ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut a));
    ok(kmm_buffer_wrap(m, foreign.as_mut_ptr().cast(), foreign.len() as u64, DEVICE, KmmOwnership::KMM_BORROW as u32, &mut w));
    ok(kmm_buffer_free(m, a, 0));
    ok(kmm_buffer_free(m, w, 0));
    ok(kmm_manager_synchronize(m));
    let after = stats(m);
    let path = std::env::temp_dir().join(format!("kmm-replay-{}-wrap.csv", std::process::id()));
    let c = CString::new(path.to_str().unwrap()).unwrap();
    ok(kmm_manager_trace_save(m, c.as_ptr(), 0));
    let p = plan(&kmm::manager::csv::read(&std::fs::read_to_string(&path).unwrap()).unwrap()).unwrap();
    assert_eq!(after.peak_in_use, 5 << 20, "the run held the wrapped 4 MiB and 1 MiB");
    assert_eq!(p.peak_in_use, after.peak_in_use, "the replay peaks where the run did");
    assert_eq!((p.allocs, p.wraps, p.frees, p.unmatched_frees), ((after.allocs - base.allocs) as usize, 1, (after.frees - base.frees) as usize, 0));
    let r = manager();
    run(&p, &mut Host(r)).unwrap();
    assert_eq!(stats(r).peak_in_use, 5 << 20);
    ok(kmm_manager_destroy(r, 0));
    ok(kmm_manager_destroy(m, 0));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn live_bytes_past_two_to_the_64_are_an_error_naming_the_record() {
    // 65,537 live buffers of 2^48 bytes each: every row valid, their sum not a number any run
    // held (a capped "peak in use" would be printed as a fact). The 65,536th row brings the
    // sum to 2^64.
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 0..=65_536u64 {
        log += &format!("1,0.{i},allocate,{:#x},{},0x0\n", 0x1000 + i * 0x1000, 1u64 << 48);
    }
    let e = plan(&kmm::manager::csv::read(&log).unwrap()).unwrap_err();
    assert!(e.contains("row 65536 after the header:") && e.contains("2^64"), "{e}");
}

#[test]
fn quoted_fields_and_rows_without_a_buffer_read_as_written() {
    // Found by an adversarial run (2026-11-29): a file with every field quoted (Python's
    // csv.QUOTE_ALL) was refused for its header, and hand-written rows of a buffer-keyed trace
    // with an empty Buffer all became buffer 0, each "freeing" the one before.
    let plain = "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x1000,256,0x0\n1,0.2,allocate,0x2000,512,0x0\n1,0.3,free,0x1000,256,0x0\n";
    let quoted: String = plain.lines().map(|l| l.split(',').map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(",") + "\n").collect();
    let (a, b) = (kmm::manager::csv::read(plain).unwrap(), kmm::manager::csv::read(&quoted).unwrap());
    assert_eq!(format!("{a:?}"), format!("{b:?}"), "quoted and plain read alike");
    let keyed = "Thread,Time,Action,Pointer,Size,Stream,Buffer\n\
                 1,0.1,allocate,0x1000,256,0x0,0x1000000000000001\n\
                 1,0.2,allocate,0x2000,512,0x0,\n\
                 1,0.3,allocate,0x3000,128,0x0,\n\
                 1,0.4,free,0x2000,512,0x0,\n";
    let p = plan(&kmm::manager::csv::read(keyed).unwrap()).unwrap();
    assert_eq!((p.allocs, p.frees, p.unmatched_frees, p.peak_in_use, p.in_use_at_end), (3, 1, 0, 896, 384));
}

#[test]
fn a_reader_that_stops_early_ends_the_replay_without_a_panic() {
    // Found by an adversarial run (2026-11-29): `replay t.csv | head -1` panicked on the broken
    // pipe, with a backtrace.
    let trace = TraceFile::new("pipe", "1,0.1,allocate,0x1000,256,0x0\n");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_replay"))
        .args([trace.path(), "--host", "--repeat", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && out.status.code() != Some(101), "{:?}: {err}", out.status);
}

#[test]
fn a_modes_peak_reserved_does_not_grow_with_the_number_of_runs() {
    // Found by a newcomer's walk-through (2026-11-29): direct mode's frees of one run were still
    // pending when the next allocated, so one 1 MiB buffer showed 2, 3, 6 and 11 MiB reserved
    // for --repeat 1, 2, 5 and 10.
    let trace = TraceFile::new("repeat", "1,0.1,allocate,0x1000,1048576,0x0\n1,0.2,free,0x1000,1048576,0x0\n");
    // (mode, peak reserved) of each Kmm row.
    let peaks = |repeat: &str| -> Vec<(String, String)> {
        let (_, text, _) = replay_command(&[trace.path(), "--host", "--repeat", repeat]);
        let rows: Vec<(String, String)> = text.lines().filter(|l| l.starts_with("| Kmm ")).map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].to_string(), cells[3].to_string())
        }).collect();
        assert!(rows.len() >= 3, "{text}");
        rows
    };
    let once = peaks("1");
    assert!(once.iter().any(|(mode, peak)| mode == "Kmm direct" && peak == "1.00 MiB"), "{once:?}");
    assert_eq!(peaks("10"), once, "ten runs reserve at their peak what one run does");
}

#[test]
fn a_trace_whose_name_is_not_utf8_replays() {
    // Found by an adversarial run (2026-11-29): Kmm writes traces to any path the OS takes, but
    // the replay command panicked (exit 101) on a file name that is not UTF-8.
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::OsStr::from_bytes(b"kmm-replay-\xff-latin1.csv");
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x1000,256,0x0\n1,0.2,free,0x1000,256,0x0\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_replay")).arg(&path).args(["--host", "--repeat", "1"]).output().unwrap();
    let _ = std::fs::remove_file(&path);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("1 allocations, 1 frees") && stdout.contains("latin1.csv"), "{stdout}");
}

/// The trace of `m` saved in both forms and read back: (form's name, records).
fn both_forms(m: KmmManager, name: &str) -> Vec<(&'static str, Vec<kmm::manager::trace::Record>)> {
    [("full", 0), ("rmm", KMM_TRACE_RMM_ONLY)]
        .into_iter()
        .map(|(form, flags)| {
            let path = std::env::temp_dir().join(format!("kmm-replay-{}-{name}-{form}.csv", std::process::id()));
            let c = CString::new(path.to_str().unwrap()).unwrap();
            ok(kmm_manager_trace_save(m, c.as_ptr(), flags));
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            let records = kmm::manager::csv::read(&text).unwrap_or_else(|e| panic!("{form}: {}\n{text}", e.message));
            (form, records)
        })
        .collect()
}

#[test]
fn refused_allocations_past_the_size_limit_are_skipped_and_counted() {
    // Found by an adversarial run (round 13): an `allocate failure` row carries the refused
    // size, 2^49 or SIZE_MAX, and the reader refused the whole trace for a size past
    // KMM_MAX_BUFFER_BYTES, in either form.
    let m = manager();
    ok(kmm_manager_trace_start(m, 0, std::ptr::null(), 0));
    let (mut a, mut b) = (0, 0);
    ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut a));
    for bytes in [1u64 << 49, u64::MAX] {
        assert_ne!(kmm_buffer_alloc(m, bytes, DEVICE, &mut b), KmmStatus::KMM_OK, "{bytes} is refused");
    }
    ok(kmm_buffer_free(m, a, 0));
    assert_eq!(stats(m).failed_allocs, 2);
    for (form, records) in both_forms(m, "refused") {
        let p = plan(&records).unwrap();
        assert_eq!((p.allocs, p.frees, p.failures, p.peak_in_use), (1, 1, 2, 1 << 20), "{form}");
        run_plan_through(manager(), &p);
    }
    ok(kmm_manager_destroy(m, 0));
    // Other rows past the limit are still refused, with the line.
    let log = "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate failure,0x0,18446744073709551615,0x0\n1,0.2,allocate,0x1000,562949953421312,0x0\n";
    let e = kmm::manager::csv::read(log).unwrap_err();
    assert!(e.message.contains("line 3: size 562949953421312 is past KMM_MAX_BUFFER_BYTES"), "{}", e.message);
}

#[test]
fn a_restore_of_a_buffer_older_than_the_trace_takes_memory_in_either_form() {
    // Found by an adversarial run (round 13): two buffers allocated before the trace, one
    // spilled for a new one and restored (spilling the other). The RMM form replayed the restore
    // as an allocation (2 MiB, the run's peak in the InUse column); the full form dropped it
    // (1 MiB).
    let m = manager_with(|c| {
        c.chunk_size = 1 << 20;
        c.hard_limit = 2 << 20;
        c.spill_limit = 16 << 20;
        c.suballocator = KmmSuballocator::KMM_SUBALLOC_HEAP as u32;
    });
    let (mut old0, mut old1, mut b, mut p) = (0, 0, 0, 0);
    ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut old0));
    ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut old1));
    ok(kmm_manager_trace_start(m, 0, std::ptr::null(), 0));
    ok(kmm_buffer_alloc(m, 1 << 20, DEVICE, &mut b)); // spills old0
    ok(kmm_buffer_map(m, old0, &mut p)); // restores old0, spills old1
    ok(kmm_buffer_unmap(m, old0));
    for h in [old0, b, old1] {
        ok(kmm_buffer_free(m, h, 0));
    }
    for (form, records) in both_forms(m, "older") {
        let peak = records.iter().filter(|r| r.kind == 0).map(|r| r.in_use).max().unwrap();
        assert_eq!(peak, 2 << 20, "{form}: the run held 2 MiB during the trace");
        let p = plan(&records).unwrap();
        assert_eq!(p.peak_in_use, peak, "{form}: the replay peaks where the run did");
        assert_eq!((p.in_use_at_end, p.restores + p.allocs), (0, 2), "{form}: b and old0's restore");
        if form == "full" {
            assert_eq!((p.allocs, p.frees, p.unmatched_frees), (1, 1, 2), "{form}: old0 and old1 are older");
        }
        run_plan_through(manager(), &p);
    }
    ok(kmm_manager_destroy(m, 0));
}
