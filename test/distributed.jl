# Scale-out over two local Distributed workers on the host backend, each with two stand-in
# devices: simulation and matching split over the workers equal one process's, bad arguments
# are refused, and a worker that fails or dies fails the call while the other frees everything
# it made.
using Distributed
import Random
using Kmm: QMRI

old_devices = get(ENV, "KMM_HOST_DEVICES", nothing)
ENV["KMM_HOST_DEVICES"] = "2"        # the workers' environment (this process keeps its count)
ws = addprocs(2; exeflags = "--project=$(Base.active_project())")
old_devices === nothing ? delete!(ENV, "KMM_HOST_DEVICES") : (ENV["KMM_HOST_DEVICES"] = old_devices)
try
    @everywhere ws using Kmm
    # A call computes on each worker's default managers and frees what it made there.
    in_use(w) = remotecall_fetch(w) do
        sum(Kmm.memory_stats(Kmm.default_manager(d)).in_use for d in 0:Kmm.device_count()-1)
    end

    seq = QMRI.FISPSequence(range(0.1, 1.2; length = 60); TR = 0.01, TE = 0.005, TI = 0.02, Ns = 8)
    p = QMRI.parameter_grid(T1 = (0.2, 3.0, 30), T2 = (0.02, 1.0, 20))    # 519 atoms
    natoms = size(p, 2)
    # Two devices: the host backend's stand-ins in CI, or the GPUs of a machine with two or more.
    ndev = remotecall_fetch(Kmm.device_count, ws[1])
    @test QMRI.worker_devices("test", ws, nothing) == [0, 1 % ndev]    # one host: its devices in turn
    @test QMRI.split_atoms(natoms, 2) == [1:259, 260:519]

    @testset "simulation equals one process's" begin
        one = Array(QMRI.simulate_fisp(seq, p))
        @test Array(QMRI.simulate_fisp(seq, p; workers = ws)) == one
        @test Array(QMRI.simulate_fisp(seq, KmmArray{Float32}(p); workers = ws, devices = [ndev - 1])) == one
        ps = QMRI.PSSFPSequence(fill(0.5, 40); TR = 0.006, rf_shape = fill(0.25, 4), dt_ex = 0.0002,
                                z = [0.0, 0.1], dt_inv = 0.01, dt_pr = 0.0025, gz_ex = 1.0, gz_pr = -0.5)
        @test Array(QMRI.simulate_pssfp(ps, p; workers = ws)) == Array(QMRI.simulate_pssfp(ps, p))
        @test all(in_use(w) == 0 for w in ws)
    end

    dict = Array(QMRI.simulate_fisp(seq, p))
    truth = 1:37:natoms
    signals = reshape(dict[:, truth] .* ComplexF32(0.7 - 0.2im), 60, 3, 5)
    signals[:, 2, 2] .= 0                                       # a voxel that matches nothing
    @testset "matching equals one process's (rank $rank)" for rank in (0, 8)
        one = QMRI.match(seq, p, signals; rank = rank, batch_atoms = 97)
        two = QMRI.match(seq, p, signals; rank = rank, workers = ws, batch_atoms = 50)
        # Bit for bit, but for compressed scores on a GPU: cuBLAS projects each batch with a
        # kernel it picks by the batch's shape, so other batches round the last bits otherwise.
        exact = rank == 0 || Kmm.backend(Kmm.default_manager()) == :host
        for f in (:index, :score, :PD, :pd_normalized, :T1, :T2, :B1, :B0)
            a, b = Array(getfield(one, f)), Array(getfield(two, f))
            @test exact || f in (:index, :T1, :T2, :B1, :B0) ? a == b : isapprox(a, b; rtol = 1e-5)
        end
        @test size(two.index) == (3, 5) && two.natoms == natoms
        @test Array(two.index)[2, 2] == 0
        rank == 0 && @test vec(Array(two.index))[[1:4; 6:15]] == collect(truth)[[1:4; 6:15]]
        @test all(in_use(w) == 0 for w in ws)
    end

    # Round 15: a view with an offset axis matched in one process, but the workers' path
    # converted it with `convert`, a DimensionMismatch.
    @testset "signals in a view with an offset axis reach the workers by position" begin
        padded = [zeros(ComplexF32, 5); signals[:, 1, 1]]
        v = view(padded, Base.IdentityUnitRange(6:65))
        one = QMRI.match(seq, p, signals[:, 1, 1])
        two = QMRI.match(seq, p, v; workers = ws)
        @test Array(two.index) == Array(one.index) && Array(two.score) == Array(one.score)
    end

    @testset "signals reach workers through one shared file, or are fetched" begin
        @everywhere ws using Kmm: QMRI
        sig = reshape(ComplexF32.(1:60*15, -(1:60*15)), 60, 3, 5)
        seen = QMRI.with_shipped_signals(sig) do s, write_file
            @test s.dims == size(sig)
            write_file()                                       # as on_workers does once it sent
            # A worker waits for the file, then maps it (and unmaps it after).
            path, got = remotecall_fetch(ws[1], s) do s
                path = remotecall_fetch(QMRI.shipped_path, s.owner, s.id)
                m = QMRI.map_shared(path, s.dims, s.token)
                got = m === nothing ? nothing : copy(m.signals)
                m === nothing || QMRI.unmap_shared(m)
                (path, got)
            end
            @test isfile(path) && got == sig
            received(s) = remotecall_fetch(x -> QMRI.with_received_signals(copy, x), ws[2], s)
            @test received(s) == sig
            # A worker that cannot map the file (another call's token: another host's file of
            # that name) fetches the array from the caller.
            other = QMRI.ShippedSignals(s.owner, s.id, s.dims, s.token + 1)
            @test QMRI.map_shared(path, s.dims, s.token + 1) === nothing
            @test QMRI.map_shared(path * ".missing", s.dims, s.token) === nothing
            @test received(other) == sig
            # The caller as a worker of its own call: it fetches its own array, which must come
            # back untouched (only what a worker mapped is unmapped).
            @test QMRI.with_received_signals(x -> x === sig, other) && sig[1] == ComplexF32(1, -1)
            path
        end
        @test !isfile(seen) && isempty(QMRI.SHIPPED)            # removed after the call
        path = Ref("")
        err = try
            QMRI.with_shipped_signals(sig) do s, write_file
                write_file()
                path[] = remotecall_fetch(QMRI.shipped_path, s.owner, s.id)
                error("the call failed")
            end
            nothing
        catch e
            e
        end
        @test err isa ErrorException && err.msg == "the call failed"    # the call's own error
        @test !isfile(path[]) && isempty(QMRI.SHIPPED)          # and removed after it
        # The file: this user's alone, in shared memory whatever TMPDIR says, token first.
        f = QMRI.write_shared(sig, UInt128(7))
        @test startswith(f, "/dev/shm/") && filemode(f) & 0o777 == 0o600
        @test read(f, UInt128) == 7 && filesize(f) == QMRI.SHARED_HEADER + sizeof(sig)
        rm(f)
        # Calls go out before the file is written, so that workers start meanwhile.
        log = Symbol[]
        QMRI.on_workers("test", ws, [0, 1], [1:1, 2:2],
                        (i, w) -> (push!(log, :sent); remotecall(myid, w)); sent = () -> push!(log, :write))
        @test log == [:sent, :sent, :write]
        # The token does not draw from the caller's (perhaps seeded) random numbers.
        Random.seed!(3); want = rand()
        Random.seed!(3); QMRI.with_shipped_signals((s, write_file) -> write_file(), sig)
        @test rand() == want
    end

    @testset "bad arguments" begin
        @test_throws ArgumentError QMRI.match(seq, p, signals; workers = Int[])
        @test_throws ArgumentError QMRI.match(seq, p, signals; workers = [ws[1], ws[1]])
        @test_throws ArgumentError QMRI.simulate_fisp(seq, p; workers = [maximum(procs()) + 100])
        @test_throws DimensionMismatch QMRI.match(seq, p, signals[1:50, :, :]; workers = ws)
        bad = Array(p); bad[1, 3] = -1
        @test_throws ArgumentError QMRI.simulate_fisp(seq, bad; workers = ws)
    end

    @testset "a failing worker" begin
        # The second worker is given a device its process does not have.
        err = try QMRI.match(seq, p, signals; workers = ws, devices = [0, 7]); nothing catch e; e end
        @test err isa QMRI.WorkerError && err.worker == ws[2] && err.device == 7 && err.atoms == 260:519
        msg = sprint(showerror, err)
        @test occursin("worker $(ws[2]) (device 7, atoms 260:519) failed", msg) && occursin("device 7", msg)
        @test all(in_use(w) == 0 for w in ws)
        # Workers that fail after allocating (a basis that is not orthonormal: the library turns
        # it away at the first match) free what the call made there at once, not at a later
        # collection (collections are off on the workers meanwhile), and so does the caller.
        @everywhere ws GC.enable(false)
        here = Kmm.memory_stats(Kmm.default_manager()).in_use
        err = try QMRI.match(seq, p, signals; basis = ones(ComplexF32, 60, 3), workers = ws); nothing catch e; e end
        @test err isa QMRI.WorkerError && occursin("orthonormal", sprint(showerror, err))
        @test all(in_use(w) == 0 for w in ws)
        QMRI.match(seq, p, signals; rank = 8, workers = ws)     # the caller computes the basis
        @test all(in_use(w) == 0 for w in ws)
        @test Kmm.memory_stats(Kmm.default_manager()).in_use - here < 2 * 15 * 64   # the maps alone
        @everywhere ws GC.enable(true)
    end

    @testset "a worker that dies" begin
        pid = remotecall_fetch(getpid, ws[2])
        run(`kill -9 $pid`)
        # With the devices given, the dead worker is found by the call itself ...
        err = try QMRI.match(seq, p, signals; workers = ws, devices = [0, 1]); nothing catch e; e end
        @test err isa QMRI.WorkerError && err.worker == ws[2]
        @test occursin("worker $(ws[2]) (device 1, atoms 260:519) died", sprint(showerror, err))
        @test in_use(ws[1]) == 0                                   # the survivor freed everything
        # Distributed has dropped it since: naming it again is an argument error.
        err = try QMRI.simulate_fisp(seq, p; workers = ws); nothing catch e; e end
        @test err isa ArgumentError && occursin("process $(ws[2]) does not exist", err.msg)
        # The survivor alone still gives one process's answer.
        @test Array(QMRI.match(seq, p, signals; workers = ws[1:1]).index) ==
              Array(QMRI.match(seq, p, signals).index)
        @test in_use(ws[1]) == 0
    end
finally
    rmprocs(filter(in(workers()), ws))
end
