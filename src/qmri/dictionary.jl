# A dictionary kept in memory in blocks of atoms, each its own array: larger than the device, it
# runs through spill to host (KmmManager(spill_limit = ...)) without the caller batching.

"""
    QMRI.Dictionary(seq, params; manager, block_atoms = nothing, check = true)

The dictionary of `seq` (a `FISPSequence` or `PSSFPSequence`) over the atoms `params`
(`4 x natoms`), simulated once and kept, in blocks of `block_atoms` atoms (default: 256 MiB
each), each a `KmmArray{ComplexF32,2}` of its own, on `manager` (default: that of `params` when it is a
`KmmArray`, else the default manager). Match it against any number of signal sets
with `match(dict, signals)`: each block is matched in turn, keeping the best atom per voxel.
It keeps a copy of `seq` as it was simulated (`dict.seq`): changing the sequence's vectors in
place afterwards changes neither the dictionary nor its matches' PD.

A dictionary larger than the device (or the manager's `hard_limit`) needs a manager with
`spill_limit`: blocks not in use spill to host memory, least recently used first, and come back
when matched; the user sees time, not an out-of-memory error. Without spill it must fit.
`Kmm.is_spilled.(dict.blocks)` tells where the blocks are.
"""
struct Dictionary{S<:AbstractSequence}
    seq::S
    params::KmmArray{Float32,2}
    blocks::Vector{KmmArray{ComplexF32,2}}
    firsts::Vector{Int}          # the 0-based first atom of each block
    natoms::Int
end

const DICTIONARY_BLOCK_BYTES = 256 * 2^20

function Dictionary(seq::AbstractSequence, params; manager::KmmManager = default_manager_of(params),
                    block_atoms::Union{Nothing,Integer} = nothing, check::Bool = true)
    # Its own copy: the PD of a match is scaled by the sequence's signal, and the sequence's
    # vectors may be changed in place (the matches of a kept dictionary followed them).
    seq = deepcopy(seq)
    ntr = length(seq)
    nb = block_atoms === nothing ? max(1, DICTIONARY_BLOCK_BYTES ÷ (8 * ntr)) :
                                   count_arg("Dictionary", :block_atoms, block_atoms)
    # a call that fails frees what it made: the blocks, and the upload or copy of params
    with_temporaries() do made
        p = result!(made, as_params(params, manager), params)
        blocks, firsts = KmmArray{ComplexF32,2}[], Int[]
        natoms = size(p, 2)
        check && check_params(Array(p))
        for first in 0:nb:natoms-1
            n = min(nb, natoms - first)
            d = result!(made, KmmArray{ComplexF32}(undef, ntr, n; manager = manager))
            push!(blocks, d)
            push!(firsts, first)
            simulate_raw!(d, seq, p, first, n, false)
        end
        Dictionary(seq, p, blocks, firsts, natoms)
    end
end

Base.length(d::Dictionary) = d.natoms
Base.show(io::IO, d::Dictionary) =
    print(io, "QMRI.Dictionary(", d.natoms, " atoms x ", length(d.seq), " TRs in ", length(d.blocks),
          length(d.blocks) == 1 ? " block)" : " blocks)")

"""
    match(dict::QMRI.Dictionary, signals; rank = 0, basis = nothing, timings = false) -> MatchResult

Matches the signals against every block of `dict` in turn (see `QMRI.Dictionary`); the maps
equal those of matching the whole dictionary at once. `rank > 0` compresses on one basis for all
blocks: `basis` when given, else `compression_basis(dict.seq, dict.params; rank)`.
"""
function match(d::Dictionary, signals; rank::Integer = 0, basis = nothing, basis_atoms::Integer = 2000,
               timings::Bool = false)
    m = Kmm.manager(d.params)
    ntr = length(d.seq)
    check_rank(rank, ntr)
    with_temporaries() do made
        s, vdims, nvox = prepare_signals(signals, ntr, m)
        temp!(made, s, signals)
        u = temp!(made, choose_basis(basis, rank, ntr, m), basis)
        check_basis = u !== nothing
        if u === nothing && 0 < rank < ntr
            u = temp!(made, compression_basis(d.seq, d.params; rank = rank, atoms = basis_atoms, manager = m))
        end
        o = result!(made, RawOutputs(m, nvox, true))
        t = @elapsed begin
            for (k, (block, first)) in enumerate(zip(d.blocks, d.firsts))
                match_raw!(o, block, ntr, size(block, 2), first, s, nvox, Int(rank), d.params, k > 1, u,
                           check_basis && k == 1)
            end
            timings && Kmm.synchronize(m)
        end
        finish(o, vdims, d.natoms, length(d.blocks), idx -> simulated_norms(d.seq, d.params, idx, u),
               timings ? Dict(:match => t) : Dict{Symbol,Float64}())
    end
end
