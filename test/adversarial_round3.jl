# Defects found by the third adversarial run against the exported API (showing freed pinned
# arrays, qMRI arguments narrowed to Float32, calls that leave memory behind, restores of
# spilled arrays under memory pressure, freed empty arrays), one testset each.

const QMRI3 = Kmm.QMRI
const FLIPS3 = Float32[deg2rad(5 + 60 * sin(pi * n / 50)^2) for n in 1:20]

@testset "show/repr/string of a freed PinnedArray does not throw" begin
    m = KmmManager(backend = :host)
    p = PinnedArray(Float32[1, 2]; manager = m)
    Kmm.unsafe_free!(p)
    @test occursin("(freed)", repr(p))                               # was a KmmError
    @test occursin("(freed)", string(p))
    @test occursin("(freed)", sprint(show, MIME"text/plain"(), [p]))  # a container holding it
    q = PinnedArray(Float32[1, 2]; manager = m)
    close(m)
    @test occursin("(freed)", repr(q))                               # manager closed
end

@testset "sequence values that overflow or underflow Float32 are refused on construction" begin
    # Checked as Float64, stored as Float32: 1e39 becomes Inf32 and passes the finite check.
    @test_throws ArgumentError QMRI3.FISPSequence(FLIPS3; TR = 1e39, TE = 0.005)
    @test_throws ArgumentError QMRI3.FISPSequence(FLIPS3; TR = 0.01, TI = 1e39)
    @test_throws ArgumentError QMRI3.FISPSequence(fill(1e39, 20); TR = 0.01)
    @test_throws ArgumentError QMRI3.FISPSequence(FLIPS3; TR = 0.01, profile = fill(1e39, 20, 2))
    @test_throws ArgumentError QMRI3.PSSFPSequence(FLIPS3; TR = 0.01, dt_ex = 1e39, dt_pr = 0.001)
    @test_throws ArgumentError QMRI3.PSSFPSequence(FLIPS3; TR = 0.01, gz_ex = 1e39)
    @test_throws ArgumentError QMRI3.PSSFPSequence(FLIPS3; TR = 0.01, z = [1e39])
    # dt must be > 0: 1e-50 passes as Float64 and is stored as 0f0; 1e39 is stored as Inf32
    k0 = ComplexF32[complex(-100f0, 10f0 * r) for r in 1:8]; dk = fill(ComplexF32(10, 0), 8)
    @test_throws ArgumentError QMRI3.CartesianTrajectory(k0, dk; nsamples = 6, dt = 1e-50)
    @test_throws ArgumentError QMRI3.CartesianTrajectory(k0, dk; nsamples = 6, dt = 1e39)
    @test_throws ArgumentError QMRI3.SpiralTrajectory(zeros(ComplexF32, 6, 8); dt = 1e-50)
end

@testset "PSSFPSequence: a bad explicit dt_pr is named in the error" begin
    for bad in (-1.0, NaN)
        err = try QMRI3.PSSFPSequence(FLIPS3; TR = 0.01, dt_pr = bad); nothing catch e; e end
        @test err isa ArgumentError
        # was: "the RF pulse (1 x dt_ex = 0 s) is longer than TR = 0.01 s"
        @test err isa ArgumentError && occursin("dt_pr", sprint(showerror, err))
    end
end

@testset "compression_basis(seq, params; atoms = 1) and match(...; basis_atoms = 1) sample one atom" begin
    m = KmmManager(backend = :host)
    seq = QMRI3.FISPSequence(FLIPS3; TR = 0.010, TE = 0.005, Ns = 8)
    params = QMRI3.parameter_grid(T1 = (0.1, 5.0, 5), T2 = (0.01, 3.0, 5), manager = m)
    # was: ArgumentError("range(1.0, stop=N, length=1): endpoints differ")
    u = try QMRI3.compression_basis(seq, params; rank = 1, atoms = 1) catch e; e end
    @test u isa KmmArray && size(u) == (20, 1)
    sig = Array(QMRI3.simulate_fisp(seq, params))[:, 1:2]
    r = try QMRI3.match(seq, params, sig; rank = 1, basis_atoms = 1) catch e; e end
    @test r isa QMRI3.MatchResult
    close(m)
end

@testset "restoring a spilled array retries after a collection, as an allocation does" begin
    # Unreachable arrays marked never_spill hold the device; an allocation runs GC and
    # succeeds, but Array/fill!/copyto!/never_spill! of a spilled array (a restore) throw a
    # bare KmmError(KMM_ERROR_OUT_OF_MEMORY) although the live arrays fit.
    function setup()
        m = KmmManager(backend = :host, chunk_size = 1 << 20, hard_limit = 4 << 20,
                       spill_limit = 16 << 20)
        a = KmmArray(fill(0x01, 1 << 20); manager = m)
        for i in 1:4
            Kmm.never_spill!(KmmArray{UInt8}(undef, 1 << 20; manager = m))   # garbage at once
        end
        m, a
    end
    for op in (a -> Array(a), a -> fill!(a, 0x01), a -> copyto!(a, ones(UInt8, 1 << 20)),
               a -> Kmm.never_spill!(a))
        m, a = setup()
        @test Kmm.is_spilled(a)
        r = try op(a); :ok catch e; e end
        @test r === :ok
        GC.gc(); close(m)
    end
end

@testset "qMRI calls free what they made: simulate that fails, magnetization's upload" begin
    mm = KmmManager(backend = :host)
    seq = QMRI3.FISPSequence(FLIPS3; TR = 0.010, TE = 0.005, Ns = 8)
    live() = Kmm.memory_stats(mm).live_buffers
    GC.gc(); GC.enable(false)
    try
        # T1 = 1e-50 passes the Julia check and becomes 0f0: the library refuses it, and the
        # upload of the parameters and the dictionary stay allocated (until a collection).
        b = live()
        @test_throws ArgumentError QMRI3.simulate_fisp(seq, [1e-50 1.0; 0.1 0.1; 1 1; 0 0]; manager = mm)
        @test live() == b
        p = KmmArray(Float32[0 1.0; 0.1 0.1; 1 1; 0 0]; manager = mm)
        b = live()
        @test_throws KmmError QMRI3.simulate_fisp(seq, p)
        @test live() == b                                   # the dictionary `out` stays
        b = live()
        @test_throws KmmError QMRI3.magnetization(seq, p)
        @test live() == b                                   # 3 outputs stayed
        @test_throws ArgumentError QMRI3.magnetization(seq, [1e-50 1.0; 0.1 0.1; 1 1; 0 0]; manager = mm)
        @test live() == b
        b = live()
        mg = QMRI3.magnetization(seq, [1.0 1.0; 0.1 0.1; 1 1; 0 0]; manager = mm)
        @test live() == b + 3                               # was b + 4: the upload stayed
    finally
        GC.enable(true)
    end
    close(mm)
end

@testset "a freed empty KmmArray is a KmmError when used, like any freed array" begin
    m = KmmManager(backend = :host)
    x = KmmArray{Float32}(undef, 0; manager = m)
    Kmm.unsafe_free!(x)
    @test_throws KmmError Array(x)          # returned Float32[]
    @test_throws KmmError fill!(x, 1f0)     # returned silently
    @test_throws KmmError copyto_async!(Float32[], x)   # already a KmmError
    close(m)
end

@testset "trace_start! refuses a Bool capacity, as the other counts do" begin
    m = KmmManager(backend = :host)
    @test_throws KmmError Kmm.trace_start!(m; capacity = true)   # was accepted as 1
    close(m)
end

@testset "tissue_parameters refuses a String instead of reading its characters as numbers" begin
    # tissue_parameters("a", 0.1) gave T1 = 97 ('a')
    @test_throws ArgumentError QMRI3.tissue_parameters("a", 0.1)
end

