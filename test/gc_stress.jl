# GC stress (trust suite): many threads create, view, reshape, copy and drop KmmArrays with
# forced collections in between, so finalizers run on any thread while owners allocate;
# managers are closed while their arrays are still reachable and while those arrays are being
# finalized. Everything must end with zero bytes in use and no finalizer failure.
# Needs several threads: runs in a child process with JULIA_NUM_THREADS=4 when Julia has one.
# KMM_GC_STRESS_ROUNDS scales it (default 200 rounds per task).

if Threads.nthreads() > 1
    @testset "GC stress on $(Threads.nthreads()) threads" begin
        rounds = parse(Int, get(ENV, "KMM_GC_STRESS_ROUNDS", "200"))
        before = Kmm.finalizer_failures()
        shared = KmmManager(backend = :host)
        errors = Threads.Atomic{Int}(0)
        ops = Threads.Atomic{Int}(0)
        closed_live = Threads.Atomic{Int}(0)
        tasks = map(1:16) do t
            Threads.@spawn begin
                try
                    own = KmmManager(backend = :host)
                    keep = Any[]
                    for i in 1:rounds
                        n = 1 + (t * 131 + i * 17) % 5000
                        a = rand(Float32, n)
                        x = KmmArray(a; manager = isodd(i) ? shared : own)
                        Array(x) == a || Threads.atomic_add!(errors, 1)
                        v = view(x, 1:cld(n, 2))
                        Array(v) == a[1:cld(n, 2)] || Threads.atomic_add!(errors, 1)
                        if n % 4 == 0
                            r = reshape(x, 4, n ÷ 4)
                            Array(r) == reshape(a, 4, n ÷ 4) || Threads.atomic_add!(errors, 1)
                        end
                        y = similar(x)
                        copyto!(y, x)
                        Array(y) == a || Threads.atomic_add!(errors, 1)
                        fill!(y, 1.5f0)
                        all(==(1.5f0), Array(y)) || Threads.atomic_add!(errors, 1)
                        i % 3 == 0 && push!(keep, v)             # a view keeps its buffer
                        i % 5 == 0 && Kmm.unsafe_free!(y)
                        length(keep) > 20 && empty!(keep)
                        i % 25 == 0 && GC.gc(false)              # finalizers on this thread
                        i % 97 == 0 && GC.gc(true)
                        if i % 60 == 0
                            # Close our manager while arrays of it are reachable (keep) and
                            # others are unreachable, finalized by the next collections.
                            junk = [KmmArray{Int8}(undef, 64; manager = own) for _ in 1:20]
                            junk = nothing
                            Threads.@spawn GC.gc(false)          # finalizers race the close
                            close(own)
                            Threads.atomic_add!(closed_live, 1)
                            own = KmmManager(backend = :host)
                        end
                        Threads.atomic_add!(ops, 1)
                    end
                    close(own)
                    keep = nothing
                catch err
                    Threads.atomic_add!(errors, 1)
                    @error "GC stress task failed" exception = (err, catch_backtrace())
                end
            end
        end
        foreach(wait, tasks)
        @test errors[] == 0
        for _ in 1:3
            GC.gc(true)
        end
        Kmm.synchronize(shared)
        st = memory_status(shared)
        @test st.device.in_use == 0
        @test st.device.live_buffers == 0
        @test st.pinned.in_use == 0
        @test Kmm.finalizer_failures() == before
        @info "GC stress" threads = Threads.nthreads() tasks = 16 arrays = ops[] closed_with_live_arrays = closed_live[]
        close(shared)
    end
else
    include("in_child.jl")
    test_in_child("using Test, Kmm; include(\"$(escape_string(@__FILE__))\")"; threads = 4)
end
