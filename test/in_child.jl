# Runs Julia code in a child process with `threads` threads (the suite itself may run on one),
# with this repository's project; a @test that the child succeeded.
if !@isdefined(test_in_child)
    function test_in_child(code::AbstractString; threads::Integer)
        env = merge(Dict(ENV), Dict("JULIA_NUM_THREADS" => string(threads)))
        project = normpath(joinpath(@__DIR__, ".."))
        cmd = setenv(`$(Base.julia_cmd()) --project=$project --startup-file=no -e $code`, env)
        @test success(pipeline(cmd, stdout = stdout, stderr = stderr))
    end
end
