//! CuPy's `CFunctionAllocator`: the allocation and free functions it loads, on the manager the
//! caller registers per device, for CuPy's current stream.

use super::by_address::{alloc_by_address, free_by_address, ByAddress};
use super::registry::with_manager;
use super::types::*;
use super::{boundary, write_out};
use crate::error::{lock, KmmStatus, Result};
use crate::fail;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Mutex, OnceLock};

/// Reads CuPy's current stream (CuPy's `get_current_stream_ptr`); -1 on error.
pub type KmmStreamSource = Option<unsafe extern "C" fn() -> isize>;
/// Called after a `KmmStreamSource` failed, to clear the error it left (Python's `PyErr_Clear`).
pub type KmmErrorHook = Option<unsafe extern "C" fn()>;

static CUPY_STREAM_SOURCE: AtomicUsize = AtomicUsize::new(0);
static CUPY_STREAM_ERROR_HOOK: AtomicUsize = AtomicUsize::new(0);

pub(super) fn cupy_state() -> &'static Mutex<ByAddress> {
    static STATE: OnceLock<Mutex<ByAddress>> = OnceLock::new();
    STATE.get_or_init(ByAddress::by_address_alone)
}

fn cupy_stream() -> Result<u64> {
    let source = CUPY_STREAM_SOURCE.load(AtomicOrdering::Acquire);
    if source == 0 {
        return Ok(0);
    }
    // SAFETY: set by kmm_cupy_set_stream_source to a function of that type; CuPy calls the
    // allocator with the GIL held, as the function needs.
    let read: unsafe extern "C" fn() -> isize = unsafe { std::mem::transmute(source) };
    match unsafe { read() } {
        -1 => {
            let hook = CUPY_STREAM_ERROR_HOOK.load(AtomicOrdering::Acquire);
            if hook != 0 {
                // SAFETY: set with the source by kmm_cupy_set_stream_source; same thread and GIL.
                let clear: unsafe extern "C" fn() = unsafe { std::mem::transmute(hook) };
                unsafe { clear() };
            }
            fail!(KMM_ERROR_BACKEND, "CuPy's current stream could not be read (get_current_stream_ptr failed)")
        }
        s => Ok(s as u64),
    }
}

/// Makes `manager` the one `kmm_cupy_malloc` allocates from on `device` (the caller keeps it
/// alive while CuPy may allocate); 0 forgets the device's manager (`kmm_cupy_malloc` then fails
/// there until one is set), before it is closed. Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_cupy_set_manager(device: i32, manager: KmmManager) -> KmmStatus {
    boundary(|| {
        if device < 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "device = {device} is negative");
        }
        if manager == 0 {
            lock(cupy_state()).managers.remove(&device);
            return Ok(());
        }
        with_manager(manager, |_| Ok(()))?;
        lock(cupy_state()).managers.insert(device, manager);
        Ok(())
    })
}

/// Sets the function `kmm_cupy_malloc` calls for CuPy's current stream (CuPy's
/// `get_current_stream_ptr`; NULL means the legacy default stream) and the one it calls when
/// that fails (Python's `PyErr_Clear`, so the failure comes back as a NULL allocation instead of
/// a pending Python exception; may be NULL).
#[no_mangle]
pub extern "C" fn kmm_cupy_set_stream_source(source: KmmStreamSource, on_error: KmmErrorHook) -> KmmStatus {
    boundary(|| {
        CUPY_STREAM_ERROR_HOOK.store(on_error.map_or(0, |f| f as usize), AtomicOrdering::Release);
        CUPY_STREAM_SOURCE.store(source.map_or(0, |f| f as usize), AtomicOrdering::Release);
        Ok(())
    })
}

/// The allocation function of CuPy's `CFunctionAllocator` (`param` is unused): `size` bytes of
/// device memory from the manager registered for `device`, ready for work on CuPy's current
/// stream. NULL on failure, with the error readable through `kmm_last_error` (CuPy does not
/// check; `kmm.cupy` does and raises). Call it as CuPy does, with the GIL held: the stream
/// source set by `kmm_cupy_set_stream_source` is Python code underneath (not through ctypes'
/// `CDLL`, which releases the GIL).
#[no_mangle]
pub extern "C" fn kmm_cupy_malloc(param: *mut c_void, size: usize, device: i32) -> *mut c_void {
    let _ = param;
    if size == 0 {
        return std::ptr::null_mut();
    }
    let mut addr = 0u64;
    let _ = boundary(|| {
        let Some(mgr) = lock(cupy_state()).managers.get(&device).copied() else {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "device = {device} has no Kmm manager for CuPy (kmm_cupy_set_manager)");
        };
        addr = alloc_by_address(cupy_state(), mgr, size as u64, cupy_stream()?)?;
        Ok(())
    });
    addr as *mut c_void
}

/// The free function of CuPy's `CFunctionAllocator`: frees memory from `kmm_cupy_malloc` after
/// the work queued so far on the stream it was allocated for. Unknown pointers and NULL are
/// ignored (the error is readable with `kmm_last_error`).
#[no_mangle]
pub extern "C" fn kmm_cupy_free(param: *mut c_void, ptr: *mut c_void, device: i32) {
    let _ = (param, device);
    if !ptr.is_null() {
        let _ = boundary(|| free_by_address(cupy_state(), ptr as u64, None, None, "kmm_cupy_malloc"));
    }
}

/// How many allocations of `kmm_cupy_malloc` are live (for tests and leak checks).
#[no_mangle]
pub extern "C" fn kmm_cupy_live_allocations(out: *mut u64) -> KmmStatus {
    boundary(|| write_out(out, "out", lock(cupy_state()).live.len() as u64))
}
