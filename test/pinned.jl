# PinnedArray and asynchronous copies.

@testset "PinnedArray" begin
    m = KmmManager(backend = :host)
    p = PinnedArray{Float32}(undef, 4, 5; manager = m)
    @test p isa PinnedArray{Float32,2} && p isa DenseArray
    @test memory_status(m).pinned.in_use == 80
    p .= reshape(1:20, 4, 5)                               # the CPU writes it directly
    @test p[2, 3] == 10
    @test sum(p) == 210
    GC.@preserve p begin
        a = unsafe_wrap(Array, pointer(p), size(p))
        @test a == reshape(1:20, 4, 5)
    end
    x = KmmArray{Float32}(undef, 4, 5; manager = m)
    copyto!(x, p)                                          # a fast copy source
    @test Array(x) == reshape(1:20, 4, 5)
    q = similar(p)
    @test q isa PinnedArray{Float32,2}
    copyto!(q, x)
    @test q == p
    @test PinnedArray([1, 2, 3]; manager = m) == [1, 2, 3]
    r = PinnedArray{Int}(undef, 3; manager = m)
    copyto!(r, [4, 5, 6])
    @test r == [4, 5, 6]
    @test Array(KmmArray(r; manager = m)) == [4, 5, 6]          # straight from pinned memory
    Kmm.unsafe_free!(p)
    @test Kmm.isfreed(p)
    @test_throws KmmError p[1]
    @test_throws KmmError pointer(p)
    @test occursin("freed", sprint(show, MIME"text/plain"(), p))
    close(m)
    @test_throws KmmError q[1]                             # the manager's close freed it
end

@testset "asynchronous copies" begin
    m = KmmManager(backend = :host)
    a = rand(Float64, 1000)
    x = KmmArray{Float64}(undef, 1000; manager = m)
    t = copyto_async!(x, a)
    @test t isa KmmCopyTask
    wait(t)
    @test Kmm.isdone(t)
    wait(t)                                                # twice is fine
    @test Array(x) == a
    b = zeros(1000)
    t = copyto_async!(b, x)
    wait(t)
    @test b == a
    # from and to pinned memory
    p = PinnedArray(a; manager = m)
    y = KmmArray{Float64}(undef, 1000; manager = m)
    wait(copyto_async!(y, p))
    q = PinnedArray{Float64}(undef, 1000; manager = m)
    wait(copyto_async!(q, y))
    @test q == a
    # a dropped task keeps the host array alive until the copy ran
    for i in 1:50
        copyto_async!(x, fill(Float64(i), 1000))
    end
    GC.gc(true)
    @test length(m.pending) <= 50
    Kmm.synchronize(m)
    @test isempty(m.pending)
    @test all(==(50.0), Array(x))
    @test_throws DimensionMismatch copyto_async!(x, zeros(3))
    @test isempty(m.pending)
    close(m)
end

@testset "fetch(::KmmCopyTask) waits and returns the destination" begin
    m = KmmManager(backend = :host)
    a = rand(Float64, 2^20)
    x = KmmArray{Float64}(undef, length(a); manager = m)
    fill!(x, 1.0)                                          # queued ahead of the copy
    t = copyto_async!(x, a)
    @test fetch(t) === x                                   # host to device: the KmmArray
    @test Kmm.isdone(t) && isempty(m.pending)
    @test Array(x) == a
    @test fetch(t) === x                                   # again, once done
    b = zeros(length(a))
    fill!(x, 2.0)
    t = copyto_async!(b, x)
    @test fetch(t) === b                                   # device to host: the host array
    @test Kmm.isdone(t) && all(==(2.0), b)                 # filled when fetch returns
    v = view(b, 1:1000)                                    # a contiguous view as destination
    @test fetch(copyto_async!(v, view(x, 1:1000))) == v
    q = PinnedArray{Float64}(undef, length(a); manager = m)
    @test fetch(copyto_async!(q, x)) === q && all(==(2.0), q)
    e = Float64[]                                          # an empty copy is done at once
    @test fetch(copyto_async!(e, KmmArray{Float64}(undef, 0; manager = m))) === e
    # A failed wait fails fetch the same way: a task whose event the manager does not know.
    t = copyto_async!(b, x)
    wait(t)
    t.event = typemax(UInt64)
    err = try wait(t); nothing catch e; e end
    @test err isa KmmError
    @test_throws KmmError fetch(t)
    t.event = 0
    close(m)
end
