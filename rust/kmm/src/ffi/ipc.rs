//! CUDA IPC handles of device buffers, for sharing sub-allocations with other processes.

use super::registry::with_manager;
use super::types::*;
use super::{boundary, check_out, write_out};
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::manager::{Manager, MemoryKind};

/// Size of the handle `kmm_buffer_ipc_handle` writes (a `CUipcMemHandle`).
pub const KMM_IPC_HANDLE_BYTES: u32 = 64;

fn ipc_handle(m: &Manager, buffer: u64) -> Result<([u8; 64], u64)> {
    if m.backend_kind() != crate::backend::BackendKind::Cuda {
        fail!(KMM_ERROR_NOT_SUPPORTED, "IPC handles need the CUDA backend; this manager runs on the host backend");
    }
    let (addr, bytes, kind, pins) = m.buffer_info(buffer)?;
    if pins == 0 {
        fail!(
            KMM_ERROR_INVALID_ARGUMENT,
            "buffer {buffer:#x} is not mapped: keep it mapped while another process uses it (unmapped buffers may be moved)"
        );
    }
    if kind != MemoryKind::Device {
        fail!(KMM_ERROR_WRONG_KIND, "buffer {buffer:#x} is pinned host memory; IPC handles are for device memory");
    }
    if bytes == 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "buffer {buffer:#x} is empty: it has no memory to share");
    }
    m.backend().ipc_handle(addr)
}

/// Writes the CUDA IPC handle (`cuIpcGetMemHandle`, `KMM_IPC_HANDLE_BYTES` bytes) of the device
/// allocation that holds the buffer to `out`, and the buffer's offset from that allocation's base
/// to `*offset`: another process opens the handle (`cuIpcOpenMemHandle`) and adds the offset.
/// The buffer must be mapped (`kmm_buffer_map`), and stay mapped and allocated while others use
/// it; an unmapped buffer is `KMM_ERROR_INVALID_ARGUMENT`. `KMM_ERROR_NOT_SUPPORTED` on the host
/// backend; `KMM_ERROR_BACKEND` for memory the driver cannot share (`KMM_ALLOC_CUDA_ASYNC`).
#[no_mangle]
pub extern "C" fn kmm_buffer_ipc_handle(manager: KmmManager, buffer: KmmBuffer, out: *mut u8, offset: *mut u64) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        check_out(offset, "offset")?;
        let (handle, off) = with_manager(manager, |m| ipc_handle(m, buffer))?;
        // SAFETY: non-null; the caller provides KMM_IPC_HANDLE_BYTES bytes.
        unsafe { std::ptr::copy_nonoverlapping(handle.as_ptr(), out, handle.len()) };
        write_out(offset, "offset", off)
    })
}
