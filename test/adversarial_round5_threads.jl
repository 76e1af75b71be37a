# Round 5 of the adversarial tests, the part that needs several threads (see
# adversarial_round5.jl, which runs it here or in a child with JULIA_NUM_THREADS=2).

@testset "a synchronize on another thread never completes a copy task queued after its wait" begin
    # synchronize finished every pending task, also one another thread queued after its own
    # stream wait: wait(t) then returned before the copy had run (27 of 3,402 waits in 20 s).
    m = KmmManager(backend = :host)
    n = 2^20
    x = KmmArray(fill(1.0, n); manager = m)
    stop = Threads.Atomic{Bool}(false)
    syncer = Threads.@spawn while !stop[]
        Kmm.synchronize(m)
    end
    early, waits, h = 0, 0, zeros(n)
    t0 = time()
    while time() - t0 < 8 && early == 0
        fill!(h, 0.0)
        wait(copyto_async!(h, x))
        waits += 1
        (h[1] == 1.0 && h[end] == 1.0) || (early += 1)
    end
    stop[] = true
    wait(syncer)
    @test early == 0
    @test waits > 0
    close(m)
end
