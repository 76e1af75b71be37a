# Finding libkmm and the ABI check.
using Kmm: LibKmm

@test isfile(Kmm.libkmm_path())
@test Kmm.libkmm_source() in (:env, :local, :artifact)
@test Kmm.version() isa VersionNumber

@testset "ABI version check" begin
    @test Kmm.check_abi_version(LibKmm.KMM_ABI_VERSION) === nothing
    @test_throws Kmm.KmmLibraryError Kmm.check_abi_version(LibKmm.KMM_ABI_VERSION + 1)
    err = try
        Kmm.check_abi_version(999; path = "/fake/libkmm.so"); nothing
    catch e
        e
    end
    msg = sprint(showerror, err)
    @test occursin("ABI version 999", msg) && occursin("need ABI version $(LibKmm.KMM_ABI_VERSION)", msg)
    @test occursin("/fake/libkmm.so", msg)
end

julia = Base.julia_cmd()
with_env(cmd, pairs...) = setenv(cmd, merge(Dict(ENV), Dict(pairs...)))   # addenv needs 1.6
project = "--project=$ROOT"

@testset "KMM_LIBRARY chooses the library" begin
    code = "using Kmm; print(Kmm.libkmm_source(), \" \", Kmm.libkmm_path())"
    out = read(with_env(`$julia $project --startup-file=no -e $code`,
                      "KMM_LIBRARY" => Kmm.libkmm_path()), String)
    @test out == "env $(Kmm.libkmm_path())"
    # a missing file is a clear load error
    p = run(pipeline(ignorestatus(with_env(`$julia $project --startup-file=no -e "using Kmm"`,
                                         "KMM_LIBRARY" => "/nonexistent/libkmm.so")),
                     stdout = devnull, stderr = (errbuf = IOBuffer())))
    @test !success(p)
    @test occursin("KMM_LIBRARY=/nonexistent/libkmm.so is not a file", String(take!(errbuf)))
end

@testset "a library of another ABI version is refused at load" begin
    cc = Sys.which("cc")
    if cc === nothing
        @info "no C compiler: skipping the fake-library load test"
    else
        mktempdir() do dir
            src = joinpath(dir, "fake.c")
            write(src, """
                #include <stdint.h>
                uint32_t kmm_abi_version(void) { return 999; }
                const char *kmm_version(void) { return "0.0.0-fake"; }
                """)
            lib = joinpath(dir, "libkmm_fake." * Kmm.Libdl.dlext)
            run(`$cc -shared -fPIC -o $lib $src`)
            p = run(pipeline(ignorestatus(with_env(`$julia $project --startup-file=no -e "using Kmm"`,
                                                   "KMM_LIBRARY" => lib)),
                             stdout = devnull, stderr = (errbuf = IOBuffer())))
            @test !success(p)
            msg = String(take!(errbuf))
            @test occursin("KmmLibraryError", msg)
            @test occursin("has ABI version 999", msg)
            @test occursin("need ABI version $(LibKmm.KMM_ABI_VERSION)", msg)
        end
    end
end

@testset "the search order" begin
    @test Kmm.local_build_paths()[1] == joinpath(ROOT, "rust", "target", "release", Kmm.LIBNAME)
    # the Artifacts.toml entry parses; the artifact is absent until a release fills it in
    @test Kmm.artifact_library() === nothing || isfile(Kmm.artifact_library())
end
