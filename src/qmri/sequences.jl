# Sequence descriptions: plain Julia structs checked on construction, packed into the C structs
# of gen/kmm.h (KmmFispSequence, KmmPssfpSequence) for each call.

"Largest number of EPG states (`Ns`) of a FISP simulation (the library's `MAX_STATES`)."
const MAX_STATES = 512
"Largest number of TRs of one sequence."
const MAX_TRS = 2^20
"Largest number of slice positions / slice-profile columns, and of RF sub-steps."
const MAX_POSITIONS = 4096

abstract type AbstractSequence end

"""
A count `name` of `fname` (atoms per batch or block, a byte budget, EPG states, samples per
readout) as an `Int` in 1..`most`: an `ArgumentError` naming it and the bound otherwise (a
`Bool` too), never an `InexactError` from `Int(v)`.
"""
function count_arg(fname::AbstractString, name::Symbol, v::Integer, most::Integer = typemax(Int))
    (!(v isa Bool) && 1 <= v <= most) ||
        throw(ArgumentError("$fname: $name = $(repr(v)) must be an integer in 1..$most" *
                            (v isa Bool ? ", not a Bool" : "")))
    Int(v)
end

"""
    FISPSequence(flip_angles; phases = zeros, TR, TE = TR / 2, TI = 0, Ns = 32, profile = nothing)

A gradient-spoiled FISP (FISP2D of BlochSimulators.jl) MR-fingerprinting train with an
adiabatic inversion, simulated with the extended phase graph.

- `flip_angles`: one flip angle per TR (radians)
- `phases`: RF phase per TR (radians), default all zero
- `TR`, `TE`, `TI`: repetition time, echo time (≤ TR) and the delay from the inversion to the
  first RF pulse, in seconds
- `Ns`: number of EPG states kept (1 to 512); more states follow the spin history longer
- `profile`: optional `ntr x npositions` flip-angle scale factors (slice profile); the signal is
  summed over the positions

Fields: `flip_angles`, `phases`, `TR`, `TE`, `TI`, `Ns`, `profile` (`ntr x 0` when none).
`length(seq)` is the number of TRs. The vectors may be changed in place; each call that
simulates the sequence checks their lengths again (an `ArgumentError` naming the field unless
`phases` has one entry per flip angle and `profile` one row per flip angle or no column).
"""
struct FISPSequence <: AbstractSequence
    flip_angles::Vector{Float32}
    phases::Vector{Float32}
    TR::Float32
    TE::Float32
    TI::Float32
    Ns::Int
    profile::Matrix{Float32}
    function FISPSequence(flip_angles::AbstractVector{<:Real}, phases::AbstractVector{<:Real},
                          TR::Real, TE::Real, TI::Real, Ns::Integer, profile::AbstractMatrix{<:Real})
        check_fisp_sizes("FISPSequence", flip_angles, phases, profile)
        count_arg("FISPSequence", :Ns, Ns, MAX_STATES)
        check_time("TR", TR); check_time("TE", TE); check_time("TI", TI)
        TE <= TR || throw(ArgumentError("FISPSequence: TE = $TE s must be at most TR = $TR s"))
        check_finite("flip_angles", flip_angles); check_finite("phases", phases)
        check_finite("profile", profile)
        new(Float32.(collect(flip_angles)), Float32.(collect(phases)), TR, TE, TI, Ns,
            Matrix{Float32}(profile))
    end
end

function FISPSequence(flip_angles::AbstractVector{<:Real}; phases = nothing, TR::Real,
                      TE::Real = TR / 2, TI::Real = 0, Ns::Integer = 32, profile = nothing)
    ntr = length(flip_angles)
    ph = phases === nothing ? zeros(Float32, ntr) : phases
    prof = profile === nothing ? zeros(Float32, ntr, 0) : profile
    FISPSequence(flip_angles, ph, TR, TE, TI, Ns, prof)
end

Base.length(s::AbstractSequence) = length(s.flip_angles)

function Base.show(io::IO, s::FISPSequence)
    print(io, "FISPSequence(", length(s), " TRs, TR = ", s.TR * 1000, " ms, TE = ", s.TE * 1000,
          " ms, TI = ", s.TI * 1000, " ms, Ns = ", s.Ns)
    size(s.profile, 2) > 0 && print(io, ", ", size(s.profile, 2), " profile positions")
    print(io, ")")
end

"""
    PSSFPSequence(flip_angles; phases = zeros, TR, rf_shape = [1], z = [0], dt_ex = 0,
                  dt_inv = 0, dt_pr = (TR - length(rf_shape) * dt_ex) / 2, gz_ex = 0, gz_pr = 0)

A balanced pSSFP (pSSFP2D of BlochSimulators.jl) train simulated with isochromats: a
B1-scaled inversion, `dt_inv` of relaxation, an α/2 prepulse, then per TR an RF pulse in
`length(rf_shape)` hard-pulse sub-steps of `dt_ex` with slice-select gradient area `gz_ex`
(rad/cm) each, precession over `dt_pr` (gradient area `gz_pr`) to TE, a sample of
`m_x + i m_y`, and precession over `dt_pr` to the next pulse. The signal is summed over the
slice positions `z` (cm).

- `flip_angles`, `phases`: per TR (radians)
- `rf_shape`: fractions of the flip angle per RF sub-step (summing to 1 for the nominal angle)
- times in seconds; `TR` only sets the default `dt_pr`

Fields: `flip_angles`, `phases`, `rf_shape`, `z`, `dt_ex`, `dt_inv`, `dt_pr`, `gz_ex`, `gz_pr`.
The vectors may be changed in place; each call that simulates the sequence checks their lengths
again (an `ArgumentError` naming the field and the length it needs).
"""
struct PSSFPSequence <: AbstractSequence
    flip_angles::Vector{Float32}
    phases::Vector{Float32}
    rf_shape::Vector{Float32}
    z::Vector{Float32}
    dt_ex::Float32
    dt_inv::Float32
    dt_pr::Float32
    gz_ex::Float32
    gz_pr::Float32
    function PSSFPSequence(flip_angles::AbstractVector{<:Real}, phases::AbstractVector{<:Real},
                           rf_shape::AbstractVector{<:Real}, z::AbstractVector{<:Real},
                           dt_ex::Real, dt_inv::Real, dt_pr::Real, gz_ex::Real, gz_pr::Real)
        check_pssfp_sizes("PSSFPSequence", flip_angles, phases, rf_shape, z)
        check_time("dt_ex", dt_ex); check_time("dt_inv", dt_inv); check_time("dt_pr", dt_pr)
        isfinite(Float32(gz_ex)) && isfinite(Float32(gz_pr)) || throw(ArgumentError(
            "PSSFPSequence: gz_ex = $gz_ex and gz_pr = $gz_pr must be finite Float32 values"))
        check_finite("flip_angles", flip_angles); check_finite("phases", phases)
        check_finite("rf_shape", rf_shape); check_finite("z", z)
        new(Float32.(collect(flip_angles)), Float32.(collect(phases)), Float32.(collect(rf_shape)),
            Float32.(collect(z)), dt_ex, dt_inv, dt_pr, gz_ex, gz_pr)
    end
end

function PSSFPSequence(flip_angles::AbstractVector{<:Real}; phases = nothing, TR::Real,
                       rf_shape = Float32[1], z = Float32[0], dt_ex::Real = 0, dt_inv::Real = 0,
                       dt_pr = nothing, gz_ex::Real = 0, gz_pr::Real = 0)
    ntr = length(flip_angles)
    ph = phases === nothing ? zeros(Float32, ntr) : phases
    pr = dt_pr
    if dt_pr === nothing                # else the constructor checks the given dt_pr
        check_time("TR", TR); check_time("dt_ex", dt_ex)
        pr = (TR - length(rf_shape) * dt_ex) / 2
        pr >= 0 || throw(ArgumentError(
            "PSSFPSequence: the RF pulse ($(length(rf_shape)) x dt_ex = $(length(rf_shape) * dt_ex) s) is longer than TR = $TR s"))
    end
    PSSFPSequence(flip_angles, ph, rf_shape, z, dt_ex, dt_inv, pr, gz_ex, gz_pr)
end

function Base.show(io::IO, s::PSSFPSequence)
    print(io, "PSSFPSequence(", length(s), " TRs, ", length(s.rf_shape), " RF sub-steps of ",
          s.dt_ex * 1e6, " µs, dt_pr = ", s.dt_pr * 1000, " ms, ", length(s.z), " slice positions)")
end

# The library takes Float32: a value is checked as it will be stored (1e39 is Inf32).
@noinline function check_time(name, t)
    isfinite(Float32(t)) && t >= 0 || throw(ArgumentError(
        "$name = $t s must be finite and >= 0 (and at most $(floatmax(Float32)), a Float32)"))
end

@noinline function check_finite(name, v)
    i = findfirst(x -> !isfinite(Float32(x)), v)
    i === nothing || throw(ArgumentError("$name[$i] = $(v[i]) is not finite as a Float32"))
end

# The sizes the library relies on, checked by the constructors and again by `cstruct` before
# every call: the fields are Vectors that may have been resized since (the library reads
# `length(flip_angles)` entries of `phases` and rows of `profile`; past their ends otherwise).
@noinline function check_fisp_sizes(what, flip_angles, phases, profile)
    ntr = check_ntr(what, flip_angles)
    check_length(what, "phases", length(phases), ntr, ntr)
    if size(profile, 2) != 0
        size(profile, 1) == ntr || throw(ArgumentError(
            "$what: profile is $(size(profile, 1)) x $(size(profile, 2)); it must be ntr ($ntr, the length of flip_angles) x npositions"))
        check_length(what, "profile (columns)", size(profile, 2), 0, MAX_POSITIONS)
    end
    nothing
end

@noinline function check_pssfp_sizes(what, flip_angles, phases, rf_shape, z)
    ntr = check_ntr(what, flip_angles)
    check_length(what, "phases", length(phases), ntr, ntr)
    check_length(what, "rf_shape", length(rf_shape), 1, MAX_POSITIONS)
    check_length(what, "z", length(z), 1, MAX_POSITIONS)
end

function check_ntr(what, flip_angles)
    check_length(what, "flip_angles", length(flip_angles), 1, MAX_TRS)
    length(flip_angles)
end

@noinline function check_length(what, name, n, lo, hi)
    lo <= n <= hi || throw(ArgumentError(string("$what: $name has length $n; it must be ",
        lo == hi ? "$lo (one per flip angle)" : "$lo to $hi")))
    nothing
end

"What `cstruct` names in its errors: the fields may have changed since the constructor's checks."
const RESIZED = " (its fields, as given to the library now)"

# The C structs hold pointers into the Julia vectors: build and use them under GC.@preserve seq.
function cstruct(s::FISPSequence)
    check_fisp_sizes("FISPSequence" * RESIZED, s.flip_angles, s.phases, s.profile)
    LibKmm.KmmFispSequence(pointer(s.flip_angles), pointer(s.phases),
                           size(s.profile, 2) == 0 ? Ptr{Cfloat}(C_NULL) : pointer(s.profile),
                           UInt32(length(s)), UInt32(s.Ns), UInt32(size(s.profile, 2)),
                           s.TR, s.TE, s.TI)
end

function cstruct(s::PSSFPSequence)
    check_pssfp_sizes("PSSFPSequence" * RESIZED, s.flip_angles, s.phases, s.rf_shape, s.z)
    LibKmm.KmmPssfpSequence(pointer(s.flip_angles), pointer(s.phases), pointer(s.rf_shape),
                            pointer(s.z), UInt32(length(s)), UInt32(length(s.rf_shape)),
                            UInt32(length(s.z)), s.dt_ex, s.dt_inv, s.dt_pr, s.gz_ex, s.gz_pr)
end
