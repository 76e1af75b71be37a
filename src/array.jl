# KmmArray{T,N}: device memory of a libkmm buffer, shared by views and reshapes (one KmmStorage,
# a byte offset, the dims). Content crosses to the host only through copies.

"""
    KmmArray{T,N} <: AbstractArray{T,N}

An array in memory owned by a `KmmManager` (device memory, or pinned host memory with
`kind = :pinned`), for isbits element types `T`.

    KmmArray{T}(undef, dims...; manager = Kmm.default_manager(), kind = :device)
    KmmArray(a::AbstractArray; manager, kind)      # a copy of host data
    KmmArray{T}(a::AbstractArray; manager, kind)   # with conversion to T

`dims` are integers (or a tuple of them) of any type, each in 0..typemax(Int): others are an
`ArgumentError` naming the dimensions.

Reading back: `Array(x)` or `collect(x)`; copies: `copyto!` in every direction. `reshape` and
contiguous `view`s share the memory. Scalar indexing is an error unless allowed (see
`Kmm.@allowscalar`). The memory is freed when the array (and every view of it) is unreachable,
or at once by `Kmm.unsafe_free!`.
"""
struct KmmArray{T,N} <: AbstractArray{T,N}
    storage::KmmStorage
    offset::Int               # bytes from the start of the buffer
    dims::NTuple{N,Int}
    function KmmArray{T,N}(storage::KmmStorage, offset::Int, dims::NTuple{N,Int}) where {T,N}
        check_eltype(T)
        new{T,N}(storage, offset, dims)
    end
end

@noinline function check_eltype(T, array = "KmmArray")
    isbitstype(T) || throw(ArgumentError("$array needs an isbits element type, got $T"))
end

"The bytes of an array of `T` with `dims`, or an `ArgumentError` naming the dimensions (a
negative one, or a length or size past `typemax(Int)`: also for elements of no bytes, whose
`length` would wrap). A dimension of 0 makes the length 0 wherever it is, as in Base
((2^32, 2^32, 0) was refused while (0, 2^32, 2^32) passed). No `try`: it runs at every
allocation."
function checked_bytes(::Type{T}, dims::Dims) where {T}
    n = 1
    overflow = false
    for d in dims
        d >= 0 || throw_bad_dims(dims, "negative dimension")
        n, o = Base.mul_with_overflow(n, d)
        overflow |= o
    end
    n, o = Base.mul_with_overflow(n, sizeof(T))
    (overflow | o) && !any(iszero, dims) && throw_bad_dims(dims, "the size overflows")
    return any(iszero, dims) ? 0 : n
end
@noinline throw_bad_dims(dims, why) = throw(ArgumentError("invalid array dimensions $dims: $why"))

function KmmArray{T,N}(::UndefInitializer, dims::Dims{N}; manager::KmmManager = default_manager(),
                       kind::Symbol = :device) where {T,N}
    check_eltype(T)
    s = alloc_storage(manager, checked_bytes(T, dims), kind_value(kind))
    KmmArray{T,N}(s, 0, dims)
end
KmmArray{T,N}(::UndefInitializer, dims::Integer...; kw...) where {T,N} =
    KmmArray{T,N}(undef, dims; kw...)
KmmArray{T,N}(::UndefInitializer, dims::NTuple{N,Integer}; kw...) where {T,N} =
    KmmArray{T,N}(undef, to_dims(dims); kw...)
KmmArray{T}(::UndefInitializer, dims::Dims{N}; kw...) where {T,N} = KmmArray{T,N}(undef, dims; kw...)
KmmArray{T}(::UndefInitializer, dims::NTuple{N,Integer}; kw...) where {T,N} =
    KmmArray{T,N}(undef, to_dims(dims); kw...)
KmmArray{T}(::UndefInitializer, dims::Integer...; kw...) where {T} = KmmArray{T}(undef, dims; kw...)

"A dimension as `similar` takes it: a length, or the axis `Base.OneTo(n)`."
const DimOrOneTo = Union{Integer,Base.OneTo}

"""Dimensions given as any integers (or `Base.OneTo` axes), as `Dims`: each must fit an `Int`
(an `ArgumentError` naming the dimensions and the bound otherwise, never an `InexactError` from
the conversion). Negative ones pass on to `checked_bytes`, which names them."""
@noinline function to_dims(dims::Tuple{Vararg{DimOrOneTo}})
    lengths = map(d -> d isa Base.OneTo ? last(d) : d, dims)
    for d in lengths
        typemin(Int) <= d <= typemax(Int) || throw(ArgumentError(
            "invalid array dimensions $dims: each must be in 0..$(typemax(Int)) (typemax(Int))"))
    end
    map(Int, lengths)
end

KmmArray{T,N}(a::AbstractArray{S,N}; kw...) where {T,N,S} =
    filled(host_dense(T, a)) do   # converted first: a conversion that fails allocates nothing
        KmmArray{T,N}(undef, size(a); kw...)
    end

"""`copyto!(new(), src)`, freeing the new array at once when the copy fails: a constructor that
throws leaves no memory allocated until a collection."""
function filled(new, src)
    x = new()
    try
        copyto!(x, src)
    catch
        unsafe_free!(x)
        rethrow()
    end
end
KmmArray{T}(a::AbstractArray{S,N}; kw...) where {T,N,S} = KmmArray{T,N}(a; kw...)
KmmArray(a::AbstractArray{T,N}; kw...) where {T,N} = KmmArray{T,N}(a; kw...)

Base.size(x::KmmArray) = x.dims
Base.sizeof(x::KmmArray{T}) where {T} = length(x) * sizeof(T)
Base.IndexStyle(::Type{<:KmmArray}) = IndexLinear()
Base.elsize(::Type{<:KmmArray{T}}) where {T} = sizeof(T)

"""
    Kmm.manager(x) -> KmmManager

The manager that owns an array's memory.
"""
manager(x::KmmArray) = x.storage.manager

"""
    Kmm.isfreed(x) -> Bool

Whether the array's memory has been freed (by `unsafe_free!` or by closing its manager).
"""
isfreed(x::KmmArray) = x.storage.handle == 0 || x.storage.manager.handle == 0

"""
    Kmm.unsafe_free!(x)

Frees the memory of `x` now (stream-ordered: copies already queued still see it), instead of
when the garbage collector finds `x` unreachable. Views and reshapes of `x` share the memory and
are freed with it. Using a freed array is a `KmmError`. Freeing twice is allowed.
"""
unsafe_free!(x::KmmArray) = (free!(x.storage); nothing)

"""
    Kmm.kind(x) -> Symbol

The memory kind of an array: `:device` or `:pinned`.
"""
kind(x::KmmArray) = x.storage.kind == LibKmm.KMM_MEMORY_PINNED ? :pinned : :device

"""
    Kmm.never_spill!(x, never = true) -> x

Keeps the memory of `x` (and its views) on the device when the manager spills to host memory
under pressure (`KmmManager(spill_limit = ...)`); `never = false` lets it spill again. A spilled
array marked so comes back to the device first. Arrays a `CuArray` view or a kernel holds mapped
never spill either way.
"""
function never_spill!(x::KmmArray, never::Bool = true)
    mh, h = handles(x.storage)
    # marked never to spill, a spilled array comes back to the device: memory, as an allocation
    check_restoring(() -> GC.@preserve(x, LibKmm.unchecked_kmm_buffer_never_spill(mh, h, never)), x.storage)
    return x
end

"""
    Kmm.is_spilled(x) -> Bool

Whether the memory of `x` is in host memory now (spilled under device pressure); its next use
brings it back.
"""
is_spilled(x::KmmArray) = is_spilled(x.storage)
function is_spilled(s::KmmStorage)
    mh, h = handles(s)
    out = Ref{LibKmm.KmmBufferInfo}()
    GC.@preserve s LibKmm.kmm_buffer_info(mh, h, out)
    return out[].spilled != 0
end

Base.similar(x::KmmArray, ::Type{S}, dims::Dims{M}) where {S,M} =
    (check_live(x); KmmArray{S,M}(undef, dims; manager = manager(x), kind = kind(x)))
# Dimensions of other integer types, or `OneTo` axes: Base would convert them with an
# InexactError past Int.
Base.similar(x::KmmArray, ::Type{S}, dims::Tuple{DimOrOneTo,Vararg{DimOrOneTo}}) where {S} = similar(x, S, to_dims(dims))
Base.similar(x::KmmArray, ::Type{S}, d::DimOrOneTo, dims::DimOrOneTo...) where {S} = similar(x, S, to_dims((d, dims...)))
# Without an element type, the same check (Base's `similar(x, dims...)` converts first).
Base.similar(x::KmmArray{T}, dims::Tuple{DimOrOneTo,Vararg{DimOrOneTo}}) where {T} = similar(x, T, dims)
Base.similar(x::KmmArray{T}, d::DimOrOneTo, dims::DimOrOneTo...) where {T} = similar(x, T, d, dims...)

Base.copy(x::KmmArray) = filled(() -> similar(x), x)

# Views and reshapes are distinct KmmArray values over one storage. Base decides whether a
# broadcast, `map!` or other in-place operation must copy a source first (`Base.unalias`) from
# `dataids`/`mightalias`; the default (each value's own objectid) called overlapping views of one
# buffer disjoint, and `view(x, 2:5) .= view(x, 1:4) .* 10` read elements it had already written.
Base.dataids(x::KmmArray) = (objectid(x.storage),)
"Whether the bytes of `a` and `b` overlap (views of one storage); arrays of two storages never do."
function Base.mightalias(a::KmmArray, b::KmmArray)
    a.storage === b.storage || return false
    (isempty(a) || isempty(b)) && return false
    a.offset < b.offset + sizeof(b) && b.offset < a.offset + sizeof(a)
end

function Base.summary(io::IO, x::KmmArray)
    print(io, Base.dims2string(size(x)), " ", typeof(x))
    if isfreed(x)
        print(io, " (freed)")
    elseif kind(x) == :pinned
        print(io, " (pinned)")
    end
end

# (show_read_back, show_compact_read_back: wrappers.jl)
Base.show(io::IO, ::MIME"text/plain", x::KmmArray) = isfreed(x) ? summary(io, x) : show_read_back(io, x)
Base.show(io::IO, x::KmmArray) = isfreed(x) ? summary(io, x) : show_compact_read_back(io, x)

# ---- host side of copies -------------------------------------------------------------------

"Contiguous host memory with a pointer: what copies read from and write to directly."
const HostDense{T} = Union{Array{T},Base.FastContiguousSubArray{T,<:Any,<:Array{T}}}

"`a` as contiguous host memory of eltype T (itself when it already is)."
host_dense(::Type{T}, a::HostDense{T}) where {T} = a
host_dense(::Type{T}, a::AbstractArray) where {T} = convert(Array{T}, collect(a))

byteoffset(x::KmmArray{T}, i::Integer) where {T} = x.offset + (Int(i) - 1) * sizeof(T)

# Offsets are Base's linear indices, counted from `firstindex(a)`: a vector's first axis value
# (4 for a view over `Base.IdentityUnitRange(4:6)`), else 1. `pointer(host, offs)` takes the
# same index, so a contiguous view with offset axes copies its own elements.
@noinline function check_range(a, offs::Integer, n::Integer)
    n >= 0 || throw(ArgumentError("copyto!: negative number of elements $n"))
    n == 0 && return nothing
    # No sum that can wrap: offsets near typemax(Int) must fail here, not pass.
    f = firstindex(a)
    (n <= length(a) && f <= offs <= f + (length(a) - Int(n))) ||
        throw(BoundsError(a, big(offs):big(offs) + n - 1))  # (no type of the arguments' holds every sum)
    nothing
end

# The elements `offs:offs+n-1` once `check_range` passed, summed as Int: in the arguments' own
# type the sum wraps (UInt8(250) + UInt8(10) - 1 is 3) and the range comes out empty.
copied_range(offs::Integer, n::Integer) = Int(offs):(Int(offs) + Int(n) - 1)
"Linear index `offs` of `a` (checked by `check_range`) counted from 1: its place in `vec(collect(a))`."
one_based(a, offs::Integer) = Int(offs) - firstindex(a) + 1

# The rule of every `copyto!(dest, doffs, src, soffs, n)`, as Base's: both ranges are checked
# first (before any view or sum of them is made); `n = 0` copies nothing and checks no offset,
# but a freed array is still an error.
"Whether there is nothing to copy (`n == 0`), once the arrays are known to be live (`check_live`)."
nothing_to_copy(n, arrays...) = n == 0 && (foreach(check_live, arrays); true)
check_live(x::KmmArray) = (handles(x.storage); nothing)
check_live(x) = nothing
# A view, reshape or other wrapper (nested) is live while what it wraps is (`kmm_root`: wrappers.jl).
check_live(x::AbstractArray) = (r = kmm_root(x); r === nothing || check_live(r); nothing)

@noinline function check_lengths(dest, src)
    length(dest) >= length(src) || throw(BoundsError(dest, length(src)))
    nothing
end

# The one place host pointers cross into libkmm: `host` is dense host memory (an Array, a
# contiguous view of one, or a PinnedArray), kept alive for the synchronous copy.
# The synchronous copies between a storage and host memory at `ptr`: queued, then waited for
# without blocking the thread (`wait_event`), as one of the manager's synchronous calls
# (`waiting`: a `finalize` meanwhile waits for them). The caller keeps `ptr`'s memory alive.
copy_into_storage!(s::KmmStorage, offset, ptr::Ptr, bytes, host = nothing) =
    waiting(() -> copy_into_storage_waiting!(s, offset, ptr, bytes, host), s.manager)

function copy_into_storage_waiting!(s::KmmStorage, offset, ptr::Ptr, bytes, host)
    mh, h = handles(s)
    ev = Ref{UInt64}(0)
    # A pageable copy may wait inside libkmm for a staging slot.
    check_restoring(s) do
        GC.@preserve s @gcsafe LibKmm.unchecked_kmm_copy_to_device_async(mh, h, UInt64(offset), Ptr{Cvoid}(ptr), UInt64(bytes), ev)
    end
    try
        order_host_memory!(s.manager, host)
    finally
        wait_event(s.manager, ev[])
    end
end

copy_from_storage!(ptr::Ptr, s::KmmStorage, offset, bytes, host = nothing) =
    waiting(() -> copy_from_storage_waiting!(ptr, s, offset, bytes, host), s.manager)

function copy_from_storage_waiting!(ptr::Ptr, s::KmmStorage, offset, bytes, host)
    mh, h = handles(s)
    ev = Ref{UInt64}(0)
    check_restoring(s) do
        GC.@preserve s @gcsafe LibKmm.unchecked_kmm_copy_to_host_async(mh, Ptr{Cvoid}(ptr), h, UInt64(offset), UInt64(bytes), ev)
    end
    try
        order_host_memory!(s.manager, host)
    finally
        wait_event(s.manager, ev[])
    end
end

function copy_from_host!(dest::KmmArray{T}, doffs, host, soffs, n) where {T}
    check_range(dest, doffs, n); check_range(host, soffs, n)
    nothing_to_copy(n, dest, host) && return dest
    GC.@preserve host copy_into_storage!(dest.storage, byteoffset(dest, doffs), pointer(host, soffs),
                                         n * sizeof(T), host)
    dest
end

function copy_to_host!(host, doffs, src::KmmArray{T}, soffs, n) where {T}
    check_range(host, doffs, n); check_range(src, soffs, n)
    nothing_to_copy(n, host, src) && return host
    GC.@preserve host copy_from_storage!(pointer(host, doffs), src.storage, byteoffset(src, soffs),
                                         n * sizeof(T), host)
    host
end

"""
After a copy queued on `m` that reads or writes the host memory `host`: when `host` is a
`PinnedArray` of another manager of the same backend, that manager's stream waits for the copy,
so that the pinned array's free (stream-ordered on its own manager) and its manager's `close`
come after the copy, never while it still reads or writes the memory. Returns whether the copy
is ordered so; `false` (another backend's manager) means the caller must wait for the copy.
A `close` or `unsafe_free!` of the pinned array on another thread while the copy is being
queued is not covered: the array must stay alive until the copy function returns.
"""
order_host_memory!(m::KmmManager, host) = true

# host -> Kmm
Base.copyto!(dest::KmmArray{T}, doffs::Integer, src::HostDense{T}, soffs::Integer, n::Integer) where {T} =
    copy_from_host!(dest, doffs, src, soffs, n)
Base.copyto!(dest::KmmArray{T}, src::HostDense{T}) where {T} =
    (check_lengths(dest, src); copyto!(dest, 1, src, firstindex(src), length(src)))
Base.copyto!(dest::KmmArray{T}, src::AbstractArray) where {T} = copyto!(dest, host_dense(T, src))
function Base.copyto!(dest::KmmArray{T}, doffs::Integer, src::AbstractArray, soffs::Integer,
                      n::Integer) where {T}
    check_range(dest, doffs, n); check_range(src, soffs, n)
    nothing_to_copy(n, dest, src) && return dest
    copyto!(dest, doffs, host_dense(T, vec(collect(src))[copied_range(one_based(src, soffs), n)]), 1, n)
end

# Kmm -> host
Base.copyto!(dest::HostDense{T}, doffs::Integer, src::KmmArray{T}, soffs::Integer, n::Integer) where {T} =
    copy_to_host!(dest, doffs, src, soffs, n)
Base.copyto!(dest::HostDense{T}, src::KmmArray{T}) where {T} =
    (check_lengths(dest, src); copyto!(dest, firstindex(dest), src, 1, length(src)))
function Base.copyto!(dest::AbstractArray, src::KmmArray)
    check_lengths(dest, src)
    copyto!(dest, firstindex(dest), Array(src), 1, length(src))
end
function Base.copyto!(dest::AbstractArray, doffs::Integer, src::KmmArray, soffs::Integer,
                      n::Integer)
    # dest too: Base's generic copyto! tests doffs + n - 1, which wraps, then writes @inbounds
    check_range(dest, doffs, n); check_range(src, soffs, n)
    nothing_to_copy(n, dest, src) && return dest
    copyto!(dest, doffs, Array(view(src, copied_range(soffs, n))), 1, n)
end

# Kmm -> Kmm (one manager or two): stream-ordered on the destination's stream
function Base.copyto!(dest::KmmArray{T}, doffs::Integer, src::KmmArray{T}, soffs::Integer,
                      n::Integer) where {T}
    check_range(dest, doffs, n); check_range(src, soffs, n)
    nothing_to_copy(n, dest, src) && return dest
    ds, ss = dest.storage, src.storage
    dmh, dh = handles(ds)
    smh, sh = handles(ss)
    bytes = n * sizeof(T)
    doff, soff = byteoffset(dest, doffs), byteoffset(src, soffs)
    if dest.storage === src.storage && doff < soff + bytes && soff < doff + bytes
        doff == soff && return dest
        # overlapping: through a copy, freed (stream-ordered) once it is copied or has failed
        tmp = filled(() -> KmmArray{T,1}(undef, (n,); manager = manager(src)), view(src, copied_range(soffs, n)))
        try
            return copyto!(dest, doffs, tmp, 1, n)
        finally
            unsafe_free!(tmp)
        end
    end
    # Between a host-backend and a CUDA manager the copy is synchronous, inside libkmm.
    check_restoring(ds, ss) do
        GC.@preserve ds ss @gcsafe LibKmm.unchecked_kmm_copy_buffer(dmh, dh, UInt64(doff), smh, sh, UInt64(soff), UInt64(bytes))
    end
    dest
end
Base.copyto!(dest::KmmArray{T}, src::KmmArray{T}) where {T} =
    (check_lengths(dest, src); copyto!(dest, 1, src, 1, length(src)))
Base.copyto!(dest::KmmArray{T}, src::KmmArray) where {T} = copyto!(dest, Array{T}(src))
function Base.copyto!(dest::KmmArray{T}, doffs::Integer, src::KmmArray, soffs::Integer,
                      n::Integer) where {T}
    check_range(dest, doffs, n); check_range(src, soffs, n)   # before the view: its sum wraps
    nothing_to_copy(n, dest, src) && return dest
    copyto!(dest, doffs, Array{T}(view(src, copied_range(soffs, n))), 1, n)
end

# ---- reading back --------------------------------------------------------------------------

Base.Array{T,N}(x::KmmArray{T,N}) where {T,N} = copyto!(Array{T,N}(undef, size(x)), x)
Base.Array{T,N}(x::KmmArray{S,N}) where {T,N,S} = convert(Array{T,N}, Array(x))
Base.Array{T}(x::KmmArray{S,N}) where {T,S,N} = Array{T,N}(x)
Base.Array(x::KmmArray{T,N}) where {T,N} = Array{T,N}(x)
Base.collect(x::KmmArray) = Array(x)

function Base.fill!(x::KmmArray{T}, v) where {T}
    pattern = Ref{T}(convert(T, v))
    xs = x.storage
    mh, h = handles(xs)
    (isempty(x) || sizeof(T) == 0) && return x
    if sizeof(T) <= 4096
        # It may wait inside libkmm for a staging slot.
        check_restoring(xs) do
            GC.@preserve xs pattern @gcsafe LibKmm.unchecked_kmm_fill(mh, h, UInt64(x.offset), UInt64(sizeof(x)),
                                             Ptr{Cvoid}(Base.unsafe_convert(Ptr{T}, pattern)), Csize_t(sizeof(T)))
        end
    else
        copyto!(x, fill(pattern[], size(x)))
    end
    x
end

# ---- views and reshapes that share the buffer ---------------------------------------------

"""Checks new dimensions for `reshape`: none negative, and their product, computed without
wrapping (a product that overflows Int is refused, never compared modulo 2^64), is `length(x)`."""
@noinline function check_reshape(x::AbstractArray, dims::Dims)
    any(d -> d < 0, dims) && throw(ArgumentError("negative dimension in $dims"))
    n = 1
    for d in dims
        p, overflow = Base.mul_with_overflow(n, d)
        # A later 0 makes the product 0: no overflow then.
        overflow && !any(iszero, dims) && throw(DimensionMismatch(
            "new dimensions $dims must be consistent with array size $(length(x)): their product overflows Int"))
        n = p
    end
    n = any(iszero, dims) ? 0 : n
    n == length(x) || throw(DimensionMismatch(
        "new dimensions $dims must be consistent with array size $(length(x))"))
    nothing
end

function Base.reshape(x::KmmArray{T}, dims::Dims{M}) where {T,M}
    check_reshape(x, dims)
    KmmArray{T,M}(x.storage, x.offset, dims)
end
"`dims` with its one `Colon` replaced by what makes the product `length(x)` (checked by `check_reshape`)."
function reshape_uncolon(x::AbstractArray, dims::Tuple{Vararg{Union{Int,Colon}}})
    ncolon = count(d -> d isa Colon, dims)
    ncolon <= 1 || throw(DimensionMismatch("new dimensions $dims may have at most one omitted dimension"))
    known = 1
    for d in dims
        d isa Int || continue
        p, overflow = Base.mul_with_overflow(known, d)
        overflow && throw(DimensionMismatch(
            "new dimensions $dims must be consistent with array size $(length(x)): their product overflows Int"))
        known = p
    end
    (known == 0 || length(x) % known != 0) && throw(DimensionMismatch(
        "array size $(length(x)) must be divisible by the product of the new dimensions $dims"))
    map(d -> d isa Colon ? length(x) ÷ known : d, dims)
end
Base.reshape(x::KmmArray, dims::Tuple{Vararg{Union{Int,Colon}}}) = reshape(x, reshape_uncolon(x, dims))
Base.vec(x::KmmArray) = reshape(x, (length(x),))

@noinline throw_noncontiguous(I) = throw(ArgumentError(
    "a view of a KmmArray must be contiguous (leading whole dimensions, then one unit range, " *
    "then scalars); got indices $I. Copy through Array(x) for other selections."))

unitlike(i) = i isa Integer || i isa AbstractUnitRange || (i isa AbstractRange && step(i) == 1)

# A KmmArray's axes start at 1: a view over `Base.IdentityUnitRange(4:6)` would be indexed 1:3
# where Base's is indexed 4:6, so its elements and copy offsets would name other elements.
@noinline throw_offset_axes(I) = throw(ArgumentError(
    "a view of a KmmArray has axes starting at 1; got indices $I with offset axes " *
    "(Base.IdentityUnitRange). Index with the plain range (4:6 for IdentityUnitRange(4:6))."))
from_one(i) = i isa Integer || first(Base.axes1(i)) == 1

"""
    view(x::KmmArray, I...)

A `KmmArray` sharing `x`'s memory, for contiguous selections only: leading dimensions taken
whole, then one unit range, then scalars (`view(x, :, 2:3)`, `view(x, :, :, 4)`), or one unit
range over the linear index (`view(x, 3:10)`). Indices past the last dimension must be 1, as
in Base (`view(x, :, 2, 1)` of a matrix). Other selections throw an `ArgumentError`, and so do
indices with offset axes (`Base.IdentityUnitRange`): a `KmmArray`'s axes start at 1.
"""
function Base.view(x::KmmArray{T,N}, I::Vararg{Any,M}) where {T,N,M}
    M == 0 && return x
    J = Base.to_indices(x, I)
    checkbounds(x, J...)
    all(unitlike, J) || throw_noncontiguous(I)
    all(from_one, J) || throw_offset_axes(I)
    if length(J) == 1
        j = J[1]
        j isa Integer && return KmmArray{T,0}(x.storage, byteoffset(x, j), ())
        return KmmArray{T,1}(x.storage, byteoffset(x, isempty(j) ? 1 : first(j)), (Int(length(j)),))
    end
    # indices past the last dimension: checkbounds left them at 1 (or 1:1, a dimension of length 1)
    # Lengths as Int (ranges of UInt or BigInt have lengths of their type; checked in bounds).
    lens = map(j -> Int(length(j)), J)
    dims = Tuple(Int(length(j)) for j in J if !(j isa Integer))
    any(iszero, lens) && return KmmArray{T,length(dims)}(x.storage, x.offset, dims)
    k = something(findlast(l -> l > 1, collect(lens)), 0)
    for d in 1:k-1
        lens[d] == x.dims[d] || throw_noncontiguous(I)
    end
    first_index = LinearIndices(x)[ntuple(d -> first(J[d]), N)...]
    KmmArray{T,length(dims)}(x.storage, byteoffset(x, first_index), dims)
end
