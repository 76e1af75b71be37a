//! The CUDA backend: cudarc's driver bindings, loaded at run time, on each device's primary
//! context (retained, never destroyed by us), so CUDA.jl, CuPy and PyTorch in the same process
//! share the context and can use the memory and streams Kmm hands out. [`module`] compiles and
//! launches run-time CUDA modules (NVRTC) on the same contexts.

pub mod module;
mod module_cache;

use super::{AsyncPool, Backend, BackendKind, DevicePtr, Event, PinnedRanges, Stream};
use crate::error::{lock, Error, KmmStatus, Result};
use crate::fail;
use cudarc::driver::sys;
use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Turns a driver status into a `Result`, naming the call.
pub(crate) fn check(status: sys::CUresult, call: &str) -> Result<()> {
    if status == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it null.
    unsafe { sys::cuGetErrorName(status, &mut name) };
    let name = if name.is_null() {
        format!("{status:?}")
    } else {
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    let code = if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        KmmStatus::KMM_ERROR_OUT_OF_MEMORY
    } else {
        KmmStatus::KMM_ERROR_BACKEND
    };
    Err(Error::new(code, format!("{call} failed: {name} ({})", status as u32)))
}

/// Raw driver handles are plain pointers; the driver allows their use from any thread.
#[derive(Clone, Copy)]
struct Raw<T>(T);
unsafe impl<T> Send for Raw<T> {}
unsafe impl<T> Sync for Raw<T> {}

pub struct CudaBackend {
    device: i32,
    cu_device: sys::CUdevice,
    ctx: Raw<sys::CUcontext>,
    name: String,
    pinned_ranges: PinnedRanges,
    orders: Arc<StreamOrders>,
}

/// The devices Kmm has opened, each with its retained primary context.
fn opened() -> &'static Mutex<HashMap<i32, Arc<CudaBackend>>> {
    static DEVICES: OnceLock<Mutex<HashMap<i32, Arc<CudaBackend>>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A registration is the process's (portable: every device may DMA from it), and the driver
/// queues any copy from registered memory as DMA, small ones included, whichever manager or
/// device queues it. Such a copy must not run after the range is unregistered (a device fault,
/// `CUDA_ERROR_LAUNCH_FAILED`, for the context). Copies between host and device memory are
/// queued under the read side; ending a registration takes the write side, so no copy is being
/// queued while it drains every context Kmm uses and unregisters.
static REGISTRATIONS: RwLock<()> = RwLock::new(());

fn queuing_host_copy() -> std::sync::RwLockReadGuard<'static, ()> {
    REGISTRATIONS.read().unwrap_or_else(|e| e.into_inner())
}

impl CudaBackend {
    pub fn get(device: i32) -> Result<Arc<dyn Backend>> {
        let mut devices = lock(opened());
        if let Some(b) = devices.get(&device) {
            return Ok(b.clone());
        }
        let backend = Arc::new(CudaBackend::open(device)?);
        devices.insert(device, backend.clone());
        Ok(backend)
    }

    fn open(device: i32) -> Result<CudaBackend> {
        // cudarc panics on the first call when libcuda is missing: probe before any call.
        if !unsafe { sys::is_culib_present() } {
            fail!(KMM_ERROR_BACKEND_UNAVAILABLE, "{NO_DRIVER}");
        }
        let unavailable = |e: Error| Error::new(KmmStatus::KMM_ERROR_BACKEND_UNAVAILABLE, e.message);
        unsafe {
            check(sys::cuInit(0), "cuInit").map_err(unavailable)?;
            let mut count = 0;
            check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount").map_err(unavailable)?;
            if device < 0 || device >= count {
                fail!(KMM_ERROR_BACKEND_UNAVAILABLE, "device {device} does not exist: {count} CUDA device(s) visible");
            }
            let mut cu_device = 0;
            check(sys::cuDeviceGet(&mut cu_device, device), "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, cu_device), "cuDevicePrimaryCtxRetain")?;
            let mut name = [0 as std::ffi::c_char; 256];
            check(sys::cuDeviceGetName(name.as_mut_ptr(), 256, cu_device), "cuDeviceGetName")?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let orders = Arc::new(StreamOrders { ctx: Raw(ctx), spare: Mutex::new(Vec::new()) });
            Ok(CudaBackend { device, cu_device, ctx: Raw(ctx), name, pinned_ranges: PinnedRanges::default(), orders })
        }
    }

    /// Makes the primary context current on this thread while the guard lives.
    fn enter(&self) -> Result<Current> {
        enter(self.ctx.0)
    }
}

/// The one context rule: a Kmm call leaves the calling thread's current context as it found it.
/// `enter` makes `ctx` current for the guard's lifetime and the guard puts the caller's context
/// back (CUDA.jl, CuPy or PyTorch may have made another device's context current on the thread,
/// and a Julia finalizer may run Kmm in the middle of their work).
#[must_use = "the context is current only while the guard lives"]
pub(crate) struct Current {
    previous: Option<sys::CUcontext>,
}

impl Drop for Current {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: restores the handle cuCtxGetCurrent gave (possibly NULL: no context).
            unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

/// Makes `ctx` current on this thread until the returned guard drops (nothing to undo when it
/// already is).
pub(crate) fn enter(ctx: sys::CUcontext) -> Result<Current> {
    let mut current = std::ptr::null_mut();
    unsafe {
        check(sys::cuCtxGetCurrent(&mut current), "cuCtxGetCurrent")?;
        if current == ctx {
            return Ok(Current { previous: None });
        }
        check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
    }
    Ok(Current { previous: Some(current) })
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn device_name(&self) -> String {
        self.name.clone()
    }
    fn memory_info(&self) -> Result<(u64, u64)> {
        let _current = self.enter()?;
        let (mut free, mut total) = (0usize, 0usize);
        check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }
    fn alloc_device(&self, bytes: u64) -> Result<DevicePtr> {
        let _current = self.enter()?;
        let mut ptr = 0;
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) }, "cuMemAlloc")?;
        Ok(ptr)
    }
    unsafe fn free_device(&self, ptr: DevicePtr) -> Result<()> {
        let _current = self.enter()?;
        check(sys::cuMemFree_v2(ptr), "cuMemFree")
    }
    fn alloc_pinned(&self, bytes: u64) -> Result<*mut u8> {
        let _current = self.enter()?;
        let mut ptr = std::ptr::null_mut();
        check(
            unsafe { sys::cuMemHostAlloc(&mut ptr, bytes as usize, sys::CU_MEMHOSTALLOC_PORTABLE) },
            "cuMemHostAlloc",
        )?;
        self.pinned_ranges.insert(ptr as u64, bytes);
        Ok(ptr as *mut u8)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8) -> Result<()> {
        let _current = self.enter()?;
        self.pinned_ranges.remove(ptr as u64);
        check(sys::cuMemFreeHost(ptr as *mut c_void), "cuMemFreeHost")
    }
    unsafe fn register_host(&self, ptr: *mut u8, bytes: u64) -> Result<()> {
        // Refused here as on the host backend, rather than by the driver with its own status.
        if self.pinned_ranges.overlaps(ptr as u64, bytes) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "host memory at {ptr:?} ({bytes} bytes) overlaps a registered range");
        }
        let _current = self.enter()?;
        check(
            sys::cuMemHostRegister_v2(ptr as *mut c_void, bytes as usize, sys::CU_MEMHOSTREGISTER_PORTABLE),
            "cuMemHostRegister",
        )?;
        self.pinned_ranges.insert(ptr as u64, bytes);
        Ok(())
    }
    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        // Copies of any manager, on any device, may be reading or writing the range by DMA (a
        // registration is the process's, not one stream's). No copy is queued meanwhile; those
        // in flight finish before the range is unpinned under them; later ones see pageable
        // memory.
        let _no_copy_queued = REGISTRATIONS.write().unwrap_or_else(|e| e.into_inner());
        let Some(bytes) = self.pinned_ranges.remove(ptr as u64) else {
            crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "host memory at {ptr:?} was not registered");
        };
        let contexts: Vec<Raw<sys::CUcontext>> = lock(opened()).values().map(|b| b.ctx).collect();
        let drained = contexts.iter().try_for_each(|ctx| {
            let _current = enter(ctx.0)?;
            check(sys::cuCtxSynchronize(), "cuCtxSynchronize")
        });
        let _current = self.enter()?;
        let unpinned = drained.and_then(|_| check(sys::cuMemHostUnregister(ptr as *mut c_void), "cuMemHostUnregister"));
        if unpinned.is_err() {
            self.pinned_ranges.insert(ptr as u64, bytes);
        }
        unpinned
    }
    fn is_pinned_host(&self, ptr: *const u8, bytes: u64) -> bool {
        self.pinned_ranges.contains(ptr as u64, bytes)
    }
    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        let _current = self.enter()?;
        let mut raw = std::ptr::null_mut();
        check(
            unsafe { sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            "cuStreamCreate",
        )?;
        Ok(Arc::new(CudaStream { raw: Raw(raw), ctx: self.ctx, orders: self.orders.clone() }))
    }
    fn create_event(&self) -> Result<Box<dyn Event>> {
        Ok(Box::new(CudaEvent::new(self.ctx.0)?))
    }
    fn order_streams(&self, earlier: u64, later: u64) -> Result<()> {
        self.orders.order(earlier, later)
    }
    fn ipc_handle(&self, addr: DevicePtr) -> Result<([u8; 64], u64)> {
        let _current = self.enter()?;
        unsafe {
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
        }
    }
    fn create_async_pool(&self, release_threshold: u64, max_size: u64) -> Result<Box<dyn AsyncPool>> {
        let _current = self.enter()?;
        unsafe {
            let mut props: sys::CUmemPoolProps = std::mem::zeroed();
            props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
            props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
            props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = self.cu_device;
            props.maxSize = if max_size == u64::MAX { 0 } else { max_size as usize };
            let mut pool = std::ptr::null_mut();
            check(sys::cuMemPoolCreate(&mut pool, &props), "cuMemPoolCreate")?;
            let mut threshold = release_threshold;
            check(
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut threshold as *mut u64 as *mut c_void,
                ),
                "cuMemPoolSetAttribute(RELEASE_THRESHOLD)",
            )?;
            Ok(Box::new(CudaAsyncPool { pool: Raw(pool), ctx: self.ctx }))
        }
    }
    fn peer_access(&self, peer: &dyn Backend) -> Result<bool> {
        if peer.kind() != BackendKind::Cuda || peer.device() == self.device {
            return Ok(false);
        }
        peer_pair(self, peer.device(), peer.raw_context() as sys::CUcontext)
    }
    fn raw_context(&self) -> u64 {
        self.ctx.0 as u64
    }
}

/// How many CUDA devices are visible (an error when the driver is missing or fails).
pub fn device_count() -> Result<u32> {
    if !unsafe { sys::is_culib_present() } {
        fail!(KMM_ERROR_BACKEND_UNAVAILABLE, "{NO_DRIVER}");
    }
    let unavailable = |e: Error| Error::new(KmmStatus::KMM_ERROR_BACKEND_UNAVAILABLE, e.message);
    let mut count = 0;
    unsafe {
        check(sys::cuInit(0), "cuInit").map_err(unavailable)?;
        check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount").map_err(unavailable)?;
    }
    Ok(count.max(0) as u32)
}

/// Whether the devices can reach each other's memory, both ways (`cuDeviceCanAccessPeer`): a
/// question to the devices, no context made and nothing enabled.
pub fn can_access_peer(a: i32, b: i32) -> Result<bool> {
    if a == b {
        return Ok(false);
    }
    device_count()?;
    let (mut da, mut db, mut ab, mut ba) = (0, 0, 0, 0);
    unsafe {
        check(sys::cuDeviceGet(&mut da, a), "cuDeviceGet")?;
        check(sys::cuDeviceGet(&mut db, b), "cuDeviceGet")?;
        check(sys::cuDeviceCanAccessPeer(&mut ab, da, db), "cuDeviceCanAccessPeer")?;
        check(sys::cuDeviceCanAccessPeer(&mut ba, db, da), "cuDeviceCanAccessPeer")?;
    }
    Ok(ab == 1 && ba == 1)
}

/// Whether two devices copy peer to peer, decided (and peer access enabled both ways) once per
/// pair: enabling is per context and lasts as long as the primary contexts, which Kmm retains.
fn peer_pair(a: &CudaBackend, b_device: i32, b_ctx: sys::CUcontext) -> Result<bool> {
    static PAIRS: OnceLock<Mutex<HashMap<(i32, i32), bool>>> = OnceLock::new();
    let mut pairs = lock(PAIRS.get_or_init(|| Mutex::new(HashMap::new())));
    if let Some(&ok) = pairs.get(&(a.device, b_device)) {
        return Ok(ok);
    }
    // Another library (CUDA.jl, PyTorch) may have enabled it already: that is success too.
    let enable = |ctx: sys::CUcontext, peer: sys::CUcontext| -> bool {
        let Ok(_current) = enter(ctx) else { return false };
        matches!(
            unsafe { sys::cuCtxEnablePeerAccess(peer, 0) },
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        )
    };
    let ok = can_access_peer(a.device, b_device)? && enable(a.ctx.0, b_ctx) && enable(b_ctx, a.ctx.0);
    pairs.insert((a.device, b_device), ok);
    pairs.insert((b_device, a.device), ok);
    Ok(ok)
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.cu_device) };
    }
}

pub struct CudaStream {
    raw: Raw<sys::CUstream>,
    ctx: Raw<sys::CUcontext>,
    orders: Arc<StreamOrders>,
}

/// Orders raw streams of one context through events kept for reuse: creating an event per
/// ordering would cost more than recording it.
struct StreamOrders {
    ctx: Raw<sys::CUcontext>,
    spare: Mutex<Vec<CudaEvent>>,
}

impl StreamOrders {
    /// `later` waits for the work queued so far on `earlier` (0 is the context's legacy default
    /// stream, which is why the context is made current).
    fn order(&self, earlier: u64, later: u64) -> Result<()> {
        if earlier == later {
            return Ok(());
        }
        let event = match lock(&self.spare).pop() {
            Some(e) => e,
            None => CudaEvent::new(self.ctx.0)?,
        };
        let _current = enter(self.ctx.0)?;
        let ordered = unsafe {
            check(sys::cuEventRecord(event.raw.0, earlier as sys::CUstream), "cuEventRecord (ordering streams)")
                .and_then(|_| check(sys::cuStreamWaitEvent(later as sys::CUstream, event.raw.0, 0), "cuStreamWaitEvent (ordering streams)"))
        };
        // The wait captured the record: the event may be recorded again at once.
        lock(&self.spare).push(event);
        ordered
    }
}

fn cuda_event(event: &dyn Event) -> Result<&CudaEvent> {
    match event.as_any().downcast_ref::<CudaEvent>() {
        Some(e) => Ok(e),
        None => fail!(KMM_ERROR_INVALID_ARGUMENT, "event of another backend passed to the CUDA backend"),
    }
}

unsafe extern "C" fn run_host_fn(data: *mut c_void) {
    let f: Box<Box<dyn FnOnce() + Send>> = Box::from_raw(data as *mut Box<dyn FnOnce() + Send>);
    // A panic must not unwind into the driver's thread.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || f()));
}

impl Stream for CudaStream {
    fn raw(&self) -> u64 {
        self.raw.0 as u64
    }
    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64) -> Result<()> {
        let _registrations = queuing_host_copy();
        let _current = enter(self.ctx.0)?;
        check(sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes as usize, self.raw.0), "cuMemcpyHtoDAsync")
    }
    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64) -> Result<()> {
        let _registrations = queuing_host_copy();
        let _current = enter(self.ctx.0)?;
        check(sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes as usize, self.raw.0), "cuMemcpyDtoHAsync")
    }
    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(sys::cuMemcpyAsync(dst, src, bytes as usize, self.raw.0), "cuMemcpyAsync")
    }
    unsafe fn copy_peer(&self, dst: DevicePtr, src: DevicePtr, src_context: u64, bytes: u64) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(
            sys::cuMemcpyPeerAsync(dst, self.ctx.0, src, src_context as sys::CUcontext, bytes as usize, self.raw.0),
            "cuMemcpyPeerAsync",
        )
    }
    unsafe fn memset(&self, dst: DevicePtr, value: u32, width: u32, count: u64) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        let n = count as usize;
        match width {
            1 => check(sys::cuMemsetD8Async(dst, value as u8, n, self.raw.0), "cuMemsetD8Async"),
            2 => check(sys::cuMemsetD16Async(dst, value as u16, n, self.raw.0), "cuMemsetD16Async"),
            4 => check(sys::cuMemsetD32Async(dst, value, n, self.raw.0), "cuMemsetD32Async"),
            _ => fail!(KMM_ERROR_INVALID_ARGUMENT, "memset width {width} is not 1, 2 or 4"),
        }
    }
    fn record(&self, event: &dyn Event) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(unsafe { sys::cuEventRecord(cuda_event(event)?.raw.0, self.raw.0) }, "cuEventRecord")
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(unsafe { sys::cuStreamWaitEvent(self.raw.0, cuda_event(event)?.raw.0, 0) }, "cuStreamWaitEvent")
    }
    fn wait_raw_stream(&self, foreign: u64) -> Result<()> {
        self.orders.order(foreign, self.raw())
    }
    fn signal_raw_stream(&self, foreign: u64) -> Result<()> {
        self.orders.order(self.raw(), foreign)
    }
    fn synchronize(&self) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(unsafe { sys::cuStreamSynchronize(self.raw.0) }, "cuStreamSynchronize")
    }
    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        let status = unsafe { sys::cuLaunchHostFunc(self.raw.0, Some(run_host_fn), data) };
        if status != sys::CUresult::CUDA_SUCCESS {
            // Not enqueued: reclaim the closure without running it.
            drop(unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) });
        }
        check(status, "cuLaunchHostFunc")
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if let Ok(_current) = enter(self.ctx.0) {
            unsafe {
                sys::cuStreamSynchronize(self.raw.0);
                sys::cuStreamDestroy_v2(self.raw.0);
            }
        }
    }
}

pub struct CudaEvent {
    raw: Raw<sys::CUevent>,
    ctx: Raw<sys::CUcontext>,
}

impl CudaEvent {
    fn new(ctx: sys::CUcontext) -> Result<CudaEvent> {
        let _current = enter(ctx)?;
        let mut raw = std::ptr::null_mut();
        check(
            unsafe { sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )?;
        Ok(CudaEvent { raw: Raw(raw), ctx: Raw(ctx) })
    }
}

impl Event for CudaEvent {
    fn query(&self) -> Result<bool> {
        let _current = enter(self.ctx.0)?;
        match unsafe { sys::cuEventQuery(self.raw.0) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, "cuEventQuery").map(|_| false),
        }
    }
    fn synchronize(&self) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(unsafe { sys::cuEventSynchronize(self.raw.0) }, "cuEventSynchronize")
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if let Ok(_current) = enter(self.ctx.0) {
            unsafe { sys::cuEventDestroy_v2(self.raw.0) };
        }
    }
}

pub struct CudaAsyncPool {
    pool: Raw<sys::CUmemoryPool>,
    ctx: Raw<sys::CUcontext>,
}

impl CudaAsyncPool {
    fn attribute(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let mut value: u64 = 0;
        check(
            unsafe { sys::cuMemPoolGetAttribute(self.pool.0, attr, &mut value as *mut u64 as *mut c_void) },
            "cuMemPoolGetAttribute",
        )?;
        Ok(value)
    }
}

impl AsyncPool for CudaAsyncPool {
    fn alloc(&self, bytes: u64, stream: &dyn Stream) -> Result<DevicePtr> {
        let _current = enter(self.ctx.0)?;
        let mut ptr = 0;
        check(
            unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes as usize, self.pool.0, stream.raw() as sys::CUstream) },
            "cuMemAllocFromPoolAsync",
        )?;
        Ok(ptr)
    }
    unsafe fn free(&self, ptr: DevicePtr, stream: &dyn Stream) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(sys::cuMemFreeAsync(ptr, stream.raw() as sys::CUstream), "cuMemFreeAsync")
    }
    fn reserved(&self) -> Result<(u64, u64)> {
        use sys::CUmemPool_attribute::*;
        Ok((self.attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?, self.attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?))
    }
    fn trim(&self, keep_bytes: u64) -> Result<()> {
        let _current = enter(self.ctx.0)?;
        check(unsafe { sys::cuMemPoolTrimTo(self.pool.0, keep_bytes as usize) }, "cuMemPoolTrimTo")
    }
}

impl Drop for CudaAsyncPool {
    fn drop(&mut self) {
        if let Ok(_current) = enter(self.ctx.0) {
            unsafe { sys::cuMemPoolDestroy(self.pool.0) };
        }
    }
}

/// Why there is no CUDA backend on a machine without the driver, and what to choose instead.
const NO_DRIVER: &str = "the CUDA backend needs the CUDA driver (libcuda), which is not installed: without a GPU, \
     choose the host backend (KMM_BACKEND=host; or auto, the default, which falls back to it)";
