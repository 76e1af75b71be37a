# copyto! in every direction, with ranges, and between managers.

@testset "host <-> Kmm" begin
    a = rand(Float32, 10)
    x = KmmArray{Float32}(undef, 10)
    @test copyto!(x, a) === x
    @test Array(x) == a
    b = zeros(Float32, 10)
    @test copyto!(b, x) === b
    @test b == a
    # a longer destination takes a shorter source (as Base.copyto!)
    y = KmmArray(zeros(Float32, 12))
    copyto!(y, a)
    @test Array(y) == [a; 0; 0]
    c = zeros(Float32, 12)
    copyto!(c, x)
    @test c == [a; 0; 0]
    # eltype conversion on the way
    copyto!(x, collect(1:10))
    @test Array(x) == Float32.(1:10)
    d = zeros(Float64, 10)
    copyto!(d, x)
    @test d == 1:10
    # into non-dense host arrays
    m = zeros(Float32, 4, 10)
    copyto!(view(m, 2, :), x)
    @test m[2, :] == 1:10
end

@testset "ranges" begin
    a = collect(1.0:10.0)
    x = KmmArray(zeros(10))
    copyto!(x, 3, a, 5, 4)
    @test Array(x) == [0, 0, 5, 6, 7, 8, 0, 0, 0, 0]
    b = zeros(6)
    copyto!(b, 2, x, 3, 3)
    @test b == [0, 5, 6, 7, 0, 0]
    # contiguous host views are copied directly
    copyto!(x, view(a, 2:11 - 1))
    @test Array(x)[1:9] == 2:10
    h = zeros(10)
    copyto!(view(h, 3:5), view(x, 1:3))
    @test h[3:5] == [2, 3, 4]
    # Kmm -> Kmm with ranges, within and across arrays
    y = KmmArray(collect(1.0:10.0))
    z = KmmArray(zeros(10))
    copyto!(z, 4, y, 1, 3)
    @test Array(z) == [0, 0, 0, 1, 2, 3, 0, 0, 0, 0]
    copyto!(y, 3, y, 1, 5)                                  # overlapping, as memmove
    @test Array(y) == [1, 2, 1, 2, 3, 4, 5, 8, 9, 10]
    copyto!(y, 1, y, 1, 3)
    @test Array(y) == [1, 2, 1, 2, 3, 4, 5, 8, 9, 10]
    n0 = KmmArray{Float64}(undef, 0)
    @test copyto!(n0, Float64[]) === n0
    @test copyto!(x, 1, a, 1, 0) === x
end

@testset "Kmm <-> Kmm, same and different managers" begin
    m1 = KmmManager(backend = :host)
    m2 = KmmManager(backend = :host, suballocator = :heap)
    a = rand(ComplexF64, 50, 3)
    x = KmmArray(a; manager = m1)
    y = KmmArray{ComplexF64}(undef, 50, 3; manager = m2)
    copyto!(y, x)
    @test Array(y) == a
    z = KmmArray{ComplexF64}(undef, 150; manager = m1)
    copyto!(z, y)
    @test Array(z) == vec(a)
    w = KmmArray{ComplexF32}(undef, 50, 3; manager = m2)
    copyto!(w, x)                                           # with conversion
    @test Array(w) == ComplexF32.(a)
    # a chain of queued copies across managers reads back in order
    v = KmmArray{ComplexF64}(undef, 150; manager = m2)
    for i in 1:20
        fill!(z, i)
        copyto!(v, z)
    end
    @test all(==(20), Array(v))
    close(m1); close(m2)
end

@testset "wrong sizes" begin
    x = KmmArray{Float64}(undef, 4)
    @test_throws BoundsError copyto!(x, zeros(5))
    @test_throws BoundsError copyto!(zeros(3), x)
    @test_throws BoundsError copyto!(x, KmmArray(zeros(5)))
    @test_throws BoundsError copyto!(x, 3, zeros(10), 1, 3)
    @test_throws BoundsError copyto!(x, 0, zeros(10), 1, 2)
    @test_throws BoundsError copyto!(x, 1, zeros(10), 9, 3)
    @test_throws BoundsError copyto!(zeros(2), 1, x, 1, 3)
    @test_throws ArgumentError copyto!(x, 1, zeros(10), 1, -1)
end

@testset "copyto! with offsets: ranges checked first on every path; n = 0 copies nothing" begin
    # Every 5-argument copyto! checks both ranges before making a view or a sum of them (the
    # converting methods made view(src, soffs:soffs+n-1), whose sum wraps, and passed a
    # wrapping doffs to Base's generic copyto!, which writes @inbounds); n = 0 checks no offset,
    # as Base's, on every path.
    m = KmmManager(backend = :host)
    k = KmmArray(collect(1.0:4.0); manager = m)
    k32 = KmmArray(collect(1f0:4f0); manager = m)
    h, h32 = collect(1.0:4.0), collect(1f0:4f0)
    T, B = typemax(Int), typemin(Int)
    for (d, s) in ((k, k), (k, k32), (k, h), (h, k), (k, h32), (h32, k), (k, 1:4), (view(h, 1:2:3), k))
        for o in (T, B)
            @test copyto!(d, o, s, o, 0) === d
        end
    end
    for (d, s, bad) in ((k, k32, :src), (k, k32, :dest), (h32, k, :src), (h32, k, :dest),
                        (k, h32, :src), (k, h32, :dest), (k, 1:4, :src), (k, 1:4, :dest))
        err = try bad === :src ? copyto!(d, 1, s, T, 2) : copyto!(d, T, s, 1, 2); nothing catch e; e end
        @test err isa BoundsError && err.a === (bad === :src ? s : d)
    end
    @test Array(k) == 1:4 && h32 == 1:4
    Kmm.unsafe_free!(k32)
    @test_throws KmmError copyto!(k, T, k32, T, 0)     # a freed array is an error still
    @test_throws KmmError copyto!(h32, 1, k32, 1, 0)
    close(m)
end
