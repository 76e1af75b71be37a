//! The calls allocator plugins of other libraries make (Numba's, and the CuPy and PyTorch
//! adapters through the by-address table): one that allocates and maps memory ready for the
//! caller's stream, one that frees it after that stream's work. Both go through the manager's
//! one stream-ordering rule (`manager::order`): the memory is handed out for `stream`, and its
//! free is ordered after `stream`, as a buffer recorded with `kmm_buffer_record_stream` is.

use super::by_address::{alloc_by_address, free_by_address, ByAddress};
use super::registry::{with_alloc_state, with_buffer_state, with_manager};
use super::types::*;
use super::{boundary, check_out, write_out};
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::manager::{MappedTry, MemoryKind};
use std::sync::{Mutex, OnceLock};

/// Allocates and maps `bytes` of `kind` memory of the manager `manager` ready for work on the
/// raw `stream`: (buffer, address). Where the calling thread's lane serves it, under that lane's
/// lock alone, as `kmm_buffer_alloc`; else the manager's long way.
pub(super) fn plugin_alloc(manager: u64, bytes: u64, kind: MemoryKind, stream: u64) -> Result<(u64, u64)> {
    let ((first, stream), frees_pending) = with_alloc_state(manager, kind, |st| {
        let stream = st.plugin_stream(stream)?;
        Ok((st.try_alloc_mapped(bytes, kind, stream), stream))
    })?;
    match first {
        MappedTry::Mapped { handle, addr, settle: None } => {
            if frees_pending {
                // As in `kmm_buffer_alloc`: the lanes' queued upstream frees, no lock held.
                let _ = with_manager(manager, |m| Ok(m.flush_frees()));
            }
            Ok((handle, addr))
        }
        first => with_manager(manager, |m| m.alloc_mapped_rest(first, bytes, kind, stream)),
    }
}

/// Frees a plugin buffer of the manager `manager` after the work queued so far on the raw
/// `stream`, under the buffer's lane's lock alone.
pub(super) fn plugin_free(manager: u64, buffer: u64, stream: u64) -> Result<()> {
    with_buffer_state(manager, buffer, |st| st.free_used_on(buffer, stream, true))
}

/// For allocator plugins: allocates `bytes` of `kind` memory, maps it, and writes the buffer's
/// handle to `*buffer` and its address to `*ptr` (0 for zero bytes). `stream` is the raw stream
/// the memory will be used on (a `CUstream`; 0 is the legacy default stream on CUDA and means
/// the manager's own stream on the host backend); the memory is ready for work queued on it.
/// The stream must stay alive until the buffer is freed (its free is ordered after it). Free
/// with `kmm_plugin_free` (the buffer stays mapped until then). `CU_STREAM_PER_THREAD` (2) names
/// the calling thread's stream: free from the thread that allocated.
#[no_mangle]
pub extern "C" fn kmm_plugin_alloc(
    manager: KmmManager,
    bytes: u64,
    kind: u32,
    stream: u64,
    buffer: *mut KmmBuffer,
    ptr: *mut u64,
) -> KmmStatus {
    boundary(|| {
        check_out(buffer, "buffer")?;
        check_out(ptr, "ptr")?;
        let kind = memory_kind(kind, "kind")?;
        let (b, p) = plugin_alloc(manager, bytes, kind, stream)?;
        write_out(buffer, "buffer", b)?;
        write_out(ptr, "ptr", p)
    })
}

/// For allocator plugins: frees a buffer from `kmm_plugin_alloc` (mapped or not) after the work
/// queued so far on `stream` (the stream that last used it; it must still be alive).
/// Non-blocking; callable from any thread and from finalizers.
#[no_mangle]
pub extern "C" fn kmm_plugin_free(manager: KmmManager, buffer: KmmBuffer, stream: u64) -> KmmStatus {
    boundary(|| plugin_free(manager, buffer, stream))
}

pub(super) fn plugin_table() -> &'static Mutex<ByAddress> {
    static STATE: OnceLock<Mutex<ByAddress>> = OnceLock::new();
    STATE.get_or_init(ByAddress::naming_the_manager)
}

/// For allocator plugins that keep only the address: allocates, as `kmm_plugin_alloc` does,
/// `bytes` (at least 1) of device memory ready for work on `stream`, and returns its address. 0
/// on failure, with the message in `kmm_last_error` (`kmm_plugin_alloc` returns the status).
/// Free with `kmm_plugin_free_address`.
#[no_mangle]
pub extern "C" fn kmm_plugin_malloc(manager: KmmManager, bytes: u64, stream: u64) -> u64 {
    let mut addr = 0;
    let _ = boundary(|| {
        if bytes == 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "bytes = 0: an empty allocation has no address (use kmm_plugin_alloc)");
        }
        addr = alloc_by_address(plugin_table(), manager, bytes, stream)?;
        Ok(())
    });
    addr
}

/// Frees the allocation of `kmm_plugin_malloc` at `address` of `manager` after the work queued
/// so far on `stream`. Non-blocking; callable from any thread and from finalizers.
#[no_mangle]
pub extern "C" fn kmm_plugin_free_address(manager: KmmManager, address: u64, stream: u64) -> KmmStatus {
    boundary(|| free_by_address(plugin_table(), address, Some(manager), Some(stream), "kmm_plugin_malloc"))
}
