# The body of test/threads.jl (needs several threads).
@test Threads.nthreads() > 1
shared = KmmManager(backend = :host)
errors = Threads.Atomic{Int}(0)
Threads.@threads for t in 1:8
    try
        own = KmmManager(backend = :host)
        for i in 1:300
            a = rand(Float32, 100 + i)
            x = KmmArray(a; manager = isodd(i) ? shared : own)
            y = similar(x)
            copyto!(y, x)
            z = KmmArray{Float32}(undef, length(a); manager = Kmm.default_manager())
            copyto!(z, y)                                  # across managers
            Array(z) == a || Threads.atomic_add!(errors, 1)
            i % 3 == 0 && Kmm.unsafe_free!(y)
            i % 50 == 0 && GC.gc(false)                    # finalizers on any thread
        end
        close(own)
    catch err
        Threads.atomic_add!(errors, 1)
        @error "thread task failed" exception = (err, catch_backtrace())
    end
end
@test errors[] == 0
GC.gc(true); GC.gc(true)
Kmm.synchronize(shared)
@test memory_status(shared).device.in_use == 0
@test Kmm.finalizer_failures() == 0
close(shared)

# A copy waiting for its stream while another thread closes the manager: `close` drops the
# handle before libkmm's destroy has drained the stream, so the copy must wait for the destroy,
# not return when it sees no handle (it read stale bytes, and its queued copy wrote into host
# memory after `copyto!` had returned).
@testset "a copy whose manager is closed meanwhile returns after the copy ran" begin
    n = 256 * 2^20
    for trial in 1:4
        m = KmmManager(backend = :host)
        x = KmmArray{UInt8}(undef, n; manager = m)
        for v in 0x01:0x05
            fill!(x, v)                     # queued: keeps the stream busy for a while
        end
        h = zeros(UInt8, 4096)
        closer = Threads.@spawn (t0 = time(); while time() - t0 < 0.02 end; close(m))
        returned = try
            copyto!(h, 1, x, n - 4095, 4096)
            true
        catch err
            err isa KmmError || rethrow()   # a KmmError naming the closed manager is fine too
            false
        end
        seen = h[1]                         # read as soon as copyto! returned
        wait(closer)
        returned && @test seen == 0x05
        @test !isopen(m)
    end
end

# Two threads close one manager at once: exactly one destroys it, the other waits for that
# destroy; neither throws, and a copy task waited for after either close has run (the handle was
# read and zeroed unlocked: the second destroy failed with INVALID_HANDLE and marked the manager
# destroyed while the first still drained its stream).
@testset "two threads closing one manager" begin
    n = 16 * 2^20
    errors = 0
    stale = 0
    for trial in 1:150
        m = KmmManager(backend = :host)
        x = KmmArray{UInt8}(undef, n; manager = m)
        fill!(x, 0x01); fill!(x, 0x02); fill!(x, 0x03)
        h = zeros(UInt8, 4096)
        t = copyto_async!(h, view(x, n-4095:n))
        go = Threads.Atomic{Bool}(false)
        function close_and_wait()
            threw = try close(m); false catch; true end
            wait(t)
            return threw, h[1]
        end
        other = Threads.@spawn (while !go[] end; close_and_wait())
        go[] = true
        for (threw, seen) in (close_and_wait(), fetch(other))
            errors += threw
            stale += seen != 0x03
        end
    end
    @test errors == 0
    @test stale == 0
end
