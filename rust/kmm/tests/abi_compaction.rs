//! Compaction through the C ABI: a pool past its compaction ratio moves unmapped buffers to make
//! room instead of growing. Moved buffers keep their bytes, work queued before a move still reads
//! the old place, mapped buffers never move, and a map of a moved buffer waits for its copy. The
//! stream is gated while the moves are queued, so a move that skipped the queue would show up as
//! wrong data on the host backend.
mod common;
use common::*;
use kmm::ffi::ipc::kmm_buffer_ipc_handle;
use kmm::ffi::trace::{kmm_manager_memory_map, KmmMapSegment, KmmSegmentState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The smallest chunk a pool takes (device memory comes in 2 MiB pages).
const CHUNK: u64 = 2 << 20;
const PIECE: u64 = CHUNK / 8;

/// A manager whose device pool grows by 2 MiB chunks and compacts at `ratio_pct`; warmed up
/// (for `Gate::shut`) and trimmed, so its pool starts empty.
fn manager(ratio_pct: u32) -> Mgr {
    let m = Mgr::with(|c| {
        c.chunk_size = CHUNK;
        c.compaction_ratio_pct = ratio_pct;
    });
    Gate::warm(&m);
    ok(kmm_manager_trim(m.0, 0));
    m
}

/// One chunk filled with eight buffers of distinct contents, every odd one freed: half the
/// chunk free in four holes of one buffer each. Returns the four live buffers.
fn checkerboard(m: &Mgr) -> Vec<(KmmBuffer, Vec<u8>)> {
    let all = filled(m, &[PIECE; 8], 100);
    let mut live = Vec::new();
    for (i, piece) in all.into_iter().enumerate() {
        if i % 2 == 1 {
            m.free(piece.0);
        } else {
            live.push(piece);
        }
    }
    let s = m.stats(DEVICE);
    assert_eq!((s.reserved, s.in_use), (CHUNK, 4 * PIECE), "one chunk, half of it live");
    assert_eq!(s.largest_free_block, PIECE, "free space in holes of one buffer each");
    live
}

/// Buffers of the given sizes, in allocation order, each uploaded with its own pattern.
fn filled(m: &Mgr, sizes: &[u64], seed: u64) -> Vec<(KmmBuffer, Vec<u8>)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let b = m.alloc(size, DEVICE);
            let data = pattern(size as usize, seed + i as u64);
            m.upload(b, 0, &data);
            (b, data)
        })
        .collect()
}

fn map(m: &Mgr, b: KmmBuffer) -> u64 {
    let mut p = 0;
    ok(kmm_buffer_map(m.0, b, &mut p));
    p
}

#[test]
fn moved_buffers_keep_their_bytes_and_queued_work_reads_the_old_place() {
    let m = manager(100);
    let live = checkerboard(&m);
    let (pinned, _) = live[0];
    let pinned_at = map(&m, pinned);
    let chunks_before = m.stats(DEVICE).upstream_allocs;
    // Page-locked, so the early read below is queued rather than done at once (CUDA).
    let early_buf = m.alloc(PIECE, PINNED);
    let early = map(&m, early_buf);
    let gate = Gate::shut(&m);
    // Queued before the moves: a read of the old bytes, then new bytes for every movable buffer.
    let mut ev = 0;
    ok(kmm_copy_to_host_async(m.0, early as *mut _, live[1].0, 0, PIECE, &mut ev));
    for (i, (b, _)) in live.iter().enumerate().skip(1) {
        ok(kmm_fill(m.0, *b, 0, PIECE, [0xA0u8 + i as u8].as_ptr().cast(), 1));
    }
    let big = m.alloc(3 * PIECE, DEVICE);
    ok(kmm_fill(m.0, big, 0, 3 * PIECE, [0xEEu8].as_ptr().cast(), 1));
    let s = m.stats(DEVICE);
    assert_eq!(s.compactions, 1, "a buffer of three holes' size needs room made");
    assert!((PIECE..=3 * PIECE).contains(&s.relocated_bytes), "moved {} bytes", s.relocated_bytes);
    assert_eq!(s.reserved, CHUNK, "room was made, not reserved");
    assert_eq!(s.upstream_allocs, chunks_before);
    gate.open();
    ok(kmm_event_wait(m.0, ev));
    ok(kmm_event_destroy(m.0, ev));
    // SAFETY: the pinned buffer is mapped and the copy into it has completed.
    let early_bytes = unsafe { std::slice::from_raw_parts(early as *const u8, PIECE as usize) };
    assert_eq!(early_bytes, &live[1].1[..], "a copy queued before the move reads the old contents");
    ok(kmm_buffer_unmap(m.0, early_buf));
    m.free(early_buf);
    assert_eq!(m.download(pinned, 0, PIECE as usize), live[0].1);
    for (i, (b, _)) in live.iter().enumerate().skip(1) {
        let filled = vec![0xA0u8 + i as u8; PIECE as usize];
        assert_eq!(m.download(*b, 0, PIECE as usize), filled, "buffer {i}: a move lost what was queued before it");
    }
    assert_eq!(m.download(big, 0, 3 * PIECE as usize), vec![0xEE; 3 * PIECE as usize]);
    assert_eq!(map(&m, pinned), pinned_at, "a mapped buffer never moves");
    let mut needed = 0usize;
    ok(kmm_manager_summary(m.0, std::ptr::null_mut(), 0, &mut needed));
    let mut text = vec![0u8; needed];
    ok(kmm_manager_summary(m.0, text.as_mut_ptr().cast(), needed, std::ptr::null_mut()));
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("compactions: 1 ("), "summary lacks the compaction:\n{text}");
    ok(kmm_buffer_unmap(m.0, pinned));
    ok(kmm_buffer_unmap(m.0, pinned));
    for (b, _) in live {
        m.free(b);
    }
    m.free(big);
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers, s.largest_free_block), (0, 0, CHUNK), "the chunk is whole again");
}

#[test]
fn mapped_buffers_are_never_moved() {
    let m = manager(100);
    let live = checkerboard(&m);
    let addrs: Vec<u64> = live.iter().map(|&(b, _)| map(&m, b)).collect();
    let big = m.alloc(3 * PIECE, DEVICE);
    let s = m.stats(DEVICE);
    assert_eq!((s.compactions, s.reserved), (0, 2 * CHUNK), "nothing movable: the pool grows");
    for (&(b, ref data), &at) in live.iter().zip(&addrs) {
        assert_eq!(map(&m, b), at);
        assert_eq!(&m.download(b, 0, PIECE as usize), data);
        ok(kmm_buffer_unmap(m.0, b));
        ok(kmm_buffer_unmap(m.0, b));
    }
    m.free(big);
}

#[test]
fn ratio_zero_never_moves_and_a_lenient_ratio_grows_first() {
    for ratio in [0, 1000] {
        let m = manager(ratio);
        let live = checkerboard(&m);
        let _big = m.alloc(3 * PIECE, DEVICE);
        let s = m.stats(DEVICE);
        assert_eq!((s.compactions, s.reserved), (0, 2 * CHUNK), "ratio {ratio}%");
        for (b, data) in &live {
            assert_eq!(&m.download(*b, 0, PIECE as usize), data);
        }
    }
}

#[test]
fn compaction_serves_what_the_hard_limit_would_refuse() {
    // Growing is within the lenient ratio but past the hard limit: moving buffers is the way out.
    let m = Mgr::with(|c| {
        c.chunk_size = CHUNK;
        c.compaction_ratio_pct = 1000;
        c.hard_limit = CHUNK;
    });
    let live = checkerboard(&m);
    let big = m.alloc(3 * PIECE, DEVICE);
    let s = m.stats(DEVICE);
    assert_eq!((s.compactions, s.reserved, s.failed_allocs), (1, CHUNK, 0));
    for (b, data) in &live {
        assert_eq!(&m.download(*b, 0, PIECE as usize), data);
    }
    // More than the free bytes: out of memory, and nothing stored is lost.
    let mut b = 0;
    expect_err(kmm_buffer_alloc(m.0, 2 * PIECE, DEVICE, &mut b), KMM_ERROR_OUT_OF_MEMORY, &["hard limit"]);
    for (b, data) in &live {
        assert_eq!(&m.download(*b, 0, PIECE as usize), data);
    }
    m.free(big);
}

#[test]
fn map_of_a_moved_buffer_waits_until_its_bytes_are_there() {
    if gpu() {
        return; // reads the mapped address from the CPU: host backend only
    }
    let m = Arc::new(manager(100));
    let live = checkerboard(&m);
    let gate = Gate::shut(&m);
    let _big = m.alloc(3 * PIECE, DEVICE);
    assert_eq!(m.stats(DEVICE).compactions, 1);
    let mapped = Arc::new(AtomicBool::new(false));
    let reader = {
        let (m, live, mapped) = (m.clone(), live.clone(), mapped.clone());
        std::thread::spawn(move || {
            for (b, data) in &live {
                let p = map(&m, *b);
                mapped.store(true, Ordering::SeqCst);
                // SAFETY: host backend: device memory is host memory, mapped for this read.
                let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, PIECE as usize) };
                assert_eq!(bytes, &data[..], "mapped before its move ran");
                ok(kmm_buffer_unmap(m.0, *b));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // The first buffer is the lowest and stays, so the reader may get past it; a moved one stops it.
    let stalled = !reader.is_finished();
    gate.open();
    reader.join().expect("reader saw every buffer's bytes");
    assert!(stalled, "a map of a moved buffer returned while its copy was still queued");
    assert!(mapped.load(Ordering::SeqCst));
}

#[test]
fn ipc_handles_are_for_mapped_buffers_only() {
    let m = Mgr::new();
    let b = m.alloc(1 << 20, DEVICE);
    let (mut out, mut offset) = ([0u8; 64], 0u64);
    let status = kmm_buffer_ipc_handle(m.0, b, out.as_mut_ptr(), &mut offset);
    if !gpu() {
        expect_err(status, KMM_ERROR_NOT_SUPPORTED, &["host backend"]);
        return;
    }
    expect_err(status, KMM_ERROR_INVALID_ARGUMENT, &["is not mapped", "moved"]);
    map(&m, b);
    ok(kmm_buffer_ipc_handle(m.0, b, out.as_mut_ptr(), &mut offset));
    ok(kmm_buffer_unmap(m.0, b));
    m.free(b);
}

/// What a vacated window leaves over beyond the request was a moved buffer's place: a plain
/// allocation served there must not be written from the CPU before the move's copy ran.
#[test]
fn a_new_buffer_over_a_moved_place_waits_for_the_move() {
    if gpu() {
        return; // writes the mapped address from the CPU: host backend only
    }
    let m = Arc::new(manager(100));
    let all = filled(&m, &[PIECE; 8], 300);
    // Mapped: 0, 3, 5, 7. Free: 1, 4, 6. Movable: 2.
    for i in [1, 4, 6] {
        m.free(all[i].0);
    }
    for i in [0, 3, 5, 7] {
        map(&m, all[i].0);
    }
    let gate = Gate::shut(&m);
    let _big = m.alloc(PIECE * 3 / 2, DEVICE);
    assert_eq!(m.stats(DEVICE).compactions, 1);
    let small = m.alloc(PIECE / 2, DEVICE);
    let writer = {
        let m = m.clone();
        std::thread::spawn(move || {
            let p = map(&m, small);
            // SAFETY: host backend: device memory is host memory, mapped for this write.
            unsafe { std::ptr::write_bytes(p as *mut u8, 0x5A, (PIECE / 2) as usize) };
            ok(kmm_buffer_unmap(m.0, small));
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let stalled = !writer.is_finished();
    gate.open();
    writer.join().expect("writer");
    assert!(stalled, "a buffer allocated while moves were queued was mapped before they ran");
    assert_eq!(m.download(all[2].0, 0, PIECE as usize), all[2].1, "the moved buffer lost bytes");
}

/// A compaction that moved blocks and then failed (past the hard limit) still fences its moves.
#[test]
fn moves_of_a_failed_compaction_are_fenced() {
    if gpu() {
        return; // reads the mapped address from the CPU: host backend only
    }
    let unit = CHUNK / 16;
    let m = Arc::new(Mgr::with(|c| {
        c.chunk_size = CHUNK;
        c.compaction_ratio_pct = 100;
        c.hard_limit = CHUNK;
    }));
    let bufs = filled(&m, &[1, 2, 1, 1, 1, 1, 1, 1, 7].map(|k| k * unit), 500);
    for i in [3, 5, 7] {
        m.free(bufs[i].0);
    }
    for i in [2, 4, 6, 8] {
        map(&m, bufs[i].0);
    }
    let gate = Gate::shut(&m);
    // Buffer 0 moves, buffer 1 finds no place, growing hits the limit: the allocation waits in
    // its out-of-memory rung for the (gated) stream.
    let allocating = {
        let m = m.clone();
        std::thread::spawn(move || {
            let mut b = 0;
            kmm_buffer_alloc(m.0, 3 * unit, DEVICE, &mut b)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(m.stats(DEVICE).relocated_bytes > 0, "buffer 0 was moved");
    let reader = {
        let (m, (b, data)) = (m.clone(), bufs[0].clone());
        std::thread::spawn(move || {
            let p = map(&m, b);
            // SAFETY: host backend: device memory is host memory, mapped for this read.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, data.len()) };
            assert_eq!(bytes, &data[..], "mapped before its move ran");
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let stalled = !reader.is_finished();
    gate.open();
    reader.join().expect("reader saw the moved bytes");
    let _ = allocating.join().expect("allocating thread");
    assert!(stalled, "a map of a buffer moved by a failed compaction did not wait");
}

/// A stream recorded on a buffer stays recorded when a compaction moves the buffer: work that
/// stream queues at the new place after a map still holds the memory back at the free.
#[test]
fn a_move_keeps_the_buffers_recorded_streams() {
    if gpu() {
        return; // the foreign work below is a host closure: host backend only
    }
    use kmm::backend::host::HostBackend;
    let m = manager(100);
    let foreign = HostBackend::get(0).expect("host device").create_stream().expect("stream");
    let live = checkerboard(&m);
    let at = |b: KmmBuffer| {
        let a = map(&m, b);
        ok(kmm_buffer_unmap(m.0, b));
        a
    };
    let before: Vec<u64> = live.iter().map(|&(b, _)| at(b)).collect();
    for (b, _) in &live {
        ok(kmm_buffer_record_stream(m.0, *b, foreign.raw()));
    }
    let big = m.alloc(3 * PIECE, DEVICE);
    assert_eq!(m.stats(DEVICE).compactions, 1);
    // Only the moved buffers are freed below: a buffer that kept its place and its record
    // would hold the manager's stream back for all of them.
    let (moved, stayed): (Vec<_>, Vec<_>) = live.iter().zip(&before).partition(|((b, _), &was)| at(*b) != was);
    assert!(!moved.is_empty(), "the compaction moved a buffer");
    // The foreign stream reads each moved buffer at its new place once released; the buffers
    // are freed at once, and their memory asked for again and overwritten on the manager's stream.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let addrs: Vec<u64> = moved.iter().map(|((b, _), _)| map(&m, *b)).collect();
    let (reads, size) = (seen.clone(), PIECE as usize);
    foreign
        .launch_host_fn(Box::new(move || {
            let _ = released.recv();
            for a in addrs {
                // SAFETY: the buffers' frees wait for this stream, so the memory is still theirs.
                reads.lock().unwrap().push(unsafe { std::slice::from_raw_parts(a as *const u8, size) }.to_vec());
            }
        }))
        .expect("queued");
    for ((b, _), _) in &moved {
        ok(kmm_buffer_unmap(m.0, *b));
        m.free(*b);
    }
    let again: Vec<KmmBuffer> = (0..4).map(|_| m.alloc(PIECE, DEVICE)).collect();
    for &b in &again {
        ok(kmm_fill(m.0, b, 0, PIECE, [0xEEu8].as_ptr().cast(), 1));
    }
    std::thread::sleep(Duration::from_millis(30));
    release.send(()).expect("foreign stream waits");
    m.sync();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), moved.len());
    for (i, (((_, data), _), got)) in moved.iter().zip(seen.iter()).enumerate() {
        assert_eq!(got, data, "moved buffer {i}: its memory was reused before the recorded stream read it");
    }
    for b in again.into_iter().chain(stayed.iter().map(|((b, _), _)| *b)) {
        m.free(b);
    }
    m.free(big);
}

/// A buffer freed while a copy still holds it waits, its handle dead, until the copy ends; its
/// pool block keeps the slot of the handle table as owner meanwhile. Found by a review
/// (2026-11-29): the slot went to the next buffer at once, a compaction took the dying block for
/// that buffer's and moved it (the new buffer ended up on the old 256 KiB block, its own block
/// leaked, the old block was freed twice and a later allocation overlapped a live buffer).
#[test]
fn a_block_freed_under_a_copy_is_never_moved_for_another_buffer() {
    const PIECE: u64 = 256 << 10;
    let m = std::sync::Arc::new(Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        c.chunk_size = 2 << 20;
        c.compaction_ratio_pct = 100;
    }));
    Gate::warm(&m);
    ok(kmm_manager_trim(m.0, 0));
    let p: Vec<u64> = (0..8u8)
        .map(|i| {
            let b = m.alloc(PIECE, DEVICE);
            m.upload(b, 0, &vec![0x10 + i; PIECE as usize]);
            b
        })
        .collect();
    for i in [0, 2, 4] {
        m.free(p[i]);
    }
    let mut p3 = 0;
    ok(kmm_buffer_map(m.0, p[3], &mut p3)); // stays put
    m.sync();
    let gate = Gate::shut(&m);
    let (handle, x) = (m.0, p[1]);
    let copier = std::thread::spawn(move || {
        let src = vec![0xAAu8; PIECE as usize];
        kmm_copy_to_device(handle, x, 0, src.as_ptr().cast(), PIECE) // waits behind the gate, leased
    });
    // The copy's own pin (not the caller's map: `kmm_buffer_info` leaves it out) shows in the
    // memory map, which draws a pinned block as mapped.
    let held = |m: &Mgr| {
        let mut segs = vec![KmmMapSegment::default(); 64];
        let mut n = 0usize;
        ok(kmm_manager_memory_map(m.0, DEVICE, segs.as_mut_ptr(), segs.len(), &mut n));
        segs[..n].iter().any(|s| s.buffer == x && s.state == KmmSegmentState::KMM_SEGMENT_MAPPED as u32)
    };
    while !held(&m) {
        std::thread::yield_now();
    }
    ok(kmm_buffer_free(m.0, x, KMM_FREE_FORCE));
    // Until the copy ends its block is held: the map draws it (as held, by its dead handle).
    assert!(held(&m), "the held block is drawn free");
    let y = m.alloc(4 << 20, DEVICE);
    let bb = 0xBBu8;
    ok(kmm_fill(m.0, y, 0, 4 << 20, (&bb as *const u8).cast(), 1));
    let big = m.alloc(3 * PIECE, DEVICE); // a compaction makes room in the chunk
    let ee = 0xEEu8;
    ok(kmm_fill(m.0, big, 0, 3 * PIECE, (&ee as *const u8).cast(), 1));
    gate.open();
    ok(copier.join().unwrap());
    m.sync();
    assert!(m.download(y, 0, 4 << 20).iter().all(|&v| v == 0xBB), "the new buffer lost its bytes");
    assert!(m.download(big, 0, (3 * PIECE) as usize).iter().all(|&v| v == 0xEE));
    for i in [3u8, 5, 6, 7] {
        assert!(m.download(p[i as usize], 0, PIECE as usize).iter().all(|&v| v == 0x10 + i), "piece {i} changed");
    }
    // Every block once: new buffers land on no live one.
    let extra: Vec<u64> = (0..4).map(|_| m.alloc(PIECE, DEVICE)).collect();
    let seven = 0x77u8;
    for &b in &extra {
        ok(kmm_fill(m.0, b, 0, PIECE, (&seven as *const u8).cast(), 1));
    }
    m.sync();
    assert!(m.download(big, 0, (3 * PIECE) as usize).iter().all(|&v| v == 0xEE), "a new buffer overlapped a live one");
    ok(kmm_buffer_unmap(m.0, p[3]));
    for b in extra.into_iter().chain([y, big, p[3], p[5], p[6], p[7]]) {
        m.free(b);
    }
    m.sync();
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers), (0, 0));
}
