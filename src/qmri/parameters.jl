# Atom parameters: `4 x natoms` Float32 (T1 s, T2 s, B1 relative, B0 Hz), one atom per column,
# in a KmmArray (the layout of the C ABI's atom records).

"The most values a log grid may have (its Float64s' bytes stay within Int)."
const MAX_GRID_VALUES = typemax(Int) ÷ sizeof(Float64)

"""
    log_grid(lo, hi, n) -> Vector{Float64}

`n` logarithmically spaced values from `lo` to `hi` (both finite and > 0), ends included.
"""
function log_grid(lo::Real, hi::Real, n::Integer)
    # An infinite end made log(hi) - log(lo) infinite, and (i - 1) * Inf NaN at i = 1: the grid
    # began with NaN (a parameter_grid error then named a NaN the caller never gave).
    0 < lo < Inf && 0 < hi < Inf ||
        throw(ArgumentError("log_grid: the ends must be finite and > 0, got $lo and $hi"))
    # n * 8 bytes must not wrap: Julia 1.5 allocates a wrapped size and the fill segfaults.
    count_arg("log_grid", :n, n, MAX_GRID_VALUES)
    n == 1 && return [Float64(lo)]
    a, b = log(Float64(lo)), log(Float64(hi))
    # The ends as given: exp(log(x)) is not always x (0.49999999999999994 for 0.5), and
    # parameter_grid then dropped the atom where T2 == T1.
    [i == 1 ? Float64(lo) : i == n ? Float64(hi) : exp(a + (b - a) * (i - 1) / (n - 1)) for i in 1:n]
end

# The values of one `parameter_grid` keyword (`name`), whose errors name it.
function grid_values(name::Symbol, v::Tuple{Real,Real,Integer})
    lo, hi, n = v
    0 < lo < Inf && 0 < hi < Inf && !(n isa Bool) && 1 <= n <= MAX_GRID_VALUES ||
        throw(ArgumentError("parameter_grid: $name = $v; a log grid (lo, hi, n) needs finite " *
                            "lo > 0 and hi > 0 and n >= 1 (n an integer in 1..$MAX_GRID_VALUES, not a Bool)"))
    log_grid(lo, hi, n)
end
grid_values(name::Symbol, v::AbstractVector{<:Real}) = Float64.(collect(v))
grid_values(name::Symbol, v::Real) = [Float64(v)]
grid_values(name::Symbol, v) = throw(ArgumentError("parameter_grid: $name = $(repr(v)); give " *
    "a vector of values, one value, or (lo, hi, n)"))

"""
    parameter_grid(; T1, T2, B1 = 1.0, B0 = 0.0, drop_T2_above_T1 = true,
                   manager = Kmm.default_manager()) -> KmmArray{Float32,2}

The atoms of a dictionary: every combination of the `T1`, `T2`, `B1` and `B0` values (T1
fastest, then T2, B1, B0), as `4 x natoms` parameters on `manager`. Each of `T1`, `T2`, `B1`,
`B0` is a vector of values, a single value, or `(lo, hi, n)` for `n` log-spaced values
(`log_grid`). Combinations with T2 > T1 are dropped unless `drop_T2_above_T1 = false`.
T1 and T2 in seconds (> 0, `Inf` allowed), B1 relative, B0 in Hz (both finite), each as the
Float32 the library gets (1e-50 s is 0 and 1e39 is Inf: refused). A bad value is an
`ArgumentError` naming `parameter_grid`, the keyword, the value as given and the bound, before
anything is allocated.
"""
function parameter_grid(; T1, T2, B1 = 1.0, B0 = 0.0, drop_T2_above_T1::Bool = true,
                        manager::KmmManager = default_manager())
    t1s, t2s = grid_values(:T1, T1), grid_values(:T2, T2)
    b1s, b0s = grid_values(:B1, B1), grid_values(:B0, B0)
    for (name, given, vals) in ((:T1, T1, t1s), (:T2, T2, t2s), (:B1, B1, b1s), (:B0, B0, b0s))
        check_grid_values(name, given, vals)
    end
    recs = Float32[]
    for b0 in b0s, b1 in b1s, t2 in t2s, t1 in t1s
        drop_T2_above_T1 && t2 > t1 && continue
        push!(recs, t1, t2, b1, b0)
    end
    isempty(recs) && throw(ArgumentError("parameter_grid: no atoms: every T2 (smallest " *
        "$(minimum(t2s)) s) exceeds every T1 (largest $(maximum(t1s)) s); pass " *
        "drop_T2_above_T1 = false to keep them"))
    p = reshape(recs, 4, :)
    check_params(p)
    KmmArray(p; manager = manager)
end

"""Throws an ArgumentError naming the `parameter_grid` keyword `name`, the value as given and
the bound it breaks. The values are checked as given, not as converted: the library gets
Float32s, in which 1e39 is Inf and 1e-50 is 0, values the caller never gave."""
function check_grid_values(name::Symbol, given, vals::Vector{Float64})
    isempty(vals) && throw(ArgumentError("parameter_grid: $name has no values"))
    # a log grid lies between its ends: they are what was given
    xs = given isa Tuple ? given[1:2] : given isa Real ? (given,) : given
    for (i, x) in enumerate(xs)
        atom_value_ok(name, x) || throw(ArgumentError("parameter_grid: $name = $x (value $i of " *
            "$(length(xs)) given); $name must be $(atom_value_bound(name))"))
    end
    nothing
end

# An atom's T1 and T2 (s) are > 0 (Inf allowed), B1 and B0 (Hz) finite, as the Float32s the
# library gets.
atom_value_ok(name::Symbol, x::Real) = name in (:T1, :T2) ? Float32(x) > 0 : isfinite(Float32(x))
atom_value_bound(name::Symbol) = name in (:T1, :T2) ?
    "> 0 s as a Float32 (at least $(nextfloat(0f0)); Inf allowed)" :
    "finite as a Float32 (magnitude at most $(floatmax(Float32)))" * (name === :B0 ? " (Hz)" : "")

"""
    tissue_parameters(T1, T2, B1 = 1, B0 = 0; manager = Kmm.default_manager()) -> KmmArray{Float32,2}

`4 x n` atom parameters from per-atom values (vectors of one length, or scalars repeated),
with `parameter_grid`'s bounds; a bad value is an `ArgumentError` naming it as given.
"""
function tissue_parameters(T1, T2, B1 = 1.0, B0 = 0.0; manager::KmmManager = default_manager())
    for (name, v) in zip((:T1, :T2, :B1, :B0), (T1, T2, B1, B0))
        # (a String iterates as characters, which would convert to numbers)
        v isa Real || (v isa Union{AbstractArray,Tuple} && all(x -> x isa Real, v)) || throw(ArgumentError(
            "tissue_parameters: $name = $(repr(v)) must be a real number or an array or tuple of them"))
    end
    cols = map(v -> v isa Real ? nothing : collect(v), (T1, T2, B1, B0))
    lens = [length(c) for c in cols if c !== nothing]
    n = isempty(lens) ? 1 : lens[1]
    all(==(n), lens) || throw(ArgumentError("tissue_parameters: T1, T2, B1, B0 have lengths $lens; they must match"))
    n >= 1 || throw(ArgumentError("tissue_parameters: no atoms"))
    p = Matrix{Float32}(undef, 4, n)
    for (r, (name, v)) in enumerate(zip((:T1, :T2, :B1, :B0), (T1, T2, B1, B0)))
        for j in 1:n
            x = v isa Real ? v : cols[r][j]
            # checked as given: the Float32 (Inf, 0.0) is not what the caller wrote
            atom_value_ok(name, x) || throw(ArgumentError("tissue_parameters: $name = $x (atom $j); " *
                                                          "$name must be $(atom_value_bound(name))"))
            p[r, j] = x
        end
    end
    check_params(p)
    KmmArray(p; manager = manager)
end

"Throws an ArgumentError naming the first bad atom (T1, T2 > 0, B1 and B0 finite)."
function check_params(p::AbstractMatrix)
    size(p, 1) == 4 || throw(ArgumentError("parameters must be 4 x natoms (T1, T2, B1, B0), got $(size(p))"))
    size(p, 2) >= 1 || throw(ArgumentError("the dictionary is empty: parameters have 0 atoms"))
    for j in 1:size(p, 2)
        t1, t2, b1, b0 = p[1, j], p[2, j], p[3, j], p[4, j]
        # as the Float32 values the library gets (1e-50 would be 0, 1e39 Inf)
        Float32(t1) > 0 || throw(ArgumentError("atom $j has T1 = $t1 s; T1 must be > 0 as a Float32 (Inf allowed)"))
        Float32(t2) > 0 || throw(ArgumentError("atom $j has T2 = $t2 s; T2 must be > 0 as a Float32 (Inf allowed)"))
        isfinite(Float32(b1)) && isfinite(Float32(b0)) || throw(ArgumentError(
            "atom $j has B1 = $b1, B0 = $b0; both must be finite as Float32 values"))
    end
    nothing
end
