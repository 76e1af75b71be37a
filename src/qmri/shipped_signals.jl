# How a call over workers hands them its signals. Every worker needs all of them (the workers
# split atoms, not voxels), and serializing a 131 MB array once per worker through the loopback
# socket cost more than a tenth of a two-GPU call. So the caller writes the signals once to a
# file in shared memory (/dev/shm, else the temporary directory) and each worker on its host maps
# that file; a worker that cannot see the file (another host, or one whose file system differs)
# asks the caller for the array, which is then serialized to it as before. A random token at the
# head of the file keeps a worker from mapping another call's file of the same name.

"What a worker is sent in place of the signals (see `with_shipped_signals`)."
struct ShippedSignals{N}
    owner::Int                        # the process that holds the array
    id::Int                           # its key in that process's `SHIPPED`
    path::Union{Nothing,String}       # the shared file, or nothing when none could be written
    dims::NTuple{N,Int}
    token::UInt128
end

const SHIPPED = Dict{Int,Array{ComplexF32}}()
const SHIPPED_LOCK = ReentrantLock()
const SHIPPED_NEXT = Ref(0)
const SHARED_HEADER = 64              # bytes before the data: the token, then padding

"""
Runs `f(shipped)` while workers can reach `signals` through `shipped`: the array stays held in
this process, and (when it can be written) in a shared file that is removed when `f` returns or
throws.
"""
function with_shipped_signals(f, signals::Array{ComplexF32})
    token = rand(UInt128)
    id = lock(SHIPPED_LOCK) do
        SHIPPED_NEXT[] += 1
        SHIPPED[SHIPPED_NEXT[]] = signals
        SHIPPED_NEXT[]
    end
    path = nothing
    try
        path = write_shared(signals, token)
        f(ShippedSignals(Distributed.myid(), id, path, size(signals), token))
    finally
        path === nothing || rm(path; force = true)
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

"On a worker: the signals, mapped from the shared file when it is there, else fetched."
function receive_signals(s::ShippedSignals{N}) where {N}
    mapped = s.path === nothing ? nothing : map_shared(s)
    mapped === nothing ? Distributed.remotecall_fetch(shipped_array, s.owner, s.id) : mapped
end

"The shared file mapped read-only, or nothing when it is missing or not this call's."
function map_shared(s::ShippedSignals{N}) where {N}
    bytes = SHARED_HEADER + sizeof(ComplexF32) * prod(s.dims)
    try
        open(s.path) do io
            filesize(io) == bytes && read(io, UInt128) == s.token || return nothing
            Mmap.mmap(io, Array{ComplexF32,N}, s.dims, SHARED_HEADER; shared = true)
        end
    catch err
        err isa SystemError || err isa Base.IOError || err isa EOFError || rethrow()
        nothing
    end
end

"On the owner: the array a worker that could not map the file asks for."
shipped_array(id::Int) = lock(() -> SHIPPED[id], SHIPPED_LOCK)
