# Spill to host on the host backend: arrays beyond the hard limit move to host memory and come
# back on their next use; never_spill! keeps one on the device; spill off runs out of memory.

const SPILL_N = 1 << 18                                  # Float32s: 1 MiB per array
m = KmmManager(backend = :host, hard_limit = 4 * 2^20, chunk_size = 2 * 2^20, spill_limit = 64 * 2^20)
xs = [KmmArray{Float32}(undef, SPILL_N; manager = m) for _ in 1:12]   # 12 MiB under a 4 MiB limit
for (i, x) in enumerate(xs)
    copyto!(x, fill(Float32(i), SPILL_N))
end
@test count(Kmm.is_spilled, xs) >= 8
st = Kmm.memory_stats(m)
@test st.spills >= 8 && st.reserved <= 4 * 2^20
@test st.in_use + st.spilled_bytes == 12 * 2^20
for i in (7, 1, 12, 3, 1, 9)                             # random order: each read restores
    @test Array(xs[i]) == fill(Float32(i), SPILL_N)
end
@test Kmm.memory_stats(m).restores >= 5
Kmm.never_spill!(xs[2])
@test !Kmm.is_spilled(xs[2])
for i in 3:12
    fill!(xs[i], Float32(-i))                             # uses on the device spill others
end
@test !Kmm.is_spilled(xs[2]) && Array(xs[2]) == fill(2f0, SPILL_N)
@test all(Array(xs[i]) == fill(Float32(-i), SPILL_N) for i in 3:12)
@test occursin("spill:", sprint(show, memory_status(m)))
foreach(Kmm.unsafe_free!, xs)
st = Kmm.memory_stats(m)
@test (st.in_use, st.spilled_bytes, st.live_buffers) == (0, 0, 0)
close(m)

# Spill off (the default): the same arrays run out of memory, and the error says spill is off.
m = KmmManager(backend = :host, hard_limit = 4 * 2^20, chunk_size = 2 * 2^20)
keep = KmmArray{Float32}[]
err = try
    for _ in 1:12
        push!(keep, KmmArray{Float32}(undef, SPILL_N; manager = m))
        copyto!(keep[end], zeros(Float32, SPILL_N))
    end
    nothing
catch e
    e
end
@test err isa KmmOutOfMemoryError
@test occursin("spill_limit is 0", sprint(showerror, err))
foreach(Kmm.unsafe_free!, keep)
close(m)

# MRF matching of a dictionary twice the hard limit (kept in blocks) runs through spill and
# gives the maps of the same matching where it fits.
let Q = Kmm.QMRI
    seq = Q.FISPSequence([0.2 + 0.6 * abs(sin(i / 30)) for i in 1:300]; TR = 0.010, TE = 0.004,
                         TI = 0.02, Ns = 12)
    params = Q.parameter_grid(T1 = (0.2, 3.0, 80), T2 = (0.02, 0.8, 50))
    n = size(params, 2)
    @test n * 300 * 8 >= 2 * 4 * 2^20                                       # twice the hard limit
    truth = Array(params)[:, 1:97:end]
    m_fits = KmmManager(backend = :host, chunk_size = 2 * 2^20)
    m_spill = KmmManager(backend = :host, chunk_size = 2 * 2^20, hard_limit = 4 * 2^20,
                         spill_limit = 64 * 2^20)
    results = map((m_fits, m_spill)) do m
        signals = Q.simulate_fisp(seq, truth; manager = m)
        d = Q.Dictionary(seq, params; manager = m, block_atoms = 250)           # blocks of 600 kB
        @test length(d.blocks) == cld(n, 250) && length(d) == n
        Q.match(d, signals), Q.match(d, signals)
    end
    (fits, _), (spilled1, spilled2) = results
    @test Array(spilled1.index) == Array(fits.index) == Array(spilled2.index)
    @test Array(fits.index) == collect(1:97:n)
    @test Array(spilled1.T1) ≈ Array(fits.T1)
    st = Kmm.memory_stats(m_spill)
    @test st.spills > 0 && st.restores > 0 && st.reserved <= 4 * 2^20
    @test Kmm.memory_stats(m_fits).spills == 0
    close(m_fits); close(m_spill)
end
