# Values that own libkmm handles are never duplicated field by field: a copy with the same
# handle would be a second owner (its free frees the original's memory; a copied manager's
# close destroys the original). `deepcopy` copies the data of arrays onto the same manager, and
# refuses managers; serialization is refused, since a handle names memory of this process only
# (in another process the same number may name a live buffer of its own).

# One new storage per storage copied: views and reshapes of one array stay views of one copy.
# The copy has the storage's kind and mapping state. What decides is the mapping, not the kind:
# a PinnedArray's storage is mapped (hostptr set) and copies on the CPU into a mapped copy; every
# other storage (device, or pinned from `KmmArray(...; kind = :pinned)`, never mapped: hostptr
# is C_NULL) copies through libkmm into a new storage of its kind.
function Base.deepcopy_internal(s::KmmStorage, dict::IdDict)
    haskey(dict, s) && return dict[s]::KmmStorage
    handles(s)  # a freed storage (or one of a closed manager) throws, as any use does
    return dict[s] = s.hostptr == C_NULL ? copy_unmapped(s) : copy_mapped(s)
end

"A copy of a storage that is not mapped, by libkmm (stream-ordered, as `copy(x)`), of its kind."
copy_unmapped(s::KmmStorage) = copy(KmmArray{UInt8,1}(s, 0, (s.bytes,))).storage

"A mapped copy of a mapped (PinnedArray) storage, by a CPU copy between the two host addresses."
function copy_mapped(s::KmmStorage)
    mapped_address(s)   # a freed source's error before the allocation: no copy left behind
    c = PinnedArray{UInt8}(undef, s.bytes; manager = s.manager)
    try
        # The address is read again next to the copy: the allocation may collect (a finalizer,
        # another thread's unsafe_free!), and the source freed meanwhile must not be read.
        GC.@preserve s c unsafe_copyto!(pointer(c), Ptr{UInt8}(mapped_address(s)), s.bytes)
    catch
        unsafe_free!(c)
        rethrow()
    end
    return c.storage
end

"The host address of a mapped storage; a clear error once it is freed (its address is then C_NULL)."
function mapped_address(s::KmmStorage)
    handles(s)
    p = s.hostptr
    p == C_NULL && throw_freed()
    return p
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
