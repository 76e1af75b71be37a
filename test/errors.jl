# Errors for bad input: freed arrays, closed managers, bad handles, bad arguments.
using Kmm: LibKmm

@testset "a freed array" begin
    x = KmmArray(collect(1.0:4.0))
    v = view(x, 2:3)
    Kmm.unsafe_free!(x)
    @test Kmm.isfreed(x) && Kmm.isfreed(v)                # views share the buffer
    Kmm.unsafe_free!(x)                                   # twice is fine
    err = try Array(x) catch e e end
    @test err isa KmmError
    @test err.status == LibKmm.KMM_ERROR_INVALID_HANDLE
    @test occursin("freed", sprint(showerror, err))
    @test_throws KmmError Array(v)
    @test_throws KmmError copyto!(x, zeros(4))
    @test_throws KmmError copyto!(zeros(4), x)
    @test_throws KmmError fill!(x, 1)
    @test_throws KmmError copy(x)
    @test_throws KmmError copyto_async!(x, zeros(4))
    @test_throws KmmError Kmm.@allowscalar x[1]
    @test occursin("(freed)", sprint(show, MIME"text/plain"(), x))
    @test occursin("(freed)", sprint(show, x))
end

@testset "a closed manager" begin
    m = KmmManager(backend = :host)
    x = KmmArray([1, 2, 3]; manager = m)
    close(m)
    err = try copyto!(x, [4, 5, 6]) catch e e end
    @test err isa KmmError && occursin("closed", err.message)
    @test_throws KmmError KmmArray([1]; manager = m)
    @test_throws KmmError Kmm.synchronize(m)
    @test_throws KmmError trim!(m)
    @test_throws KmmError Kmm.stream(m)
    Kmm.unsafe_free!(x)                                   # freeing after close is harmless
end

@testset "the library's own checks" begin
    m = KmmManager(backend = :host, hard_limit = 2^20)
    err = try KmmArray{UInt8}(undef, 2^49; manager = m) catch e e end   # above 2^48 bytes
    @test err isa KmmError && err.status == LibKmm.KMM_ERROR_SIZE_OVERFLOW
    @test !isempty(err.message)
    close(m)
    @test_throws KmmError KmmManager(backend = :host, staging_chunks = 1)   # 2 to 64
end
