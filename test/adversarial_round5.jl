# Round 5 of the adversarial tests (a tester working from the docs alone). Each testset failed
# before its fix.

# The threaded part: here when Julia has several threads, else in a child process with
# JULIA_NUM_THREADS=2 (as threads.jl does).
if Threads.nthreads() > 1
    include("adversarial_round5_threads.jl")
else
    include("in_child.jl")
    script = joinpath(@__DIR__, "adversarial_round5_threads.jl")
    test_in_child("using Test, Kmm; @testset \"round 5, threads\" begin include(\"$(escape_string(script))\") end"; threads = 2)
end

@testset "a copy whose spilled source cannot come back reports the source's bytes and manager" begin
    m1 = KmmManager(backend = :host, hard_limit = 2 * 2^20, chunk_size = 2 * 2^20, spill_limit = 64 * 2^20)
    m2 = KmmManager(backend = :host)
    src = KmmArray(fill(0x05, 2^20); manager = m1)
    hold = KmmArray(fill(0x07, 2^20 + 2^19); manager = m1)    # pushes src out
    Kmm.never_spill!(hold)
    @test Kmm.is_spilled(src)
    dest = KmmArray{UInt8}(undef, 1000; manager = m2)
    err = try copyto!(dest, 1, src, 1, 1000); nothing catch e; e end
    @test err isa KmmOutOfMemoryError
    if err isa KmmOutOfMemoryError
        @test err.bytes == 2^20                                            # the source's bytes
        @test err.status.device.reserved == Kmm.memory_stats(m1).reserved  # the source's manager
    end
    @test length(Array(dest)) == 1000
    Kmm.unsafe_free!(hold)
    @test Array(src) == fill(0x05, 2^20)                                   # nothing lost
    close(m1); close(m2)
end

@testset "limits below 2 MiB serve what fits; a missing device's error gives the valid range" begin
    m = KmmManager(backend = :host, hard_limit = 2^20, pinned_limit = 2^20)
    x = KmmArray(fill(3.0, 100); manager = m)
    p = PinnedArray(fill(2.0, 100); manager = m)
    @test Array(x) == fill(3.0, 100) && p == fill(2.0, 100)
    @test Kmm.memory_stats(m).reserved <= 2^20
    @test_throws KmmOutOfMemoryError KmmArray{UInt8}(undef, 2^21; manager = m)
    close(m)
    err = try KmmManager(backend = :host, device = Kmm.device_count(:host)); nothing catch e; e end
    @test err isa KmmError && occursin("numbered 0 to $(Kmm.device_count(:host) - 1)", sprint(showerror, err))
end
