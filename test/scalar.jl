# Scalar indexing: an error by default; @allowscalar and allowscalar() permit it.

x = KmmArray(collect(1:6))
m = KmmArray([1 2 3; 4 5 6])
err = try x[1] catch e e end
@test err isa ErrorException && occursin("scalar getindex of a KmmArray is disallowed", err.msg)
@test occursin("@allowscalar", err.msg)
@test_throws ErrorException x[2] = 5
@test_throws ErrorException m[2, 3]
@test_throws ErrorException sum(x)                        # generic fallbacks hit the same rule
@test_throws ErrorException x[2:3]                        # non-scalar getindex too
@test Array(x) == 1:6                                     # x was not changed

@test Kmm.@allowscalar(x[3]) == 3
@test Kmm.@allowscalar(m[2, 3]) == 6
Kmm.@allowscalar begin
    x[2] = 20
    m[1, 2] = -2
    @test x[2] == 20
    @test sum(x) == 1 + 20 + 3 + 4 + 5 + 6
    @test_throws BoundsError x[7]
    @test_throws BoundsError x[0] = 1
    @test x[end] == 6
    @test x[2:3] isa KmmArray && Array(x[2:3]) == [20, 3]
end
@test Array(m) == [1 -2 3; 4 5 6]
@test_throws ErrorException x[1]                          # scoped: off again

Kmm.allowscalar(true)
try
    @test x[1] == 1
    x[1] = 10
    @test Array(x)[1] == 10
    s = KmmArray([Voxel(1, 2, 3im, true, 4)])
    @test s[1] == Voxel(1, 2, 3im, true, 4)
finally
    Kmm.allowscalar(false)
end
@test_throws ErrorException x[1]
