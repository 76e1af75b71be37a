//! Backends: the only code that touches a device. The pool and manager layers speak to them
//! through these traits, so the same logic runs on CUDA and on the host stand-in.

pub mod cuda;
pub mod faulty;
pub mod host;
mod pinned_ranges;

pub use pinned_ranges::PinnedRanges;

use crate::error::Result;
use std::any::Any;
use std::sync::Arc;

/// A device address. On the host backend it is a host address.
pub type DevicePtr = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Host,
    Cuda,
}

pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    fn device(&self) -> i32;
    fn device_name(&self) -> String;
    /// (free, total) bytes of device memory.
    fn memory_info(&self) -> Result<(u64, u64)>;

    fn alloc_device(&self, bytes: u64) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from `alloc_device` (or is adopted memory of the same origin) and no queued
    /// work still uses it.
    unsafe fn free_device(&self, ptr: DevicePtr) -> Result<()>;

    fn alloc_pinned(&self, bytes: u64) -> Result<*mut u8>;
    /// # Safety
    /// `ptr` came from `alloc_pinned` and no queued work still uses it.
    unsafe fn free_pinned(&self, ptr: *mut u8) -> Result<()>;

    /// Page-locks caller memory so copies from it go direct.
    /// # Safety
    /// `ptr..ptr+bytes` is valid host memory until `unregister_host`.
    unsafe fn register_host(&self, ptr: *mut u8, bytes: u64) -> Result<()>;
    /// # Safety
    /// `ptr` was registered with `register_host`.
    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()>;
    /// Whether `ptr..ptr+bytes` is page-locked (Kmm's pinned memory or registered memory).
    fn is_pinned_host(&self, ptr: *const u8, bytes: u64) -> bool;

    fn create_stream(&self) -> Result<Arc<dyn Stream>>;
    fn create_event(&self) -> Result<Box<dyn Event>>;
    /// Raw stream `later` waits for the work queued so far on raw stream `earlier` (streams of
    /// this device, the backend's own or foreign ones). Stream-ordered: nothing waits on the host.
    fn order_streams(&self, earlier: u64, later: u64) -> Result<()>;
    /// Whether `raw` names a stream this backend can order (the host backend knows its streams;
    /// CUDA cannot check a `CUstream` without risking a crash on a forged one, so it accepts all).
    fn check_stream(&self, raw: u64) -> Result<()> {
        let _ = raw;
        Ok(())
    }
    /// Whether `raw` named a stream of this backend that has ended since (its work has run, or
    /// its last work is still known to the ordering): memory last used there may be freed.
    fn stream_ended(&self, raw: u64) -> bool {
        let _ = raw;
        false
    }
    /// The IPC handle (`cuIpcGetMemHandle`) of the device allocation holding `addr`, and `addr`'s
    /// offset from that allocation's base.
    fn ipc_handle(&self, addr: DevicePtr) -> Result<([u8; 64], u64)> {
        let _ = addr;
        crate::fail!(KMM_ERROR_NOT_SUPPORTED, "IPC handles need the CUDA backend; this manager runs on the host backend")
    }
    /// A stream-ordered pool private to one manager (`cuMemPoolCreate`).
    fn create_async_pool(&self, release_threshold: u64, max_size: u64) -> Result<Box<dyn AsyncPool>>;
    /// Whether streams of this device copy directly from and to `peer`'s memory (peer to peer,
    /// over NVLink or PCIe), enabling peer access both ways on first use. False for the same
    /// device and for another backend: such copies are staged through pinned host memory.
    fn peer_access(&self, peer: &dyn Backend) -> Result<bool>;
    /// The raw context (`CUcontext` on CUDA; 0 on the host backend), for peer copies.
    fn raw_context(&self) -> u64 {
        0
    }
}

/// An in-order work queue. All copies are asynchronous with respect to the caller; callers that
/// need completion record an event or synchronize.
pub trait Stream: Send + Sync {
    /// The raw handle (`CUstream` on CUDA; a registry id on the host backend).
    fn raw(&self) -> u64;
    /// # Safety
    /// The ranges are valid until the copy has run.
    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64) -> Result<()>;
    /// # Safety
    /// As `copy_h2d`.
    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64) -> Result<()>;
    /// Any pair of device or page-locked addresses (unified addressing).
    /// # Safety
    /// As `copy_h2d`.
    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()>;
    /// From memory of another device (context `src_context`, see `Backend::raw_context`) to
    /// this stream's device, peer to peer (`cuMemcpyPeerAsync`).
    /// # Safety
    /// As `copy_h2d`; the devices have peer access (`Backend::peer_access`).
    unsafe fn copy_peer(&self, dst: DevicePtr, src: DevicePtr, src_context: u64, bytes: u64) -> Result<()>;
    /// Fills `count` elements of `width` bytes (1, 2 or 4) with the low bytes of `value`.
    /// # Safety
    /// `dst..dst+count*width` is valid until the fill has run.
    unsafe fn memset(&self, dst: DevicePtr, value: u32, width: u32, count: u64) -> Result<()>;
    fn record(&self, event: &dyn Event) -> Result<()>;
    fn wait_event(&self, event: &dyn Event) -> Result<()>;
    /// This stream waits for the work queued so far on the foreign raw stream.
    fn wait_raw_stream(&self, foreign: u64) -> Result<()>;
    /// The foreign raw stream waits for the work queued so far on this stream.
    fn signal_raw_stream(&self, foreign: u64) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// Runs `f` on a host thread once the work queued before it has run. `f` must not call the
    /// backend (CUDA forbids it in host functions).
    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()>;
}

pub trait Event: Send + Sync {
    /// Whether the work captured by the last `record` has run.
    fn query(&self) -> Result<bool>;
    fn synchronize(&self) -> Result<()>;
    fn as_any(&self) -> &dyn Any;
}

/// A stream-ordered allocator whose memory the backend keeps (CUDA's `cuMemPool`).
pub trait AsyncPool: Send + Sync {
    fn alloc(&self, bytes: u64, stream: &dyn Stream) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from `alloc` on this pool.
    unsafe fn free(&self, ptr: DevicePtr, stream: &dyn Stream) -> Result<()>;
    /// Bytes held from the device (current, high-water mark).
    fn reserved(&self) -> Result<(u64, u64)>;
    fn trim(&self, keep_bytes: u64) -> Result<()>;
}

/// Which backend a manager asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Host,
    Cuda,
}

/// Records an event on `stream`, reusing one from `spare` when there is one (events are recycled
/// by the stream-ordered resources that queue a release behind each piece of work). An event
/// whose record failed goes back to `spare`.
pub fn record_reusing(backend: &dyn Backend, stream: &dyn Stream, spare: &mut Vec<Box<dyn Event>>) -> Result<Box<dyn Event>> {
    let event = match spare.pop() {
        Some(e) => e,
        None => backend.create_event()?,
    };
    match stream.record(event.as_ref()) {
        Ok(()) => Ok(event),
        Err(e) => {
            spare.push(event);
            Err(e)
        }
    }
}

/// Opens `device` of the chosen backend, resolving `Auto` through `KMM_BACKEND`
/// (host|cuda|auto) and then through CUDA's presence.
pub fn open(choice: BackendChoice, device: i32) -> Result<Arc<dyn Backend>> {
    let backend = match resolve(choice)? {
        BackendChoice::Host => host::HostBackend::get(device)?,
        BackendChoice::Cuda => cuda::CudaBackend::get(device)?,
        // CUDA when it is usable (as `device_count` counts): a device CUDA lacks is an error
        // naming it, never a host stand-in computing on the CPU in its place.
        BackendChoice::Auto if cuda_usable() => cuda::CudaBackend::get(device)?,
        BackendChoice::Auto => host::HostBackend::get(device)?,
    };
    // Tests (and KMM_FAULTS) may install a fault plan; without one this is the backend itself.
    Ok(faulty::wrap_if_planned(backend))
}

/// How many devices `choice` offers: CUDA's visible devices, or the host backend's stand-ins
/// (`KMM_HOST_DEVICES`). Auto counts CUDA's when CUDA is usable, else the host's.
pub fn device_count(choice: BackendChoice) -> Result<u32> {
    match resolve(choice)? {
        BackendChoice::Host => host::device_count(),
        BackendChoice::Cuda => cuda::device_count(),
        BackendChoice::Auto if cuda_usable() => cuda::device_count(),
        BackendChoice::Auto => host::device_count(),
    }
}

/// Whether `Auto` means CUDA: the driver is installed and sees a device.
fn cuda_usable() -> bool {
    cuda::device_count().is_ok_and(|n| n > 0)
}

/// Whether `device` and `peer` of `choice` can copy peer to peer, asked of the devices alone:
/// no context is made and peer access is not enabled (the first copy between them does that).
pub fn can_access_peer(choice: BackendChoice, device: i32, peer: i32) -> Result<bool> {
    let count = device_count(choice)?;
    for (name, d) in [("device", device), ("peer", peer)] {
        if d < 0 || d as i64 >= count as i64 {
            crate::fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "{name} = {d} is not a device of this backend: {count} device(s){}",
                if count == 0 { String::new() } else { format!(", numbered 0 to {}", count - 1) }
            );
        }
    }
    let cuda = match resolve(choice)? {
        BackendChoice::Host => false,
        BackendChoice::Cuda => true,
        BackendChoice::Auto => cuda_usable(),
    };
    if cuda {
        cuda::can_access_peer(device, peer)
    } else {
        Ok(host::paired(device, peer))
    }
}

/// `Auto` through `KMM_BACKEND` (host|cuda|auto); explicit choices stay.
fn resolve(choice: BackendChoice) -> Result<BackendChoice> {
    Ok(match choice {
        BackendChoice::Auto => match std::env::var("KMM_BACKEND").ok().as_deref() {
            None | Some("") | Some("auto") => BackendChoice::Auto,
            Some("host") => BackendChoice::Host,
            Some("cuda") => BackendChoice::Cuda,
            Some(other) => crate::fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "KMM_BACKEND={other:?} is not one of \"auto\", \"host\", \"cuda\""
            ),
        },
        explicit => explicit,
    })
}
