# An independent review of session 14's changes (2026-11-28): its reproducers. Needs two threads:
# runtests.jl runs it in a child process (JULIA_NUM_THREADS=2). Testset 1 failed on the reviewed
# code (a store landed in freed, reused pinned memory); the others guarded it and passed.
using Test, Kmm

@testset "review s14" begin
m = KmmManager(backend = :host)

# 1. setindex!: hostptr(p) is read (handle checked) before convert(T, v) runs; a convert that
#    reaches a safepoint lets unsafe_free!'s collection pass, and the store then lands in freed
#    (and reused) pinned memory.
struct SlowVal end
Base.convert(::Type{Float64}, ::SlowVal) = (t = time(); while time() - t < 0.5; GC.safepoint(); end; 42.0)
@testset "setindex! with a converting value vs unsafe_free!" begin
    @test Threads.nthreads() > 1
    p = PinnedArray{Float64,1}(undef, (1024,); manager = m)
    fill!(p, 0.0)
    t = Threads.@spawn (try p[1] = SlowVal(); :stored catch e; e end)
    sleep(0.1)
    Kmm.unsafe_free!(p)               # quiesce: GC.gc(false) passes while t sits in convert
    q = PinnedArray{Float64,1}(undef, (1024,); manager = m)   # same pool block
    fill!(q, 0.0)
    r = fetch(t)
    @test r isa KmmError              # freed: it throws (the store landed in q)
    @test q[1] == 0.0
end

# 1b. The same with a convert that merely allocates (parses a string): the store lands after
#     the free, in the next array of the pool (sentinel -1.0 overwritten).
struct Textual; s::String; end
Base.convert(::Type{Float64}, x::Textual) = parse(Float64, string(x.s, "0"))
@testset "setindex! with an allocating convert vs unsafe_free!" begin
    hits = 0
    for trial in 1:200
        p = PinnedArray{Float64,1}(undef, (1024,); manager = m)
        fill!(p, 0.0)
        go = Threads.Atomic{Bool}(false)
        t = Threads.@spawn begin
            v = Textual("2.5")
            try
                while true; p[1] = v; go[] = true; end
            catch e
            end
        end
        while !go[]; yield(); end
        Kmm.unsafe_free!(p)
        q = PinnedArray{Float64,1}(undef, (1024,); manager = m)
        q[1] = -1.0
        wait(t)
        q[1] != -1.0 && (hits += 1)
        Kmm.unsafe_free!(q)
    end
    @test hits == 0
end

# 2. unsafe_free! / close from a finalizer with more than one thread: GC.gc inside a finalizer
@testset "unsafe_free! from a finalizer" begin
    mutable struct Holder; p::PinnedArray{Float64,1}; end
    err = Ref{Any}(nothing)
    let h = Holder(PinnedArray{Float64,1}(undef, (16,); manager = m))
        finalizer(h) do x
            try Kmm.unsafe_free!(x.p) catch e; err[] = e end
        end
    end
    GC.gc(); GC.gc()
    @test err[] === nothing
end
@testset "close from a finalizer" begin
    mutable struct MHolder; m::KmmManager; end
    err = Ref{Any}(nothing)
    let h = MHolder(KmmManager(backend = :host))
        finalizer(h) do x
            try close(x.m) catch e; err[] = e end
        end
    end
    GC.gc(); GC.gc()
    @test err[] === nothing
end

# 3. copyto! 5-arg: ambiguities and results
@testset "5-arg copyto!" begin
    p = PinnedArray{Int,1}(undef, (8,); manager = m); fill!(p, 0)
    a = collect(1:8)
    copyto!(p, UInt(2), a, UInt(3), UInt(4)); @test p[2:5] == [3,4,5,6]
    @test_throws BoundsError copyto!(p, 2, a, 1, typemax(UInt))
    @test_throws BoundsError copyto!(p, typemax(Int), a, 1, 2)
    @test copyto!(p, 100, a, 100, 0) === p          # Base: n = 0 copies nothing, checks nothing
    @test_throws ArgumentError copyto!(p, 1, a, 1, -1)
    x = Kmm.KmmArray(collect(1.0:8.0); manager = m)
    pf = PinnedArray{Float64,1}(undef, (8,); manager = m)
    copyto!(pf, 1, x, 1, 8); @test pf == collect(1.0:8.0)
    copyto!(p, 1, x, 1, 8); @test p == collect(1:8)        # other element type
    copyto!(x, 1, p, 1, 8); @test Array(x) == collect(1.0:8.0)
    q = PinnedArray{Int,1}(undef, (8,); manager = m); fill!(q, 7)
    copyto!(p, 1, q, 1, 8); @test p == fill(7, 8)
    copyto!(p, 2, p, 1, 7); @test p == fill(7, 8)
    v = view(a, 1:8)
    copyto!(p, 1, v, 1, 8); @test p == collect(1:8)
    copyto!(p, 1, big.(a), 1, 8); @test p == collect(1:8)
    copyto!(p, 1, a, 1, big(8)); @test p == collect(1:8)
    amb = Test.detect_ambiguities(Kmm; imported = true, recursive = true)
    amb = filter(t -> any(mm -> mm.name === :copyto!, t), amb)
    @test isempty(amb)
end

# 4. views with UInt / BigInt ranges
@testset "views" begin
    x = Kmm.KmmArray(collect(1.0:12.0); manager = m)
    @test Array(view(x, UInt(2):UInt(5))) == [2.0,3,4,5]
    @test Array(view(x, big(2):big(5))) == [2.0,3,4,5]
    X = Kmm.KmmArray(reshape(collect(1.0:12.0), 3, 4); manager = m)
    @test Array(view(X, :, UInt(2):UInt(3))) == reshape(collect(4.0:9.0), 3, 2)
    @test Array(view(X, :, big(2):big(3))) == reshape(collect(4.0:9.0), 3, 2)
    @test Array(view(X, UInt(1):UInt(3), big(2))) == [4.0,5,6]
    @test Array(view(X, Base.OneTo(UInt(3)), 2)) == [4.0,5,6]
    @test size(view(X, :, UInt(3):UInt(2))) == (3, 0)
end
@test Kmm.GC_INTERVAL_BYTES[] == 2^30
end
