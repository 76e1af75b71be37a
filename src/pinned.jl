# PinnedArray: page-locked host memory from a manager's pinned pool, mapped for its whole life,
# so the CPU reads and writes it like an Array and copies from and to it go direct.

"""
    PinnedArray{T,N} <: DenseArray{T,N}

Page-locked host memory owned by a `KmmManager`, usable from the CPU like an `Array` and a fast
source or destination for copies to and from `KmmArray`s.

    PinnedArray{T}(undef, dims...; manager = Kmm.default_manager())
    PinnedArray(a::AbstractArray; manager)

`dims` as for `KmmArray`: integers of any type, each in 0..typemax(Int).

`pointer(p)` is its host address, valid while `p` is reachable (use `GC.@preserve`);
`unsafe_wrap(Array, pointer(p), size(p))` gives an `Array` over it. Freed by the garbage
collector or `Kmm.unsafe_free!`; a freed one throws on access. Another thread may be reading
or writing it meanwhile: with more than one thread, `Kmm.unsafe_free!` and `close` of its
manager first run a quick collection (tens of microseconds), after which no thread is still
inside an access (an `Array` from `unsafe_wrap` is not covered: keep `p` alive and unfreed
while it is used).
"""
struct PinnedArray{T,N} <: DenseArray{T,N}
    storage::KmmStorage
    dims::NTuple{N,Int}
end

function PinnedArray{T,N}(::UndefInitializer, dims::Dims{N};
                          manager::KmmManager = default_manager()) where {T,N}
    check_eltype(T, "PinnedArray")
    s = alloc_storage(manager, checked_bytes(T, dims), LibKmm.KMM_MEMORY_PINNED)
    s.hostptr = Ptr{Cvoid}(map_storage(s))   # stays mapped; the free (FORCE) drops the pin
    PinnedArray{T,N}(s, dims)
end
# Dimensions of any integer type go through `to_dims` (array.jl): past Int, an ArgumentError.
PinnedArray{T,N}(::UndefInitializer, dims::Integer...; kw...) where {T,N} =
    PinnedArray{T,N}(undef, dims; kw...)
PinnedArray{T,N}(::UndefInitializer, dims::NTuple{N,Integer}; kw...) where {T,N} =
    PinnedArray{T,N}(undef, to_dims(dims); kw...)
PinnedArray{T}(::UndefInitializer, dims::Dims{N}; kw...) where {T,N} =
    PinnedArray{T,N}(undef, dims; kw...)
PinnedArray{T}(::UndefInitializer, dims::NTuple{N,Integer}; kw...) where {T,N} =
    PinnedArray{T,N}(undef, to_dims(dims); kw...)
PinnedArray{T}(::UndefInitializer, dims::Integer...; kw...) where {T} = PinnedArray{T}(undef, dims; kw...)
PinnedArray(a::AbstractArray{T,N}; kw...) where {T,N} = filled(() -> PinnedArray{T,N}(undef, size(a); kw...), a)
Base.copy(p::PinnedArray) = filled(() -> similar(p), p)

Base.size(p::PinnedArray) = p.dims
Base.IndexStyle(::Type{<:PinnedArray}) = IndexLinear()
Base.elsize(::Type{<:PinnedArray{T}}) where {T} = sizeof(T)
Base.sizeof(p::PinnedArray{T}) where {T} = length(p) * sizeof(T)
manager(p::PinnedArray) = p.storage.manager
isfreed(p::PinnedArray) = p.storage.handle == 0 || p.storage.manager.handle == 0
# Other threads may be reading or writing the memory in place (p[i], copyto!): see
# `quiesce_cpu_access`.
unsafe_free!(p::PinnedArray) = (free!(p.storage; cpu_visible = true); nothing)

@inline function hostptr(p::PinnedArray{T}) where {T}
    handles(p.storage)          # a clear error when freed or when the manager is closed
    Ptr{T}(p.storage.hostptr)
end

Base.unsafe_convert(::Type{Ptr{T}}, p::PinnedArray{T}) where {T} = hostptr(p)
Base.pointer(p::PinnedArray{T}, i::Integer = 1) where {T} = hostptr(p) + (Int(i) - 1) * sizeof(T)

Base.@propagate_inbounds function Base.getindex(p::PinnedArray{T}, i::Int) where {T}
    @boundscheck checkbounds(p, i)
    GC.@preserve p unsafe_load(hostptr(p), i)
end
Base.@propagate_inbounds function Base.setindex!(p::PinnedArray{T}, v, i::Int) where {T}
    @boundscheck checkbounds(p, i)
    x = convert(T, v)   # before the handle's check: a conversion may reach a safepoint
    GC.@preserve p unsafe_store!(hostptr(p), x, i)
    p
end

# Base's reshape compares the product of the new dimensions with the length modulo 2^64, and
# its ReshapedArray then indexes the parent @inbounds: a wrapped product would read and write
# outside the pinned memory. The product is checked without wrapping first.
function Base.reshape(p::PinnedArray, dims::Dims)
    check_reshape(p, dims)
    invoke(reshape, Tuple{AbstractArray,Dims}, p, dims)
end
Base.reshape(p::PinnedArray, dims::Tuple{Vararg{Union{Int,Colon}}}) = reshape(p, reshape_uncolon(p, dims))

function order_host_memory!(m::KmmManager, p::PinnedArray)
    pm = manager(p)
    pm === m && return true
    # A stream of one backend cannot wait for the other's (a host stream id is no CUstream):
    # the caller waits for the copy instead.
    backend(pm) === backend(m) || return false
    signal_stream(m, stream(pm))
    return true
end

Base.similar(p::PinnedArray, ::Type{S}, dims::Dims{M}) where {S,M} =
    (check_live(p); PinnedArray{S,M}(undef, dims; manager = manager(p)))
Base.similar(p::PinnedArray, ::Type{S}, dims::Tuple{DimOrOneTo,Vararg{DimOrOneTo}}) where {S} = similar(p, S, to_dims(dims))
Base.similar(p::PinnedArray, ::Type{S}, d::DimOrOneTo, dims::DimOrOneTo...) where {S} = similar(p, S, to_dims((d, dims...)))
Base.similar(p::PinnedArray{T}, dims::Tuple{DimOrOneTo,Vararg{DimOrOneTo}}) where {T} = similar(p, T, dims)
Base.similar(p::PinnedArray{T}, d::DimOrOneTo, dims::DimOrOneTo...) where {T} = similar(p, T, d, dims...)

function Base.summary(io::IO, p::PinnedArray)
    print(io, Base.dims2string(size(p)), " ", typeof(p))
    isfreed(p) && print(io, " (freed)")
end
Base.show(io::IO, m::MIME"text/plain", p::PinnedArray) =
    isfreed(p) ? summary(io, p) : invoke(show, Tuple{IO,MIME"text/plain",AbstractArray}, io, m, p)
# repr, string, print and containers (a freed array has no elements to show)
Base.show(io::IO, p::PinnedArray) =
    isfreed(p) ? summary(io, p) : invoke(show, Tuple{IO,AbstractArray}, io, p)
# Wrappers of one (views, reshapes, ...): wrappers.jl.

const HostMem{T} = Union{HostDense{T},PinnedArray{T}}

check_live(p::PinnedArray) = (handles(p.storage); nothing)

# Base's loops over no elements touch no memory, so a freed array of none would pass them: their
# entry points check first (a KmmArray's own methods check its handles).
Base.iterate(p::PinnedArray) = (check_live(p); invoke(iterate, Tuple{AbstractArray}, p))
Base.iterate(x::KmmArray) = (check_live(x); invoke(iterate, Tuple{AbstractArray}, x))
Base.fill!(p::PinnedArray, v) = (check_live(p); invoke(fill!, Tuple{AbstractArray,Any}, p, v))
# So do Base's reductions (`sum`, `prod`: `mapreduce`), `hash` and broadcasting
# (`broadcastable`, Base's documented hook for each argument of a broadcast); Base's wrappers
# of these arrays, the same (wrappers.jl).
Base.mapreduce(f, op, p::PinnedArray; kw...) =
    (check_live(p); invoke(mapreduce, Tuple{Any,Any,AbstractArray}, f, op, p; kw...))
Base.mapreduce(f, op, x::KmmArray; kw...) = (check_live(x); device_mapreduce(f, op, x; kw...))

"""
    device_mapreduce(f, op, x::KmmArray; kw...)

A live `KmmArray`'s reduction: Base's (scalar indexing, refused outside `@allowscalar`), or
KmmCUDAExt's on the GPU when CUDA.jl is loaded.
"""
device_mapreduce(f, op, x::AbstractArray; kw...) = invoke(mapreduce, Tuple{Any,Any,AbstractArray}, f, op, x; kw...)
# Between host memory of one element type (narrow signatures: wider ones made copies of other
# array types ambiguous), one memory copy after both are checked.
function Base.copyto!(dest::Union{Array{T},PinnedArray{T}}, src::PinnedArray{T}) where {T}
    check_lengths(dest, src)
    GC.@preserve dest src unsafe_copyto!(pointer(dest), pointer(src), length(src))
    dest
end

Base.copyto!(dest::KmmArray{T}, doffs::Integer, src::PinnedArray{T}, soffs::Integer, n::Integer) where {T} =
    copy_from_host!(dest, doffs, src, soffs, n)
Base.copyto!(dest::KmmArray{T}, src::PinnedArray{T}) where {T} =
    (check_lengths(dest, src); copyto!(dest, 1, src, 1, length(src)))

Base.copyto!(dest::PinnedArray{T}, doffs::Integer, src::KmmArray{T}, soffs::Integer, n::Integer) where {T} =
    copy_to_host!(dest, doffs, src, soffs, n)
Base.copyto!(dest::PinnedArray{T}, src::KmmArray{T}) where {T} =
    (check_lengths(dest, src); copyto!(dest, 1, src, 1, length(src)))

# (`pointer` checks a PinnedArray's handles, also one of no elements.)
function Base.copyto!(dest::PinnedArray{T}, src::Array{T}) where {T}
    check_lengths(dest, src)
    GC.@preserve dest src unsafe_copyto!(pointer(dest), pointer(src), length(src))
    dest
end

# Base's generic copyto!(dest, doffs, src, soffs, n) tests `doffs + n - 1`, which wraps for an
# unsigned `n` past typemax(Int), then copies @inbounds: through a PinnedArray that reads and
# writes outside the pinned memory. Both ranges are checked without a sum first; then one
# memory copy (same element type, contiguous host memory), else Base's loop with Int arguments.
function copy_host!(dest::AbstractArray, doffs::Integer, src::AbstractArray, soffs::Integer, n::Integer)
    check_range(dest, doffs, n); check_range(src, soffs, n)
    nothing_to_copy(n, dest, src) && return dest
    if eltype(dest) === eltype(src) && dest isa HostMem && src isa HostMem
        GC.@preserve dest src unsafe_copyto!(pointer(dest, doffs), pointer(src, soffs), Int(n))
        return dest
    end
    invoke(copyto!, Tuple{AbstractArray,Integer,AbstractArray,Integer,Integer},
           dest, Int(doffs), src, Int(soffs), Int(n))
end
Base.copyto!(dest::PinnedArray, doffs::Integer, src::AbstractArray, soffs::Integer, n::Integer) =
    copy_host!(dest, doffs, src, soffs, n)
Base.copyto!(dest::AbstractArray, doffs::Integer, src::PinnedArray, soffs::Integer, n::Integer) =
    copy_host!(dest, doffs, src, soffs, n)
Base.copyto!(dest::PinnedArray, doffs::Integer, src::PinnedArray, soffs::Integer, n::Integer) =
    copy_host!(dest, doffs, src, soffs, n)
# Another element type than the KmmArray's: through an Array, as for any host array.
Base.copyto!(dest::PinnedArray, doffs::Integer, src::KmmArray, soffs::Integer, n::Integer) =
    invoke(copyto!, Tuple{AbstractArray,Integer,KmmArray,Integer,Integer}, dest, doffs, src, soffs, n)
Base.copyto!(dest::KmmArray{T}, doffs::Integer, src::PinnedArray, soffs::Integer, n::Integer) where {T} =
    invoke(copyto!, Tuple{KmmArray{T},Integer,AbstractArray,Integer,Integer}, dest, doffs, src, soffs, n)

host_dense(::Type{T}, p::PinnedArray{T}) where {T} = p     # KmmArray(p) copies direct
