# Adversarial round 15 (qMRI): failing tests for defects found from the documentation and the
# public API (host backend). Each @testset failed on the code as it was found.

using Test, Kmm, Random
const Q15 = Kmm.QMRI

# Two atoms of a grid with B0 = 0 and 7 Hz scored 4.2713168099530 and 4.2713168096858 in f64,
# equal in Float32: the whole dictionary's match compared f64 scores (the higher index won),
# a batched one compared the stored Float32 scores (ties: the lower index), so the maps
# differed in index, B0 and PD, where the docs promise the same maps.
@testset "matching whole, in batches and in blocks gives the same maps" begin
    m = KmmManager(backend = :host)
    Random.seed!(2)
    flips = Float32[deg2rad(5 + 60 * sin(pi * n / 50)^2) for n in 1:100]
    seq = Q15.FISPSequence(flips; TR = 0.010, TE = 0.005, TI = 0.020, Ns = 16)
    params = Q15.parameter_grid(T1 = (0.1, 5.0, 9), T2 = (0.01, 3.0, 7), B0 = [0.0, 7.0], manager = m)
    truth = Q15.tissue_parameters([0.78, 1.1, 4.0, 0.3], [0.065, 0.1, 2.0, 0.3], 1.0, [0.0, 7.0, 0.0, 7.0]; manager = m)
    noisy = Array(Q15.simulate_fisp(seq, truth)) .* ComplexF32[0.8, 1.2im, 2, -1]' .+ 0.01f0 .* randn(ComplexF32, 100, 4)
    sig = KmmArray(noisy; manager = m)   # every match on m (a batched match runs on the signals' manager)
    dict = Q15.simulate_fisp(seq, params)
    whole = Q15.match(dict, sig; params = params)
    maps(r) = (Array(r.index), Array(r.score), Array(r.PD), Array(r.B0))
    @test Array(whole.index)[3] == 42 && Array(whole.B0)[3] == 0  # the tie: the lower index
    for batch in (1, 4, 7, 63)
        @test maps(Q15.match(seq, params, sig; batch_atoms = batch)) == maps(whole)
    end
    for block in (5, 17)
        @test maps(Q15.match(Q15.Dictionary(seq, params; block_atoms = block), sig)) == maps(whole)
    end
    close(m)
end

# `simulate_fisp(...; check = true)` and every MR-STAT call wait for the stream inside libkmm
# (they read their inputs back to check them). They did so inside a plain ccall: another task
# of the thread did not run for the whole wait (1.5 s behind queued work), and other threads'
# collections stalled. Now the queued work is waited for by polling first.
@testset "qMRI calls that check their inputs let other tasks run while they wait" begin
    m = KmmManager(backend = :host)
    flips = Float32[deg2rad(5 + 60 * sin(pi * n / 250)^2) for n in 1:1000]
    seq = Q15.FISPSequence(flips; TR = 0.010, TE = 0.005, TI = 0.020, Ns = 32)
    params = Q15.parameter_grid(T1 = (0.1, 5.0, 60), T2 = (0.01, 3.0, 60), manager = m)
    small = Q15.tissue_parameters([1.0], [0.1]; manager = m)
    traj = Q15.CartesianTrajectory(ComplexF32.(1:1000), fill(ComplexF32(1), 1000); nsamples = 4, dt = 1e-5)
    model = Q15.MRSTATModel([0.0], [0.0], [0.1], [0.0], [1.0 + 0im], ones(ComplexF32, 1, 1), traj; manager = m)
    mag, d1, d2 = Q15.magnetization(seq, small)
    J = Q15.Jacobian(model, mag, d1, d2)
    v = KmmArray(ones(Float32, 4, 1); manager = m)
    calls = [("simulate_fisp", () -> Q15.simulate_fisp(seq, small)),
             ("magnetization", () -> Q15.magnetization(seq, small)),
             ("signal", () -> Q15.signal(model, mag)),
             ("J * v", () -> J * v)]
    foreach(c -> c[2](), calls)     # compiled before the timed calls
    Kmm.synchronize(m)
    # Half a second of work or more queued before each call, whatever the machine's speed.
    one = @elapsed (Kmm.unsafe_free!(Q15.simulate_fisp(seq, params; check = false)); Kmm.synchronize(m))
    copies = clamp(ceil(Int, 0.5 / one), 1, 100)
    for (name, call) in calls
        # The work queued, then the call, while a task of this thread beats every 5 ms: beats
        # inside the call mean it yielded.
        queued = [Q15.simulate_fisp(seq, params; check = false) for _ in 1:copies]
        beats = Float64[]
        stop = Ref(false)
        beater = @async while !stop[]
            push!(beats, time())
            sleep(0.005)
        end
        yield()
        t0 = time()
        call()
        t1 = time()
        stop[] = true
        wait(beater)
        inside = count(t -> t0 < t < t1, beats)
        @test t1 - t0 > 0.2           # the call did wait for the queued work
        @test inside >= 5             # and the task ran meanwhile
        inside >= 5 || @info "$name: $(round(t1 - t0; digits = 2)) s, $inside beats inside"
        foreach(Kmm.unsafe_free!, queued)
    end
    close(m)
end

# MRSTATModel accepted T2 = 1e-50, x = 1e39, NaN and Inf: the error came at the first `signal`,
# naming values the caller never gave, 0-based (`voxels.t2[0] = 0`, the Float32 of 1e-50).
@testset "an MR-STAT model checks its values when made, named as given" begin
    m = KmmManager(backend = :host)
    traj = Q15.CartesianTrajectory(ComplexF32.(1:4), fill(ComplexF32(1), 4); nsamples = 2, dt = 1e-5)
    good = (x = [0.0, 0.1], y = [0.0, 0.0], T2 = [0.1, Inf], B0 = [0.0, 1.0], ρ = [1.0 + 0im, 1.0im], coils = ones(ComplexF32, 2, 2))
    make(; kw...) = (a = merge(good, kw); Q15.MRSTATModel(a.x, a.y, a.T2, a.B0, a.ρ, a.coils, traj; manager = m))
    live = Kmm.memory_status(m).device.live_buffers
    for (kw, words) in (((T2 = [0.1, 1e-50],), ["T2[2] = 1.0e-50", "> 0"]),
                        ((T2 = [NaN, 0.1],), ["T2[1] = NaN"]),
                        ((T2 = [0.1, -1.0],), ["T2[2] = -1.0"]),
                        ((x = [1e39, 0.0],), ["x[1] = 1.0e39", "finite"]),
                        ((y = [0.0, NaN],), ["y[2] = NaN"]),
                        ((B0 = [Inf, 0.0],), ["B0[1] = Inf"]),
                        ((ρ = [1.0 + 0im, complex(0.0, 1e40)],), ["ρ[2]"]),
                        ((coils = ComplexF32[1 1; 1 Inf],), ["coils[2, 2]"]))
        err = try
            make(; kw...)
            nothing
        catch e
            e
        end
        @test err isa ArgumentError
        err isa ArgumentError && @test all(w -> occursin(w, err.msg), words)
    end
    @test Kmm.memory_status(m).device.live_buffers == live   # nothing was uploaded
    model = make()
    @test model.nvoxels == 2
    @test_throws ArgumentError Q15.with_tissue(model, [0.1, 0.0], good.ρ)
    close(m)
end

# Review of round 15: `match_raw!` assigned the basis call's flags twice, so the closure around
# the call boxed them (`Core.Box`, untyped): the libkmm wrapper was looked up, and on the first
# call compiled, inside the GC-safe region, where another thread's collection may run.
@testset "the GC-safe match call reads no boxed variable" begin
    T = Tuple{Q15.RawOutputs,KmmArray{ComplexF32,2},Int,Int,Int,KmmArray{ComplexF32,2},Int,Int,Nothing,Bool,
              KmmArray{ComplexF32,2},Bool}
    ir = sprint(show, Base.code_typed(Q15.match_raw!, T; optimize = false))
    @test occursin("unchecked_kmm_qmri_match_in_basis", ir) || occursin("#call#", ir)
    @test !occursin("Core.Box", ir)
end
