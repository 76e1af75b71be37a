# Allocate + free of a 1 MiB KmmArray from Julia, two ways:
#   explicit:  KmmArray{UInt8}(undef, 2^20) then Kmm.unsafe_free!   (what a careful user writes)
#   finalizer: KmmArray{UInt8}(undef, 2^20) dropped, freed by the GC's finalizer (including the
#              cost of the collections Kmm.jl triggers every Kmm.GC_INTERVAL_BYTES[])
# and, for reference, the raw ccall pair (kmm_buffer_alloc + kmm_buffer_free) with no Julia
# object. Prints ns per allocate+free pair (median of several runs).
#
#     julia --project=. bench/julia_alloc.jl [pairs]      # KMM_BACKEND=host|cuda|auto
using Kmm
using Kmm: LibKmm
using Printf, Statistics

const BYTES = 2^20
const N = length(ARGS) >= 1 ? parse(Int, ARGS[1]) : 200_000
const RUNS = 7

function explicit_pairs(m, n)
    for _ in 1:n
        x = KmmArray{UInt8}(undef, BYTES; manager = m)
        Kmm.unsafe_free!(x)
    end
end

function finalizer_pairs(m, n)
    for _ in 1:n
        KmmArray{UInt8}(undef, BYTES; manager = m)
    end
    GC.gc(false)                 # count the collection that frees the last ones
end

function raw_pairs(m, n)
    h = m.handle
    out = Ref{UInt64}(0)
    for _ in 1:n
        LibKmm.unchecked_kmm_buffer_alloc(h, BYTES, LibKmm.KMM_MEMORY_DEVICE, out)
        LibKmm.unchecked_kmm_buffer_free(h, out[], 0)
    end
end

function measure(f, m, n)
    f(m, 1000)                   # compile and warm the pool
    GC.gc(true)
    times = Float64[]
    for _ in 1:RUNS
        t0 = time_ns()
        f(m, n)
        push!(times, (time_ns() - t0) / n)
        GC.gc(true)
        Kmm.synchronize(m)
    end
    median(times), minimum(times)
end

m = KmmManager()
@printf("Kmm.jl allocate+free of a 1 MiB KmmArray: libkmm %s, backend %s, Julia %s, %d pairs x %d runs\n",
        Kmm.version(), Kmm.backend(m), VERSION, N, RUNS)
for (name, f) in (("raw ccall pair (no Julia object)", raw_pairs),
                  ("KmmArray + unsafe_free! (explicit)", explicit_pairs),
                  ("KmmArray dropped, freed by finalizer", finalizer_pairs))
    med, best = measure(f, m, N)
    @printf("%-40s %8.0f ns per pair (median), %8.0f ns (best)\n", name, med, best)
end
st = memory_status(m)
@printf("after: in use %d B, reserved %d B, peak reserved %d B, live buffers %d\n",
        st.device.in_use, st.device.reserved, st.device.peak_reserved, st.device.live_buffers)
close(m)
