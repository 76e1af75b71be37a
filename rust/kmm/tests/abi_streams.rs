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
