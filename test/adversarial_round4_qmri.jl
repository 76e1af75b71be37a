# Defects of the qMRI module found by the fourth adversarial run (MR-STAT calls that leave
# temporaries to the collector, trajectory counts the library refuses, a Bool rank), one
# testset each.

using Kmm, Test, LinearAlgebra

const QMRI4 = Kmm.QMRI
const FLIPS4 = Float32[deg2rad(5 + 60 * sin(pi * n / 50)^2) for n in 1:8]
r4qerror(f) = try f(); nothing catch e; e end

# A 4-voxel, 2-coil, 8-readout, 6-sample MR-STAT model on `m` (T2 as given: a T2 <= 0 is
# refused by the library when the signal is computed, which makes a call fail after its
# allocations; the checked constructor refuses it, so such a model is made field by field).
function r4q_model(m; T2 = fill(0.08, 4))
    traj = QMRI4.CartesianTrajectory(ComplexF32[complex(-100f0, 10f0 * r) for r in 1:8],
                                     fill(ComplexF32(10, 0), 8); nsamples = 6, dt = 5e-6)
    good = QMRI4.MRSTATModel([0.0, 0.01, 0.02, 0.03], zeros(4), fill(0.08, 4), zeros(4), ComplexF32.(ones(4)),
                             ones(ComplexF32, 4, 2), traj; manager = m)
    all(>(0), T2) && return QMRI4.with_tissue(good, T2, ComplexF32.(ones(4)))
    rec = Array(good.voxels)
    rec[3, :] .= T2
    QMRI4.MRSTATModel(good.nvoxels, good.nreadouts, good.nsamples, good.ncoils, KmmArray(rec; manager = m),
                      good.coils, good.kspace, good.trajectory)
end

@testset "MR-STAT calls free the temporaries they make, and their outputs when they fail" begin
    m = KmmManager(backend = :host)
    seq = QMRI4.FISPSequence(FLIPS4; TR = 0.010, TE = 0.005, Ns = 8)
    params = QMRI4.tissue_parameters(fill(1.0, 4), fill(0.08, 4); manager = m)
    mg, d1, d2 = QMRI4.magnetization(seq, params)
    model = r4q_model(m)
    bad = r4q_model(m; T2 = fill(-0.08, 4))
    J = QMRI4.Jacobian(model, mg, d1, d2)
    Jbad = QMRI4.Jacobian(bad, mg, d1, d2)
    big = KmmArray(ones(Float32, 20); manager = m)
    mgbig = KmmArray(zeros(ComplexF32, 8, 5); manager = m)
    copyto!(mgbig, 9, mg, 1, 32)
    mgview = reshape(view(mgbig, 9:40), 8, 4)          # starts inside its buffer
    live() = Int(Kmm.memory_stats(m).live_buffers)
    data = zeros(ComplexF32, 6, 8, 2)
    GC.gc(); GC.enable(false)
    try
        # what a call returns is all it leaves
        b = live(); r = QMRI4.residual(model, mg, data)
        @test live() == b + 1                   # was b + 2: the signal stayed
        b = live(); y = J * ones(Float32, 4, 4)
        @test live() == b + 1                   # was b + 2: the upload of v stayed
        b = live(); g = J' * ones(ComplexF32, 6, 8, 2)
        @test live() == b + 1                   # was b + 2: the upload of w stayed
        b = live(); y = J * view(big, 5:20)
        @test live() == b + 1                   # was b + 2: the copy of the view stayed
        b = live(); y2 = J * KmmArray(ones(Float32, 16); manager = m)
        @test live() == b + 2                   # the caller's upload and the result
        b = live(); LinearAlgebra.mul!(y2, J, view(big, 5:20))
        @test live() == b                       # was b + 1
        b = live(); g2 = J' * KmmArray(ones(ComplexF32, 96); manager = m)
        w = KmmArray(ones(ComplexF32, 100); manager = m)
        b = live(); LinearAlgebra.mul!(g2, J', view(w, 5:100))
        @test live() == b                       # was b + 1
        b = live(); s = QMRI4.signal(model, mgview)
        @test live() == b + 1                   # was b + 2: the copy of the view stayed
        @test Array(s) == Array(QMRI4.signal(model, mg))
        # a Jacobian keeps the copy of a view it takes (the calls need whole buffers)...
        b = live(); Jv = QMRI4.Jacobian(model, mgview, d1, d2)
        @test live() == b + 1
        @test Array(Jv * ones(Float32, 16)) == Array(J * ones(Float32, 16))
        # ...and frees it when it cannot be made
        b = live()
        @test_throws DimensionMismatch QMRI4.Jacobian(model, mgview, d1, KmmArray(zeros(ComplexF32, 4, 4); manager = m))
        @test live() == b + 1                   # only the caller's 4 x 4 upload
        # a call that fails leaves nothing: the library refuses T2 < 0 after the allocations
        b = live()
        @test_throws KmmError QMRI4.signal(bad, mg)
        @test live() == b                       # was b + 1: the output stayed
        @test_throws KmmError QMRI4.signal(bad, mgview)
        @test live() == b                       # was b + 2: the output and the copy
        @test_throws KmmError QMRI4.residual(bad, mg, data)
        @test live() == b
        @test_throws KmmError Jbad * ones(Float32, 4, 4)
        @test live() == b                       # was b + 2: the output and the upload
        @test_throws KmmError Jbad * view(big, 5:20)
        @test live() == b                       # was b + 2: the output and the copy
        @test_throws KmmError Jbad' * data
        @test live() == b                       # was b + 2
        # refused arguments make nothing
        @test_throws DimensionMismatch J * ones(Float32, 5)
        @test_throws DimensionMismatch J' * ones(ComplexF32, 5)
        @test_throws DimensionMismatch QMRI4.residual(model, mg, zeros(ComplexF32, 6, 8, 3))
        @test live() == b                       # was b + 1: it computed the signal first
        @test_throws ArgumentError LinearAlgebra.mul!(view(KmmArray(zeros(ComplexF32, 100); manager = m), 5:100),
                                                      J, view(big, 5:20))
        @test live() == b + 1                   # the caller's output buffer; was b + 2
    finally
        GC.enable(true)
    end
    close(m)
end

@testset "compression bases and dictionaries free what they make" begin
    m = KmmManager(backend = :host)
    seq = QMRI4.FISPSequence(FLIPS4; TR = 0.010, TE = 0.005, Ns = 8)
    p = QMRI4.parameter_grid(T1 = (0.1, 5.0, 4), T2 = (0.01, 3.0, 4); manager = m)
    d = QMRI4.simulate_fisp(seq, p)
    dv = view(d, :, 2:size(d, 2))                       # starts inside its buffer
    live() = Int(Kmm.memory_stats(m).live_buffers)
    GC.gc(); GC.enable(false)
    try
        b = live(); u = QMRI4.compression_basis(dv; rank = 2)
        @test live() == b + 1                   # was b + 2: the copy of the view stayed
        # parameters in a KmmArray view with a bad atom: the copy is freed with the error
        pk = KmmArray(Float32[1 1 1; 0.1 0.1 -0.1; 1 1 1; 0 0 0]; manager = m)
        b = live()
        @test_throws ArgumentError QMRI4.Dictionary(seq, view(pk, :, 2:3))
        @test live() == b                       # was b + 1
        b = live()
        @test_throws ArgumentError QMRI4.Dictionary(seq, p; block_atoms = 0)
        @test live() == b
    finally
        GC.enable(true)
    end
    close(m)
end

@testset "trajectories and sequences refuse counts the library cannot take, naming them" begin
    k0 = ComplexF32.(1:8); dk = fill(ComplexF32(10, 0), 8)
    msg(e) = sprint(showerror, e)
    for n in (2^31, big(2)^70, typemax(Int), 0, -1, true, false)
        err = r4qerror(() -> QMRI4.CartesianTrajectory(k0, dk; nsamples = n, dt = 5e-6))
        @test err isa ArgumentError && occursin("nsamples", msg(err))   # was accepted / InexactError
        @test err isa ArgumentError && occursin("2147483647", msg(err))
        # the positional constructor checks too
        err = r4qerror(() -> QMRI4.CartesianTrajectory(k0, dk, n, 5e-6))
        @test err isa ArgumentError && occursin("nsamples", msg(err))
    end
    @test occursin("Bool", msg(r4qerror(() -> QMRI4.CartesianTrajectory(k0, dk; nsamples = true, dt = 5e-6))))
    t = QMRI4.CartesianTrajectory(k0, dk; nsamples = 2^31 - 1, dt = 5e-6)   # the bound itself is taken
    @test t.nsamples == 2^31 - 1
    @test QMRI4.CartesianTrajectory(k0, dk; nsamples = big(6), dt = 5e-6).nsamples == 6
    # a spiral's counts are its shape: no samples or no readouts is refused on construction
    err = r4qerror(() -> QMRI4.SpiralTrajectory(zeros(ComplexF32, 0, 8); dt = 5e-6))
    @test err isa ArgumentError && occursin("nsamples", msg(err))       # was accepted
    @test r4qerror(() -> QMRI4.SpiralTrajectory(zeros(ComplexF32, 6, 0); dt = 5e-6)) isa ArgumentError
    @test r4qerror(() -> QMRI4.SpiralTrajectory(zeros(ComplexF32, 6, 8), 0.0)) isa ArgumentError
    @test size(QMRI4.SpiralTrajectory(zeros(ComplexF32, 6, 8); dt = 5e-6).k) == (6, 8)
    # a model without coils is refused when made, not when its signal is computed
    m = KmmManager(backend = :host)
    traj = QMRI4.CartesianTrajectory(k0, dk; nsamples = 6, dt = 5e-6)
    err = r4qerror(() -> QMRI4.MRSTATModel(zeros(4), zeros(4), fill(0.08, 4), zeros(4), ones(ComplexF32, 4),
                                           zeros(ComplexF32, 4, 0), traj; manager = m))
    @test err isa ArgumentError && occursin("coils", msg(err))          # was accepted
    @test Int(Kmm.memory_stats(m).live_buffers) == 0
    close(m)
    # the sequences' integer counts refuse a Bool as well
    err = r4qerror(() -> QMRI4.FISPSequence(FLIPS4; TR = 0.01, Ns = true))
    @test err isa ArgumentError && occursin("Ns", msg(err))              # was Ns = 1
    @test r4qerror(() -> QMRI4.FISPSequence(FLIPS4; TR = 0.01, Ns = big(2)^70)) isa ArgumentError
    @test QMRI4.FISPSequence(FLIPS4; TR = 0.01, Ns = big(8)).Ns == 8
    @test r4qerror(() -> QMRI4.log_grid(0.1, 5.0, true)) isa ArgumentError              # was [0.1]
    err = r4qerror(() -> QMRI4.parameter_grid(T1 = (0.1, 5.0, true), T2 = 0.05))
    @test err isa ArgumentError && occursin("T1", msg(err))
end

@testset "rank = true is refused, as other counts refuse a Bool" begin
    m = KmmManager(backend = :host)
    flips = Float32[deg2rad(5 + 60 * sin(pi * n / 50)^2) for n in 1:20]
    seq = QMRI4.FISPSequence(flips; TR = 0.010, TE = 0.005, Ns = 8)
    p = QMRI4.parameter_grid(T1 = (0.1, 5.0, 4), T2 = (0.01, 3.0, 4); manager = m)
    d = QMRI4.simulate_fisp(seq, p)
    sig = Array(d)[:, 1:2]
    live() = Int(Kmm.memory_stats(m).live_buffers)
    b = live()
    for r in (true, false)
        err = r4qerror(() -> QMRI4.match(d, sig; rank = r))
        @test err isa ArgumentError && occursin("rank", sprint(showerror, err))   # true was rank 1
        @test r4qerror(() -> QMRI4.match(seq, p, sig; rank = r)) isa ArgumentError
        @test r4qerror(() -> QMRI4.match(QMRI4.Dictionary(seq, p), sig; rank = r)) isa ArgumentError
        err = r4qerror(() -> QMRI4.compression_basis(d; rank = r))
        @test err isa ArgumentError && occursin("rank", sprint(showerror, err))
        @test r4qerror(() -> QMRI4.compression_basis(seq, p; rank = r)) isa ArgumentError
    end
    # the integers still work
    @test QMRI4.match(d, sig; rank = 1) isa QMRI4.MatchResult
    @test size(QMRI4.compression_basis(d; rank = 1)) == (20, 1)
    @test size(QMRI4.compression_basis(seq, p; rank = Int32(2))) == (20, 2)
    close(m)
end
