# Scale-out of generate-and-match over Distributed workers, one per device, against one
# process on one device, in the same run: `julia --project=. bench/julia_devices.jl [NVOX [NT1]]`
# (NT1 T1 values by 0.58 NT1 T2 values: NT1 = 450 gives 94,500 atoms).
# Prints the times, the speed-up and whether the maps are identical. On a machine with two
# GPUs the workers take devices 0 and 1; on the host backend set KMM_HOST_DEVICES=2.
using Distributed, Printf
nvox = length(ARGS) >= 1 ? parse(Int, ARGS[1]) : 16384
nt1 = length(ARGS) >= 2 ? parse(Int, ARGS[2]) : 450
ws = addprocs(2; exeflags = "--project=$(Base.active_project())")
@everywhere using Kmm
using Kmm: QMRI

seq = QMRI.FISPSequence([0.02 + 1.05 * abs(sin(n / 160 * pi)) for n in 0:999]; TR = 0.0087, TE = 0.0035,
                        TI = 0.0204, Ns = 32)
p = Array(QMRI.parameter_grid(T1 = (0.1, 5.0, nt1), T2 = (0.005, 2.0, round(Int, 0.58 * nt1))))
natoms = size(p, 2)
dict = QMRI.simulate_fisp(seq, p[:, 1:7:natoms])
signals = Array(dict)[:, 1:min(nvox, size(dict, 2))]
signals = repeat(signals, 1, cld(nvox, size(signals, 2)))[:, 1:nvox] .* ComplexF32(0.8 + 0.1im)
Kmm.unsafe_free!(dict)
m = Kmm.default_manager(0)
println("# Kmm Distributed scale-out on ", Kmm.device_count(), " x ", Kmm.backend(m), " devices, ",
        natoms, " atoms x ", length(seq), " TRs against ", nvox, " voxels")
one(; kw...) = (r = QMRI.match(seq, p, signals; kw...); Kmm.synchronize(Kmm.manager(r.index)); r)
one(); one(workers = ws)                                    # compile on every process
t1 = minimum(@elapsed(one()) for _ in 1:3)
t2 = minimum(@elapsed(one(workers = ws)) for _ in 1:3)
r1, r2 = one(), one(workers = ws)
same = Array(r1.index) == Array(r2.index) && Array(r1.score) == Array(r2.score) && Array(r1.PD) == Array(r2.PD)
@printf("| generate and match, one process, device 0 | %.1f ms |\n", 1e3 * t1)
@printf("| generate and match, 2 workers, devices 0 and 1 | %.1f ms |\n", 1e3 * t2)
@printf("| speed-up | %.2fx (target >= 1.8x) |\n", t1 / t2)
println("| maps identical to one process's | ", same, " |")
# Where the two-worker call's time goes: the slowest worker's simulation and matching (a call
# with timings, each step waited for) against the best untimed call; the rest is the signals
# reaching the workers, the maps coming back and the reduction.
rt = one(workers = ws, timings = true)
busy = get(rt.seconds, :simulate, 0.0) + get(rt.seconds, :match, 0.0)
@printf("| 2 workers: the slowest worker simulating and matching | %.1f ms; the rest of the call %.1f ms |\n",
        1e3 * busy, 1e3 * (t2 - busy))
rmprocs(ws)
