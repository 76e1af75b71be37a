# CUDA.jl interop (package extension, Julia >= 1.9, loaded when CUDA and Adapt are).
#
# Written against CUDA.jl's documented API (`unsafe_wrap(CuArray, ptr, dims; own = false)`,
# `CUDA.stream()`, `CUDA.device()`, `CUDA.deviceid`, `Adapt.adapt_storage`, Base's broadcasting
# interface) and names CUDA.jl does not export: `CUDA.CuArrayStyle` (its broadcast style) and
# its kernel-argument adaptor (`CUDA.KernelAdaptor` from 5.2, `CUDA.Adaptor` before). It cannot
# run on machines without a GPU and Julia >= 1.9; test/ext.jl runs it against stand-ins. See
# docs/julia-cuda-interop.md.
module KmmCUDAExt

using Kmm
using Kmm: LibKmm, KmmArray, KmmManager, KmmStorage
using CUDA
using Adapt

raw_stream(s::CuStream) = UInt64(UInt(s.handle))

Kmm.wait_stream(m::KmmManager, s::CuStream) = Kmm.wait_stream(m, raw_stream(s))
Kmm.signal_stream(m::KmmManager, s::CuStream) = Kmm.signal_stream(m, raw_stream(s))

on_cuda(x::KmmArray) = Kmm.backend(Kmm.manager(x)) == :cuda
"Whether CUDA.jl can work on `a` in place: a CuArray, or device memory of a CUDA-backend manager."
usable(x::KmmArray) = Kmm.kind(x) == :device && on_cuda(x)
usable(::CuArray) = true
usable(_) = false

function check_view(x::KmmArray)
    Kmm.kind(x) == :device ||
        throw(ArgumentError("CuArray(x) needs device memory, not kind $(Kmm.kind(x))"))
    on_cuda(x) ||
        throw(ArgumentError("CuArray(x) needs a KmmArray of a manager on the CUDA backend"))
    # CUDA.jl tags a wrapped pointer with its current device's context and works on that
    # device's task stream: both must be the manager's.
    d, current = Kmm.device(Kmm.manager(x)), CUDA.deviceid(CUDA.device())
    d == current || throw(ArgumentError(
        "CuArray(x): x lives on device $d, CUDA.jl's current device is $current; call CUDA.device!($d) first"))
end

"A zero-copy CuArray over `base + x.offset` (device memory of `x`), or a new empty one for an empty `x` (Kmm gives an empty buffer address 0, which `unsafe_wrap` refuses)."
wrap(x::KmmArray{T,N}, base::UInt64) where {T,N} =
    isempty(x) ? CuArray{T,N}(undef, size(x)) :
                 unsafe_wrap(CuArray, CuPtr{T}(base + x.offset), size(x); own = false)

# ---- the pin: a storage viewed by CuArray(x) stays mapped until it is freed -----------------
#
# Arrays CUDA.jl derives from a view (reshape, vec, contiguous views, the CuDeviceArray of an
# @cuda argument) do not refer to the KmmArray, so no wrapper's death can tell when CUDA.jl is
# done with the memory. The storage is therefore mapped once, on its first view, and stays mapped
# (never moved by compaction) until it is freed: by its finalizer or `unsafe_free!`, whose FORCE
# free drops the pin and is ordered after the work queued on every recorded task stream.

"A recorded task stream, kept alive until every storage that recorded it has been freed (the free records an event on it)."
mutable struct HeldStream
    stream::CuStream
    users::Threads.Atomic{Int}     # storages that recorded it, not yet freed
end

"A storage's pin: its device address (valid until the free) and the streams recorded on it."
mutable struct Pin
    addr::UInt64
    streams::Vector{HeldStream}
end

const LOCK = ReentrantLock()                    # taken by normal code only, never by finalizers
const PINS = WeakKeyDict{KmmStorage,Pin}()      # weak: a pin never keeps its storage alive
const HELD = Dict{UInt64,HeldStream}()          # by raw stream handle

# The storage's own finalizer and this one run in either order; whichever comes first frees the
# buffer (one claim per storage), so the streams are let go only after the free has used them.
struct UnpinAtFree
    pin::Pin
end
function (u::UnpinAtFree)(s::KmmStorage)
    Kmm.finalize_storage(s)
    foreach(h -> Threads.atomic_sub!(h.users, 1), u.pin.streams)
    nothing
end

"Maps `s` (once), records `stream` on it (once) and returns its address; throws once `s` is freed."
function pin!(s::KmmStorage, stream::CuStream)
    lock(LOCK) do
        pin = get(PINS, s, nothing)
        if pin === nothing
            pin = Pin(Kmm.map_storage(s), HeldStream[])
            finalizer(UnpinAtFree(pin), s)
            PINS[s] = pin
        end
        raw = raw_stream(stream)
        Kmm.record_stream(s, raw)                   # also the check that s is still allocated
        if !any(h -> raw_stream(h.stream) == raw, pin.streams)
            filter!(p -> p.second.users[] > 0, HELD)    # streams no live storage recorded may go
            h = get!(() -> HeldStream(stream, Threads.Atomic{Int}(0)), HELD, raw)
            Threads.atomic_add!(h.users, 1)
            push!(pin.streams, h)
        end
        pin.addr
    end
end

"A view's finalizer that only holds the storage: the view keeps it alive, but never unpins it."
struct HoldStorage
    storage::KmmStorage
end
(::HoldStorage)(_) = nothing

"""
    CuArray(x::KmmArray)

A zero-copy `CuArray` over `x`'s device memory. The first view of a storage maps (pins) it until
the storage is freed, so Kmm never moves it while CUDA.jl may use it; every view records
CUDA.jl's task stream on the storage, so its free waits for the work queued there. CUDA.jl's
stream is made to wait for the manager's stream; after CUDA work writes the memory, call
`Kmm.wait_stream(Kmm.manager(x), CUDA.stream())` before Kmm works on `x` again. The view keeps
the storage alive; arrays derived from it (`reshape`, `vec`, views) do not: keep `x` referenced
while you queue work on them.
"""
function CUDA.CuArray(x::KmmArray{T,N}) where {T,N}
    check_view(x)
    isempty(x) && (Kmm.check_live(x); return wrap(x, UInt64(0)))   # no memory to pin or order
    s = CUDA.stream()
    base = pin!(x.storage, s)
    Kmm.signal_stream(Kmm.manager(x), s)                   # CUDA's stream waits for Kmm's work
    c = wrap(x, base)
    finalizer(HoldStorage(x.storage), c)
    c
end

"""
    Kmm.record_stream(x::KmmArray, s::CuStream)

Pins `x`'s storage as a view does, records `s` on it and makes `s` wait for the manager's
queued work (as a view does for the task stream): for work on `s` other than `CUDA.stream()`
(`@cuda stream = s` converts its arguments on the task stream).
"""
function Kmm.record_stream(x::KmmArray, s::CuStream)
    check_view(x)
    pin!(x.storage, s)
    Kmm.signal_stream(Kmm.manager(x), s)       # work on s sees what Kmm queued on x
    nothing
end

"""
    KmmArray(c::CuArray; manager = Kmm.default_manager(), kind = :device)

A copy of `c` in Kmm's pool (device to device, ordered between CUDA.jl's stream and the
manager's stream). The copy's view is temporary: the new array is not left pinned. With
`kind = :pinned`, or a manager on the host backend, the copy goes through a host `Array`.
"""
function Kmm.KmmArray(c::CuArray{T,N}; manager::KmmManager = Kmm.default_manager(),
                      kind::Symbol = :device) where {T,N}
    alloc() = KmmArray{T,N}(undef, size(c); manager = manager, kind = kind)
    isempty(c) ? alloc() : Kmm.filled(alloc, c)   # freed at once when the copy fails
end

# @cuda kernels take KmmArrays: they are converted through the zero-copy view. CUDA.jl named
# its kernel-argument adaptor `Adaptor` before 5.2 and `KernelAdaptor` since.
kernel_adaptor(cuda::Module) = isdefined(cuda, :KernelAdaptor) ? cuda.KernelAdaptor : cuda.Adaptor
const KernelArgs = kernel_adaptor(CUDA)
Adapt.adapt_storage(to::KernelArgs, x::KmmArray) = Adapt.adapt_storage(to, CuArray(x))

# ---- copies, broadcasts, map and reductions run on CUDA.jl through temporary views ----------
#
# These views never leave the operation: each storage is mapped while it runs, CUDA.jl's stream
# waits for each manager's, and each manager's stream waits for CUDA.jl's before the unmap, so a
# later move, free or Kmm operation is ordered after the CUDA.jl work. They leave no pin.

kmm_arrays!(out, x::KmmArray) = push!(out, x)
kmm_arrays!(out, bc::Broadcast.Broadcasted) = (foreach(a -> kmm_arrays!(out, a), bc.args); out)
kmm_arrays!(out, _) = out
kmm_arrays(xs...) = foldl(kmm_arrays!, xs; init = KmmArray[])

"Calls `f(v)`, where `v(x)` is a temporary `CuArray` view of any `KmmArray` `x` among `arrays`."
function on_views(f, arrays...)
    bases = IdDict{KmmStorage,UInt64}()
    s = CUDA.stream()
    try
        for x in kmm_arrays(arrays...)
            haskey(bases, x.storage) && continue
            check_view(x)
            bases[x.storage] = Kmm.map_storage(x.storage)
            Kmm.signal_stream(Kmm.manager(x), s)
        end
        v(x::KmmArray) = wrap(x, bases[x.storage])
        return f(v)
    finally
        for m in unique!([k.manager for k in keys(bases)])
            m.handle == 0 || Kmm.wait_stream(m, s)     # (a manager closed meanwhile freed all)
        end
        foreach(Kmm.unmap_storage, keys(bases))
    end
end

"`x` with every KmmArray in it replaced by its view `v(x)` (a broadcast's arguments too)."
viewed(v, x::KmmArray) = v(x)
viewed(v, bc::Broadcast.Broadcasted) = Broadcast.broadcasted(bc.f, map(a -> viewed(v, a), bc.args)...)
viewed(v, x) = x

# Memory CUDA.jl cannot use in place (pinned host memory, a manager on the host backend) goes
# through a host array: CUDA.jl's own copies between a CuArray and an Array.
Base.copyto!(d::CuArray{T}, s::KmmArray{T}) where {T} =
    usable(s) ? (on_views(v -> copyto!(d, v(s)), s); d) : copyto!(d, Array(s))
Base.copyto!(d::KmmArray{T}, s::CuArray{T}) where {T} =
    usable(d) ? (on_views(v -> copyto!(v(d), s), d); d) : copyto!(d, Array(s))

struct KmmStyle{N} <: Broadcast.AbstractArrayStyle{N} end
KmmStyle{M}(::Val{N}) where {M,N} = KmmStyle{N}()
Base.BroadcastStyle(::Type{<:KmmArray{T,N}}) where {T,N} = KmmStyle{N}()
Base.BroadcastStyle(::KmmStyle{N}, ::CUDA.CuArrayStyle{M}) where {N,M} = KmmStyle{max(N, M)}()

function Base.similar(bc::Broadcast.Broadcasted{KmmStyle{N}}, ::Type{T}) where {N,T}
    KmmArray{T}(undef, length.(axes(bc)); manager = Kmm.manager(first(kmm_arrays(bc))))
end

function copyto_views!(dest::AbstractArray, bc::Broadcast.Broadcasted)
    all(usable, kmm_arrays(dest, bc)) && usable(dest) ||    # else Base's element loop,
        return copyto!(dest, convert(Broadcast.Broadcasted{Nothing}, bc))   # scalar rules apply
    on_views(v -> Broadcast.materialize!(viewed(v, dest), viewed(v, bc)), dest, bc)
    dest
end
Base.copyto!(dest::AbstractArray, bc::Broadcast.Broadcasted{<:KmmStyle}) = copyto_views!(dest, bc)
Base.copyto!(dest::AbstractArray, bc::Broadcast.Broadcasted{KmmStyle{0}}) = copyto_views!(dest, bc)

# A 0-dimensional broadcast gives its one element, as Base's does (by `bc[]`, scalar indexing):
# computed into a 0-dimensional KmmArray through the views, then read back (as GPUArrays does).
function Base.copy(bc::Broadcast.Broadcasted{KmmStyle{0}})
    dest = copyto!(similar(bc, Broadcast.combine_eltypes(bc.f, bc.args)), bc)
    try
        Array(dest)[]
    finally
        Kmm.unsafe_free!(dest)
    end
end

function Base.map(f, x::KmmArray, xs::AbstractArray...)
    usable(x) && all(a -> usable(a) && size(a) == size(x), xs) && return broadcast(f, x, xs...)
    isempty(xs) ? invoke(map, Tuple{Any,AbstractArray}, f, x) :
                  invoke(map, Tuple{Any,Any,Vararg{Any}}, f, x, xs...)
end

# Kmm's `mapreduce` checks that `x` is live, then calls this.
function Kmm.device_mapreduce(f, op, x::KmmArray; kw...)
    usable(x) || return invoke(Kmm.device_mapreduce, Tuple{Any,Any,AbstractArray}, f, op, x; kw...)
    r = on_views(v -> mapreduce(f, op, v(x); kw...), x)
    r isa CuArray ? KmmArray(r; manager = Kmm.manager(x)) : r    # `dims` reductions stay in Kmm
end

end # module KmmCUDAExt
