# Dictionary matching (kmm_qmri_match), from a dictionary in memory or generated in batches.

"""
    MatchResult

What `QMRI.match` returns: maps with the shape of the voxel dimensions of the signals, all
KmmArrays on the manager the match ran on: the signals' for `match(seq, params, signals)`, the
dictionary's for `match(dict, signals)` and `match(::Dictionary, signals)`.

- `index`: the best atom of each voxel (1-based column of the dictionary / parameters), `Int32`;
  0 where no atom matches (a zero or non-finite signal), with score, PD and parameters 0 there
- `score`: |dᴴx| / (‖d‖ ‖x‖), 1 for a perfect match, `Float32`; compressed on a basis U, d is
  the atom's projection UUᴴd and x the whole signal (scores of batches and bases compare)
- `PD`: complex proton density: the scale with x ≈ PD · d of the simulated (unnormalised)
  atom d, `ComplexF32`
- `pd_normalized`: dᴴx / ‖d‖, the scale of the unit-norm atom (what the C ABI reports)
- `T1`, `T2`, `B1`, `B0`: the best atom's parameters (`Float32`; `nothing` when the match had
  no parameters)
- `natoms`, `batches`: the dictionary size and the number of batches it was matched in
- `seconds`: with `timings = true`, the time spent simulating (`:simulate`), matching
  (`:match`) and computing the compression basis (`:basis`), each step waited for; else empty
"""
struct MatchResult{N}
    index::KmmArray{Int32,N}
    score::KmmArray{Float32,N}
    PD::KmmArray{ComplexF32,N}
    pd_normalized::KmmArray{ComplexF32,N}
    T1::Union{Nothing,KmmArray{Float32,N}}
    T2::Union{Nothing,KmmArray{Float32,N}}
    B1::Union{Nothing,KmmArray{Float32,N}}
    B0::Union{Nothing,KmmArray{Float32,N}}
    natoms::Int
    batches::Int
    seconds::Dict{Symbol,Float64}
end

function Base.show(io::IO, r::MatchResult)
    print(io, "MatchResult(", join(size(r.index), "x"), " voxels, ", r.natoms, " atoms in ",
          r.batches, r.batches == 1 ? " batch)" : " batches)")
end

# Raw outputs of kmm_qmri_match: one entry per voxel, on the signals' manager.
struct RawOutputs
    index::KmmArray{Int32,1}
    score::KmmArray{Float32,1}
    pd::KmmArray{ComplexF32,1}
    params::Union{Nothing,KmmArray{Float32,2}}
end

function RawOutputs(m::KmmManager, nvox::Int, with_params::Bool)
    with_temporaries() do made                         # those made before an allocation failed
        new_array(T, dims...) = result!(made, KmmArray{T}(undef, dims...; manager = m))
        RawOutputs(new_array(Int32, nvox), new_array(Float32, nvox), new_array(ComplexF32, nvox),
                   with_params ? new_array(Float32, 4, nvox) : nothing)
    end
end

"Frees the outputs of a match that failed (`with_temporaries`' `result!`)."
release_made(o::RawOutputs, arg) = foreach(x -> release_made(x, nothing), (o.index, o.score, o.pd, o.params))

function match_raw!(o::RawOutputs, dict::KmmArray{ComplexF32}, ntr::Int, natoms::Int, offset::Int,
                    signals::KmmArray{ComplexF32}, nvox::Int, rank::Int,
                    params::Union{Nothing,KmmArray{Float32}}, accumulate::Bool,
                    basis::Union{Nothing,KmmArray{ComplexF32}} = nothing, check_basis::Bool = true)
    mh, dh = handles(dict.storage)
    _, sh = handles(signals.storage)
    ph = params === nothing ? UInt64(0) : handles(params.storage)[2]
    outs = Ref(LibKmm.KmmMatchOutputs(handles(o.index.storage)[2], handles(o.score.storage)[2],
                                      handles(o.pd.storage)[2],
                                      o.params === nothing ? UInt64(0) : handles(o.params.storage)[2]))
    flags = accumulate ? UInt32(LibKmm.KMM_MATCH_ACCUMULATE) : UInt32(0)
    GC.@preserve dict signals params o basis begin
        if basis === nothing
            # GC-safe: a compressed match that computes its own basis waits for the stream.
            LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_match(
                mh, dh, UInt64(ntr), UInt64(natoms), UInt64(offset), sh, UInt64(nvox), UInt32(rank), ph, outs, flags))
        else
            # The library checks a basis it did not make (orthonormal columns), once per match:
            # it reads the basis back, after the stream's queued work (`after_queued_work`).
            # (One assignment: a variable the closure captures and that is assigned again is
            # boxed, untyped, and the call inside the GC-safe region would be dispatched there.)
            bflags = check_basis ? flags : flags | UInt32(LibKmm.KMM_MATCH_SKIP_CHECKS)
            bh, r = handles(basis.storage)[2], UInt32(size(basis, 2))
            call() = LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_match_in_basis(
                mh, dh, UInt64(ntr), UInt64(natoms), UInt64(offset), sh, UInt64(nvox), bh, r, ph, outs, bflags))
            check_basis ? after_queued_work(call, Kmm.manager(dict)) : call()
        end
    end
    o
end

"""
    compression_basis(dict::KmmArray{ComplexF32,2}; rank) -> KmmArray{ComplexF32,2}
    compression_basis(seq, params; rank, atoms = 2000, manager) -> KmmArray{ComplexF32,2}

The orthonormal basis (`ntr x rank`) of the dominant rank-`rank` subspace of a dictionary's TR
space (SVD compression), on the dictionary's manager. From a sequence and its atoms, the
dictionary is sampled: `atoms` atoms evenly spaced over the columns of `params` (all of them
when there are fewer) are simulated and the basis is theirs. Pass it to `match(...; basis)`
to match many dictionaries or batches in one basis.
"""
# The rank of a compression basis: an integer in 1:ntr, not a Bool (true is no rank 1).
check_basis_rank(rank, ntr) = (!(rank isa Bool) && 1 <= rank <= ntr) || throw(ArgumentError(
    "rank = $(repr(rank)) must be an integer in 1:ntr ($ntr)$(rank isa Bool ? ", not a Bool," : "") for a compression basis"))

function compression_basis(dict::KmmArray{ComplexF32,2}; rank::Integer)
    ntr, natoms = size(dict)
    natoms >= 1 || throw(ArgumentError("the dictionary is empty (0 atoms)"))
    check_basis_rank(rank, ntr)
    m = Kmm.manager(dict)
    with_temporaries() do made
        d = temp!(made, whole_buffer(dict), dict)     # the copy of a view
        u = result!(made, KmmArray{ComplexF32}(undef, ntr, Int(rank); manager = m))
        (mh, dh), uh = handles(d.storage), handles(u.storage)[2]
        # The eigensolver's status is read back, after the stream's queued work.
        GC.@preserve d u after_queued_work(m) do
            LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_compression_basis(
                mh, dh, UInt64(ntr), UInt64(natoms), UInt32(rank), uh))
        end
        u
    end
end

function compression_basis(seq::AbstractSequence, params; rank::Integer, atoms::Integer = 2000,
                           manager::KmmManager = default_manager_of(params))
    atoms = count_arg("compression_basis", :atoms, atoms)
    check_basis_rank(rank, length(seq))
    with_temporaries() do made
        p = temp!(made, as_params(params, manager), params)
        natoms = size(p, 2)
        # evenly spaced atoms, first to last (one atom: the first; Julia 1.5's range refuses a
        # length of 1 between distinct endpoints)
        k = min(atoms, natoms)
        pick = k == 1 ? [1] : unique(round.(Int, range(1, natoms; length = k)))
        sample = length(pick) == natoms ? p : temp!(made, KmmArray(Array(p)[:, pick]; manager = manager))
        d = temp!(made, KmmArray{ComplexF32}(undef, length(seq), length(pick); manager = manager))
        simulate_raw!(d, seq, sample, 0, length(pick), false)
        compression_basis(d; rank = rank)
    end
end

"A given basis as an `ntr x rank` KmmArray on `m` (the library checks that it is orthonormal)."
function prepare_basis(basis, ntr::Int, m::KmmManager)
    # Checked before anything is uploaded, so that a bad basis leaves nothing behind.
    bad() = throw(ArgumentError("basis must be an ntr x rank matrix of ComplexF32, got $(typeof(basis)) of size $(size(basis))"))
    basis isa AbstractMatrix || bad()
    eltype(basis) == ComplexF32 || (!(basis isa KmmArray) && eltype(basis) <: Number) || bad()
    size(basis, 1) == ntr || throw(DimensionMismatch(
        "basis has $(size(basis, 1)) rows (TRs) but the dictionary has $ntr"))
    1 <= size(basis, 2) <= ntr || throw(ArgumentError("basis has $(size(basis, 2)) columns: the rank must be in 1:$ntr"))
    b = basis isa KmmArray ? basis : KmmArray{ComplexF32}(basis; manager = m)
    Kmm.manager(b) === m || (b = KmmArray(Array(b); manager = m))
    whole_buffer(b)
end

"Signals as (ntr x nvox contiguous KmmArray on m, voxel dims)."
function prepare_signals(signals, ntr::Int, m::KmmManager)
    # The shape is checked before anything is uploaded (a host array converts to ComplexF32).
    signals isa AbstractArray && signal_shape(size(signals), ntr)
    s = signals isa KmmArray ? signals : KmmArray{ComplexF32}(signals; manager = m)
    vdims, nvox = signal_dims(s, ntr)
    Kmm.manager(s) === m || (s = KmmArray(Array(s); manager = m))
    (whole_buffer(s), vdims, nvox)
end

"""
Signals as `prepare_signals` gives them, and a function that fills them, or nothing when they
are filled already. A worker's shipped signals are filled once they arrive: the caller runs the
function after it has queued its first simulation, so that the wait overlaps it.
"""
function prepare_signals_later(signals, ntr::Int, m::KmmManager)
    signals isa ShippedSignals || return (prepare_signals(signals, ntr, m)..., nothing)
    vdims, nvox = signal_shape(signals.dims, ntr)
    s = KmmArray{ComplexF32}(undef, ntr, nvox; manager = m)
    # The copy is synchronous: the signals have been read when it returns, and may be unmapped.
    arrive() = with_received_signals(x -> (copyto!(s, 1, x, 1, length(s)); nothing), signals)
    (s, vdims, nvox, arrive)
end

"The voxel dimensions and count of `ntr x voxels...` ComplexF32 signals, checked."
function signal_dims(s::AbstractArray, ntr::Int)
    eltype(s) == ComplexF32 || throw(ArgumentError("signals must hold ComplexF32, got $(eltype(s))"))
    signal_shape(size(s), ntr)
end

"The voxel dimensions and count of signals of size `dims`, checked."
function signal_shape(dims::Tuple, ntr::Int)
    length(dims) >= 1 || throw(ArgumentError("signals must be ntr x voxels..."))
    dims[1] == ntr || throw(DimensionMismatch(
        "signals have $(dims[1]) time points (first dimension) but the dictionary has $ntr"))
    vdims = length(dims) == 1 ? (1,) : dims[2:end]
    nvox = prod(vdims)
    nvox >= 1 || throw(ArgumentError("signals hold no voxels"))
    (vdims, nvox)
end

check_rank(rank, ntr) = (!(rank isa Bool) && 0 <= rank <= ntr) || throw(ArgumentError(
    "rank = $(repr(rank)) must be an integer in 0:ntr ($ntr)$(rank isa Bool ? ", not a Bool" : ""); 0 matches without compression"))

"The basis a match uses: the given one, or none (rank 0 or ntr, or `own` for the dictionary's own)."
function choose_basis(basis, rank::Integer, ntr::Int, m::KmmManager)
    basis === nothing && return nothing
    rank == 0 || rank == size(basis, 2) || throw(ArgumentError(
        "rank = $rank and a basis of rank $(size(basis, 2)) are given: give one of them"))
    prepare_basis(basis, ntr, m)
end

"""
    match(dict, signals; params = nothing, rank = 0) -> MatchResult

Matches each voxel signal (columns of `signals`: `ntr x voxels...`, `ComplexF32`) against the
atoms of `dict` (`ntr x natoms`, e.g. from `simulate_fisp`) on the dictionary's manager: the
atom with the largest |dᴴx|/‖d‖ wins (ties: the lower index). With `params` (`4 x natoms`)
the maps include T1, T2, B1, B0. `rank > 0` first compresses dictionary and signals to the
dominant rank-`rank` subspace of the dictionary (SVD); `basis` (from `compression_basis`)
compresses on a given basis instead. Compressed, each atom is matched as its projection on
the basis and scores use the norm of the whole signal; `PD` is relative to the projection.

    match(seq, params, signals; rank = 0, batch_atoms = nothing, max_bytes = nothing) -> MatchResult

Generates the dictionary of `seq` (a `FISPSequence` or `PSSFPSequence`) over the atoms
`params` and matches it, in batches of atoms when it does not fit: each batch is simulated,
matched keeping the running best per voxel (`KMM_MATCH_ACCUMULATE`), and freed. The batch is
`batch_atoms` atoms when given, else chosen from the device's free memory (a quarter of it, at
most `max_bytes`, default 2 GiB, for the batch's dictionary); an allocation that still fails
(e.g. the manager's hard limit) halves the batch and retries. With `rank > 0` every batch is
compressed on one basis, so that their scores compare: `basis` when given, else
`compression_basis(seq, params; rank, atoms = basis_atoms)` (a sample of `basis_atoms`
atoms, default 2000, spread over `params`). `timings = true` waits for each step and records the time
spent simulating and matching in `result.seconds`; `verbose = true` prints each batch.

With `workers` (Distributed process ids), the atoms are split into one contiguous range per
worker, each generates and matches its range against all signals on its default manager of
its own device (`devices` as for `simulate_fisp`), and the best atom per voxel is reduced in
atom order: the maps equal one process's. The compression basis, when one is needed, is
computed once here and used by every worker. The maps are KmmArrays on `manager`;
`result.seconds` holds the slowest worker's times. A worker that fails or dies fails the call
with a `QMRI.WorkerError` after the others have finished and freed their memory.
"""
function match(dict::KmmArray{ComplexF32,2}, signals; params = nothing, rank::Integer = 0,
               basis = nothing, timings::Bool = false)
    m = Kmm.manager(dict)
    ntr, natoms = size(dict)
    natoms >= 1 || throw(ArgumentError("the dictionary is empty (0 atoms)"))
    check_rank(rank, ntr)
    with_temporaries() do made
        u = temp!(made, choose_basis(basis, rank, ntr, m), basis)
        p = params === nothing ? nothing : temp!(made, as_params(params, m), params)
        p === nothing || size(p, 2) == natoms || throw(DimensionMismatch(
            "params describe $(size(p, 2)) atoms but the dictionary has $natoms"))
        s, vdims, nvox = prepare_signals(signals, ntr, m)
        temp!(made, s, signals)
        d = temp!(made, whole_buffer(dict), dict)
        checked = u !== nothing
        if u === nothing && 0 < rank < ntr    # the dictionary's own basis, kept for the PD's norms
            u = temp!(made, compression_basis(d; rank = rank))
        end
        o = result!(made, RawOutputs(m, nvox, p !== nothing))
        t = @elapsed begin
            match_raw!(o, d, ntr, natoms, 0, s, nvox, Int(rank), p, false, u, checked)
            timings && Kmm.synchronize(m)
        end
        finish(o, vdims, natoms, 1, idx -> dictionary_norms(d, idx, u),
               timings ? Dict(:match => t) : Dict{Symbol,Float64}())
    end
end

match(dict::KmmArray{ComplexF32}, signals; kw...) =
    throw(ArgumentError("the dictionary must be a matrix (ntr x natoms), got size $(size(dict))"))
match(dict::AbstractMatrix{<:Complex}, signals; params = nothing, kw...) =
    with_upload(d -> match(d, signals; params = params, kw...),
                KmmArray{ComplexF32}(dict; manager = default_manager_of(signals)))

"`f(x)` for an array this call uploaded, freed (in stream order) when `f` returns or throws."
with_upload(f, x::KmmArray) = with_temporaries(made -> f(temp!(made, x)))

function match(seq::AbstractSequence, params, signals; rank::Integer = 0, basis = nothing,
               basis_atoms::Integer = 2000, batch_atoms::Union{Nothing,Integer} = nothing,
               max_bytes::Union{Nothing,Integer} = nothing,
               manager::KmmManager = default_manager_of(signals), check::Bool = true,
               verbose::Bool = false, timings::Bool = false, workers = nothing, devices = nothing)
    batch_atoms === nothing || count_arg("match", :batch_atoms, batch_atoms)
    max_bytes === nothing || count_arg("match", :max_bytes, max_bytes)
    workers === nothing || return match_on_workers(seq, params, signals, manager; rank = rank,
        basis = basis, basis_atoms = basis_atoms, batch_atoms = batch_atoms, max_bytes = max_bytes,
        check = check, timings = timings, workers = workers, devices = devices)
    m = manager
    ntr = length(seq)
    check_rank(rank, ntr)
    # A call that fails frees what it made too: later calls' batches see the memory free.
    with_temporaries() do made
        p = temp!(made, as_params(params, m), params)
        match_batches(seq, p, signals, m, rank, basis, basis_atoms, batch_atoms, max_bytes, check,
                      verbose, timings, made)
    end
end

"""
The generate-and-match loop of `match(seq, params, signals)` on `m`. It notes in `made` each
array it makes as it goes (`temp!`, `result!`), so that the caller's `with_temporaries` frees
them whether the loop returns or throws.
"""
function match_batches(seq, p, signals, m, rank, basis, basis_atoms, batch_atoms, max_bytes,
                       check, verbose, timings, made::Made)
    ntr, natoms = length(seq), size(p, 2)
    check && check_params(Array(p))
    s, vdims, nvox, arrive = prepare_signals_later(signals, ntr, m)
    temp!(made, s, signals)
    u = temp!(made, choose_basis(basis, rank, ntr, m), basis)
    check_basis, tbasis = u !== nothing, 0.0
    if u === nothing && 0 < rank < ntr
        t0 = time()
        u = temp!(made, compression_basis(seq, p; rank = rank, atoms = basis_atoms, manager = m))
        timings && (Kmm.synchronize(m); tbasis = time() - t0)
    end
    nb = batch_atoms === nothing ? auto_batch(m, ntr, natoms, max_bytes) :
                                   count_arg("match", :batch_atoms, batch_atoms)
    nb = min(nb, natoms)
    o = result!(made, RawOutputs(m, nvox, true))
    first, batches = 0, 0
    tsim = tmatch = 0.0
    while first < natoms
        n = min(nb, natoms - first)
        d = try
            KmmArray{ComplexF32}(undef, ntr, n; manager = m)
        catch err
            (err isa KmmOutOfMemoryError && nb > 1) || rethrow()
            nb = max(1, nb ÷ 2)
            verbose && println("QMRI.match: out of memory for $n atoms; batches of $nb atoms now")
            continue
        end
        temp!(made, d)          # freed below once matched; noted for a batch that fails
        t0 = time()
        simulate_raw!(d, seq, p, first, n, false)
        timings && (Kmm.synchronize(m); tsim += time() - t0)
        arrive === nothing || (arrive(); arrive = nothing)    # while the batch simulates
        t0 = time()
        match_raw!(o, d, ntr, n, first, s, nvox, Int(rank), p, batches > 0, u, check_basis && batches == 0)
        timings && (Kmm.synchronize(m); tmatch += time() - t0)
        Kmm.unsafe_free!(d)
        batches += 1
        verbose && println("QMRI.match: batch $batches: atoms $(first + 1):$(first + n) of $natoms")
        first += n
    end
    finish(o, vdims, natoms, batches, idx -> simulated_norms(seq, p, idx, u),
           timings ? Dict(:simulate => tsim, :match => tmatch, :basis => tbasis) : Dict{Symbol,Float64}())
end

"Atoms per batch: the dictionary batch takes at most a quarter of the free memory and max_bytes."
function auto_batch(m::KmmManager, ntr::Int, natoms::Int, max_bytes)
    free, total = Ref{UInt64}(0), Ref{UInt64}(0)
    GC.@preserve m LibKmm.kmm_manager_memory_info(Kmm.handle(m), free, total)
    budget = min(Int(min(free[], UInt64(typemax(Int)))) ÷ 4,
                 max_bytes === nothing ? 2^31 : count_arg("match", :max_bytes, max_bytes))
    per_atom = 8 * ntr
    max(1, min(natoms, budget ÷ per_atom, typemax(Int32)))
end

cnorm(v) = sqrt(sum(z -> abs2(ComplexF64(z)), v))

# The norm of an atom as the library matched it: of its coordinates U'd in the basis U when the
# match was compressed (the library's PD is relative to that), else of the atom.
atom_norm(col, U) = U === nothing ? cnorm(col) : cnorm(U' * ComplexF64.(col))
host_basis(u) = u === nothing ? nothing : ComplexF64.(Array(u))

"‖d_j‖ (in the basis `u`, if any) for the 0-based atoms `idx` of a dictionary in memory."
function dictionary_norms(d::KmmArray{ComplexF32,2}, idx::Vector{Int}, u = nothing)
    ntr = size(d, 1)
    col = Vector{ComplexF32}(undef, ntr)
    U = host_basis(u)
    map(idx) do j
        copyto!(col, 1, d, j * ntr + 1, ntr)
        atom_norm(col, U)
    end
end

"‖d_j‖ (in the basis `u`, if any) for the 0-based atoms `idx`, simulated again (only those)."
function simulated_norms(seq::AbstractSequence, p::KmmArray{Float32,2}, idx::Vector{Int}, u = nothing)
    ph = Array(p)
    sig = with_temporaries() do made
        sub = temp!(made, KmmArray(ph[:, idx .+ 1]; manager = Kmm.manager(p)))
        d = temp!(made, KmmArray{ComplexF32}(undef, length(seq), length(idx); manager = Kmm.manager(p)))
        Array(simulate_raw!(d, seq, sub, 0, length(idx), false))
    end
    U = host_basis(u)
    [atom_norm(view(sig, :, k), U) for k in 1:length(idx)]
end

# Raw outputs -> maps: 1-based index, PD of the unnormalised atom, parameter maps.
function finish(o::RawOutputs, vdims::Tuple, natoms::Int, batches::Int, norms_of, seconds)
    m = Kmm.manager(o.index)
    idx0 = Array(o.index)
    Kmm.unsafe_free!(o.index)          # the maps are new arrays but for score and PD (o's own)
    pdn = Array(o.pd)
    atoms = sort!(unique(filter(>=(0), idx0)))    # -1: nothing matched
    norms = isempty(atoms) ? Float64[] : norms_of(Int.(atoms))
    normof = Dict(zip(atoms, norms))
    PD = ComplexF32[(nd = get(normof, j, 0.0); nd > 0 ? pdn[v] / nd : zero(ComplexF32))
                    for (v, j) in enumerate(idx0)]
    shape(x::KmmArray) = reshape(x, vdims)
    with_temporaries() do made  # the maps made here: freed if a later one fails (the caller frees o)
        up(a) = result!(made, KmmArray(reshape(a, vdims); manager = m))
        T1 = T2 = B1 = B0 = nothing
        if o.params !== nothing
            rec = Array(o.params)
            Kmm.unsafe_free!(o.params)
            T1, T2, B1, B0 = (up(rec[r, :]) for r in 1:4)
        end
        MatchResult{length(vdims)}(up(idx0 .+ Int32(1)), shape(o.score), up(PD), shape(o.pd),
                                   T1, T2, B1, B0, natoms, batches, seconds)
    end
end
