# Adversarial round 14: failing tests for defects found from the documentation and the public
# API (host backend). Each @testset failed on the code as it was found.

using Test, Kmm

# The error kept the first attempt's figures (3 MiB in 2 buffers, a buffer the collection then
# freed among the largest holders) while the memory_status it carries, printed under them, was
# read after the collection: the printed error contradicted itself.
@testset "an out-of-memory error's figures agree with the status it carries" begin
    m = KmmManager(backend = :host, chunk_size = 1 << 20, hard_limit = 4 << 20)
    keep = KmmArray{UInt8}(undef, 2 << 20; manager = m)
    garbage(m) = (KmmArray{UInt8}(undef, 1 << 20; manager = m); nothing)
    garbage(m)
    err = try
        KmmArray{UInt8}(undef, 3 << 20; manager = m)
        nothing
    catch e
        e
    end
    @test err isa KmmOutOfMemoryError
    st = err.status.device
    @test st.live_buffers == 1 && st.in_use == 2 << 20
    @test occursin("in use: 2.00 MiB in 1 buffers", err.message) || occursin("in use: 2.00 MiB in 1 buffer", err.message)
    @test count("buffer 0x", split(err.message, "largest holders")[2]) >= 1
    @test !occursin("1.00 MiB", split(split(err.message, "largest holders")[2], '\n')[1])
    @test occursin("the first try tried:", err.message)
    @test occursin("in Julia: GC.gc(false), GC.gc(true) and trim!", sprint(showerror, err))
    @test length(keep) == 2 << 20
    close(m)
end
