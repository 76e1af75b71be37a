//! Stream ordering, events and foreign streams. On the host backend queued work runs later on a
//! worker thread; a gate holds the stream so that any operation that skipped the queue would
//! show up as wrong data.
mod common;
use common::*;

#[test]
fn freed_block_is_reused_only_after_queued_reads() {
    let m = Mgr::new();
    let len = 1 << 20;
    let a = m.alloc(len, DEVICE);
    let data = pattern(len as usize, 1);
    m.upload(a, 0, &data);
    let gate = Gate::close(&m);
    let mut out = vec![0u8; len as usize];
    let mut ev = 0;
    ok(kmm_copy_to_host_async(m.0, out.as_mut_ptr().cast(), a, 0, len, &mut ev));
    let mut done = true;
    ok(kmm_event_query(m.0, ev, &mut done));
    assert!(!done, "the stream is gated: the copy cannot have run");
    m.free(a);
    let b = m.alloc(len, DEVICE);
    let mut pa = 0;
    ok(kmm_buffer_map(m.0, b, &mut pa));
    ok(kmm_buffer_unmap(m.0, b));
    ok(kmm_fill(m.0, b, 0, len, [0xFFu8].as_ptr().cast(), 1));
    gate.open();
    ok(kmm_event_wait(m.0, ev));
    assert_eq!(out, data, "the copy queued before the free must read the old contents");
    assert_eq!(m.download(b, 0, 16), vec![0xFF; 16]);
    ok(kmm_event_destroy(m.0, ev));
    m.free(b);
}

#[test]
fn pinned_memory_is_not_reused_before_the_stream_passes_its_free() {
    let m = Mgr::new();
    let len = 64 << 10;
    let p = m.alloc(len, PINNED);
    let mut ptr = 0;
    ok(kmm_buffer_map(m.0, p, &mut ptr));
    unsafe { std::ptr::write_bytes(ptr as *mut u8, 0x11, len as usize) };
    ok(kmm_buffer_unmap(m.0, p));
    let d = m.alloc(len, DEVICE);
    let gate = Gate::close(&m);
    ok(kmm_copy_buffer(m.0, d, 0, m.0, p, 0, len));
    m.free(p);
    // The CPU writes a new pinned buffer at once: it must not be the block still being read.
    let q = m.alloc(len, PINNED);
    let mut qptr = 0;
    ok(kmm_buffer_map(m.0, q, &mut qptr));
    assert_ne!(qptr, ptr, "pinned block handed out again before its queued copy ran");
    unsafe { std::ptr::write_bytes(qptr as *mut u8, 0x22, len as usize) };
    gate.open();
    assert_eq!(m.download(d, 0, len as usize), vec![0x11; len as usize]);
    ok(kmm_buffer_unmap(m.0, q));
    m.free(q);
    m.free(d);
}

#[test]
fn foreign_streams_order_both_ways() {
    let a = Mgr::new();
    let b = Mgr::new();
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(b.0, &mut info));
    let b_stream = info.stream;
    let len = 1 << 16;
    let x = a.alloc(len, DEVICE);
    // a's stream waits for work queued on b's (gated) stream.
    let gate = Gate::close(&b);
    ok(kmm_manager_wait_stream(a.0, b_stream));
    ok(kmm_fill(a.0, x, 0, len, [0x33u8].as_ptr().cast(), 1));
    let mut ev = 0;
    ok(kmm_manager_record_event(a.0, &mut ev));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut done = true;
    ok(kmm_event_query(a.0, ev, &mut done));
    assert!(!done, "a's work ran before b's stream got there");
    gate.open();
    ok(kmm_event_wait(a.0, ev));
    ok(kmm_event_destroy(a.0, ev));
    // b's stream waits for a's (gated) stream.
    let gate = Gate::close(&a);
    ok(kmm_manager_signal_stream(a.0, b_stream));
    let mut evb = 0;
    ok(kmm_manager_record_event(b.0, &mut evb));
    std::thread::sleep(std::time::Duration::from_millis(20));
    ok(kmm_event_query(b.0, evb, &mut done));
    assert!(!done, "b's stream did not wait for a's");
    gate.open();
    ok(kmm_event_wait(b.0, evb));
    ok(kmm_event_destroy(b.0, evb));
    if !gpu() {
        expect_err(kmm_manager_wait_stream(a.0, 12345), KMM_ERROR_INVALID_ARGUMENT, &["0x3039", "not a live host-backend stream"]);
    }
    a.free(x);
}

#[test]
fn events_are_handles_of_their_manager() {
    let a = Mgr::new();
    let b = Mgr::new();
    let mut ev = 0;
    ok(kmm_manager_record_event(a.0, &mut ev));
    expect_err(kmm_event_wait(b.0, ev), KMM_ERROR_INVALID_HANDLE, &["another manager"]);
    ok(kmm_event_destroy(a.0, ev));
    expect_err(kmm_event_destroy(a.0, ev), KMM_ERROR_INVALID_HANDLE, &["not live"]);
    let mut done = false;
    expect_err(kmm_event_query(a.0, ev, &mut done), KMM_ERROR_INVALID_HANDLE, &[]);
    expect_err(kmm_event_query(a.0, ev, std::ptr::null_mut()), KMM_ERROR_NULL_POINTER, &["done"]);
}

// A host stream holds at most 1024 queued items (callers wait for room, as on a full CUDA
// stream). The review of that bound found three ways to hang on it; each test below hung
// (timed out) on the first version.

/// Runs `body` on a thread and fails the test when it is not done within `secs` of `then`
/// running (the hang's trigger: a gate opened, say).
fn done_within(secs: u64, what: &str, body: impl FnOnce() + Send + 'static, then: impl FnOnce()) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        body();
        let _ = tx.send(());
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    then();
    if rx.recv_timeout(std::time::Duration::from_secs(secs)).is_err() {
        // Not a panic: unwinding would destroy the test's manager, which waits for the
        // deadlocked stream, and the binary would hang instead of failing.
        eprintln!("{what}: not done {secs} s later (deadlocked)");
        std::process::exit(101);
    }
}

/// Queues on `stream` work that waits until the returned closure runs, then runs `then` (on the
/// stream's worker).
fn gated_host_stream(
    stream: &dyn kmm::backend::Stream,
    then: impl FnOnce() + Send + 'static,
) -> impl FnOnce() {
    use std::sync::{Arc, Condvar, Mutex};
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    stream
        .launch_host_fn(Box::new(move || {
            let mut open = g.0.lock().unwrap();
            while !*open {
                open = g.1.wait(open).unwrap();
            }
            drop(open);
            then();
        }))
        .unwrap();
    move || {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }
}

fn host_manager(f: impl FnOnce(&mut KmmConfig)) -> Mgr {
    Mgr::with(|c| {
        c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
        f(c)
    })
}

/// rayon's pool threads queuing on a full stream whose worker runs a staged copy out (its
/// `parallel_copy` runs on that pool): pool threads never wait for room.
#[test]
fn rayon_pool_threads_queuing_on_a_full_stream_do_not_deadlock_its_staged_copy() {
    let m = host_manager(|c| {
        c.staging_chunk_size = 4 << 20;
        c.staging_chunks = 4;
    });
    Gate::warm(&m);
    let b = m.alloc(4 << 20, DEVICE);
    m.sync();
    let gate = Gate::shut(&m);
    let h = m.0;
    done_within(
        20,
        "rayon threads queuing on a full stream",
        move || {
            let outs: Vec<(u64, Vec<u8>)> = rayon::broadcast(|_| {
                let mut dst = vec![0u8; 4 << 20];
                let mut ev = 0;
                ok(kmm_copy_to_host_async(h, dst.as_mut_ptr().cast(), b, 0, 4 << 20, &mut ev));
                for _ in 0..1500 {
                    ok(kmm_fill(h, b, 0, 4096, [1u8].as_ptr().cast(), 1));
                }
                (ev, dst)
            });
            for (ev, _dst) in &outs {
                ok(kmm_event_wait(h, *ev));
                ok(kmm_event_destroy(h, *ev));
            }
        },
        || gate.open(),
    );
}

/// A record waiting for room on a full stream while another stream already waits for that
/// record: no later item of a third caller may be queued before it.
#[test]
fn an_event_record_waiting_for_room_is_not_overtaken() {
    use kmm::backend::host::HostBackend;
    use kmm::backend::{Event, Stream};
    use std::sync::Arc;
    let backend = HostBackend::get(0).unwrap();
    let (s1, s2): (Arc<dyn Stream>, Arc<dyn Stream>) = (backend.create_stream().unwrap().into(), backend.create_stream().unwrap().into());
    let open = gated_host_stream(s2.as_ref(), || {});
    for _ in 0..1023 {
        s2.launch_host_fn(Box::new(|| {})).unwrap(); // s2 is full
    }
    let e: Arc<dyn Event> = backend.create_event().unwrap().into();
    let (e_u, s2_u) = (e.clone(), s2.clone());
    let recorder = std::thread::spawn(move || s2_u.record(e_u.as_ref()).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(200));
    s1.wait_event(e.as_ref()).unwrap(); // s1 waits for the record the recorder makes
    let e1: Arc<dyn Event> = backend.create_event().unwrap().into();
    s1.record(e1.as_ref()).unwrap();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let (e1, s2) = (e1.clone(), s2.clone());
            std::thread::spawn(move || s2.wait_event(e1.as_ref()).unwrap())
        })
        .collect();
    done_within(
        10,
        "s1 waiting for a record queued on s2 behind a wait for s1",
        move || {
            recorder.join().unwrap();
            waiters.into_iter().for_each(|w| w.join().unwrap());
            s1.synchronize().unwrap();
        },
        open,
    );
}

/// Work that panics ends its stream's worker: callers waiting for room on the full stream
/// then fail ("has stopped") instead of waiting for ever.
#[test]
fn callers_waiting_on_a_full_stream_whose_work_panicked_get_an_error() {
    use kmm::backend::host::HostBackend;
    use kmm::backend::Stream;
    use std::sync::Arc;
    let backend = HostBackend::get(0).unwrap();
    let s: Arc<dyn Stream> = backend.create_stream().unwrap().into();
    let open = gated_host_stream(s.as_ref(), || panic!("a host function of the test panics (expected)"));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (s2, errs) = (s.clone(), errors.clone());
    done_within(
        10,
        "a caller on a full stream whose worker died",
        move || {
            for _ in 0..3000 {
                if s2.launch_host_fn(Box::new(|| {})).is_err() {
                    errs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        },
        open,
    );
    assert!(errors.load(std::sync::atomic::Ordering::SeqCst) > 0, "queuing on a stopped stream succeeded");
}
