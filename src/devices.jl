# Devices: how many there are, which copy peer to peer, and which device an array lives on.
# Managers are per device (`KmmManager(device = d)`); copies between arrays of managers on
# different devices go device to device (`copyto!`, `KmmArray(x; manager)`).

"""
    Kmm.device_count(backend = :auto) -> Int

How many devices `backend` (`:auto`, `:host` or `:cuda`) offers: the visible CUDA devices, or
the host backend's stand-ins (the `KMM_HOST_DEVICES` environment variable, 1 to 64, default 1,
read when libkmm first opens the host backend). `:auto` follows `KMM_BACKEND`, then counts
CUDA's devices when CUDA is usable, else the host's. Managers exist on devices
`0:device_count()-1`.
"""
function device_count(backend::Symbol = :auto)
    n = Ref{UInt32}(0)
    LibKmm.kmm_device_count(enum_value(BACKENDS, backend, "backend"), n)
    Int(n[])
end

"""
    Kmm.can_access_peer(device, peer; backend = :auto) -> Bool

Whether copies between `device` and `peer` go peer to peer (NVLink or PCIe; peer access is
then enabled both ways) rather than through pinned host memory. Host stand-in devices pair up as
NVLink pairs do: 0 with 1, 2 with 3, ... Either way `copyto!` between their arrays works and
is stream-ordered on both managers.
"""
function can_access_peer(device::Integer, peer::Integer; backend::Symbol = :auto)
    out = Ref{UInt32}(0)
    LibKmm.kmm_device_can_access_peer(enum_value(BACKENDS, backend, "backend"),
                                      arg_value(Int32, "can_access_peer", :device, device),
                                      arg_value(Int32, "can_access_peer", :peer, peer), out)
    out[] == 1
end

"""
    Kmm.device(x::KmmArray) -> Int
    Kmm.device(m::KmmManager) -> Int

The device (0-based ordinal) whose memory holds the array, or that the manager runs on.
"""
device(m::KmmManager) = m.device
device(x::KmmArray) = device(manager(x))

"""
    KmmArray(x::KmmArray; manager = Kmm.manager(x), kind = :device)
    KmmArray{T}(x::KmmArray; manager = Kmm.manager(x), kind = :device)

A copy of `x` in memory of `manager` (by default `x`'s own, also when converting), on any
device. Of the same element type: device to device (peer to peer where the devices allow it),
queued on both managers' streams, never through a host `Array`. Of another element type `T`:
the elements are read back and converted first (a conversion that fails allocates nothing).
"""
function KmmArray{T,N}(x::KmmArray{S,N}; manager::KmmManager = Kmm.manager(x),
                       kind::Symbol = :device) where {T,N,S}
    src = S === T ? x : host_dense(T, x)
    filled(() -> KmmArray{T,N}(undef, size(x); manager = manager, kind = kind), src)
end
KmmArray{T}(x::KmmArray{S,N}; kw...) where {T,N,S} = KmmArray{T,N}(x; kw...)
KmmArray(x::KmmArray{T,N}; kw...) where {T,N} = KmmArray{T,N}(x; kw...)
# As Base's `convert` to an `Array` type: the array itself when it is one already, else a copy
# converted on its own manager. (The first method settles the ambiguity with Base's `(T, ::T)`.)
Base.convert(::Type{A}, x::A) where {A<:KmmArray} = x
Base.convert(::Type{A}, x::KmmArray) where {A<:KmmArray} = x isa A ? x : A(x)

"""
    Kmm.live_managers() -> Int

How many managers are alive in this process: created and not yet torn down, default managers
included (`close` tears a manager down before it returns; a collected one counts until its
deferred teardown ends). Scale-out code checks it on workers: a call that made managers
for itself leaves the count where it found it.
"""
function live_managers()
    n = Ref{UInt32}(0)
    LibKmm.kmm_live_managers(n)
    Int(n[])
end
