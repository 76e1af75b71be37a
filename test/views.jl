# reshape and contiguous views share the buffer; non-contiguous views are an error.

@testset "reshape shares memory" begin
    a = collect(reshape(1.0:24.0, 4, 6))
    x = KmmArray(a)
    r = reshape(x, 2, 12)
    @test r isa KmmArray{Float64,2} && size(r) == (2, 12)
    @test r.storage === x.storage
    @test Array(r) == reshape(a, 2, 12)
    @test Array(reshape(x, :, 3)) == reshape(a, 8, 3)
    @test Array(reshape(x, (2, :, 2))) == reshape(a, 2, 6, 2)
    @test Array(vec(x)) == vec(a)
    fill!(r, 7.0)
    @test all(==(7.0), Array(x))                          # writes through the reshape
    @test_throws DimensionMismatch reshape(x, 5, 5)
    @test_throws DimensionMismatch reshape(x, :, 5)
    @test_throws DimensionMismatch reshape(x, :, :)
    @test size(reshape(KmmArray{Int}(undef, 0), 0, 3)) == (0, 3)
end

@testset "contiguous views share memory" begin
    a = collect(reshape(1:60, 3, 4, 5))
    x = KmmArray(a)
    for I in ((:, :, 2), (:, 2:3, 1), (:, :, 2:4), (:, 2, 3), (2:3, 1, 1), (:, :, :), (1, 1, 1),
              (4:10,), (:,), (:, 1:0, 2))
        v = view(x, I...)
        @test v isa KmmArray
        @test v.storage === x.storage
        @test Array(v) == collect(view(a, I...))
        @test size(v) == size(view(a, I...))
    end
    v = @view x[:, 2:3, 5]
    fill!(v, -1)
    b = copy(a); b[:, 2:3, 5] .= -1
    @test Array(x) == b                                   # writes through the view
    vv = view(view(x, :, :, 2), :, 3)                     # a view of a view
    @test Array(vv) == b[:, 3, 2]
    w = view(KmmArray(collect(1:10)), 3:8)
    @test Array(w) == 3:8
    @test Array(view(w, 2:3)) == [4, 5]
    @test Array(reshape(w, 2, 3)) == reshape(3:8, 2, 3)
    @test Array(view(x, 5)) == fill(5)
end

@testset "non-contiguous views are an error" begin
    x = KmmArray(zeros(3, 4))
    @test_throws ArgumentError view(x, 1:2, 1:2)
    @test_throws ArgumentError view(x, 1, :)
    @test_throws ArgumentError view(x, [1, 3], 1)
    @test_throws ArgumentError view(x, 1:2:3, 1)
    @test_throws BoundsError view(x, :, 5)
    @test_throws BoundsError view(x, 0:2)
    err = try view(x, 1, :) catch e e end
    @test occursin("contiguous", sprint(showerror, err))
end
