# parameter_grid's argument checks: each error names the keyword at fault and its bound
# (issue 17: `T1 = [-1.0]` used to be reported as "every T2 exceeds every T1").

function grid_error(; kw...)
    try
        Kmm.QMRI.parameter_grid(; kw...)
    catch err
        return err
    end
    nothing
end

# the error is an ArgumentError whose message contains every one of `parts`
function blames(err, parts...)
    err isa ArgumentError || return false
    all(p -> occursin(p, err.msg), parts) || (@warn "unexpected message" err.msg parts; false)
end

@testset "a bad value names its keyword and bound" begin
    @test blames(grid_error(T1 = [-1.0], T2 = [0.05]), "T1 = -1.0", "T1 must be > 0")
    @test blames(grid_error(T1 = [1.0], T2 = [0.0]), "T2 = 0.0", "T2 must be > 0")
    @test blames(grid_error(T1 = [1.0, NaN], T2 = 0.1), "T1 = NaN", "value 2 of 2")
    @test blames(grid_error(T1 = 1.0, T2 = 0.1, B1 = [1.0, Inf]), "B1 = Inf", "B1 must be finite")
    @test blames(grid_error(T1 = 1.0, T2 = 0.1, B0 = NaN), "B0 = NaN", "B0 must be finite")
    @test blames(grid_error(T1 = (0.0, 1.0, 5), T2 = 0.1), "T1 = (0.0, 1.0, 5)", "lo > 0")
    @test blames(grid_error(T1 = 1.0, T2 = (0.01, 1.0, 0)), "T2 = (0.01, 1.0, 0)", "n >= 1")
    @test blames(grid_error(T1 = Float64[], T2 = 0.1), "T1 has no values")
    @test blames(grid_error(T1 = "1.0", T2 = 0.1), "T1 = \"1.0\"", "(lo, hi, n)")
end

@testset "no atoms left after dropping T2 > T1" begin
    err = grid_error(T1 = 0.1, T2 = [0.5, 1.0])
    @test blames(err, "every T2", "0.5", "0.1", "drop_T2_above_T1 = false")
    p = Kmm.QMRI.parameter_grid(T1 = 0.1, T2 = [0.5, 1.0], drop_T2_above_T1 = false)
    @test size(p) == (4, 2)
end

@testset "good grids" begin
    p = Kmm.QMRI.parameter_grid(T1 = [0.5, Inf], T2 = [0.05, Inf], B1 = (0.9, 1.1, 3), B0 = [-5, 5])
    a = Array(p)
    @test size(a) == (4, 3 * 3 * 2)                      # (0.5, Inf) dropped: Inf > 0.5
    @test a[:, 1] == Float32[0.5, 0.05, 0.9, -5]         # T1 fastest
    @test all(a[2, :] .<= a[1, :])
end

@testset "values outside Float32's range are reported as given" begin
    # The library gets Float32s: 1e39 is Inf and 1e-50 is 0. The checks test the values as
    # the library gets them but name the value given (not "atom 1 has T1 = 0.0 s").
    @test blames(grid_error(T1 = (1e-50, 1.0, 3), T2 = 0.1), "T1 = 1.0e-50", "as a Float32")
    @test blames(grid_error(T1 = 1.0, T2 = 0.1, B0 = [0, -1e40]), "B0 = -1.0e40", "value 2 of 2")
    err(f) = try f(); nothing catch e; e end
    @test blames(err(() -> Kmm.QMRI.tissue_parameters([1.0, 1e-50], 0.1)), "tissue_parameters", "T1 = 1.0e-50", "atom 2")
    @test blames(err(() -> Kmm.QMRI.tissue_parameters(1.0, 0.1, 1e39)), "tissue_parameters", "B1 = 1.0e39")
end
