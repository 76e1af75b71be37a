//! Exported functions for allocator plugins of other libraries (Numba, CuPy, PyTorch): one call
//! that allocates and maps, one that frees, both ordered with the caller's stream; the same pair
//! keyed by address (Numba's plugin); and the pairs that PyTorch's `CUDAPluggableAllocator` and
//! CuPy's `CFunctionAllocator` load.
//!
//! Stream ordering. A plugin allocates for work on a foreign stream S (CuPy's current stream,
//! PyTorch's stream) while Kmm's pool reuses freed memory in the order of the manager's stream.
//! While every plugin call on a manager names the same stream S, reuse is ordered by S itself
//! and no synchronization is needed (as in CuPy's and PyTorch's per-stream pools). When a second
//! stream appears, the manager's stream first waits for everything queued on S so far, and from
//! then on every free makes the manager's stream wait for the freeing stream and every allocation
//! makes the allocating stream wait for the manager's stream. Pinned memory and the non-pool
//! modes (whose frees run on the manager's stream) are always ordered that way. The manager's
//! own stream counts as one of the streams (allocations for the manager's own work).

use super::types::*;
use super::{boundary, check_out, write_out};
use crate::backend::BackendKind;
use crate::error::{lock, KmmStatus, Result};
use crate::fail;
use crate::manager::registry::{self, with_manager};
use crate::manager::{AllocMode, Config, FreeMode, Manager, MemoryKind};
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Mutex, OnceLock};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamUse {
    Bound(u64),
    Multi,
}

/// Hashes the u64 keys of the tables below (handles, addresses) with one multiply and shift:
/// they are looked up at every plugin allocation and free, where SipHash (the default) cost as
/// much as the pool. The shift brings the mixed high bits down, because aligned addresses have
/// zero low bits and the table indexes by low bits.
#[derive(Default)]
struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, key: u64) {
        let h = (self.0 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// Per manager handle: which foreign stream its plugin calls have used so far.
fn stream_use() -> &'static Mutex<U64Map<StreamUse>> {
    static MAP: OnceLock<Mutex<U64Map<StreamUse>>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(U64Map::default()))
}

/// Whether `stream` needs ordering with the manager's stream for `kind` memory, after noting it.
/// Returns true when the caller must order (wait on free, signal on alloc). The manager's own
/// stream takes part like a foreign one (Python's `Buffer`s allocate through here with it), so
/// mixing plugin memory and the manager's own use of a pool is ordered too.
fn needs_order(handle: u64, m: &Manager, kind: MemoryKind, stream: u64) -> Result<bool> {
    let own = m.raw_stream();
    // The host backend has no foreign streams but other managers' ones; 0 stands for its own.
    let stream = if stream == 0 && m.backend_kind() == BackendKind::Host { own } else { stream };
    if kind == MemoryKind::Pinned || m.config().alloc_mode != AllocMode::Pool {
        return Ok(stream != own);
    }
    let mut map = lock(stream_use());
    match map.get(&handle).copied() {
        None => {
            map.insert(handle, StreamUse::Bound(stream));
            Ok(false)
        }
        Some(StreamUse::Bound(s)) if s == stream => Ok(false),
        Some(StreamUse::Bound(s)) => {
            // Everything freed so far was freed by work on `s`: order it before any reuse.
            if s != own {
                m.wait_for_stream(s)?;
            }
            map.insert(handle, StreamUse::Multi);
            Ok(stream != own)
        }
        Some(StreamUse::Multi) => Ok(stream != own),
    }
}

fn plugin_alloc(handle: u64, m: &Manager, bytes: u64, kind: MemoryKind, stream: u64) -> Result<(u64, u64)> {
    let buffer = m.alloc(bytes, kind)?;
    let ptr = match m.map(buffer) {
        Ok(p) => p,
        Err(e) => {
            let _ = m.free(buffer, FreeMode::Force);
            return Err(e);
        }
    };
    let ordered = needs_order(handle, m, kind, stream).and_then(|o| if o { m.order_stream_after(stream) } else { Ok(()) });
    if let Err(e) = ordered {
        let _ = m.free(buffer, FreeMode::Force);
        return Err(e);
    }
    Ok((buffer, ptr))
}

fn plugin_free(handle: u64, m: &Manager, buffer: u64, stream: u64) -> Result<()> {
    let (_, _, kind, _) = m.buffer_info(buffer)?;
    if needs_order(handle, m, kind, stream)? {
        m.wait_for_stream(stream)?;
    }
    m.free(buffer, FreeMode::Force)
}

/// For allocator plugins: allocates `bytes` of `kind` memory, maps it, and writes the buffer's
/// handle to `*buffer` and its address to `*ptr` (0 for zero bytes). `stream` is the raw stream
/// the memory will be used on (a `CUstream`; 0 is the legacy default stream on CUDA and means
/// the manager's own stream on the host backend); the memory is ready for work queued on it.
/// Free with `kmm_plugin_free` (the buffer stays mapped until then).
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
        let (b, p) = with_manager(manager, |m| plugin_alloc(manager, m, bytes, kind, stream))?;
        write_out(buffer, "buffer", b)?;
        write_out(ptr, "ptr", p)
    })
}

/// For allocator plugins: frees a buffer from `kmm_plugin_alloc` (mapped or not) after the work
/// queued so far on `stream` (the stream that last used it). Non-blocking; callable from any
/// thread and from finalizers.
#[no_mangle]
pub extern "C" fn kmm_plugin_free(manager: KmmManager, buffer: KmmBuffer, stream: u64) -> KmmStatus {
    boundary(|| with_manager(manager, |m| plugin_free(manager, m, buffer, stream)))
}

fn plugin_table() -> &'static Mutex<ByAddress> {
    static STATE: OnceLock<Mutex<ByAddress>> = OnceLock::new();
    STATE.get_or_init(ByAddress::new)
}

/// For allocator plugins that keep only the address (Numba's): allocates, as `kmm_plugin_alloc`
/// does, `bytes` (at least 1) of device memory ready for work on `stream`, and returns its
/// address. 0 on failure, with the message in `kmm_last_error` (`kmm_plugin_alloc` returns the
/// status). Free with `kmm_plugin_free_address`.
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

/// Size of the handle `kmm_buffer_ipc_handle` writes (a `CUipcMemHandle`).
pub const KMM_IPC_HANDLE_BYTES: u32 = 64;

fn ipc_handle(m: &Manager, buffer: u64) -> Result<([u8; 64], u64)> {
    use crate::backend::cuda::check;
    use cudarc::driver::sys;
    if m.backend_kind() != BackendKind::Cuda {
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
    // SAFETY: plain driver calls on the manager's device; the primary context is retained by the
    // backend already, retained again here for the duration and made current on this thread.
    unsafe {
        let mut dev = 0;
        check(sys::cuDeviceGet(&mut dev, m.device()), "cuDeviceGet")?;
        let mut ctx = std::ptr::null_mut();
        check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
        let result = (|| {
            check(sys::cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")?;
            let inner = (|| {
                let (mut base, mut size) = (0, 0usize);
                check(sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr), "cuMemGetAddressRange")?;
                let mut handle: sys::CUipcMemHandle = std::mem::zeroed();
                check(
                    sys::cuIpcGetMemHandle(&mut handle, base),
                    "cuIpcGetMemHandle (memory of alloc_mode cuda_async cannot be shared this way)",
                )?;
                let mut out = [0u8; 64];
                for (o, r) in out.iter_mut().zip(handle.reserved.iter()) {
                    *o = *r as u8;
                }
                Ok((out, addr - base))
            })();
            let mut popped = std::ptr::null_mut();
            let _ = sys::cuCtxPopCurrent_v2(&mut popped);
            inner
        })();
        let _ = sys::cuDevicePrimaryCtxRelease_v2(dev);
        result
    }
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

// ---------------------------------------------------------------------------------------------
// PyTorch's CUDAPluggableAllocator

/// `kmm_torch_set_oom_policy` value: on out-of-memory, print the error and abort the process
/// (the default: PyTorch does not check for NULL and would use address 0).
pub const KMM_TORCH_OOM_ABORT: u32 = 0;
/// `kmm_torch_set_oom_policy` value: on out-of-memory, return NULL (the error stays readable
/// with `kmm_last_error` on the allocating thread).
pub const KMM_TORCH_OOM_NULL: u32 = 1;

static TORCH_OOM_POLICY: AtomicU32 = AtomicU32::new(KMM_TORCH_OOM_ABORT);

/// Allocations handed to a library that frees by address (PyTorch's pluggable allocator, CuPy's
/// C function allocator, `kmm_plugin_malloc`): the manager serving each device (where the
/// library names devices, not managers) and every live allocation.
struct ByAddress {
    /// Device ordinal -> the manager serving the library on that device.
    managers: HashMap<i32, u64>,
    /// Address -> (manager, buffer, stream it was allocated for) of every live allocation.
    live: U64Map<(u64, u64, u64)>,
}

impl ByAddress {
    fn new() -> Mutex<ByAddress> {
        Mutex::new(ByAddress { managers: HashMap::new(), live: U64Map::default() })
    }
}

/// Allocates `bytes` of device memory from `mgr` for work on `stream` and records it by address.
fn alloc_by_address(table: &Mutex<ByAddress>, mgr: u64, bytes: u64, stream: u64) -> Result<u64> {
    let (b, p) = with_manager(mgr, |m| plugin_alloc(mgr, m, bytes, MemoryKind::Device, stream))?;
    lock(table).live.insert(p, (mgr, b, stream));
    Ok(p)
}

/// Frees what `alloc_by_address` recorded at `ptr`, after the work queued so far on `stream`
/// (`None`: the stream it was allocated for). With `manager`, only an allocation of that manager
/// matches (so a late free through a destroyed manager cannot hit a newer allocation).
fn free_by_address(table: &Mutex<ByAddress>, ptr: u64, manager: Option<u64>, stream: Option<u64>, owner: &str) -> Result<()> {
    let found = {
        let mut t = lock(table);
        match t.live.get(&ptr) {
            Some(&(mgr, _, _)) if manager.is_none_or(|m| m == mgr) => t.live.remove(&ptr),
            _ => None,
        }
    };
    let Some((mgr, b, alloc_stream)) = found else {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "ptr = {ptr:#x} was not allocated by {owner} (or is freed)");
    };
    with_manager(mgr, |m| plugin_free(mgr, m, b, stream.unwrap_or(alloc_stream)))
}

fn torch_state() -> &'static Mutex<ByAddress> {
    static STATE: OnceLock<Mutex<ByAddress>> = OnceLock::new();
    STATE.get_or_init(ByAddress::new)
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
    let h = registry::register(|slot, serial| Manager::new(config, slot, serial))?;
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

/// How many allocations of `kmm_torch_malloc` are live (for tests and leak checks).
#[no_mangle]
pub extern "C" fn kmm_torch_live_allocations(out: *mut u64) -> KmmStatus {
    boundary(|| write_out(out, "out", lock(torch_state()).live.len() as u64))
}

// ---------------------------------------------------------------------------------------------
// CuPy's CFunctionAllocator

/// Reads CuPy's current stream (CuPy's `get_current_stream_ptr`); -1 on error.
pub type KmmStreamSource = Option<unsafe extern "C" fn() -> isize>;
/// Called after a `KmmStreamSource` failed, to clear the error it left (Python's `PyErr_Clear`).
pub type KmmErrorHook = Option<unsafe extern "C" fn()>;

static CUPY_STREAM_SOURCE: AtomicUsize = AtomicUsize::new(0);
static CUPY_STREAM_ERROR_HOOK: AtomicUsize = AtomicUsize::new(0);

fn cupy_state() -> &'static Mutex<ByAddress> {
    static STATE: OnceLock<Mutex<ByAddress>> = OnceLock::new();
    STATE.get_or_init(ByAddress::new)
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
/// alive while CuPy may allocate). Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_cupy_set_manager(device: i32, manager: KmmManager) -> KmmStatus {
    boundary(|| {
        if device < 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "device = {device} is negative");
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
