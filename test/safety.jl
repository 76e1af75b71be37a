# The Julia binding cannot corrupt memory: offsets that would wrap are refused, keywords are
# checked against their C types, one free per storage however many tasks try, waits yield, and a
# manager collected while a copy into a host array is queued keeps that array alive.

const SAFETY_RNG_SEED = 20261124

@testset "copyto! offsets never wrap (random arguments against a model)" begin
    n = 16
    k = KmmArray(collect(1.0:n))
    h = collect(101.0:100.0 + n)
    big = (typemax(Int) - 2, typemax(Int), typemin(Int), -1, 0, 1, 2, n, n + 1)
    seed = SAFETY_RNG_SEED
    rng(m) = (seed = (seed * 6364136223846793005 + 1442695040888963407) % UInt64 % Int; mod(seed, m))
    pick() = rng(3) == 0 ? big[rng(length(big)) + 1] : rng(n + 3) - 1
    for _ in 1:400
        d, s, c = pick(), pick(), rng(4) == 0 ? pick() : rng(n + 2)
        fits(a, o) = c >= 0 && (c == 0 || (o >= 1 && c <= length(a) && o - 1 <= length(a) - c))
        ok = fits(k, d) && fits(h, s)
        before = (Array(k), copy(h))
        if ok
            copyto!(k, d, h, s, c)
            expect = copy(before[1]); c > 0 && (expect[d:d+c-1] = before[2][s:s+c-1])
            @test Array(k) == expect
            copyto!(k, 1, expect, 1, n)
        else
            @test_throws Union{BoundsError,ArgumentError} copyto!(k, d, h, s, c)
            @test_throws Union{BoundsError,ArgumentError} copyto!(h, s, k, d, c)
            @test (Array(k), h) == before   # nothing written anywhere
        end
    end
    # The example of the adversarial run: an offset near typemax(Int) once passed the check.
    @test_throws BoundsError copyto!(k, typemax(Int) - 2, h, 1, 4)
    @test_throws BoundsError copyto!(h, typemax(Int) - 2, k, 1, 4)
    @test_throws BoundsError copyto!(k, 1, view(h, 1:n), typemax(Int), 2)
end

@testset "KmmManager keywords are checked against their C types" begin
    for (kw, v) in ((:chunk_size, -5), (:hard_limit, -1), (:hard_limit, big(2)^64 + 1024),
                    (:compaction_ratio_pct, 2^32 + 108), (:device, 2^40), (:chunk_size, 2.5),
                    (:hard_limit, true), (:staging_chunks, "4"))
        err = try
            KmmManager(; backend = :host, kw => v)
            nothing
        catch e
            e
        end
        @test err isa Kmm.KmmError
        @test err !== nothing && occursin(string(kw), sprint(showerror, err)) &&
              occursin("..", sprint(showerror, err))
    end
    m = KmmManager(; backend = :host, chunk_size = UInt32(1 << 20), hard_limit = Int8(0))
    @test isopen(m)
    close(m)
end

@testset "one free per storage, however many tasks free it" begin
    for _ in 1:50
        x = KmmArray{Float64}(undef, 1024)
        live = Kmm._live_bytes[]
        ts = [Threads.@spawn Kmm.unsafe_free!(x) for _ in 1:4]
        foreach(wait, ts)
        @test Kmm._live_bytes[] == live - 8 * 1024
        @test Kmm.isfreed(x)
    end
end

@testset "waits yield to other tasks" begin
    m = KmmManager(; backend = :host)
    x = KmmArray{UInt8}(undef, 256 * 2^20; manager = m)
    ran = Ref(false)
    # Whether `wait()` let another task run while it waited for `queue()`'s long work. On a
    # loaded machine the work may rarely be done before the wait starts (no wait, no yield):
    # up to five tries; a wait that never yields fails them all.
    function yielded(wait, queue)
        for _ in 1:5
            queue()
            ran[] = false
            t = @async (ran[] = true)
            out = wait()
            saw = ran[]
            Base.wait(t)
            saw && return true, out
        end
        false, nothing
    end
    ok, _ = yielded(() -> Kmm.synchronize(m), () -> fill!(x, 0x01))   # stream-ordered fill
    @test ok                            # the other task ran while synchronize waited
    h = Vector{UInt8}(undef, length(x))
    fill!(x, 0x02)
    task = copyto_async!(h, x)
    wait(task)                          # polls too (whether it yields depends on timing)
    @test h[1] == 0x02 && h[end] == 0x02
    # The synchronous copies (Array(y), copyto!, scalar access) wait for the stream the same way.
    # They copy a small array, queued behind a long fill of x: a pageable copy larger than the
    # staging slots waits inside libkmm for a slot while it is queued (docs/julia-memory-model.md),
    # so only a small one is sure to find its work still queued when it starts to wait.
    y = KmmArray{UInt8}(undef, 2^20; manager = m)
    hy = Vector{UInt8}(undef, length(y))
    for (value, copy) in ((0x03, () -> copyto!(hy, y)), (0x04, () -> Array(y)),
                          (0x05, () -> (copyto!(y, hy); Array(y))),
                          (0x06, () -> Kmm.@allowscalar [y[1], y[end]]))
        ok, back = yielded(copy, () -> begin
            value == 0x05 && fill!(hy, value)
            fill!(x, value)                       # long work, queued ahead of the copy
            fill!(y, value == 0x05 ? 0x00 : value)
        end)
        @test ok                        # the other task ran while the copy waited
        @test back !== nothing && back[1] == value && back[end] == value
    end
    close(m)
end

@testset "a close interrupted after it took the handle still destroys the manager" begin
    # Whoever takes the handle destroys the manager before anything that may yield or throw,
    # and marks it destroyed only then: a close interrupted while it waited for the manager's
    # lock had marked it destroyed without destroying it (the copy below then was still queued
    # when wait returned, and the manager leaked).
    n = 64 * 2^20
    m = KmmManager(backend = :host)
    x = KmmArray{UInt8}(undef, n; manager = m)
    for v in 0x01:0x08
        fill!(x, v)
    end
    h = zeros(UInt8, 4096)
    t = copyto_async!(h, view(x, n-4095:n))
    lock(m.lock)                        # as register_task! or complete_pending! elsewhere would
    closer = @async close(m)
    yield()                             # close runs until it waits for m.lock
    schedule(closer, InterruptException(); error = true)
    @test_throws Exception wait(closer)
    unlock(m.lock)
    wait(t)
    @test h[1] == 0x08                  # the copy had run when wait returned
    @test !isopen(m) && m.destroyed[]
end

@testset "a manager collected while a copy into host memory is queued keeps the array" begin
    m = KmmManager(; backend = :host)
    x = KmmArray{UInt8}(undef, 256 * 2^20; manager = m)
    fill!(x, 0x07)                      # the copy below queues behind this fill
    h = Vector{UInt8}(undef, length(x))
    task = copyto_async!(h, x)
    if !Kmm.isdone(task)
        finalize(m)                     # as a collection would: the copy is still queued
        @test isopen(m)                 # so the manager (and the host array) stay
    end
    wait(task)
    @test h[1] == 0x07 && h[end] == 0x07
    finalize(m)                         # nothing queued now: the manager goes
    @test !isopen(m)
end
