# CUDA.jl interop (package extension, Julia >= 1.9, loaded when CUDA and Adapt are).
#
# Written against CUDA.jl's documented API (`unsafe_wrap(CuArray, ptr, dims; own = false)`,
# `CUDA.stream()`, `Adapt.adapt_storage`, `CUDA.KernelAdaptor`). It cannot run on machines
# without a GPU and Julia >= 1.9, so the test suite does not exercise it; see
# docs/julia-cuda-interop.md.
module KmmCUDAExt

using Kmm
using Kmm: LibKmm, KmmArray, KmmManager
using CUDA
using Adapt

raw_stream(s::CuStream) = UInt64(UInt(s.handle))

Kmm.wait_stream(m::KmmManager, s::CuStream) = Kmm.wait_stream(m, raw_stream(s))
Kmm.signal_stream(m::KmmManager, s::CuStream) = Kmm.signal_stream(m, raw_stream(s))

check_cuda(x::KmmArray) = Kmm.backend(Kmm.manager(x)) == :cuda ||
    throw(ArgumentError("CuArray(x) needs a KmmArray of a manager on the CUDA backend"))

"""
    CuArray(x::KmmArray)

A zero-copy `CuArray` over `x`'s device memory. While the view lives it keeps `x` alive and
pinned (mapped), so Kmm never moves or frees the memory under it. CUDA.jl's task stream is made
to wait for the manager's stream; after CUDA work on the view, call
`Kmm.wait_stream(Kmm.manager(x), CUDA.stream())` before Kmm works on `x` again. When the view
dies, the manager's stream waits for the work queued on that task stream so far before the pin
is dropped, so a later move (compaction) or free of `x` is ordered after it.
"""
function CUDA.CuArray(x::KmmArray{T,N}) where {T,N}
    Kmm.kind(x) == :device ||
        throw(ArgumentError("CuArray(x) needs device memory, not kind $(Kmm.kind(x))"))
    check_cuda(x)
    m = Kmm.manager(x)
    base = Kmm.map_storage(x.storage)                       # pin: the address stays valid
    ptr = CuPtr{T}(base + x.offset)
    c = unsafe_wrap(CuArray, ptr, size(x); own = false)
    s = CUDA.stream()
    # the closure holds x and s: x outlives the view; the pin is dropped when the view dies
    finalizer(_ -> (release_view(x, s); nothing), c)
    Kmm.signal_stream(m, s)                                # CUDA's stream waits for Kmm's work
    Kmm.record_stream(x.storage, raw_stream(s))            # x's free waits for CUDA's work too
    c
end

# A finalizer's work: never throws (a closed manager just has no stream to order).
function release_view(x::KmmArray, s::CuStream)
    mh = x.storage.manager.handle
    mh == 0 || LibKmm.unchecked_kmm_manager_wait_stream(mh, raw_stream(s))
    Kmm.unmap_storage(x.storage)
end

"""
    KmmArray(c::CuArray; manager = Kmm.default_manager(), kind = :device)

A copy of `c` in Kmm's pool (device to device, ordered between CUDA.jl's stream and the
manager's stream).
"""
function Kmm.KmmArray(c::CuArray{T,N}; manager::KmmManager = Kmm.default_manager(),
                      kind::Symbol = :device) where {T,N}
    x = KmmArray{T,N}(undef, size(c); manager = manager, kind = kind)
    if !isempty(c)
        v = CuArray(x)                                     # CUDA's stream waits for the allocation
        copyto!(v, c)                                      # queued on CUDA.stream()
        Kmm.wait_stream(manager, CUDA.stream())            # Kmm's later work waits for the copy
        finalize(v)                                        # drop the pin now
    end
    x
end

# @cuda kernels take KmmArrays: they are converted through the zero-copy view.
Adapt.adapt_storage(::CUDA.KernelAdaptor, x::KmmArray) =
    Adapt.adapt_storage(CUDA.KernelAdaptor(), CuArray(x))

end # module KmmCUDAExt
