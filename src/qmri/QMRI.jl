"""
    Kmm.QMRI

Quantitative-MRI compute on Kmm arrays: MR-fingerprinting dictionaries of FISP (EPG) and
pSSFP (isochromat) sequences, dictionary matching, and batched generate-and-match for
dictionaries larger than the device. The math runs in libkmm (CUDA kernels on a GPU, the CPU
reference on the host backend); this module checks arguments, packs the C structs and chooses
batches.

Units follow the C ABI: times in seconds, angles in radians, B0 in Hz, slice positions in cm.
Atom parameters are `4 x natoms` `Float32` (T1, T2, B1, B0 per column); signals are
`ComplexF32`, TR index first. See docs/qmri.md.

    seq    = QMRI.FISPSequence(flip_angles; TR = 0.010, TE = 0.005, TI = 0.020, Ns = 32)
    params = QMRI.parameter_grid(T1 = (0.1, 5.0, 100), T2 = (0.01, 2.0, 100))
    dict   = QMRI.simulate_fisp(seq, params)              # ntr x natoms KmmArray{ComplexF32}
    maps   = QMRI.match(dict, signals; params = params)    # from a dictionary in memory
    maps   = QMRI.match(seq, params, signals)              # generated and matched in batches
    dict   = QMRI.Dictionary(seq, params)                 # kept in blocks (spills when too big)
    maps   = QMRI.match(dict, signals)
    Array(maps.T1)
"""
module QMRI

using ..Kmm: Kmm, KmmArray, KmmManager, KmmError, KmmOutOfMemoryError, LibKmm,
             default_manager, handles, @gcsafe, after_queued_work
import LinearAlgebra
import Distributed
import Random

export FISPSequence, PSSFPSequence, MatchResult, Dictionary, WorkerError, parameter_grid, tissue_parameters,
       simulate_fisp, simulate_pssfp, log_grid, compression_basis,
       CartesianTrajectory, SpiralTrajectory, MRSTATModel, Jacobian, magnetization

include("sequences.jl")
include("parameters.jl")
include("simulate.jl")
include("shipped_signals.jl")
include("match.jl")
include("dictionary.jl")
include("mrstat.jl")
include("distributed.jl")

end # module QMRI
