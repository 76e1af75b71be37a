# Docs: every exported name has a docstring, the API page names it, and the ```julia blocks of
# docs/julia*.md run (a block whose first line is `# not run` is skipped: it needs CUDA.jl).

# Base.Docs.hasdoc is newer than Julia 1.5
has_docstring(m, name) = haskey(Base.Docs.meta(m), Base.Docs.Binding(m, name))

@testset "docstrings" begin
    for name in names(Kmm)
        name == :Kmm && continue
        @test has_docstring(Kmm, name) || (@warn "no docstring" name; false)
    end
    for name in (:synchronize, :stream, :default_manager, :unsafe_free!, :allowscalar,
                 Symbol("@allowscalar"), :libkmm_path, :libkmm_source, :memory_stats, :isdone,
                 :check_abi_version, :version, :backend, :manager, :kind, :isfreed)
        @test has_docstring(Kmm, name) || (@warn "no docstring" name; false)
    end
end

docsdir = joinpath(ROOT, "docs")
pages = filter(f -> startswith(f, "julia") && endswith(f, ".md"), readdir(docsdir))
@test length(pages) >= 4

@testset "the API page names every exported name" begin
    api = read(joinpath(docsdir, "julia-api.md"), String)
    for name in names(Kmm)
        name == :Kmm && continue
        @test occursin(string(name), api) || (@warn "not in docs/julia-api.md" name; false)
    end
end

function julia_blocks(text)
    blocks = String[]
    for m in eachmatch(r"```julia\n(.*?)```"s, text)
        code = m[1]
        startswith(code, "# not run") || push!(blocks, code)
    end
    blocks
end

@testset "examples in $page" for page in pages
    for (i, code) in enumerate(julia_blocks(read(joinpath(docsdir, page), String)))
        mod = Module(Symbol("DocExample", i))
        Core.eval(mod, :(using Kmm, Test))
        ok = try
            include_string(mod, code, "$page block $i")
            true
        catch err
            @error "doc example failed" page i exception = (err, catch_backtrace())
            false
        end
        @test ok
    end
end
