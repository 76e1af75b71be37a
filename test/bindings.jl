# src/LibKmm.jl against gen/kmm.h and the library: staleness, symbols, struct layouts.
using Kmm: LibKmm

@testset "generated file is current" begin
    gen = joinpath(ROOT, "gen", "generator.jl")
    cmd = `$(Base.julia_cmd()) --startup-file=no $gen --check`
    @test success(pipeline(cmd, stdout = devnull, stderr = devnull))
    @test startswith(read(joinpath(ROOT, "src", "LibKmm.jl"), String),
                     "# generated from gen/kmm.h by gen/generator.jl; do not edit")
end

# what Kmm.jl itself calls must be in the library; newer functions of the header may be missing
# from an older build and then throw when called
const CORE = filter(f -> occursin(r"^kmm_(version|abi|last|status|buffer|copy|fill|config|manager|event)",
                                  string(f)), collect(LibKmm.FUNCTIONS))

@testset "functions are resolved" begin
    @test length(CORE) >= 30
    for f in CORE
        @test getfield(LibKmm, Symbol("_fp_", f))[] != C_NULL
    end
    @test LibKmm.kmm_abi_version() == LibKmm.KMM_ABI_VERSION
    missing = LibKmm.missing_functions()
    isempty(missing) || @info "functions of gen/kmm.h that this libkmm build lacks" missing
    for f in missing
        err = try getfield(LibKmm, f)(ntuple(_ -> 0, 16)...) catch e e end
        @test err isa KmmError || err isa MethodError
    end
    fp = LibKmm._fp_kmm_fill[]
    try
        LibKmm._fp_kmm_fill[] = C_NULL                     # as in a build that lacks it
        err = try LibKmm.kmm_fill(0, 0, 0, 0, C_NULL, 0) catch e e end
        @test err isa KmmError && occursin("does not export kmm_fill", err.message)
    finally
        LibKmm._fp_kmm_fill[] = fp
    end
end

const STRUCTS = Tuple(filter(T -> T isa DataType && isstructtype(T) && fieldcount(T) > 0 &&
                                  parentmodule(T) === LibKmm,
                             [getfield(LibKmm, n) for n in names(LibKmm, all = true)
                              if isdefined(LibKmm, n)]))
@test length(STRUCTS) >= 4

@testset "struct layout matches C (compiled header)" begin
    cc = Sys.which("cc")
    if cc === nothing
        @info "no C compiler: skipping the compiled layout check"
    else
        mktempdir() do dir
            src = joinpath(dir, "layout.c")
            open(src, "w") do io
                println(io, "#include <stdio.h>\n#include <stddef.h>\n#include \"kmm.h\"\nint main(void){")
                for S in STRUCTS
                    println(io, "printf(\"$(nameof(S)) size %zu\\n\", sizeof($(nameof(S))));")
                    for f in fieldnames(S)
                        println(io, "printf(\"$(nameof(S)) $f %zu\\n\", offsetof($(nameof(S)), $f));")
                    end
                end
                println(io, "return 0;}")
            end
            exe = joinpath(dir, "layout")
            run(`$cc -std=c11 -Wall -Werror -I$(joinpath(ROOT, "gen")) -o $exe $src`)
            lines = split(strip(read(`$exe`, String)), '\n')
            table = Dict(join(split(l)[1:2], " ") => parse(Int, split(l)[3]) for l in lines)
            for S in STRUCTS
                @test table["$(nameof(S)) size"] == sizeof(S)
                for (i, f) in enumerate(fieldnames(S))
                    @test table["$(nameof(S)) $f"] == fieldoffset(S, i)
                end
            end
        end
    end
end

"Calls `f(ptr)` on a buffer of sizeof(S) bytes followed by sentinels; returns (S value, tail)."
function written_by_library(f, ::Type{S}) where {S}
    buf = fill(0xAB, sizeof(S) + 64)
    GC.@preserve buf begin
        f(Ptr{S}(pointer(buf)))
        v = unsafe_load(Ptr{S}(pointer(buf)))
    end
    v, buf[sizeof(S)+1:end]
end

@testset "struct layout matches the library" begin
    cfg, tail = written_by_library(p -> LibKmm.kmm_config_default(p), LibKmm.KmmConfig)
    @test all(==(0xAB), tail)                      # the library writes exactly sizeof bytes
    @test cfg.backend == LibKmm.KMM_BACKEND_AUTO
    @test cfg.device == 0
    @test cfg.alignment == 256                     # documented defaults land on their fields
    @test ispow2(cfg.chunk_size) && cfg.chunk_size >= 2^20     # 8 MiB today
    @test cfg.fixed_block_size == 2^20
    @test cfg.hard_limit == 0
    @test cfg.release_threshold == typemax(UInt64)
    @test cfg.pinned_chunk_size == 32 * 2^20
    @test cfg.staging_chunk_size == 16 * 2^20
    @test cfg.staging_chunks == 4
    @test cfg.compaction_ratio_pct == 108

    m = KmmManager(backend = :host, alloc_mode = :pool, suballocator = :heap)
    info, tail = written_by_library(p -> LibKmm.kmm_manager_info(m.handle, p), LibKmm.KmmManagerInfo)
    @test all(==(0xAB), tail)
    @test info.backend == LibKmm.KMM_BACKEND_HOST
    @test info.suballocator == LibKmm.KMM_SUBALLOC_HEAP
    @test info.alloc_mode == LibKmm.KMM_ALLOC_POOL

    x = KmmArray{UInt8}(undef, 1000; manager = m)
    st, tail = written_by_library(p -> LibKmm.kmm_manager_stats(m.handle, LibKmm.KMM_MEMORY_DEVICE, p),
                                  LibKmm.KmmMemoryStats)
    @test all(==(0xAB), tail)
    @test st.in_use == 1000 && st.live_buffers == 1 && st.allocs == 1 && st.frees == 0
    @test st.compactions == 0 && st.relocated_bytes == 0
    bi, tail = written_by_library(p -> LibKmm.kmm_buffer_info(m.handle, x.storage.handle, p),
                                  LibKmm.KmmBufferInfo)
    @test all(==(0xAB), tail)
    @test bi.bytes == 1000 && bi.kind == LibKmm.KMM_MEMORY_DEVICE && bi.pins == 0
    close(m)
end

@testset "status names and checked/unchecked forms" begin
    @test unsafe_string(LibKmm.kmm_status_name(LibKmm.KMM_ERROR_OUT_OF_MEMORY)) == "KMM_ERROR_OUT_OF_MEMORY"
    out = Ref{UInt64}(0)
    @test LibKmm.unchecked_kmm_buffer_alloc(UInt64(12345), 8, 0, out) == LibKmm.KMM_ERROR_INVALID_HANDLE
    err = try
        LibKmm.kmm_buffer_alloc(UInt64(12345), 8, 0, out); nothing
    catch e
        e
    end
    @test err isa KmmError
    @test err.status == LibKmm.KMM_ERROR_INVALID_HANDLE
    @test err.name == "KMM_ERROR_INVALID_HANDLE"
    @test !isempty(err.message)
    @test occursin("KMM_ERROR_INVALID_HANDLE", sprint(showerror, err))
end
