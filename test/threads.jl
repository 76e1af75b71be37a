# Arrays used from several Julia threads. Run here when Julia has several threads, else in a
# child process with JULIA_NUM_THREADS=4.

if Threads.nthreads() > 1
    @testset "$(Threads.nthreads()) threads" begin include("threads_body.jl") end
else
    script = joinpath(@__DIR__, "threads_body.jl")
    code = "using Test, Kmm; @testset \"threads\" begin include(\"$(escape_string(script))\") end"
    env = merge(Dict(ENV), Dict("JULIA_NUM_THREADS" => "4"))
    cmd = setenv(`$(Base.julia_cmd()) --project=$ROOT --startup-file=no -e $code`, env)
    @test success(pipeline(cmd, stdout = stdout, stderr = stderr))
end
