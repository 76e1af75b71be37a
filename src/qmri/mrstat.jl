# MR-STAT: the magnetization with its T1/T2 derivatives, the k-space signal, and the Jacobian
# of that signal as a matrix-free operator (kmm_qmri_fisp_derivatives, kmm_qmri_mrstat_signal,
# kmm_qmri_jacobian_mul, kmm_qmri_jacobian_adjoint_mul): f64 on the host backend, f32 kernels on CUDA.

"""
    CartesianTrajectory(k0, dk; nsamples, dt)

Readout `r` samples k0[r] + s·dk[r] for s = 0 … nsamples-1 (k-space in rad/m, `(kx, ky)`
tuples or complex numbers kx + i·ky), `dt` seconds apart; the echo is at the middle sample.
"""
struct CartesianTrajectory
    k0::Vector{ComplexF32}
    dk::Vector{ComplexF32}
    nsamples::Int
    dt::Float32
    # Every way of making one checks it: the library's counts are 1 .. 2^31-1.
    function CartesianTrajectory(k0::AbstractVector, dk::AbstractVector, nsamples::Integer, dt::Real)
        length(k0) == length(dk) >= 1 || throw(DimensionMismatch(
            "CartesianTrajectory: $(length(k0)) starts k0 and $(length(dk)) steps dk; need one of each per readout"))
        check_mrstat_count("CartesianTrajectory", "readouts (entries of k0)", length(k0))
        ns = count_arg("CartesianTrajectory", :nsamples, nsamples, MAX_MRSTAT_COUNT)
        check_dt("CartesianTrajectory", dt)
        new(kvec(k0), kvec(dk), ns, Float32(dt))
    end
end
CartesianTrajectory(k0::AbstractVector, dk::AbstractVector; nsamples::Integer, dt::Real) =
    CartesianTrajectory(k0, dk, nsamples, dt)

"The most of each count of an MR-STAT model (voxels, readouts, samples, coils) the library takes."
const MAX_MRSTAT_COUNT = Int(typemax(Int32))

# A count the library takes in 1 .. 2^31-1 that comes from a shape (not an argument of its own).
@noinline function check_mrstat_count(what, name, n::Int)
    1 <= n <= MAX_MRSTAT_COUNT || throw(ArgumentError(
        "$what: $n $name; the library takes 1..$MAX_MRSTAT_COUNT"))
    n
end

"""
    SpiralTrajectory(k::AbstractMatrix; dt)

Any trajectory: `k[s, r]` the position of sample `s` of readout `r` (rad/m, `(kx, ky)` tuples or
kx + i·ky), `dt` seconds apart.
"""
struct SpiralTrajectory
    k::Matrix{ComplexF32}
    dt::Float32
    function SpiralTrajectory(k::AbstractMatrix, dt::Real)
        check_mrstat_count("SpiralTrajectory", "rows of k (nsamples, samples per readout)", size(k, 1))
        check_mrstat_count("SpiralTrajectory", "columns of k (readouts)", size(k, 2))
        check_dt("SpiralTrajectory", dt)
        new(reshape(kvec(vec(k)), size(k)), Float32(dt))
    end
end
SpiralTrajectory(k::AbstractMatrix; dt::Real) = SpiralTrajectory(k, dt)

kvec(k) = ComplexF32[p isa Tuple ? complex(p[1], p[2]) : p for p in k]

# Stored as a Float32: 1e-50 would be 0 and 1e39 Inf.
@noinline function check_dt(what, dt)
    d = Float32(dt)
    isfinite(d) && d > 0 && dt > 0 || throw(ArgumentError(
        "$what: dt = $dt must be finite and > 0 (s) as a Float32 ($(floatmin(Float32)) to $(floatmax(Float32)))"))
end

nreadouts(t::CartesianTrajectory) = length(t.k0)
nreadouts(t::SpiralTrajectory) = size(t.k, 2)
nsamples(t::CartesianTrajectory) = t.nsamples
nsamples(t::SpiralTrajectory) = size(t.k, 1)
kspace_data(t::CartesianTrajectory) = vec(permutedims(hcat(t.k0, t.dk)))   # k0[1], dk[1], k0[2], ...
kspace_data(t::SpiralTrajectory) = vec(t.k)
trajectory_kind(::CartesianTrajectory) = LibKmm.KMM_TRAJECTORY_CARTESIAN
trajectory_kind(::SpiralTrajectory) = LibKmm.KMM_TRAJECTORY_SPIRAL

"""
    MRSTATModel(x, y, T2, B0, ρ, coils, trajectory; manager = default_manager())

An MR-STAT acquisition: `nvoxels` voxels at positions `x`, `y` (m) with T2 (s), B0 (Hz) and
complex proton density ρ, receive coil sensitivities `coils` (`nvoxels x ncoils`), and a
`CartesianTrajectory` or `SpiralTrajectory` with one readout per TR. The signal of voxel v in
coil c at sample s of readout r is C[v,c] ρ_v m_v(r) exp(-t_s/T2_v) exp(i2πB0_v t_s)
exp(-i(kx x_v + ky y_v)), t_s the time from the echo. The data live on `manager`.
"""
struct MRSTATModel
    nvoxels::Int
    nreadouts::Int
    nsamples::Int
    ncoils::Int
    voxels::KmmArray{Float32,2}
    coils::KmmArray{ComplexF32,2}
    kspace::KmmArray{ComplexF32,1}
    trajectory::Union{CartesianTrajectory,SpiralTrajectory}
end

function MRSTATModel(x, y, T2, B0, ρ, coils::AbstractMatrix, traj::Union{CartesianTrajectory,SpiralTrajectory};
                     manager::KmmManager = default_manager())
    n = length(x)
    n >= 1 || throw(ArgumentError("MRSTATModel: no voxels"))
    check_mrstat_count("MRSTATModel", "voxels (entries of x)", n)
    for (name, a) in (("y", y), ("T2", T2), ("B0", B0), ("ρ", ρ))
        length(a) == n || throw(DimensionMismatch("MRSTATModel: $name has $(length(a)) entries, x has $n"))
    end
    size(coils, 1) == n || throw(DimensionMismatch("MRSTATModel: coils has $(size(coils, 1)) rows; need one per voxel ($n)"))
    check_mrstat_count("MRSTATModel", "coils (columns of coils)", size(coils, 2))
    check_voxel_values("MRSTATModel", (x = x, y = y, B0 = B0, ρ = ρ, coils = coils), T2)
    rec = Float32[f for v in 1:n for f in (x[v], y[v], T2[v], B0[v], real(ρ[v]), imag(ρ[v]))]
    c = Matrix{ComplexF32}(coils)
    with_temporaries() do made                         # a call that fails frees what it made
        up(a) = result!(made, KmmArray(a; manager = manager))
        MRSTATModel(n, nreadouts(traj), nsamples(traj), size(coils, 2), up(reshape(rec, 6, n)), up(c),
                    up(kspace_data(traj)), traj)
    end
end

Kmm.manager(model::MRSTATModel) = Kmm.manager(model.voxels)

"The model with new T2 and ρ (the values a Gauss-Newton step changes), on the same manager."
function with_tissue(model::MRSTATModel, T2, ρ)
    rec = Array(model.voxels)
    length(T2) == length(ρ) == model.nvoxels || throw(DimensionMismatch("with_tissue: need $(model.nvoxels) values"))
    check_voxel_values("with_tissue", (ρ = ρ,), T2)
    rec[3, :] .= T2
    rec[5, :] .= real.(ρ)
    rec[6, :] .= imag.(ρ)
    MRSTATModel(model.nvoxels, model.nreadouts, model.nsamples, model.ncoils,
                KmmArray(rec; manager = Kmm.manager(model)), model.coils, model.kspace, model.trajectory)
end

# The values the library checks at every call (finite positions, B0, ρ and coils; T2 > 0, +Inf
# allowed), checked here as the caller gave them: named, 1-based, before their rounding to
# Float32 (1e-50 is 0 there, 1e39 infinite), where the library would name the rounded value.
@noinline function check_voxel_values(what, finite::NamedTuple, T2)
    for (name, a) in pairs(finite), (i, v) in pairs(a)
        isfinite(Float32(real(v))) && isfinite(Float32(imag(v))) || throw(ArgumentError(
            "$what: $name[$(index_text(i))] = $v must be finite as a Float32 (magnitude at most $(floatmax(Float32)))"))
    end
    for (i, v) in pairs(T2)
        Float32(v) > 0 || throw(ArgumentError(
            "$what: T2[$(index_text(i))] = $v must be > 0 (s) as a Float32 (at least $(nextfloat(0f0)); +Inf allowed)"))
    end
end
index_text(i) = i isa CartesianIndex ? join(Tuple(i), ", ") : string(i)

# The library takes the counts and the buffers' handles (not their offsets or lengths): before
# every call the arrays are checked against the counts, as a model made with the positional
# (field by field) constructor was never checked.
function cmodel(model::MRSTATModel)
    check_model(model)
    LibKmm.KmmMrstatModel(model.nvoxels, model.nreadouts, model.nsamples, model.ncoils,
                          handles(model.voxels.storage)[2], handles(model.coils.storage)[2],
                          trajectory_kind(model.trajectory), model.trajectory.dt,
                          handles(model.kspace.storage)[2])
end

@noinline function check_model(model::MRSTATModel)
    for f in (:nvoxels, :nreadouts, :nsamples, :ncoils)
        check_mrstat_count("MRSTATModel", string(f), getfield(model, f))
    end
    nk = model.trajectory isa CartesianTrajectory ? 2 * model.nreadouts : model.nsamples * model.nreadouts
    check_model_array(:voxels, model.voxels, (6, model.nvoxels))
    check_model_array(:coils, model.coils, (model.nvoxels, model.ncoils))
    check_model_array(:kspace, model.kspace, (nk,))
    nothing
end

@noinline function check_model_array(name, a::KmmArray, dims)
    size(a) == dims || throw(DimensionMismatch("MRSTATModel: $name is $(size(a)); the counts need $dims"))
    a.offset == 0 || throw(ArgumentError("MRSTATModel: $name must start at the start of its buffer (not a view)"))
    nothing
end

"""
    magnetization(seq::FISPSequence, params; derivatives = true, manager) -> (m, ∂m/∂T1, ∂m/∂T2)

The echo magnetization of each atom of `params` (`4 x n`: T1, T2, B1, B0), `ntr x n`
`ComplexF32`, and its exact derivatives with respect to T1 and T2 (forward-mode automatic
differentiation: in f64 on the host backend, f32 on CUDA; `nothing` with `derivatives = false`).
"""
function magnetization(seq::FISPSequence, params; derivatives::Bool = true,
                       manager::KmmManager = default_manager_of(params))
    with_temporaries() do made                         # a call that fails frees what it made
        p = temp!(made, as_params(params, manager), params)
        n = size(p, 2)
        output() = result!(made, KmmArray{ComplexF32}(undef, length(seq), n; manager = manager))
        m = output()
        d1, d2 = derivatives ? (output(), output()) : (nothing, nothing)
        h(a) = a === nothing ? UInt64(0) : handles(a.storage)[2]
        cs = Ref(cstruct(seq))
        mh, ph = handles(p.storage)
        # Every MR-STAT call reads its inputs back to check them, after the queued work.
        GC.@preserve seq p m d1 d2 after_queued_work(manager) do
            LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_fisp_derivatives(
                mh, cs, ph, UInt64(0), UInt64(n), h(m), h(d1), h(d2), UInt32(0)))
        end
        (m, d1, d2)
    end
end

function check_magnetization(model::MRSTATModel, m::KmmArray)
    size(m) == (model.nreadouts, model.nvoxels) || throw(DimensionMismatch(
        "the magnetization is $(size(m)); the model needs nreadouts x nvoxels = $((model.nreadouts, model.nvoxels))"))
    Kmm.manager(m) === Kmm.manager(model) || throw(ArgumentError("the magnetization is on another manager than the model"))
    whole_buffer(m)
end

signal_size(model::MRSTATModel) = (model.nsamples, model.nreadouts, model.ncoils)

"""
    signal(model::MRSTATModel, m) -> KmmArray{ComplexF32,3}

The k-space signal (`nsamples x nreadouts x ncoils`) of the magnetization `m`
(`nreadouts x nvoxels`, e.g. from `magnetization`).
"""
function signal(model::MRSTATModel, m::KmmArray{ComplexF32,2})
    with_temporaries() do made
        mm = temp!(made, check_magnetization(model, m), m)      # the copy of a view
        out = result!(made, KmmArray{ComplexF32}(undef, signal_size(model)...; manager = Kmm.manager(model)))
        mh, cm, inh, outh = handles(model.voxels.storage)[1], Ref(cmodel(model)), handles(mm.storage)[2], handles(out.storage)[2]
        GC.@preserve model mm out after_queued_work(Kmm.manager(model)) do
            LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_mrstat_signal(mh, cm, inh, outh))
        end
        out
    end
end

"""
    J = Jacobian(model, m, ∂m/∂T1, ∂m/∂T2)

The Jacobian of `signal(model, m)` with respect to the parameters (T1, T2, Re ρ, Im ρ) of every
voxel, as a matrix-free operator: `J * v` (`v`: `4 x nvoxels` or a vector of `4 nvoxels`
Float32, parameter fastest) gives a signal-shaped `KmmArray`, `J' * w` gives Re(Jᴴw) as
`4 x nvoxels`; `mul!(y, J, v)` and `mul!(g, J', w)` write into given KmmArrays (`y`:
`ComplexF32`, `g`: `Float32`, on the model's manager). Inputs may be KmmArrays or host arrays,
which are uploaded for the call.
"""
struct Jacobian
    model::MRSTATModel
    m::KmmArray{ComplexF32,2}
    dT1::KmmArray{ComplexF32,2}
    dT2::KmmArray{ComplexF32,2}
    # J keeps the copies of views it makes (the calls take whole buffers); a failure frees them.
    function Jacobian(model::MRSTATModel, m, dT1, dT2)
        with_temporaries() do made
            new(model, (result!(made, check_magnetization(model, x), x) for x in (m, dT1, dT2))...)
        end
    end
end

struct AdjointJacobian
    J::Jacobian
end

Base.adjoint(J::Jacobian) = AdjointJacobian(J)
Base.adjoint(A::AdjointJacobian) = A.J
Base.size(J::Jacobian) = (prod(signal_size(J.model)), 4 * J.model.nvoxels)
Base.size(A::AdjointJacobian) = reverse(size(A.J))
Base.size(J::Union{Jacobian,AdjointJacobian}, d::Integer) = size(J)[d]
Base.show(io::IO, J::Jacobian) = print(io, "Jacobian(", join(signal_size(J.model), "x"), " signal, ",
                                       J.model.nvoxels, " voxels x (T1, T2, Re ρ, Im ρ))")

# The input as a whole buffer (a view is copied: free it with `release_made(x2, x)`) once the
# operands are checked, so that a bad call makes nothing.
function operands(J::Jacobian, x::KmmArray, xlen::Int, y::KmmArray, ylen::Int)
    length(x) == xlen || throw(DimensionMismatch("the input has $(length(x)) entries; need $xlen"))
    length(y) == ylen || throw(DimensionMismatch("the output has $(length(y)) entries; need $ylen"))
    m = Kmm.manager(J.model)
    Kmm.manager(x) === m && Kmm.manager(y) === m || throw(ArgumentError("the arrays must be on the model's manager"))
    y.offset == 0 || throw(ArgumentError("mul!: the output must start at the start of its buffer (not a view)"))
    whole_buffer(x)
end

# The arguments J·v and Jᴴw share: the manager, the model, the magnetization and its derivatives.
jacobian_args(J::Jacobian) = (handles(J.model.voxels.storage)[1], Ref(cmodel(J.model)), handles(J.m.storage)[2],
                              handles(J.dT1.storage)[2], handles(J.dT2.storage)[2])

function LinearAlgebra.mul!(y::KmmArray{ComplexF32}, J::Jacobian, v::KmmArray{Float32})
    with_temporaries() do made
        vv = temp!(made, operands(J, v, 4 * J.model.nvoxels, y, size(J, 1)), v)   # the copy of a view
        a = jacobian_args(J)
        vh, yh = handles(vv.storage)[2], handles(y.storage)[2]
        GC.@preserve J vv y after_queued_work(Kmm.manager(J.model)) do
            LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_jacobian_mul(a[1], a[2], a[3], a[4], a[5], vh, yh))
        end
    end
    y
end

function LinearAlgebra.mul!(g::KmmArray{Float32}, A::AdjointJacobian, w::KmmArray{ComplexF32})
    J = A.J
    with_temporaries() do made
        ww = temp!(made, operands(J, w, size(J, 1), g, 4 * J.model.nvoxels), w)
        a = jacobian_args(J)
        wh, gh = handles(ww.storage)[2], handles(g.storage)[2]
        GC.@preserve J ww g after_queued_work(Kmm.manager(J.model)) do
            LibKmm.check_status(@gcsafe LibKmm.unchecked_kmm_qmri_jacobian_adjoint_mul(a[1], a[2], a[3], a[4], a[5], wh, gh))
        end
    end
    g
end

# A host input is uploaded for the call and freed (in stream order) when it returns or throws,
# as `J * v` does.
function LinearAlgebra.mul!(y::KmmArray{ComplexF32}, J::Jacobian, v::AbstractArray{<:Real})
    length(v) == size(J, 2) || throw(DimensionMismatch("the input has $(length(v)) entries; need $(size(J, 2))"))
    with_upload(x -> LinearAlgebra.mul!(y, J, x), KmmArray{Float32}(Array{Float32}(v); manager = Kmm.manager(J.model)))
end
function LinearAlgebra.mul!(g::KmmArray{Float32}, A::AdjointJacobian, w::AbstractArray{<:Complex})
    length(w) == size(A, 2) || throw(DimensionMismatch("the input has $(length(w)) entries; need $(size(A, 2))"))
    with_upload(x -> LinearAlgebra.mul!(g, A, x), KmmArray{ComplexF32}(Array{ComplexF32}(w); manager = Kmm.manager(A.J.model)))
end
# Any other output or input: an error naming them, not a MethodError of LinearAlgebra's
# five-argument fallback.
function LinearAlgebra.mul!(y::AbstractArray, A::Union{Jacobian,AdjointJacobian}, x::AbstractArray)
    out, in = A isa Jacobian ? ("KmmArray{ComplexF32}", "real") : ("KmmArray{Float32}", "complex")
    throw(ArgumentError("mul!(y, $(A isa Jacobian ? "J" : "J'"), x): y must be a $out on the model's manager and x a " *
                        "$in array (a KmmArray, or a host array uploaded for the call); got $(typeof(y)) and $(typeof(x))"))
end

"`mul!(out, A, x)` into `out`, a new array of this call's, freed when the call fails."
mul_new(out::KmmArray, A, x) = with_temporaries(made -> LinearAlgebra.mul!(result!(made, out), A, x))

Base.:*(J::Jacobian, v::KmmArray{Float32}) =
    mul_new(KmmArray{ComplexF32}(undef, signal_size(J.model)...; manager = Kmm.manager(J.model)), J, v)
Base.:*(A::AdjointJacobian, w::KmmArray{ComplexF32}) =
    mul_new(KmmArray{Float32}(undef, 4, A.J.model.nvoxels; manager = Kmm.manager(A.J.model)), A, w)
# A host operand is uploaded for the call and freed (in stream order) when it returns or throws.
function Base.:*(J::Jacobian, v::AbstractArray{<:Real})
    length(v) == size(J, 2) || throw(DimensionMismatch("the input has $(length(v)) entries; need $(size(J, 2))"))
    with_upload(x -> J * x, KmmArray{Float32}(Array{Float32}(v); manager = Kmm.manager(J.model)))
end
function Base.:*(A::AdjointJacobian, w::AbstractArray{<:Complex})
    length(w) == size(A, 2) || throw(DimensionMismatch("the input has $(length(w)) entries; need $(size(A, 2))"))
    with_upload(x -> A * x, KmmArray{ComplexF32}(Array{ComplexF32}(w); manager = Kmm.manager(A.J.model)))
end

"""
    residual(model, m, data) -> (r, ‖r‖²)

The residual `signal(model, m) - data` (a signal-shaped KmmArray) and its squared norm.
"""
function residual(model::MRSTATModel, m::KmmArray{ComplexF32,2}, data)
    d = data isa KmmArray ? Array(data) : data
    size(d) == signal_size(model) || throw(DimensionMismatch("data is $(size(d)); the signal is $(signal_size(model))"))
    s = with_temporaries(made -> Array(temp!(made, signal(model, m))))   # the signal is a temporary
    r = s .- ComplexF32.(d)
    (KmmArray(r; manager = Kmm.manager(model)), sum(abs2, ComplexF64.(r)))
end
