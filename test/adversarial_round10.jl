# Adversarial round 10: failing tests for defects found from the documentation and the public
# API (host backend). Each @testset failed on the code as it was found.

using Test, Kmm

# A request larger than the hard limit on its own can never fit: libkmm spilled every array to
# the host for it (and left them there), and the error reported the last of Julia's retries
# ("0 B spilled now") instead of the call that climbed the ladder.
@testset "a request past the hard limit spills nothing and says why" begin
    m = KmmManager(backend = :host, hard_limit = 1 << 20, chunk_size = 1 << 16, spill_limit = 4 << 20)
    xs = [KmmArray(fill(UInt8(i), 60_000); manager = m) for i in 1:15]
    err = try
        KmmArray{UInt8}(undef, 2 << 20; manager = m)
        nothing
    catch e
        e
    end
    @test err isa KmmOutOfMemoryError
    msg = sprint(showerror, err)
    @test occursin("the request alone is larger than the hard limit", msg)
    @test occursin("in Julia: GC.gc(false), GC.gc(true) and trim!", msg)
    @test count(Kmm.is_spilled, xs) == 0
    @test Kmm.memory_stats(m).spilled_buffers == 0
    @test all(Array(x) == fill(UInt8(i), 60_000) for (i, x) in enumerate(xs))
    close(m)
end

# check_range built its BoundsError as Int128(offs):Int128(offs) + n - 1, which throws an
# InexactError for an unsigned 128-bit n and a negative offset.
@testset "an out-of-range copy is a BoundsError for counts of every integer type" begin
    m = KmmManager(backend = :host)
    x = KmmArray(collect(1:4); manager = m)
    a = collect(1:4)
    p = PinnedArray(a; manager = m)
    for n in (UInt128(2), Int128(2), UInt64(2), big(2), typemax(UInt128))
        @test_throws BoundsError copyto!(x, -1, a, 1, n)
        @test_throws BoundsError copyto!(a, 1, x, -1, n)
        @test_throws BoundsError copyto!(p, -1, x, 1, n)
    end
    @test Array(x) == 1:4 && a == 1:4 && p == 1:4
    close(m)
end

# Scalar access of a KmmArray{Nothing} recursed without end (StackOverflowError).
@testset "scalar access of an element type of no bytes" begin
    m = KmmManager(backend = :host)
    x = KmmArray{Nothing}(undef, 3; manager = m)
    Kmm.@allowscalar begin
        @test x[2] === nothing
        x[2] = nothing
        @test x[3] === nothing
    end
    Kmm.unsafe_free!(x)
    @test_throws KmmError Kmm.@allowscalar x[1]
    close(m)
end

# Dimensions whose product overflows Int were accepted for elements of no bytes: `length`
# wrapped to 0.
@testset "dimensions whose product overflows are refused for every element size" begin
    m = KmmManager(backend = :host)
    @test_throws ArgumentError KmmArray{Nothing}(undef, 2^62, 4; manager = m)
    @test_throws ArgumentError PinnedArray{Nothing}(undef, 2^62, 4; manager = m)
    @test length(KmmArray{Nothing}(undef, 2^62, 1; manager = m)) == 2^62
    close(m)
end

# `show` of a KmmCopyTask read only its event field: "pending" for a copy that had run.
@testset "a copy task shows done once its copy ran" begin
    m = KmmManager(backend = :host)
    x = KmmArray{Int}(undef, 8; manager = m)
    t = copyto_async!(x, collect(1:8))
    while !Kmm.isdone(t)
        yield()
    end
    @test sprint(show, t) == "KmmCopyTask(done)"
    wait(t)
    @test sprint(show, t) == "KmmCopyTask(done)"
    close(m)
end

# A KmmArray{T}(a) (or PinnedArray(a)) whose conversion failed kept its new buffer allocated
# until a collection: a refused call changed the manager's figures.
struct FailsAtThree <: AbstractVector{Int} end
Base.size(::FailsAtThree) = (4,)
Base.getindex(::FailsAtThree, i::Int) = i == 3 ? throw(InexactError(:getindex, Int, 3.5)) : i

@testset "a constructor whose conversion fails allocates nothing" begin
    m = KmmManager(backend = :host)
    for kind in (:device, :pinned)
        @test_throws InexactError KmmArray{Int}(fill(1.5, 100_000); manager = m)
        @test_throws InexactError KmmArray(FailsAtThree(); manager = m)
        @test_throws InexactError PinnedArray(FailsAtThree(); manager = m)
        s = Kmm.memory_stats(m, kind)
        @test s.live_buffers == 0 && s.in_use == 0
    end
    close(m)
end

# repr of a view or reshape of a freed PinnedArray threw a KmmError (the array itself shows
# "(freed)").
@testset "views and reshapes of a freed pinned array show as freed" begin
    m = KmmManager(backend = :host)
    p = PinnedArray(collect(1:4); manager = m)
    v, r = view(p, 1:2), reshape(p, 2, 2)
    @test occursin("[1, 2]", repr(v))
    @test occursin("1  3", repr(MIME"text/plain"(), r))
    Kmm.unsafe_free!(p)
    for y in (v, r)
        @test occursin("(freed)", repr(y))
        @test occursin("(freed)", repr(MIME"text/plain"(), y))
    end
    close(m)
end
