//! Types that cross the C ABI. Enumerations are declared for the header, but functions and
//! structs carry them as `uint32_t` so an out-of-range value from C is a checked error rather
//! than undefined behaviour in Rust.

use crate::backend::BackendChoice;
use crate::error::Result;
use crate::fail;
use crate::manager::{AllocMode, Config, KindStats, MemoryKind};
use crate::pool::SuballocatorKind;

/// Bumped whenever a signature, a struct layout or a constant's meaning changes.
pub const KMM_ABI_VERSION: u32 = 3;

/// The largest buffer one allocation may ask for: 2^48 bytes. Larger is `KMM_ERROR_SIZE_OVERFLOW`.
pub const KMM_MAX_BUFFER_BYTES: u64 = 281_474_976_710_656;

/// A manager: owns a stream, memory pools, buffers and events. 0 is never a valid handle.
pub type KmmManager = u64;
/// A buffer of device or pinned host memory, owned by one manager. 0 is never valid.
pub type KmmBuffer = u64;
/// An event recorded on a manager's stream. 0 is never valid.
pub type KmmEvent = u64;

/// `kmm_buffer_free` flag: free even if the buffer is mapped (its mappings become dangling).
pub const KMM_FREE_FORCE: u32 = 1;
/// `kmm_manager_destroy` flag: invalidate the handle now and tear down on a background thread,
/// so the call never waits for the device (for finalizers).
pub const KMM_DESTROY_DEFERRED: u32 = 1;

/// Which backend a manager runs on (`KmmConfig.backend`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmBackend {
    /// CUDA when a device is usable, else host; the `KMM_BACKEND` variable (auto|host|cuda)
    /// decides first when set.
    KMM_BACKEND_AUTO = 0,
    /// The CPU stand-in: host memory with faithful stream semantics.
    KMM_BACKEND_HOST = 1,
    /// CUDA through the driver API; an error when no device is usable.
    KMM_BACKEND_CUDA = 2,
}

/// How a manager obtains device memory (`KmmConfig.alloc_mode`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmAllocMode {
    /// Kmm's own suballocator over large chunks (the default). The pool is split into 16
    /// lanes, each with its own lock and chunks; threads are dealt lanes in turn, so threads
    /// sharing a manager seldom wait for each other. A request its thread's lane cannot serve is
    /// tried in the other lanes before the manager reports out of memory, and a lane takes the
    /// free chunks of other lanes before it grows.
    KMM_ALLOC_POOL = 0,
    /// A private CUDA memory pool (`cuMemAllocFromPoolAsync`) with release threshold and
    /// maximum size (the hard limit).
    KMM_ALLOC_CUDA_ASYNC = 1,
    /// One `cuMemAlloc` per buffer: for debugging and as a baseline.
    KMM_ALLOC_DIRECT = 2,
}

/// The suballocator of pool mode (`KmmConfig.suballocator`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmSuballocator {
    /// Size classes up to 64 KiB, heap above (the default).
    KMM_SUBALLOC_BINNED = 0,
    /// Best fit within fine size classes, with splitting and coalescing.
    KMM_SUBALLOC_HEAP = 1,
    /// Blocks of `fixed_block_size` (rounded up to `alignment`); larger requests fail.
    KMM_SUBALLOC_FIXED = 2,
    /// A ring for short-lived temporaries freed roughly in allocation order.
    KMM_SUBALLOC_RING = 3,
}

/// Where a buffer's memory lives.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmMemoryKind {
    /// Device memory.
    KMM_MEMORY_DEVICE = 0,
    /// Page-locked host memory, addressable by the host and the device.
    KMM_MEMORY_PINNED = 1,
}

/// Who frees memory passed to `kmm_buffer_wrap`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmOwnership {
    /// The caller keeps ownership and frees the memory after freeing the buffer and
    /// synchronizing the manager.
    KMM_BORROW = 0,
    /// Kmm frees the memory when the buffer is freed: `cuMemFree`/`cuMemFreeHost` on CUDA
    /// (memory from `cuMemAlloc`/`cuMemHostAlloc`), `free` on the host backend (from `malloc`).
    KMM_ADOPT = 1,
}

/// Manager configuration. Fill it with `kmm_config_default`, then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KmmConfig {
    /// A `KmmBackend`.
    pub backend: u32,
    /// Device ordinal.
    pub device: i32,
    /// A `KmmAllocMode`.
    pub alloc_mode: u32,
    /// A `KmmSuballocator`.
    pub suballocator: u32,
    /// Alignment of every block in bytes: a power of two up to 2 MiB (default 256).
    pub alignment: u64,
    /// Bytes the device pool grows by (default 8 MiB). A chunk is never smaller than the request
    /// rounded up to a multiple of 2 MiB (the granularity CUDA maps device memory in): a
    /// `chunk_size` under 2 MiB grows the pool by 2 MiB, and a larger request gets a chunk of
    /// its own of that size. The fixed suballocator's chunks are `chunk_size` rounded up to whole
    /// blocks instead. Where a whole chunk would pass `hard_limit` or the device's free memory,
    /// the pool grows by the least chunk that serves the request.
    pub chunk_size: u64,
    /// Bytes reserved when the manager is created (default 0); in pool mode, in the lane of the
    /// creating thread. At most `hard_limit` when that is set.
    pub initial_pool_size: u64,
    /// Block size of the fixed suballocator (default 1 MiB), rounded up to a multiple of
    /// `alignment`: requests up to the rounded size are served, larger ones fail.
    pub fixed_block_size: u64,
    /// Most device bytes the manager may reserve; 0 means no limit (default 0). Memory adopted
    /// with `kmm_buffer_wrap` was allocated by the caller, not reserved here: the limit leaves it
    /// out, while `KmmMemoryStats.reserved` counts it (the manager holds and frees it).
    pub hard_limit: u64,
    /// Cached device bytes kept across `kmm_manager_synchronize`; UINT64_MAX keeps all (default).
    pub release_threshold: u64,
    /// Bytes the pinned pool grows by (default 32 MiB; less where a whole chunk would pass
    /// `pinned_limit`, as for `chunk_size`).
    pub pinned_chunk_size: u64,
    /// Most pinned bytes the manager's pinned pool may reserve (pinned buffers and the pinned
    /// part of spilled data; a pinned allocation that needs the room moves spilled data on to
    /// pageable memory); 0 means no limit (default 0). The staging slots of pageable copies
    /// (`staging_chunk_size` x `staging_chunks`) are reserved apart from it.
    pub pinned_limit: u64,
    /// Size of one staging slot for pageable copies (default 16 MiB; 4 KiB to 1 GiB).
    pub staging_chunk_size: u64,
    /// Number of staging slots (default 4; 2 to 64).
    pub staging_chunks: u32,
    /// Pool mode: once growing would take the device pool's reserved bytes past this percentage
    /// of the bytes its blocks hold, the pool first makes room by moving unmapped buffers
    /// (compaction; also tried before failing with out of memory). 0 never moves buffers;
    /// otherwise 100 to 1000 (default 108).
    pub compaction_ratio_pct: u32,
    /// Most bytes of device buffers that may spill to host memory when the device (or
    /// `hard_limit`) is full: unmapped buffers not marked `kmm_buffer_never_spill` move to the
    /// host, least recently used first, into pinned memory while `pinned_limit` leaves room, then
    /// pageable memory, and come back on their next use. 0 never spills (default 0).
    pub spill_limit: u64,
}

/// Figures for one memory kind of one manager (`kmm_manager_stats`). Byte counts of "in use"
/// are what callers asked for; "reserved" is what the manager holds from the device. Bytes in use
/// and reserved, and their peaks, are the manager's own across all its lanes (see
/// `KMM_ALLOC_POOL`); the counts sum the lanes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KmmMemoryStats {
    /// Bytes of live buffers, as asked for.
    pub in_use: u64,
    /// The most `in_use` has been since the manager's creation or `kmm_manager_reset_peaks`.
    pub peak_in_use: u64,
    /// Bytes the manager holds from the device (or host, for pinned memory), adopted memory
    /// included (which `KmmConfig.hard_limit` leaves out).
    pub reserved: u64,
    /// The most `reserved` has been since the creation or the last reset of the peaks.
    pub peak_reserved: u64,
    /// Allocations that succeeded.
    pub allocs: u64,
    pub frees: u64,
    /// Allocations that failed (out of memory, or refused).
    pub failed_allocs: u64,
    pub live_buffers: u64,
    /// Allocations served by a free block the pool already held.
    pub pool_hits: u64,
    /// Times the pool found no free block that fits: once for an allocation that then grew the
    /// pool or moved buffers, and once per attempt for one that failed (the out-of-memory ladder
    /// asks each lane and rung again, so one failure counts several).
    pub pool_misses: u64,
    /// Chunks taken from the device (or host).
    pub upstream_allocs: u64,
    /// Chunks given back.
    pub upstream_frees: u64,
    /// The largest free block the pool holds now.
    pub largest_free_block: u64,
    /// Allocations served by moving unmapped buffers instead of growing the pool.
    pub compactions: u64,
    /// Bytes moved to make room, also in attempts that then grew the pool.
    pub relocated_bytes: u64,
    /// Device memory only (0 for pinned): bytes of buffers spilled to host memory now, and
    /// their peak (`in_use` counts the buffers on the device only).
    pub spilled_bytes: u64,
    pub peak_spilled_bytes: u64,
    /// Of `spilled_bytes`, those in pageable host memory.
    pub spilled_pageable_bytes: u64,
    /// Buffers on the host now (counted in `live_buffers` too).
    pub spilled_buffers: u64,
    /// Buffers spilled, and restored.
    pub spills: u64,
    pub restores: u64,
    /// Bytes copied to the host by spills, and back by restores.
    pub spilled_out_bytes: u64,
    pub restored_in_bytes: u64,
    /// Host time spent spilling and restoring, in nanoseconds: choosing buffers, queuing the
    /// copies, and waiting for copies out before their device memory went back.
    pub spill_time_ns: u64,
}

/// What `kmm_buffer_info` reports.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KmmBufferInfo {
    pub bytes: u64,
    /// A `KmmMemoryKind`.
    pub kind: u32,
    /// How many `kmm_buffer_map` calls are not yet matched by `kmm_buffer_unmap`.
    pub pins: u32,
    /// 1 while the buffer is spilled to host memory (see `KmmConfig.spill_limit`), else 0.
    pub spilled: u32,
    /// 1 when the buffer is marked never to spill (`kmm_buffer_never_spill`), else 0.
    pub never_spill: u32,
}

/// What `kmm_manager_info` reports.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KmmManagerInfo {
    /// The backend in use: `KMM_BACKEND_HOST` or `KMM_BACKEND_CUDA` (never AUTO).
    pub backend: u32,
    pub device: i32,
    /// A `KmmAllocMode`.
    pub alloc_mode: u32,
    /// A `KmmSuballocator`.
    pub suballocator: u32,
    /// The manager's stream (`CUstream` on CUDA), for third parties to launch work on.
    pub stream: u64,
}

pub(crate) fn backend_choice(value: u32) -> Result<BackendChoice> {
    match value {
        0 => Ok(BackendChoice::Auto),
        1 => Ok(BackendChoice::Host),
        2 => Ok(BackendChoice::Cuda),
        v => fail!(KMM_ERROR_INVALID_ARGUMENT, "backend = {v} is not a KmmBackend (0 = auto, 1 = host, 2 = cuda)"),
    }
}

pub(crate) fn memory_kind(value: u32, name: &str) -> Result<MemoryKind> {
    match value {
        0 => Ok(MemoryKind::Device),
        1 => Ok(MemoryKind::Pinned),
        _ => fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {value} is not a KmmMemoryKind (0 = device, 1 = pinned)"),
    }
}

impl From<KindStats> for KmmMemoryStats {
    fn from(s: KindStats) -> Self {
        KmmMemoryStats {
            in_use: s.usage.in_use,
            peak_in_use: s.usage.peak_in_use,
            reserved: s.resource.reserved,
            peak_reserved: s.resource.peak_reserved,
            allocs: s.usage.allocs,
            frees: s.usage.frees,
            failed_allocs: s.usage.failed_allocs,
            live_buffers: s.usage.live_buffers,
            pool_hits: s.resource.pool_hits,
            pool_misses: s.resource.pool_misses,
            upstream_allocs: s.resource.upstream_allocs,
            upstream_frees: s.resource.upstream_frees,
            largest_free_block: s.resource.largest_free,
            compactions: s.resource.compactions,
            relocated_bytes: s.resource.relocated_bytes,
            spilled_bytes: s.spill.spilled_bytes,
            peak_spilled_bytes: s.spill.peak_spilled_bytes,
            spilled_pageable_bytes: s.spill.pageable_bytes,
            spilled_buffers: s.spill.buffers,
            spills: s.spill.spills,
            restores: s.spill.restores,
            spilled_out_bytes: s.spill.bytes_out,
            restored_in_bytes: s.spill.bytes_in,
            spill_time_ns: s.spill.time_ns,
        }
    }
}

impl From<&Config> for KmmConfig {
    fn from(c: &Config) -> Self {
        KmmConfig {
            backend: match c.backend {
                BackendChoice::Auto => KmmBackend::KMM_BACKEND_AUTO,
                BackendChoice::Host => KmmBackend::KMM_BACKEND_HOST,
                BackendChoice::Cuda => KmmBackend::KMM_BACKEND_CUDA,
            } as u32,
            device: c.device,
            alloc_mode: match c.alloc_mode {
                AllocMode::Pool => KmmAllocMode::KMM_ALLOC_POOL,
                AllocMode::CudaAsync => KmmAllocMode::KMM_ALLOC_CUDA_ASYNC,
                AllocMode::Direct => KmmAllocMode::KMM_ALLOC_DIRECT,
            } as u32,
            suballocator: suballocator_code(c.suballocator),
            alignment: c.alignment,
            chunk_size: c.chunk_size,
            initial_pool_size: c.initial_pool_size,
            fixed_block_size: c.fixed_block_size,
            hard_limit: c.hard_limit,
            release_threshold: c.release_threshold,
            pinned_chunk_size: c.pinned_chunk_size,
            pinned_limit: c.pinned_limit,
            staging_chunk_size: c.staging_chunk_size,
            staging_chunks: c.staging_chunks,
            compaction_ratio_pct: c.compaction_ratio_pct,
            spill_limit: c.spill_limit,
        }
    }
}

pub(crate) fn suballocator_code(kind: SuballocatorKind) -> u32 {
    (match kind {
        SuballocatorKind::Binned => KmmSuballocator::KMM_SUBALLOC_BINNED,
        SuballocatorKind::Heap => KmmSuballocator::KMM_SUBALLOC_HEAP,
        SuballocatorKind::Fixed => KmmSuballocator::KMM_SUBALLOC_FIXED,
        SuballocatorKind::Ring => KmmSuballocator::KMM_SUBALLOC_RING,
    }) as u32
}

impl TryFrom<&KmmConfig> for Config {
    type Error = crate::error::Error;
    fn try_from(c: &KmmConfig) -> Result<Config> {
        let backend = backend_choice(c.backend).map_err(|e| crate::err!(KMM_ERROR_INVALID_ARGUMENT, "config.{}", e.message))?;
        let alloc_mode = match c.alloc_mode {
            0 => AllocMode::Pool,
            1 => AllocMode::CudaAsync,
            2 => AllocMode::Direct,
            v => fail!(KMM_ERROR_INVALID_ARGUMENT, "config.alloc_mode = {v} is not a KmmAllocMode (0 = pool, 1 = cuda_async, 2 = direct)"),
        };
        let suballocator = match c.suballocator {
            0 => SuballocatorKind::Binned,
            1 => SuballocatorKind::Heap,
            2 => SuballocatorKind::Fixed,
            3 => SuballocatorKind::Ring,
            v => fail!(KMM_ERROR_INVALID_ARGUMENT, "config.suballocator = {v} is not a KmmSuballocator (0 = binned, 1 = heap, 2 = fixed, 3 = ring)"),
        };
        let config = Config {
            backend,
            device: c.device,
            alloc_mode,
            suballocator,
            alignment: c.alignment,
            chunk_size: c.chunk_size,
            initial_pool_size: c.initial_pool_size,
            fixed_block_size: c.fixed_block_size,
            hard_limit: c.hard_limit,
            release_threshold: c.release_threshold,
            pinned_chunk_size: c.pinned_chunk_size,
            pinned_limit: c.pinned_limit,
            staging_chunk_size: c.staging_chunk_size,
            staging_chunks: c.staging_chunks,
            compaction_ratio_pct: c.compaction_ratio_pct,
            spill_limit: c.spill_limit,
        };
        config.validate()?;
        Ok(config)
    }
}
