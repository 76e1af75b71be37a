# Several devices: the host backend stands in for 2 and 4 (KMM_HOST_DEVICES is read once per
# process, so each count runs in a child process); then Distributed scale-out over two workers.

for n in (2, 4)
    local script, code, env, cmd    # names threads.jl also uses at the top level
    script = joinpath(@__DIR__, "devices_body.jl")
    code = "using Test, Kmm; @testset \"$n host devices\" begin include(\"$(escape_string(script))\") end"
    env = merge(Dict(ENV), Dict("KMM_HOST_DEVICES" => string(n), "KMM_BACKEND" => "host"))
    cmd = setenv(`$(Base.julia_cmd()) --project=$(Base.active_project()) --startup-file=no -e $code`, env)
    @test success(pipeline(cmd, stdout = stdout, stderr = stderr))
end

@testset "Distributed" begin include("distributed.jl") end
