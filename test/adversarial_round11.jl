# Adversarial round 11: failing tests for defects found from the documentation and the public
# API (host backend). Each @testset failed on the code as it was found.

using Test, Kmm

# docs/julia-api.md: "`n = 0` copies nothing and checks no offset, as Base's (a freed array is
# still an error)". A freed PinnedArray passed when the other side was not a KmmArray of its
# element type: the zero-length return came before the liveness check.
@testset "a zero-length copy with a freed PinnedArray is an error in every form" begin
    m = KmmManager(backend = :host)
    p = PinnedArray{Float64}(undef, 4; manager = m)
    Kmm.unsafe_free!(p)
    q = PinnedArray(fill(7.0, 4); manager = m)
    xf = KmmArray(fill(1.0, 4); manager = m)
    xi = KmmArray(fill(2, 4); manager = m)
    host = fill(3.0, 4)
    for (dest, src) in ((xf, p), (p, xf), (xi, p), (p, xi), (q, p), (p, q), (host, p), (p, host))
        @test_throws KmmError copyto!(dest, 1, src, 1, 0)
        @test_throws KmmError copyto!(dest, 9, src, 9, 0)   # no offset checked, liveness still
    end
    # A view, reshape or reinterpretation of the freed array, against a KmmArray (Kmm's methods;
    # Base's own copyto! between two host views is not Kmm's, docs/julia-api.md).
    for w in (view(p, 1:2), reshape(p, 2, 2), reinterpret(Int64, p), view(reinterpret(Int64, p), 1:2))
        @test_throws KmmError copyto!(xi, 1, w, 1, 0)
        @test_throws KmmError copyto!(w, 1, xi, 1, 0)
    end
    # Live arrays: n = 0 copies nothing and checks no offset.
    @test copyto!(q, 9, host, 9, 0) === q && Array(q) == fill(7.0, 4)
    @test copyto!(xi, 1, q, 1, 0) === xi && Array(xi) == fill(2, 4)
    @test Array(xf) == fill(1.0, 4) && host == fill(3.0, 4)
    close(m)
end

# Views and reshapes of a freed PinnedArray showed "(freed)"; a reinterpretation threw.
@testset "a reinterpretation of a freed PinnedArray shows as freed" begin
    m = KmmManager(backend = :host)
    p = PinnedArray(collect(1.0:4.0); manager = m)
    r = reinterpret(Int64, p)
    @test occursin("4607182418800017408", sprint(show, MIME"text/plain"(), r))   # 1.0, as Int64
    Kmm.unsafe_free!(p)
    for text in (sprint(show, MIME"text/plain"(), r), sprint(show, r))
        @test occursin("(freed)", text)
    end
    close(m)
end

# A Symbol (or anything String() converts) was taken as a trace's file path.
@testset "a trace's path must be a string" begin
    m = KmmManager(backend = :host)
    dir = mktempdir()
    cd(dir) do
        for path in (:sym, 'c', [0x61])
            err = try Kmm.trace_start!(m; path = path); nothing catch e; e end
            @test err isa ArgumentError && occursin("path = ", sprint(showerror, err)) &&
                  occursin("must be a string", sprint(showerror, err))
        end
        @test isempty(readdir(dir))
        Kmm.trace_start!(m; path = "t.csv")
        KmmArray{UInt8}(undef, 8; manager = m)
        Kmm.trace_stop!(m)
        @test readdir(dir) == ["t.csv"]
    end
    close(m)
end

# A device is an ordinal: the bound said -2147483648, and default_manager(true) found device 1's
# manager (true == 1 as a Dict key) where KmmManager(device = true) is refused.
@testset "device arguments: the bound an ordinal has, and no Bool" begin
    err = try KmmManager(backend = :host, device = -1) catch e e end
    @test err isa KmmError && occursin("device = -1 must be an integer in 0..2147483647", sprint(showerror, err))
    err = try Kmm.default_manager(true) catch e e end
    @test err isa KmmError && occursin("not a Bool", sprint(showerror, err))
end
