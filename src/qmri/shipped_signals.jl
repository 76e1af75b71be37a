# How a call over workers hands them its signals. Every worker needs all of them (the workers
# split atoms, not voxels), and serializing a 131 MB array once per worker through the loopback
# socket cost more than a tenth of a two-GPU call. So the caller writes the signals once to a
# file in shared memory (/dev/shm, else the temporary directory) and each worker on its host maps
# that file; a worker that cannot (another host, another file system) asks the caller for the
# array, which is then serialized to it. A random token at the head of the file keeps a worker
# from mapping another call's file of the same name.
#
# The caller sends the calls first and writes the file while the workers start: a worker asks
# for the signals only after it has queued its first batch's simulation (see `match`), so the
# write and the wait overlap the simulation.

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

"""
Runs `f(shipped)` while workers can reach `signals` through `shipped`: `f` runs in a task of its
own, and once it has sent its calls this task writes the shared file. The array stays held here
until `f` returns or throws, and the file is removed then.
"""
function with_shipped_signals(f, signals::Array{ComplexF32})
    token = rand(UInt128)
    shipment = Shipment(signals, Base.Event(), nothing)
    id = lock(SHIPPED_LOCK) do
        SHIPPED_NEXT[] += 1
        SHIPPED[SHIPPED_NEXT[]] = shipment
        SHIPPED_NEXT[]
    end
    try
        calls = @async f(ShippedSignals(Distributed.myid(), id, size(signals), token))
        yield()                                # the calls go out before the write holds this thread
        shipment.path = write_shared(signals, token)
        notify(shipment.written)
        try
            fetch(calls)
        catch err
            throw(err isa TaskFailedException ? err.task.exception : err)
        end
    finally
        notify(shipment.written)               # no worker waits forever, whatever failed
        shipment.path === nothing || rm(shipment.path; force = true)
        lock(() -> delete!(SHIPPED, id), SHIPPED_LOCK)
    end
end

"The signals' shared file (token, padding, data), or nothing when no directory takes it."
function write_shared(signals::Array{ComplexF32}, token::UInt128)
    for dir in ("/dev/shm", tempdir())
        isdir(dir) || continue
        path = tempname(dir)
        try
            open(path, "w") do io
                write(io, token)
                write(io, zeros(UInt8, SHARED_HEADER - sizeof(token)))
                write(io, signals)
            end
            return path
        catch err
            rm(path; force = true)             # a full tmpfs leaves a partial file
            err isa SystemError || err isa Base.IOError || rethrow()
        end
    end
    nothing
end

"On a worker: the signals, mapped from the shared file when it can be, else fetched."
function receive_signals(s::ShippedSignals)
    path = Distributed.remotecall_fetch(shipped_path, s.owner, s.id)
    mapped = path === nothing ? nothing : map_shared(path, s.dims, s.token)
    mapped === nothing ? Distributed.remotecall_fetch(shipped_array, s.owner, s.id) : mapped
end

"`path` mapped read-only as signals of `dims`, or nothing when it is missing or not this call's."
function map_shared(path::String, dims::NTuple{N,Int}, token::UInt128) where {N}
    bytes = SHARED_HEADER + sizeof(ComplexF32) * prod(dims)
    try
        open(path) do io
            filesize(io) == bytes && read(io, UInt128) == token || return nothing
            Mmap.mmap(io, Array{ComplexF32,N}, dims, SHARED_HEADER; shared = true)
        end
    catch err
        err isa SystemError || err isa Base.IOError || err isa EOFError || rethrow()
        nothing
    end
end

"On the owner: the shared file once it is written (nothing: there is none)."
function shipped_path(id::Int)
    shipment = lock(() -> SHIPPED[id], SHIPPED_LOCK)
    wait(shipment.written)
    shipment.path
end

"On the owner: the array, for a worker that could not map the file."
shipped_array(id::Int) = lock(() -> SHIPPED[id].signals, SHIPPED_LOCK)
