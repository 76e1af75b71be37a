# KmmStorage: one libkmm buffer, owned by Julia. Arrays, views and reshapes share it; its
# finalizer hands the handle to libkmm's non-blocking free and never blocks, switches tasks or
# throws.

mutable struct KmmStorage
    manager::KmmManager     # keeps the manager alive as long as the buffer
    handle::UInt64          # 0 once freed
    bytes::Int
    kind::UInt32
    hostptr::Ptr{Cvoid}     # pinned storages stay mapped: their host address, else C_NULL
    function KmmStorage(m::KmmManager, handle::UInt64, bytes::Int, kind::UInt32)
        s = new(m, handle, bytes, kind, C_NULL)
        Threads.atomic_add!(_live_bytes, bytes)
        finalizer(finalize_storage, s)
        return s
    end
end

"Counts failures inside finalizers (they cannot throw or print); see `Kmm.finalizer_failures()`."
const _finalizer_failures = Threads.Atomic{Int}(0)

"""
    Kmm.finalizer_failures() -> Int

How many frees from finalizers libkmm refused for a reason other than a manager that was
already gone (which is expected and ignored). Zero unless something is wrong.
"""
finalizer_failures() = _finalizer_failures[]

# A storage's handle is taken with `claim_handle!` (manager.jl): of two `unsafe_free!`s, or one
# and the finalizer, only one frees it and counts its bytes.
function finalize_storage(s::KmmStorage)
    h = claim_handle!(s)
    mh = s.manager.handle
    h == 0 || Threads.atomic_sub!(_live_bytes, s.bytes)
    if h != 0 && mh != 0
        st = LibKmm.unchecked_kmm_buffer_free(mh, h, LibKmm.KMM_FREE_FORCE)
        # INVALID_HANDLE: the manager was destroyed (or is being) in the same collection
        if st != LibKmm.KMM_OK && st != LibKmm.KMM_ERROR_INVALID_HANDLE
            Threads.atomic_add!(_finalizer_failures, 1)
        end
    end
    return nothing
end

@noinline throw_freed() = throw_kmm_error(LibKmm.KMM_ERROR_INVALID_HANDLE,
                                          "the array has been freed (unsafe_free!)")
@noinline throw_manager_closed() = throw_kmm_error(LibKmm.KMM_ERROR_INVALID_HANDLE,
                                                   "the array's manager has been closed")

"(manager handle, buffer handle) of a live storage, or a clear `KmmError`."
@inline function handles(s::KmmStorage)
    h = s.handle
    h == 0 && throw_freed()
    mh = s.manager.handle
    mh == 0 && throw_manager_closed()
    return (mh, h)
end

"""
After a handle was claimed (an explicit free of memory the CPU reads and writes in place, a
`close`): lets every other thread finish an access to that memory it is in the middle of. An
access checks the handles and then reads or writes with no safepoint in between (no allocation,
a plain `ccall` for a copy), so once a collection, which stops every thread at a safepoint, has
run, no thread is past its check with the old handle: later accesses see it claimed and throw.
One thread: no other thread can be there.
"""
quiesce_cpu_access() = Threads.nthreads() > 1 ? GC.gc(false) : nothing

function free!(s::KmmStorage; cpu_visible::Bool = false)
    h = claim_handle!(s)
    h == 0 && return nothing
    cpu_visible && quiesce_cpu_access()   # (a finalizer's free: no other thread holds `s`)
    s.hostptr = C_NULL
    Threads.atomic_sub!(_live_bytes, s.bytes)
    mh = s.manager.handle
    mh == 0 && return nothing   # the manager's destruction freed it
    st = LibKmm.unchecked_kmm_buffer_free(mh, h, LibKmm.KMM_FREE_FORCE)
    # A `close` on another thread took the manager's handle after it was read: its destroy
    # frees the buffer, as if the manager had been closed first.
    st == LibKmm.KMM_OK || (st == LibKmm.KMM_ERROR_INVALID_HANDLE && s.manager.handle == 0) ||
        throw_kmm_error(st)
    return nothing
end

# Julia's GC does not see device memory. Kmm.jl counts the bytes of live storages (allocations
# minus frees, explicit or by finalizer); when they have grown by GC_INTERVAL_BYTES since the
# last collection it triggered, a quick collection runs so that dropped arrays give their memory
# back (as CUDA.jl does). Explicit frees keep the count flat, so they never trigger one.
"""
    Kmm.GC_INTERVAL_BYTES[]

Growth of live Kmm.jl memory (bytes) after which an allocation first runs `GC.gc(false)`, so
that unreachable arrays are freed (default 1 GiB). Smaller keeps less dropped memory reserved,
at the price of more collections, tens of microseconds each: a dropped 1 MiB array cost 238 ns
at 256 MiB and 168 ns at 1 GiB (host backend, finalizer path of bench/julia_alloc.jl).
"""
const GC_INTERVAL_BYTES = Ref{Int}(2^30)
const _live_bytes = Threads.Atomic{Int}(0)
const _live_bytes_after_gc = Threads.Atomic{Int}(0)

@inline function maybe_collect(bytes::Int)
    live, base = _live_bytes[], _live_bytes_after_gc[]
    # Frees since the last collection lowered the live bytes: growth counts from there (else a
    # collection after a large peak waited for the next growth past that peak).
    live < base && (_live_bytes_after_gc[] = base = live)
    if live + bytes - base > GC_INTERVAL_BYTES[]
        GC.gc(false)
        _live_bytes_after_gc[] = _live_bytes[]
    end
end

"""
Allocates a buffer of `bytes` of `kind`. On out of memory: `GC.gc(false)`, `GC.gc(true)`,
`trim!`, retrying after each; then a `KmmOutOfMemoryError` with the manager's memory status.
"""
function alloc_storage(m::KmmManager, bytes::Int, kind::UInt32)
    bytes >= 0 || throw(ArgumentError("negative size $bytes"))
    maybe_collect(bytes)
    out = Ref{UInt64}(0)
    alloc() = GC.@preserve m @gcsafe LibKmm.unchecked_kmm_buffer_alloc(handle(m), UInt64(bytes), kind, out)
    st = alloc()
    st == LibKmm.KMM_OK || retry_out_of_memory(alloc, st, m, bytes)
    KmmStorage(m, out[], bytes, kind)
end

"""
Checks the status of `call()`, a libkmm call on the memory of `s` (a copy, a fill, a map). Such a
call brings a spilled buffer back to the device first, which takes device memory as an
allocation does: out of memory is retried as `alloc_storage` retries it.
"""
function check_restoring(call, s::KmmStorage)
    st = call()
    st == LibKmm.KMM_OK || retry_out_of_memory(call, st, s.manager, s.bytes)
    nothing
end

# A copy between two storages, either of which may need restoring (libkmm restores the
# destination first): out of memory is retried on the source's manager when the destination is
# back and the source stayed spilled (its restore failed), else on the destination's, and
# reported with that storage's bytes and manager.
function check_restoring(call, dest::KmmStorage, src::KmmStorage)
    st = call()
    st == LibKmm.KMM_OK && return nothing
    failed = st == LibKmm.KMM_ERROR_OUT_OF_MEMORY && src !== dest && !is_spilled(dest) && is_spilled(src) ? src : dest
    retry_out_of_memory(call, st, failed.manager, failed.bytes)
    nothing
end

"""
After `call()` (needing `bytes` of `m`'s memory) returned the status `st`: throws unless it is out
of memory; else runs `GC.gc(false)`, `GC.gc(true)` and `trim!`, retrying after each, and returns
once a retry succeeds; then a `KmmOutOfMemoryError` with the manager's memory status. Its figures
are the last retry's, read with that status (a collection may have freed buffers meanwhile); the
first failure's `tried:` line follows them, since that call climbed libkmm's whole ladder (what it
released, moved and spilled), where the retries after it find that done.
"""
function retry_out_of_memory(call, st::UInt32, m::KmmManager, bytes::Int)
    st == LibKmm.KMM_ERROR_OUT_OF_MEMORY || throw_kmm_error(st)
    first = last_error_message()
    for step in 1:3
        if step == 1
            GC.gc(false)
        elseif step == 2
            GC.gc(true)
        else
            trim!(m, 0)
        end
        st = call()
        st == LibKmm.KMM_OK && return nothing
        st == LibKmm.KMM_ERROR_OUT_OF_MEMORY || throw_kmm_error(st)
    end
    msg = last_error_message()
    status = memory_status(m)
    msg *= "\n  in Julia: GC.gc(false), GC.gc(true) and trim!(manager, 0), each followed by a retry that ran out of memory too (the figures above are the last retry's)"
    for line in split(first, '\n')
        startswith(line, "  tried:") && (msg *= "\n  the first try " * lstrip(line))
    end
    throw(KmmOutOfMemoryError(bytes, msg, status))
end

"Pins the buffer and returns its address (device pointer, or host pointer for pinned memory)."
function map_storage(s::KmmStorage)
    mh, h = handles(s)
    out = Ref{UInt64}(0)
    # It may wait for a compaction's copies to the buffer's new place.
    check_restoring(s) do
        GC.@preserve s @gcsafe LibKmm.unchecked_kmm_buffer_map(mh, h, out)
    end
    out[]
end

"""
    record_stream(s::KmmStorage, stream::UInt64)

Records that work on the raw `stream` may use the storage's memory (`kmm_buffer_record_stream`):
its free, a move and a trim wait for the work queued on that stream up to the free.
"""
function record_stream(s::KmmStorage, stream::UInt64)
    mh, h = handles(s)
    GC.@preserve s LibKmm.kmm_buffer_record_stream(mh, h, stream)
    nothing
end

"Drops one pin taken by `map_storage`; never throws (used by finalizers of views)."
function unmap_storage(s::KmmStorage)
    h = s.handle
    mh = s.manager.handle
    (h == 0 || mh == 0) && return LibKmm.KMM_OK
    LibKmm.unchecked_kmm_buffer_unmap(mh, h)
end
