# Kmm.jl tests. Run with `julia --project=. test/runtests.jl` (or `Pkg.test()`).
# They run on the host backend when no GPU is present (KMM_BACKEND unset or =host).
using Test
using Kmm

const ROOT = normpath(joinpath(@__DIR__, ".."))

println("Kmm.jl tests: libkmm ", Kmm.version(), " from ", Kmm.libkmm_path(),
        " (", Kmm.libkmm_source(), "), backend ", Kmm.backend(Kmm.default_manager()),
        ", Julia ", VERSION, ", ", Threads.nthreads(), " thread(s)")

@testset "Kmm.jl" begin
    @testset "bindings" begin include("bindings.jl") end
    @testset "library" begin include("library.jl") end
    @testset "manager" begin include("manager.jl") end
    @testset "arrays" begin include("array.jl") end
    @testset "views and reshapes" begin include("views.jl") end
    @testset "copies" begin include("copies.jl") end
    @testset "scalar indexing" begin include("scalar.jl") end
    @testset "pinned and async" begin include("pinned.jl") end
    @testset "errors" begin include("errors.jl") end
    @testset "safety" begin include("safety.jl") end
    @testset "adversarial" begin include("adversarial.jl") end
    @testset "adversarial, third run" begin include("adversarial_round3.jl") end
    @testset "adversarial, fourth run (qMRI)" begin include("adversarial_round4_qmri.jl") end
    @testset "adversarial, fourth run" begin include("adversarial_round4.jl") end
    @testset "adversarial, fifth run" begin include("adversarial_round5.jl") end
    @testset "adversarial, sixth run" begin include("adversarial_round6.jl") end
    @testset "adversarial, eighth run" begin include("adversarial_round8.jl") end
    @testset "adversarial, ninth run" begin include("adversarial_round9.jl") end
    @testset "adversarial, tenth run" begin include("adversarial_round10.jl") end
    @testset "adversarial, eleventh run" begin include("adversarial_round11.jl") end
    @testset "adversarial, twelfth run" begin include("adversarial_round12.jl") end
    @testset "adversarial, thirteenth run" begin include("adversarial_round13.jl") end
    @testset "adversarial, fourteenth run" begin include("adversarial_round14.jl") end
    @testset "adversarial, fifteenth run" begin include("adversarial_round15.jl") end
    @testset "adversarial, fifteenth run (qMRI)" begin include("adversarial_round15_qmri.jl") end
    @testset "review of session 14 (two threads, in a child)" begin
        include("in_child.jl")
        test_in_child("include($(repr(joinpath(@__DIR__, "review_s14.jl"))))"; threads = 2)
    end
    @testset "garbage collection" begin include("gc.jl") end
    @testset "out of memory" begin include("oom.jl") end
    @testset "traces, maps and figures" begin include("observe.jl") end
    @testset "spill to host" begin include("spill.jl") end
    @testset "threads" begin include("threads.jl") end
    @testset "GC stress" begin include("gc_stress.jl") end
    @testset "CUDA.jl extension (stand-ins)" begin include("ext.jl") end
    @testset "docs" begin include("docs.jl") end
    @testset "qMRI" begin include("qmri.jl") end
    @testset "qMRI parameter grids" begin include("parameters.jl") end
    @testset "devices and Distributed" begin include("devices.jl") end
    @testset "no method ambiguities" begin
        @test isempty(Test.detect_ambiguities(Kmm; imported = true, recursive = true))
    end
end
