//! PyTorch's `CUDAPluggableAllocator`: the allocation and free functions it loads, on a default
//! Kmm manager per device.

use super::by_address::{alloc_by_address, free_by_address, record_by_address, ByAddress};
use super::registry;
use super::types::*;
use super::{boundary, check_out, write_out};
use crate::error::{lock, KmmStatus, Result};
use crate::fail;
use crate::manager::Config;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::{Mutex, OnceLock};

/// `kmm_torch_set_oom_policy` value: on out-of-memory, print the error and abort the process
/// (the default: PyTorch does not check for NULL and would use address 0).
pub const KMM_TORCH_OOM_ABORT: u32 = 0;
/// `kmm_torch_set_oom_policy` value: on out-of-memory, return NULL (the error stays readable
/// with `kmm_last_error` on the allocating thread).
pub const KMM_TORCH_OOM_NULL: u32 = 1;

static TORCH_OOM_POLICY: AtomicU32 = AtomicU32::new(KMM_TORCH_OOM_ABORT);

pub(super) fn torch_state() -> &'static Mutex<ByAddress> {
    static STATE: OnceLock<Mutex<ByAddress>> = OnceLock::new();
    STATE.get_or_init(ByAddress::by_address_alone)
}

fn torch_manager(device: i32) -> Result<u64> {
    let mut st = lock(torch_state());
    if let Some(&h) = st.managers.get(&device) {
        return Ok(h);
    }
    if device < 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "device = {device} is negative");
    }
    let config = Config { device, ..Config::default() };
    let h = registry::register(config)?;
    st.managers.insert(device, h);
    Ok(h)
}

/// Writes the handle of the default manager that `kmm_torch_malloc` uses for `device`, creating
/// it (default configuration, device `device`) if needed. Kmm owns it: do not destroy it.
#[no_mangle]
pub extern "C" fn kmm_torch_manager(device: i32, out: *mut KmmManager) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        write_out(out, "out", torch_manager(device)?)
    })
}

/// Chooses what `kmm_torch_malloc` does when memory runs out: `KMM_TORCH_OOM_ABORT` (default)
/// or `KMM_TORCH_OOM_NULL`.
#[no_mangle]
pub extern "C" fn kmm_torch_set_oom_policy(policy: u32) -> KmmStatus {
    boundary(|| {
        if policy > KMM_TORCH_OOM_NULL {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "policy = {policy} is not KMM_TORCH_OOM_ABORT (0) or KMM_TORCH_OOM_NULL (1)");
        }
        TORCH_OOM_POLICY.store(policy, AtomicOrdering::Relaxed);
        Ok(())
    })
}

/// The allocation function of PyTorch's `CUDAPluggableAllocator`: `size` bytes of device memory
/// of `device`'s default Kmm manager, ready for work on `stream`. NULL for zero bytes. On failure
/// the policy of `kmm_torch_set_oom_policy` applies (default: message on stderr, then abort).
#[no_mangle]
pub extern "C" fn kmm_torch_malloc(size: usize, device: i32, stream: *mut c_void) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    let mut addr = 0u64;
    let status = boundary(|| {
        addr = alloc_by_address(torch_state(), torch_manager(device)?, size as u64, stream as u64)?;
        Ok(())
    });
    if status != KmmStatus::KMM_OK {
        if TORCH_OOM_POLICY.load(AtomicOrdering::Relaxed) == KMM_TORCH_OOM_ABORT {
            let msg = unsafe { std::ffi::CStr::from_ptr(super::kmm_last_error()) };
            eprintln!(
                "kmm_torch_malloc: cannot allocate {size} bytes on device {device}: {} ({}); aborting \
                 because PyTorch would use a NULL pointer (kmm.torch.allocator(on_oom=\"null\") returns NULL instead)",
                msg.to_string_lossy(),
                status.name().to_string_lossy()
            );
            std::process::abort();
        }
        return std::ptr::null_mut();
    }
    addr as *mut c_void
}

/// The free function of PyTorch's `CUDAPluggableAllocator`: frees memory from
/// `kmm_torch_malloc` after the work queued so far on `stream`. Unknown pointers and NULL are
/// ignored (the error is readable with `kmm_last_error`).
#[no_mangle]
pub extern "C" fn kmm_torch_free(ptr: *mut c_void, size: usize, device: i32, stream: *mut c_void) {
    let _ = (size, device);
    if ptr.is_null() {
        return;
    }
    let _ = boundary(|| free_by_address(torch_state(), ptr as u64, None, Some(stream as u64), "kmm_torch_malloc"));
}

/// `Tensor.record_stream` for memory from `kmm_torch_malloc`: work on `stream` may use the
/// allocation at `ptr` (the storage's base address), so its free, and any move or trim of its
/// memory, waits for the work queued on `stream` by then. PyTorch's Python
/// `CUDAPluggableAllocator` registers no record-stream function, so there `record_stream` does
/// nothing; call this (Python: `kmm.torch.record_stream`), or register it from C++ with
/// `allocator->set_record_stream_fn([](void *p, cudaStream_t s) { kmm_torch_record_stream(p, s); })`.
#[no_mangle]
pub extern "C" fn kmm_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) -> KmmStatus {
    boundary(|| record_by_address(torch_state(), ptr as u64, stream as u64, "kmm_torch_malloc"))
}

/// How many allocations of `kmm_torch_malloc` are live (for tests and leak checks).
#[no_mangle]
pub extern "C" fn kmm_torch_live_allocations(out: *mut u64) -> KmmStatus {
    boundary(|| write_out(out, "out", lock(torch_state()).live.len() as u64))
}
