# generated from gen/kmm.h by gen/generator.jl; do not edit
# Regenerate: julia gen/generator.jl   (CI: julia gen/generator.jl --check)

module LibKmm

using Libdl
import ..check_status, ..throw_kmm_error

# constants
"""
Size of the handle `kmm_buffer_ipc_handle` writes (a `CUipcMemHandle`).
"""
const KMM_IPC_HANDLE_BYTES = 64
"""
Most kernel arguments of one launch.
"""
const KMM_MAX_KERNEL_ARGS = 256
"""
`KmmMrstatModel::trajectory`: readouts along straight lines, `kspace` holding per readout
its start k0 and step dk, (kx, ky) each: `k0[0], dk[0], k0[1], dk[1], ...`.
"""
const KMM_TRAJECTORY_CARTESIAN = 0
"""
`KmmMrstatModel::trajectory`: every sample's (kx, ky) given, `nsamples x nreadouts`,
sample fastest (spiral, radial, ...).
"""
const KMM_TRAJECTORY_SPIRAL = 1
"""
`flags` bit of the simulation calls: skip the check of the atom parameters (T1, T2 > 0, B1
and B0 finite). The check copies the parameters to the host and waits for the stream; skip
it in tight loops over parameters already checked. Bad atoms then give NaN signals.
"""
const KMM_QMRI_SKIP_CHECKS = 1
"""
`flags` bit of `kmm_qmri_match`: the outputs already hold the results of earlier dictionary
batches; a voxel's results are replaced only where this batch scores strictly higher, and a
voxel this batch matches nothing in keeps them (one whose score is still negative gets the
no-match record: index -1, score 0). Needs `outputs->score`. Start with `score` filled with
-1 (or run the first batch without it).
"""
const KMM_MATCH_ACCUMULATE = 1
"""
`flags` bit of `kmm_qmri_match_in_basis`: skip the check that the basis' columns are
orthonormal (it copies the basis to the host and waits for the stream).
"""
const KMM_MATCH_SKIP_CHECKS = 2
"""
`kmm_torch_set_oom_policy` value: on out-of-memory, print the error and abort the process
(the default: PyTorch does not check for NULL and would use address 0).
"""
const KMM_TORCH_OOM_ABORT = 0
"""
`kmm_torch_set_oom_policy` value: on out-of-memory, return NULL (the error stays readable
with `kmm_last_error` on the allocating thread).
"""
const KMM_TORCH_OOM_NULL = 1
"""
`kmm_manager_trace_start` and `kmm_manager_trace_save` flag: write only what RMM's replay
benchmark accepts (allocate, free and allocate failure rows, streams as 0, a move as a free
and an allocation; see docs/observability.md).
"""
const KMM_TRACE_RMM_ONLY = 1
"""
The ring's size when `kmm_manager_trace_start` is given a capacity of 0.
"""
const KMM_TRACE_DEFAULT_RECORDS = 65536
"""
The largest ring `kmm_manager_trace_start` makes (records of 64 bytes: 1 GiB a ring).
"""
const KMM_TRACE_MAX_RECORDS = 16777216
"""
Bumped whenever a signature, a struct layout or a constant's meaning changes.
"""
const KMM_ABI_VERSION = 3
"""
The largest buffer one allocation may ask for: 2^48 bytes. Larger is `KMM_ERROR_SIZE_OVERFLOW`.
"""
const KMM_MAX_BUFFER_BYTES = 281474976710656
"""
`kmm_buffer_free` flag: free even if the buffer is mapped (its mappings become dangling).
"""
const KMM_FREE_FORCE = 1
"""
`kmm_manager_destroy` flag: invalidate the handle now and tear down on a background thread,
so the call never waits for the device (for finalizers).
"""
const KMM_DESTROY_DEFERRED = 1

# enums (values are plain UInt32 constants, as in the C ABI)
"""
Result of every exported function. `KMM_OK` is zero; errors are grouped in bands by category
(1xxx: the caller's arguments, 2xxx: handles and buffer state, 3xxx: resources, 4xxx: the
backend, 9xxx: bugs in Kmm). Codes are never renumbered; retired codes stay reserved.
"""
const KmmStatus = UInt32
const KMM_OK = UInt32(0)
const KMM_ERROR_NULL_POINTER = UInt32(1001)
const KMM_ERROR_INVALID_ARGUMENT = UInt32(1002)
const KMM_ERROR_OUT_OF_RANGE = UInt32(1003)
const KMM_ERROR_SIZE_OVERFLOW = UInt32(1004)
const KMM_ERROR_INVALID_HANDLE = UInt32(2001)
const KMM_ERROR_BUFFER_MAPPED = UInt32(2002)
const KMM_ERROR_WRONG_KIND = UInt32(2003)
const KMM_ERROR_OUT_OF_MEMORY = UInt32(3001)
const KMM_ERROR_BACKEND_UNAVAILABLE = UInt32(4001)
const KMM_ERROR_BACKEND = UInt32(4002)
const KMM_ERROR_NOT_SUPPORTED = UInt32(4003)
const KMM_ERROR_COMPILE = UInt32(4004)
const KMM_ERROR_INTERNAL = UInt32(9001)

"""
Which backend a manager runs on (`KmmConfig.backend`).
"""
const KmmBackend = UInt32
const KMM_BACKEND_AUTO = UInt32(0)
const KMM_BACKEND_HOST = UInt32(1)
const KMM_BACKEND_CUDA = UInt32(2)

"""
How a manager obtains device memory (`KmmConfig.alloc_mode`).
"""
const KmmAllocMode = UInt32
const KMM_ALLOC_POOL = UInt32(0)
const KMM_ALLOC_CUDA_ASYNC = UInt32(1)
const KMM_ALLOC_DIRECT = UInt32(2)

"""
The suballocator of pool mode (`KmmConfig.suballocator`).
"""
const KmmSuballocator = UInt32
const KMM_SUBALLOC_BINNED = UInt32(0)
const KMM_SUBALLOC_HEAP = UInt32(1)
const KMM_SUBALLOC_FIXED = UInt32(2)
const KMM_SUBALLOC_RING = UInt32(3)

"""
Where a buffer's memory lives.
"""
const KmmMemoryKind = UInt32
const KMM_MEMORY_DEVICE = UInt32(0)
const KMM_MEMORY_PINNED = UInt32(1)

"""
Who frees memory passed to `kmm_buffer_wrap`.
"""
const KmmOwnership = UInt32
const KMM_BORROW = UInt32(0)
const KMM_ADOPT = UInt32(1)

"""
What a `KmmKernelArg` carries.
"""
const KmmArgKind = UInt32
const KMM_ARG_BUFFER = UInt32(0)
const KMM_ARG_I32 = UInt32(1)
const KMM_ARG_I64 = UInt32(2)
const KMM_ARG_F32 = UInt32(3)
const KMM_ARG_F64 = UInt32(4)
const KMM_ARG_U64 = UInt32(5)
const KMM_ARG_U32 = UInt32(6)

"""
What a trace record says happened (`KmmTraceRecord.action`).
"""
const KmmTraceAction = UInt32
const KMM_TRACE_ALLOCATE = UInt32(0)
const KMM_TRACE_FREE = UInt32(1)
const KMM_TRACE_ALLOCATE_FAILURE = UInt32(2)
const KMM_TRACE_MAP = UInt32(3)
const KMM_TRACE_UNMAP = UInt32(4)
const KMM_TRACE_MOVE = UInt32(5)
const KMM_TRACE_TRIM = UInt32(6)
const KMM_TRACE_WRAP = UInt32(7)
const KMM_TRACE_SPILL = UInt32(8)
const KMM_TRACE_RESTORE = UInt32(9)

"""
What a stretch of a chunk holds (`KmmMapSegment.state`).
"""
const KmmSegmentState = UInt32
const KMM_SEGMENT_FREE = UInt32(0)
const KMM_SEGMENT_IN_USE = UInt32(1)
const KMM_SEGMENT_MAPPED = UInt32(2)

"""
Which figure `kmm_manager_figure_svg` draws.
"""
const KmmFigure = UInt32
const KMM_FIGURE_DEVICE_MAP = UInt32(0)
const KMM_FIGURE_PINNED_MAP = UInt32(1)
const KMM_FIGURE_TIMELINE = UInt32(2)
const KMM_FIGURE_OVERVIEW = UInt32(3)

# handle types
"""
A manager: owns a stream, memory pools, buffers and events. 0 is never a valid handle.
"""
const KmmManager = UInt64
"""
A buffer of device or pinned host memory, owned by one manager. 0 is never valid.
"""
const KmmBuffer = UInt64
"""
An event recorded on a manager's stream. 0 is never valid.
"""
const KmmEvent = UInt64
"""
Reads CuPy's current stream (CuPy's `get_current_stream_ptr`); -1 on error.
"""
const KmmStreamSource = Ptr{Cvoid}
"""
Called after a `KmmStreamSource` failed, to clear the error it left (Python's `PyErr_Clear`).
"""
const KmmErrorHook = Ptr{Cvoid}
"""
A compiled, loaded CUDA module. Process-wide: usable with any manager on the device it was
compiled for. 0 is never valid.
"""
const KmmModule = UInt64

# structs (field order and types as in C; layout checked by test/bindings.jl)
"""
What `kmm_buffer_info` reports.
"""
struct KmmBufferInfo
    bytes::UInt64
    kind::UInt32
    pins::UInt32
    spilled::UInt32
    never_spill::UInt32
end

"""
Manager configuration. Fill it with `kmm_config_default`, then change fields.
"""
struct KmmConfig
    backend::UInt32
    device::Int32
    alloc_mode::UInt32
    suballocator::UInt32
    alignment::UInt64
    chunk_size::UInt64
    initial_pool_size::UInt64
    fixed_block_size::UInt64
    hard_limit::UInt64
    release_threshold::UInt64
    pinned_chunk_size::UInt64
    pinned_limit::UInt64
    staging_chunk_size::UInt64
    staging_chunks::UInt32
    compaction_ratio_pct::UInt32
    spill_limit::UInt64
end

"""
What `kmm_manager_info` reports.
"""
struct KmmManagerInfo
    backend::UInt32
    device::Int32
    alloc_mode::UInt32
    suballocator::UInt32
    stream::UInt64
end

"""
Figures for one memory kind of one manager (`kmm_manager_stats`). Byte counts of "in use"
are what callers asked for; "reserved" is what the manager holds from the device. Bytes in use
and reserved, and their peaks, are the manager's own across all its lanes (see
`KMM_ALLOC_POOL`); the counts sum the lanes.
"""
struct KmmMemoryStats
    in_use::UInt64
    peak_in_use::UInt64
    reserved::UInt64
    peak_reserved::UInt64
    allocs::UInt64
    frees::UInt64
    failed_allocs::UInt64
    live_buffers::UInt64
    pool_hits::UInt64
    pool_misses::UInt64
    upstream_allocs::UInt64
    upstream_frees::UInt64
    largest_free_block::UInt64
    compactions::UInt64
    relocated_bytes::UInt64
    spilled_bytes::UInt64
    peak_spilled_bytes::UInt64
    spilled_pageable_bytes::UInt64
    spilled_buffers::UInt64
    spills::UInt64
    restores::UInt64
    spilled_out_bytes::UInt64
    restored_in_bytes::UInt64
    spill_time_ns::UInt64
end

"""
One kernel argument of `kmm_module_launch`: a tagged value.
"""
struct KmmKernelArg
    kind::UInt32
    reserved::UInt32
    value::UInt64
    offset::UInt64
end

"""
A gradient-spoiled FISP sequence with adiabatic inversion (BlochSimulators' FISP2D),
simulated with the extended phase graph. Times in seconds, angles in radians. The arrays are
host memory, read during the call only.
"""
struct KmmFispSequence
    flip_angle::Ptr{Cfloat}
    phase::Ptr{Cfloat}
    profile::Ptr{Cfloat}
    ntr::UInt32
    max_state::UInt32
    nprofile::UInt32
    tr::Cfloat
    te::Cfloat
    ti::Cfloat
end

"""
An MR-STAT acquisition on a manager's buffers. The signal of voxel v in coil c at sample s
of readout r is C[c,v] ρ_v m_v(r) exp(-t_s/T2_v) exp(i 2π B0_v t_s) exp(-i (kx x_v + ky y_v)),
with t_s = (s - nsamples/2) dt the time from the echo. Units: m, s, Hz, rad/m.
"""
struct KmmMrstatModel
    nvoxels::UInt64
    nreadouts::UInt64
    nsamples::UInt64
    ncoils::UInt64
    voxels::KmmBuffer
    coils::KmmBuffer
    trajectory::UInt32
    dt::Cfloat
    kspace::KmmBuffer
end

"""
A balanced pSSFP sequence (BlochSimulators' pSSFP2D) simulated with isochromats: B1-scaled
inversion, an alpha/2 prepulse, then per TR an RF pulse in `nrf` hard-pulse sub-steps with
slice-select gradient, precession to TE, a sample of m_x + i m_y, precession to the next RF.
Signals are summed over the slice positions `z`. Arrays are host memory, read during the call.
"""
struct KmmPssfpSequence
    flip_angle::Ptr{Cfloat}
    phase::Ptr{Cfloat}
    rf_shape::Ptr{Cfloat}
    z::Ptr{Cfloat}
    ntr::UInt32
    nrf::UInt32
    nz::UInt32
    dt_ex::Cfloat
    dt_inv::Cfloat
    dt_pr::Cfloat
    gz_ex::Cfloat
    gz_pr::Cfloat
end

"""
Output buffers of `kmm_qmri_match`, one entry per voxel; 0 leaves an output out. A voxel
that matches no atom (a zero or non-finite signal, or a dictionary of zero or non-finite
atoms) gets index -1, score 0, PD 0 and a record of zeros.
"""
struct KmmMatchOutputs
    index::KmmBuffer
    score::KmmBuffer
    pd::KmmBuffer
    params::KmmBuffer
end

"""
One event of a trace (`kmm_manager_trace_records`).
"""
struct KmmTraceRecord
    time_ns::UInt64
    thread::UInt64
    action::UInt32
    kind::UInt32
    address::UInt64
    bytes::UInt64
    stream::UInt64
    buffer::UInt64
    moved_from::UInt64
    status::UInt32
    _reserved::UInt32
    in_use::UInt64
    reserved::UInt64
end

"""
A stretch of a chunk in a memory map (`kmm_manager_memory_map`).
"""
struct KmmMapSegment
    chunk::UInt64
    address::UInt64
    bytes::UInt64
    state::UInt32
    _reserved::UInt32
    buffer::UInt64
    requested::UInt64
end

"The path of the loaded library (set by `load!`; chosen by `Kmm.find_libkmm`)."
const libkmm = Ref{String}("")

# function pointers, filled by load! (one dlsym per function, once)
const _fp_kmm_version = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_abi_version = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_last_error = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_last_status = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_status_name = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_alloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_wrap = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_record_stream = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_never_spill = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_map = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_unmap = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_host_register = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_host_unregister = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_copy_to_device = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_copy_to_device_async = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_copy_to_host = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_copy_to_host_async = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_copy_buffer = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_fill = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_cupy_set_manager = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_cupy_set_stream_source = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_cupy_malloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_cupy_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_cupy_live_allocations = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_ipc_handle = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_config_default = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_config_check = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_device_count = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_device_can_access_peer = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_live_managers = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_create = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_destroy = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_synchronize = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_stats = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_reset_peaks = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_trim = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_summary = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_memory_info = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_wait_stream = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_signal_stream = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_record_event = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_event_query = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_event_wait = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_event_destroy = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_module_compile = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_module_launch = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_module_destroy = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_fisp_derivatives = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_mrstat_signal = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_jacobian_mul = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_jacobian_adjoint_mul = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_plugin_alloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_plugin_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_plugin_malloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_plugin_free_address = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_simulate_fisp = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_simulate_pssfp = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_match = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_compression_basis = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_qmri_match_in_basis = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_manager = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_set_oom_policy = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_malloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_record_stream = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_live_allocations = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_trace_start = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_trace_stop = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_trace_records = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_trace_save = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_trace_action_name = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_memory_map = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_manager_figure_svg = Ref{Ptr{Cvoid}}(C_NULL)

"The names of every exported function of the header."
const FUNCTIONS = (:kmm_version, :kmm_abi_version, :kmm_last_error, :kmm_last_status, :kmm_status_name, :kmm_buffer_alloc, :kmm_buffer_wrap, :kmm_buffer_free, :kmm_buffer_record_stream, :kmm_buffer_info, :kmm_buffer_never_spill, :kmm_buffer_map, :kmm_buffer_unmap, :kmm_host_register, :kmm_host_unregister, :kmm_copy_to_device, :kmm_copy_to_device_async, :kmm_copy_to_host, :kmm_copy_to_host_async, :kmm_copy_buffer, :kmm_fill, :kmm_cupy_set_manager, :kmm_cupy_set_stream_source, :kmm_cupy_malloc, :kmm_cupy_free, :kmm_cupy_live_allocations, :kmm_buffer_ipc_handle, :kmm_config_default, :kmm_config_check, :kmm_device_count, :kmm_device_can_access_peer, :kmm_live_managers, :kmm_manager_create, :kmm_manager_destroy, :kmm_manager_synchronize, :kmm_manager_info, :kmm_manager_stats, :kmm_manager_reset_peaks, :kmm_manager_trim, :kmm_manager_summary, :kmm_manager_memory_info, :kmm_manager_wait_stream, :kmm_manager_signal_stream, :kmm_manager_record_event, :kmm_event_query, :kmm_event_wait, :kmm_event_destroy, :kmm_module_compile, :kmm_module_launch, :kmm_module_destroy, :kmm_qmri_fisp_derivatives, :kmm_qmri_mrstat_signal, :kmm_qmri_jacobian_mul, :kmm_qmri_jacobian_adjoint_mul, :kmm_plugin_alloc, :kmm_plugin_free, :kmm_plugin_malloc, :kmm_plugin_free_address, :kmm_qmri_simulate_fisp, :kmm_qmri_simulate_pssfp, :kmm_qmri_match, :kmm_qmri_compression_basis, :kmm_qmri_match_in_basis, :kmm_torch_manager, :kmm_torch_set_oom_policy, :kmm_torch_malloc, :kmm_torch_free, :kmm_torch_record_stream, :kmm_torch_live_allocations, :kmm_manager_trace_start, :kmm_manager_trace_stop, :kmm_manager_trace_records, :kmm_manager_trace_save, :kmm_trace_action_name, :kmm_manager_memory_map, :kmm_manager_figure_svg)

"""
    load!(path) -> handle

Opens the library at `path` and resolves every function of the header. A function the
library lacks is left unresolved: calling it throws (see `missing_functions`).
"""
function load!(path::AbstractString)
    lib = Libdl.dlopen(path, Libdl.RTLD_LAZY | Libdl.RTLD_DEEPBIND)
    _fp_kmm_version[] = something(Libdl.dlsym(lib, :kmm_version; throw_error = false), C_NULL)
    _fp_kmm_abi_version[] = something(Libdl.dlsym(lib, :kmm_abi_version; throw_error = false), C_NULL)
    _fp_kmm_last_error[] = something(Libdl.dlsym(lib, :kmm_last_error; throw_error = false), C_NULL)
    _fp_kmm_last_status[] = something(Libdl.dlsym(lib, :kmm_last_status; throw_error = false), C_NULL)
    _fp_kmm_status_name[] = something(Libdl.dlsym(lib, :kmm_status_name; throw_error = false), C_NULL)
    _fp_kmm_buffer_alloc[] = something(Libdl.dlsym(lib, :kmm_buffer_alloc; throw_error = false), C_NULL)
    _fp_kmm_buffer_wrap[] = something(Libdl.dlsym(lib, :kmm_buffer_wrap; throw_error = false), C_NULL)
    _fp_kmm_buffer_free[] = something(Libdl.dlsym(lib, :kmm_buffer_free; throw_error = false), C_NULL)
    _fp_kmm_buffer_record_stream[] = something(Libdl.dlsym(lib, :kmm_buffer_record_stream; throw_error = false), C_NULL)
    _fp_kmm_buffer_info[] = something(Libdl.dlsym(lib, :kmm_buffer_info; throw_error = false), C_NULL)
    _fp_kmm_buffer_never_spill[] = something(Libdl.dlsym(lib, :kmm_buffer_never_spill; throw_error = false), C_NULL)
    _fp_kmm_buffer_map[] = something(Libdl.dlsym(lib, :kmm_buffer_map; throw_error = false), C_NULL)
    _fp_kmm_buffer_unmap[] = something(Libdl.dlsym(lib, :kmm_buffer_unmap; throw_error = false), C_NULL)
    _fp_kmm_host_register[] = something(Libdl.dlsym(lib, :kmm_host_register; throw_error = false), C_NULL)
    _fp_kmm_host_unregister[] = something(Libdl.dlsym(lib, :kmm_host_unregister; throw_error = false), C_NULL)
    _fp_kmm_copy_to_device[] = something(Libdl.dlsym(lib, :kmm_copy_to_device; throw_error = false), C_NULL)
    _fp_kmm_copy_to_device_async[] = something(Libdl.dlsym(lib, :kmm_copy_to_device_async; throw_error = false), C_NULL)
    _fp_kmm_copy_to_host[] = something(Libdl.dlsym(lib, :kmm_copy_to_host; throw_error = false), C_NULL)
    _fp_kmm_copy_to_host_async[] = something(Libdl.dlsym(lib, :kmm_copy_to_host_async; throw_error = false), C_NULL)
    _fp_kmm_copy_buffer[] = something(Libdl.dlsym(lib, :kmm_copy_buffer; throw_error = false), C_NULL)
    _fp_kmm_fill[] = something(Libdl.dlsym(lib, :kmm_fill; throw_error = false), C_NULL)
    _fp_kmm_cupy_set_manager[] = something(Libdl.dlsym(lib, :kmm_cupy_set_manager; throw_error = false), C_NULL)
    _fp_kmm_cupy_set_stream_source[] = something(Libdl.dlsym(lib, :kmm_cupy_set_stream_source; throw_error = false), C_NULL)
    _fp_kmm_cupy_malloc[] = something(Libdl.dlsym(lib, :kmm_cupy_malloc; throw_error = false), C_NULL)
    _fp_kmm_cupy_free[] = something(Libdl.dlsym(lib, :kmm_cupy_free; throw_error = false), C_NULL)
    _fp_kmm_cupy_live_allocations[] = something(Libdl.dlsym(lib, :kmm_cupy_live_allocations; throw_error = false), C_NULL)
    _fp_kmm_buffer_ipc_handle[] = something(Libdl.dlsym(lib, :kmm_buffer_ipc_handle; throw_error = false), C_NULL)
    _fp_kmm_config_default[] = something(Libdl.dlsym(lib, :kmm_config_default; throw_error = false), C_NULL)
    _fp_kmm_config_check[] = something(Libdl.dlsym(lib, :kmm_config_check; throw_error = false), C_NULL)
    _fp_kmm_device_count[] = something(Libdl.dlsym(lib, :kmm_device_count; throw_error = false), C_NULL)
    _fp_kmm_device_can_access_peer[] = something(Libdl.dlsym(lib, :kmm_device_can_access_peer; throw_error = false), C_NULL)
    _fp_kmm_live_managers[] = something(Libdl.dlsym(lib, :kmm_live_managers; throw_error = false), C_NULL)
    _fp_kmm_manager_create[] = something(Libdl.dlsym(lib, :kmm_manager_create; throw_error = false), C_NULL)
    _fp_kmm_manager_destroy[] = something(Libdl.dlsym(lib, :kmm_manager_destroy; throw_error = false), C_NULL)
    _fp_kmm_manager_synchronize[] = something(Libdl.dlsym(lib, :kmm_manager_synchronize; throw_error = false), C_NULL)
    _fp_kmm_manager_info[] = something(Libdl.dlsym(lib, :kmm_manager_info; throw_error = false), C_NULL)
    _fp_kmm_manager_stats[] = something(Libdl.dlsym(lib, :kmm_manager_stats; throw_error = false), C_NULL)
    _fp_kmm_manager_reset_peaks[] = something(Libdl.dlsym(lib, :kmm_manager_reset_peaks; throw_error = false), C_NULL)
    _fp_kmm_manager_trim[] = something(Libdl.dlsym(lib, :kmm_manager_trim; throw_error = false), C_NULL)
    _fp_kmm_manager_summary[] = something(Libdl.dlsym(lib, :kmm_manager_summary; throw_error = false), C_NULL)
    _fp_kmm_manager_memory_info[] = something(Libdl.dlsym(lib, :kmm_manager_memory_info; throw_error = false), C_NULL)
    _fp_kmm_manager_wait_stream[] = something(Libdl.dlsym(lib, :kmm_manager_wait_stream; throw_error = false), C_NULL)
    _fp_kmm_manager_signal_stream[] = something(Libdl.dlsym(lib, :kmm_manager_signal_stream; throw_error = false), C_NULL)
    _fp_kmm_manager_record_event[] = something(Libdl.dlsym(lib, :kmm_manager_record_event; throw_error = false), C_NULL)
    _fp_kmm_event_query[] = something(Libdl.dlsym(lib, :kmm_event_query; throw_error = false), C_NULL)
    _fp_kmm_event_wait[] = something(Libdl.dlsym(lib, :kmm_event_wait; throw_error = false), C_NULL)
    _fp_kmm_event_destroy[] = something(Libdl.dlsym(lib, :kmm_event_destroy; throw_error = false), C_NULL)
    _fp_kmm_module_compile[] = something(Libdl.dlsym(lib, :kmm_module_compile; throw_error = false), C_NULL)
    _fp_kmm_module_launch[] = something(Libdl.dlsym(lib, :kmm_module_launch; throw_error = false), C_NULL)
    _fp_kmm_module_destroy[] = something(Libdl.dlsym(lib, :kmm_module_destroy; throw_error = false), C_NULL)
    _fp_kmm_qmri_fisp_derivatives[] = something(Libdl.dlsym(lib, :kmm_qmri_fisp_derivatives; throw_error = false), C_NULL)
    _fp_kmm_qmri_mrstat_signal[] = something(Libdl.dlsym(lib, :kmm_qmri_mrstat_signal; throw_error = false), C_NULL)
    _fp_kmm_qmri_jacobian_mul[] = something(Libdl.dlsym(lib, :kmm_qmri_jacobian_mul; throw_error = false), C_NULL)
    _fp_kmm_qmri_jacobian_adjoint_mul[] = something(Libdl.dlsym(lib, :kmm_qmri_jacobian_adjoint_mul; throw_error = false), C_NULL)
    _fp_kmm_plugin_alloc[] = something(Libdl.dlsym(lib, :kmm_plugin_alloc; throw_error = false), C_NULL)
    _fp_kmm_plugin_free[] = something(Libdl.dlsym(lib, :kmm_plugin_free; throw_error = false), C_NULL)
    _fp_kmm_plugin_malloc[] = something(Libdl.dlsym(lib, :kmm_plugin_malloc; throw_error = false), C_NULL)
    _fp_kmm_plugin_free_address[] = something(Libdl.dlsym(lib, :kmm_plugin_free_address; throw_error = false), C_NULL)
    _fp_kmm_qmri_simulate_fisp[] = something(Libdl.dlsym(lib, :kmm_qmri_simulate_fisp; throw_error = false), C_NULL)
    _fp_kmm_qmri_simulate_pssfp[] = something(Libdl.dlsym(lib, :kmm_qmri_simulate_pssfp; throw_error = false), C_NULL)
    _fp_kmm_qmri_match[] = something(Libdl.dlsym(lib, :kmm_qmri_match; throw_error = false), C_NULL)
    _fp_kmm_qmri_compression_basis[] = something(Libdl.dlsym(lib, :kmm_qmri_compression_basis; throw_error = false), C_NULL)
    _fp_kmm_qmri_match_in_basis[] = something(Libdl.dlsym(lib, :kmm_qmri_match_in_basis; throw_error = false), C_NULL)
    _fp_kmm_torch_manager[] = something(Libdl.dlsym(lib, :kmm_torch_manager; throw_error = false), C_NULL)
    _fp_kmm_torch_set_oom_policy[] = something(Libdl.dlsym(lib, :kmm_torch_set_oom_policy; throw_error = false), C_NULL)
    _fp_kmm_torch_malloc[] = something(Libdl.dlsym(lib, :kmm_torch_malloc; throw_error = false), C_NULL)
    _fp_kmm_torch_free[] = something(Libdl.dlsym(lib, :kmm_torch_free; throw_error = false), C_NULL)
    _fp_kmm_torch_record_stream[] = something(Libdl.dlsym(lib, :kmm_torch_record_stream; throw_error = false), C_NULL)
    _fp_kmm_torch_live_allocations[] = something(Libdl.dlsym(lib, :kmm_torch_live_allocations; throw_error = false), C_NULL)
    _fp_kmm_manager_trace_start[] = something(Libdl.dlsym(lib, :kmm_manager_trace_start; throw_error = false), C_NULL)
    _fp_kmm_manager_trace_stop[] = something(Libdl.dlsym(lib, :kmm_manager_trace_stop; throw_error = false), C_NULL)
    _fp_kmm_manager_trace_records[] = something(Libdl.dlsym(lib, :kmm_manager_trace_records; throw_error = false), C_NULL)
    _fp_kmm_manager_trace_save[] = something(Libdl.dlsym(lib, :kmm_manager_trace_save; throw_error = false), C_NULL)
    _fp_kmm_trace_action_name[] = something(Libdl.dlsym(lib, :kmm_trace_action_name; throw_error = false), C_NULL)
    _fp_kmm_manager_memory_map[] = something(Libdl.dlsym(lib, :kmm_manager_memory_map; throw_error = false), C_NULL)
    _fp_kmm_manager_figure_svg[] = something(Libdl.dlsym(lib, :kmm_manager_figure_svg; throw_error = false), C_NULL)
    libkmm[] = path
    return lib
end

"""
    missing_functions() -> Vector{Symbol}

Functions of the header that the loaded library does not export (an older build); calling
one throws a `KmmError` with `KMM_ERROR_NOT_SUPPORTED`.
"""
missing_functions() = [f for f in FUNCTIONS if getfield(LibKmm, Symbol("_fp_", f))[] == C_NULL]

@noinline throw_missing(name) = throw_kmm_error(KMM_ERROR_NOT_SUPPORTED,
    "the loaded libkmm does not export $name (it is older than gen/kmm.h): rebuild it")

# functions
"""
Kmm's version, "major.minor.patch". Static string; never NULL; do not free.
"""
@inline function kmm_version()
    fp = _fp_kmm_version[]
    fp == C_NULL && throw_missing(:kmm_version)
    ccall(fp, Ptr{Cchar}, ())
end

"""
The ABI version of this library (`KMM_ABI_VERSION` of the header it was built with).
Bindings compare it with the header they were generated from.
"""
@inline function kmm_abi_version()
    fp = _fp_kmm_abi_version[]
    fp == C_NULL && throw_missing(:kmm_abi_version)
    ccall(fp, UInt32, ())
end

"""
The message of the last failed call on this thread, naming the argument and the bound.
Never NULL ("" before any failure). Valid until the next failing Kmm call on this thread;
do not free. Successful calls leave it unchanged.
"""
@inline function kmm_last_error()
    fp = _fp_kmm_last_error[]
    fp == C_NULL && throw_missing(:kmm_last_error)
    ccall(fp, Ptr{Cchar}, ())
end

"""
The status of the last failed call on this thread (`KMM_OK` before any failure), for the
functions that return an address instead of a status (`kmm_plugin_malloc`). Successful calls
leave it unchanged.

Returns the status; `kmm_last_status` is the checked form.
"""
@inline function unchecked_kmm_last_status()
    fp = _fp_kmm_last_status[]
    fp == C_NULL && throw_missing(:kmm_last_status)
    ccall(fp, KmmStatus, ())
end
"""
The status of the last failed call on this thread (`KMM_OK` before any failure), for the
functions that return an address instead of a status (`kmm_plugin_malloc`). Successful calls
leave it unchanged.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_last_status()
    check_status(unchecked_kmm_last_status())
end

"""
The name of a status code ("KMM_ERROR_OUT_OF_MEMORY"), or "KMM_UNKNOWN_STATUS".
Static string; never NULL; do not free.
"""
@inline function kmm_status_name(status)
    fp = _fp_kmm_status_name[]
    fp == C_NULL && throw_missing(:kmm_status_name)
    ccall(fp, Ptr{Cchar}, (UInt32,), status)
end

"""
Allocates `bytes` of memory of `kind` (a `KmmMemoryKind`) and writes the buffer's handle to
`*out`. Zero bytes is valid (a buffer with no memory). On `KMM_ERROR_OUT_OF_MEMORY` the
manager has already given its cached memory back once, waiting for the frees still queued on
its streams where that released more (and compacted and spilled where they are on). That is
not a synchronize: work queued before the failed call may still be running
(`kmm_manager_synchronize` waits for it). Thread-safe.

Returns the status; `kmm_buffer_alloc` is the checked form.
"""
@inline function unchecked_kmm_buffer_alloc(manager, bytes, kind, out)
    fp = _fp_kmm_buffer_alloc[]
    fp == C_NULL && throw_missing(:kmm_buffer_alloc)
    ccall(fp, KmmStatus, (KmmManager, UInt64, UInt32, Ptr{KmmBuffer}), manager, bytes, kind, out)
end
"""
Allocates `bytes` of memory of `kind` (a `KmmMemoryKind`) and writes the buffer's handle to
`*out`. Zero bytes is valid (a buffer with no memory). On `KMM_ERROR_OUT_OF_MEMORY` the
manager has already given its cached memory back once, waiting for the frees still queued on
its streams where that released more (and compacted and spilled where they are on). That is
not a synchronize: work queued before the failed call may still be running
(`kmm_manager_synchronize` waits for it). Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_alloc(manager, bytes, kind, out)
    check_status(unchecked_kmm_buffer_alloc(manager, bytes, kind, out))
end

"""
Makes a buffer of memory allocated elsewhere (`ptr`, `bytes` of `kind`). With `KMM_ADOPT`
Kmm frees the memory (`cuMemFree`/`cuMemFreeHost`) once the work queued before the buffer's
free has run: at the manager's next allocation, adoption, synchronize or trim, never inside
the free itself; with `KMM_BORROW` the caller keeps it and
must keep it valid until the buffer is freed and the manager synchronized. Adopted memory
counts in `KmmMemoryStats.reserved` but not against `KmmConfig.hard_limit` (the caller
allocated it); wrapped memory is never pooled, moved or spilled.

Returns the status; `kmm_buffer_wrap` is the checked form.
"""
@inline function unchecked_kmm_buffer_wrap(manager, ptr, bytes, kind, ownership, out)
    fp = _fp_kmm_buffer_wrap[]
    fp == C_NULL && throw_missing(:kmm_buffer_wrap)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cvoid}, UInt64, UInt32, UInt32, Ptr{KmmBuffer}), manager, ptr, bytes, kind, ownership, out)
end
"""
Makes a buffer of memory allocated elsewhere (`ptr`, `bytes` of `kind`). With `KMM_ADOPT`
Kmm frees the memory (`cuMemFree`/`cuMemFreeHost`) once the work queued before the buffer's
free has run: at the manager's next allocation, adoption, synchronize or trim, never inside
the free itself; with `KMM_BORROW` the caller keeps it and
must keep it valid until the buffer is freed and the manager synchronized. Adopted memory
counts in `KmmMemoryStats.reserved` but not against `KmmConfig.hard_limit` (the caller
allocated it); wrapped memory is never pooled, moved or spilled.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_wrap(manager, ptr, bytes, kind, ownership, out)
    check_status(unchecked_kmm_buffer_wrap(manager, ptr, bytes, kind, ownership, out))
end

"""
Frees a buffer. Stream-ordered and non-blocking: work already queued on the manager's stream,
and on every stream recorded with `kmm_buffer_record_stream`, still sees the memory; the
memory is reused only after that work. Callable from any thread and from finalizers. A mapped
buffer is `KMM_ERROR_BUFFER_MAPPED` unless `flags` has `KMM_FREE_FORCE`. A second free of the
same handle is `KMM_ERROR_INVALID_HANDLE`. A free while another thread's copy, fill or kernel
launch is still queuing work on the buffer ends the handle at once and releases the memory
once that call has queued its work (ordered after it). If a recorded stream cannot be waited
for, the buffer stays allocated and the status says why.

Returns the status; `kmm_buffer_free` is the checked form.
"""
@inline function unchecked_kmm_buffer_free(manager, buffer, flags)
    fp = _fp_kmm_buffer_free[]
    fp == C_NULL && throw_missing(:kmm_buffer_free)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt32), manager, buffer, flags)
end
"""
Frees a buffer. Stream-ordered and non-blocking: work already queued on the manager's stream,
and on every stream recorded with `kmm_buffer_record_stream`, still sees the memory; the
memory is reused only after that work. Callable from any thread and from finalizers. A mapped
buffer is `KMM_ERROR_BUFFER_MAPPED` unless `flags` has `KMM_FREE_FORCE`. A second free of the
same handle is `KMM_ERROR_INVALID_HANDLE`. A free while another thread's copy, fill or kernel
launch is still queuing work on the buffer ends the handle at once and releases the memory
once that call has queued its work (ordered after it). If a recorded stream cannot be waited
for, the buffer stays allocated and the status says why.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_free(manager, buffer, flags)
    check_status(unchecked_kmm_buffer_free(manager, buffer, flags))
end

"""
Records that work on `stream` (a `CUstream` of the manager's device, 0 the legacy default
stream; on the host backend another manager's stream, 0 the manager's own) may use the
buffer's memory, as PyTorch's `record_stream`: the buffer's free, a compaction move of it, a
trim and the reuse of its memory all wait for the work queued on `stream` up to the free
(stream-ordered: nothing blocks). Record each stream that uses a mapped address; the
manager's own stream needs no record. The stream must stay alive until the buffer is freed.

Returns the status; `kmm_buffer_record_stream` is the checked form.
"""
@inline function unchecked_kmm_buffer_record_stream(manager, buffer, stream)
    fp = _fp_kmm_buffer_record_stream[]
    fp == C_NULL && throw_missing(:kmm_buffer_record_stream)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64), manager, buffer, stream)
end
"""
Records that work on `stream` (a `CUstream` of the manager's device, 0 the legacy default
stream; on the host backend another manager's stream, 0 the manager's own) may use the
buffer's memory, as PyTorch's `record_stream`: the buffer's free, a compaction move of it, a
trim and the reuse of its memory all wait for the work queued on `stream` up to the free
(stream-ordered: nothing blocks). Record each stream that uses a mapped address; the
manager's own stream needs no record. The stream must stay alive until the buffer is freed.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_record_stream(manager, buffer, stream)
    check_status(unchecked_kmm_buffer_record_stream(manager, buffer, stream))
end

"""
Writes the buffer's size, kind and pin count to `*out`.

Returns the status; `kmm_buffer_info` is the checked form.
"""
@inline function unchecked_kmm_buffer_info(manager, buffer, out)
    fp = _fp_kmm_buffer_info[]
    fp == C_NULL && throw_missing(:kmm_buffer_info)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, Ptr{KmmBufferInfo}), manager, buffer, out)
end
"""
Writes the buffer's size, kind and pin count to `*out`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_info(manager, buffer, out)
    check_status(unchecked_kmm_buffer_info(manager, buffer, out))
end

"""
Marks the buffer never to spill to host memory (`never` true), or lets it spill again
(false; the default). A spilled buffer marked never to spill comes back to the device before
this returns (out of memory if it cannot). Mapped buffers never spill either way.

Returns the status; `kmm_buffer_never_spill` is the checked form.
"""
@inline function unchecked_kmm_buffer_never_spill(manager, buffer, never)
    fp = _fp_kmm_buffer_never_spill[]
    fp == C_NULL && throw_missing(:kmm_buffer_never_spill)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, Bool), manager, buffer, never)
end
"""
Marks the buffer never to spill to host memory (`never` true), or lets it spill again
(false; the default). A spilled buffer marked never to spill comes back to the device before
this returns (out of memory if it cannot). Mapped buffers never spill either way.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_never_spill(manager, buffer, never)
    check_status(unchecked_kmm_buffer_never_spill(manager, buffer, never))
end

"""
Pins the buffer and writes its address to `*ptr`: a device pointer (`CUdeviceptr`) for
device memory, a host pointer for pinned memory, 0 for an empty buffer. The address stays
valid until the matching `kmm_buffer_unmap`; an unmapped buffer may be moved (compaction, see
`KmmConfig.compaction_ratio_pct`, or spill to host, see `KmmConfig.spill_limit`), so map it
again for each use. A spilled buffer comes back to the device first. Work on other streams that
uses the address must be ordered with the manager's stream (`kmm_manager_signal_stream`
before, `kmm_manager_wait_stream` after, before the unmap). A new buffer's memory, like any
stream-ordered allocation's, is free of the work of the buffer that had it before only for
work ordered after the manager's stream: `map` does not wait for that work (on the host
backend, where device memory is host memory, synchronize before the CPU writes it).

Returns the status; `kmm_buffer_map` is the checked form.
"""
@inline function unchecked_kmm_buffer_map(manager, buffer, ptr)
    fp = _fp_kmm_buffer_map[]
    fp == C_NULL && throw_missing(:kmm_buffer_map)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, Ptr{UInt64}), manager, buffer, ptr)
end
"""
Pins the buffer and writes its address to `*ptr`: a device pointer (`CUdeviceptr`) for
device memory, a host pointer for pinned memory, 0 for an empty buffer. The address stays
valid until the matching `kmm_buffer_unmap`; an unmapped buffer may be moved (compaction, see
`KmmConfig.compaction_ratio_pct`, or spill to host, see `KmmConfig.spill_limit`), so map it
again for each use. A spilled buffer comes back to the device first. Work on other streams that
uses the address must be ordered with the manager's stream (`kmm_manager_signal_stream`
before, `kmm_manager_wait_stream` after, before the unmap). A new buffer's memory, like any
stream-ordered allocation's, is free of the work of the buffer that had it before only for
work ordered after the manager's stream: `map` does not wait for that work (on the host
backend, where device memory is host memory, synchronize before the CPU writes it).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_map(manager, buffer, ptr)
    check_status(unchecked_kmm_buffer_map(manager, buffer, ptr))
end

"""
Drops one pin taken by `kmm_buffer_map`. Unmapping an unmapped buffer is
`KMM_ERROR_INVALID_ARGUMENT`. Once its last pin is gone a device buffer may be moved by work
queued on the manager's stream (compaction), so work on other streams that used the address
must be ordered before that stream first (`kmm_manager_wait_stream`).

Returns the status; `kmm_buffer_unmap` is the checked form.
"""
@inline function unchecked_kmm_buffer_unmap(manager, buffer)
    fp = _fp_kmm_buffer_unmap[]
    fp == C_NULL && throw_missing(:kmm_buffer_unmap)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer), manager, buffer)
end
"""
Drops one pin taken by `kmm_buffer_map`. Unmapping an unmapped buffer is
`KMM_ERROR_INVALID_ARGUMENT`. Once its last pin is gone a device buffer may be moved by work
queued on the manager's stream (compaction), so work on other streams that used the address
must be ordered before that stream first (`kmm_manager_wait_stream`).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_unmap(manager, buffer)
    check_status(unchecked_kmm_buffer_unmap(manager, buffer))
end

"""
Page-locks `bytes` of caller memory at `ptr` so copies from and to it go direct. The memory
must stay valid until `kmm_host_unregister`.

Returns the status; `kmm_host_register` is the checked form.
"""
@inline function unchecked_kmm_host_register(manager, ptr, bytes)
    fp = _fp_kmm_host_register[]
    fp == C_NULL && throw_missing(:kmm_host_register)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cvoid}, UInt64), manager, ptr, bytes)
end
"""
Page-locks `bytes` of caller memory at `ptr` so copies from and to it go direct. The memory
must stay valid until `kmm_host_unregister`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_host_register(manager, ptr, bytes)
    check_status(unchecked_kmm_host_register(manager, ptr, bytes))
end

"""
Undoes `kmm_host_register`. No queued copy may still use the memory.

Returns the status; `kmm_host_unregister` is the checked form.
"""
@inline function unchecked_kmm_host_unregister(manager, ptr)
    fp = _fp_kmm_host_unregister[]
    fp == C_NULL && throw_missing(:kmm_host_unregister)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cvoid}), manager, ptr)
end
"""
Undoes `kmm_host_register`. No queued copy may still use the memory.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_host_unregister(manager, ptr)
    check_status(unchecked_kmm_host_unregister(manager, ptr))
end

"""
Copies `bytes` from host memory `src` into `dst` at `dst_offset` and returns once done.
Pageable memory is staged through pinned memory in chunks; pinned memory (Kmm's or
registered) goes direct. `src` is not kept.

Returns the status; `kmm_copy_to_device` is the checked form.
"""
@inline function unchecked_kmm_copy_to_device(manager, dst, dst_offset, src, bytes)
    fp = _fp_kmm_copy_to_device[]
    fp == C_NULL && throw_missing(:kmm_copy_to_device)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, Ptr{Cvoid}, UInt64), manager, dst, dst_offset, src, bytes)
end
"""
Copies `bytes` from host memory `src` into `dst` at `dst_offset` and returns once done.
Pageable memory is staged through pinned memory in chunks; pinned memory (Kmm's or
registered) goes direct. `src` is not kept.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_copy_to_device(manager, dst, dst_offset, src, bytes)
    check_status(unchecked_kmm_copy_to_device(manager, dst, dst_offset, src, bytes))
end

"""
As `kmm_copy_to_device` but returns once the copy is queued. When `event` is not NULL, writes
an event that completes when the copy has run (destroy it with `kmm_event_destroy`). The
memory at `src` must stay valid and unchanged until then.

Returns the status; `kmm_copy_to_device_async` is the checked form.
"""
@inline function unchecked_kmm_copy_to_device_async(manager, dst, dst_offset, src, bytes, event)
    fp = _fp_kmm_copy_to_device_async[]
    fp == C_NULL && throw_missing(:kmm_copy_to_device_async)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, Ptr{Cvoid}, UInt64, Ptr{KmmEvent}), manager, dst, dst_offset, src, bytes, event)
end
"""
As `kmm_copy_to_device` but returns once the copy is queued. When `event` is not NULL, writes
an event that completes when the copy has run (destroy it with `kmm_event_destroy`). The
memory at `src` must stay valid and unchanged until then.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_copy_to_device_async(manager, dst, dst_offset, src, bytes, event)
    check_status(unchecked_kmm_copy_to_device_async(manager, dst, dst_offset, src, bytes, event))
end

"""
Copies `bytes` from `src` at `src_offset` into host memory `dst` and returns once done.

Returns the status; `kmm_copy_to_host` is the checked form.
"""
@inline function unchecked_kmm_copy_to_host(manager, dst, src, src_offset, bytes)
    fp = _fp_kmm_copy_to_host[]
    fp == C_NULL && throw_missing(:kmm_copy_to_host)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cvoid}, KmmBuffer, UInt64, UInt64), manager, dst, src, src_offset, bytes)
end
"""
Copies `bytes` from `src` at `src_offset` into host memory `dst` and returns once done.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_copy_to_host(manager, dst, src, src_offset, bytes)
    check_status(unchecked_kmm_copy_to_host(manager, dst, src, src_offset, bytes))
end

"""
As `kmm_copy_to_host` but returns once the copy is queued; `event` as in
`kmm_copy_to_device_async`. The memory at `dst` must stay valid, and must not be read, until
the event completes (or the manager is synchronized).

Returns the status; `kmm_copy_to_host_async` is the checked form.
"""
@inline function unchecked_kmm_copy_to_host_async(manager, dst, src, src_offset, bytes, event)
    fp = _fp_kmm_copy_to_host_async[]
    fp == C_NULL && throw_missing(:kmm_copy_to_host_async)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cvoid}, KmmBuffer, UInt64, UInt64, Ptr{KmmEvent}), manager, dst, src, src_offset, bytes, event)
end
"""
As `kmm_copy_to_host` but returns once the copy is queued; `event` as in
`kmm_copy_to_device_async`. The memory at `dst` must stay valid, and must not be read, until
the event completes (or the manager is synchronized).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_copy_to_host_async(manager, dst, src, src_offset, bytes, event)
    check_status(unchecked_kmm_copy_to_host_async(manager, dst, src, src_offset, bytes, event))
end

"""
Copies `bytes` between buffers of one manager or of two managers. Stream-ordered (returns
once queued): queued on the destination's stream after the source's work so far, and the
source's later work waits for it. Between managers on different devices the copy goes peer
to peer where the devices allow it (`kmm_device_can_access_peer`), else it is staged through
the destination's pinned staging ring; either way it is stream-ordered on both sides and
leaves the calling thread's current CUDA context as it was. A staged copy larger than the
ring (`staging_chunks` x `staging_chunk_size`) waits on the host for its slots to come back,
as a copy from pageable memory does. Between a host-backend and a CUDA
manager the copy goes through host memory and returns once done. Overlapping ranges of one buffer are
`KMM_ERROR_INVALID_ARGUMENT`.

Returns the status; `kmm_copy_buffer` is the checked form.
"""
@inline function unchecked_kmm_copy_buffer(dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes)
    fp = _fp_kmm_copy_buffer[]
    fp == C_NULL && throw_missing(:kmm_copy_buffer)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, KmmManager, KmmBuffer, UInt64, UInt64), dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes)
end
"""
Copies `bytes` between buffers of one manager or of two managers. Stream-ordered (returns
once queued): queued on the destination's stream after the source's work so far, and the
source's later work waits for it. Between managers on different devices the copy goes peer
to peer where the devices allow it (`kmm_device_can_access_peer`), else it is staged through
the destination's pinned staging ring; either way it is stream-ordered on both sides and
leaves the calling thread's current CUDA context as it was. A staged copy larger than the
ring (`staging_chunks` x `staging_chunk_size`) waits on the host for its slots to come back,
as a copy from pageable memory does. Between a host-backend and a CUDA
manager the copy goes through host memory and returns once done. Overlapping ranges of one buffer are
`KMM_ERROR_INVALID_ARGUMENT`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_copy_buffer(dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes)
    check_status(unchecked_kmm_copy_buffer(dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes))
end

"""
Fills `bytes` bytes of `buffer` from `offset` with repeats of the `pattern_size`-byte
`pattern` (1 to 4096 bytes; `bytes` a multiple of it). Stream-ordered (returns once queued).

Returns the status; `kmm_fill` is the checked form.
"""
@inline function unchecked_kmm_fill(manager, buffer, offset, bytes, pattern, pattern_size)
    fp = _fp_kmm_fill[]
    fp == C_NULL && throw_missing(:kmm_fill)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, UInt64, Ptr{Cvoid}, Csize_t), manager, buffer, offset, bytes, pattern, pattern_size)
end
"""
Fills `bytes` bytes of `buffer` from `offset` with repeats of the `pattern_size`-byte
`pattern` (1 to 4096 bytes; `bytes` a multiple of it). Stream-ordered (returns once queued).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_fill(manager, buffer, offset, bytes, pattern, pattern_size)
    check_status(unchecked_kmm_fill(manager, buffer, offset, bytes, pattern, pattern_size))
end

"""
Makes `manager` the one `kmm_cupy_malloc` allocates from on `device` (the caller keeps it
alive while CuPy may allocate); 0 forgets the device's manager (`kmm_cupy_malloc` then fails
there until one is set), before it is closed. Thread-safe.

Returns the status; `kmm_cupy_set_manager` is the checked form.
"""
@inline function unchecked_kmm_cupy_set_manager(device, manager)
    fp = _fp_kmm_cupy_set_manager[]
    fp == C_NULL && throw_missing(:kmm_cupy_set_manager)
    ccall(fp, KmmStatus, (Int32, KmmManager), device, manager)
end
"""
Makes `manager` the one `kmm_cupy_malloc` allocates from on `device` (the caller keeps it
alive while CuPy may allocate); 0 forgets the device's manager (`kmm_cupy_malloc` then fails
there until one is set), before it is closed. Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_cupy_set_manager(device, manager)
    check_status(unchecked_kmm_cupy_set_manager(device, manager))
end

"""
Sets the function `kmm_cupy_malloc` calls for CuPy's current stream (CuPy's
`get_current_stream_ptr`; NULL means the legacy default stream) and the one it calls when
that fails (Python's `PyErr_Clear`, so the failure comes back as a NULL allocation instead of
a pending Python exception; may be NULL).

Returns the status; `kmm_cupy_set_stream_source` is the checked form.
"""
@inline function unchecked_kmm_cupy_set_stream_source(source, on_error)
    fp = _fp_kmm_cupy_set_stream_source[]
    fp == C_NULL && throw_missing(:kmm_cupy_set_stream_source)
    ccall(fp, KmmStatus, (KmmStreamSource, KmmErrorHook), source, on_error)
end
"""
Sets the function `kmm_cupy_malloc` calls for CuPy's current stream (CuPy's
`get_current_stream_ptr`; NULL means the legacy default stream) and the one it calls when
that fails (Python's `PyErr_Clear`, so the failure comes back as a NULL allocation instead of
a pending Python exception; may be NULL).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_cupy_set_stream_source(source, on_error)
    check_status(unchecked_kmm_cupy_set_stream_source(source, on_error))
end

"""
The allocation function of CuPy's `CFunctionAllocator` (`param` is unused): `size` bytes of
device memory from the manager registered for `device`, ready for work on CuPy's current
stream. NULL on failure, with the error readable through `kmm_last_error` (CuPy does not
check; `kmm.cupy` does and raises). Call it as CuPy does, with the GIL held: the stream
source set by `kmm_cupy_set_stream_source` is Python code underneath (not through ctypes'
`CDLL`, which releases the GIL).
"""
@inline function kmm_cupy_malloc(param, size, device)
    fp = _fp_kmm_cupy_malloc[]
    fp == C_NULL && throw_missing(:kmm_cupy_malloc)
    ccall(fp, Ptr{Cvoid}, (Ptr{Cvoid}, Csize_t, Int32), param, size, device)
end

"""
The free function of CuPy's `CFunctionAllocator`: frees memory from `kmm_cupy_malloc` after
the work queued so far on the stream it was allocated for. Unknown pointers and NULL are
ignored (the error is readable with `kmm_last_error`).
"""
@inline function kmm_cupy_free(param, ptr, device)
    fp = _fp_kmm_cupy_free[]
    fp == C_NULL && throw_missing(:kmm_cupy_free)
    ccall(fp, Cvoid, (Ptr{Cvoid}, Ptr{Cvoid}, Int32), param, ptr, device)
end

"""
How many allocations of `kmm_cupy_malloc` are live (for tests and leak checks).

Returns the status; `kmm_cupy_live_allocations` is the checked form.
"""
@inline function unchecked_kmm_cupy_live_allocations(out)
    fp = _fp_kmm_cupy_live_allocations[]
    fp == C_NULL && throw_missing(:kmm_cupy_live_allocations)
    ccall(fp, KmmStatus, (Ptr{UInt64},), out)
end
"""
How many allocations of `kmm_cupy_malloc` are live (for tests and leak checks).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_cupy_live_allocations(out)
    check_status(unchecked_kmm_cupy_live_allocations(out))
end

"""
Writes the CUDA IPC handle (`cuIpcGetMemHandle`, `KMM_IPC_HANDLE_BYTES` bytes) of the device
allocation that holds the buffer to `out`, and the buffer's offset from that allocation's base
to `*offset`: another process opens the handle (`cuIpcOpenMemHandle`) and adds the offset.
The buffer must be mapped (`kmm_buffer_map`), and stay mapped and allocated while others use
it; an unmapped buffer is `KMM_ERROR_INVALID_ARGUMENT`. `KMM_ERROR_NOT_SUPPORTED` on the host
backend; `KMM_ERROR_BACKEND` for memory the driver cannot share (`KMM_ALLOC_CUDA_ASYNC`).

Returns the status; `kmm_buffer_ipc_handle` is the checked form.
"""
@inline function unchecked_kmm_buffer_ipc_handle(manager, buffer, out, offset)
    fp = _fp_kmm_buffer_ipc_handle[]
    fp == C_NULL && throw_missing(:kmm_buffer_ipc_handle)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, Ptr{UInt8}, Ptr{UInt64}), manager, buffer, out, offset)
end
"""
Writes the CUDA IPC handle (`cuIpcGetMemHandle`, `KMM_IPC_HANDLE_BYTES` bytes) of the device
allocation that holds the buffer to `out`, and the buffer's offset from that allocation's base
to `*offset`: another process opens the handle (`cuIpcOpenMemHandle`) and adds the offset.
The buffer must be mapped (`kmm_buffer_map`), and stay mapped and allocated while others use
it; an unmapped buffer is `KMM_ERROR_INVALID_ARGUMENT`. `KMM_ERROR_NOT_SUPPORTED` on the host
backend; `KMM_ERROR_BACKEND` for memory the driver cannot share (`KMM_ALLOC_CUDA_ASYNC`).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_ipc_handle(manager, buffer, out, offset)
    check_status(unchecked_kmm_buffer_ipc_handle(manager, buffer, out, offset))
end

"""
Fills `*config` with the defaults: auto backend, device 0, pool mode with the binned
suballocator, 256-byte alignment, 8 MiB device chunks, no limits, everything cached.

Returns the status; `kmm_config_default` is the checked form.
"""
@inline function unchecked_kmm_config_default(config)
    fp = _fp_kmm_config_default[]
    fp == C_NULL && throw_missing(:kmm_config_default)
    ccall(fp, KmmStatus, (Ptr{KmmConfig},), config)
end
"""
Fills `*config` with the defaults: auto backend, device 0, pool mode with the binned
suballocator, 256-byte alignment, 8 MiB device chunks, no limits, everything cached.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_config_default(config)
    check_status(unchecked_kmm_config_default(config))
end

"""
Checks `*config` as `kmm_manager_create` does, without making a manager: `KMM_OK`, or the
status and a message naming the first option out of bounds. (Whether the backend and device
exist is the creation's to find.)

Returns the status; `kmm_config_check` is the checked form.
"""
@inline function unchecked_kmm_config_check(config)
    fp = _fp_kmm_config_check[]
    fp == C_NULL && throw_missing(:kmm_config_check)
    ccall(fp, KmmStatus, (Ptr{KmmConfig},), config)
end
"""
Checks `*config` as `kmm_manager_create` does, without making a manager: `KMM_OK`, or the
status and a message naming the first option out of bounds. (Whether the backend and device
exist is the creation's to find.)

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_config_check(config)
    check_status(unchecked_kmm_config_check(config))
end

"""
Writes to `*count` how many devices `backend` (a `KmmBackend`) offers: the visible CUDA
devices, or the host backend's stand-ins (the `KMM_HOST_DEVICES` variable, 1 to 64, default
1). `KMM_BACKEND_AUTO` follows `KMM_BACKEND`, then counts CUDA's devices when CUDA is usable,
else the host's. Managers may be created on devices `0..count`.

Returns the status; `kmm_device_count` is the checked form.
"""
@inline function unchecked_kmm_device_count(backend, count)
    fp = _fp_kmm_device_count[]
    fp == C_NULL && throw_missing(:kmm_device_count)
    ccall(fp, KmmStatus, (UInt32, Ptr{UInt32}), backend, count)
end
"""
Writes to `*count` how many devices `backend` (a `KmmBackend`) offers: the visible CUDA
devices, or the host backend's stand-ins (the `KMM_HOST_DEVICES` variable, 1 to 64, default
1). `KMM_BACKEND_AUTO` follows `KMM_BACKEND`, then counts CUDA's devices when CUDA is usable,
else the host's. Managers may be created on devices `0..count`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_device_count(backend, count)
    check_status(unchecked_kmm_device_count(backend, count))
end

"""
Writes to `*out` whether copies between `device` and `peer` of `backend` (a `KmmBackend`)
can go peer to peer (1) or are staged through pinned host memory (0; also for `device ==
peer`). Only asks the devices (`cuDeviceCanAccessPeer` both ways): no context is made and
peer access is not enabled; the first copy between the two enables it, both ways, for the
life of the process (and accepts it already enabled by another library). Host stand-in
devices pair up as NVLink pairs do: 0 with 1, 2 with 3, and so on.

Returns the status; `kmm_device_can_access_peer` is the checked form.
"""
@inline function unchecked_kmm_device_can_access_peer(backend, device, peer, out)
    fp = _fp_kmm_device_can_access_peer[]
    fp == C_NULL && throw_missing(:kmm_device_can_access_peer)
    ccall(fp, KmmStatus, (UInt32, Int32, Int32, Ptr{UInt32}), backend, device, peer, out)
end
"""
Writes to `*out` whether copies between `device` and `peer` of `backend` (a `KmmBackend`)
can go peer to peer (1) or are staged through pinned host memory (0; also for `device ==
peer`). Only asks the devices (`cuDeviceCanAccessPeer` both ways): no context is made and
peer access is not enabled; the first copy between the two enables it, both ways, for the
life of the process (and accepts it already enabled by another library). Host stand-in
devices pair up as NVLink pairs do: 0 with 1, 2 with 3, and so on.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_device_can_access_peer(backend, device, peer, out)
    check_status(unchecked_kmm_device_can_access_peer(backend, device, peer, out))
end

"""
Writes to `*count` how many managers are alive in this process: created and not yet torn
down (one whose deferred teardown still runs counts). A process that closed all it made
reads 0: what scale-out code checks to show a call left nothing behind.

Returns the status; `kmm_live_managers` is the checked form.
"""
@inline function unchecked_kmm_live_managers(count)
    fp = _fp_kmm_live_managers[]
    fp == C_NULL && throw_missing(:kmm_live_managers)
    ccall(fp, KmmStatus, (Ptr{UInt32},), count)
end
"""
Writes to `*count` how many managers are alive in this process: created and not yet torn
down (one whose deferred teardown still runs counts). A process that closed all it made
reads 0: what scale-out code checks to show a call left nothing behind.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_live_managers(count)
    check_status(unchecked_kmm_live_managers(count))
end

"""
Creates a manager with its own stream and pools. `config` may be NULL for the defaults.
On success writes the handle to `*out`; destroy it with `kmm_manager_destroy`.
Many managers may coexist, on one device or several. Thread-safe.

Returns the status; `kmm_manager_create` is the checked form.
"""
@inline function unchecked_kmm_manager_create(config, out)
    fp = _fp_kmm_manager_create[]
    fp == C_NULL && throw_missing(:kmm_manager_create)
    ccall(fp, KmmStatus, (Ptr{KmmConfig}, Ptr{KmmManager}), config, out)
end
"""
Creates a manager with its own stream and pools. `config` may be NULL for the defaults.
On success writes the handle to `*out`; destroy it with `kmm_manager_destroy`.
Many managers may coexist, on one device or several. Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_create(config, out)
    check_status(unchecked_kmm_manager_create(config, out))
end

"""
Destroys a manager: waits for its stream, frees every buffer and event it still holds and
gives all its memory back. Later calls with its handles return `KMM_ERROR_INVALID_HANDLE`.
With `KMM_DESTROY_DEFERRED` the handle dies at once and the teardown runs on a background
thread, so the call never waits for the device (for finalizers), nor for calls in flight on
the manager (the teardown waits for them); a file trace's rows recorded so far are written
first (into a pipe, that waits for its reader). Thread-safe; without the flag, waits for calls
in flight on the same manager. Allocations of `kmm_cupy_malloc` and `kmm_torch_malloc` it
still held are freed with it; those libraries free by address alone, so until each late free
comes, a new allocation of theirs that lands on such an address is held back (it counts in
its manager's stats, at most one per address) and the request is served elsewhere; the late
free gives it back. `kmm_plugin_free_address` names the manager, so its late frees need none of this.

Returns the status; `kmm_manager_destroy` is the checked form.
"""
@inline function unchecked_kmm_manager_destroy(manager, flags)
    fp = _fp_kmm_manager_destroy[]
    fp == C_NULL && throw_missing(:kmm_manager_destroy)
    ccall(fp, KmmStatus, (KmmManager, UInt32), manager, flags)
end
"""
Destroys a manager: waits for its stream, frees every buffer and event it still holds and
gives all its memory back. Later calls with its handles return `KMM_ERROR_INVALID_HANDLE`.
With `KMM_DESTROY_DEFERRED` the handle dies at once and the teardown runs on a background
thread, so the call never waits for the device (for finalizers), nor for calls in flight on
the manager (the teardown waits for them); a file trace's rows recorded so far are written
first (into a pipe, that waits for its reader). Thread-safe; without the flag, waits for calls
in flight on the same manager. Allocations of `kmm_cupy_malloc` and `kmm_torch_malloc` it
still held are freed with it; those libraries free by address alone, so until each late free
comes, a new allocation of theirs that lands on such an address is held back (it counts in
its manager's stats, at most one per address) and the request is served elsewhere; the late
free gives it back. `kmm_plugin_free_address` names the manager, so its late frees need none of this.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_destroy(manager, flags)
    check_status(unchecked_kmm_manager_destroy(manager, flags))
end

"""
Waits until all work queued on the manager's stream has run, then gives cached device
memory above the release threshold back.

Returns the status; `kmm_manager_synchronize` is the checked form.
"""
@inline function unchecked_kmm_manager_synchronize(manager)
    fp = _fp_kmm_manager_synchronize[]
    fp == C_NULL && throw_missing(:kmm_manager_synchronize)
    ccall(fp, KmmStatus, (KmmManager,), manager)
end
"""
Waits until all work queued on the manager's stream has run, then gives cached device
memory above the release threshold back.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_synchronize(manager)
    check_status(unchecked_kmm_manager_synchronize(manager))
end

"""
Writes the manager's backend, device, mode and raw stream to `*out`. The stream (a
`CUstream` on CUDA) stays owned by the manager; others may queue work on it until the
manager is destroyed.

Returns the status; `kmm_manager_info` is the checked form.
"""
@inline function unchecked_kmm_manager_info(manager, out)
    fp = _fp_kmm_manager_info[]
    fp == C_NULL && throw_missing(:kmm_manager_info)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmManagerInfo}), manager, out)
end
"""
Writes the manager's backend, device, mode and raw stream to `*out`. The stream (a
`CUstream` on CUDA) stays owned by the manager; others may queue work on it until the
manager is destroyed.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_info(manager, out)
    check_status(unchecked_kmm_manager_info(manager, out))
end

"""
Writes the figures of one memory kind (a `KmmMemoryKind`) to `*out`.

Returns the status; `kmm_manager_stats` is the checked form.
"""
@inline function unchecked_kmm_manager_stats(manager, kind, out)
    fp = _fp_kmm_manager_stats[]
    fp == C_NULL && throw_missing(:kmm_manager_stats)
    ccall(fp, KmmStatus, (KmmManager, UInt32, Ptr{KmmMemoryStats}), manager, kind, out)
end
"""
Writes the figures of one memory kind (a `KmmMemoryKind`) to `*out`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_stats(manager, kind, out)
    check_status(unchecked_kmm_manager_stats(manager, kind, out))
end

"""
Resets the peak counters (in use and reserved) of both kinds to their current values.

Returns the status; `kmm_manager_reset_peaks` is the checked form.
"""
@inline function unchecked_kmm_manager_reset_peaks(manager)
    fp = _fp_kmm_manager_reset_peaks[]
    fp == C_NULL && throw_missing(:kmm_manager_reset_peaks)
    ccall(fp, KmmStatus, (KmmManager,), manager)
end
"""
Resets the peak counters (in use and reserved) of both kinds to their current values.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_reset_peaks(manager)
    check_status(unchecked_kmm_manager_reset_peaks(manager))
end

"""
Waits for the stream, then gives cached memory back until each pool reserves at most
`keep_bytes` (live buffers are never moved or freed).

Returns the status; `kmm_manager_trim` is the checked form.
"""
@inline function unchecked_kmm_manager_trim(manager, keep_bytes)
    fp = _fp_kmm_manager_trim[]
    fp == C_NULL && throw_missing(:kmm_manager_trim)
    ccall(fp, KmmStatus, (KmmManager, UInt64), manager, keep_bytes)
end
"""
Waits for the stream, then gives cached memory back until each pool reserves at most
`keep_bytes` (live buffers are never moved or freed).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_trim(manager, keep_bytes)
    check_status(unchecked_kmm_manager_trim(manager, keep_bytes))
end

"""
Writes a readable table of the manager's memory (in use, reserved, peaks, counts, largest
free block) into `buf` as a NUL-terminated string, truncated to `len` bytes, and the length
the whole text needs (with its NUL) to `*needed` when `needed` is not NULL. `buf` may be NULL
when `len` is 0, to ask for the length.

Returns the status; `kmm_manager_summary` is the checked form.
"""
@inline function unchecked_kmm_manager_summary(manager, buf, len, needed)
    fp = _fp_kmm_manager_summary[]
    fp == C_NULL && throw_missing(:kmm_manager_summary)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cchar}, Csize_t, Ptr{Csize_t}), manager, buf, len, needed)
end
"""
Writes a readable table of the manager's memory (in use, reserved, peaks, counts, largest
free block) into `buf` as a NUL-terminated string, truncated to `len` bytes, and the length
the whole text needs (with its NUL) to `*needed` when `needed` is not NULL. `buf` may be NULL
when `len` is 0, to ask for the length.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_summary(manager, buf, len, needed)
    check_status(unchecked_kmm_manager_summary(manager, buf, len, needed))
end

"""
Writes the device's free and total memory in bytes.

Returns the status; `kmm_manager_memory_info` is the checked form.
"""
@inline function unchecked_kmm_manager_memory_info(manager, free, total)
    fp = _fp_kmm_manager_memory_info[]
    fp == C_NULL && throw_missing(:kmm_manager_memory_info)
    ccall(fp, KmmStatus, (KmmManager, Ptr{UInt64}, Ptr{UInt64}), manager, free, total)
end
"""
Writes the device's free and total memory in bytes.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_memory_info(manager, free, total)
    check_status(unchecked_kmm_manager_memory_info(manager, free, total))
end

"""
Makes the manager's stream wait for the work queued so far on `stream` (a `CUstream` of the
same device, e.g. CUDA.jl's or PyTorch's; on the host backend, another manager's stream).

Returns the status; `kmm_manager_wait_stream` is the checked form.
"""
@inline function unchecked_kmm_manager_wait_stream(manager, stream)
    fp = _fp_kmm_manager_wait_stream[]
    fp == C_NULL && throw_missing(:kmm_manager_wait_stream)
    ccall(fp, KmmStatus, (KmmManager, UInt64), manager, stream)
end
"""
Makes the manager's stream wait for the work queued so far on `stream` (a `CUstream` of the
same device, e.g. CUDA.jl's or PyTorch's; on the host backend, another manager's stream).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_wait_stream(manager, stream)
    check_status(unchecked_kmm_manager_wait_stream(manager, stream))
end

"""
Makes `stream` wait for the work queued so far on the manager's stream.

Returns the status; `kmm_manager_signal_stream` is the checked form.
"""
@inline function unchecked_kmm_manager_signal_stream(manager, stream)
    fp = _fp_kmm_manager_signal_stream[]
    fp == C_NULL && throw_missing(:kmm_manager_signal_stream)
    ccall(fp, KmmStatus, (KmmManager, UInt64), manager, stream)
end
"""
Makes `stream` wait for the work queued so far on the manager's stream.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_signal_stream(manager, stream)
    check_status(unchecked_kmm_manager_signal_stream(manager, stream))
end

"""
Records an event after the work queued so far on the manager's stream. Destroy it with
`kmm_event_destroy` (destroying the manager destroys it too).

Returns the status; `kmm_manager_record_event` is the checked form.
"""
@inline function unchecked_kmm_manager_record_event(manager, out)
    fp = _fp_kmm_manager_record_event[]
    fp == C_NULL && throw_missing(:kmm_manager_record_event)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmEvent}), manager, out)
end
"""
Records an event after the work queued so far on the manager's stream. Destroy it with
`kmm_event_destroy` (destroying the manager destroys it too).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_record_event(manager, out)
    check_status(unchecked_kmm_manager_record_event(manager, out))
end

"""
Writes whether the work before the event has run (non-blocking).

Returns the status; `kmm_event_query` is the checked form.
"""
@inline function unchecked_kmm_event_query(manager, event, done)
    fp = _fp_kmm_event_query[]
    fp == C_NULL && throw_missing(:kmm_event_query)
    ccall(fp, KmmStatus, (KmmManager, KmmEvent, Ptr{Bool}), manager, event, done)
end
"""
Writes whether the work before the event has run (non-blocking).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_event_query(manager, event, done)
    check_status(unchecked_kmm_event_query(manager, event, done))
end

"""
Blocks until the work before the event has run.

Returns the status; `kmm_event_wait` is the checked form.
"""
@inline function unchecked_kmm_event_wait(manager, event)
    fp = _fp_kmm_event_wait[]
    fp == C_NULL && throw_missing(:kmm_event_wait)
    ccall(fp, KmmStatus, (KmmManager, KmmEvent), manager, event)
end
"""
Blocks until the work before the event has run.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_event_wait(manager, event)
    check_status(unchecked_kmm_event_wait(manager, event))
end

"""
Destroys an event; work already queued is unaffected.

Returns the status; `kmm_event_destroy` is the checked form.
"""
@inline function unchecked_kmm_event_destroy(manager, event)
    fp = _fp_kmm_event_destroy[]
    fp == C_NULL && throw_missing(:kmm_event_destroy)
    ccall(fp, KmmStatus, (KmmManager, KmmEvent), manager, event)
end
"""
Destroys an event; work already queued is unaffected.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_event_destroy(manager, event)
    check_status(unchecked_kmm_event_destroy(manager, event))
end

"""
Compiles CUDA C source `src` with NVRTC for the manager's device and loads it; writes the
module to `*out`. `options` holds `noptions` NVRTC options (NULL when 0), e.g. "-DN=32";
`--gpu-architecture=sm_XY` of the device is added unless an architecture is given.
Kernels must be `extern "C" __global__`. Compiled images are cached in memory and on disk
under `\$KMM_CACHE_DIR` (else `\$XDG_CACHE_HOME/kmm`, else `~/.cache/kmm`), keyed by a hash of
source, options, architecture and NVRTC version. A compile error is `KMM_ERROR_COMPILE` with
NVRTC's log in `kmm_last_error()`. Needs the CUDA backend and libnvrtc. Thread-safe.

Returns the status; `kmm_module_compile` is the checked form.
"""
@inline function unchecked_kmm_module_compile(manager, src, options, noptions, out)
    fp = _fp_kmm_module_compile[]
    fp == C_NULL && throw_missing(:kmm_module_compile)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cchar}, Ptr{Ptr{Cchar}}, UInt32, Ptr{KmmModule}), manager, src, options, noptions, out)
end
"""
Compiles CUDA C source `src` with NVRTC for the manager's device and loads it; writes the
module to `*out`. `options` holds `noptions` NVRTC options (NULL when 0), e.g. "-DN=32";
`--gpu-architecture=sm_XY` of the device is added unless an architecture is given.
Kernels must be `extern "C" __global__`. Compiled images are cached in memory and on disk
under `\$KMM_CACHE_DIR` (else `\$XDG_CACHE_HOME/kmm`, else `~/.cache/kmm`), keyed by a hash of
source, options, architecture and NVRTC version. A compile error is `KMM_ERROR_COMPILE` with
NVRTC's log in `kmm_last_error()`. Needs the CUDA backend and libnvrtc. Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_module_compile(manager, src, options, noptions, out)
    check_status(unchecked_kmm_module_compile(manager, src, options, noptions, out))
end

"""
Launches kernel `name` of `module` on the manager's stream with `grid[3]` blocks of
`block[3]` threads, `shmem` bytes of dynamic shared memory and `nargs` arguments (at most
256; `args` may be NULL when 0). Buffer arguments are pinned while the launch is queued;
stream order keeps them alive for the kernel, as for copies. The arguments must match the
kernel's parameters in number, order and size: the driver cannot check them. Returns once
queued. Needs the CUDA backend and a module of the manager's device.

Returns the status; `kmm_module_launch` is the checked form.
"""
@inline function unchecked_kmm_module_launch(manager, module_, name, grid, block, shmem, args, nargs)
    fp = _fp_kmm_module_launch[]
    fp == C_NULL && throw_missing(:kmm_module_launch)
    ccall(fp, KmmStatus, (KmmManager, KmmModule, Ptr{Cchar}, Ptr{UInt32}, Ptr{UInt32}, UInt32, Ptr{KmmKernelArg}, UInt32), manager, module_, name, grid, block, shmem, args, nargs)
end
"""
Launches kernel `name` of `module` on the manager's stream with `grid[3]` blocks of
`block[3]` threads, `shmem` bytes of dynamic shared memory and `nargs` arguments (at most
256; `args` may be NULL when 0). Buffer arguments are pinned while the launch is queued;
stream order keeps them alive for the kernel, as for copies. The arguments must match the
kernel's parameters in number, order and size: the driver cannot check them. Returns once
queued. Needs the CUDA backend and a module of the manager's device.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_module_launch(manager, module_, name, grid, block, shmem, args, nargs)
    check_status(unchecked_kmm_module_launch(manager, module_, name, grid, block, shmem, args, nargs))
end

"""
Releases a module handle. The compiled code stays cached for the process (a later compile of
the same source is instant). A second destroy is `KMM_ERROR_INVALID_HANDLE`.

Returns the status; `kmm_module_destroy` is the checked form.
"""
@inline function unchecked_kmm_module_destroy(module_)
    fp = _fp_kmm_module_destroy[]
    fp == C_NULL && throw_missing(:kmm_module_destroy)
    ccall(fp, KmmStatus, (KmmModule,), module_)
end
"""
Releases a module handle. The compiled code stays cached for the process (a later compile of
the same source is instant). A second destroy is `KMM_ERROR_INVALID_HANDLE`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_module_destroy(module_)
    check_status(unchecked_kmm_module_destroy(module_))
end

"""
The FISP echo magnetization of atoms `first_atom .. first_atom + natoms` of `params`
(records of four floats: T1 s, T2 s, B1, B0 Hz) into `m` (`ntr x natoms` complex float), and
its exact derivatives (forward-mode automatic differentiation, not finite differences) with
respect to T1 into `dm_dt1` and T2 into `dm_dt2` (same shape; 0 leaves one out). Computed in
f64 on the host backend, in f32 kernels with dual numbers on CUDA (there `seq.max_state`
at most 64). `flags` must be 0. Thread-safe.

Returns the status; `kmm_qmri_fisp_derivatives` is the checked form.
"""
@inline function unchecked_kmm_qmri_fisp_derivatives(manager, seq, params, first_atom, natoms, m, dm_dt1, dm_dt2, flags)
    fp = _fp_kmm_qmri_fisp_derivatives[]
    fp == C_NULL && throw_missing(:kmm_qmri_fisp_derivatives)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmFispSequence}, KmmBuffer, UInt64, UInt64, KmmBuffer, KmmBuffer, KmmBuffer, UInt32), manager, seq, params, first_atom, natoms, m, dm_dt1, dm_dt2, flags)
end
"""
The FISP echo magnetization of atoms `first_atom .. first_atom + natoms` of `params`
(records of four floats: T1 s, T2 s, B1, B0 Hz) into `m` (`ntr x natoms` complex float), and
its exact derivatives (forward-mode automatic differentiation, not finite differences) with
respect to T1 into `dm_dt1` and T2 into `dm_dt2` (same shape; 0 leaves one out). Computed in
f64 on the host backend, in f32 kernels with dual numbers on CUDA (there `seq.max_state`
at most 64). `flags` must be 0. Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_fisp_derivatives(manager, seq, params, first_atom, natoms, m, dm_dt1, dm_dt2, flags)
    check_status(unchecked_kmm_qmri_fisp_derivatives(manager, seq, params, first_atom, natoms, m, dm_dt1, dm_dt2, flags))
end

"""
The k-space signal of the magnetization `m` (`nreadouts x nvoxels` complex float, readout
fastest) into `out` (`nsamples x nreadouts x ncoils` complex float, sample fastest).
Thread-safe.

Returns the status; `kmm_qmri_mrstat_signal` is the checked form.
"""
@inline function unchecked_kmm_qmri_mrstat_signal(manager, model, m, out)
    fp = _fp_kmm_qmri_mrstat_signal[]
    fp == C_NULL && throw_missing(:kmm_qmri_mrstat_signal)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmMrstatModel}, KmmBuffer, KmmBuffer), manager, model, m, out)
end
"""
The k-space signal of the magnetization `m` (`nreadouts x nvoxels` complex float, readout
fastest) into `out` (`nsamples x nreadouts x ncoils` complex float, sample fastest).
Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_mrstat_signal(manager, model, m, out)
    check_status(unchecked_kmm_qmri_mrstat_signal(manager, model, m, out))
end

"""
J·v, the Jacobian of the signal with respect to (T1, T2, Re ρ, Im ρ) of every voxel applied
to `v` (`4 x nvoxels` float, parameter fastest), into `out` (signal-shaped). `m`, `dm_dt1`
and `dm_dt2` are the magnetization and its derivatives (from `kmm_qmri_fisp_derivatives`).
Thread-safe.

Returns the status; `kmm_qmri_jacobian_mul` is the checked form.
"""
@inline function unchecked_kmm_qmri_jacobian_mul(manager, model, m, dm_dt1, dm_dt2, v, out)
    fp = _fp_kmm_qmri_jacobian_mul[]
    fp == C_NULL && throw_missing(:kmm_qmri_jacobian_mul)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmMrstatModel}, KmmBuffer, KmmBuffer, KmmBuffer, KmmBuffer, KmmBuffer), manager, model, m, dm_dt1, dm_dt2, v, out)
end
"""
J·v, the Jacobian of the signal with respect to (T1, T2, Re ρ, Im ρ) of every voxel applied
to `v` (`4 x nvoxels` float, parameter fastest), into `out` (signal-shaped). `m`, `dm_dt1`
and `dm_dt2` are the magnetization and its derivatives (from `kmm_qmri_fisp_derivatives`).
Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_jacobian_mul(manager, model, m, dm_dt1, dm_dt2, v, out)
    check_status(unchecked_kmm_qmri_jacobian_mul(manager, model, m, dm_dt1, dm_dt2, v, out))
end

"""
Re(Jᴴw): the adjoint of `kmm_qmri_jacobian_mul` (in the real sense) applied to a
signal-shaped `w`, into `out` (`4 x nvoxels` float). Thread-safe.

Returns the status; `kmm_qmri_jacobian_adjoint_mul` is the checked form.
"""
@inline function unchecked_kmm_qmri_jacobian_adjoint_mul(manager, model, m, dm_dt1, dm_dt2, w, out)
    fp = _fp_kmm_qmri_jacobian_adjoint_mul[]
    fp == C_NULL && throw_missing(:kmm_qmri_jacobian_adjoint_mul)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmMrstatModel}, KmmBuffer, KmmBuffer, KmmBuffer, KmmBuffer, KmmBuffer), manager, model, m, dm_dt1, dm_dt2, w, out)
end
"""
Re(Jᴴw): the adjoint of `kmm_qmri_jacobian_mul` (in the real sense) applied to a
signal-shaped `w`, into `out` (`4 x nvoxels` float). Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_jacobian_adjoint_mul(manager, model, m, dm_dt1, dm_dt2, w, out)
    check_status(unchecked_kmm_qmri_jacobian_adjoint_mul(manager, model, m, dm_dt1, dm_dt2, w, out))
end

"""
For allocator plugins: allocates `bytes` of `kind` memory, maps it, and writes the buffer's
handle to `*buffer` and its address to `*ptr` (0 for zero bytes). `stream` is the raw stream
the memory will be used on (a `CUstream`; 0 is the legacy default stream on CUDA and means
the manager's own stream on the host backend); the memory is ready for work queued on it.
The stream must stay alive until the buffer is freed (its free is ordered after it). Free
with `kmm_plugin_free` (the buffer stays mapped until then). `CU_STREAM_PER_THREAD` (2) names
the calling thread's stream: free from the thread that allocated.

Returns the status; `kmm_plugin_alloc` is the checked form.
"""
@inline function unchecked_kmm_plugin_alloc(manager, bytes, kind, stream, buffer, ptr)
    fp = _fp_kmm_plugin_alloc[]
    fp == C_NULL && throw_missing(:kmm_plugin_alloc)
    ccall(fp, KmmStatus, (KmmManager, UInt64, UInt32, UInt64, Ptr{KmmBuffer}, Ptr{UInt64}), manager, bytes, kind, stream, buffer, ptr)
end
"""
For allocator plugins: allocates `bytes` of `kind` memory, maps it, and writes the buffer's
handle to `*buffer` and its address to `*ptr` (0 for zero bytes). `stream` is the raw stream
the memory will be used on (a `CUstream`; 0 is the legacy default stream on CUDA and means
the manager's own stream on the host backend); the memory is ready for work queued on it.
The stream must stay alive until the buffer is freed (its free is ordered after it). Free
with `kmm_plugin_free` (the buffer stays mapped until then). `CU_STREAM_PER_THREAD` (2) names
the calling thread's stream: free from the thread that allocated.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_plugin_alloc(manager, bytes, kind, stream, buffer, ptr)
    check_status(unchecked_kmm_plugin_alloc(manager, bytes, kind, stream, buffer, ptr))
end

"""
For allocator plugins: frees a buffer from `kmm_plugin_alloc` (mapped or not) after the work
queued so far on `stream` (the stream that last used it; it must still be alive).
Non-blocking; callable from any thread and from finalizers.

Returns the status; `kmm_plugin_free` is the checked form.
"""
@inline function unchecked_kmm_plugin_free(manager, buffer, stream)
    fp = _fp_kmm_plugin_free[]
    fp == C_NULL && throw_missing(:kmm_plugin_free)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64), manager, buffer, stream)
end
"""
For allocator plugins: frees a buffer from `kmm_plugin_alloc` (mapped or not) after the work
queued so far on `stream` (the stream that last used it; it must still be alive).
Non-blocking; callable from any thread and from finalizers.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_plugin_free(manager, buffer, stream)
    check_status(unchecked_kmm_plugin_free(manager, buffer, stream))
end

"""
For allocator plugins that keep only the address: allocates, as `kmm_plugin_alloc` does,
`bytes` (at least 1) of device memory ready for work on `stream`, and returns its address. 0
on failure, with the message in `kmm_last_error` (`kmm_plugin_alloc` returns the status).
Free with `kmm_plugin_free_address`.
"""
@inline function kmm_plugin_malloc(manager, bytes, stream)
    fp = _fp_kmm_plugin_malloc[]
    fp == C_NULL && throw_missing(:kmm_plugin_malloc)
    ccall(fp, UInt64, (KmmManager, UInt64, UInt64), manager, bytes, stream)
end

"""
Frees the allocation of `kmm_plugin_malloc` at `address` of `manager` after the work queued
so far on `stream`. Non-blocking; callable from any thread and from finalizers.

Returns the status; `kmm_plugin_free_address` is the checked form.
"""
@inline function unchecked_kmm_plugin_free_address(manager, address, stream)
    fp = _fp_kmm_plugin_free_address[]
    fp == C_NULL && throw_missing(:kmm_plugin_free_address)
    ccall(fp, KmmStatus, (KmmManager, UInt64, UInt64), manager, address, stream)
end
"""
Frees the allocation of `kmm_plugin_malloc` at `address` of `manager` after the work queued
so far on `stream`. Non-blocking; callable from any thread and from finalizers.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_plugin_free_address(manager, address, stream)
    check_status(unchecked_kmm_plugin_free_address(manager, address, stream))
end

"""
Simulates the FISP signals of atoms `first_atom .. first_atom + natoms` of `params` into
`out`: `ntr x natoms` complex float (re, im pairs; TR index fastest; column 0 is atom
`first_atom`). `params` holds records of four floats (T1 s, T2 s, B1 relative, B0 Hz); T1
and T2 must be > 0 (+Inf allowed), B1 and B0 finite, unless `flags` has
`KMM_QMRI_SKIP_CHECKS`. Large dictionaries go in batches: all parameters in one buffer, one
output buffer per batch, each batch matched with `KMM_MATCH_ACCUMULATE`. Queued on the
manager's stream; returns once queued (after a wait for the parameter check). On CUDA the
kernel is compiled once per state count and threads per atom (NVRTC, cached): 1 to 4 threads
per atom of 32 states as `natoms` fills the GPU more or less (a smaller last batch may compile
a second layout); `KMM_FISP_LANES` (1 to 32) sets the threads per atom for tuning.
Thread-safe.

Returns the status; `kmm_qmri_simulate_fisp` is the checked form.
"""
@inline function unchecked_kmm_qmri_simulate_fisp(manager, seq, params, first_atom, natoms, out, flags)
    fp = _fp_kmm_qmri_simulate_fisp[]
    fp == C_NULL && throw_missing(:kmm_qmri_simulate_fisp)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmFispSequence}, KmmBuffer, UInt64, UInt64, KmmBuffer, UInt32), manager, seq, params, first_atom, natoms, out, flags)
end
"""
Simulates the FISP signals of atoms `first_atom .. first_atom + natoms` of `params` into
`out`: `ntr x natoms` complex float (re, im pairs; TR index fastest; column 0 is atom
`first_atom`). `params` holds records of four floats (T1 s, T2 s, B1 relative, B0 Hz); T1
and T2 must be > 0 (+Inf allowed), B1 and B0 finite, unless `flags` has
`KMM_QMRI_SKIP_CHECKS`. Large dictionaries go in batches: all parameters in one buffer, one
output buffer per batch, each batch matched with `KMM_MATCH_ACCUMULATE`. Queued on the
manager's stream; returns once queued (after a wait for the parameter check). On CUDA the
kernel is compiled once per state count and threads per atom (NVRTC, cached): 1 to 4 threads
per atom of 32 states as `natoms` fills the GPU more or less (a smaller last batch may compile
a second layout); `KMM_FISP_LANES` (1 to 32) sets the threads per atom for tuning.
Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_simulate_fisp(manager, seq, params, first_atom, natoms, out, flags)
    check_status(unchecked_kmm_qmri_simulate_fisp(manager, seq, params, first_atom, natoms, out, flags))
end

"""
Simulates the pSSFP signals of `natoms` atoms into `out` (`ntr x natoms` complex float), as
`kmm_qmri_simulate_fisp` does for FISP.

Returns the status; `kmm_qmri_simulate_pssfp` is the checked form.
"""
@inline function unchecked_kmm_qmri_simulate_pssfp(manager, seq, params, first_atom, natoms, out, flags)
    fp = _fp_kmm_qmri_simulate_pssfp[]
    fp == C_NULL && throw_missing(:kmm_qmri_simulate_pssfp)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmPssfpSequence}, KmmBuffer, UInt64, UInt64, KmmBuffer, UInt32), manager, seq, params, first_atom, natoms, out, flags)
end
"""
Simulates the pSSFP signals of `natoms` atoms into `out` (`ntr x natoms` complex float), as
`kmm_qmri_simulate_fisp` does for FISP.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_simulate_pssfp(manager, seq, params, first_atom, natoms, out, flags)
    check_status(unchecked_kmm_qmri_simulate_pssfp(manager, seq, params, first_atom, natoms, out, flags))
end

"""
Dictionary matching. `dictionary` holds `ntr x natoms` complex float (one atom per column:
atoms `atom_offset .. atom_offset + natoms` of the whole dictionary), `signals` holds
`ntr x nvoxels`. For each voxel signal x, finds the atom j maximising |d_j^H x| / ||d_j||
and writes the `outputs` (see `KmmMatchOutputs`; `index` is required). `params` holds the
whole dictionary's atom records (at least `atom_offset + natoms`), or 0 when
`outputs->params` is 0. Ties go to the lower index; zero and non-finite atoms never match.
`rank` in 1..=ntr first projects dictionary and signals on the dominant rank-`rank`
subspace of this dictionary's TR space (SVD compression); 0 (and ntr, whose subspace is the
whole space) matches uncompressed. Compressed,
each atom is matched as its projection on the basis, and scores use the norm of the whole
signal, so that they are cosines comparable between batches. A dictionary matched
in batches should share one basis: `kmm_qmri_compression_basis` once, then
`kmm_qmri_match_in_basis` per batch. `flags`: `KMM_MATCH_ACCUMULATE` to merge with earlier
batches. On CUDA: cuBLAS CGEMM in voxel chunks (scratch of natoms x chunk complex values, at
most half the free memory and `\$KMM_MATCH_SCRATCH_BYTES`, default 2 GiB), then a reduction
kernel; `KMM_MATCH_MATH=tf32` lets cuBLAS use TF32 tensor cores. Compressed to rank 32 or
less, one fused kernel computes the inner products and keeps the best atom, with no scratch
(`KMM_MATCH_FUSED=0` uses GEMM and reduction instead). Queued on the manager's
stream (a compressed match that computes its own basis waits once). Thread-safe.

Returns the status; `kmm_qmri_match` is the checked form.
"""
@inline function unchecked_kmm_qmri_match(manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, rank, params, outputs, flags)
    fp = _fp_kmm_qmri_match[]
    fp == C_NULL && throw_missing(:kmm_qmri_match)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, UInt64, UInt64, KmmBuffer, UInt64, UInt32, KmmBuffer, Ptr{KmmMatchOutputs}, UInt32), manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, rank, params, outputs, flags)
end
"""
Dictionary matching. `dictionary` holds `ntr x natoms` complex float (one atom per column:
atoms `atom_offset .. atom_offset + natoms` of the whole dictionary), `signals` holds
`ntr x nvoxels`. For each voxel signal x, finds the atom j maximising |d_j^H x| / ||d_j||
and writes the `outputs` (see `KmmMatchOutputs`; `index` is required). `params` holds the
whole dictionary's atom records (at least `atom_offset + natoms`), or 0 when
`outputs->params` is 0. Ties go to the lower index; zero and non-finite atoms never match.
`rank` in 1..=ntr first projects dictionary and signals on the dominant rank-`rank`
subspace of this dictionary's TR space (SVD compression); 0 (and ntr, whose subspace is the
whole space) matches uncompressed. Compressed,
each atom is matched as its projection on the basis, and scores use the norm of the whole
signal, so that they are cosines comparable between batches. A dictionary matched
in batches should share one basis: `kmm_qmri_compression_basis` once, then
`kmm_qmri_match_in_basis` per batch. `flags`: `KMM_MATCH_ACCUMULATE` to merge with earlier
batches. On CUDA: cuBLAS CGEMM in voxel chunks (scratch of natoms x chunk complex values, at
most half the free memory and `\$KMM_MATCH_SCRATCH_BYTES`, default 2 GiB), then a reduction
kernel; `KMM_MATCH_MATH=tf32` lets cuBLAS use TF32 tensor cores. Compressed to rank 32 or
less, one fused kernel computes the inner products and keeps the best atom, with no scratch
(`KMM_MATCH_FUSED=0` uses GEMM and reduction instead). Queued on the manager's
stream (a compressed match that computes its own basis waits once). Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_match(manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, rank, params, outputs, flags)
    check_status(unchecked_kmm_qmri_match(manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, rank, params, outputs, flags))
end

"""
Writes the compression basis of a dictionary (`ntr x natoms` complex float) into `basis`:
`ntr x rank` complex float (TR index fastest), the orthonormal basis of the dominant
rank-`rank` subspace of the atoms' TR space (1 <= rank <= ntr). Compute it once from the
whole dictionary or a representative sample of its atoms (a few thousand spread over the
parameter grid), then match every batch with `kmm_qmri_match_in_basis`. On CUDA: a
randomized range finder (3 power iterations whose products use TF32 tensor cores,
`KMM_BASIS_MATH=fp32` for FP32, `KMM_BASIS_ITERATIONS` for another count) and a
Rayleigh-Ritz step in FP32 by cuSOLVER; the call waits once, for the eigensolver's status
(for the Gram matrix where cuSOLVER is missing). Queued on the manager's stream otherwise.
Thread-safe.

Returns the status; `kmm_qmri_compression_basis` is the checked form.
"""
@inline function unchecked_kmm_qmri_compression_basis(manager, dictionary, ntr, natoms, rank, basis)
    fp = _fp_kmm_qmri_compression_basis[]
    fp == C_NULL && throw_missing(:kmm_qmri_compression_basis)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, UInt64, UInt32, KmmBuffer), manager, dictionary, ntr, natoms, rank, basis)
end
"""
Writes the compression basis of a dictionary (`ntr x natoms` complex float) into `basis`:
`ntr x rank` complex float (TR index fastest), the orthonormal basis of the dominant
rank-`rank` subspace of the atoms' TR space (1 <= rank <= ntr). Compute it once from the
whole dictionary or a representative sample of its atoms (a few thousand spread over the
parameter grid), then match every batch with `kmm_qmri_match_in_basis`. On CUDA: a
randomized range finder (3 power iterations whose products use TF32 tensor cores,
`KMM_BASIS_MATH=fp32` for FP32, `KMM_BASIS_ITERATIONS` for another count) and a
Rayleigh-Ritz step in FP32 by cuSOLVER; the call waits once, for the eigensolver's status
(for the Gram matrix where cuSOLVER is missing). Queued on the manager's stream otherwise.
Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_compression_basis(manager, dictionary, ntr, natoms, rank, basis)
    check_status(unchecked_kmm_qmri_compression_basis(manager, dictionary, ntr, natoms, rank, basis))
end

"""
`kmm_qmri_match` on the coordinates of atoms and signals in a given basis (`ntr x rank`
complex float with orthonormal columns, as `kmm_qmri_compression_basis` writes it): the
scores of every batch matched in one basis are comparable, so `KMM_MATCH_ACCUMULATE` keeps
the true best. The basis is read and checked first (the call then waits for the stream)
unless `flags` has `KMM_MATCH_SKIP_CHECKS`; a basis that is not orthonormal gives
`INVALID_ARGUMENT`. Thread-safe.

Returns the status; `kmm_qmri_match_in_basis` is the checked form.
"""
@inline function unchecked_kmm_qmri_match_in_basis(manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, basis, rank, params, outputs, flags)
    fp = _fp_kmm_qmri_match_in_basis[]
    fp == C_NULL && throw_missing(:kmm_qmri_match_in_basis)
    ccall(fp, KmmStatus, (KmmManager, KmmBuffer, UInt64, UInt64, UInt64, KmmBuffer, UInt64, KmmBuffer, UInt32, KmmBuffer, Ptr{KmmMatchOutputs}, UInt32), manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, basis, rank, params, outputs, flags)
end
"""
`kmm_qmri_match` on the coordinates of atoms and signals in a given basis (`ntr x rank`
complex float with orthonormal columns, as `kmm_qmri_compression_basis` writes it): the
scores of every batch matched in one basis are comparable, so `KMM_MATCH_ACCUMULATE` keeps
the true best. The basis is read and checked first (the call then waits for the stream)
unless `flags` has `KMM_MATCH_SKIP_CHECKS`; a basis that is not orthonormal gives
`INVALID_ARGUMENT`. Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_qmri_match_in_basis(manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, basis, rank, params, outputs, flags)
    check_status(unchecked_kmm_qmri_match_in_basis(manager, dictionary, ntr, natoms, atom_offset, signals, nvoxels, basis, rank, params, outputs, flags))
end

"""
Writes the handle of the default manager that `kmm_torch_malloc` uses for `device`, creating
it (default configuration, device `device`) if needed. Kmm owns it: do not destroy it.

Returns the status; `kmm_torch_manager` is the checked form.
"""
@inline function unchecked_kmm_torch_manager(device, out)
    fp = _fp_kmm_torch_manager[]
    fp == C_NULL && throw_missing(:kmm_torch_manager)
    ccall(fp, KmmStatus, (Int32, Ptr{KmmManager}), device, out)
end
"""
Writes the handle of the default manager that `kmm_torch_malloc` uses for `device`, creating
it (default configuration, device `device`) if needed. Kmm owns it: do not destroy it.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_torch_manager(device, out)
    check_status(unchecked_kmm_torch_manager(device, out))
end

"""
Chooses what `kmm_torch_malloc` does when memory runs out: `KMM_TORCH_OOM_ABORT` (default)
or `KMM_TORCH_OOM_NULL`.

Returns the status; `kmm_torch_set_oom_policy` is the checked form.
"""
@inline function unchecked_kmm_torch_set_oom_policy(policy)
    fp = _fp_kmm_torch_set_oom_policy[]
    fp == C_NULL && throw_missing(:kmm_torch_set_oom_policy)
    ccall(fp, KmmStatus, (UInt32,), policy)
end
"""
Chooses what `kmm_torch_malloc` does when memory runs out: `KMM_TORCH_OOM_ABORT` (default)
or `KMM_TORCH_OOM_NULL`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_torch_set_oom_policy(policy)
    check_status(unchecked_kmm_torch_set_oom_policy(policy))
end

"""
The allocation function of PyTorch's `CUDAPluggableAllocator`: `size` bytes of device memory
of `device`'s default Kmm manager, ready for work on `stream`. NULL for zero bytes. On failure
the policy of `kmm_torch_set_oom_policy` applies (default: message on stderr, then abort).
"""
@inline function kmm_torch_malloc(size, device, stream)
    fp = _fp_kmm_torch_malloc[]
    fp == C_NULL && throw_missing(:kmm_torch_malloc)
    ccall(fp, Ptr{Cvoid}, (Csize_t, Int32, Ptr{Cvoid}), size, device, stream)
end

"""
The free function of PyTorch's `CUDAPluggableAllocator`: frees memory from
`kmm_torch_malloc` after the work queued so far on `stream`. Unknown pointers and NULL are
ignored (the error is readable with `kmm_last_error`).
"""
@inline function kmm_torch_free(ptr, size, device, stream)
    fp = _fp_kmm_torch_free[]
    fp == C_NULL && throw_missing(:kmm_torch_free)
    ccall(fp, Cvoid, (Ptr{Cvoid}, Csize_t, Int32, Ptr{Cvoid}), ptr, size, device, stream)
end

"""
`Tensor.record_stream` for memory from `kmm_torch_malloc`: work on `stream` may use the
allocation at `ptr` (the storage's base address), so its free, and any move or trim of its
memory, waits for the work queued on `stream` by then. PyTorch's Python
`CUDAPluggableAllocator` registers no record-stream function, so there `record_stream` does
nothing; call this (Python: `kmm.torch.record_stream`), or register it from C++ with
`allocator->set_record_stream_fn([](void *p, cudaStream_t s) { kmm_torch_record_stream(p, s); })`.

Returns the status; `kmm_torch_record_stream` is the checked form.
"""
@inline function unchecked_kmm_torch_record_stream(ptr, stream)
    fp = _fp_kmm_torch_record_stream[]
    fp == C_NULL && throw_missing(:kmm_torch_record_stream)
    ccall(fp, KmmStatus, (Ptr{Cvoid}, Ptr{Cvoid}), ptr, stream)
end
"""
`Tensor.record_stream` for memory from `kmm_torch_malloc`: work on `stream` may use the
allocation at `ptr` (the storage's base address), so its free, and any move or trim of its
memory, waits for the work queued on `stream` by then. PyTorch's Python
`CUDAPluggableAllocator` registers no record-stream function, so there `record_stream` does
nothing; call this (Python: `kmm.torch.record_stream`), or register it from C++ with
`allocator->set_record_stream_fn([](void *p, cudaStream_t s) { kmm_torch_record_stream(p, s); })`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_torch_record_stream(ptr, stream)
    check_status(unchecked_kmm_torch_record_stream(ptr, stream))
end

"""
How many allocations of `kmm_torch_malloc` are live (for tests and leak checks).

Returns the status; `kmm_torch_live_allocations` is the checked form.
"""
@inline function unchecked_kmm_torch_live_allocations(out)
    fp = _fp_kmm_torch_live_allocations[]
    fp == C_NULL && throw_missing(:kmm_torch_live_allocations)
    ccall(fp, KmmStatus, (Ptr{UInt64},), out)
end
"""
How many allocations of `kmm_torch_malloc` are live (for tests and leak checks).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_torch_live_allocations(out)
    check_status(unchecked_kmm_torch_live_allocations(out))
end

"""
Starts recording every allocation, free, map, unmap, move, spill, restore, trim and failed allocation of the
manager (a trace already recording is stopped first; the last trace's records are dropped).
A start that fails (a file that cannot be made, a ring that cannot be reserved, a bad
argument, a file trace recording whose writing failed: its stop reports that) changes
nothing: a trace recording goes on, and an existing file at `path` is emptied only once the
start succeeds.
With `path` NULL the records go to rings of the last `capacity` records (0: 65,536; at most
`KMM_TRACE_MAX_RECORDS`): one per lane of the manager, so that threads sharing it record in
parallel, and one for the manager's own events (each reserves `capacity` x 64 bytes of
address space at the start, `KMM_ERROR_OUT_OF_MEMORY` where it cannot; pages are used as
records arrive);
read them, merged in time order, with `kmm_manager_trace_records` or `kmm_manager_trace_save`; else they are
written to the CSV file `path` as they happen (`capacity` is not used; `flags` may hold
`KMM_TRACE_RMM_ONLY`). A regular file that another manager's trace writes is refused
(`KMM_ERROR_INVALID_ARGUMENT`) until that trace stops or its manager's teardown ends (a
deferred destroy's may wait for its stream); the manager's own recording file may be named
again. Off by default; while off, tracing costs nothing measurable.

Returns the status; `kmm_manager_trace_start` is the checked form.
"""
@inline function unchecked_kmm_manager_trace_start(manager, capacity, path, flags)
    fp = _fp_kmm_manager_trace_start[]
    fp == C_NULL && throw_missing(:kmm_manager_trace_start)
    ccall(fp, KmmStatus, (KmmManager, UInt64, Ptr{Cchar}, UInt32), manager, capacity, path, flags)
end
"""
Starts recording every allocation, free, map, unmap, move, spill, restore, trim and failed allocation of the
manager (a trace already recording is stopped first; the last trace's records are dropped).
A start that fails (a file that cannot be made, a ring that cannot be reserved, a bad
argument, a file trace recording whose writing failed: its stop reports that) changes
nothing: a trace recording goes on, and an existing file at `path` is emptied only once the
start succeeds.
With `path` NULL the records go to rings of the last `capacity` records (0: 65,536; at most
`KMM_TRACE_MAX_RECORDS`): one per lane of the manager, so that threads sharing it record in
parallel, and one for the manager's own events (each reserves `capacity` x 64 bytes of
address space at the start, `KMM_ERROR_OUT_OF_MEMORY` where it cannot; pages are used as
records arrive);
read them, merged in time order, with `kmm_manager_trace_records` or `kmm_manager_trace_save`; else they are
written to the CSV file `path` as they happen (`capacity` is not used; `flags` may hold
`KMM_TRACE_RMM_ONLY`). A regular file that another manager's trace writes is refused
(`KMM_ERROR_INVALID_ARGUMENT`) until that trace stops or its manager's teardown ends (a
deferred destroy's may wait for its stream); the manager's own recording file may be named
again. Off by default; while off, tracing costs nothing measurable.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_trace_start(manager, capacity, path, flags)
    check_status(unchecked_kmm_manager_trace_start(manager, capacity, path, flags))
end

"""
Stops the trace; a file trace is flushed and closed (a write that failed while recording is
reported here). A ring's records stay readable until the next start. Without a trace
recording it does nothing.

Returns the status; `kmm_manager_trace_stop` is the checked form.
"""
@inline function unchecked_kmm_manager_trace_stop(manager)
    fp = _fp_kmm_manager_trace_stop[]
    fp == C_NULL && throw_missing(:kmm_manager_trace_stop)
    ccall(fp, KmmStatus, (KmmManager,), manager)
end
"""
Stops the trace; a file trace is flushed and closed (a write that failed while recording is
reported here). A ring's records stay readable until the next start. Without a trace
recording it does nothing.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_trace_stop(manager)
    check_status(unchecked_kmm_manager_trace_stop(manager))
end

"""
Copies the ring trace's records, oldest first (the rings merged in time order), into `out`
(`capacity` entries; the oldest ones when it is too small), and writes how many there are to
`*count` and, when `dropped` is not NULL, how many older ones the rings let go. `out` may be NULL when `capacity` is 0.
`KMM_ERROR_INVALID_ARGUMENT` when the manager has no ring trace.

Returns the status; `kmm_manager_trace_records` is the checked form.
"""
@inline function unchecked_kmm_manager_trace_records(manager, out, capacity, count, dropped)
    fp = _fp_kmm_manager_trace_records[]
    fp == C_NULL && throw_missing(:kmm_manager_trace_records)
    ccall(fp, KmmStatus, (KmmManager, Ptr{KmmTraceRecord}, Csize_t, Ptr{Csize_t}, Ptr{UInt64}), manager, out, capacity, count, dropped)
end
"""
Copies the ring trace's records, oldest first (the rings merged in time order), into `out`
(`capacity` entries; the oldest ones when it is too small), and writes how many there are to
`*count` and, when `dropped` is not NULL, how many older ones the rings let go. `out` may be NULL when `capacity` is 0.
`KMM_ERROR_INVALID_ARGUMENT` when the manager has no ring trace.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_trace_records(manager, out, capacity, count, dropped)
    check_status(unchecked_kmm_manager_trace_records(manager, out, capacity, count, dropped))
end

"""
Writes the ring trace's records to the CSV file `path` (RMM's columns first; `flags` may hold
`KMM_TRACE_RMM_ONLY`). `KMM_ERROR_INVALID_ARGUMENT` when the manager has no ring trace, the
file cannot be written, or a recording file trace (of any manager) writes it.

Returns the status; `kmm_manager_trace_save` is the checked form.
"""
@inline function unchecked_kmm_manager_trace_save(manager, path, flags)
    fp = _fp_kmm_manager_trace_save[]
    fp == C_NULL && throw_missing(:kmm_manager_trace_save)
    ccall(fp, KmmStatus, (KmmManager, Ptr{Cchar}, UInt32), manager, path, flags)
end
"""
Writes the ring trace's records to the CSV file `path` (RMM's columns first; `flags` may hold
`KMM_TRACE_RMM_ONLY`). `KMM_ERROR_INVALID_ARGUMENT` when the manager has no ring trace, the
file cannot be written, or a recording file trace (of any manager) writes it.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_trace_save(manager, path, flags)
    check_status(unchecked_kmm_manager_trace_save(manager, path, flags))
end

"""
The name of a `KmmTraceAction` as the CSV writes it ("allocate", "allocate failure", ...), or
"unknown". Static string; never NULL; do not free.
"""
@inline function kmm_trace_action_name(action)
    fp = _fp_kmm_trace_action_name[]
    fp == C_NULL && throw_missing(:kmm_trace_action_name)
    ccall(fp, Ptr{Cchar}, (UInt32,), action)
end

"""
Copies the map of the manager's memory of `kind` (a `KmmMemoryKind`) into `out`
(`capacity` entries; the first ones when it is too small) and writes how many segments it has
to `*count`: every chunk in address order, cut into its buffers' blocks and the free space
between them. `out` may be NULL when `capacity` is 0.

Returns the status; `kmm_manager_memory_map` is the checked form.
"""
@inline function unchecked_kmm_manager_memory_map(manager, kind, out, capacity, count)
    fp = _fp_kmm_manager_memory_map[]
    fp == C_NULL && throw_missing(:kmm_manager_memory_map)
    ccall(fp, KmmStatus, (KmmManager, UInt32, Ptr{KmmMapSegment}, Csize_t, Ptr{Csize_t}), manager, kind, out, capacity, count)
end
"""
Copies the map of the manager's memory of `kind` (a `KmmMemoryKind`) into `out`
(`capacity` entries; the first ones when it is too small) and writes how many segments it has
to `*count`: every chunk in address order, cut into its buffers' blocks and the free space
between them. `out` may be NULL when `capacity` is 0.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_memory_map(manager, kind, out, capacity, count)
    check_status(unchecked_kmm_manager_memory_map(manager, kind, out, capacity, count))
end

"""
Draws a figure (a `KmmFigure`) as SVG into `buf` as a NUL-terminated string, truncated to
`len` bytes, and writes the length the whole text needs (with its NUL) to `*needed` when
`needed` is not NULL; `buf` may be NULL when `len` is 0. The timeline needs a ring trace
(`KMM_ERROR_INVALID_ARGUMENT` without one).

Returns the status; `kmm_manager_figure_svg` is the checked form.
"""
@inline function unchecked_kmm_manager_figure_svg(manager, figure, buf, len, needed)
    fp = _fp_kmm_manager_figure_svg[]
    fp == C_NULL && throw_missing(:kmm_manager_figure_svg)
    ccall(fp, KmmStatus, (KmmManager, UInt32, Ptr{Cchar}, Csize_t, Ptr{Csize_t}), manager, figure, buf, len, needed)
end
"""
Draws a figure (a `KmmFigure`) as SVG into `buf` as a NUL-terminated string, truncated to
`len` bytes, and writes the length the whole text needs (with its NUL) to `*needed` when
`needed` is not NULL; `buf` may be NULL when `len` is 0. The timeline needs a ring trace
(`KMM_ERROR_INVALID_ARGUMENT` without one).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_manager_figure_svg(manager, figure, buf, len, needed)
    check_status(unchecked_kmm_manager_figure_svg(manager, figure, buf, len, needed))
end

end # module LibKmm
