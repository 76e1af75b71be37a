# Scalar indexing of a KmmArray copies one element across; like CuArray it is an error unless
# allowed, so that slow element-by-element loops are noticed.

const _scalar_allowed = Ref{Bool}(false)

"""
    Kmm.allowscalar(flag::Bool = true)

Allows (or disallows again) scalar `getindex`/`setindex!` on every `KmmArray`, everywhere.
Prefer the scoped `Kmm.@allowscalar`.
"""
allowscalar(flag::Bool = true) = (_scalar_allowed[] = flag; nothing)

"""
    Kmm.@allowscalar expr

Evaluates `expr` with scalar indexing of `KmmArray`s allowed (in this task only). Each scalar
access copies one element to or from the device.
"""
macro allowscalar(ex)
    quote
        task_local_storage(:KmmAllowScalar, true) do
            $(esc(ex))
        end
    end
end

@noinline function throw_scalar(op)
    throw(ErrorException("scalar $op of a KmmArray is disallowed: each access is a copy " *
        "between host and device. Copy the whole array (Array(x), copyto!) or a contiguous " *
        "view, or allow it with `Kmm.@allowscalar` / `Kmm.allowscalar(true)`."))
end

@inline function assertscalar(op)
    _scalar_allowed[] && return nothing
    get(task_local_storage(), :KmmAllowScalar, false) === true && return nothing
    throw_scalar(op)
end

function Base.getindex(x::KmmArray{T}, i::Int) where {T}
    check_live(x)   # a freed array says so, also where scalar indexing is not allowed
    assertscalar("getindex")
    @boundscheck checkbounds(x, i)
    # An element of no bytes (`nothing`) is its type's one instance: nothing to read (and
    # `unsafe_convert(Ptr{Nothing}, ::Ref{Nothing})` recurses without end).
    sizeof(T) == 0 && return T.instance
    out = Ref{T}()
    GC.@preserve out copy_from_storage!(Base.unsafe_convert(Ptr{T}, out), x.storage, byteoffset(x, i), sizeof(T))
    out[]
end

function Base.setindex!(x::KmmArray{T}, v, i::Int) where {T}
    check_live(x)
    assertscalar("setindex!")
    @boundscheck checkbounds(x, i)
    val = Ref{T}(convert(T, v))
    sizeof(T) == 0 && return x
    GC.@preserve val copy_into_storage!(x.storage, byteoffset(x, i), Base.unsafe_convert(Ptr{T}, val), sizeof(T))
    x
end
