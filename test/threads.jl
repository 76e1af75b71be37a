# Arrays used from several Julia threads. Run here when Julia has several threads, else in a
# child process with JULIA_NUM_THREADS=4.

if Threads.nthreads() > 1
    @testset "$(Threads.nthreads()) threads" begin include("threads_body.jl") end
else
    include("in_child.jl")
    script = joinpath(@__DIR__, "threads_body.jl")
    test_in_child("using Test, Kmm; @testset \"threads\" begin include(\"$(escape_string(script))\") end"; threads = 4)
end
