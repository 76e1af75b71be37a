# KmmArray: constructors and round trips of every eltype and shape.
using Random
using Random: AbstractRNG

struct Voxel
    t1::Float32
    t2::Float32
    pd::ComplexF32
    flag::Bool
    index::Int16
end
Base.rand(rng::AbstractRNG, ::Random.SamplerType{Voxel}) =
    Voxel(rand(rng, Float32), rand(rng, Float32), rand(rng, ComplexF32), rand(rng, Bool),
          rand(rng, Int16))

const ELTYPES = (Float32, Float64, ComplexF32, ComplexF64, Int8, Int16, Int32, Int64, UInt8,
                 Bool, Voxel)
const SHAPES = ((), (0,), (7,), (3, 0), (4, 5), (2, 3, 4), (2, 3, 2, 2), (1, 1, 1, 1))

@testset "round trip $T" for T in ELTYPES
    for dims in SHAPES
        a = rand(T, dims...)
        dims == () && (a = fill(rand(T)))
        x = KmmArray(a)
        @test x isa KmmArray{T,length(dims)}
        @test size(x) == size(a)
        @test length(x) == length(a)
        @test sizeof(x) == sizeof(a)
        @test eltype(x) == T
        @test ndims(x) == length(dims)
        b = Array(x)
        @test b == a && typeof(b) == typeof(a)
        @test collect(x) == a
        y = copy(x)
        @test y.storage !== x.storage && Array(y) == a
        s = similar(x)
        @test s isa KmmArray{T,length(dims)} && size(s) == size(a)
        s2 = similar(x, Float64, (2, 2))
        @test s2 isa KmmArray{Float64,2}
        fill!(y, isempty(a) ? rand(T) : first(a))
        isempty(a) || @test all(==(first(a)), Array(y))
    end
end

@testset "constructors" begin
    x = KmmArray{Float32}(undef, 3, 4)
    @test size(x) == (3, 4) && x isa KmmArray{Float32,2}
    @test size(KmmArray{Int,3}(undef, 1, 2, 3)) == (1, 2, 3)
    @test size(KmmArray{Int}(undef, (5, 6))) == (5, 6)
    @test size(KmmArray{Int,2}(undef, (5, 6))) == (5, 6)
    z = KmmArray{Float64}(undef)
    @test size(z) == () && length(z) == 1
    @test Array(KmmArray{Float32}([1, 2, 3])) == Float32[1, 2, 3]
    @test eltype(KmmArray{Float32}([1, 2, 3])) == Float32
    @test Array{Float64}(KmmArray(Int32[1, 2])) == [1.0, 2.0]
    @test Array(KmmArray(1:5)) == collect(1:5)                # ranges become arrays
    @test Array(KmmArray(view([1, 2, 3, 4], [1, 3]))) == [1, 3] # non-contiguous host views
    @test_throws ArgumentError KmmArray{String}(undef, 3)
    @test_throws ArgumentError KmmArray{Vector{Int}}(undef, 3)
    @test_throws ArgumentError KmmArray{Float32}(undef, -1)
    @test_throws ArgumentError KmmArray{Float32}(undef, 2, -3)
    @test_throws ArgumentError KmmArray{Float64}(undef, typemax(Int) ÷ 4, 4)
    @test_throws ArgumentError KmmArray{Float32}(undef, 3; kind = :texture)
    p = KmmArray([1.0, 2.0]; kind = :pinned)
    @test Kmm.kind(p) == :pinned && Array(p) == [1.0, 2.0]
    @test occursin("(pinned)", summary(p))
end

@testset "fill! and show" begin
    x = KmmArray{ComplexF32}(undef, 2, 3)
    fill!(x, 1 + 2im)
    @test Array(x) == fill(ComplexF32(1 + 2im), 2, 3)
    fill!(x, 0)
    @test all(iszero, Array(x))
    s = sprint(show, MIME"text/plain"(), KmmArray([1 2; 3 4]))
    @test occursin("2×2 KmmArray{Int64,2}", s) || occursin("2×2 KmmArray{Int64, 2}", s)
    @test occursin("3  4", s)
    @test sprint(show, KmmArray([1, 2])) == "[1, 2]"
    @test occursin("KmmArray", summary(KmmArray([1])))
end

@testset "a negative or overflowing size is an ArgumentError, and nothing is allocated" begin
    m = KmmManager(backend = :host)
    cases = ((() -> KmmArray{Float64}(undef, 2, -1; manager = m), "negative dimension"),
             (() -> KmmArray{Float64}(undef, 2^31, 2^31; manager = m), "the size overflows"),
             (() -> KmmArray{UInt8}(undef, typemax(Int), 2, 1; manager = m), "the size overflows"),
             (() -> PinnedArray{Int32}(undef, 2^62; manager = m), "the size overflows"),
             (() -> PinnedArray{Int32}(undef, -3; manager = m), "negative dimension"))
    for (f, why) in cases
        err = try f(); nothing catch e; e end
        @test err isa ArgumentError
        @test err !== nothing && occursin("invalid array dimensions", sprint(showerror, err)) &&
              occursin(why, sprint(showerror, err))
    end
    @test Kmm.memory_stats(m).live_buffers == 0 && Kmm.memory_stats(m, :pinned).live_buffers == 0
    @test_throws ArgumentError KmmArray{Float64}(undef, 4; manager = m, kind = :managed)
    @test size(KmmArray{Float64}(undef, 0, typemax(Int); manager = m)) == (0, typemax(Int))
    @test size(KmmArray{UInt8}(undef, typemax(Int), 2, 0; manager = m)) == (typemax(Int), 2, 0)
    close(m)
end
