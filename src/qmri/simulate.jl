# Dictionary simulation: kmm_qmri_simulate_fisp / kmm_qmri_simulate_pssfp on KmmArrays.

"""
The qMRI calls take buffer handles without offsets: an array that starts inside its buffer
(a view) is copied to a buffer of its own first.
"""
whole_buffer(x::KmmArray) = x.offset == 0 ? x : copy(x)

"""
Frees `x` when this call made it from the caller's `arg` (an upload or a copy), never the
caller's own memory: a call frees its temporaries in stream order instead of leaving device
memory to the next collection (a loop of calls, or a worker serving many, would otherwise hold
gigabytes until then).
"""
release_made(x, arg) = (x isa KmmArray && !(arg isa KmmArray && x.storage === arg.storage) && Kmm.unsafe_free!(x); nothing)

# Every call here frees the device arrays it makes at once (see `release_made`): its temporaries
# when it returns or throws, and what it would have returned when it throws (a failed call leaves
# nothing behind: a retry or the next batch finds the memory free). `with_temporaries` is that
# try/catch/finally, written once instead of in each call.

"What a call under `with_temporaries` has made so far: `(array, caller's argument)` pairs."
struct Made
    temporaries::Vector{Pair{Any,Any}}    # freed when the call returns or throws
    results::Vector{Pair{Any,Any}}        # freed only when it throws
end

"""
    temp!(made, x, arg = nothing) -> x

Notes `x` as a temporary of the call (freed when it returns or throws), made from the caller's
`arg`: `x` is freed only if it is not `arg`'s own memory (`release_made`). `x` may be `nothing`.
"""
temp!(made::Made, x, arg = nothing) = (push!(made.temporaries, x => arg); x)

"""
    result!(made, x, arg = nothing) -> x

Notes `x` as (part of) what the call returns: freed only if the call throws, as `temp!` frees.
"""
result!(made::Made, x, arg = nothing) = (push!(made.results, x => arg); x)

"""
    with_temporaries(f)

Returns `f(made)`, `made` a new `Made` that `f` notes its arrays in (`temp!`, `result!`). When
`f` returns, its temporaries are freed; when it throws, its results too, and the error goes on.
Frees run newest first, results before temporaries.
"""
function with_temporaries(f)
    made = Made(Pair{Any,Any}[], Pair{Any,Any}[])
    returned = false
    try
        value = f(made)
        returned = true
        return value
    finally
        try
            returned || foreach(p -> release_made(p.first, p.second), Iterators.reverse(made.results))
        finally
            foreach(p -> release_made(p.first, p.second), Iterators.reverse(made.temporaries))
        end
    end
end

"`params` as a `4 x natoms` `KmmArray{Float32,2}` on `m` (host arrays are checked and uploaded)."
function as_params(params, m::KmmManager)
    if params isa KmmArray
        eltype(params) == Float32 || throw(ArgumentError(
            "parameters must hold Float32 (T1, T2, B1, B0 records), got $(eltype(params))"))
        p = ndims(params) == 2 ? params : reshape(params, 4, :)
        size(p, 1) == 4 || throw(ArgumentError("parameters must be 4 x natoms (T1, T2, B1, B0), got $(size(params))"))
        size(p, 2) >= 1 || throw(ArgumentError("the dictionary is empty: parameters have 0 atoms"))
        Kmm.manager(p) === m && return whole_buffer(p)
        return KmmArray(Array(p); manager = m)
    elseif params isa AbstractMatrix{<:Real}
        check_params(params)
        return KmmArray{Float32}(params; manager = m)
    end
    throw(ArgumentError("parameters must be a 4 x natoms KmmArray{Float32} or matrix, got $(typeof(params))"))
end

default_manager_of(x) = x isa KmmArray ? Kmm.manager(x) : default_manager()

# The export that simulates each kind of sequence (GC-safe: the check waits for the stream).
simulate_export(::FISPSequence, mh, cs, ph, first, n, oh, flags) =
    @gcsafe LibKmm.unchecked_kmm_qmri_simulate_fisp(mh, cs, ph, first, n, oh, flags)
simulate_export(::PSSFPSequence, mh, cs, ph, first, n, oh, flags) =
    @gcsafe LibKmm.unchecked_kmm_qmri_simulate_pssfp(mh, cs, ph, first, n, oh, flags)

# The raw call: atoms first_atom .. first_atom + n - 1 (0-based) into `out` (ntr x n). The
# check reads the parameters back, after the stream's queued work (`after_queued_work`).
function simulate_raw!(out::KmmArray{ComplexF32}, seq::AbstractSequence, p::KmmArray{Float32},
                       first_atom::Integer, n::Integer, check::Bool)
    (mh, ph), (_, oh) = handles(p.storage), handles(out.storage)
    flags = check ? UInt32(0) : UInt32(LibKmm.KMM_QMRI_SKIP_CHECKS)
    call() = GC.@preserve seq p out begin
        cs = Ref(cstruct(seq))
        LibKmm.check_status(simulate_export(seq, mh, cs, ph, UInt64(first_atom), UInt64(n), oh, flags))
    end
    check ? after_queued_work(call, Kmm.manager(p)) : call()
    out
end

function simulate(seq::AbstractSequence, params; manager::KmmManager = default_manager_of(params),
                  check::Bool = true, workers = nothing, devices = nothing)
    workers === nothing || return simulate_on_workers(seq, params, manager, check, workers, devices)
    with_temporaries() do made
        p = temp!(made, as_params(params, manager), params)
        n = size(p, 2)
        out = result!(made, KmmArray{ComplexF32}(undef, length(seq), n; manager = manager))
        simulate_raw!(out, seq, p, 0, n, check)
    end
end

"""
    simulate_fisp(seq::FISPSequence, params; manager, check = true, workers, devices) -> KmmArray{ComplexF32,2}

The FISP signals (`ntr x natoms`, one atom per column) of the atoms `params` (`4 x natoms`
Float32: T1 s, T2 s, B1, B0 Hz; a KmmArray, or a host matrix that is uploaded) on `manager`
(default: the manager of `params`, else `Kmm.default_manager()`). Returns once the work is
queued; reading the result (`Array`) waits for it. `check = false` skips the library's check
of the parameters (T1, T2 > 0; B1, B0 finite), which waits for the stream.

With `workers` (Distributed process ids, e.g. `workers()`), the atoms are split into one
contiguous range per worker; each simulates its range on its default manager of its own
device (`devices[i]` for the i-th worker when given, else each host's workers take that host's
devices in turn), and the result is gathered into one array on `manager`, equal to one
process's. Kmm must be loaded on every worker (`@everywhere using Kmm`). A worker that fails or
dies fails the call with a `QMRI.WorkerError`, after the others have finished and freed what
the call made there. See docs/multi-gpu.md.
"""
simulate_fisp(seq::FISPSequence, params; kw...) = simulate(seq, params; kw...)

"""
    simulate_pssfp(seq::PSSFPSequence, params; manager, check = true) -> KmmArray{ComplexF32,2}

The pSSFP signals (`ntr x natoms`) of the atoms `params`, as `simulate_fisp` does for FISP.
"""
simulate_pssfp(seq::PSSFPSequence, params; kw...) = simulate(seq, params; kw...)
