//! Exported functions on buffers.

use super::registry::{with_alloc_state, with_buffer_state, with_manager};
use super::types::*;
use super::{boundary, check_flags, check_out, write_out};
use crate::error::KmmStatus;
use crate::fail;
use std::ffi::c_void;

/// Allocates `bytes` of memory of `kind` (a `KmmMemoryKind`) and writes the buffer's handle to
/// `*out`. Zero bytes is valid (a buffer with no memory). On `KMM_ERROR_OUT_OF_MEMORY` the
/// manager has already given its cached memory back once, waiting for the frees still queued on
/// its streams where that released more (and compacted and spilled where they are on). That is
/// not a synchronize: work queued before the failed call may still be running
/// (`kmm_manager_synchronize` waits for it). Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_buffer_alloc(manager: KmmManager, bytes: u64, kind: u32, out: *mut KmmBuffer) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let kind = memory_kind(kind, "kind")?;
        // The lane's free blocks, under the lane's lock alone; the rest (other lanes' free
        // blocks, growing, and on out of memory giving cached memory back before trying again)
        // takes the manager's path.
        let first = with_alloc_state(manager, kind, |st| st.try_alloc_own(bytes, kind)).and_then(|(first, frees_pending)| {
            if frees_pending {
                // Upstream frees queued by the lanes (direct mode, adopted memory), now that the
                // lane's lock is dropped; what fails stays queued. Under the slot's read lock, so
                // that a destroy returns only after every flush that took blocks out of the
                // queues has freed them (a destroyed manager's teardown has flushed them itself).
                let _ = with_manager(manager, |m| Ok(m.flush_frees()));
            }
            Ok(first)
        });
        let b = match first {
            Ok(Some(b)) => b,
            first => with_manager(manager, |m| m.alloc_rest(first, bytes, kind, m.raw_stream()))?,
        };
        write_out(out, "out", b)
    })
}

/// Makes a buffer of memory allocated elsewhere (`ptr`, `bytes` of `kind`). With `KMM_ADOPT`
/// Kmm frees the memory (`cuMemFree`/`cuMemFreeHost`) once the work queued before the buffer's
/// free has run: at the manager's next allocation, adoption, synchronize or trim, never inside
/// the free itself; with `KMM_BORROW` the caller keeps it and
/// must keep it valid until the buffer is freed and the manager synchronized. Adopted memory
/// counts in `KmmMemoryStats.reserved` but not against `KmmConfig.hard_limit` (the caller
/// allocated it); wrapped memory is never pooled, moved or spilled.
#[no_mangle]
pub extern "C" fn kmm_buffer_wrap(
    manager: KmmManager,
    ptr: *mut c_void,
    bytes: u64,
    kind: u32,
    ownership: u32,
    out: *mut KmmBuffer,
) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let kind = memory_kind(kind, "kind")?;
        let adopt = match ownership {
            0 => false,
            1 => true,
            v => fail!(KMM_ERROR_INVALID_ARGUMENT, "ownership = {v} is not a KmmOwnership (0 = borrow, 1 = adopt)"),
        };
        let b = with_manager(manager, |m| m.wrap(ptr as u64, bytes, kind, adopt))?;
        write_out(out, "out", b)
    })
}

/// Frees a buffer. Stream-ordered and non-blocking: work already queued on the manager's stream,
/// and on every stream recorded with `kmm_buffer_record_stream`, still sees the memory; the
/// memory is reused only after that work. Callable from any thread and from finalizers. A mapped
/// buffer is `KMM_ERROR_BUFFER_MAPPED` unless `flags` has `KMM_FREE_FORCE`. A second free of the
/// same handle is `KMM_ERROR_INVALID_HANDLE`. A free while another thread's copy, fill or kernel
/// launch is still queuing work on the buffer ends the handle at once and releases the memory
/// once that call has queued its work (ordered after it). If a recorded stream cannot be waited
/// for, the buffer stays allocated and the status says why.
#[no_mangle]
pub extern "C" fn kmm_buffer_free(manager: KmmManager, buffer: KmmBuffer, flags: u32) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_FREE_FORCE, "flags")?;
        with_buffer_state(manager, buffer, |st| st.free(buffer, flags & KMM_FREE_FORCE != 0))
    })
}

/// Records that work on `stream` (a `CUstream` of the manager's device, 0 the legacy default
/// stream; on the host backend another manager's stream, 0 the manager's own) may use the
/// buffer's memory, as PyTorch's `record_stream`: the buffer's free, a compaction move of it, a
/// trim and the reuse of its memory all wait for the work queued on `stream` up to the free
/// (stream-ordered: nothing blocks). Record each stream that uses a mapped address; the
/// manager's own stream needs no record. The stream must stay alive until the buffer is freed.
#[no_mangle]
pub extern "C" fn kmm_buffer_record_stream(manager: KmmManager, buffer: KmmBuffer, stream: u64) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.record_stream(buffer, stream)))
}

/// Writes the buffer's size, kind and pin count to `*out`.
#[no_mangle]
pub extern "C" fn kmm_buffer_info(manager: KmmManager, buffer: KmmBuffer, out: *mut KmmBufferInfo) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let ((_, bytes, kind, pins), (spilled, never_spill)) =
            with_buffer_state(manager, buffer, |st| Ok((st.buffer_info(buffer)?, st.spill_flags(buffer)?)))?;
        let info = KmmBufferInfo { bytes, kind: kind as u32, pins, spilled: spilled as u32, never_spill: never_spill as u32 };
        write_out(out, "out", info)
    })
}

/// Marks the buffer never to spill to host memory (`never` true), or lets it spill again
/// (false; the default). A spilled buffer marked never to spill comes back to the device before
/// this returns (out of memory if it cannot). Mapped buffers never spill either way.
#[no_mangle]
pub extern "C" fn kmm_buffer_never_spill(manager: KmmManager, buffer: KmmBuffer, never: bool) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.set_never_spill(buffer, never)))
}

/// Pins the buffer and writes its address to `*ptr`: a device pointer (`CUdeviceptr`) for
/// device memory, a host pointer for pinned memory, 0 for an empty buffer. The address stays
/// valid until the matching `kmm_buffer_unmap`; an unmapped buffer may be moved (compaction, see
/// `KmmConfig.compaction_ratio_pct`, or spill to host, see `KmmConfig.spill_limit`), so map it
/// again for each use. A spilled buffer comes back to the device first. Work on other streams that
/// uses the address must be ordered with the manager's stream (`kmm_manager_signal_stream`
/// before, `kmm_manager_wait_stream` after, before the unmap). A new buffer's memory, like any
/// stream-ordered allocation's, is free of the work of the buffer that had it before only for
/// work ordered after the manager's stream: `map` does not wait for that work (on the host
/// backend, where device memory is host memory, synchronize before the CPU writes it).
#[no_mangle]
pub extern "C" fn kmm_buffer_map(manager: KmmManager, buffer: KmmBuffer, ptr: *mut u64) -> KmmStatus {
    boundary(|| {
        check_out(ptr, "ptr")?;
        let addr = with_manager(manager, |m| m.map(buffer))?;
        write_out(ptr, "ptr", addr)
    })
}

/// Drops one pin taken by `kmm_buffer_map`. Unmapping an unmapped buffer is
/// `KMM_ERROR_INVALID_ARGUMENT`. Once its last pin is gone a device buffer may be moved by work
/// queued on the manager's stream (compaction), so work on other streams that used the address
/// must be ordered before that stream first (`kmm_manager_wait_stream`).
#[no_mangle]
pub extern "C" fn kmm_buffer_unmap(manager: KmmManager, buffer: KmmBuffer) -> KmmStatus {
    boundary(|| with_buffer_state(manager, buffer, |st| st.unmap(buffer)))
}

/// Page-locks `bytes` of caller memory at `ptr` so copies from and to it go direct. The memory
/// must stay valid until `kmm_host_unregister`.
#[no_mangle]
pub extern "C" fn kmm_host_register(manager: KmmManager, ptr: *mut c_void, bytes: u64) -> KmmStatus {
    // SAFETY: the caller keeps the range valid until unregistered (documented).
    boundary(|| with_manager(manager, |m| unsafe { m.register_host(ptr as *mut u8, bytes) }))
}

/// Undoes `kmm_host_register`. No queued copy may still use the memory.
#[no_mangle]
pub extern "C" fn kmm_host_unregister(manager: KmmManager, ptr: *mut c_void) -> KmmStatus {
    // SAFETY: as documented above.
    boundary(|| with_manager(manager, |m| unsafe { m.unregister_host(ptr as *mut u8) }))
}
