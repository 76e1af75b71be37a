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
