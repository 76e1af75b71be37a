# Values that own libkmm handles are never duplicated field by field: a copy with the same
# handle would be a second owner (its free frees the original's memory; a copied manager's
# close destroys the original). `deepcopy` copies the data of arrays onto the same manager, and
# refuses managers; serialization is refused, since a handle names memory of this process only
# (in another process the same number may name a live buffer of its own).

# One new storage per storage copied: views and reshapes of one array stay views of one copy.
function Base.deepcopy_internal(s::KmmStorage, dict::IdDict)
    haskey(dict, s) && return dict[s]::KmmStorage
    handles(s)  # a freed storage (or one of a closed manager) throws, as any use does
    if s.kind == LibKmm.KMM_MEMORY_PINNED
        c = PinnedArray{UInt8}(undef, s.bytes; manager = s.manager)
        GC.@preserve s c unsafe_copyto!(Ptr{UInt8}(c.storage.hostptr), Ptr{UInt8}(s.hostptr), s.bytes)
    else
        c = copy(KmmArray{UInt8,1}(s, 0, (s.bytes,)))
    end
    return dict[s] = c.storage
end

Base.deepcopy_internal(x::KmmArray{T,N}, dict::IdDict) where {T,N} =
    get!(() -> KmmArray{T,N}(Base.deepcopy_internal(x.storage, dict), x.offset, x.dims), dict, x)

Base.deepcopy_internal(p::PinnedArray{T,N}, dict::IdDict) where {T,N} =
    get!(() -> PinnedArray{T,N}(Base.deepcopy_internal(p.storage, dict), p.dims), dict, p)

# A manager is a resource, not data: a copy would be a second owner of its handle, and the
# original itself would make `close(copy)` close it. Arrays copy without it.
Base.deepcopy_internal(::KmmManager, ::IdDict) =
    throw(ArgumentError("a KmmManager cannot be deep-copied: it owns its memory and stream. " *
                        "Copy the arrays (`deepcopy` of a KmmArray copies its data onto the same manager)."))

@noinline function refuse_serialize(what, advice)
    throw(ArgumentError("a $what cannot be serialized: its libkmm handle names memory of this " *
                        "process only. $advice"))
end

const _SHIP_ADVICE = "Send `Array(x)` and make a KmmArray of it where it arrives."
Serialization.serialize(::Serialization.AbstractSerializer, ::KmmArray) = refuse_serialize("KmmArray", _SHIP_ADVICE)
Serialization.serialize(::Serialization.AbstractSerializer, ::PinnedArray) = refuse_serialize("PinnedArray", _SHIP_ADVICE)
Serialization.serialize(::Serialization.AbstractSerializer, ::KmmStorage) = refuse_serialize("KmmStorage", _SHIP_ADVICE)
Serialization.serialize(::Serialization.AbstractSerializer, ::KmmManager) =
    refuse_serialize("KmmManager", "Make a manager in the process that uses it (`Kmm.default_manager()`).")
