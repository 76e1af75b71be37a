# Adversarial round 12: failing tests for defects found from the documentation and the public
# API (host backend). Each @testset failed on the code as it was found.

using Test, Kmm, LinearAlgebra

# A freed PinnedArray's wrappers showed "(freed)" one view, reshape or reinterpretation deep
# only: two deep, or a transpose, adjoint or permutation one deep, threw KmmError in show.
@testset "wrappers of a freed PinnedArray show as freed at any depth" begin
    m = KmmManager(backend = :host)
    p = PinnedArray(collect(1.0:4.0); manager = m)
    wrappers = () -> (reinterpret(Int64, view(p, 1:2)), view(reshape(p, 2, 2), :, 1),
                      reshape(view(p, 1:4), 2, 2), transpose(p), p', PermutedDimsArray(reshape(p, 2, 2), (2, 1)),
                      view(transpose(reshape(p, 2, 2)), 1, :))
    live = wrappers()
    @test occursin("3.0", sprint(show, MIME"text/plain"(), live[4]))
    Kmm.unsafe_free!(p)
    for w in wrappers()
        for text in (sprint(show, MIME"text/plain"(), w), sprint(show, w), repr(w))
            @test occursin("(freed)", text)
        end
    end
    close(m)
end

# A KmmArray's wrappers (reinterpret, transpose, adjoint, permutation) threw the scalar-indexing
# error when shown, live or freed, and once freed `Array` of one named scalar indexing.
@testset "wrappers of a KmmArray show, read back, and say freed" begin
    m = KmmManager(backend = :host)
    x = KmmArray(collect(1.0:4.0); manager = m)
    r = reinterpret(Int64, x)
    @test r isa KmmArray{Int64,1} && Array(r) == reinterpret(Int64, collect(1.0:4.0))
    @test reinterpret(Float32, x) isa KmmArray{Float32,1} && length(reinterpret(Float32, x)) == 8
    @test_throws ArgumentError reinterpret(NTuple{3,Float64}, x)   # 32 bytes do not divide by 24
    @test_throws ArgumentError reinterpret(Any, x)
    host = collect(1.0:4.0)
    for (w, h) in ((transpose(x), transpose(host)), (x', host'),
                   (PermutedDimsArray(reshape(x, 2, 2), (2, 1)), PermutedDimsArray(reshape(host, 2, 2), (2, 1))),
                   (view(transpose(reshape(x, 2, 2)), 1, :), view(transpose(reshape(host, 2, 2)), 1, :)))
        @test Array(w) == Array(h) && collect(w) == collect(h)
        @test repr(w) == repr(Array(h)) || repr(w) == repr(collect(h))
        @test occursin(" 2.0", sprint(show, MIME"text/plain"(), w))
    end
    Kmm.unsafe_free!(x)
    for w in (transpose(x), x', PermutedDimsArray(reshape(x, 2, 2), (2, 1)), reinterpret(Int64, x))
        @test occursin("(freed)", sprint(show, MIME"text/plain"(), w)) && occursin("(freed)", repr(w))
        err = try Array(w); nothing catch e; e end
        @test err isa KmmError && occursin("freed", sprint(showerror, err))
    end
    err = try x[1]; nothing catch e; e end
    @test err isa KmmError   # freed, not "scalar getindex ... disallowed"
    close(m)
end

# Showing a spilled array that finds no device memory to come back to threw
# KmmOutOfMemoryError: a display never throws, and the data stay intact.
@testset "a spilled array with no room to come back shows without throwing" begin
    m = KmmManager(backend = :host, hard_limit = 2^21, spill_limit = 2^24, chunk_size = 2^20)
    a = KmmArray(fill(1.0, 2^17); manager = m)
    b = KmmArray(fill(2.0, 2^17); manager = m)
    c = KmmArray(fill(3.0, 2^17); manager = m)
    Kmm.never_spill!(b); Kmm.never_spill!(c)
    @test Kmm.is_spilled(a)
    for text in (sprint(show, MIME"text/plain"(), a), sprint(show, a), sprint(show, MIME"text/plain"(), transpose(a)))
        @test occursin("spilled to host", text)
    end
    Kmm.unsafe_free!(c)
    @test Array(a) == fill(1.0, 2^17)   # intact once there is room
    close(m)
end

# copyto_async! and Base's loops passed a freed PinnedArray of no elements (nothing to touch),
# and `similar` made new arrays from freed ones.
@testset "freed arrays of no elements are refused; similar of a freed array too" begin
    m = KmmManager(backend = :host)
    p0 = PinnedArray{Float64}(undef, 0; manager = m); Kmm.unsafe_free!(p0)
    x0 = KmmArray{Float64}(undef, 0; manager = m)
    @test_throws KmmError copyto_async!(x0, p0)
    @test_throws KmmError copyto_async!(p0, x0)
    for f in (() -> copyto!(Float64[], p0), () -> copyto!(p0, Float64[]), () -> copyto!(p0, p0),
              () -> fill!(p0, 1.0), () -> PinnedArray(p0; manager = m), () -> collect(p0),
              () -> iterate(p0), () -> map(identity, p0), () -> p0 == Float64[], () -> similar(p0))
        @test_throws KmmError f()
    end
    xf = KmmArray{Float64}(undef, 0; manager = m); Kmm.unsafe_free!(xf)
    @test_throws KmmError iterate(xf)
    @test_throws KmmError similar(xf)
    y = KmmArray([1.0, 2.0]; manager = m); Kmm.unsafe_free!(y)
    @test_throws KmmError similar(y)
    # Live arrays of no elements still work.
    q0 = PinnedArray{Float64}(undef, 0; manager = m)
    @test copyto!(Float64[], q0) == Float64[] && iterate(q0) === nothing && similar(q0) isa PinnedArray
    wait(copyto_async!(x0, q0))
    close(m)
end

# similar with a dimension past typemax(Int) was an InexactError from Base's conversion; an
# element-type error of a PinnedArray named KmmArray.
@testset "similar's dimensions and PinnedArray's element type name themselves" begin
    m = KmmManager(backend = :host)
    x = KmmArray([1]; manager = m)
    p = PinnedArray([1]; manager = m)
    for a in (x, p)
        err = try similar(a, Int, typemax(UInt)); nothing catch e; e end
        @test err isa ArgumentError && occursin("typemax(Int)", sprint(showerror, err))
        @test size(similar(a, Int, UInt8(3), Int16(2))) == (3, 2)
    end
    for f in (() -> PinnedArray(Any[1]; manager = m), () -> PinnedArray{String}(undef, 2; manager = m))
        err = try f(); nothing catch e; e end
        @test err isa ArgumentError && occursin("PinnedArray needs an isbits", sprint(showerror, err))
    end
    close(m)
end

# Found by the review of these fixes: the 2-argument copyto! methods first added for a freed
# PinnedArray of no elements made copies with other array types ambiguous (`x .= PinnedArray`
# of another element type threw a MethodError), and typed read-backs of a KmmArray's wrappers
# (`Matrix(x')`) threw the scalar-indexing error.
@testset "copies with PinnedArrays stay unambiguous; typed read-backs of wrappers" begin
    m = KmmManager(backend = :host)
    x = KmmArray([1.0, 2, 3, 4]; manager = m)
    x .= PinnedArray([1, 2, 3, 4]; manager = m)
    @test Array(x) == [1.0, 2, 3, 4]
    p = PinnedArray([1.0, 2, 3, 4]; manager = m)
    copyto!(p, KmmArray([5, 6, 7, 8]; manager = m))
    @test p == [5.0, 6, 7, 8]
    pd = PermutedDimsArray(zeros(2, 2), (2, 1))
    copyto!(pd, PinnedArray([1.0 2; 3 4]; manager = m))
    @test pd == [1.0 2; 3 4]
    y = KmmArray(Float64[1 2 3; 4 5 6]; manager = m)
    @test Matrix(transpose(y)) == [1.0 4; 2 5; 3 6]
    @test Matrix{Float32}(y') == Float32[1 4; 2 5; 3 6]
    @test Array{Int}(transpose(y)) == [1 4; 2 5; 3 6]
    close(m)
end
