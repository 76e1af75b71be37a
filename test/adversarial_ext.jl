# Regressions of the adversarial runs (see test/adversarial.jl) that need the CUDA.jl stand-ins
# of test/ext.jl, which includes this file and calls them.

"""
The extension's regressions; test/ext.jl runs them against its stand-ins for CUDA.jl (`CUDA`),
with `task_stream(m)` the CuStream over a manager's stream.
"""
function adversarial_ext_tests(CUDA, task_stream)
    @testset "a 0-dimensional broadcast gives its element through the views, not scalar indexing" begin
        # Base's copy of a 0-dimensional broadcast reads bc[]: view(x, 3) .+ 1 threw "scalar
        # getindex of a KmmArray is disallowed" (round 5 of the adversarial tests).
        m = KmmManager(backend = :host)
        x = KmmArray(collect(1.0:4.0); manager = m)
        live = Kmm.memory_stats(m).live_buffers
        @test (view(x, 3) .+ 1) === 4.0
        @test (view(x, 2) .* view(x, 4)) === 8.0
        @test Kmm.memory_stats(m).live_buffers == live    # the 0-d result was freed
        close(m)
    end
    @testset "Kmm.record_stream(x, s) makes s wait for the manager's queued work" begin
        # It pinned x and recorded s but left s unordered: work launched on s after it (the
        # documented way to use x on a stream other than CUDA.stream()) could run before, or
        # while, the manager's queued writes to x (a fill, a copy in).
        m = KmmManager(backend = :host); o = KmmManager(backend = :host)
        x = KmmArray(zeros(UInt8, 16); manager = m)
        busy = KmmArray{UInt8}(undef, 256 * 2^20; manager = m)
        fill!(busy, 0x00)
        Kmm.record_stream(x, task_stream(o))            # compiled before it is timed
        Kmm.synchronize(m); Kmm.synchronize(o)
        foreach(v -> fill!(busy, v), 0x01:0x04)         # long work queued on the manager
        fill!(x, 0x07)
        ev = Ref{UInt64}(0)
        Kmm.LibKmm.kmm_manager_record_event(m.handle, ev)
        Kmm.record_stream(x, task_stream(o))            # again: the stream is recorded already
        Kmm.synchronize(o)                              # what s runs from now on comes after ...
        done = Ref{Bool}(false)
        Kmm.LibKmm.kmm_event_query(m.handle, ev[], done)
        @test done[]                                    # ... the fill of x
        Kmm.synchronize(m)
        Kmm.LibKmm.kmm_event_destroy(m.handle, ev[])
        Kmm.unsafe_free!(x)
        close(m); close(o)
    end

    @testset "KmmArray(c::CuArray; kind = :pinned) and copyto! with pinned memory copy through the host" begin
        # They took the zero-copy view of the pinned array and failed with "CuArray(x) needs
        # device memory", though nothing asked for a view of it.
        m = KmmManager(backend = :host)
        c = CUDA.alloc(Float64, (3,)); CUDA.host(c) .= [1.5, 2.5, 3.5]
        p = KmmArray(c; manager = m, kind = :pinned)
        @test Kmm.kind(p) == :pinned && Array(p) == [1.5, 2.5, 3.5]
        copyto!(p, [7.0, 8.0, 9.0])
        copyto!(c, p)                                   # pinned KmmArray -> CuArray
        @test CUDA.host(c) == [7.0, 8.0, 9.0]
        CUDA.host(c) .= 4.0
        copyto!(p, c)                                   # CuArray -> pinned KmmArray
        @test Array(p) == fill(4.0, 3)
        d = KmmArray(c; manager = m)                    # device memory still takes the view
        @test Array(d) == fill(4.0, 3) && Kmm.kind(d) == :device
        Kmm.unsafe_free!(p); Kmm.unsafe_free!(d)
        close(m)
    end
end
