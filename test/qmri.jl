# Kmm.QMRI tests: the library's FISP and pSSFP simulations against independent plain-Julia
# references written here (EPG and isochromat, after BlochSimulators.jl's FISP2D and pSSFP2D),
# closed forms, symmetries, matching, batching, bad input, and the MRF notebook end to end.

using Test
using Kmm
import LinearAlgebra
const Q = Kmm.QMRI

# ---- plain-Julia references (Float64) -------------------------------------------------------

"EPG FISP of one atom (BlochSimulators' FISP2D): adiabatic inversion, TI, then per TR: RF,
relaxation + off-resonance to TE, sample F+(0), relaxation to TR, dephasing."
function ref_fisp(flip, phase, TR, TE, TI, Ns, T1, T2, B1 = 1.0, B0 = 0.0; profile = ones(length(flip), 1))
    ntr = length(flip)
    E(t, T) = exp(-t / T)
    out = zeros(ComplexF64, ntr)
    rot(t) = cis(2pi * B0 * t)           # BlochSimulators' rotate_decay!: F₊ *= E₂ exp(+i 2π B0 Δt)
    for p in 1:size(profile, 2)
        F = zeros(ComplexF64, Ns); G = zeros(ComplexF64, Ns); Z = zeros(ComplexF64, Ns)
        Z[1] = -1                        # inversion of the equilibrium
        Z .*= E(TI, T1); Z[1] += 1 - E(TI, T1)
        for n in 1:ntr
            a = flip[n] * profile[n, p] * B1
            e = cis(phase[n])
            c2, s2, sa, ca = cos(a / 2)^2, sin(a / 2)^2, sin(a), cos(a)
            for k in 1:Ns
                f, g, z = F[k], G[k], Z[k]
                F[k] = c2 * f + e^2 * s2 * g - im * e * sa * z
                G[k] = conj(e)^2 * s2 * f + c2 * g + im * conj(e) * sa * z
                Z[k] = -im / 2 * conj(e) * sa * f + im / 2 * e * sa * g + ca * z
            end
            for (t, acc) in ((TE, true), (TR - TE, false))
                F .*= E(t, T2) * rot(t); G .*= E(t, T2) * conj(rot(t))
                Z .*= E(t, T1); Z[1] += 1 - E(t, T1)
                acc && (out[n] += F[1])
            end
            G[1:end-1] = G[2:end]; G[end] = 0         # F- states down
            F[2:end] = F[1:end-1]; F[1] = conj(G[1])  # F+ states up
        end
    end
    out
end

"Isochromat pSSFP of one atom (BlochSimulators' pSSFP2D), summed over the slice positions."
function ref_pssfp(flip, phase, rf_shape, zs, dt_ex, dt_inv, dt_pr, gz_ex, gz_pr, T1, T2, B1 = 1.0, B0 = 0.0)
    E(t, T) = exp(-t / T)
    function rotate(m, a)                      # Rodrigues, about a by |a|
        θ = sqrt(sum(abs2, a)); θ == 0 && return m
        k = a ./ θ
        cr = [k[2] * m[3] - k[3] * m[2], k[3] * m[1] - k[1] * m[3], k[1] * m[2] - k[2] * m[1]]
        cos(θ) .* m .+ sin(θ) .* cr .+ (sum(k .* m) * (1 - cos(θ))) .* k
    end
    relax(m, t) = [m[1] * E(t, T2), m[2] * E(t, T2), m[3] * E(t, T1) + 1 - E(t, T1)]
    function excite(m, rf, z)
        for w in rf_shape
            s = rf * w
            m = rotate(m, [real(s) * B1, -imag(s) * B1, -(gz_ex * z) - dt_ex * 2pi * B0])
            m = relax(m, dt_ex)
        end
        m
    end
    function precess(m, area, z)
        θ = -area * z - dt_pr * 2pi * B0
        m = [cos(θ) * m[1] - sin(θ) * m[2], sin(θ) * m[1] + cos(θ) * m[2], m[3]]
        relax(m, dt_pr)
    end
    out = zeros(ComplexF64, length(flip))
    for z in zs
        m = [0.0, 0.0, cos(pi * B1)]
        m = relax(m, dt_inv)
        m = excite(m, -flip[1] / 2 * cis(phase[1]), z)
        m = precess(m, 2gz_pr, z)
        for n in 1:length(flip)
            m = excite(m, flip[n] * cis(phase[n]), z)
            m = precess(m, gz_pr, z)
            out[n] += complex(m[1], m[2])
            m = precess(m, gz_pr, z)
        end
    end
    out
end

relerr(a, b) = sqrt(sum(abs2, a .- b) / sum(abs2, b))

# ---- sequences and atoms used below ---------------------------------------------------------

const NTR = 60
const FLIPS = [deg2rad(10 + 50 * sin(pi * n / NTR)^2) for n in 1:NTR]
const PHASES = [0.3 * sin(n / 7) for n in 1:NTR]
const ATOMS = [(0.8, 0.07, 1.0, 0.0), (1.5, 0.12, 0.9, 0.0), (4.0, 2.0, 1.1, 0.0),
               (0.3, 0.05, 1.0, 0.0), (Inf, Inf, 1.0, 0.0), (1.2, Inf, 1.0, 0.0)]
params_of(atoms) = Q.tissue_parameters([a[1] for a in atoms], [a[2] for a in atoms],
                                       [a[3] for a in atoms], [a[4] for a in atoms])

@testset "FISP against the EPG reference" begin
    seq = Q.FISPSequence(FLIPS; phases = PHASES, TR = 0.010, TE = 0.004, TI = 0.025, Ns = 20)
    sim = Array(Q.simulate_fisp(seq, params_of(ATOMS)))
    @test size(sim) == (NTR, length(ATOMS))
    for (j, a) in enumerate(ATOMS)
        ref = ref_fisp(Float32.(FLIPS), Float32.(PHASES), 0.010f0, 0.004f0, 0.025f0, 20, a...)
        @test relerr(sim[:, j], ref) < 1e-4
    end
    # slice profile: the signal is summed over the profile's positions
    prof = Float32[s for n in 1:NTR, s in (1.0, 0.8, 0.4)]
    seqp = Q.FISPSequence(FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 12, profile = prof)
    simp = Array(Q.simulate_fisp(seqp, params_of(ATOMS[1:2])))
    for j in 1:2
        ref = ref_fisp(Float32.(FLIPS), zeros(NTR), 0.010f0, 0.005f0, 0.02f0, 12, ATOMS[j]...; profile = prof)
        @test relerr(simp[:, j], ref) < 1e-4
    end
end

@testset "FISP off-resonance (BlochSimulators' rotate_decay!: F₊ *= E₂ exp(+i 2π B0 Δt))" begin
    seq = Q.FISPSequence(FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 20)
    sim = Array(Q.simulate_fisp(seq, Q.tissue_parameters(0.8, 0.07, 1.0, 13.0)))[:, 1]
    ref = ref_fisp(Float32.(FLIPS), zeros(NTR), 0.010f0, 0.005f0, 0.02f0, 20, 0.8, 0.07, 1.0, 13.0)
    flipped = ref_fisp(Float32.(FLIPS), zeros(NTR), 0.010f0, 0.005f0, 0.02f0, 20, 0.8, 0.07, 1.0, -13.0)
    @test relerr(sim, ref) < 1e-4
    @test relerr(sim, flipped) > 1e-2       # the sign matters at 13 Hz: the check can fail
end

@testset "pSSFP against the isochromat reference" begin
    nrf = 5
    shape = fill(1 / nrf, nrf)
    zs = [-0.2, -0.05, 0.1, 0.3]
    args = (0.0001f0, 0.015f0, 0.0025f0, 2.0f0, -5.0f0)   # dt_ex, dt_inv, dt_pr, gz_ex, gz_pr
    seq = Q.PSSFPSequence(FLIPS, PHASES, shape, zs, args...)
    atoms = [(0.8, 0.07, 1.0, 0.0), (1.5, 0.12, 0.9, 3.0), (4.0, 2.0, 1.1, -7.0), (Inf, Inf, 1.0, 0.0)]
    sim = Array(Q.simulate_pssfp(seq, params_of(atoms)))
    for (j, a) in enumerate(atoms)
        ref = ref_pssfp(Float32.(FLIPS), Float32.(PHASES), Float32.(shape), Float32.(zs), args..., a...)
        @test relerr(sim[:, j], ref) < 1e-4
    end
end

@testset "closed forms" begin
    # First two echoes after the inversion: -i sin(α) Z E2(TE) with Z known in closed form.
    T1, T2, TR, TE, TI = 0.9, 0.08, 0.012, 0.005, 0.03
    a1, a2 = 0.3, 0.7
    seq = Q.FISPSequence([a1, a2, 0.5]; TR = TR, TE = TE, TI = TI, Ns = 8)
    s = Array(Q.simulate_fisp(seq, Q.tissue_parameters(T1, T2)))[:, 1]
    z1 = 1 - 2exp(-TI / T1)
    z2 = cos(a1) * z1 * exp(-TR / T1) + 1 - exp(-TR / T1)
    @test s[1] ≈ -im * sin(a1) * z1 * exp(-TE / T2) rtol = 1e-5
    @test s[2] ≈ -im * sin(a2) * z2 * exp(-TE / T2) rtol = 1e-5
    # T1, T2 -> infinity: no relaxation, the first echo is i sin(α).
    sinf = Array(Q.simulate_fisp(seq, Q.tissue_parameters(Inf, Inf)))[:, 1]
    @test sinf[1] ≈ im * sin(a1) rtol = 1e-6
    @test sinf[2] ≈ im * sin(a2) * cos(a1) rtol = 1e-6
    # T2 -> infinity alone: the first echo loses its exp(-TE/T2); T2 = 1e6 s is continuous with Inf
    st2 = Array(Q.simulate_fisp(seq, Q.tissue_parameters([T1, T1], [Inf, 1e6])))
    @test st2[1, 1] ≈ -im * sin(a1) * z1 rtol = 1e-5
    @test st2[:, 1] ≈ st2[:, 2] rtol = 1e-5
    # Constant flip angle: FISP (SSFP-FID) converges to its analytic steady state.
    α, T1, T2, TR, TE = deg2rad(30), 0.8, 0.1, 0.01, 0.0
    seqc = Q.FISPSequence(fill(α, 1500); TR = TR, TE = TE, TI = 0, Ns = 160)
    sc = Array(Q.simulate_fisp(seqc, Q.tissue_parameters(T1, T2)))[:, 1]
    E1, E2 = exp(-TR / T1), exp(-TR / T2)
    p = 1 - E1 * cos(α) - E2^2 * (E1 - cos(α))
    q = E2 * (1 - E1) * (1 + cos(α))
    ss = tan(α / 2) * (1 - (E1 - cos(α)) * (1 - E2^2) / sqrt(p^2 - q^2))
    @test abs(sc[end]) ≈ ss rtol = 1e-3
    @test abs(real(sc[end])) < 1e-3 * abs(sc[end])
    # T1 -> infinity: E1 = 1 makes the closed form 0 (the longitudinal magnetisation is used
    # up and never recovers); the simulation decays to it.
    s1 = Array(Q.simulate_fisp(seqc, Q.tissue_parameters(Inf, 0.05)))[:, 1]
    @test abs(s1[end]) < 1e-3
    # balanced pSSFP with alternating flips, instantaneous RF, on resonance: the bSSFP steady
    # state sin(α)(1 - E1) / (1 - (E1 - E2) cos(α) - E1 E2), times E2(TE) at TE = TR/2.
    n = 3000
    flips = [α * (-1)^k for k in 1:n]
    dt_pr = 0.003
    seqb = Q.PSSFPSequence(flips, zeros(n), [1.0], [0.0], 0.0, 0.0, dt_pr, 0.0, 0.0)
    T1, T2 = 1.0, 0.1
    sb = Array(Q.simulate_pssfp(seqb, Q.tissue_parameters(T1, T2)))[:, 1]
    E1, E2 = exp(-2dt_pr / T1), exp(-2dt_pr / T2)
    bss = sin(α) * (1 - E1) / (1 - (E1 - E2) * cos(α) - E1 * E2) * exp(-dt_pr / T2)
    @test abs(sb[end]) ≈ bss rtol = 1e-3
end

@testset "symmetries" begin
    seq = Q.FISPSequence(FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 16)
    p = params_of(ATOMS[1:3])
    s0 = Array(Q.simulate_fisp(seq, p))
    # a constant RF phase φ rotates the signal by exp(iφ)
    φ = 0.7
    seqφ = Q.FISPSequence(FLIPS; phases = fill(φ, NTR), TR = 0.010, TE = 0.005, TI = 0.02, Ns = 16)
    @test relerr(Array(Q.simulate_fisp(seqφ, p)), s0 .* cis(φ)) < 1e-5
    # B1 scales the flip angles
    seqb = Q.FISPSequence(1.2 .* FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 16)
    sb = Array(Q.simulate_fisp(seq, Q.tissue_parameters(0.8, 0.07, 1.2)))
    @test relerr(sb, Array(Q.simulate_fisp(seqb, Q.tissue_parameters(0.8, 0.07, 1.0)))) < 1e-5
    # PD scaling: matching recovers the complex scale of the atom
    d = Q.simulate_fisp(seq, p)
    c = ComplexF32(0.6, -0.3)
    r = Q.match(d, KmmArray(c .* s0[:, [2, 3, 1]]); params = p)
    @test Array(r.index) == [2, 3, 1]
    @test all(isapprox.(Array(r.PD), c; rtol = 1e-4))
    @test all(isapprox.(Array(r.score), 1; atol = 1e-5))
end

@testset "matching" begin
    seq = Q.FISPSequence(FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 16)
    p = Q.parameter_grid(T1 = (0.2, 4.0, 15), T2 = (0.02, 2.0, 15), B1 = [0.9, 1.0])
    ph = Array(p)
    @test all(ph[2, :] .<= ph[1, :])                     # T2 > T1 dropped
    @test size(ph, 2) == 2 * count(t2 <= t1 for t1 in Q.log_grid(0.2, 4.0, 15), t2 in Q.log_grid(0.02, 2.0, 15))
    d = Q.simulate_fisp(seq, p)
    D = Array(d)
    pick = [1, 17, 40, 99, size(ph, 2)]
    sig = reshape(D[:, pick] .* ComplexF32(2.5), NTR, 5, 1)
    r = Q.match(d, KmmArray(sig); params = p)
    @test size(r.index) == (5, 1)
    @test vec(Array(r.index)) == pick                    # the exact grid atom, noiseless
    @test vec(Array(r.T1)) == ph[1, pick]
    @test vec(Array(r.T2)) == ph[2, pick]
    @test vec(Array(r.B1)) == ph[3, pick]
    @test all(isapprox.(Array(r.PD), 2.5; rtol = 1e-4))
    # generated and matched in batches (accumulating) = matched in one go
    for nb in (1, 7, 64)
        rb = Q.match(seq, p, KmmArray(sig); batch_atoms = nb)
        @test rb.batches == cld(size(ph, 2), nb)
        @test Array(rb.index) == Array(r.index)
        @test Array(rb.T1) == Array(r.T1)
        @test Array(rb.score) ≈ Array(r.score)
        @test Array(rb.PD) ≈ Array(r.PD) rtol = 1e-5
    end
    rt = Q.match(seq, p, KmmArray(sig); batch_atoms = 50, timings = true)
    @test rt.seconds[:simulate] >= 0 && rt.seconds[:match] >= 0
    @test isempty(r.seconds)
    # batches from a memory budget, and from a manager with a hard limit (halving on OOM)
    rm = Q.match(seq, p, KmmArray(sig); max_bytes = 8 * NTR * 50)
    @test rm.batches == cld(size(ph, 2), 50)
    @test Array(rm.index) == Array(r.index)
    small = KmmManager(backend = :host, alloc_mode = :direct, hard_limit = 100_000)
    rs = Q.match(seq, Array(p), KmmArray(sig; manager = small); batch_atoms = size(ph, 2), manager = small)
    @test rs.batches > 1
    @test Array(rs.index) == Array(r.index)
    close(small)
    # noisy signals still find nearby atoms; compressed matching agrees on noiseless ones
    rr = Q.match(d, KmmArray(sig); params = p, rank = 20)
    @test vec(Array(rr.index)) == pick
    @test all(isapprox.(Array(rr.PD), 2.5; rtol = 1e-4))  # PD on the norms the library used
    # pSSFP dictionaries match the same way
    sq = Q.PSSFPSequence(FLIPS; TR = 0.006, rf_shape = fill(0.25, 4), dt_ex = 0.0002, z = [0.0, 0.1],
                         gz_ex = 1.0, gz_pr = -2.0)
    dp = Q.simulate_pssfp(sq, p)
    rp = Q.match(sq, p, KmmArray(Array(dp)[:, pick]); batch_atoms = 33)
    @test vec(Array(rp.index)) == pick
end

@testset "compressed matching" begin
    # Two atoms (ntr = 3) at rank 2, the basis the dictionary's own or given: scores are the
    # true cosines (uncompressed norms), so the atom the signal is close to wins.
    d2 = KmmArray(ComplexF32[1 0; 0 1; 0.2 0.1])
    x = ComplexF32[0.02, 1.0, 0.12]
    nrm(a) = sqrt(sum(abs2, ComplexF64.(a)))
    want = abs(sum(conj.(ComplexF64[0, 1, 0.1]) .* x)) / (nrm([0, 1, 0.1]) * nrm(x))
    for r1 in (Q.match(d2, KmmArray(reshape(x, 3, 1)); rank = 2),
               Q.match(d2, KmmArray(reshape(x, 3, 1)); basis = Q.compression_basis(d2; rank = 2)))
        @test Array(r1.index) == [2]
        @test Array(r1.score)[1] ≈ want atol = 1e-5
    end
    # A realistic dictionary in batches: one basis from a sample, >= 99% of the noisy voxels
    # as uncompressed, scores within 1e-3, PD consistent with the uncompressed norms.
    seq = Q.FISPSequence(FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 16)
    p = Q.parameter_grid(T1 = (0.2, 4.0, 25), T2 = (0.02, 2.0, 25))
    D = Array(Q.simulate_fisp(seq, p))
    nat = size(D, 2)
    pick = [mod1(7919k, nat) for k in 1:200]
    noise = ComplexF32[ComplexF32(cos(0.7k), sin(1.3k)) for k in 1:NTR*length(pick)]
    sig = D[:, pick] .* ComplexF32(0.8) .+ 0.01f0 .* reshape(noise, NTR, :) .* (sum(abs, D) / length(D))
    full = Q.match(seq, p, KmmArray(sig); batch_atoms = 100)
    comp = Q.match(seq, p, KmmArray(sig); batch_atoms = 100, rank = 20, basis_atoms = 300, timings = true)
    @test comp.batches == full.batches > 1
    @test count(Array(comp.index) .== Array(full.index)) >= 0.99 * length(pick)
    @test maximum(abs.(Array(comp.score) .- Array(full.score))) < 1e-3
    same = Array(comp.index) .== Array(full.index)
    @test Array(comp.PD)[same] ≈ Array(full.PD)[same] rtol = 1e-3
    @test comp.seconds[:basis] >= 0
    # The same basis given explicitly gives the same result.
    u = Q.compression_basis(seq, p; rank = 20, atoms = 300)
    @test size(u) == (NTR, 20)
    U = ComplexF64.(Array(u))
    @test maximum(abs.(U' * U .- [i == j for i in 1:20, j in 1:20])) < 1e-5
    given = Q.match(seq, p, KmmArray(sig); batch_atoms = 100, basis = u)
    @test Array(given.index) == Array(comp.index)
    # Batches share one basis: sampled from every atom, the batched match equals the match of
    # the whole dictionary in that basis. At rank 4 the basis loses part of each atom, so
    # batches on bases of their own would score differently.
    whole = Q.match(KmmArray(D), KmmArray(sig); params = p, basis = Q.compression_basis(KmmArray(D); rank = 4))
    shared = Q.match(seq, p, KmmArray(sig); batch_atoms = 100, rank = 4, basis_atoms = nat)
    @test Array(shared.index) == Array(whole.index)
    @test Array(shared.score) ≈ Array(whole.score) rtol = 1e-6
    # Zero signals match nothing: index 0, score, PD and parameters 0.
    z = hcat(sig[:, 1:2], zeros(ComplexF32, NTR, 1))
    for rz in (Q.match(seq, p, KmmArray(z); batch_atoms = 100, rank = 20),
               Q.match(KmmArray(D), KmmArray(z); params = p))
        @test Array(rz.index)[3] == 0 && Array(rz.index)[1] == Array(full.index)[1]
        @test Array(rz.score)[3] == 0 && Array(rz.PD)[3] == 0 && Array(rz.T1)[3] == 0
    end
    # Bad bases: not orthonormal (the library's check), wrong shape, rank and basis disagree.
    err = try Q.match(seq, p, KmmArray(sig); basis = ones(ComplexF32, NTR, 3)); nothing catch e; e end
    @test err isa KmmError && occursin("orthonormal", err.message)
    @test_throws DimensionMismatch Q.match(seq, p, KmmArray(sig); basis = zeros(ComplexF32, NTR + 1, 3))
    @test_throws ArgumentError Q.match(seq, p, KmmArray(sig); basis = u, rank = 5)
    @test_throws ArgumentError Q.compression_basis(KmmArray(D); rank = 0)
    @test_throws ArgumentError Q.compression_basis(KmmArray(D); rank = NTR + 1)
end

@testset "calls free what they made, never the caller's arrays" begin
    # Device memory left to the next collection piles up over a loop of calls (or on a worker
    # serving many): after each call only its result is in use.
    m = KmmManager(backend = :host)
    seq = Q.FISPSequence(FLIPS; TR = 0.010, TE = 0.005, TI = 0.02, Ns = 8)
    p = Array(Q.parameter_grid(T1 = (0.2, 4.0, 12), T2 = (0.02, 2.0, 12)))
    sd = Q.simulate_fisp(seq, p[:, 1:9:end]; manager = m)
    sig = Array(sd)
    Kmm.unsafe_free!(sd)
    in_use() = Kmm.memory_stats(m).in_use
    maps(r) = filter(x -> x !== nothing, [r.index, r.score, r.PD, r.pd_normalized, r.T1, r.T2, r.B1, r.B0])
    bytes(r) = sum(sizeof, maps(r))
    @test in_use() == 0
    d = Q.simulate_fisp(seq, p; manager = m)             # host parameters: uploaded, then freed
    @test in_use() == sizeof(d)
    Kmm.unsafe_free!(d)
    u = Q.compression_basis(seq, p; rank = 6, manager = m)
    basis = Array(u)
    Kmm.unsafe_free!(u)
    for kw in ((rank = 0,), (rank = 6,), (basis = basis,))
        @test in_use() == 0
        r = Q.match(seq, p, sig; manager = m, batch_atoms = 20, kw...)
        @test in_use() == bytes(r)
        foreach(Kmm.unsafe_free!, maps(r))
    end
    # The caller's own KmmArrays on the manager are used in place and left alone.
    kp, ks, kd = KmmArray(p; manager = m), KmmArray(sig; manager = m), Q.simulate_fisp(seq, p; manager = m)
    held = sizeof(kp) + sizeof(ks) + sizeof(kd)
    r = Q.match(seq, kp, ks; manager = m, batch_atoms = 20)
    @test in_use() == held + bytes(r)
    r2 = Q.match(kd, ks; params = kp, rank = 6)
    @test in_use() == held + bytes(r) + bytes(r2)
    @test Array(kp) == p && Array(ks) == sig && Array(r2.index) == Array(r.index)
    # Calls that fail free what they made at once (collections are off meanwhile): bad shapes
    # before anything is uploaded, a basis the library turns away after.
    GC.enable(false)
    bad_basis = ones(ComplexF32, size(sig, 1), 3)
    blocks = Q.Dictionary(seq, p; manager = m)
    held = in_use()
    @test_throws DimensionMismatch Q.match(seq, p, sig[1:end-1, :]; manager = m)
    @test_throws DimensionMismatch Q.match(seq, p, sig; manager = m, basis = bad_basis[1:end-1, :])
    @test_throws KmmError Q.match(seq, p, sig; manager = m, basis = bad_basis, batch_atoms = 20)
    @test_throws KmmError Q.match(kd, sig; params = p, basis = bad_basis)
    @test_throws KmmError Q.match(Array(kd), ks; params = p, basis = bad_basis)
    @test_throws KmmError Q.match(blocks, sig; basis = bad_basis)
    @test in_use() == held
    GC.enable(true)
    close(m)
end

@testset "bad input" begin
    @test_throws ArgumentError Q.FISPSequence(FLIPS; phases = zeros(3), TR = 0.01)
    @test_throws ArgumentError Q.FISPSequence(FLIPS; TR = 0.01, Ns = 0)
    @test_throws ArgumentError Q.FISPSequence(FLIPS; TR = 0.01, Ns = 513)
    @test_throws ArgumentError Q.FISPSequence(FLIPS; TR = 0.01, TE = 0.02)
    @test_throws ArgumentError Q.FISPSequence(FLIPS; TR = -0.01)
    @test_throws ArgumentError Q.FISPSequence(Float64[]; TR = 0.01)
    @test_throws ArgumentError Q.FISPSequence([NaN]; TR = 0.01)
    @test_throws ArgumentError Q.FISPSequence(FLIPS; TR = 0.01, profile = ones(3, 2))
    @test_throws ArgumentError Q.PSSFPSequence(FLIPS; TR = 0.01, rf_shape = Float64[])
    @test_throws ArgumentError Q.PSSFPSequence(FLIPS; TR = 0.001, rf_shape = ones(10), dt_ex = 0.001)
    @test_throws ArgumentError Q.tissue_parameters(-1.0, 0.1)
    @test_throws ArgumentError Q.tissue_parameters(1.0, 0.0)
    @test_throws ArgumentError Q.tissue_parameters([1.0, 2.0], [0.1, 0.2, 0.3])
    @test_throws ArgumentError Q.parameter_grid(T1 = (0.0, 1.0, 5), T2 = 0.1)
    @test_throws ArgumentError Q.parameter_grid(T1 = 0.1, T2 = [0.5, 1.0])   # every T2 > T1
    seq = Q.FISPSequence(FLIPS; TR = 0.01, TE = 0.005, Ns = 8)
    # bad atoms already on the device: the library's check, with its message
    bad = KmmArray(Float32[1.0 1.0; 0.1 -0.1; 1 1; 0 0])
    err = try Q.simulate_fisp(seq, bad); nothing catch e; e end
    @test err isa KmmError && occursin("T2", err.message)
    @test_throws ArgumentError Q.simulate_fisp(seq, KmmArray{Float32}(undef, 4, 0))
    @test_throws ArgumentError Q.simulate_fisp(seq, KmmArray(ones(Float32, 3, 2)))
    @test_throws ArgumentError Q.match(seq, bad, KmmArray(zeros(ComplexF32, NTR, 2)))
    p = Q.tissue_parameters([1.0, 2.0], [0.1, 0.2])
    d = Q.simulate_fisp(seq, p)
    @test_throws DimensionMismatch Q.match(d, KmmArray(zeros(ComplexF32, NTR + 1, 2)))
    @test_throws DimensionMismatch Q.match(d, KmmArray(zeros(ComplexF32, NTR, 2)); params = Q.tissue_parameters(1.0, 0.1))
    @test_throws ArgumentError Q.match(KmmArray{ComplexF32}(undef, NTR, 0), KmmArray(zeros(ComplexF32, NTR, 2)))
    @test_throws ArgumentError Q.match(d, KmmArray(zeros(ComplexF32, NTR, 2)); rank = NTR + 1)
    @test_throws ArgumentError Q.match(seq, p, KmmArray(zeros(ComplexF32, NTR, 2)); batch_atoms = 0)
    # a view inside a buffer is copied (the ABI takes whole buffers)
    big = KmmArray(hcat(zeros(ComplexF32, NTR), Array(d)))
    r = Q.match(view(big, :, 2:3), KmmArray(Array(d)); params = p)
    @test Array(r.index) == [1, 2]
end

# the notebook's figures (examples/figures.jl, module MapFigures)
include(joinpath(ROOT, "examples", "figures.jl"))

@testset "map figures: SVG with colour bar, embedded palette PNG" begin
    F = MapFigures
    @test F.base64(Vector{UInt8}("Man")) == "TWFu"
    @test F.base64(Vector{UInt8}("Ma")) == "TWE="
    @test F.base64(Vector{UInt8}("M")) == "TQ=="
    @test F.crc32(Vector{UInt8}(codeunits("IEND"))) == 0xae426082
    # ranges hold every value of the notebook's phantom, CSF included, on the notebook's scales
    @test F.colour_range([350.0, 780, 1100, 4000, 3950, NaN], :log) == (300.0, 5000.0)
    @test F.colour_range([65.0, 80, 100, 2000, 2106], :log) == (50.0, 3000.0)
    @test F.colour_range([0.65, 0.8, 0.9, 1.0, 1.02], :linear; low = 0) == (0.0, 1.1)
    for scale in (:log, :linear), trial in 1:20
        v = exp.(4 .* rand(50)) .* rand()
        lo, hi = F.colour_range(v, scale)
        @test lo <= minimum(v) && maximum(v) <= hi
        t = F.ticks(lo, hi, scale)
        @test issorted(t) && all(x -> lo - 1e-9 * hi <= x <= hi * (1 + 1e-9), t) && length(t) >= 2
    end
    @test F.ticks(50.0, 3000.0, :log) == [50, 100, 200, 300, 500, 1000, 2000, 3000]
    @test [F.tick_label(t, 0.2) for t in F.ticks(0.0, 1.1, :linear)] == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]

    # the PNG: palette indices, each voxel s x s, NaN the last entry; zlib's inflate gets them back
    idx = F.map_indices([1.0 NaN; 10.0 100.0], 1.0, 100.0, :log, 2)
    @test idx == UInt8[0 0 255 255; 0 0 255 255; 127 127 254 254; 127 127 254 254]
    png = F.png_palette(idx, F.PALETTE)
    @test png[1:8] == UInt8[0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]
    @test png[13:16] == codeunits("IHDR") && png[17:24] == UInt8[0, 0, 0, 4, 0, 0, 0, 4]
    @test png[25:26] == UInt8[8, 3]                      # 8 bits, palette
    chunks = Dict{String,Vector{UInt8}}()
    at = 9
    while at < length(png)
        len = Int(png[at]) << 24 | Int(png[at+1]) << 16 | Int(png[at+2]) << 8 | Int(png[at+3])
        chunks[String(png[at+4:at+7])] = png[at+8:at+7+len]
        at += 12 + len
    end
    @test sort(collect(keys(chunks))) == ["IDAT", "IEND", "IHDR", "PLTE"]
    @test length(chunks["PLTE"]) == 3 * 256 && chunks["PLTE"][end-2:end] == [0xd9, 0xd9, 0xd9]
    raw = Vector{UInt8}(undef, 4 * 5)
    rawlen = Ref{Culong}(length(raw))
    @test ccall(F.libz(:uncompress), Cint, (Ptr{UInt8}, Ref{Culong}, Ptr{UInt8}, Culong),
                raw, rawlen, chunks["IDAT"], length(chunks["IDAT"])) == 0
    @test raw == vec(vcat(zeros(UInt8, 1, 4), permutedims(idx)))

    # the SVG: title, panels, colour bar label with the unit, ticks, table, caption, nothing clipped
    path = joinpath(mktempdir(), "sub", "T1.svg")
    truth = [NaN 4000.0; 350.0 1100.0]
    F.write_map_figure(path, [("true", truth), ("estimated", truth .* 1.02)];
                       title = "T1 map", quantity = "T1", unit = "ms", scale = :log,
                       caption = ["phantom & settings"], table = [["tissue", "true"], ["CSF", "4000"]])
    svg = read(path, String)
    @test startswith(svg, "<?xml") && occursin("<svg", svg) && endswith(svg, "</svg>\n")
    for s in (">T1 map<", ">true<", ">estimated<", ">T1 (ms)<", ">300<", ">5000<", ">CSF<",
              "phantom &amp; settings", "logarithmic colour scale", "data:image/png;base64,")
        @test occursin(s, svg) || (@warn "not in the SVG" s; false)
    end
    @test length(collect(eachmatch(r"<image ", svg))) == 2
    @test !occursin("drawn at the ends", svg)
    # a range given by hand that clips says so
    F.write_map_figure(path, [("m", truth)]; title = "T1", unit = "ms", range = (0, 2000))
    @test occursin("1 value(s) outside 0 to 2000 ms are drawn at the ends", read(path, String))
    @test_throws DimensionMismatch F.write_map_figure(path, [("a", ones(2, 2)), ("b", ones(3, 2))];
                                                     title = "x", unit = "u")
    @test_throws ArgumentError F.write_map_figure(path, [("a", ones(2, 2))]; title = "x", unit = "u",
                                                  scale = :sqrt)
end

@testset "notebooks: Pluto file format ($name)" for name in ("mrf_pipeline.jl", "mrstat_pipeline.jl")
    text = read(joinpath(ROOT, "examples", name), String)
    @test startswith(text, "### A Pluto.jl notebook ###\n")
    body, order = split(text, "# ╔═╡ Cell order:\n")
    cells = [m[1] for m in eachmatch(r"^# ╔═╡ ([0-9a-f-]{36})$"m, body)]
    listed = [m[1] for m in eachmatch(r"^# [╠╟]─?═?([0-9a-f-]{36})$"m, order)]
    @test length(cells) >= 10
    @test allunique(cells)
    @test sort(cells) == sort(listed)
end

@testset "MRF notebook end to end (tiny)" begin
    out = mktempdir()
    script = joinpath(ROOT, "examples", "mrf_pipeline.jl")
    env = copy(ENV)
    for (k, v) in ("KMM_MRF_N" => "12", "KMM_MRF_NTR" => "80", "KMM_MRF_NT1" => "10",
                   "KMM_MRF_NT2" => "10", "KMM_MRF_OUTPUT" => out)
        env[k] = v
    end
    cmd = setenv(`$(Base.julia_cmd()) --project=$ROOT $script`, env)
    text = read(pipeline(cmd; stderr = stdout), String)
    @test occursin("white matter", text)
    for (name, unit) in (("T1", "ms"), ("T2", "ms"), ("PD", "a.u."))
        p = joinpath(out, "$(name)_true_vs_estimated.svg")
        @test isfile(p)
        svg = isfile(p) ? read(p, String) : ""
        @test occursin("<svg", svg) && occursin(" ($unit)<", svg) && occursin("backend", svg)
        @test !occursin("drawn at the ends", svg)         # no tissue outside the colour scale
        @test filesize(p) < 100_000 || (@warn "figure too large" p filesize(p); false)
        @test occursin(p, text)
    end
end

@testset "MR-STAT operators" begin
    n = 5; nv = n * n; nr = 20; ns = 6; nc = 3; fov = 0.2; dk = 2pi / fov
    x = [((i - 1) % n - n / 2) * fov / n for i in 1:nv]; y = [((i - 1) ÷ n - n / 2) * fov / n for i in 1:nv]
    traj = Q.CartesianTrajectory([(-ns / 2 * dk, ((r - 1) % n - n / 2) * dk) for r in 1:nr], [(dk, 0.0) for r in 1:nr];
                                 nsamples = ns, dt = 5e-6)
    coils = ComplexF32[1 + 0.2 * c * v / nv + 0.1im * c for v in 1:nv, c in 1:nc]
    T1 = Float32[0.5 + 0.05 * (i % 7) for i in 1:nv]; T2 = Float32[0.05 + 0.01 * (i % 4) for i in 1:nv]
    p = vcat(T1', T2', ones(Float32, 1, nv), zeros(Float32, 1, nv))
    seq = Q.FISPSequence([deg2rad(10 + 40 * sin(pi * k / nr)^2) for k in 1:nr]; TR = 0.01, TE = 0.005, Ns = 8)
    m, d1, d2 = Q.magnetization(seq, p)
    @test Array(m) ≈ Array(Q.simulate_fisp(seq, p)) rtol = 1e-5
    # exact derivatives against central differences of the magnetization
    h = 1f-3
    fd(k) = (Array(Q.magnetization(seq, p .+ h .* ((1:4) .== k); derivatives = false)[1]) .-
             Array(Q.magnetization(seq, p .- h .* ((1:4) .== k); derivatives = false)[1])) ./ (2h)
    @test isapprox(Array(d1), fd(1); rtol = 1e-2)
    @test isapprox(Array(d2), fd(2); rtol = 1e-2)
    ρ = ComplexF32[0.8 + 0.1im * (i % 2) for i in 1:nv]
    model = Q.MRSTATModel(x, y, T2, zeros(nv), ρ, coils, traj)
    s = Q.signal(model, m)
    @test size(s) == (ns, nr, nc)
    J = Q.Jacobian(model, m, d1, d2)
    @test size(J) == (ns * nr * nc, 4nv) && size(J') == (4nv, ns * nr * nc)
    v = randn(Float32, 4, nv); w = randn(ComplexF32, ns, nr, nc)
    jv = Array(J * v); jw = Array(J' * w)
    lhs, rhs = sum(real.(conj.(ComplexF64.(jv)) .* w)), sum(Float64.(v) .* jw)
    @test abs(lhs - rhs) <= 1e-5 * max(abs(lhs), abs(rhs))          # the adjoint test
    out = KmmArray{ComplexF32}(undef, ns, nr, nc); g = KmmArray{Float32}(undef, 4, nv)
    @test Array(LinearAlgebra.mul!(out, J, KmmArray(v))) == jv
    @test Array(LinearAlgebra.mul!(g, J', KmmArray(w))) == jw
    # J v against central differences of the signal in the proton density (linear: exact)
    e = zeros(Float32, 4, nv); e[3, 4] = 1
    s2 = Array(Q.signal(Q.MRSTATModel(x, y, T2, zeros(nv), ρ .+ (1:nv .== 4), coils, traj), m))
    @test Array(J * e) ≈ s2 .- Array(s) rtol = 1e-4
    r, r2 = Q.residual(model, m, s)
    @test r2 == 0 && all(iszero, Array(r))
    @test Q.residual(model, m, zeros(ComplexF32, ns, nr, nc))[2] ≈ sum(abs2, ComplexF64.(Array(s))) rtol = 1e-5
    # bad input
    @test_throws DimensionMismatch Q.MRSTATModel(x, y[1:end-1], T2, zeros(nv), ρ, coils, traj)
    @test_throws DimensionMismatch Q.Jacobian(model, KmmArray{ComplexF32}(undef, nr + 1, nv), d1, d2)
    @test_throws DimensionMismatch J * randn(Float32, 3, nv)
    @test_throws ArgumentError Q.CartesianTrajectory([(0.0, 0.0)], [(1.0, 0.0)]; nsamples = 4, dt = 0)
    @test_throws ArgumentError Q.MRSTATModel(x, y, -T2, zeros(nv), ρ, coils, traj)
    # a model made field by field is checked by the library at the call
    rec = Array(model.voxels)
    rec[3, :] .= -T2
    bad = Q.MRSTATModel(model.nvoxels, model.nreadouts, model.nsamples, model.ncoils, KmmArray(rec; manager = Kmm.manager(model)),
                        model.coils, model.kspace, model.trajectory)
    err = try Q.signal(bad, m); nothing catch ex; ex end
    @test err isa KmmError && occursin("t2", err.message)
end

@testset "MR-STAT notebook end to end (tiny): T1 and T2 of every tissue within 5%" begin
    out = mktempdir()
    script = joinpath(ROOT, "examples", "mrstat_pipeline.jl")
    env = copy(ENV)
    for (k, v) in ("KMM_MRSTAT_N" => "10", "KMM_MRSTAT_OUTPUT" => out)
        env[k] = v
    end
    cmd = setenv(`$(Base.julia_cmd()) --project=$ROOT $script`, env)
    text = read(pipeline(cmd; stderr = stdout), String)
    table = isfile(joinpath(out, "mrstat_errors.txt")) ? read(joinpath(out, "mrstat_errors.txt"), String) : ""
    for name in ("white matter", "grey matter", "fat")
        line = filter(l -> startswith(l, name), split(table, '\n'))
        @test length(line) == 1
        errs = [parse(Float64, e[1]) for e in eachmatch(r"(-?[0-9.]+)%", isempty(line) ? "" : line[1])]
        @test length(errs) == 3 && abs(errs[1]) < 5 && abs(errs[2]) < 5
    end
    for name in ("T1", "T2", "PD")
        @test isfile(joinpath(out, "mrstat_$(name)_true_vs_estimated.svg"))
    end
end


@testset "fields changed after construction are checked before each call" begin
    # The sequences' vectors may be resized in place: each call checks them again (the library
    # reads length(flip_angles) entries of the others). An MR-STAT model made field by field
    # has its arrays checked against its counts.
    m = KmmManager(backend = :host)
    params = Q.parameter_grid(T1 = (0.5, 2.0, 2), T2 = (0.05, 0.2, 2), manager = m)
    ps = Q.PSSFPSequence(fill(0.3, 10); TR = 0.01)
    push!(ps.flip_angles, 0.3f0)
    err = try Q.simulate_pssfp(ps, params); nothing catch e; e end
    @test err isa ArgumentError && occursin("phases has length 10", sprint(showerror, err))
    empty!(ps.flip_angles); empty!(ps.phases)
    @test_throws ArgumentError Q.simulate_pssfp(ps, params)
    seq = Q.FISPSequence(fill(0.3, 4); TR = 0.01, Ns = 8)
    push!(seq.phases, 0f0)
    err = try Q.magnetization(seq, params); nothing catch e; e end
    @test err isa ArgumentError && occursin("phases has length 5", sprint(showerror, err))
    traj = Q.CartesianTrajectory(ComplexF32[complex(-100f0, 10f0 * r) for r in 1:4],
                                 fill(ComplexF32(10, 0), 4); nsamples = 6, dt = 5e-6)
    model = Q.MRSTATModel([0.0, 0.01], zeros(2), fill(0.08, 2), zeros(2), ComplexF32.(ones(2)),
                          ones(ComplexF32, 2, 1), traj; manager = m)
    mg = KmmArray(zeros(ComplexF32, 4, 2); manager = m)
    @test size(Q.signal(model, mg)) == (6, 4, 1)
    # 8 readouts claimed, a k-space of 4
    bad = Q.MRSTATModel(2, 8, 6, 1, model.voxels, model.coils, model.kspace, traj)
    err = try Q.signal(bad, KmmArray(zeros(ComplexF32, 8, 2); manager = m)); nothing catch e; e end
    @test err isa DimensionMismatch && occursin("kspace", sprint(showerror, err))
    shifted = Q.MRSTATModel(1, 4, 6, 1, view(model.voxels, :, 2:2), view(model.coils, 2:2, :), model.kspace, traj)
    @test_throws ArgumentError Q.signal(shifted, KmmArray(zeros(ComplexF32, 4, 1); manager = m))
    close(m)
end
