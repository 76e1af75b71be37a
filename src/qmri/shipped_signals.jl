# How a call over workers hands them its signals. Every worker needs all of them (the workers
# split atoms, not voxels), and serializing a 131 MB array once per worker through the loopback
# socket cost more than a tenth of a two-GPU call. So the caller writes the signals once to a
# file in shared memory (/dev/shm, else the temporary directory), readable by its user alone,
# and each worker on its host maps that file; a worker that cannot (another host, another file
# system) asks the caller for the array, which is then serialized to it. A random token at the
# head of the file keeps a worker from mapping another call's file of the same name.
#
# The caller sends every call first and writes the file after (`on_workers`' `sent`), and a
# worker asks for the signals only after it has queued its first batch's simulation (see
# `match`), so that the write and the wait overlap the simulation. (The worker's copy itself
# runs on its stream, after the simulation.)

"What a worker is sent in place of the signals (see `with_shipped_signals`)."
struct ShippedSignals{N}
    owner::Int                        # the process that holds the array
    id::Int                           # its key in that process's `SHIPPED`
    dims::NTuple{N,Int}
    token::UInt128
end

"The caller's side of one shipment: the array, and the file once it is written (or nothing)."
mutable struct Shipment
    signals::Array{ComplexF32}
    written::Base.Event
    path::Union{Nothing,String}
end

const SHIPPED = Dict{Int,Shipment}()
const SHIPPED_LOCK = ReentrantLock()
const SHIPPED_NEXT = Ref(0)
const SHARED_HEADER = 64              # bytes before the data: the token, then padding
const WRITE_PIECE = 1 << 30

"""
Runs `f(shipped, write_file)` while workers can reach `signals` through `shipped`. `f` must call
`write_file()` once it has sent its calls (workers that ask for the signals wait for it); the
shared file is written then. The array stays held here until `f` returns or throws, and the
file is removed then.
"""
function with_shipped_signals(f, signals::Array{ComplexF32})
    # The token comes from the system, not from the caller's (perhaps seeded) global RNG.
    token = rand(Random.RandomDevice(), UInt128)
    shipment = Shipment(signals, Base.Event(), nothing)
    id = lock(SHIPPED_LOCK) do
        SHIPPED_NEXT[] += 1
        SHIPPED[SHIPPED_NEXT[]] = shipment
        SHIPPED_NEXT[]
    end
    write_started = Ref(false)               # the file is written once; the event tells when
    function write_file()
        write_started[] && return
        write_started[] = true
        try
            shipment.path = write_shared(signals, token)
        finally
            notify(shipment.written)
        end
    end
    try
        f(ShippedSignals(Distributed.myid(), id, size(signals), token), write_file)
    finally
        notify(shipment.written)               # no worker waits forever, whatever failed
        shipment.path === nothing || rm(shipment.path; force = true)
        lock(() -> delete!(SHIPPED, id), SHIPPED_LOCK)
    end
end

"""
The signals' shared file (token, padding, data), created anew and readable by this user alone,
or nothing when no directory takes it (a full tmpfs: the workers then fetch the array).
"""
function write_shared(signals::Array{ComplexF32}, token::UInt128)
    F = Base.Filesystem
    for dir in ("/dev/shm", tempdir())
        isdir(dir) || continue
        # Our own name: Julia 1.5's tempname(dir) follows TMPDIR instead of dir.
        path = joinpath(dir, "kmm-signals-$(getpid())-$(string(token; base = 16))")
        file = try
            F.open(path, F.JL_O_WRONLY | F.JL_O_CREAT | F.JL_O_EXCL, 0o600)
        catch err
            err isa Base.IOError || rethrow()
            continue
        end
        complete = try
            write(file, token)
            write(file, zeros(UInt8, SHARED_HEADER - sizeof(token)))
            # In pieces under 2 GiB: a larger write's count overflows libuv's int. A full disk
            # does not throw (the count comes back whole): the file's size tells.
            GC.@preserve signals for at in 0:WRITE_PIECE:sizeof(signals)-1
                unsafe_write(file, pointer(signals) + at, UInt(min(WRITE_PIECE, sizeof(signals) - at)))
            end
            close(file)
            filesize(path) == SHARED_HEADER + sizeof(signals)
        catch err
            close(file)
            err isa Base.IOError || (rm(path; force = true); rethrow())
            false
        end
        complete && return path
        rm(path; force = true)
    end
    nothing
end

"""
On a worker: `f(signals)`, the signals mapped from the shared file when it can be (and unmapped
when `f` returns: the caller has already removed the file's name, so its pages go then), else
fetched from the caller.
"""
function with_received_signals(f, s::ShippedSignals)
    path = Distributed.remotecall_fetch(shipped_path, s.owner, s.id)
    mapping = path === nothing ? nothing : map_shared(path, s.dims, s.token)
    mapping === nothing && return f(Distributed.remotecall_fetch(shipped_array, s.owner, s.id))
    try
        f(mapping.signals)
    finally
        unmap_shared(mapping)
    end
end

"""
`path` mapped read-only (`mmap` itself, not `Mmap`, whose unmapping waits for a collection)
as `(base, bytes, signals)`, or nothing when it is missing or not this call's. Unmap it with
`unmap_shared`; `signals` must not be used after.
"""
function map_shared(path::String, dims::NTuple{N,Int}, token::UInt128) where {N}
    bytes = SHARED_HEADER + sizeof(ComplexF32) * prod(dims)
    try
        open(path) do io
            filesize(io) == bytes && read(io, UInt128) == token || return nothing
            PROT_READ, MAP_SHARED = Cint(1), Cint(1)
            base = ccall(:mmap, Ptr{Cvoid}, (Ptr{Cvoid}, Csize_t, Cint, Cint, Cint, Int64),
                         C_NULL, bytes, PROT_READ, MAP_SHARED, Cint(fd(io)), 0)
            base == Ptr{Cvoid}(-1) && return nothing           # MAP_FAILED
            signals = unsafe_wrap(Array, Ptr{ComplexF32}(base + SHARED_HEADER), dims)
            (base = base, bytes = bytes, signals = signals)
        end
    catch err
        err isa SystemError || err isa Base.IOError || err isa EOFError || rethrow()
        nothing
    end
end

unmap_shared(m::NamedTuple) = (ccall(:munmap, Cint, (Ptr{Cvoid}, Csize_t), m.base, m.bytes); nothing)

"On the owner: the shared file once it is written (nothing: there is none)."
function shipped_path(id::Int)
    shipment = lock(() -> SHIPPED[id], SHIPPED_LOCK)
    wait(shipment.written)
    shipment.path
end

"On the owner: the array, for a worker that could not map the file."
shipped_array(id::Int) = lock(() -> SHIPPED[id].signals, SHIPPED_LOCK)
