# Adversarial round 13 (Julia, host backend). Each test failed on the code before its fix.

# copyto!(dest, doffs, src, soffs, n) with offsets of a small integer type: the converting paths
# summed `soffs:soffs+n-1` in the arguments' type, which wraps (UInt8(250) + UInt8(10) - 1 is
# 3), and refused valid copies with a BoundsError about an internal array of no elements.
@testset "copyto! with offsets of small integer types" begin
    m = KmmManager(backend = :host)
    src = KmmArray(collect(1:300); manager = m)
    want = collect(250:259)
    @test copyto!(zeros(10), 1, src, UInt8(250), UInt8(10)) == want
    @test Array(copyto!(KmmArray{Float64}(undef, 10; manager = m), 1, src, UInt8(250), UInt8(10))) == want
    @test Array(copyto!(KmmArray{Int}(undef, 10; manager = m), 1, 1:300, UInt8(250), UInt8(10))) == want
    p = PinnedArray{Float64}(undef, 10; manager = m)
    @test collect(copyto!(p, 1, src, UInt8(250), UInt8(10))) == want
    @test copyto!(zeros(100), 1, src, Int8(100), Int8(100)) == collect(100:199)
    # Still checked first: a range past the source is a BoundsError naming it.
    @test_throws BoundsError copyto!(zeros(10), 1, src, UInt16(295), UInt8(10))
    close(m)
end

# Base's reductions, hash and broadcasts read no element of an array of none, so a freed one
# passed them (sum gave 0.0), while iterate and map threw; Base's copies of a freed pinned array
# of no elements behind a wrapper passed, those of a KmmArray threw.
@testset "freed arrays of no elements: reductions, hash, broadcasts, wrappers" begin
    m = KmmManager(backend = :host)
    for make in (() -> KmmArray(Float64[]; manager = m), () -> PinnedArray(Float64[]; manager = m))
        a = make()
        @test sum(a) == 0.0 && prod(a) == 1.0 && (a .+ 1) == Float64[]   # live: Base's results
        hash(a)
        Kmm.unsafe_free!(a)
        for f in (() -> sum(a), () -> prod(a), () -> mapreduce(abs, +, a; init = 0.0), () -> hash(a),
                  () -> a .+ 1, () -> a .> 0, () -> reduce(+, a))
            @test_throws KmmError f()
        end
    end
    for make in (() -> KmmArray(zeros(0, 3); manager = m), () -> PinnedArray(zeros(0, 3); manager = m))
        a = make()
        @test size(Array(transpose(a))) == (3, 0)
        Kmm.unsafe_free!(a)
        @test_throws KmmError Array(transpose(a))
        @test_throws KmmError collect(view(a, :, 1:2))
        @test_throws KmmError Matrix(a')
        # Found by the review of these fixes: behind a wrapper, reductions, hash, broadcasts,
        # `any` and `==` passed (sum(transpose(a)) gave 0.0).
        for f in (() -> sum(transpose(a)), () -> sum(view(a, :, 1:2)), () -> hash(a'), () -> a' .+ 1,
                  () -> any(x -> x > 0, a'), () -> a' == zeros(3, 0), () -> mapreduce(abs, +, reshape(a, 3, 0); init = 0.0))
            @test_throws KmmError f()
        end
    end
    # Live arrays and their wrappers: Base's results, unchanged.
    p = PinnedArray([1.0, 2.0, 3.0]; manager = m)
    @test sum(p) == 6 && sum(view(p, 1:2)) == 3 && hash(p') == hash([1.0, 2.0, 3.0]') && (p' .+ 1) == [2.0 3.0 4.0]
    @test any(x -> x > 2, view(p, :)) && transpose(p) == [1.0 2.0 3.0]
    close(m)
end
