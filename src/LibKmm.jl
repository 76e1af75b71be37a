# generated from gen/kmm.h by gen/generator.jl; do not edit
# Regenerate: julia gen/generator.jl   (CI: julia gen/generator.jl --check)

module LibKmm

using Libdl
import ..check_status

# constants
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
Bumped whenever a signature, a struct layout or a constant's meaning changes.
"""
const KMM_ABI_VERSION = 1
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

# structs (field order and types as in C; layout checked by test/bindings.jl)
"""
What `kmm_buffer_info` reports.
"""
struct KmmBufferInfo
    bytes::UInt64
    kind::UInt32
    pins::UInt32
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
    reserved::UInt32
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
are what callers asked for; "reserved" is what the manager holds from the device.
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
end

# function pointers, filled by load!
const _fp_kmm_version = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_abi_version = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_last_error = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_status_name = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_alloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_wrap = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_buffer_info = Ref{Ptr{Cvoid}}(C_NULL)
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
const _fp_kmm_config_default = Ref{Ptr{Cvoid}}(C_NULL)
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
const _fp_kmm_plugin_alloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_plugin_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_manager = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_set_oom_policy = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_malloc = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_free = Ref{Ptr{Cvoid}}(C_NULL)
const _fp_kmm_torch_live_allocations = Ref{Ptr{Cvoid}}(C_NULL)

"The names of every exported function of the header."
const FUNCTIONS = (:kmm_version, :kmm_abi_version, :kmm_last_error, :kmm_status_name, :kmm_buffer_alloc, :kmm_buffer_wrap, :kmm_buffer_free, :kmm_buffer_info, :kmm_buffer_map, :kmm_buffer_unmap, :kmm_host_register, :kmm_host_unregister, :kmm_copy_to_device, :kmm_copy_to_device_async, :kmm_copy_to_host, :kmm_copy_to_host_async, :kmm_copy_buffer, :kmm_fill, :kmm_config_default, :kmm_manager_create, :kmm_manager_destroy, :kmm_manager_synchronize, :kmm_manager_info, :kmm_manager_stats, :kmm_manager_reset_peaks, :kmm_manager_trim, :kmm_manager_summary, :kmm_manager_memory_info, :kmm_manager_wait_stream, :kmm_manager_signal_stream, :kmm_manager_record_event, :kmm_event_query, :kmm_event_wait, :kmm_event_destroy, :kmm_plugin_alloc, :kmm_plugin_free, :kmm_torch_manager, :kmm_torch_set_oom_policy, :kmm_torch_malloc, :kmm_torch_free, :kmm_torch_live_allocations)

"""
    load!(path) -> handle

Opens the library at `path` and resolves every function of the header (an error naming the
first missing symbol when the library lacks one).
"""
function load!(path::AbstractString)
    lib = Libdl.dlopen(path, Libdl.RTLD_LAZY | Libdl.RTLD_DEEPBIND)
    _fp_kmm_version[] = Libdl.dlsym(lib, :kmm_version)
    _fp_kmm_abi_version[] = Libdl.dlsym(lib, :kmm_abi_version)
    _fp_kmm_last_error[] = Libdl.dlsym(lib, :kmm_last_error)
    _fp_kmm_status_name[] = Libdl.dlsym(lib, :kmm_status_name)
    _fp_kmm_buffer_alloc[] = Libdl.dlsym(lib, :kmm_buffer_alloc)
    _fp_kmm_buffer_wrap[] = Libdl.dlsym(lib, :kmm_buffer_wrap)
    _fp_kmm_buffer_free[] = Libdl.dlsym(lib, :kmm_buffer_free)
    _fp_kmm_buffer_info[] = Libdl.dlsym(lib, :kmm_buffer_info)
    _fp_kmm_buffer_map[] = Libdl.dlsym(lib, :kmm_buffer_map)
    _fp_kmm_buffer_unmap[] = Libdl.dlsym(lib, :kmm_buffer_unmap)
    _fp_kmm_host_register[] = Libdl.dlsym(lib, :kmm_host_register)
    _fp_kmm_host_unregister[] = Libdl.dlsym(lib, :kmm_host_unregister)
    _fp_kmm_copy_to_device[] = Libdl.dlsym(lib, :kmm_copy_to_device)
    _fp_kmm_copy_to_device_async[] = Libdl.dlsym(lib, :kmm_copy_to_device_async)
    _fp_kmm_copy_to_host[] = Libdl.dlsym(lib, :kmm_copy_to_host)
    _fp_kmm_copy_to_host_async[] = Libdl.dlsym(lib, :kmm_copy_to_host_async)
    _fp_kmm_copy_buffer[] = Libdl.dlsym(lib, :kmm_copy_buffer)
    _fp_kmm_fill[] = Libdl.dlsym(lib, :kmm_fill)
    _fp_kmm_config_default[] = Libdl.dlsym(lib, :kmm_config_default)
    _fp_kmm_manager_create[] = Libdl.dlsym(lib, :kmm_manager_create)
    _fp_kmm_manager_destroy[] = Libdl.dlsym(lib, :kmm_manager_destroy)
    _fp_kmm_manager_synchronize[] = Libdl.dlsym(lib, :kmm_manager_synchronize)
    _fp_kmm_manager_info[] = Libdl.dlsym(lib, :kmm_manager_info)
    _fp_kmm_manager_stats[] = Libdl.dlsym(lib, :kmm_manager_stats)
    _fp_kmm_manager_reset_peaks[] = Libdl.dlsym(lib, :kmm_manager_reset_peaks)
    _fp_kmm_manager_trim[] = Libdl.dlsym(lib, :kmm_manager_trim)
    _fp_kmm_manager_summary[] = Libdl.dlsym(lib, :kmm_manager_summary)
    _fp_kmm_manager_memory_info[] = Libdl.dlsym(lib, :kmm_manager_memory_info)
    _fp_kmm_manager_wait_stream[] = Libdl.dlsym(lib, :kmm_manager_wait_stream)
    _fp_kmm_manager_signal_stream[] = Libdl.dlsym(lib, :kmm_manager_signal_stream)
    _fp_kmm_manager_record_event[] = Libdl.dlsym(lib, :kmm_manager_record_event)
    _fp_kmm_event_query[] = Libdl.dlsym(lib, :kmm_event_query)
    _fp_kmm_event_wait[] = Libdl.dlsym(lib, :kmm_event_wait)
    _fp_kmm_event_destroy[] = Libdl.dlsym(lib, :kmm_event_destroy)
    _fp_kmm_plugin_alloc[] = Libdl.dlsym(lib, :kmm_plugin_alloc)
    _fp_kmm_plugin_free[] = Libdl.dlsym(lib, :kmm_plugin_free)
    _fp_kmm_torch_manager[] = Libdl.dlsym(lib, :kmm_torch_manager)
    _fp_kmm_torch_set_oom_policy[] = Libdl.dlsym(lib, :kmm_torch_set_oom_policy)
    _fp_kmm_torch_malloc[] = Libdl.dlsym(lib, :kmm_torch_malloc)
    _fp_kmm_torch_free[] = Libdl.dlsym(lib, :kmm_torch_free)
    _fp_kmm_torch_live_allocations[] = Libdl.dlsym(lib, :kmm_torch_live_allocations)
    return lib
end

# functions
"""
Kmm's version, "major.minor.patch". Static string; never NULL; do not free.
"""
@inline function kmm_version()
    ccall(_fp_kmm_version[], Ptr{Cchar}, ())
end

"""
The ABI version of this library (`KMM_ABI_VERSION` of the header it was built with).
Bindings compare it with the header they were generated from.
"""
@inline function kmm_abi_version()
    ccall(_fp_kmm_abi_version[], UInt32, ())
end

"""
The message of the last failed call on this thread, naming the argument and the bound.
Never NULL ("" before any failure). Valid until the next failing Kmm call on this thread;
do not free. Successful calls leave it unchanged.
"""
@inline function kmm_last_error()
    ccall(_fp_kmm_last_error[], Ptr{Cchar}, ())
end

"""
The name of a status code ("KMM_ERROR_OUT_OF_MEMORY"), or "KMM_UNKNOWN_STATUS".
Static string; never NULL; do not free.
"""
@inline function kmm_status_name(status)
    ccall(_fp_kmm_status_name[], Ptr{Cchar}, (UInt32,), status)
end

"""
Allocates `bytes` of memory of `kind` (a `KmmMemoryKind`) and writes the buffer's handle to
`*out`. Zero bytes is valid (a buffer with no memory). On `KMM_ERROR_OUT_OF_MEMORY` the
manager has already synchronized and given its cached memory back once. Thread-safe.

Returns the status; `kmm_buffer_alloc` is the checked form.
"""
@inline function unchecked_kmm_buffer_alloc(manager, bytes, kind, out)
    ccall(_fp_kmm_buffer_alloc[], KmmStatus, (KmmManager, UInt64, UInt32, Ptr{KmmBuffer}), manager, bytes, kind, out)
end
"""
Allocates `bytes` of memory of `kind` (a `KmmMemoryKind`) and writes the buffer's handle to
`*out`. Zero bytes is valid (a buffer with no memory). On `KMM_ERROR_OUT_OF_MEMORY` the
manager has already synchronized and given its cached memory back once. Thread-safe.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_alloc(manager, bytes, kind, out)
    check_status(unchecked_kmm_buffer_alloc(manager, bytes, kind, out))
end

"""
Makes a buffer of memory allocated elsewhere (`ptr`, `bytes` of `kind`). With `KMM_ADOPT`
Kmm frees the memory when the buffer is freed; with `KMM_BORROW` the caller keeps it and
must keep it valid until the buffer is freed and the manager synchronized.

Returns the status; `kmm_buffer_wrap` is the checked form.
"""
@inline function unchecked_kmm_buffer_wrap(manager, ptr, bytes, kind, ownership, out)
    ccall(_fp_kmm_buffer_wrap[], KmmStatus, (KmmManager, Ptr{Cvoid}, UInt64, UInt32, UInt32, Ptr{KmmBuffer}), manager, ptr, bytes, kind, ownership, out)
end
"""
Makes a buffer of memory allocated elsewhere (`ptr`, `bytes` of `kind`). With `KMM_ADOPT`
Kmm frees the memory when the buffer is freed; with `KMM_BORROW` the caller keeps it and
must keep it valid until the buffer is freed and the manager synchronized.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_wrap(manager, ptr, bytes, kind, ownership, out)
    check_status(unchecked_kmm_buffer_wrap(manager, ptr, bytes, kind, ownership, out))
end

"""
Frees a buffer. Stream-ordered and non-blocking: work already queued on the manager's stream
still sees the memory, and later work may reuse it. Callable from any thread and from
finalizers. A mapped buffer is `KMM_ERROR_BUFFER_MAPPED` unless `flags` has `KMM_FREE_FORCE`.
A second free of the same handle is `KMM_ERROR_INVALID_HANDLE`.

Returns the status; `kmm_buffer_free` is the checked form.
"""
@inline function unchecked_kmm_buffer_free(manager, buffer, flags)
    ccall(_fp_kmm_buffer_free[], KmmStatus, (KmmManager, KmmBuffer, UInt32), manager, buffer, flags)
end
"""
Frees a buffer. Stream-ordered and non-blocking: work already queued on the manager's stream
still sees the memory, and later work may reuse it. Callable from any thread and from
finalizers. A mapped buffer is `KMM_ERROR_BUFFER_MAPPED` unless `flags` has `KMM_FREE_FORCE`.
A second free of the same handle is `KMM_ERROR_INVALID_HANDLE`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_free(manager, buffer, flags)
    check_status(unchecked_kmm_buffer_free(manager, buffer, flags))
end

"""
Writes the buffer's size, kind and pin count to `*out`.

Returns the status; `kmm_buffer_info` is the checked form.
"""
@inline function unchecked_kmm_buffer_info(manager, buffer, out)
    ccall(_fp_kmm_buffer_info[], KmmStatus, (KmmManager, KmmBuffer, Ptr{KmmBufferInfo}), manager, buffer, out)
end
"""
Writes the buffer's size, kind and pin count to `*out`.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_info(manager, buffer, out)
    check_status(unchecked_kmm_buffer_info(manager, buffer, out))
end

"""
Pins the buffer and writes its address to `*ptr`: a device pointer (`CUdeviceptr`) for
device memory, a host pointer for pinned memory, 0 for an empty buffer. The address stays
valid until the matching `kmm_buffer_unmap`. Work on other streams that uses it must be
ordered with the manager's stream (`kmm_manager_wait_stream` / `kmm_manager_signal_stream`).

Returns the status; `kmm_buffer_map` is the checked form.
"""
@inline function unchecked_kmm_buffer_map(manager, buffer, ptr)
    ccall(_fp_kmm_buffer_map[], KmmStatus, (KmmManager, KmmBuffer, Ptr{UInt64}), manager, buffer, ptr)
end
"""
Pins the buffer and writes its address to `*ptr`: a device pointer (`CUdeviceptr`) for
device memory, a host pointer for pinned memory, 0 for an empty buffer. The address stays
valid until the matching `kmm_buffer_unmap`. Work on other streams that uses it must be
ordered with the manager's stream (`kmm_manager_wait_stream` / `kmm_manager_signal_stream`).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_buffer_map(manager, buffer, ptr)
    check_status(unchecked_kmm_buffer_map(manager, buffer, ptr))
end

"""
Drops one pin taken by `kmm_buffer_map`. Unmapping an unmapped buffer is
`KMM_ERROR_INVALID_ARGUMENT`.

Returns the status; `kmm_buffer_unmap` is the checked form.
"""
@inline function unchecked_kmm_buffer_unmap(manager, buffer)
    ccall(_fp_kmm_buffer_unmap[], KmmStatus, (KmmManager, KmmBuffer), manager, buffer)
end
"""
Drops one pin taken by `kmm_buffer_map`. Unmapping an unmapped buffer is
`KMM_ERROR_INVALID_ARGUMENT`.

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
    ccall(_fp_kmm_host_register[], KmmStatus, (KmmManager, Ptr{Cvoid}, UInt64), manager, ptr, bytes)
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
    ccall(_fp_kmm_host_unregister[], KmmStatus, (KmmManager, Ptr{Cvoid}), manager, ptr)
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
    ccall(_fp_kmm_copy_to_device[], KmmStatus, (KmmManager, KmmBuffer, UInt64, Ptr{Cvoid}, UInt64), manager, dst, dst_offset, src, bytes)
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
    ccall(_fp_kmm_copy_to_device_async[], KmmStatus, (KmmManager, KmmBuffer, UInt64, Ptr{Cvoid}, UInt64, Ptr{KmmEvent}), manager, dst, dst_offset, src, bytes, event)
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
    ccall(_fp_kmm_copy_to_host[], KmmStatus, (KmmManager, Ptr{Cvoid}, KmmBuffer, UInt64, UInt64), manager, dst, src, src_offset, bytes)
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
    ccall(_fp_kmm_copy_to_host_async[], KmmStatus, (KmmManager, Ptr{Cvoid}, KmmBuffer, UInt64, UInt64, Ptr{KmmEvent}), manager, dst, src, src_offset, bytes, event)
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
Copies `bytes` between buffers of one manager or of two managers of the same backend.
Stream-ordered (returns once queued): queued on the destination's stream after the source's
work so far, and the source's later work waits for it. Overlapping ranges of one buffer are
`KMM_ERROR_INVALID_ARGUMENT`.

Returns the status; `kmm_copy_buffer` is the checked form.
"""
@inline function unchecked_kmm_copy_buffer(dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes)
    ccall(_fp_kmm_copy_buffer[], KmmStatus, (KmmManager, KmmBuffer, UInt64, KmmManager, KmmBuffer, UInt64, UInt64), dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes)
end
"""
Copies `bytes` between buffers of one manager or of two managers of the same backend.
Stream-ordered (returns once queued): queued on the destination's stream after the source's
work so far, and the source's later work waits for it. Overlapping ranges of one buffer are
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
    ccall(_fp_kmm_fill[], KmmStatus, (KmmManager, KmmBuffer, UInt64, UInt64, Ptr{Cvoid}, Csize_t), manager, buffer, offset, bytes, pattern, pattern_size)
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
Fills `*config` with the defaults: auto backend, device 0, pool mode with the binned
suballocator, 256-byte alignment, 32 MiB chunks, no limits, everything cached.

Returns the status; `kmm_config_default` is the checked form.
"""
@inline function unchecked_kmm_config_default(config)
    ccall(_fp_kmm_config_default[], KmmStatus, (Ptr{KmmConfig},), config)
end
"""
Fills `*config` with the defaults: auto backend, device 0, pool mode with the binned
suballocator, 256-byte alignment, 32 MiB chunks, no limits, everything cached.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_config_default(config)
    check_status(unchecked_kmm_config_default(config))
end

"""
Creates a manager with its own stream and pools. `config` may be NULL for the defaults.
On success writes the handle to `*out`; destroy it with `kmm_manager_destroy`.
Many managers may coexist, on one device or several. Thread-safe.

Returns the status; `kmm_manager_create` is the checked form.
"""
@inline function unchecked_kmm_manager_create(config, out)
    ccall(_fp_kmm_manager_create[], KmmStatus, (Ptr{KmmConfig}, Ptr{KmmManager}), config, out)
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
thread, so the call never waits (for finalizers). Thread-safe; waits for calls in flight on
the same manager.

Returns the status; `kmm_manager_destroy` is the checked form.
"""
@inline function unchecked_kmm_manager_destroy(manager, flags)
    ccall(_fp_kmm_manager_destroy[], KmmStatus, (KmmManager, UInt32), manager, flags)
end
"""
Destroys a manager: waits for its stream, frees every buffer and event it still holds and
gives all its memory back. Later calls with its handles return `KMM_ERROR_INVALID_HANDLE`.
With `KMM_DESTROY_DEFERRED` the handle dies at once and the teardown runs on a background
thread, so the call never waits (for finalizers). Thread-safe; waits for calls in flight on
the same manager.

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
    ccall(_fp_kmm_manager_synchronize[], KmmStatus, (KmmManager,), manager)
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
    ccall(_fp_kmm_manager_info[], KmmStatus, (KmmManager, Ptr{KmmManagerInfo}), manager, out)
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
    ccall(_fp_kmm_manager_stats[], KmmStatus, (KmmManager, UInt32, Ptr{KmmMemoryStats}), manager, kind, out)
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
    ccall(_fp_kmm_manager_reset_peaks[], KmmStatus, (KmmManager,), manager)
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
    ccall(_fp_kmm_manager_trim[], KmmStatus, (KmmManager, UInt64), manager, keep_bytes)
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
    ccall(_fp_kmm_manager_summary[], KmmStatus, (KmmManager, Ptr{Cchar}, Csize_t, Ptr{Csize_t}), manager, buf, len, needed)
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
    ccall(_fp_kmm_manager_memory_info[], KmmStatus, (KmmManager, Ptr{UInt64}, Ptr{UInt64}), manager, free, total)
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
    ccall(_fp_kmm_manager_wait_stream[], KmmStatus, (KmmManager, UInt64), manager, stream)
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
    ccall(_fp_kmm_manager_signal_stream[], KmmStatus, (KmmManager, UInt64), manager, stream)
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
    ccall(_fp_kmm_manager_record_event[], KmmStatus, (KmmManager, Ptr{KmmEvent}), manager, out)
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
    ccall(_fp_kmm_event_query[], KmmStatus, (KmmManager, KmmEvent, Ptr{Bool}), manager, event, done)
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
    ccall(_fp_kmm_event_wait[], KmmStatus, (KmmManager, KmmEvent), manager, event)
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
    ccall(_fp_kmm_event_destroy[], KmmStatus, (KmmManager, KmmEvent), manager, event)
end
"""
Destroys an event; work already queued is unaffected.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_event_destroy(manager, event)
    check_status(unchecked_kmm_event_destroy(manager, event))
end

"""
For allocator plugins: allocates `bytes` of `kind` memory, maps it, and writes the buffer's
handle to `*buffer` and its address to `*ptr` (0 for zero bytes). `stream` is the raw stream
the memory will be used on (a `CUstream`; 0 is the legacy default stream on CUDA and means
the manager's own stream on the host backend); the memory is ready for work queued on it.
Free with `kmm_plugin_free` (the buffer stays mapped until then).

Returns the status; `kmm_plugin_alloc` is the checked form.
"""
@inline function unchecked_kmm_plugin_alloc(manager, bytes, kind, stream, buffer, ptr)
    ccall(_fp_kmm_plugin_alloc[], KmmStatus, (KmmManager, UInt64, UInt32, UInt64, Ptr{KmmBuffer}, Ptr{UInt64}), manager, bytes, kind, stream, buffer, ptr)
end
"""
For allocator plugins: allocates `bytes` of `kind` memory, maps it, and writes the buffer's
handle to `*buffer` and its address to `*ptr` (0 for zero bytes). `stream` is the raw stream
the memory will be used on (a `CUstream`; 0 is the legacy default stream on CUDA and means
the manager's own stream on the host backend); the memory is ready for work queued on it.
Free with `kmm_plugin_free` (the buffer stays mapped until then).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_plugin_alloc(manager, bytes, kind, stream, buffer, ptr)
    check_status(unchecked_kmm_plugin_alloc(manager, bytes, kind, stream, buffer, ptr))
end

"""
For allocator plugins: frees a buffer from `kmm_plugin_alloc` (mapped or not) after the work
queued so far on `stream` (the stream that last used it). Non-blocking; callable from any
thread and from finalizers.

Returns the status; `kmm_plugin_free` is the checked form.
"""
@inline function unchecked_kmm_plugin_free(manager, buffer, stream)
    ccall(_fp_kmm_plugin_free[], KmmStatus, (KmmManager, KmmBuffer, UInt64), manager, buffer, stream)
end
"""
For allocator plugins: frees a buffer from `kmm_plugin_alloc` (mapped or not) after the work
queued so far on `stream` (the stream that last used it). Non-blocking; callable from any
thread and from finalizers.

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_plugin_free(manager, buffer, stream)
    check_status(unchecked_kmm_plugin_free(manager, buffer, stream))
end

"""
Writes the handle of the default manager that `kmm_torch_malloc` uses for `device`, creating
it (default configuration, device `device`) if needed. Kmm owns it: do not destroy it.

Returns the status; `kmm_torch_manager` is the checked form.
"""
@inline function unchecked_kmm_torch_manager(device, out)
    ccall(_fp_kmm_torch_manager[], KmmStatus, (Int32, Ptr{KmmManager}), device, out)
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
    ccall(_fp_kmm_torch_set_oom_policy[], KmmStatus, (UInt32,), policy)
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
    ccall(_fp_kmm_torch_malloc[], Ptr{Cvoid}, (Csize_t, Int32, Ptr{Cvoid}), size, device, stream)
end

"""
The free function of PyTorch's `CUDAPluggableAllocator`: frees memory from
`kmm_torch_malloc` after the work queued so far on `stream`. Unknown pointers and NULL are
ignored (the error is readable with `kmm_last_error`).
"""
@inline function kmm_torch_free(ptr, size, device, stream)
    ccall(_fp_kmm_torch_free[], Cvoid, (Ptr{Cvoid}, Csize_t, Int32, Ptr{Cvoid}), ptr, size, device, stream)
end

"""
How many allocations of `kmm_torch_malloc` are live (for tests and leak checks).

Returns the status; `kmm_torch_live_allocations` is the checked form.
"""
@inline function unchecked_kmm_torch_live_allocations(out)
    ccall(_fp_kmm_torch_live_allocations[], KmmStatus, (Ptr{UInt64},), out)
end
"""
How many allocations of `kmm_torch_malloc` are live (for tests and leak checks).

Throws a `KmmError` unless the status is `KMM_OK`.
"""
@inline function kmm_torch_live_allocations(out)
    check_status(unchecked_kmm_torch_live_allocations(out))
end

end # module LibKmm
