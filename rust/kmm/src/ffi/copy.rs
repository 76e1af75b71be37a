//! Exported copies and fills.

use super::boundary;
use super::registry::{with_manager, with_two_managers};
use super::types::*;
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::manager::copy::{copy_buffer, Completion};
use std::ffi::c_void;

fn completion_for(event: *mut KmmEvent) -> Completion {
    if event.is_null() { Completion::Queue } else { Completion::Event }
}

fn write_event(out: *mut KmmEvent, event: Option<u64>) -> Result<()> {
    if let (false, Some(e)) = (out.is_null(), event) {
        // SAFETY: checked non-null.
        unsafe { out.write(e) };
    }
    Ok(())
}

/// Copies `bytes` from host memory `src` into `dst` at `dst_offset` and returns once done.
/// Pageable memory is staged through pinned memory in chunks; pinned memory (Kmm's or
/// registered) goes direct. `src` is not kept.
#[no_mangle]
pub extern "C" fn kmm_copy_to_device(manager: KmmManager, dst: KmmBuffer, dst_offset: u64, src: *const c_void, bytes: u64) -> KmmStatus {
    // SAFETY: the caller provides `bytes` readable bytes at `src`.
    boundary(|| with_manager(manager, |m| unsafe { m.copy_to_device(dst, dst_offset, src as *const u8, bytes, Completion::Wait) }).map(drop))
}

/// As `kmm_copy_to_device` but returns once the copy is queued. When `event` is not NULL, writes
/// an event that completes when the copy has run (destroy it with `kmm_event_destroy`). The
/// memory at `src` must stay valid and unchanged until then.
#[no_mangle]
pub extern "C" fn kmm_copy_to_device_async(
    manager: KmmManager,
    dst: KmmBuffer,
    dst_offset: u64,
    src: *const c_void,
    bytes: u64,
    event: *mut KmmEvent,
) -> KmmStatus {
    boundary(|| {
        // SAFETY: as documented above.
        let e = with_manager(manager, |m| unsafe { m.copy_to_device(dst, dst_offset, src as *const u8, bytes, completion_for(event)) })?;
        write_event(event, e)
    })
}

/// Copies `bytes` from `src` at `src_offset` into host memory `dst` and returns once done.
#[no_mangle]
pub extern "C" fn kmm_copy_to_host(manager: KmmManager, dst: *mut c_void, src: KmmBuffer, src_offset: u64, bytes: u64) -> KmmStatus {
    // SAFETY: the caller provides `bytes` writable bytes at `dst`.
    boundary(|| with_manager(manager, |m| unsafe { m.copy_to_host(dst as *mut u8, src, src_offset, bytes, Completion::Wait) }).map(drop))
}

/// As `kmm_copy_to_host` but returns once the copy is queued; `event` as in
/// `kmm_copy_to_device_async`. The memory at `dst` must stay valid, and must not be read, until
/// the event completes (or the manager is synchronized).
#[no_mangle]
pub extern "C" fn kmm_copy_to_host_async(
    manager: KmmManager,
    dst: *mut c_void,
    src: KmmBuffer,
    src_offset: u64,
    bytes: u64,
    event: *mut KmmEvent,
) -> KmmStatus {
    boundary(|| {
        // SAFETY: as documented above.
        let e = with_manager(manager, |m| unsafe { m.copy_to_host(dst as *mut u8, src, src_offset, bytes, completion_for(event)) })?;
        write_event(event, e)
    })
}

/// Copies `bytes` between buffers of one manager or of two managers. Stream-ordered (returns
/// once queued): queued on the destination's stream after the source's work so far, and the
/// source's later work waits for it. Between managers on different devices the copy goes peer
/// to peer where the devices allow it (`kmm_device_can_access_peer`), else it is staged through
/// the destination's pinned staging ring; either way it is stream-ordered on both sides and
/// leaves the calling thread's current CUDA context as it was. A staged copy larger than the
/// ring (`staging_chunks` x `staging_chunk_size`) waits on the host for its slots to come back,
/// as a copy from pageable memory does. Between a host-backend and a CUDA
/// manager the copy goes through host memory and returns once done. Overlapping ranges of one buffer are
/// `KMM_ERROR_INVALID_ARGUMENT`.
#[no_mangle]
pub extern "C" fn kmm_copy_buffer(
    dst_manager: KmmManager,
    dst: KmmBuffer,
    dst_offset: u64,
    src_manager: KmmManager,
    src: KmmBuffer,
    src_offset: u64,
    bytes: u64,
) -> KmmStatus {
    boundary(|| {
        with_two_managers(dst_manager, src_manager, |d, s| copy_buffer(d, dst, dst_offset, s, src, src_offset, bytes))
    })
}

/// Fills `bytes` bytes of `buffer` from `offset` with repeats of the `pattern_size`-byte
/// `pattern` (1 to 4096 bytes; `bytes` a multiple of it). Stream-ordered (returns once queued).
#[no_mangle]
pub extern "C" fn kmm_fill(
    manager: KmmManager,
    buffer: KmmBuffer,
    offset: u64,
    bytes: u64,
    pattern: *const c_void,
    pattern_size: usize,
) -> KmmStatus {
    boundary(|| {
        if pattern.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "pattern is NULL");
        }
        if pattern_size == 0 || pattern_size > 4096 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "pattern_size = {pattern_size} must be in 1..=4096");
        }
        // SAFETY: non-null and the caller provides pattern_size bytes.
        let pattern = unsafe { std::slice::from_raw_parts(pattern as *const u8, pattern_size) };
        with_manager(manager, |m| m.fill(buffer, offset, bytes, pattern))
    })
}
