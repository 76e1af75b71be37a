# Adversarial round 14: failing tests for defects found from the documentation and the public
# API (host backend). Each @testset failed on the code as it was found.

using Test, Kmm

# The error kept the first attempt's figures (3 MiB in 2 buffers, a buffer the collection then
# freed among the largest holders) while the memory_status it carries, printed under them, was
# read after the collection: the printed error contradicted itself.
@testset "an out-of-memory error's figures agree with the status it carries" begin
    m = KmmManager(backend = :host, chunk_size = 1 << 20, hard_limit = 4 << 20)
    keep = KmmArray{UInt8}(undef, 2 << 20; manager = m)
    garbage(m) = (KmmArray{UInt8}(undef, 1 << 20; manager = m); nothing)
    garbage(m)
    err = try
        KmmArray{UInt8}(undef, 3 << 20; manager = m)
        nothing
    catch e
        e
    end
    @test err isa KmmOutOfMemoryError
    st = err.status.device
    @test st.live_buffers == 1 && st.in_use == 2 << 20
    @test occursin("in use: 2.00 MiB in 1 buffers", err.message) || occursin("in use: 2.00 MiB in 1 buffer", err.message)
    @test count("buffer 0x", split(err.message, "largest holders")[2]) >= 1
    @test !occursin("1.00 MiB", split(split(err.message, "largest holders")[2], '\n')[1])
    @test occursin("the first try tried:", err.message)
    @test occursin("in Julia: GC.gc(false), GC.gc(true) and trim!", sprint(showerror, err))
    @test length(keep) == 2 << 20
    close(m)
end

# log_grid's ends came from exp(log(x)): 0.49999999999999994 for 0.5, and parameter_grid then
# dropped the atom where T2 == T1 (or found no atom at all).
@testset "a log grid holds its ends exactly" begin
    m = KmmManager(backend = :host)
    for (lo, hi) in ((0.1, 0.5), (0.01, 3.0), (0.3, 7.0)), n in 2:60
        g = Kmm.QMRI.log_grid(lo, hi, n)
        @test (g[1], g[end]) == (lo, hi)
        @test issorted(g)
    end
    p = Array(Kmm.QMRI.parameter_grid(T1 = (0.1, 0.5, 2), T2 = [0.1, 0.5], manager = m))
    @test size(p, 2) == 3 && (0.5f0, 0.5f0) in [(p[1, j], p[2, j]) for j in 1:3]
    @test size(Kmm.QMRI.parameter_grid(T1 = (0.1, 0.5, 2), T2 = 0.5, manager = m), 2) == 1
    close(m)
end

# (2^32, 2^32, 0) was refused ("the size overflows") while (0, 2^32, 2^32) passed: a 0 makes the
# length 0 wherever it is, as in Base.
@testset "a zero dimension anywhere makes an empty array" begin
    m = KmmManager(backend = :host)
    for dims in ((2^32, 2^32, 0), (0, 2^32, 2^32), (2^62, 4, 0))
        x = KmmArray{Float64}(undef, dims...; manager = m)
        @test size(x) == dims && length(x) == 0
        p = PinnedArray{Float64}(undef, dims...; manager = m)
        @test size(p) == dims && length(p) == 0
        @test size(similar(x, dims...)) == dims
        @test size(reshape(KmmArray{Float64}(undef, 0; manager = m), dims)) == dims
        @test size(reshape(p, reverse(dims))) == reverse(dims)
    end
    @test size(KmmArray(Array{Float64}(undef, 2^32, 2^32, 0); manager = m)) == (2^32, 2^32, 0)
    @test_throws ArgumentError KmmArray{Float64}(undef, 2^32, 2^32, 1; manager = m)
    @test_throws DimensionMismatch reshape(KmmArray{Float64}(undef, 0; manager = m), (2^32, 2^32, 1))
    close(m)
end

# The dictionary kept the caller's sequence object: changing its flip angles in place changed
# the PD of later matches against the kept dictionary (0.83 to 1.16 for a true 0.5).
@testset "a dictionary keeps the sequence it was simulated with" begin
    Q = Kmm.QMRI
    m = KmmManager(backend = :host)
    seq = Q.FISPSequence(Float32.(deg2rad.(range(5, 60, length = 20))); TR = 0.01, TE = 0.005, TI = 0.02, Ns = 8)
    params = Q.parameter_grid(T1 = (0.1, 5.0, 5), T2 = (0.01, 3.0, 5), manager = m)
    sig = Array(Q.simulate_fisp(seq, params))[:, [3, 7, 11, 17]] .* 0.5f0
    dict = Q.Dictionary(seq, params; block_atoms = 4)
    @test Array(Q.match(dict, sig).PD) ≈ fill(0.5f0, 4)
    seq.flip_angles .*= 0.3f0
    push!(seq.flip_angles, 0.1f0); push!(seq.phases, 0f0)
    r = Q.match(dict, sig)
    @test Array(r.PD) ≈ fill(0.5f0, 4)
    @test Array(r.index) == [3, 7, 11, 17]
    @test length(dict.seq) == 20
    close(m)
end

# mul! with a host input threw a five-argument MethodError naming nothing; J * v took it.
@testset "mul! with a Jacobian takes host inputs and names a wrong output" begin
    Q = Kmm.QMRI
    mgr = KmmManager(backend = :host)
    N = 4; NTR = 8; nvox = 6; dk = 2pi / 0.2
    seq = Q.FISPSequence([deg2rad(5 + 55 * sin(2pi * k / NTR)^2) for k in 1:NTR]; TR = 0.010, TE = 0.005, TI = 0.020, Ns = 8)
    traj = Q.CartesianTrajectory([(-N / 2 * dk, ((r - 1) % N - N / 2) * dk) for r in 1:NTR], [(dk, 0.0) for r in 1:NTR]; nsamples = N, dt = 1e-5)
    model = Q.MRSTATModel(collect(range(-0.05, 0.05, length = nvox)), zeros(nvox), fill(0.1, nvox), zeros(nvox),
                          ones(ComplexF32, nvox), ones(ComplexF32, nvox, 2), traj; manager = mgr)
    atoms = vcat(fill(1f0, 1, nvox), fill(0.1f0, 1, nvox), ones(Float32, 1, nvox), zeros(Float32, 1, nvox))
    m, d1, d2 = Q.magnetization(seq, atoms; manager = mgr)
    J = Q.Jacobian(model, m, d1, d2)
    v = Float32.(reshape(1:4nvox, 4, nvox)) ./ 100
    want = Array(J * v)
    y = KmmArray{ComplexF32}(undef, size(want)...; manager = mgr)
    @test Array(Kmm.LinearAlgebra.mul!(y, J, v)) == want
    g = KmmArray{Float32}(undef, 4, nvox; manager = mgr)
    @test Array(Kmm.LinearAlgebra.mul!(g, J', want)) == Array(J' * want)
    err = try Kmm.LinearAlgebra.mul!(Array(y), J, v); nothing catch e; e end
    @test err isa ArgumentError && occursin("y must be a KmmArray{ComplexF32}", err.msg)
    err = try Kmm.LinearAlgebra.mul!(KmmArray{ComplexF64}(undef, 4; manager = mgr), J', want); nothing catch e; e end
    @test err isa ArgumentError && occursin("KmmArray{Float32}", err.msg)
    close(mgr)
end
