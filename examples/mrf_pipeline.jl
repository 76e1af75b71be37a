### A Pluto.jl notebook ###
# v0.19.46

using Markdown
using InteractiveUtils

# ╔═╡ 6f7f51fd-c927-4c40-acec-821418247b0a
md"""
# MR fingerprinting with Kmm

A numerical brain phantom is "scanned" with a 1000-TR FISP fingerprinting sequence, a
dictionary over a log-spaced T1 x T2 grid is simulated and matched with `Kmm.QMRI`, and the
estimated T1, T2 and PD maps are compared with the truth (error table, SVG figures).

Runs in Pluto or as a script: `julia --project=. examples/mrf_pipeline.jl`. Sizes and the output
folder come from environment variables: `KMM_MRF_N` (phantom N x N, default 64),
`KMM_MRF_NTR` (TRs, 1000), `KMM_MRF_NT1` / `KMM_MRF_NT2` (grid sizes, 100 each),
`KMM_MRF_NOISE` (noise σ relative to the mean signal magnitude, 0.2), `KMM_MRF_RANK` (SVD
compression rank of the match, 0 = none; default 30 on the host backend, 0 on CUDA),
`KMM_MRF_OUTPUT` (default `examples/output`).
All the heavy work (simulation, matching) runs in libkmm: CUDA kernels on a GPU, the CPU
reference on the host backend.
"""

# ╔═╡ 9ab44a8b-d74f-4d24-bd45-bece22e84bb0
begin
	# Use this repository's Kmm when the notebook is not run with --project=.
	if Base.active_project() != joinpath(dirname(@__DIR__), "Project.toml")
		import Pkg
		Pkg.activate(dirname(@__DIR__))
	end
	using Kmm
	const QMRI = Kmm.QMRI
end

# ╔═╡ 6748b3e0-917d-424d-ac53-5dd46e59675b
begin
	envint(name, default) = parse(Int, get(ENV, name, string(default)))
	envfloat(name, default) = parse(Float64, get(ENV, name, string(default)))
	N = envint("KMM_MRF_N", 64)            # phantom of N x N voxels
	NTR = envint("KMM_MRF_NTR", 1000)      # TRs of the fingerprinting train
	NT1 = envint("KMM_MRF_NT1", 100)       # T1 values of the dictionary grid
	NT2 = envint("KMM_MRF_NT2", 100)       # T2 values of the dictionary grid
	NOISE = envfloat("KMM_MRF_NOISE", 0.2) # noise σ / mean |signal|
	OUTDIR = get(ENV, "KMM_MRF_OUTPUT", joinpath(@__DIR__, "output"))
	mgr = Kmm.default_manager()
	# SVD compression of the match (0: none). On the host it halves the match time with the
	# same error table; on CUDA the uncompressed match (cuBLAS) is already fast.
	RANK = min(NTR, envint("KMM_MRF_RANK", Kmm.backend(mgr) == :host ? 30 : 0))
	println("MRF pipeline: phantom $(N)x$(N), $NTR TRs, dictionary grid $NT1 T1 x $NT2 T2, ",
	        "noise $NOISE, match rank $(RANK == 0 ? "full" : RANK), backend $(Kmm.backend(mgr)), ",
	        "$(Threads.nthreads()) Julia thread(s)")
	println("libkmm ", Kmm.version(), " from ", Kmm.libkmm_path())
end

# ╔═╡ 3bdd0f9a-3628-4311-b94c-d7ffe662aa2a
md"""
## The phantom

Five tissue classes with literature-like values at 1.5 T (seconds; PD relative). A head
ellipse: a fat (scalp) ring, grey matter, white matter inside, and two CSF ventricles. The
proton density carries a smooth phase, as coil sensitivities would.
"""

# ╔═╡ dce30a54-8bac-4c24-8612-41d7d8f27e15
begin
	# name, T1 (s), T2 (s), PD
	TISSUES = [("background", 0.0, 0.0, 0.0),
	           ("CSF", 4.0, 2.0, 1.0),
	           ("grey matter", 1.10, 0.100, 0.80),
	           ("white matter", 0.78, 0.065, 0.65),
	           ("fat", 0.35, 0.080, 0.90)]
	inellipse(x, y, cx, cy, a, b) = ((x - cx) / a)^2 + ((y - cy) / b)^2 <= 1
	function phantom_labels(n)
		lab = ones(Int, n, n)    # 1 = background; rows are y (down), columns x
		for j in 1:n, i in 1:n
			x = 2 * (j - 0.5) / n - 1
			y = 2 * (i - 0.5) / n - 1
			if inellipse(x, y, 0, 0, 0.80, 0.92)
				lab[i, j] = 5                                    # fat ring
				inellipse(x, y, 0, 0, 0.72, 0.84) && (lab[i, j] = 3)  # grey matter
				inellipse(x, y, 0, 0.02, 0.58, 0.70) && (lab[i, j] = 4)  # white matter
				(inellipse(x, y, -0.17, -0.05, 0.09, 0.28) ||
				 inellipse(x, y, 0.17, -0.05, 0.09, 0.28)) && (lab[i, j] = 2)  # CSF
			end
		end
		lab
	end
	labels = phantom_labels(N)
	true_T1 = [TISSUES[l][2] for l in labels]
	true_T2 = [TISSUES[l][3] for l in labels]
	true_PD = [TISSUES[labels[i, j]][4] * cis(0.6 * ((j - N / 2) + (i - N / 2)) / N)
	           for i in 1:N, j in 1:N]
	mask = labels .!= 1
	println("phantom: ", join(["$(TISSUES[k][1]) $(count(==(k), labels))" for k in 1:5], ", "),
	        " voxels")
end

# ╔═╡ 5cf4c10d-30ed-418e-a0ec-bd07a6821b60
md"""
## The sequence

FISP with an adiabatic inversion (TI = 20 ms before the first pulse), TR = 10 ms, TE = 5 ms, and
a smooth flip-angle train of four half-sine lobes (peaks 60°, 40°, 70°, 30° on a 5° floor), as
in the MRF-FISP papers. EPG with 24 states.
"""

# ╔═╡ 6bbc7581-3cca-4de9-843d-37685be5aeb3
begin
	function flip_train(ntr)
		peaks = (60.0, 40.0, 70.0, 30.0)
		seg = ntr / 4
		Float32[deg2rad(5 + peaks[min(4, floor(Int, (n - 1) / seg) + 1)] *
		                    sin(pi * mod(n - 1, seg) / seg)) for n in 1:ntr]
	end
	seq = QMRI.FISPSequence(flip_train(NTR); TR = 0.010, TE = 0.005, TI = 0.020, Ns = 24)
	println(seq, "; flip angles ", round(rad2deg(minimum(seq.flip_angles)); digits = 1), "° to ",
	        round(rad2deg(maximum(seq.flip_angles)); digits = 1), "°")
end

# ╔═╡ beb7c5ac-6dc7-4b1a-913c-21082fd49b14
md"""
## Measured signals

The fingerprint of each tissue is simulated with `QMRI.simulate_fisp`; a voxel's measured
signal is its PD times its tissue's fingerprint plus complex Gaussian noise. Only the voxels
inside the head are matched.
"""

# ╔═╡ 3e2fdece-9aa1-4b02-943b-7e4009d3456c
begin
	# A small deterministic Gaussian generator (xorshift64* + Box-Muller), no packages needed.
	mutable struct Gauss
		s::UInt64
	end
	function uniform!(g::Gauss)
		g.s ⊻= g.s >> 12; g.s ⊻= g.s << 25; g.s ⊻= g.s >> 27
		((g.s * 0x2545f4914f6cdd1d) >> 11) / 2.0^53
	end
	gauss(g::Gauss) = sqrt(-2 * log(1 - uniform!(g))) * cospi(2 * uniform!(g))

	# measured[:, k] = PD * fingerprint of the tissue + complex Gaussian noise of σ
	function measure(fingerprints, voxels, noise, seed)
		clean = Matrix{ComplexF32}(undef, NTR, length(voxels))
		for (k, v) in enumerate(voxels)
			clean[:, k] = true_PD[v] .* view(fingerprints, :, labels[v] - 1)
		end
		σ = noise * sum(abs, clean) / length(clean)
		rng = Gauss(seed)
		for i in eachindex(clean)
			clean[i] += σ / sqrt(2) * complex(gauss(rng), gauss(rng))
		end
		clean, σ
	end
	t_signals = @elapsed begin
		tissue_params = QMRI.tissue_parameters([t[2] for t in TISSUES[2:end]],
		                                       [t[3] for t in TISSUES[2:end]]; manager = mgr)
		fingerprints = Array(QMRI.simulate_fisp(seq, tissue_params))   # NTR x 4
		voxels = findall(vec(mask))
		measured, sigma = measure(fingerprints, voxels, NOISE, 0x9e3779b97f4a7c15)
		signals = KmmArray(measured; manager = mgr)
	end
	println("signals: $(length(voxels)) voxels x $NTR TRs, noise σ = ",
	        round(sigma; sigdigits = 3), " (", round(t_signals; digits = 2), " s)")
end

# ╔═╡ 0348e0d8-306d-44d7-a117-b7210511d9f4
md"""
## Dictionary and matching

The dictionary spans log-spaced T1 (0.1 to 5 s) and T2 (10 ms to 3 s) values with T2 ≤ T1.
`QMRI.match(seq, params, signals)` simulates it and matches it in batches chosen from the free
device memory (the running best per voxel is kept between batches), so dictionaries larger
than the device work the same way.
"""

# ╔═╡ e34c8cb3-5443-468e-aec0-d1514f9fa2b0
begin
	params = QMRI.parameter_grid(T1 = (0.1, 5.0, NT1), T2 = (0.01, 3.0, NT2), manager = mgr)
	natoms = size(params, 2)
	t_match = @elapsed begin
		maps = QMRI.match(seq, params, signals; rank = RANK, timings = true)
		Kmm.synchronize(mgr)
	end
	println("dictionary: $natoms atoms ($(round(8 * NTR * natoms / 2^20; digits = 1)) MiB) ",
	        "simulated and matched against $(length(voxels)) voxels in $(maps.batches) batch(es): ",
	        round(t_match; digits = 2), " s (simulation ", round(maps.seconds[:simulate]; digits = 2),
	        " s, matching ", round(maps.seconds[:match]; digits = 2), " s)")
end

# ╔═╡ 31ef1233-b628-4ced-93ed-1e1efb0b842e
begin
	# Back to images (NaN outside the head).
	function to_image(v)
		img = fill(NaN, N, N)
		img[voxels] = v
		img
	end
	est_T1 = to_image(Array(maps.T1))
	est_T2 = to_image(Array(maps.T2))
	est_PD = to_image(abs.(Array(maps.PD)))
	score = to_image(Array(maps.score))
	nan_outside(a) = ifelse.(mask, Float64.(a), NaN)
	ref_T1, ref_T2, ref_PD = nan_outside(true_T1), nan_outside(true_T2), nan_outside(abs.(true_PD))
	println("mean match score ", round(sum(Array(maps.score)) / length(voxels); digits = 4))
end

# ╔═╡ ccdec7fd-5a36-43f3-a0e6-3ec32c8b51cc
md"""
## Errors per tissue

True value, mean ± standard deviation of the estimates over the tissue's voxels, and the
relative error of the mean.
"""

# ╔═╡ 6e9d260e-6983-4560-a55c-ade0f0152c50
begin
	function stats(est, k)
		v = est[labels .== k]
		m = sum(v) / length(v)
		(m, sqrt(sum(abs2, v .- m) / max(1, length(v) - 1)))
	end
	fmt(x) = x >= 10 ? string(round(x; digits = 1)) : string(round(x; sigdigits = 3))
	function error_table()
		io = IOBuffer()
		println(io, rpad("tissue", 13), rpad("T1 true", 9), rpad("T1 est (s)", 19), rpad("err", 8),
		        rpad("T2 true", 9), rpad("T2 est (s)", 19), rpad("err", 8),
		        rpad("PD true", 9), rpad("|PD| est", 19), "err")
		for k in 2:length(TISSUES)
			name, t1, t2, pd = TISSUES[k]
			print(io, rpad(name, 13))
			for (tv, est) in ((t1, est_T1), (t2, est_T2), (pd, est_PD))
				m, s = stats(est, k)
				print(io, rpad(fmt(tv), 9), rpad(fmt(m) * " ± " * fmt(s), 19),
				      rpad(string(round(100 * (m - tv) / tv; digits = 1)) * "%", 8))
			end
			println(io)
		end
		String(take!(io))
	end
	table = error_table()
	print(table)
end

# ╔═╡ 150ec5cd-feea-4f02-89c3-1f0daea4dba9
md"""
## Maps

One SVG figure per quantity, drawn by `examples/figures.jl`: the true map (left) and the
estimate (right) on one colour scale (viridis; light grey outside the head), a colour bar with
ticks in ms for T1 and T2 (logarithmic, like the dictionary grid) and in arbitrary units for
|PD| (linear), the true and estimated value of each tissue, and the settings of the run. Each
scale holds every value of both maps, CSF included.
"""

# ╔═╡ cd12063a-220d-4954-92c4-23454b244408
begin
	include(joinpath(@__DIR__, "figures.jl"))    # module MapFigures
	ms(t) = round(1000 * t; digits = 1)
	settings = ["Phantom $(N)×$(N) (background, CSF, grey matter, white matter, fat); FISP, $NTR TRs, " *
	            "TR $(ms(seq.TR)) ms, TE $(ms(seq.TE)) ms, TI $(ms(seq.TI)) ms; noise σ = $NOISE × mean |signal|.",
	            "Dictionary $NT1 T1 × $NT2 T2, log-spaced (T1 0.1–5 s, T2 0.01–3 s; $natoms atoms); match " *
	            (RANK == 0 ? "exact (full rank)" : "SVD rank $RANK") * "; backend $(Kmm.backend(mgr)); " *
	            "mean match score $(round(sum(Array(maps.score)) / length(voxels); digits = 4))."]
	fmt3(x) = abs(x) >= 100 ? string(round(Int, x)) : string(round(x; sigdigits = 3))
	# true value and mean ± sd of the estimate per tissue; `column` of TISSUES, times `factor`
	function tissue_rows(est, column, factor, unit)
		rows = [["tissue", "true ($unit)", "estimated ($unit), mean ± sd"]]
		for k in 2:length(TISSUES)
			m, s = stats(est, k)
			push!(rows, [TISSUES[k][1], fmt3(factor * TISSUES[k][column]),
			             fmt3(factor * m) * " ± " * fmt3(factor * s)])
		end
		rows
	end
	function map_figure(name, title, quantity, unit, factor, truth, est, column, scale)
		MapFigures.write_map_figure(joinpath(OUTDIR, "$(name)_true_vs_estimated.svg"),
		                            [("true", factor .* truth), ("estimated", factor .* est)];
		                            title = title, quantity = quantity, unit = unit, scale = scale,
		                            low = scale === :linear ? 0 : nothing, caption = settings,
		                            no_value = "outside the head (not matched)",
		                            table = tissue_rows(est, column, factor, unit))
	end
	figures = [map_figure("T1", "T1 map, true and estimated", "T1", "ms", 1000, ref_T1, est_T1, 2, :log),
	           map_figure("T2", "T2 map, true and estimated", "T2", "ms", 1000, ref_T2, est_T2, 3, :log),
	           map_figure("PD", "Proton density |PD|, true and estimated", "|PD|", "a.u.", 1, ref_PD,
	                      est_PD, 4, :linear)]
	write(joinpath(OUTDIR, "errors.txt"), table)
	println("maps (true | estimated; SVG with colour bars: T1 and T2 in ms on log scales, |PD| in a.u.):")
	foreach(p -> println("  ", p, " (", round(filesize(p) / 1024; digits = 1), " KiB)"), figures)
	println("error table: ", joinpath(OUTDIR, "errors.txt"))
	println("timings: signals ", round(t_signals; digits = 2), " s, dictionary simulation ",
	        round(maps.seconds[:simulate]; digits = 2), " s, matching ",
	        round(maps.seconds[:match]; digits = 2), " s, all of it ", round(t_match; digits = 2), " s")
	println(Kmm.memory_status(mgr))
end

# ╔═╡ Cell order:
# ╟─6f7f51fd-c927-4c40-acec-821418247b0a
# ╠═9ab44a8b-d74f-4d24-bd45-bece22e84bb0
# ╠═6748b3e0-917d-424d-ac53-5dd46e59675b
# ╟─3bdd0f9a-3628-4311-b94c-d7ffe662aa2a
# ╠═dce30a54-8bac-4c24-8612-41d7d8f27e15
# ╟─5cf4c10d-30ed-418e-a0ec-bd07a6821b60
# ╠═6bbc7581-3cca-4de9-843d-37685be5aeb3
# ╟─beb7c5ac-6dc7-4b1a-913c-21082fd49b14
# ╠═3e2fdece-9aa1-4b02-943b-7e4009d3456c
# ╟─0348e0d8-306d-44d7-a117-b7210511d9f4
# ╠═e34c8cb3-5443-468e-aec0-d1514f9fa2b0
# ╠═31ef1233-b628-4ced-93ed-1e1efb0b842e
# ╟─ccdec7fd-5a36-43f3-a0e6-3ec32c8b51cc
# ╠═6e9d260e-6983-4560-a55c-ade0f0152c50
# ╟─150ec5cd-feea-4f02-89c3-1f0daea4dba9
# ╠═cd12063a-220d-4954-92c4-23454b244408
