# Defects found by an adversarial run against the exported API, one testset each. The races
# need several threads: with one, they run in a child process with JULIA_NUM_THREADS=4.

const ADVERSARIAL_THREADS_ONLY = get(ENV, "KMM_ADVERSARIAL_THREADS_ONLY", "") == "1"

"The error `f()` throws, or `nothing`."
adversarial_error(f) = try f(); nothing catch e; e end

if !ADVERSARIAL_THREADS_ONLY

@testset "reshape refuses dimensions whose product wraps" begin
    # 3 * 6148914691236517206 == 2^64 + 2: compared modulo 2^64 it "equals" a length of 2, and
    # the reshaped array then read and wrote far outside its memory (a PinnedArray segfaulted:
    # Base's ReshapedArray indexes its parent @inbounds).
    wrap = (3, 6148914691236517206)
    m = KmmManager(backend = :host)
    x = KmmArray(collect(1.0:100.0); manager = m)
    v = view(x, 1:2)
    @test_throws DimensionMismatch reshape(v, wrap)
    @test_throws DimensionMismatch reshape(v, (wrap..., :))
    @test_throws DimensionMismatch reshape(x, (2^32, 2^32, 0))
    err = adversarial_error(() -> reshape(v, wrap))
    @test err isa DimensionMismatch && occursin("overflows", sprint(showerror, err))
    p = PinnedArray{UInt8}(undef, 2; manager = m)
    @test_throws DimensionMismatch reshape(p, wrap)
    @test_throws DimensionMismatch reshape(p, (wrap..., :))
    # what still works
    @test Array(reshape(x, 10, 10)) == reshape(1.0:100.0, 10, 10)
    @test size(reshape(x, (4, :))) == (4, 25)
    q = PinnedArray(UInt8[1, 2, 3, 4, 5, 6]; manager = m)
    @test reshape(q, 2, 3) == UInt8[1 3 5; 2 4 6]
    @test reshape(q, (3, :)) == UInt8[1 4; 2 5; 3 6]
    @test_throws DimensionMismatch reshape(q, 4, 2)
    close(m)
end

@testset "arguments outside their C type are a KmmError naming them, not an InexactError" begin
    m = KmmManager(backend = :host)
    for (f, name) in ((() -> trim!(m, -1), "keep_bytes"),
                      (() -> trim!(m, big(2)^64), "keep_bytes"),
                      (() -> Kmm.wait_stream(m, -1), "stream"),
                      (() -> Kmm.signal_stream(m, -5), "stream"),
                      (() -> Kmm.can_access_peer(2^32, 0), "device"),
                      (() -> Kmm.can_access_peer(0, -2^31 - 1), "peer"))
        err = adversarial_error(f)
        @test err isa KmmError
        msg = err === nothing ? "" : sprint(showerror, err)
        @test occursin(name, msg) && occursin("..", msg)
    end
    @test trim!(m, 0) === m && trim!(m, UInt64(1) << 40) === m
    close(m)
end

@testset "trim! and close wait for the stream without blocking the thread" begin
    # Both waited for the stream inside their ccall: no other task of the thread ran (and no
    # other thread could collect garbage) until the queued work had drained.
    for op in (m -> trim!(m), m -> close(m))
        m = KmmManager(backend = :host)
        x = KmmArray{UInt8}(undef, 256 * 2^20; manager = m)
        Kmm.synchronize(m)
        for v in 0x01:0x04
            fill!(x, v)                 # stream-ordered: still running when op starts
        end
        ran = Ref(false)
        t = @async (ran[] = true)
        op(m)
        @test ran[]                     # the other task ran while op waited
        wait(t)
        if isopen(m)
            @test Array(view(x, 1:4)) == fill(0x04, 4)
            close(m)
        end
        @test !isopen(m) && m.destroyed[]
    end
end

@testset "a pinned array of another manager is freed only after the copies queued on it" begin
    # A copy queued on manager A into (or from) a PinnedArray of manager B: B's free of the
    # array, ordered on B's stream only, let B hand the memory out again (or `close(B)` unmap it:
    # a segfault) while A's copy still wrote into it.
    n = 2^20
    corrupted = 0
    for trial in 1:12
        a = KmmManager(backend = :host); b = KmmManager(backend = :host)
        busy = KmmArray{UInt8}(undef, 128 * 2^20; manager = a)
        xa = KmmArray{UInt8}(undef, n; manager = a)
        fill!(xa, 0x11)
        for v in 0x01:0x03
            fill!(busy, v)              # A's stream stays busy for a while
        end
        p = PinnedArray{UInt8}(undef, n; manager = b)
        t = isodd(trial) ? copyto_async!(p, xa) : copyto_async!(xa, p)
        if trial == 1
            Kmm.synchronize(b)          # B's stream now waits for A's copy
            @test Kmm.isdone(t)
        end
        Kmm.unsafe_free!(p)
        qs = [PinnedArray{UInt8}(undef, n; manager = b) for _ in 1:4]   # may reuse p's memory
        foreach(q -> fill!(q, 0xaa), qs)
        wait(t)
        Kmm.synchronize(b)
        corrupted += any(q -> any(!=(0xaa), q), qs)
        close(a); close(b)
    end
    @test corrupted == 0
    # close(B) with A's copy into B's pinned memory still queued waits for the copy (it unmapped
    # the memory under the copy: a segfault, hence a child process).
    code = """
        using Kmm
        for trial in 1:5
            a = KmmManager(backend = :host); b = KmmManager(backend = :host)
            busy = KmmArray{UInt8}(undef, 128 * 2^20; manager = a)
            xa = KmmArray{UInt8}(undef, 2^20; manager = a)
            fill!(xa, 0x22)
            for v in 0x01:0x03
                fill!(busy, v)
            end
            p = PinnedArray{UInt8}(undef, 2^20; manager = b)
            t = copyto_async!(p, xa)
            close(b)
            Kmm.isdone(t) || exit(3)
            wait(t)
            close(a)
        end
        """
    project = normpath(joinpath(@__DIR__, ".."))
    cmd = `$(Base.julia_cmd()) --project=$project --startup-file=no -e $code`
    @test success(pipeline(cmd, stdout = stdout, stderr = stderr))
end

@testset "broadcasts over overlapping views of one buffer copy the source first" begin
    # Views and reshapes are distinct KmmArray values over one storage, and Base's alias check
    # (dataids: each value's own objectid) called them disjoint: the element loop read elements
    # it had already written (x became [1, 10, 100, 1000, 10000, 6]).
    m = KmmManager(backend = :host)
    x = KmmArray(collect(1.0:6.0); manager = m)
    Kmm.@allowscalar view(x, 2:5) .= view(x, 1:4) .* 10
    @test Array(x) == [1, 10, 20, 30, 40, 6]
    y = KmmArray(collect(1.0:6.0); manager = m)
    Kmm.@allowscalar reshape(y, 2, 3) .= reshape(view(y, 1:6), 3, 2)' .* 2   # transposed read
    @test Array(y) == vec(reshape(1.0:6.0, 3, 2)' .* 2)
    @test Base.mightalias(view(x, 2:5), view(x, 1:4))
    @test !Base.mightalias(view(x, 1:3), view(x, 4:6))          # disjoint parts: no copy
    @test !Base.mightalias(x, KmmArray(zeros(6); manager = m))  # other storages never alias
    @test Base.mightalias(x, reshape(x, 2, 3))
    close(m)
end

@testset "log grids and qMRI counts: bounds named, no NaN, no InexactError" begin
    Q = Kmm.QMRI
    # An infinite end gave a grid that began with NaN ((i - 1) * Inf at i = 1), which
    # parameter_grid then reported as "T1 = NaN (value 1 of 3)"; a count past Int was an
    # InexactError; a negative byte budget was taken as one atom per batch.
    for f in (() -> Q.log_grid(1.0, Inf, 3), () -> Q.log_grid(Inf, 1.0, 3))
        err = adversarial_error(f)
        @test err isa ArgumentError && occursin("finite", sprint(showerror, err))
    end
    err = adversarial_error(() -> Q.parameter_grid(T1 = (1.0, Inf, 3), T2 = 0.1))
    @test err isa ArgumentError && occursin("T1", sprint(showerror, err)) &&
          !occursin("NaN", sprint(showerror, err))
    @test adversarial_error(() -> Q.log_grid(1.0, 2.0, 2^62)) isa ArgumentError   # no wrapped allocation
    m = KmmManager(backend = :host)
    seq = Q.FISPSequence(fill(0.3, 20); TR = 0.01, TE = 0.005, TI = 0.02, Ns = 8)
    p = Q.tissue_parameters([1.0, 0.5], [0.1, 0.05]; manager = m)
    sig = reshape(Array(Q.simulate_fisp(seq, p))[:, 1], 20, 1)
    for (f, name) in ((() -> Q.Dictionary(seq, p; block_atoms = big(2)^70), "block_atoms"),
                      (() -> Q.Dictionary(seq, p; block_atoms = 0), "block_atoms"),
                      (() -> Q.match(seq, p, sig; batch_atoms = big(2)^70), "batch_atoms"),
                      (() -> Q.match(seq, p, sig; max_bytes = -1), "max_bytes"),
                      (() -> Q.compression_basis(seq, p; rank = 2, atoms = big(2)^64), "atoms"))
        err = adversarial_error(f)
        @test err isa ArgumentError
        msg = err === nothing ? "" : sprint(showerror, err)
        @test occursin(name, msg) && occursin("..", msg)
    end
    @test Q.match(seq, p, sig; batch_atoms = big(1)).batches == 2
    @test Q.match(Q.Dictionary(seq, p; block_atoms = 1), sig).batches == 2
    close(m)
end

@testset "copies between a pinned array and a manager of another backend" begin
    # Neither backend's stream can wait for the other's (a host stream id is no CUstream): the
    # copy is waited for instead of ordered. Needs CUDA for the second backend.
    cuda = try
        KmmManager(backend = :cuda)
    catch
        nothing
    end
    if cuda === nothing
        @info "copies between a pinned array and a manager of another backend: needs a CUDA device, not run here"
    else
        host = KmmManager(backend = :host)
        p = PinnedArray{Float32}(undef, 2^20; manager = host)
        p .= 1:2^20
        x = KmmArray{Float32}(undef, 2^20; manager = cuda)
        wait(copyto_async!(x, p))
        q = PinnedArray{Float32}(undef, 2^20; manager = host)
        t = copyto_async!(q, x)
        @test Kmm.isdone(t)                     # waited for: no stream ordered it
        @test q == p
        copyto!(p, x)                           # the synchronous copies too
        @test p[end] == 2^20
        close(cuda); close(host)
    end
end

@testset "views take indices past the last dimension as Base does" begin
    # `view(x, :, 2, 3, 1)` of a 3-d array (trailing indices of 1, valid in Base) was refused
    # as not contiguous.
    m = KmmManager(backend = :host)
    A = reshape(collect(1.0:24.0), 2, 3, 4)
    x = KmmArray(A; manager = m)
    for I in ((:, 2, 3, 1), (:, :, 1, 1), (1:2, 1, 1, 1), (:, 2, 3, 1:1), (:, 2, 3, 1, 1:1), (2, 3, 4, 1))
        v = view(x, I...)
        @test size(v) == size(view(A, I...)) && Array(v) == view(A, I...)
    end
    @test_throws BoundsError view(x, :, 2, 3, 2)
    @test_throws BoundsError view(x, 1:2, 1, 1, 0)
    @test_throws ArgumentError view(x, 1, :, 1, 1)       # still not contiguous
    close(m)
end

end # !ADVERSARIAL_THREADS_ONLY


function adversarial_threaded_tests()
    @testset "an allocation that waits for the device inside libkmm lets other threads collect" begin
        # The out-of-memory ladder waits for the stream inside the allocation's ccall; a ccall
        # not marked GC-safe stopped every other thread that needed a collection until then.
        m = KmmManager(backend = :host, pinned_limit = 64 * 2^20, pinned_chunk_size = 64 * 2^20)
        busy = KmmArray{UInt8}(undef, 256 * 2^20; manager = m)
        fill!(busy, 0x00)
        Kmm.synchronize(m)
        samples = 0
        for trial in 1:3
            p = PinnedArray{UInt8}(undef, 64 * 2^20; manager = m)
            for v in 1:40
                fill!(busy, UInt8(v))       # about half a second of work on the stream
            end
            Kmm.unsafe_free!(p)             # its memory comes back once the stream passed the fills
            collected = Threads.Atomic{Float64}(Inf)
            ran_on = Threads.Atomic{Int}(0)
            t0 = time()
            # Busy-waits (a sleep's timer needs the thread that allocates) and then collects.
            g = Threads.@spawn begin
                ran_on[] = Threads.threadid()
                s = time()
                while time() - s < 0.05 end
                GC.gc(false)
                collected[] = time() - t0
            end
            q = PinnedArray{UInt8}(undef, 64 * 2^20; manager = m)  # waits for the stream in libkmm
            returned = time() - t0
            wait(g)
            Kmm.unsafe_free!(q)
            Kmm.synchronize(m)
            # Only a collection on another thread, while the allocation still waited, says anything.
            (ran_on[] != Threads.threadid() && returned > 0.2) || continue
            samples += 1
            @test collected[] < returned - 0.1
        end
        @test samples >= 1
        close(m)
    end

    @testset "a copy task waited for by two tasks, or by a task and synchronize" begin
        # Both finished the task: one destroyed its event while the other still queried it,
        # which threw KMM_ERROR_INVALID_HANDLE ("event ... is not live") out of `wait`.
        m = KmmManager(backend = :host)
        x = KmmArray{UInt8}(undef, 2^16; manager = m)
        fill!(x, 0x03)
        h = zeros(UInt8, 2^16)
        errors = Threads.Atomic{Int}(0)
        stop = Threads.Atomic{Bool}(false)
        syncer = Threads.@spawn while !stop[]
            try
                Kmm.synchronize(m)
            catch
                Threads.atomic_add!(errors, 1)
            end
        end
        t0 = time()
        while time() - t0 < 8           # the race is rare: give it seconds, not a count
            try
                t = copyto_async!(h, x)
                others = [Threads.@spawn wait(t) for _ in 1:3]
                wait(t)
                foreach(wait, others)
                h[1] == 0x03 || Threads.atomic_add!(errors, 1)
            catch
                Threads.atomic_add!(errors, 1)
            end
        end
        stop[] = true
        wait(syncer)
        @test errors[] == 0
        close(m)
    end

    @testset "unsafe_free! racing close never throws" begin
        # The free read the manager's handle, `close` took it and destroyed the manager, and the
        # free failed with KMM_ERROR_INVALID_HANDLE ("manager ... is not live").
        errors = 0
        for trial in 1:1000
            m = KmmManager(backend = :host)
            xs = [KmmArray{UInt8}(undef, 64; manager = m) for _ in 1:256]
            go = Threads.Atomic{Bool}(false)
            t = Threads.@spawn (go[] = true; foreach(Kmm.unsafe_free!, xs))
            while !go[] end
            for _ in 1:(trial % 64) * 8     # land the close at varying points of the frees
                go[] || break                    # (an atomic load: the loop is not optimized away)
            end
            close(m)
            errors += try wait(t); 0 catch; 1 end
            errors += !all(Kmm.isfreed, xs)
        end
        @test errors == 0
    end
end

if Threads.nthreads() > 1
    @testset "adversarial races ($(Threads.nthreads()) threads)" begin adversarial_threaded_tests() end
else
    script = joinpath(@__DIR__, "adversarial.jl")
    code = "using Test, Kmm; @testset \"adversarial races\" begin include(\"$(escape_string(script))\") end"
    env = merge(Dict(ENV), Dict("JULIA_NUM_THREADS" => "4", "KMM_ADVERSARIAL_THREADS_ONLY" => "1"))
    project = normpath(joinpath(@__DIR__, ".."))
    cmd = setenv(`$(Base.julia_cmd()) --project=$project --startup-file=no -e $code`, env)
    @test success(pipeline(cmd, stdout = stdout, stderr = stderr))
end
