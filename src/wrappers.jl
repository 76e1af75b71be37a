# Base's wrapper arrays over Kmm memory (views, reshapes, reinterpretations, transposes,
# adjoints, permutations, nested): they show as freed once the memory is, a KmmArray's are
# read back to the host to be shown, `Array` and `collect` copy them through the host, and
# reinterpreting a KmmArray gives a KmmArray.

"""
    reinterpret(T, x::KmmArray)

A `KmmArray{T}` over the same memory (as `reinterpret` of a `CuArray` gives a `CuArray`), so it
copies, converts and frees like `x`. Sizes as in Base: the same element size keeps the
dimensions; another rescales the first, whose bytes must divide into elements of `T`.
"""
function Base.reinterpret(::Type{T}, x::KmmArray{S,N}) where {T,S,N}
    check_eltype(T)
    sizeof(T) == sizeof(S) && return KmmArray{T,N}(x.storage, x.offset, x.dims)
    if N == 0 || sizeof(T) == 0 || sizeof(S) == 0 || (size(x, 1) * sizeof(S)) % sizeof(T) != 0
        throw(ArgumentError("cannot reinterpret a $(summary(x)) as $T: the first dimension's " *
            "$(N == 0 ? 0 : size(x, 1) * sizeof(S)) bytes do not divide into elements of $(sizeof(T)) bytes"))
    end
    dims = (size(x, 1) * sizeof(S) ÷ sizeof(T), Base.tail(x.dims)...)
    KmmArray{T,N}(x.storage, x.offset, dims)
end

const KmmMemory = Union{KmmArray,PinnedArray}
# One wrapper over `P`, as Base and LinearAlgebra make them; the unions below nest it three deep
# (a view of a reshape of a transpose), as Adapt's WrappedArray covers one.
const Wrapping{P} = Union{SubArray{<:Any,<:Any,<:P},Base.ReshapedArray{<:Any,<:Any,<:P},
                          Base.ReinterpretArray{<:Any,<:Any,<:Any,<:P},
                          LinearAlgebra.Transpose{<:Any,<:P},LinearAlgebra.Adjoint{<:Any,<:P},
                          PermutedDimsArray{<:Any,<:Any,<:Any,<:Any,<:P}}
const Wrapped1 = Wrapping{KmmMemory}
const Wrapped2 = Wrapping{Union{KmmMemory,Wrapped1}}
const WrappedKmm = Wrapping{Union{KmmMemory,Wrapped1,Wrapped2}}

"The `KmmArray` or `PinnedArray` under wrappers of any depth, or `nothing`."
kmm_root(x::KmmMemory) = x
kmm_root(x::AbstractArray) = (p = parent(x); p === x ? nothing : kmm_root(p))
root_freed(x) = (r = kmm_root(x); r !== nothing && isfreed(r))

"The same wrappers over host memory: a `KmmArray` read back whole, a `PinnedArray` as it is."
on_host(x::KmmArray) = Array(x)
on_host(p::PinnedArray) = p
on_host(x::AbstractArray) = x
on_host(v::SubArray) = view(on_host(parent(v)), parentindices(v)...)
on_host(v::Base.ReshapedArray) = reshape(on_host(parent(v)), size(v))
on_host(v::Base.ReinterpretArray{T}) where {T} = reinterpret(T, on_host(parent(v)))
on_host(v::LinearAlgebra.Transpose) = transpose(on_host(parent(v)))
on_host(v::LinearAlgebra.Adjoint) = adjoint(on_host(parent(v)))
on_host(v::PermutedDimsArray{T,N,perm}) where {T,N,perm} = PermutedDimsArray(on_host(parent(v)), perm)

# Base's loops, reductions, hashing and broadcasts over no elements touch no memory: a freed
# array of none (or a wrapper of one) would pass them. Each checks that the memory is live
# first; Base does the rest (a KmmArray's own iterate and mapreduce are in pinned.jl).
const KmmOrWrapped = Union{KmmMemory,WrappedKmm}
Base.hash(x::KmmOrWrapped, h::UInt) = (check_live(x); invoke(hash, Tuple{AbstractArray,UInt}, x, h))
Base.Broadcast.broadcastable(x::KmmOrWrapped) = (check_live(x); x)
Base.iterate(v::WrappedKmm) = (check_live(v); invoke(iterate, Tuple{AbstractArray}, v))
Base.mapreduce(f, op, v::WrappedKmm; kw...) =
    (check_live(v); invoke(mapreduce, Tuple{Any,Any,AbstractArray}, f, op, v; kw...))

# A pinned root is host memory already: Base's own methods (no second trip through these).
Base.Array(v::WrappedKmm) =
    kmm_root(v) isa KmmArray ? Array(on_host(v)) : invoke(Array, Tuple{AbstractArray}, v)
Base.collect(v::WrappedKmm) =
    kmm_root(v) isa KmmArray ? collect(on_host(v)) : invoke(collect, Tuple{AbstractArray}, v)
# `Matrix(x')`, `Array{T}(w)` and the other typed forms copy into a new Array through this, and
# so do Base's `Array` and `collect` above: a freed pinned root is refused here (a copy of no
# elements reads nothing, so would pass).
Base.copyto!(dest::Array, v::WrappedKmm) =
    kmm_root(v) isa KmmArray ? copyto!(dest, on_host(v)) :
                               (check_live(v); invoke(copyto!, Tuple{AbstractArray,AbstractArray}, dest, v))

function Base.show(io::IO, m::MIME"text/plain", v::WrappedKmm)
    root_freed(v) && return (summary(io, v); print(io, " (freed)"))
    kmm_root(v) isa PinnedArray && return invoke(show, Tuple{IO,MIME"text/plain",AbstractArray}, io, m, v)
    show_read_back(io, v)
end
# repr, string, print and containers
function Base.show(io::IO, v::WrappedKmm)
    root_freed(v) && return (summary(io, v); print(io, " (freed)"))
    kmm_root(v) isa PinnedArray && return invoke(show, Tuple{IO,AbstractArray}, io, v)
    show_compact_read_back(io, v)
end

"The text/plain display of a live array of device memory (or a wrapper of one): read back first."
function show_read_back(io::IO, x::AbstractArray)
    summary(io, x)
    isempty(x) && return
    host = read_for_display(x)
    host === nothing && return print(io, SPILLED_NOT_SHOWN)
    println(io, ":")
    Base.print_array(IOContext(io, :typeinfo => eltype(x), :limit => true), host)
end

"The 2-argument show (repr, print, containers) of a live array of device memory, read back."
function show_compact_read_back(io::IO, x::AbstractArray)
    host = read_for_display(x)
    host === nothing ? (summary(io, x); print(io, SPILLED_NOT_SHOWN)) : show(io, host)
end

const SPILLED_NOT_SHOWN = " (spilled to host; no device memory to read it back now)"

"""`x` read back for display, or `nothing` for a spilled array that finds no device memory to
come back to: a display never throws, and the data stay on the host, intact."""
function read_for_display(x)
    try
        return on_host(x)
    catch e
        e isa KmmOutOfMemoryError || rethrow()
        return nothing
    end
end
