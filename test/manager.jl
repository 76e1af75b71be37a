# KmmManager: configuration, default managers, status, trim, stream, close.
using Kmm: LibKmm

@testset "keyword constructor mirrors the config" begin
    for sub in (:binned, :heap, :fixed, :ring)
        m = KmmManager(backend = :host, suballocator = sub, chunk_size = 4 * 2^20,
                       initial_pool_size = 2^20, fixed_block_size = 2^16, hard_limit = 64 * 2^20,
                       release_threshold = 0, alignment = 512)
        @test Kmm.backend(m) == :host
        x = KmmArray(collect(1.0:100.0); manager = m)
        @test Array(x) == collect(1.0:100.0)
        @test Kmm.info(m).suballocator == Kmm.SUBALLOCATORS[sub]
        close(m)
    end
    m = KmmManager(backend = :host, alloc_mode = :direct)
    @test Array(KmmArray([1, 2, 3]; manager = m)) == [1, 2, 3]
    close(m)
    @test_throws ArgumentError KmmManager(backend = :opencl)
    @test_throws ArgumentError KmmManager(suballocator = :buddy)
    @test_throws ArgumentError KmmManager(colour = :blue)
    @test_throws KmmError KmmManager(backend = :host, alignment = 3)   # not a power of two
    @test_throws Kmm.KmmError KmmManager(backend = :host, hard_limit = -1)   # names the keyword and the bound (safety.jl)
end

@testset "default manager" begin
    m = Kmm.default_manager()
    @test m === Kmm.default_manager(0)
    @test isopen(m)
    x = KmmArray{Float32}(undef, 10)
    @test Kmm.manager(x) === m
    @test Kmm.stream(m) isa UInt64
    @test Kmm.stream() == Kmm.stream(m)
    @test occursin("KmmManager(", sprint(show, m))
end

@testset "memory_status, stats, trim!, synchronize" begin
    m = KmmManager(backend = :host)
    st = memory_status(m)
    @test st.device.in_use == 0
    x = KmmArray{UInt8}(undef, 4096; manager = m)
    p = PinnedArray{UInt8}(undef, 100; manager = m)
    st = memory_status(m)
    @test st.device.in_use == 4096 && st.device.live_buffers == 1
    @test st.pinned.in_use == 100
    @test st.device.reserved >= 4096
    text = sprint(show, MIME"text/plain"(), st)
    for word in ("in use", "reserved", "peak", "largest free", "device", "pinned")
        @test occursin(word, text)
    end
    @test Kmm.memory_stats(m, :device).in_use == 4096
    @test_throws ArgumentError Kmm.memory_stats(m, :texture)
    Kmm.unsafe_free!(x)
    Kmm.synchronize(m)
    @test memory_status(m).device.in_use == 0
    @test memory_status(m).device.peak_in_use == 4096
    Kmm.reset_peaks!(m)
    @test memory_status(m).device.peak_in_use == 0
    trim!(m)
    @test memory_status(m).device.reserved == 0
    close(m)
end

@testset "close" begin
    m = KmmManager(backend = :host)
    x = KmmArray([1.0, 2.0]; manager = m)
    close(m)
    @test !isopen(m)
    close(m)                                    # twice is fine
    @test_throws KmmError memory_status(m)
    @test_throws KmmError KmmArray{Int}(undef, 3; manager = m)
    err = try Array(x) catch e e end
    @test err isa KmmError && occursin("manager has been closed", err.message)
    @test Kmm.isfreed(x)
    @test occursin("freed", sprint(show, MIME"text/plain"(), x))
    @test sprint(show, m) == "KmmManager(closed)"
end

@testset "ordering with another stream" begin
    a = KmmManager(backend = :host)
    b = KmmManager(backend = :host)
    x = KmmArray(collect(1:1000); manager = a)
    y = KmmArray{Int}(undef, 1000; manager = b)
    fill!(x, 7)                                       # queued on a's stream
    @test Kmm.signal_stream(a, Kmm.stream(b)) === a   # b's stream waits for a's fill
    copyto!(y, x)
    @test Kmm.wait_stream(a, Kmm.stream(b)) === a     # a's later work waits for b's copy
    fill!(x, 0)
    @test all(==(7), Array(y))
    @test all(==(0), Array(x))
    @test_throws KmmError Kmm.wait_stream(a, 0)       # not a stream
    close(a); close(b)
end
