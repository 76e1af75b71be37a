# Docs: every exported name has a docstring, the API page names it, and the ```julia blocks of
# README.md and docs/*.md run. A block is skipped only when the line above its fence is a marker
# `<!-- gpu: what it needs -->` or `<!-- no-run: why -->` (the markers tools/run_doc_blocks.py
# reads too; it runs the python and sh blocks).

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
pages = vcat("README.md", ["docs/" * f for f in readdir(docsdir) if endswith(f, ".md")])
@test length(pages) >= 8

@testset "the API page names every exported name" begin
    api = read(joinpath(docsdir, "julia-api.md"), String)
    for name in names(Kmm)
        name == :Kmm && continue
        @test occursin(string(name), api) || (@warn "not in docs/julia-api.md" name; false)
    end
end

const DOC_MARKER = r"^<!--\s*(gpu|no-run)\s*:\s*(.*?)\s*-->\s*$"

"The ```julia blocks of a page: (line of the fence, code, marker or nothing, reason)."
function julia_blocks(text)
    lines = split(text, '\n')
    blocks = []
    i = 1
    while i <= length(lines)
        if startswith(lines[i], "```")
            j = findnext(l -> rstrip(l) == "```", lines, i + 1)
            j === nothing && error("a block opened at line $i never closes")
            if rstrip(lines[i]) == "```julia"
                m = i > 1 ? match(DOC_MARKER, lines[i - 1]) : nothing
                push!(blocks, (i, join(lines[i+1:j-1], '\n'), m === nothing ? nothing : m[1],
                               m === nothing ? "" : m[2]))
            end
            i = j + 1
        else
            i += 1
        end
    end
    blocks
end

doc_blocks = Dict(page => julia_blocks(read(joinpath(ROOT, page), String)) for page in pages)
@test sum(length, values(doc_blocks)) >= 15

@testset "examples in $page" for page in pages
    for (line, code, marker, reason) in doc_blocks[page]
        if marker !== nothing
            @test !isempty(reason)              # a skipped block says why
            continue
        end
        mod = Module(Symbol("DocExample", line))
        Core.eval(mod, :(using Kmm, Test))
        ok = try
            include_string(mod, code, "$page:$line")
            true
        catch err
            @error "doc example failed" page line exception = (err, catch_backtrace())
            false
        end
        @test ok
    end
end
