# Scale-out over Distributed workers: the dictionary's atoms are split into one contiguous
# range per worker; each worker simulates (and matches) its range on its default manager of its
# own device, as one process computes on its own, and frees what the call made before it returns,
# so a call leaves no memory in use on any worker, whether it succeeds or another worker dies.
# The manager and the pool it has reserved stay for the next call: a manager made and closed per
# call reserved and returned the dictionary batch's gigabytes each time. Results equal one process's: every
# atom is simulated, and every (atom, voxel) score computed, by the same code; the best atom
# per voxel is reduced in atom order with the same tie rule (the lower index wins).

"""
    QMRI.WorkerError

Thrown by `simulate_fisp`, `simulate_pssfp` and `match` with `workers` when a worker fails:
`worker` (its id), `device` and `atoms` (the range it had; `nothing` when it failed while asked
for its host and devices), and `cause` (the remote exception; a `ProcessExitedException` when
the worker process died). The other workers finished their
parts and freed their memory before this was thrown.
"""
struct WorkerError <: Exception
    call::String
    worker::Int
    device::Union{Nothing,Int}
    atoms::Union{Nothing,UnitRange{Int}}
    cause::Any
end

function Base.showerror(io::IO, e::WorkerError)
    died = e.cause isa Distributed.ProcessExitedException ||
           (e.cause isa Distributed.RemoteException && e.cause.captured.ex isa Distributed.ProcessExitedException)
    print(io, "QMRI.", e.call, ": worker ", e.worker)
    e.device === nothing || print(io, " (device ", e.device, ", atoms ", first(e.atoms), ":", last(e.atoms), ")")
    print(io, died ? " died (its process exited)" : " failed")
    e.device === nothing && print(io, " when asked for its host and devices")
    print(io, "; the other workers finished and freed their memory")
    if !died
        print(io, ". Its error:\n")
        cause = e.cause isa Distributed.RemoteException ? e.cause.captured.ex : e.cause
        showerror(io, cause)
        if cause isa UndefVarError || cause isa KeyError
            print(io, "\n(is Kmm loaded on every worker? `@everywhere using Kmm`, with the workers ",
                  "started in the same project: addprocs(n; exeflags = \"--project\"))")
        end
    end
end

"The worker ids, checked: a non-empty vector of distinct live processes."
function check_workers(workers)
    ws = collect(Int, workers)
    isempty(ws) && throw(ArgumentError("workers is empty: give worker ids, e.g. Distributed.workers()"))
    allunique(ws) || throw(ArgumentError("workers = $ws names a worker twice"))
    live = Distributed.procs()
    for w in ws
        w in live || throw(ArgumentError("workers = $ws: process $w does not exist (live: $live)"))
    end
    ws
end

"""
The checked workers that get atoms, their atom ranges and devices, and the parameters as a
checked host matrix: what a call over workers starts with.
"""
function plan_workers(call::String, workers, params, devices, check::Bool)
    ws = check_workers(workers)
    p = host_params(params)
    check && check_params(p)
    ranges = split_atoms(size(p, 2), length(ws))
    ws = ws[1:length(ranges)]
    (ws, ranges, worker_devices(call, ws, devices), p)
end

"This process's host name and device count (run on a worker)."
worker_info() = (Libc.gethostname(), Kmm.device_count())

"""
The device of each worker: `devices[i]` (cycled) when given, else the workers of each host take
that host's devices in turn (worker order), as a SLURM allocation of several GPUs per node wants.
"""
function worker_devices(call::String, ws::Vector{Int}, devices)
    if devices !== nothing
        ds = collect(Int, devices)
        isempty(ds) && throw(ArgumentError("devices is empty"))
        return [ds[mod1(i, length(ds))] for i in 1:length(ws)]
    end
    infos = on_workers(call, ws, [nothing for _ in ws], [nothing for _ in ws],
                       (i, w) -> Distributed.remotecall(worker_info, w))
    seen = Dict{String,Int}()
    map(infos) do (host, count)
        k = get(seen, host, 0)
        seen[host] = k + 1
        k % max(count, 1)
    end
end

"`natoms` atoms in `n` contiguous ranges as equal as can be (empty ranges dropped)."
function split_atoms(natoms::Int, n::Int)
    edges = [div(natoms * k, n) for k in 0:n]
    filter(!isempty, [edges[k]+1:edges[k+1] for k in 1:n])
end

"""
Sends `send(i, ws[i])` (a `Future`, from `remotecall`) to every worker, runs `sent()` once every
call has gone out, then waits for each and returns `then(i, value)` of each; a failure becomes
a `WorkerError` once every other worker has finished (their own cleanup has run).
"""
function on_workers(call::String, ws::Vector{Int}, devs, ranges, send;
                    sent = () -> nothing, then = (i, value) -> value)
    # An interrupt (Ctrl-C) is the caller's, not a worker's failure: it ends the call at once.
    caught(err) = err isa InterruptException ? rethrow() : err
    calls = Any[try send(i, w) catch err caught(err) end for (i, w) in enumerate(ws)]
    sent()
    outcomes = map(enumerate(calls)) do (i, c)
        c isa Distributed.Future || return (false, c)     # a worker that could not be sent to
        try
            (true, then(i, fetch(c)))
        catch err
            (false, caught(err))
        end
    end
    for (i, (ok, value)) in enumerate(outcomes)
        ok || throw(WorkerError(call, ws[i], devs[i], ranges[i], value))
    end
    [value for (_, value) in outcomes]
end

# ---- simulation ------------------------------------------------------------------------------

function remote_simulate(seq, p::Matrix{Float32}, device::Int, check::Bool)
    with_temporaries() do made
        d = temp!(made, simulate(seq, p; manager = default_manager(device), check = check))
        Array(d)                                      # d is freed also when the copy back fails
    end
end

function simulate_on_workers(seq::AbstractSequence, params, manager::KmmManager, check::Bool,
                             workers, devices)
    call = seq isa FISPSequence ? "simulate_fisp" : "simulate_pssfp"
    ws, ranges, devs, p = plan_workers(call, workers, params, devices, check)
    ntr = length(seq)
    with_temporaries() do made
        out = result!(made, KmmArray{ComplexF32}(undef, length(seq), size(p, 2); manager = manager))
        on_workers(call, ws, devs, ranges,
                   (i, w) -> Distributed.remotecall(remote_simulate, w, seq, p[:, ranges[i]], devs[i], false);
                   then = (i, part) -> copyto!(out, (first(ranges[i]) - 1) * ntr + 1, part, 1, length(part)))
        out
    end
end

"Parameters as a checked host `4 x natoms` Float32 matrix."
function host_params(params)
    p = params isa KmmArray ? Array(params) : params
    p isa AbstractMatrix{<:Real} || throw(ArgumentError(
        "parameters must be a 4 x natoms KmmArray{Float32} or matrix, got $(typeof(params))"))
    size(p, 1) == 4 || throw(ArgumentError("parameters must be 4 x natoms (T1, T2, B1, B0), got $(size(p))"))
    size(p, 2) >= 1 || throw(ArgumentError("the dictionary is empty: parameters have 0 atoms"))
    Matrix{Float32}(p)
end

# ---- matching --------------------------------------------------------------------------------

"What a worker's match returns: host vectors per voxel, the index global (0: no match)."
struct PartialMatch
    index::Vector{Int32}
    score::Vector{Float32}
    PD::Vector{ComplexF32}
    pd_normalized::Vector{ComplexF32}
    params::Matrix{Float32}
    batches::Int
    seconds::Dict{Symbol,Float64}
end

function remote_match(seq, p::Matrix{Float32}, first_atom::Int, shipped::ShippedSignals, basis,
                      rank::Int, batch_atoms, max_bytes, device::Int, timings::Bool)
    r = match(seq, p, shipped; rank = basis === nothing ? rank : 0, basis = basis,
              batch_atoms = batch_atoms, max_bytes = max_bytes, manager = default_manager(device),
              check = false, timings = timings)
    maps = (r.index, r.score, r.PD, r.pd_normalized, r.T1, r.T2, r.B1, r.B0)
    idx, score, PD, pdn, T1, T2, B1, B0 = with_temporaries() do made
        foreach(x -> temp!(made, x), maps)            # freed also when a copy back fails
        map(x -> vec(Array(x)), maps)
    end
    idx .= ifelse.(idx .> 0, idx .+ Int32(first_atom - 1), Int32(0))
    PartialMatch(idx, score, PD, pdn, vcat(T1', T2', B1', B0'), r.batches, r.seconds)
end

function match_on_workers(seq::AbstractSequence, params, signals, manager::KmmManager;
                          rank::Integer, basis, basis_atoms::Integer, batch_atoms, max_bytes,
                          check::Bool, timings::Bool, workers, devices)
    ntr = length(seq)
    check_rank(rank, ntr)
    # Checked here, as one process does, and shipped to the workers as ComplexF32.
    # (copyto!, not convert: a view with offset axes is copied by position, as one process does)
    host_signals = signals isa KmmArray ? Array(signals) : copyto!(Array{ComplexF32}(undef, size(signals)), signals)
    vdims, _ = signal_dims(host_signals, ntr)
    ws, ranges, devs, p = plan_workers("match", workers, params, devices, check)
    # One basis for every worker, so that their scores compare (as one process's batches do).
    tbasis = @elapsed begin
        u = choose_basis(basis, rank, ntr, manager)
        if u === nothing && 0 < rank < ntr
            u = compression_basis(seq, p; rank = rank, atoms = basis_atoms, manager = manager)
        end
        hu = with_temporaries() do made
            temp!(made, u, basis)
            u === nothing ? nothing : Array(u)
        end
    end
    parts = with_shipped_signals(host_signals) do shipped, write_file
        on_workers("match", ws, devs, ranges,
                   (i, w) -> Distributed.remotecall(remote_match, w, seq, p[:, ranges[i]], first(ranges[i]),
                                                    shipped, hu, Int(rank), batch_atoms, max_bytes,
                                                    devs[i], timings);
                   sent = write_file)
    end
    best = reduce_matches(parts)
    seconds = Dict{Symbol,Float64}()
    if timings    # the slowest worker's times: the workers run at once
        for part in parts, (k, v) in part.seconds
            seconds[k] = max(get(seconds, k, 0.0), v)
        end
        seconds[:basis] = tbasis
    end
    with_temporaries() do made  # the maps: freed if a later one cannot be made
        up(a) = result!(made, KmmArray(reshape(a, vdims); manager = manager))
        MatchResult{length(vdims)}(up(best.index), up(best.score), up(best.PD), up(best.pd_normalized),
                                   (up(best.params[r, :]) for r in 1:4)..., size(p, 2),
                                   sum(part.batches for part in parts), seconds)
    end
end

"""
The best atom per voxel over the workers' parts, in atom order: a part replaces the best so far
only with a match and a strictly higher score (one process's accumulate rule: ties keep the
lower index, and a part without a match keeps the earlier one).
"""
function reduce_matches(parts::Vector{PartialMatch})
    best = deepcopy(parts[1])
    for part in parts[2:end], v in 1:length(best.index)
        if part.index[v] != 0 && (best.index[v] == 0 || part.score[v] > best.score[v])
            best.index[v], best.score[v] = part.index[v], part.score[v]
            best.PD[v], best.pd_normalized[v] = part.PD[v], part.pd_normalized[v]
            best.params[:, v] = view(part.params, :, v)
        end
    end
    best
end
