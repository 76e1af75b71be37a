# Round 6 of the adversarial tests. Each testset fails on the code it was written against
# (de09b4f); the crashing ones run in a child process (test/in_child.jl).

include("in_child.jl")

@testset "deepcopy of a KmmArray in pinned memory (kind = :pinned) copies its data" begin
    # A KmmArray with kind = :pinned has a pinned storage that is never mapped (hostptr is
    # C_NULL); deepcopy took every pinned storage for a PinnedArray's and read hostptr:
    # unsafe_copyto! from NULL, SIGSEGV (exit 139).
    test_in_child("""
        using Test, Kmm
        m = KmmManager(backend = :host)
        x = KmmArray(collect(1.0:8.0); manager = m, kind = :pinned)
        y = deepcopy(x)
        @test Array(y) == 1:8 && y.storage !== x.storage
        v = view(x, 3:5)
        @test Array(deepcopy(v)) == 3:5
        close(m)
        """; threads = 1)
end

@testset "a sequence whose field vectors were resized is refused, never read out of bounds" begin
    # FISPSequence/PSSFPSequence check their lengths on construction only, but their fields
    # are plain mutable Vectors/Matrices (documented as fields). cstruct() passes
    # length(flip_angles) with pointers into phases and profile: after push!/append! to
    # flip_angles the library reads phases and profile past their ends. Seen: "seq.phase[266] =
    # NaN is not finite" for a 10-element phases vector, and with a 10 x 2 profile a 1010-TR
    # simulation that succeeded on whatever lay past the matrix (values like 9.2e-38).
    test_in_child("""
        using Test, Kmm
        const Q = Kmm.QMRI
        m = KmmManager(backend = :host)
        params = Q.parameter_grid(T1 = (0.5, 2.0, 3), T2 = (0.05, 0.2, 3), manager = m)
        # profile: flip angles and phases grown together, the 10 x 2 profile left as it was
        seq = Q.FISPSequence(fill(0.3, 10); TR = 0.01, Ns = 8, profile = ones(10, 2))
        grown = try
            append!(seq.flip_angles, fill(0.3f0, 1000)); append!(seq.phases, zeros(Float32, 1000)); true
        catch
            false                                  # fields that cannot be resized: fine too
        end
        if grown
            err = try Q.simulate_fisp(seq, params); nothing catch e; e end
            @test err !== nothing                  # it must not simulate from outside the profile
        end
        # phases: flip angles grown alone
        seq2 = Q.FISPSequence(fill(0.3, 10); TR = 0.01, Ns = 8)
        grown = try append!(seq2.flip_angles, fill(0.3f0, 2^20 - 10)); true catch; false end
        if grown
            err = try Q.simulate_fisp(seq2, params; check = false); nothing catch e; e end
            msg = err === nothing ? "" : sprint(showerror, err)
            @test err !== nothing
            # an element index past the 10 phases means the library read beyond the vector
            i = match(r"phase\\[(\\d+)\\]", msg)
            @test i === nothing || parse(Int, i.captures[1]) <= 10
        end
        close(m)
        """; threads = 1)
end

@testset "finalize(manager) during a synchronous copy: the copy still returns only once its bytes arrived" begin
    # finalize_manager sets `destroyed` right after the *deferred* destroy, whose teardown
    # drains the stream later on a background thread; a synchronous copy waiting on that
    # manager (event_done: handle 0 -> destroyed[]) then returned before the copy ran:
    # copyto!(h, x) returned with h all zeros and wrote h seconds later, over what the
    # caller had stored there since.
    m = KmmManager(backend = :host)
    n = 2^22
    x = KmmArray(fill(1.0, n); manager = m)
    busy = KmmArray{UInt8}(undef, 512 * 2^20; manager = m)
    Kmm.synchronize(m)
    h = zeros(n)
    foreach(v -> fill!(busy, v), 0x01:0x06)          # long work queued before the copy
    t = @async begin
        copyto!(h, x)
        seen = count(==(1.0), h)
        h .= 5.0                                     # the caller's own data, after the return
        seen
    end
    yield()                                          # the copy is queued and polling
    finalize(m)
    seen = try fetch(t) catch e; e end
    sleep(2)                                         # the deferred teardown drains the stream
    @test seen == n                                  # returned with every byte, or threw
    @test all(==(5.0), h)                            # nothing written after the return
end

@testset "dimensions past Int are an ArgumentError naming the dimensions, not an InexactError" begin
    # KmmArray{T}(undef, dims::Integer...) and PinnedArray converted dims with
    # convert(Dims, dims): UInt64(2)^63 gave "InexactError: check_top_bit(Int64, ...)",
    # big(2)^70 "InexactError: Int64(...)", UInt128 "InexactError: trunc(Int64, ...)", naming
    # neither the argument nor the bound (a negative or overflowing size is an ArgumentError).
    m = KmmManager(backend = :host)
    for f in (() -> KmmArray{Float64}(undef, UInt64(2)^63; manager = m),
              () -> KmmArray{Float64}(undef, 4, big(2)^70; manager = m),
              () -> PinnedArray{Float64}(undef, UInt128(2)^100; manager = m))
        err = try f(); nothing catch e; e end
        @test err isa ArgumentError
        @test err !== nothing && occursin("dimensions", sprint(showerror, err))
    end
    close(m)
end

@testset "copyto! between KmmArrays of two element types names the source when its range is bad" begin
    # The converting method read view(src, soffs:soffs+n-1) without checking the range: the
    # sum wrapped to an empty view, and the error named a 0-element temporary Array
    # ("attempt to access 0-element Array{Float64,1} at index [1:2]"), neither argument.
    m = KmmManager(backend = :host)
    k = KmmArray(collect(1.0:16.0); manager = m)
    k32 = KmmArray(collect(1f0:16f0); manager = m)
    err = try copyto!(k, 1, k32, typemax(Int), 2); nothing catch e; e end
    @test err isa BoundsError && err.a === k32
    @test Array(k) == 1:16
    close(m)
end

@testset "parameter_grid names the keyword and the value given when it is out of Float32's range" begin
    # check_grid_values tests the Float64 values (1e39 is finite, 1e-50 > 0), then the Float32
    # records fail check_params: "atom 1 has B1 = Inf, B0 = 0.0; both must be finite" and
    # "atom 1 has T1 = 0.0 s", values the caller never gave, without the keyword's name
    # (the docstring: "A bad value is an ArgumentError naming the keyword and the bound").
    m = KmmManager(backend = :host)
    for (kw, given) in (((T1 = 1.0, T2 = 0.1, B1 = 1e39), "1.0e39"),
                        ((T1 = 1e-50, T2 = 1e-60, drop_T2_above_T1 = false), "1.0e-50"))
        err = try Kmm.QMRI.parameter_grid(; kw..., manager = m); nothing catch e; e end
        msg = err === nothing ? "" : sprint(showerror, err)
        @test err isa ArgumentError
        @test occursin("parameter_grid", msg) && occursin(given, msg)
    end
    close(m)
end
