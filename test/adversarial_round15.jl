# Adversarial round 15: failing tests for defects found from the public API (host backend).
# Each @testset failed on the code as it was found.

using Test, Kmm

const IUR15 = Base.IdentityUnitRange

# A contiguous view with offset axes passed as dense host memory, but its copy offsets were
# counted from 1: `Array(KmmArray(V))` read the parent's first elements and `copyto!(V, k)`
# overwrote them. Offsets are Base's linear indices (from `firstindex`), as Base copies them.
@testset "copies through views with offset axes copy the view's own elements" begin
    m = KmmManager(backend = :host)
    k = KmmArray([10.0, 20.0, 30.0]; manager = m)
    # The same copy by Base into a plain copy of the parent, for comparison.
    base_copy(A, I, args...) = (B = copy(A); copyto!(view(B, I...), args...); B)

    A = collect(1.0:6.0); V = view(A, IUR15(4:6))
    @test firstindex(V) == 4
    @test Array(KmmArray(V; manager = m)) == [4.0, 5.0, 6.0]
    @test Array(KmmArray{Float32}(V; manager = m)) == Float32[4, 5, 6]
    @test PinnedArray(V; manager = m) == [4.0, 5.0, 6.0]
    copyto!(V, k)
    @test A == base_copy(collect(1.0:6.0), (IUR15(4:6),), [10.0, 20.0, 30.0]) == [1, 2, 3, 10, 20, 30]
    A = collect(1.0:6.0); V = view(A, IUR15(4:6))
    copyto!(V, 5, k, 2, 2)
    @test A == base_copy(collect(1.0:6.0), (IUR15(4:6),), 5, [10.0, 20.0, 30.0], 2, 2) == [1, 2, 3, 4, 20, 30]
    @test_throws BoundsError copyto!(V, 1, k, 1, 1)      # Base: 1 is not an index of V
    @test_throws BoundsError copyto!(V, 6, k, 1, 2)
    @test A == [1, 2, 3, 4, 20, 30]
    y = KmmArray(zeros(3); manager = m)
    copyto!(y, V)
    @test Array(y) == [4.0, 20.0, 30.0]
    copyto!(y, 1, V, 5, 2)
    @test Array(y) == [20.0, 30.0, 30.0]
    @test_throws BoundsError copyto!(y, 1, V, 1, 1)
    @test_throws BoundsError copyto!(y, 1, V, 5, 3)

    # N-D: a 1-D view down a column with an offset axis, and a matrix view (linear indices from 1)
    M = reshape(collect(1.0:25.0), 5, 5)
    X = view(M, IUR15(2:4), 3); W = view(M, :, IUR15(2:3))
    @test Array(KmmArray(X; manager = m)) == M[2:4, 3]
    @test Array(KmmArray(W; manager = m)) == M[:, 2:3]
    copyto!(X, k)
    @test M[2:4, 3] == [10, 20, 30] && M[1, 3] == 11 && M[5, 3] == 15
    copyto!(X, 3, k, 1, 2)
    @test M[:, 3] == [11, 10, 10, 20, 15]
    z = KmmArray(zeros(10); manager = m)
    copyto!(z, W)
    @test Array(z) == vec(M[:, 2:3])
    copyto!(W, 6, k, 1, 3)
    @test M[1:3, 3] == [10, 20, 30]

    # pinned memory on either side: one memory copy between the two host arrays
    p = PinnedArray(collect(1.0:6.0); manager = m)
    A = collect(1.0:6.0); V = view(A, IUR15(4:6))
    copyto!(V, 4, p, 2, 3)
    @test A == base_copy(collect(1.0:6.0), (IUR15(4:6),), 4, collect(1.0:6.0), 2, 3) == [1, 2, 3, 2, 3, 4]
    copyto!(p, 2, V, 5, 2)
    @test p == [1, 3, 4, 4, 5, 6]
    @test_throws BoundsError copyto!(p, 1, V, 1, 1)
    # a view of a PinnedArray with an offset axis, and of a reshaped range: not dense, through Base
    PV = view(p, IUR15(2:4))
    copyto!(z, 1, PV, 3, 2)
    @test Array(z)[1:2] == [4.0, 4.0]
    copyto!(z, 1, view(reshape(1.0:6.0, 2, 3), IUR15(4:6)), 5, 2)
    @test Array(z)[1:2] == [5.0, 6.0]
    copyto!(PV, k)
    @test p == [1, 10, 20, 30, 5, 6]
    copyto!(PV, 4, k, 1, 1)
    @test p == [1, 10, 20, 10, 5, 6]

    # asynchronous copies take the view's first element
    B = collect(1.0:6.0); t = copyto_async!(view(B, IUR15(4:6)), k); wait(t)
    @test B == [1, 2, 3, 10, 20, 30]
    t = copyto_async!(k, X); wait(t)
    @test Array(k) == M[2:4, 3]

    # A KmmArray's own view cannot have offset axes: refused, not indexed from 1.
    err = try view(k, IUR15(2:3)) catch e; e end
    @test err isa ArgumentError && occursin("offset axes", err.msg)
    @test_throws ArgumentError view(KmmArray(zeros(3, 3); manager = m), IUR15(2:3), 2)
    @test size(view(KmmArray(zeros(3, 3); manager = m), IUR15(1:3), 2)) == (3,)
    @test Array(view(k, 2:3)) == Array(k)[2:3]
    close(m)
end

# KmmArray(x::KmmArray; manager) allocated the copy, then the copy failed (x freed) and the
# allocation stayed live until a collection; an overlapping copy's temporary did too.
@testset "constructors from a KmmArray free their allocation when the copy fails" begin
    m = KmmManager(backend = :host)
    m2 = KmmManager(backend = :host)
    x = KmmArray(zeros(Float32, 1000); manager = m)
    Kmm.unsafe_free!(x)
    status(m) = (s = memory_status(m); (s.device.live_buffers, s.device.in_use, s.pinned.live_buffers))
    GC.enable(false)   # the figures before any collection
    try
        for f in (() -> KmmArray(x; manager = m2), () -> KmmArray(x),
                  () -> KmmArray{Float32}(x; manager = m2), () -> KmmArray{Float32,1}(x),
                  () -> KmmArray(x; manager = m2, kind = :pinned), () -> KmmArray{Float64}(x))
            @test_throws KmmError f()
            @test status(m) == (0, 0, 0)
            @test status(m2) == (0, 0, 0)
        end
        y = KmmArray(collect(1.0:10.0); manager = m2)
        copyto!(y, 3, y, 1, 5)    # overlapping: through a temporary, freed after
        @test Array(y) == [1, 2, 1, 2, 3, 4, 5, 8, 9, 10]
        @test status(m2)[1] == 1
    finally
        GC.enable(true)
    end
    close(m); close(m2)
end

# KmmArray{Float32}(x) of a KmmArray fell to the host-array constructor: the copy landed on the
# default manager (device 0), not x's. Two host stand-in devices: KMM_HOST_DEVICES is read once
# per process, so in a child process.
@testset "converting constructors of a KmmArray keep its manager" begin
    code = """
    using Test, Kmm
    @testset "converting constructors, 2 host devices" begin
        m1 = KmmManager(backend = :host, device = 1)
        m0 = KmmManager(backend = :host, device = 0)
        x = KmmArray(collect(1.0:4.0); manager = m1)
        for (f, T) in ((x -> KmmArray{Float32}(x), Float32), (x -> KmmArray{Float32,1}(x), Float32),
                       (x -> KmmArray{Float64}(x), Float64), (x -> KmmArray{Int}(x), Int),
                       (x -> convert(KmmArray{Float32}, x), Float32),
                       (x -> convert(KmmArray{Float32,1}, x), Float32))
            y = f(x)
            @test Kmm.manager(y) === m1 && Kmm.device(y) == 1
            @test y isa KmmArray{T,1} && Array(y) == T[1, 2, 3, 4] && Kmm.kind(y) == :device
        end
        @test convert(KmmArray{Float64,1}, x) === x && convert(KmmArray, x) === x
        y = KmmArray{Float32}(x; kind = :pinned)
        @test Kmm.manager(y) === m1 && Kmm.kind(y) == :pinned && Array(y) == Float32[1, 2, 3, 4]
        y = KmmArray{Float32,1}(x; manager = m0)
        @test Kmm.manager(y) === m0 && Kmm.device(y) == 0 && Array(y) == Float32[1, 2, 3, 4]
        # a conversion that fails allocates nothing (figures before any collection)
        GC.enable(false)
        before = memory_status(m1).device.live_buffers
        src = KmmArray([1.5]; manager = m1)
        @test_throws InexactError KmmArray{Int}(src)
        @test memory_status(m1).device.live_buffers == before + 1   # the source alone
        GC.enable(true)
    end
    """
    env = merge(Dict(ENV), Dict("KMM_HOST_DEVICES" => "2", "KMM_BACKEND" => "host"))
    cmd = setenv(`$(Base.julia_cmd()) --project=$(Base.active_project()) --startup-file=no -e $code`, env)
    @test success(pipeline(cmd, stdout = stdout, stderr = stderr))
end

# similar(x, dims...) without an element type converted the dimensions with Int(d): an
# InexactError past Int, where similar(x, T, dims...) gives the ArgumentError naming them.
@testset "similar without an element type checks dimensions past Int" begin
    m = KmmManager(backend = :host)
    x = KmmArray([1.0, 2.0]; manager = m)
    p = PinnedArray([1.0, 2.0]; manager = m)
    for a in (x, p), args in ((typemax(UInt),), ((typemax(UInt),),), (UInt(2)^63, 1),
                              ((UInt(2)^63, 1),), ((big(2)^64,),), (Int8(2), big(2)^64))
        err = try similar(a, args...) catch e; e end
        @test err isa ArgumentError
        @test occursin("invalid array dimensions", err.msg) && occursin("typemax(Int)", err.msg) &&
              occursin(string(typemax(Int)), err.msg)
        @test occursin(repr(args[1] isa Tuple ? args[1][1] : args[1]), err.msg)   # names the dimension
    end
    @test memory_status(m).device.live_buffers == 1
    for (a, T) in ((x, KmmArray), (p, PinnedArray))
        s = similar(a, UInt8(3))
        @test s isa T{Float64,1} && size(s) == (3,) && Kmm.manager(s) === m
        s = similar(a, (UInt16(2), Int8(3)))
        @test s isa T{Float64,2} && size(s) == (2, 3) && Kmm.manager(s) === m
        s = similar(a, big(2), UInt(1))
        @test s isa T{Float64,2} && size(s) == (2, 1)
    end
    @test Kmm.kind(similar(KmmArray([1.0]; manager = m, kind = :pinned), UInt(2))) == :pinned
    # `Base.OneTo` axes past Int, typed or not (Base's `to_shape` converted their ends with Int)
    for a in (x, p), args in ((Base.OneTo(typemax(UInt)),), ((Base.OneTo(UInt(2)^63), 1),),
                              (Float32, Base.OneTo(typemax(UInt))), (Float32, (2, Base.OneTo(UInt(2)^63))))
        err = try similar(a, args...) catch e; e end
        @test err isa ArgumentError && occursin("typemax(Int)", err.msg)
    end
    @test size(similar(x, Base.OneTo(UInt(3)), 2)) == (3, 2) && size(similar(p, Float32, (Base.OneTo(2),))) == (2,)
    close(m)
end

# Review of round 15: deepcopy of a PinnedArray read the source's address before allocating the
# copy; the allocation may collect, and a finalizer that freed the source there (its memory
# then reused by another array) made deepcopy return that array's bytes as the copy.
mutable struct R15Trigger end
@testset "deepcopy of a PinnedArray freed during the copy's allocation is an error" begin
    m = KmmManager(backend = :host)
    n = 1 << 16
    p = PinnedArray(fill(0x11, n); manager = m)
    keep = Any[]
    arm() = (finalizer(R15Trigger()) do _
        Kmm.unsafe_free!(p)                              # frees the source mid-deepcopy
        q = PinnedArray{UInt8}(undef, n; manager = m)   # and reuses its memory
        fill!(q, 0xEE)
        push!(keep, q)
    end; nothing)
    arm()
    old = Kmm.GC_INTERVAL_BYTES[]
    Kmm.GC_INTERVAL_BYTES[] = 0                          # the copy's allocation collects first
    err = try
        deepcopy(p)
        nothing
    catch e
        e
    finally
        Kmm.GC_INTERVAL_BYTES[] = old
    end
    @test length(keep) == 1 && Kmm.isfreed(p)           # the finalizer ran inside the copy
    @test err isa KmmError && occursin("freed", err.message)
    @test memory_status(m).pinned.live_buffers == 1     # the reusing array only: no copy left
    close(m)
end
