//! Defects in stream ordering, handles, lanes and locking, driven through the C ABI. Each test is
//! named after its defect and fails (or crashes, or trips its watchdog) until the defect is fixed.
//! The symptom of a deadlock is a call that never returns, so those tests run their body under
//! `within`, which fails the test instead of hanging the suite.
mod common;
use common::*;
use kmm::ffi::cupy::{kmm_cupy_free, kmm_cupy_live_allocations, kmm_cupy_malloc, kmm_cupy_set_manager};
use kmm::ffi::plugin::{kmm_plugin_alloc, kmm_plugin_free};
use kmm::manager::cells::thread_lane;
use std::collections::{BTreeSet, VecDeque};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;


/// A dead handle naming the registry slot of the live manager `m`: the handle of the manager
/// the slot held before (a handle is the slot in its low 12 bits and the slot's generation
/// above them, and every destroy bumps the generation), or, for a slot in its first use, one
/// never issued. Slots are reused first in, first out, so a new manager lands in a destroyed
/// one's slot only after all 4096 slots have gone round: this spares a test that wait.
fn stale_handle_of_slot(m: &Mgr) -> KmmManager {
    let stale = m.0 - (1 << 12);
    let mut info = KmmManagerInfo::default();
    expect_err(kmm_manager_info(stale, &mut info), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    stale
}

/// Loops `step` on a thread of `s` until `stop` is set.
fn repeat_until<'s>(s: &'s std::thread::Scope<'s, '_>, stop: &'s AtomicBool, step: impl Fn() + Send + 's) {
    s.spawn(move || {
        while !stop.load(Relaxed) {
            step();
        }
    });
}

/// A trim waits for the stream, then gives free chunks back; a buffer allocated, filled (queued)
/// and freed by another thread in between leaves its chunk free while the fill is still queued.
/// Giving that chunk back frees memory the stream worker is about to write: chunks above 32 MiB
/// are mmap'ed by the C allocator, so the write faults.
#[test]
fn trim_races_free() {
    const BIG: u64 = 64 * MIB;
    // Only the filled pages are ever touched: a chunk grown again after a trim costs page faults
    // for these alone.
    const FILL: u64 = 16 * MIB;
    const ROUNDS: u32 = 200;
    // Rounds queued ahead of the one waited for: the stream is never idle, and between rounds
    // the buffer is freed while its fill is still queued.
    const AHEAD: usize = 3;
    // A trim every few rounds: trims that do give the chunk back cost a new one.
    const TRIM_EVERY: u32 = 5;
    let m = Mgr::new();
    let rounds = AtomicU32::new(0);
    std::thread::scope(|s| {
        let filler = s.spawn(|| {
            let mut queued = VecDeque::new();
            for round in 0..ROUNDS {
                let b = m.alloc(BIG, DEVICE);
                ok(kmm_fill(m.0, b, 0, FILL, [round as u8].as_ptr().cast(), 1));
                // No synchronize: the free is stream-ordered, the fill still queued.
                m.free(b);
                let mut ev = 0;
                ok(kmm_manager_record_event(m.0, &mut ev));
                queued.push_back(ev);
                if queued.len() > AHEAD {
                    let ev = queued.pop_front().expect("queued");
                    ok(kmm_event_wait(m.0, ev));
                    ok(kmm_event_destroy(m.0, ev));
                }
                rounds.store(round + 1, Relaxed);
            }
            for ev in queued {
                ok(kmm_event_destroy(m.0, ev));
            }
        });
        let mut trimmed_at = 0;
        while !filler.is_finished() {
            let now = rounds.load(Relaxed);
            if now >= trimmed_at + TRIM_EVERY {
                ok(kmm_manager_trim(m.0, 0));
                trimmed_at = now;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        filler.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
    });
    // The pool still hands out memory that holds what is written to it.
    let b = m.alloc(BIG, DEVICE);
    ok(kmm_fill(m.0, b, 0, FILL, [0x5Au8].as_ptr().cast(), 1));
    let data = pattern(MIB as usize, 7);
    m.upload(b, BIG - MIB, &data);
    assert_eq!(m.download(b, 0, FILL as usize), vec![0x5A; FILL as usize]);
    assert_eq!(m.download(b, BIG - MIB, MIB as usize), data);
    m.free(b);
    ok(kmm_manager_trim(m.0, 0));
    assert_eq!(m.stats(DEVICE).reserved, 0);
}

/// Handles carry a 20-bit generation and a lane's free slots are reused last in, first out, so
/// 2^20 allocations and frees through one slot bring a freed handle back to life.
#[test]
fn handle_generation_wraps() {
    const GENERATIONS: u32 = 1 << 20;
    let m = Mgr::new();
    // Empty buffers take handle slots like any other and cost no memory.
    let stale = m.alloc(0, DEVICE);
    m.free(stale);
    let mut reissued = None;
    for _ in 0..GENERATIONS + 2 {
        let b = m.alloc(0, DEVICE);
        if b == stale {
            reissued = Some(b);
            break;
        }
        m.free(b);
    }
    // Keep one buffer live: the one that got the stale handle back, if any.
    let live = reissued.unwrap_or_else(|| m.alloc(0, DEVICE));
    let mut info = KmmBufferInfo::default();
    let status = kmm_buffer_info(m.0, stale, &mut info);
    assert_eq!(status, KMM_ERROR_INVALID_HANDLE, "freed handle {stale:#x} is live again after {GENERATIONS} reuses of its slot");
    expect_err(kmm_buffer_free(m.0, stale, 0), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    ok(kmm_buffer_info(m.0, live, &mut info));
    assert_eq!(m.stats(DEVICE).live_buffers, 1);
    m.free(live);
}

/// Sixteen threads in turn (each dealt its own lane) allocate and free one large buffer. A lane
/// must take another lane's free chunk before it grows, and the peak is the manager's own, not
/// the sum of each lane's peak.
#[test]
fn lanes_do_not_strand_memory() {
    const BIG: u64 = 256 * MIB;
    let m = Mgr::new();
    let mut lanes = BTreeSet::new();
    for _ in 0..16 {
        let lane = std::thread::scope(|s| {
            s.spawn(|| {
                m.free(m.alloc(BIG, DEVICE));
                thread_lane()
            })
            .join()
            .expect("thread")
        });
        lanes.insert(lane);
    }
    m.sync();
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers), (0, 0));
    assert!(
        s.reserved <= 2 * BIG,
        "one {} MiB buffer at a time from {} lanes left {} MiB reserved",
        BIG / MIB,
        lanes.len(),
        s.reserved / MIB
    );
    assert_eq!(s.peak_in_use, BIG, "peak in use of one {} MiB buffer at a time", BIG / MIB);
}

/// Threads whose needs peak at different times share one set of chunks: a lane that would grow
/// first takes the free blocks another lane holds. One thread leaves every other 4 MiB block of
/// its 256 MiB free (so no chunk of its lane is entirely free); another thread's 128 MiB then fit
/// in those blocks instead of reserving 128 MiB more.
#[test]
fn lanes_share_free_blocks() {
    const BLOCK: u64 = 4 * MIB;
    let m = Mgr::with(|c| c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32); // lanes are the pool's
    let kept: Vec<KmmBuffer> = std::thread::scope(|s| {
        s.spawn(|| {
            let all: Vec<KmmBuffer> = (0..64).map(|_| m.alloc(BLOCK, DEVICE)).collect();
            let (freed, kept): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
            freed.into_iter().for_each(|(_, b)| m.free(b));
            kept.into_iter().map(|(_, b)| b).collect()
        })
        .join()
        .expect("first thread")
    });
    let before = m.stats(DEVICE).reserved;
    assert!(before >= 256 * MIB);
    let second: Vec<KmmBuffer> = std::thread::scope(|s| {
        s.spawn(|| {
            let bufs: Vec<KmmBuffer> = (0..32).map(|_| m.alloc(BLOCK, DEVICE)).collect();
            for (i, &b) in bufs.iter().enumerate() {
                m.upload(b, 0, &pattern(4096, i as u64));
            }
            bufs
        })
        .join()
        .expect("second thread")
    });
    let s = m.stats(DEVICE);
    assert!(
        s.reserved <= before + 8 * MIB,
        "128 MiB while 128 MiB of free blocks sat in another lane took the reserve from {} to {} MiB",
        before / MIB,
        s.reserved / MIB
    );
    for (i, &b) in second.iter().enumerate() {
        assert_eq!(m.download(b, 0, 4096), pattern(4096, i as u64), "buffer {i} placed in another lane's free block");
    }
    kept.into_iter().chain(second).for_each(|b| m.free(b));
    assert_eq!(m.stats(DEVICE).in_use, 0);
}

/// Another lane's free space is fragmented (1 MiB holes between live buffers): no free block
/// fits a 4 MiB request, and growing would take the manager past its compaction ratio. The lane
/// holding the holes compacts to lend the room; the manager does not grow, and the moved
/// buffers keep their bytes.
#[test]
fn a_lane_compacts_to_lend_before_the_manager_grows() {
    const BLOCK: u64 = MIB;
    let m = Mgr::with(|c| {
        c.alloc_mode = KmmAllocMode::KMM_ALLOC_POOL as u32;
        c.compaction_ratio_pct = 125;
    });
    let kept: Vec<(KmmBuffer, u64)> = std::thread::scope(|s| {
        s.spawn(|| {
            let all: Vec<KmmBuffer> = (0..64).map(|_| m.alloc(BLOCK, DEVICE)).collect();
            let (freed, kept): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
            freed.into_iter().for_each(|(_, b)| m.free(b));
            kept.into_iter()
                .map(|(i, b)| {
                    m.upload(b, 0, &pattern(4096, i as u64));
                    (b, i as u64)
                })
                .collect()
        })
        .join()
        .expect("first thread")
    });
    let before = m.stats(DEVICE);
    assert_eq!(before.in_use, 32 * BLOCK);
    let big = std::thread::scope(|s| s.spawn(|| (0..4).map(|_| m.alloc(4 * BLOCK, DEVICE)).collect::<Vec<_>>()).join().expect("second thread"));
    let after = m.stats(DEVICE);
    assert_eq!(
        after.reserved,
        before.reserved,
        "16 MiB with 32 MiB of 1 MiB holes in another lane grew the reserve from {} to {} MiB instead of compacting",
        before.reserved / MIB,
        after.reserved / MIB
    );
    assert!(after.compactions > before.compactions);
    for &(b, i) in &kept {
        assert_eq!(m.download(b, 0, 4096), pattern(4096, i), "a buffer moved to lend room lost its bytes");
    }
    kept.into_iter().map(|(b, _)| b).chain(big).for_each(|b| m.free(b));
}

/// Copies both ways between two managers must move the right bytes while both are alive.
fn copies_move_correct_data(a: &Mgr, b: &Mgr) {
    const N: usize = 64 << 10;
    let (ab, bb) = (a.alloc(2 * N as u64, DEVICE), b.alloc(2 * N as u64, DEVICE));
    let (first, second) = (pattern(N, 11), pattern(N, 12));
    a.upload(ab, 0, &first);
    b.upload(bb, N as u64, &second);
    std::thread::scope(|s| {
        s.spawn(|| ok(kmm_copy_buffer(b.0, bb, 0, a.0, ab, 0, N as u64)));
        s.spawn(|| ok(kmm_copy_buffer(a.0, ab, N as u64, b.0, bb, N as u64, N as u64)));
    });
    assert_eq!(b.download(bb, 0, N), first);
    assert_eq!(a.download(ab, N as u64, N), second);
    a.free(ab);
    b.free(bb);
}

/// How long each race runs. On the current code each deadlocked within 0.5 s in every trial
/// (2 cores, under load); the races below must survive it.
const RACE: Duration = Duration::from_millis(1500);

/// Each copy holds its destination manager's read lock while it takes its source's, so copies
/// A->B and B->A take two locks in opposite orders; with writers waiting on both (destroys,
/// which new readers queue behind) each copy waits for the other. A destroy through a stale
/// handle write-locks the slot it names just as a real destroy does (before it finds the
/// handle stale), so it can be repeated until the race is won; the real destroys come last. Copies of zero bytes take the same locks
/// and queue nothing, so the loops spin fast and the streams stay idle.
fn cross_copies_race_destroys(a: Mgr, b: Mgr) {
    let (a_stale, b_stale) = (stale_handle_of_slot(&a), stale_handle_of_slot(&b));
    let (ab, bb) = (a.alloc(4096, DEVICE), b.alloc(4096, DEVICE));
    // The stale writers run until the real destroys begin, the copies until those have ended.
    let (destroying, destroyed) = (&AtomicBool::new(false), &AtomicBool::new(false));
    std::thread::scope(|s| {
        for (dm, db, sm, sb) in [(a.0, ab, b.0, bb), (b.0, bb, a.0, ab)] {
            for _ in 0..3 {
                repeat_until(s, destroyed, move || match kmm_copy_buffer(dm, db, 0, sm, sb, 0, 0) {
                    KMM_OK => {}
                    KMM_ERROR_INVALID_HANDLE if destroying.load(Relaxed) => {}
                    other => panic!("copy between live managers: {other:?}: {}", last_error()),
                });
            }
        }
        for stale in [a_stale, b_stale] {
            repeat_until(s, destroying, move || assert_eq!(kmm_manager_destroy(stale, 0), KMM_ERROR_INVALID_HANDLE, "{}", last_error()));
        }
        std::thread::sleep(RACE);
        destroying.store(true, Relaxed);
        // Then the managers themselves, from threads of their own, while the copies go on.
        let destroys = [a.0, b.0].map(|m| s.spawn(move || kmm_manager_destroy(m, 0)));
        let statuses = destroys.map(|d| d.join().expect("destroy"));
        destroyed.store(true, Relaxed);
        assert_eq!(statuses, [KMM_OK; 2], "destroying the managers copied between");
    });
    drop((a, b)); // Already destroyed: their own destroy finds the handles dead.
}

/// A stale source handle that names the destination's registry slot: the copy holds that slot's
/// read lock and takes it again for the source; with a writer waiting in between, the second
/// read waits for the writer and the writer for the first read. The copy must instead find the
/// source stale.
fn stale_source_races_destroy(y: Mgr) {
    let x_stale = stale_handle_of_slot(&y);
    let yb = y.alloc(4096, DEVICE);
    // The stale writer runs until the real destroy begins, the copies until it has ended.
    let (destroying, destroyed) = (&AtomicBool::new(false), &AtomicBool::new(false));
    std::thread::scope(|s| {
        for _ in 0..2 {
            // Invalid either way: the source is stale, and later the destination is destroyed.
            repeat_until(s, destroyed, || expect_err(kmm_copy_buffer(y.0, yb, 0, x_stale, yb, 0, 0), KMM_ERROR_INVALID_HANDLE, &[]));
        }
        repeat_until(s, destroying, || assert_eq!(kmm_manager_destroy(x_stale, 0), KMM_ERROR_INVALID_HANDLE, "{}", last_error()));
        std::thread::sleep(RACE);
        destroying.store(true, Relaxed);
        // The live manager's own destroy, while the copies go on.
        let status = kmm_manager_destroy(y.0, 0);
        destroyed.store(true, Relaxed);
        ok(status);
    });
}

#[test]
fn copy_lock_order() {
    within(20, "copies racing destroys", || {
        let (a, b) = (Mgr::new(), Mgr::new());
        copies_move_correct_data(&a, &b);
        cross_copies_race_destroys(a, b);
        stale_source_races_destroy(Mgr::new());
    });
}

/// Adopted memory is freed through a deferral that is drained only by synchronize and trim, so
/// a program that wraps and frees without either piles it all up. Once the stream has passed a
/// free (an event waited for says so) the memory must go back.
#[test]
fn adopted_memory_is_returned_without_trim() {
    if gpu() {
        return; // Adopting malloc'ed memory is the host backend's contract only.
    }
    const SIZE: u64 = 64 << 10;
    const ROUNDS: u32 = 2000;
    const WAIT_EVERY: u32 = 32;
    let m = Mgr::new();
    let mut most = 0;
    for round in 0..ROUNDS {
        // SAFETY: a plain allocation, handed to Kmm, which frees it.
        let p = unsafe { libc::malloc(SIZE as usize) };
        assert!(!p.is_null());
        let mut b = 0;
        ok(kmm_buffer_wrap(m.0, p, SIZE, DEVICE, KmmOwnership::KMM_ADOPT as u32, &mut b));
        m.free(b);
        most = most.max(m.stats(DEVICE).reserved);
        if round % WAIT_EVERY == WAIT_EVERY - 1 {
            // The stream passes every free so far (no synchronize, no trim).
            let mut ev = 0;
            ok(kmm_manager_record_event(m.0, &mut ev));
            ok(kmm_event_wait(m.0, ev));
            ok(kmm_event_destroy(m.0, ev));
        }
    }
    assert!(most < 64 * SIZE, "{ROUNDS} adopted {} KiB buffers, freed one at a time, reserved up to {} KiB", SIZE >> 10, most >> 10);
}

/// A range that wraps past the top of the address space is no memory at all.
#[test]
fn wrap_rejects_wrapping_range() {
    let m = Mgr::new();
    let mut b = 0;
    let status = kmm_buffer_wrap(m.0, (u64::MAX - 100) as *mut c_void, 4096, DEVICE, KmmOwnership::KMM_BORROW as u32, &mut b);
    let msg = last_error();
    if status == KMM_OK {
        m.free(b); // Borrowed: Kmm never touches the memory.
    }
    assert!(matches!(status, KMM_ERROR_INVALID_ARGUMENT | KMM_ERROR_OUT_OF_RANGE), "wrapping {:#x} + 4096 gave {status:?}", u64::MAX - 100);
    assert!(msg.contains("ptr") || msg.contains("bytes"), "error message {msg:?} names neither ptr nor bytes");
}

/// `kmm_host_register`, expecting a refusal; a registration it accepts by mistake is undone so
/// the failing test leaves no range registered. Returns the status and the message.
fn register_refused(m: &Mgr, ptr: *mut u8, bytes: u64) -> (KmmStatus, String) {
    let status = kmm_host_register(m.0, ptr.cast(), bytes);
    let msg = last_error();
    if status == KMM_OK {
        ok(kmm_host_unregister(m.0, ptr.cast()));
    }
    assert!(
        matches!(status, KMM_ERROR_INVALID_ARGUMENT | KMM_ERROR_OUT_OF_RANGE | KMM_ERROR_SIZE_OVERFLOW),
        "registering {bytes} bytes at {ptr:?} gave {status:?}"
    );
    (status, msg)
}

/// Registration checks its range (size, wrap-around, overlap with other registrations) and
/// belongs to the manager that made it.
#[test]
fn host_register_checks() {
    let (a, b) = (Mgr::new(), Mgr::new());
    let mut memory = vec![0u8; 4 * 4096];
    let p = memory.as_mut_ptr();
    let (_, msg) = register_refused(&a, p, u64::MAX);
    assert!(msg.contains("bytes"), "error message {msg:?} does not name bytes");
    let (_, msg) = register_refused(&a, (u64::MAX - 4095) as *mut u8, 8192);
    assert!(msg.contains("ptr") || msg.contains("bytes"), "error message {msg:?} names neither ptr nor bytes");
    ok(kmm_host_register(a.0, p.cast(), 2 * 4096));
    // The same pointer twice is refused; so must be any range sharing bytes with it.
    expect_err(kmm_host_register(a.0, p.cast(), 4096), KMM_ERROR_INVALID_ARGUMENT, &[]);
    // SAFETY (both): inside `memory`.
    let (tail, inside) = unsafe { (p.add(4096), p.add(1024)) };
    let (status, _) = register_refused(&a, tail, 2 * 4096);
    assert_eq!(status, KMM_ERROR_INVALID_ARGUMENT, "a range overlapping a registration's tail");
    let (status, _) = register_refused(&a, inside, 1024);
    assert_eq!(status, KMM_ERROR_INVALID_ARGUMENT, "a range inside a registration");
    // Another manager cannot undo A's registration.
    let status = kmm_host_unregister(b.0, p.cast());
    assert_eq!(status, KMM_ERROR_INVALID_ARGUMENT, "manager B unregistered memory registered through A");
    ok(kmm_host_unregister(a.0, p.cast()));
    drop(memory);
}

/// CuPy asks for zero bytes at times; that must give NULL and hold nothing, not an empty buffer
/// that is never freed (CuPy does not free NULL).
/// The CuPy state is process-wide: the tests that use it take turns.
static CUPY_STATE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn cupy_malloc_zero_does_not_leak() {
    let _turn = CUPY_STATE.lock().unwrap_or_else(|e| e.into_inner());
    let m = Mgr::new();
    ok(kmm_cupy_set_manager(0, m.0));
    for i in 0..1000 {
        assert!(kmm_cupy_malloc(null_mut(), 0, 0).is_null(), "call {i}: a zero-byte allocation has no address");
    }
    let mut live = u64::MAX;
    ok(kmm_cupy_live_allocations(&mut live));
    let s = m.stats(DEVICE);
    assert_eq!((live, s.live_buffers, s.in_use), (0, 0, 0), "(CuPy allocations, live buffers, bytes) after 1000 zero-byte mallocs");
}

/// A plugin buffer freed on another stream than it was allocated for: the free waits for the
/// work queued on the freeing stream, not only on the allocation's.
#[test]
fn plugin_free_waits_for_its_own_stream() {
    if gpu() {
        return; // the foreign work is a host closure: host backend only
    }
    use kmm::backend::host::HostBackend;
    const LEN: usize = 1 << 16;
    let m = Mgr::new();
    let host = HostBackend::get(0).expect("host device");
    let (alloc_stream, free_stream) = (host.create_stream().expect("stream"), host.create_stream().expect("stream"));
    let (mut buf, mut ptr) = (0, 0);
    ok(kmm_plugin_alloc(m.0, LEN as u64, DEVICE, alloc_stream.raw(), &mut buf, &mut ptr));
    let data = pattern(LEN, 9);
    // SAFETY: mapped plugin memory of LEN bytes, nothing queued on it yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, LEN) };
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (tx, seen) = std::sync::mpsc::channel::<Vec<u8>>();
    free_stream
        .launch_host_fn(Box::new(move || {
            let _ = released.recv();
            // SAFETY: the free below waits for this stream, so the memory is still the buffer's.
            let _ = tx.send(unsafe { std::slice::from_raw_parts(ptr as *const u8, LEN) }.to_vec());
        }))
        .expect("queued");
    ok(kmm_plugin_free(m.0, buf, free_stream.raw()));
    let next: Vec<KmmBuffer> = (0..4).map(|_| m.alloc(LEN as u64, DEVICE)).collect();
    for &b in &next {
        ok(kmm_fill(m.0, b, 0, LEN as u64, [0xEEu8].as_ptr().cast(), 1));
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    release.send(()).expect("the freeing stream waits");
    assert!(seen.recv().expect("read") == data, "the block was reused before the freeing stream's work read it");
    m.sync();
    for b in next {
        m.free(b);
    }
}

/// A plugin buffer is pinned from its allocation to its free (its library keeps the address, so
/// no compaction may move it), on every allocation path; `kmm_plugin_free` frees it pinned.
#[test]
fn plugin_buffers_are_pinned_until_freed() {
    let m = Mgr::new();
    // The first allocations grow the pool; the later ones are served by its free blocks.
    for round in 0..3 {
        let plugin: Vec<(KmmBuffer, u64)> = (0..4)
            .map(|_| {
                let (mut buf, mut ptr) = (0, 0);
                ok(kmm_plugin_alloc(m.0, 1 << 20, DEVICE, 0, &mut buf, &mut ptr));
                (buf, ptr)
            })
            .collect();
        for &(buf, _) in &plugin {
            let mut info = KmmBufferInfo::default();
            ok(kmm_buffer_info(m.0, buf, &mut info));
            assert_eq!(info.pins, 1, "round {round}: a plugin buffer must be pinned");
            let st = kmm_buffer_free(m.0, buf, 0);
            assert_eq!(st, KmmStatus::KMM_ERROR_BUFFER_MAPPED, "round {round}: a pinned buffer's plain free is refused");
        }
        for (buf, _) in plugin {
            ok(kmm_plugin_free(m.0, buf, 0));
        }
    }
    m.sync();
    let mut stats = KmmMemoryStats::default();
    ok(kmm_manager_stats(m.0, DEVICE, &mut stats));
    assert_eq!(stats.live_buffers, 0);
}

fn plugin_alloc(m: &Mgr, bytes: u64) -> (KmmBuffer, u64) {
    let (mut buffer, mut ptr) = (0, 0);
    ok(kmm_plugin_alloc(m.0, bytes, DEVICE, 0, &mut buffer, &mut ptr));
    (buffer, ptr)
}

fn buffer_info(m: &Mgr, b: KmmBuffer) -> KmmBufferInfo {
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, b, &mut info));
    info
}

/// A manager on the host backend with 4 MiB of device memory in 2 MiB chunks that spills.
fn spilling_manager() -> Mgr {
    Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.chunk_size = 2 << 20;
        c.hard_limit = 4 << 20;
        c.spill_limit = 64 << 20;
    })
}

/// The plugin allocations that the calling thread's lane does not serve at once are pinned too:
/// one borrowed from another lane's free blocks, one served after a spill made room.
#[test]
fn plugin_buffers_from_other_lanes_and_after_a_spill_are_pinned() {
    let m = Mgr::with(|c| c.backend = KmmBackend::KMM_BACKEND_HOST as u32);
    let m = &m;
    std::thread::scope(|s| {
        // Lane A keeps 1 MiB of its chunk and leaves the rest free.
        let (lane_a, kept) = s
            .spawn(|| {
                let kept = m.alloc(1 << 20, DEVICE);
                m.free(m.alloc(4 << 20, DEVICE));
                m.sync();
                (thread_lane(), kept)
            })
            .join()
            .expect("lane A");
        s.spawn(move || {
            assert_ne!(thread_lane(), lane_a);
            let (b, ptr) = plugin_alloc(m, 1 << 20);
            assert_eq!(kmm::manager::handles::lane_of(b), lane_a, "a borrow from lane A was expected");
            assert!(ptr != 0 && buffer_info(m, b).pins == 1, "a borrowed plugin buffer must be pinned");
            ok(kmm_plugin_free(m.0, b, 0));
        })
        .join()
        .expect("borrowing thread");
        m.free(kept);
    });
    let m = spilling_manager();
    let x = m.alloc(4 << 20, DEVICE);
    let (b, _) = plugin_alloc(&m, 4 << 20);
    assert_eq!(buffer_info(&m, x).spilled, 1, "the allocation needed a spill");
    assert_eq!(buffer_info(&m, b).pins, 1, "a plugin buffer served after a spill must be pinned");
    ok(kmm_plugin_free(m.0, b, 0));
    m.free(x);
}

/// A plugin buffer placed where a spilled buffer's copy out is still queued is handed out only
/// after that copy ran (the library writes to it at once, outside any stream).
#[test]
fn plugin_buffer_waits_for_the_copy_out_where_it_lies() {
    let m = spilling_manager();
    let x = m.alloc(4 << 20, DEVICE);
    let data = pattern(4 << 20, 9);
    m.upload(x, 0, &data);
    m.sync();
    let gate = Arc::new(Gate::shut(&m));
    let opener = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            gate.open();
        })
    };
    // y spills x (its copy out queued behind the gate) and takes its place, then goes.
    let y = m.alloc(4 << 20, DEVICE);
    assert_eq!(buffer_info(&m, x).spilled, 1);
    m.free(y);
    // Served by the lane's free block, where x's copy out may still be queued.
    let (b, ptr) = plugin_alloc(&m, 4 << 20);
    // SAFETY: a mapped plugin buffer of 4 MiB.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, 0x5A, 4 << 20) };
    ok(kmm_plugin_free(m.0, b, 0));
    opener.join().expect("opener");
    assert!(m.download(x, 0, data.len()) == data, "the plugin buffer was handed out before the copy out ran");
}

/// A free through `kmm_plugin_free` on a stream the backend refuses is refused, the buffer kept,
/// whether the buffer is resident or spilled.
#[test]
fn plugin_free_refuses_an_unknown_stream_resident_or_spilled() {
    let m = spilling_manager();
    let bogus = 0xdead_beef_u64;
    let (b, _) = plugin_alloc(&m, 4 << 20);
    ok(kmm_buffer_unmap(m.0, b));
    let y = m.alloc(4 << 20, DEVICE);
    assert_eq!(buffer_info(&m, b).spilled, 1);
    assert_eq!(kmm_plugin_free(m.0, b, bogus), KmmStatus::KMM_ERROR_INVALID_ARGUMENT, "spilled");
    assert_eq!(buffer_info(&m, b).bytes, 4 << 20, "the refused free kept the spilled buffer");
    m.free(y);
    let (r, _) = plugin_alloc(&m, 1 << 20);
    assert_eq!(kmm_plugin_free(m.0, r, bogus), KmmStatus::KMM_ERROR_INVALID_ARGUMENT, "resident");
    ok(kmm_plugin_free(m.0, r, 0));
    ok(kmm_plugin_free(m.0, b, 0));
}

/// PyTorch's `record_stream` for memory from `kmm_torch_malloc`: freed on the stream it was
/// allocated for, its memory still waits for a side stream recorded with
/// `kmm_torch_record_stream`; unknown addresses are refused by name.
#[test]
fn torch_record_stream_orders_the_free() {
    if gpu() {
        return; // the side stream's work is a host closure: host backend only
    }
    use kmm::backend::host::HostBackend;
    use kmm::ffi::torch::{kmm_torch_free, kmm_torch_malloc, kmm_torch_manager, kmm_torch_record_stream};
    const LEN: usize = 1 << 16;
    let mut manager = 0;
    ok(kmm_torch_manager(0, &mut manager));
    let host = HostBackend::get(0).expect("host device");
    let (alloc_stream, side_stream) = (host.create_stream().expect("stream"), host.create_stream().expect("stream"));
    let as_ptr = |raw: u64| raw as *mut c_void;
    let ptr = kmm_torch_malloc(LEN, 0, as_ptr(alloc_stream.raw()));
    assert!(!ptr.is_null());
    let data = pattern(LEN, 21);
    // SAFETY: LEN bytes of live host-backend memory, nothing queued on them yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, LEN) };
    ok(kmm_torch_record_stream(ptr, as_ptr(side_stream.raw())));
    let (release, released) = mpsc::channel::<()>();
    let (tx, seen) = mpsc::channel::<Vec<u8>>();
    let addr = ptr as u64;
    side_stream
        .launch_host_fn(Box::new(move || {
            let _ = released.recv();
            // SAFETY: the free below waits for this stream, so the memory is still the tensor's.
            let _ = tx.send(unsafe { std::slice::from_raw_parts(addr as *const u8, LEN) }.to_vec());
        }))
        .expect("queued");
    kmm_torch_free(ptr, LEN, 0, as_ptr(alloc_stream.raw()));
    let next: Vec<KmmBuffer> = (0..4)
        .map(|_| {
            let mut b = 0;
            ok(kmm_buffer_alloc(manager, LEN as u64, DEVICE, &mut b));
            ok(kmm_fill(manager, b, 0, LEN as u64, [0xEEu8].as_ptr().cast(), 1));
            b
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    release.send(()).expect("the side stream waits");
    assert!(seen.recv().expect("read") == data, "the tensor's block was reused before the recorded side stream read it");
    ok(kmm_manager_synchronize(manager));
    for b in next {
        ok(kmm_buffer_free(manager, b, 0));
    }
    let status = kmm_torch_record_stream(ptr, as_ptr(side_stream.raw()));
    let message = last_error();
    assert_eq!(status, KmmStatus::KMM_ERROR_INVALID_ARGUMENT);
    assert!(message.contains("ptr = ") && message.contains("kmm_torch_malloc"), "{message}");
}

/// A manager closed (destroyed) while CuPy still held memory of it by address: CuPy's late free
/// of that address must not free what a new manager allocated there since (it freed the new
/// allocation, and the next one shared its memory).
#[test]
fn a_late_free_by_address_after_a_destroy_frees_no_new_allocation() {
    let _turn = CUPY_STATE.lock().unwrap_or_else(|e| e.into_inner());
    let mut reused = 0;
    for _ in 0..20 {
        let m1 = Mgr::new();
        ok(kmm_cupy_set_manager(0, m1.0));
        let p = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert!(!p.is_null());
        ok(kmm_cupy_set_manager(0, 0));
        drop(m1); // destroyed with CuPy's allocation live (a forced close)
        let m2 = Mgr::new();
        ok(kmm_cupy_set_manager(0, m2.0));
        let q = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert!(!q.is_null());
        // An allocation that landed on the old address is held back: a second live buffer.
        reused += usize::from(q == p || m2.stats(DEVICE).live_buffers == 2);
        kmm_cupy_free(null_mut(), p, 0); // CuPy drops the old array at last
        let r = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert!(!r.is_null());
        assert_ne!(r, q, "the late free of the old address freed the new allocation at it");
        for x in [q, r] {
            kmm_cupy_free(null_mut(), x, 0);
        }
        let mut live = u64::MAX;
        ok(kmm_cupy_live_allocations(&mut live));
        assert_eq!((live, m2.stats(DEVICE).live_buffers), (0, 0), "every allocation freed once");
        ok(kmm_cupy_set_manager(0, 0));
    }
    // (Whether a new manager's memory lands at the old address is the allocator's choice; the
    // test means something only where it does.)
    eprintln!("{reused} of 20 new managers allocated at the orphaned address first");
}

/// A plugin buffer allocated for a host stream whose manager is destroyed before the free: the
/// free goes on (that stream's work has run), where it was refused and the buffer leaked.
#[test]
fn a_plugin_free_on_a_stream_that_is_gone_frees() {
    if gpu() {
        return; // host streams: a destroyed CUDA stream cannot be told from one never made
    }
    let m = Mgr::new();
    let other = Mgr::new();
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(other.0, &mut info));
    let (mut b, mut p) = (0, 0);
    ok(kmm_plugin_alloc(m.0, 4096, DEVICE, info.stream, &mut b, &mut p));
    drop(other);
    ok(kmm_plugin_free(m.0, b, info.stream));
    assert_eq!(m.stats(DEVICE).live_buffers, 0, "the buffer leaked");
    // A stream that never was is still refused where it is recorded for a live buffer.
    let (mut b, mut p) = (0, 0);
    ok(kmm_plugin_alloc(m.0, 4096, DEVICE, 0, &mut b, &mut p));
    expect_err(kmm_buffer_record_stream(m.0, b, 0x7777_0001), KMM_ERROR_INVALID_ARGUMENT, &["not a live host-backend stream"]);
    ok(kmm_plugin_free(m.0, b, 0));
}

fn cupy_live() -> u64 {
    let mut n = u64::MAX;
    ok(kmm_cupy_live_allocations(&mut n));
    n
}

/// A destroy racing CuPy allocations on another thread: no allocation of the destroyed manager
/// stays recorded as live (its late free would then free whatever a newer manager put at that
/// address), and every pointer the thread got is an orphan its late free consumes.
#[test]
fn a_destroy_racing_allocations_by_address_leaves_no_live_entry() {
    let _turn = CUPY_STATE.lock().unwrap_or_else(|e| e.into_inner());
    for it in 0..300 {
        let m = Mgr::new();
        ok(kmm_cupy_set_manager(0, m.0));
        let stop = Arc::new(AtomicBool::new(false));
        let allocator = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut ptrs = Vec::new();
                while !stop.load(Relaxed) && ptrs.len() < 20_000 {
                    let p = kmm_cupy_malloc(null_mut(), 256, 0);
                    if p.is_null() {
                        break;
                    }
                    ptrs.push(p as u64);
                }
                ptrs
            })
        };
        for _ in 0..(it % 50) * 20 {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
        let handle = m.0;
        std::mem::forget(m);
        ok(kmm_manager_destroy(handle, 0));
        stop.store(true, Relaxed);
        let ptrs = allocator.join().unwrap();
        ok(kmm_cupy_set_manager(0, 0));
        assert_eq!(cupy_live(), 0, "iteration {it}: an allocation of the destroyed manager is recorded as live");
        for p in ptrs {
            kmm_cupy_free(null_mut(), p as *mut c_void, 0); // the late frees
        }
    }
}

/// An allocation held back at an orphaned address whose manager is destroyed in turn: the orphan
/// still waits for its late free, so a third manager's allocation there is held back again, and
/// that late free frees nothing of the third manager's.
#[test]
fn an_orphan_outlives_the_manager_that_held_its_address_back() {
    let _turn = CUPY_STATE.lock().unwrap_or_else(|e| e.into_inner());
    // Several rounds: where the next manager's memory lands is the allocator's choice (other
    // tests allocate at the same time), and the check means something where it lands on p.
    for round in 0..20 {
        let m1 = Mgr::new();
        ok(kmm_cupy_set_manager(0, m1.0));
        let p = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert!(!p.is_null());
        ok(kmm_cupy_set_manager(0, 0));
        drop(m1);
        let m2 = Mgr::new();
        ok(kmm_cupy_set_manager(0, m2.0));
        let q = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert_ne!(q, p);
        kmm_cupy_free(null_mut(), q, 0);
        ok(kmm_cupy_set_manager(0, 0));
        drop(m2);
        let m3 = Mgr::new();
        ok(kmm_cupy_set_manager(0, m3.0));
        let a = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert!(!a.is_null() && a != p, "round {round}: m3's allocation was handed out at the orphaned address");
        kmm_cupy_free(null_mut(), p, 0); // m1's late free
        let b = kmm_cupy_malloc(null_mut(), 4096, 0);
        assert!(!b.is_null() && b != a, "round {round}: m1's late free freed m3's allocation");
        for x in [a, b] {
            kmm_cupy_free(null_mut(), x, 0);
        }
        assert_eq!((cupy_live(), m3.stats(DEVICE).live_buffers), (0, 0));
        ok(kmm_cupy_set_manager(0, 0));
    }
}
