//! Exported functions on managers and events.

use super::registry::{self, with_manager};
use super::types::*;
use super::{boundary, check_flags, check_out, write_out, write_text};
use crate::backend::BackendKind;
use crate::error::KmmStatus;
use crate::fail;
use crate::manager::Config;
use std::ffi::c_char;

/// Fills `*config` with the defaults: auto backend, device 0, pool mode with the binned
/// suballocator, 256-byte alignment, 8 MiB device chunks, no limits, everything cached.
#[no_mangle]
pub extern "C" fn kmm_config_default(config: *mut KmmConfig) -> KmmStatus {
    boundary(|| write_out(config, "config", KmmConfig::from(&Config::default())))
}

/// Checks `*config` as `kmm_manager_create` does, without making a manager: `KMM_OK`, or the
/// status and a message naming the first option out of bounds. (Whether the backend and device
/// exist is the creation's to find.)
#[no_mangle]
pub extern "C" fn kmm_config_check(config: *const KmmConfig) -> KmmStatus {
    boundary(|| {
        if config.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "config is NULL");
        }
        // SAFETY: non-null; the caller passes a KmmConfig.
        Config::try_from(unsafe { &*config }).map(drop)
    })
}

/// Writes to `*count` how many devices `backend` (a `KmmBackend`) offers: the visible CUDA
/// devices, or the host backend's stand-ins (the `KMM_HOST_DEVICES` variable, 1 to 64, default
/// 1). `KMM_BACKEND_AUTO` follows `KMM_BACKEND`, then counts CUDA's devices when CUDA is usable,
/// else the host's. Managers may be created on devices `0..count`.
#[no_mangle]
pub extern "C" fn kmm_device_count(backend: u32, count: *mut u32) -> KmmStatus {
    boundary(|| {
        check_out(count, "count")?;
        write_out(count, "count", crate::backend::device_count(backend_choice(backend)?)?)
    })
}

/// Writes to `*out` whether copies between `device` and `peer` of `backend` (a `KmmBackend`)
/// can go peer to peer (1) or are staged through pinned host memory (0; also for `device ==
/// peer`). Only asks the devices (`cuDeviceCanAccessPeer` both ways): no context is made and
/// peer access is not enabled; the first copy between the two enables it, both ways, for the
/// life of the process (and accepts it already enabled by another library). Host stand-in
/// devices pair up as NVLink pairs do: 0 with 1, 2 with 3, and so on.
#[no_mangle]
pub extern "C" fn kmm_device_can_access_peer(backend: u32, device: i32, peer: i32, out: *mut u32) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let can = crate::backend::can_access_peer(backend_choice(backend)?, device, peer)?;
        write_out(out, "out", can as u32)
    })
}

/// Writes to `*count` how many managers are alive in this process: created and not yet torn
/// down (one whose deferred teardown still runs counts). A process that closed all it made
/// reads 0: what scale-out code checks to show a call left nothing behind.
#[no_mangle]
pub extern "C" fn kmm_live_managers(count: *mut u32) -> KmmStatus {
    boundary(|| {
        check_out(count, "count")?;
        write_out(count, "count", registry::live_managers() as u32)
    })
}

/// Creates a manager with its own stream and pools. `config` may be NULL for the defaults.
/// On success writes the handle to `*out`; destroy it with `kmm_manager_destroy`.
/// Many managers may coexist, on one device or several. Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_manager_create(config: *const KmmConfig, out: *mut KmmManager) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        // SAFETY: non-null config points to a KmmConfig provided by the caller.
        let config = if config.is_null() { Config::default() } else { Config::try_from(unsafe { &*config })? };
        let handle = registry::register(config)?;
        write_out(out, "out", handle)
    })
}

/// Destroys a manager: waits for its stream, frees every buffer and event it still holds and
/// gives all its memory back. Later calls with its handles return `KMM_ERROR_INVALID_HANDLE`.
/// With `KMM_DESTROY_DEFERRED` the handle dies at once and the teardown runs on a background
/// thread, so the call never waits for the device (for finalizers), nor for calls in flight on
/// the manager (the teardown waits for them); a file trace's rows recorded so far are written
/// first (into a pipe, that waits for its reader). Thread-safe; without the flag, waits for calls
/// in flight on the same manager. Allocations of `kmm_cupy_malloc` and `kmm_torch_malloc` it
/// still held are freed with it; those libraries free by address alone, so until each late free
/// comes, a new allocation of theirs that lands on such an address is held back (it counts in
/// its manager's stats, at most one per address) and the request is served elsewhere; the late
/// free gives it back. `kmm_plugin_free_address` names the manager, so its late frees need none of this.
#[no_mangle]
pub extern "C" fn kmm_manager_destroy(manager: KmmManager, flags: u32) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_DESTROY_DEFERRED, "flags")?;
        if flags & KMM_DESTROY_DEFERRED != 0 {
            // The handle ends now, beside the calls in flight (one may wait for the device);
            // the teardown thread waits for them. The teardown may not end before the process
            // does: what a file trace recorded up to this call is written now (its teardown's
            // own rows follow, if it ends).
            let retired = registry::retire(manager, |m| m.trace_flush())?;
            // Before the teardown frees its memory: a late free by address of what it held
            // must not free a new allocation at that address.
            super::by_address::orphan_everywhere(manager);
            // A thread that cannot start (no memory, a thread limit) drops the closure: the
            // drop of `retired` tears the manager down here instead, waiting for those calls.
            let _ = std::thread::Builder::new()
                .name("kmm-manager-teardown".into())
                .spawn(move || drop(retired.take()));
            Ok(())
        } else {
            let m = registry::unregister(manager)?;
            super::by_address::orphan_everywhere(manager);
            drop(m);
            Ok(())
        }
    })
}

/// Waits until all work queued on the manager's stream has run, then gives cached device
/// memory above the release threshold back.
#[no_mangle]
pub extern "C" fn kmm_manager_synchronize(manager: KmmManager) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.synchronize()))
}

/// Writes the manager's backend, device, mode and raw stream to `*out`. The stream (a
/// `CUstream` on CUDA) stays owned by the manager; others may queue work on it until the
/// manager is destroyed.
#[no_mangle]
pub extern "C" fn kmm_manager_info(manager: KmmManager, out: *mut KmmManagerInfo) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let info = with_manager(manager, |m| {
            let c = m.config();
            Ok(KmmManagerInfo {
                backend: match m.backend_kind() {
                    BackendKind::Host => KmmBackend::KMM_BACKEND_HOST,
                    BackendKind::Cuda => KmmBackend::KMM_BACKEND_CUDA,
                } as u32,
                device: m.device(),
                alloc_mode: KmmConfig::from(c).alloc_mode,
                suballocator: suballocator_code(c.suballocator),
                stream: m.raw_stream(),
            })
        })?;
        write_out(out, "out", info)
    })
}

/// Writes the figures of one memory kind (a `KmmMemoryKind`) to `*out`.
#[no_mangle]
pub extern "C" fn kmm_manager_stats(manager: KmmManager, kind: u32, out: *mut KmmMemoryStats) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let kind = memory_kind(kind, "kind")?;
        let stats = with_manager(manager, |m| Ok(m.stats(kind)))?;
        write_out(out, "out", stats.into())
    })
}

/// Resets the peak counters (in use and reserved) of both kinds to their current values.
#[no_mangle]
pub extern "C" fn kmm_manager_reset_peaks(manager: KmmManager) -> KmmStatus {
    boundary(|| with_manager(manager, |m| Ok(m.reset_peaks())))
}

/// Waits for the stream, then gives cached memory back until each pool reserves at most
/// `keep_bytes` (live buffers are never moved or freed).
#[no_mangle]
pub extern "C" fn kmm_manager_trim(manager: KmmManager, keep_bytes: u64) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.trim(keep_bytes)))
}

/// Writes a readable table of the manager's memory (in use, reserved, peaks, counts, largest
/// free block) into `buf` as a NUL-terminated string, truncated to `len` bytes, and the length
/// the whole text needs (with its NUL) to `*needed` when `needed` is not NULL. `buf` may be NULL
/// when `len` is 0, to ask for the length.
#[no_mangle]
pub extern "C" fn kmm_manager_summary(manager: KmmManager, buf: *mut c_char, len: usize, needed: *mut usize) -> KmmStatus {
    boundary(|| {
        if buf.is_null() && len > 0 {
            fail!(KMM_ERROR_NULL_POINTER, "buf is NULL but len = {len}");
        }
        let text = with_manager(manager, |m| Ok(m.summary()))?;
        write_text(&text, buf, len, needed)
    })
}

/// Writes the device's free and total memory in bytes.
#[no_mangle]
pub extern "C" fn kmm_manager_memory_info(manager: KmmManager, free: *mut u64, total: *mut u64) -> KmmStatus {
    boundary(|| {
        check_out(free, "free")?;
        check_out(total, "total")?;
        let (f, t) = with_manager(manager, |m| m.memory_info())?;
        write_out(free, "free", f)?;
        write_out(total, "total", t)
    })
}

/// Makes the manager's stream wait for the work queued so far on `stream` (a `CUstream` of the
/// same device, e.g. CUDA.jl's or PyTorch's; on the host backend, another manager's stream).
#[no_mangle]
pub extern "C" fn kmm_manager_wait_stream(manager: KmmManager, stream: u64) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.wait_for_stream(stream)))
}

/// Makes `stream` wait for the work queued so far on the manager's stream.
#[no_mangle]
pub extern "C" fn kmm_manager_signal_stream(manager: KmmManager, stream: u64) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.order_stream_after(stream)))
}

/// Records an event after the work queued so far on the manager's stream. Destroy it with
/// `kmm_event_destroy` (destroying the manager destroys it too).
#[no_mangle]
pub extern "C" fn kmm_manager_record_event(manager: KmmManager, out: *mut KmmEvent) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let e = with_manager(manager, |m| m.record_event())?;
        write_out(out, "out", e)
    })
}

/// Writes whether the work before the event has run (non-blocking).
#[no_mangle]
pub extern "C" fn kmm_event_query(manager: KmmManager, event: KmmEvent, done: *mut bool) -> KmmStatus {
    boundary(|| {
        check_out(done, "done")?;
        let d = with_manager(manager, |m| m.event_query(event))?;
        write_out(done, "done", d)
    })
}

/// Blocks until the work before the event has run.
#[no_mangle]
pub extern "C" fn kmm_event_wait(manager: KmmManager, event: KmmEvent) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.event_wait(event)))
}

/// Destroys an event; work already queued is unaffected.
#[no_mangle]
pub extern "C" fn kmm_event_destroy(manager: KmmManager, event: KmmEvent) -> KmmStatus {
    boundary(|| with_manager(manager, |m| m.event_destroy(event)))
}

