# Turns gen/kmm.h (cbindgen output) into src/LibKmm.jl.
#
#     julia gen/generator.jl            # rewrite src/LibKmm.jl
#     julia gen/generator.jl --check    # exit 1 when src/LibKmm.jl is stale (CI)
#
# The header is regular (cbindgen writes it), so a small line-based parser suffices: `#define`
# constants, `enum` blocks, `typedef struct { ... } Name;`, `typedef uint64_t Name;`, function
# pointer typedefs and function prototypes. Anything else the parser does not understand is an
# error, so a header change that needs generator work is noticed instead of silently dropped.
#
# Calls go through function pointers resolved once by `LibKmm.load!(path)` (the library is chosen
# at load time, see src/library.jl), cached in one `Ref` per function. Every function returning a
# `KmmStatus` gets two wrappers: `kmm_x(...)` throws through `check_status` (defined by the parent
# module) and `unchecked_kmm_x(...)` returns the status (for finalizers and probes).

const ROOT = normpath(joinpath(@__DIR__, ".."))
const HEADER = joinpath(ROOT, "gen", "kmm.h")
const OUTPUT = joinpath(ROOT, "src", "LibKmm.jl")

const CTYPES = Dict(
    "uint64_t" => "UInt64", "int64_t" => "Int64", "uint32_t" => "UInt32", "int32_t" => "Int32",
    "uint16_t" => "UInt16", "int16_t" => "Int16", "uint8_t" => "UInt8", "int8_t" => "Int8",
    "size_t" => "Csize_t", "bool" => "Bool", "char" => "Cchar", "void" => "Cvoid",
    "double" => "Cdouble", "float" => "Cfloat", "int" => "Cint",
)

struct CEnum
    name::String
    values::Vector{Pair{String,String}}
    doc::String
end
struct CStruct
    name::String
    fields::Vector{Pair{String,String}}   # name => Julia type
    doc::String
end
struct CFunction
    name::String
    ret::String
    args::Vector{Pair{String,String}}     # name => Julia type
    doc::String
end

"Strips `/** ... */` comment markers and leading stars; returns plain text."
function clean_doc(lines)
    out = String[]
    for l in lines
        l = strip(l)
        l = replace(l, r"^/\*\*" => "")
        l = replace(l, r"\*/$" => "")
        l = replace(l, r"^\*" => "")
        push!(out, strip(l))
    end
    strip(join(filter(!isempty, out), "\n"))
end

function jltype(ctype::AbstractString, typedefs)
    t = strip(replace(ctype, "const " => ""))
    nptr = count(==('*'), t)
    base = strip(replace(t, "*" => ""))
    jl = haskey(CTYPES, base) ? CTYPES[base] :
         base in typedefs ? base : error("generator: unknown C type `$ctype`")
    for _ in 1:nptr
        jl = "Ptr{$jl}"
    end
    jl
end

function parse_header(text)
    lines = split(text, '\n')
    consts = Pair{String,String}[]
    constdocs = Dict{String,String}()
    enums = CEnum[]
    structs = CStruct[]
    funcs = CFunction[]
    typedefs = Set{String}()
    aliases = Pair{String,String}[]
    doc = String[]
    i = 1
    while i <= length(lines)
        l = strip(lines[i])
        if startswith(l, "/**")
            doc = String[]
            while true
                push!(doc, lines[i])
                occursin("*/", lines[i]) && break
                i += 1
            end
            i += 1
            continue
        end
        if (m = match(r"^#define (KMM_\w+) (\d+)$", l)) !== nothing
            push!(consts, m[1] => m[2]); constdocs[m[1]] = clean_doc(doc); doc = String[]
        elseif (m = match(r"^enum (\w+)$", l)) !== nothing
            name = m[1]; edoc = clean_doc(doc); vals = Pair{String,String}[]; vdoc = String[]
            while !startswith(strip(lines[i]), "{")
                i += 1
            end
            i += 1
            while !startswith(strip(lines[i]), "};")
                s = strip(lines[i])
                if (mv = match(r"^(\w+) = (\d+),$", s)) !== nothing
                    push!(vals, mv[1] => mv[2])
                end
                i += 1
            end
            push!(enums, CEnum(name, vals, edoc)); push!(typedefs, name); doc = String[]
        elseif (m = match(r"^typedef (\w+) (\w+);$", l)) !== nothing
            if !(m[2] in typedefs)   # `typedef uint32_t KmmStatus;` after the enum: already known
                push!(aliases, m[2] => jltype(m[1], typedefs)); push!(typedefs, m[2])
                constdocs[m[2]] = clean_doc(doc)
            end
            doc = String[]
        elseif (m = match(r"^typedef \w+ \(\*(\w+)\)\(.*\);$", l)) !== nothing
            # A C function pointer type: Julia passes it as a `Ptr{Cvoid}` (`@cfunction`).
            push!(aliases, m[1] => "Ptr{Cvoid}"); push!(typedefs, m[1])
            constdocs[m[1]] = clean_doc(doc); doc = String[]
        elseif l == "typedef struct {"
            sdoc = clean_doc(doc); fields = Pair{String,String}[]; i += 1
            while !startswith(strip(lines[i]), "}")
                s = strip(lines[i])
                if (mf = match(r"^([\w *]+?) ?(\w+);$", s)) !== nothing
                    push!(fields, mf[2] => jltype(mf[1], typedefs))
                elseif !(isempty(s) || startswith(s, "/**") || startswith(s, "*"))
                    error("generator: cannot parse struct field `$s`")
                end
                i += 1
            end
            name = match(r"^} (\w+);$", strip(lines[i]))[1]
            push!(structs, CStruct(name, fields, sdoc)); push!(typedefs, name); doc = String[]
        elseif (m = match(r"^([\w ]+?\**) ?(kmm_\w+)\((.*)$", l)) !== nothing
            sig = String(l)
            while !endswith(strip(sig), ";")
                i += 1; sig *= " " * strip(lines[i])
            end
            m = match(r"^([\w ]+?\**) ?(kmm_\w+)\((.*)\);$", sig)
            args = Pair{String,String}[]
            if strip(m[3]) != "void"
                for a in split(m[3], ',')
                    ma = match(r"^(.*?)(\w+)$", strip(a))
                    push!(args, safe_name(ma[2]) => jltype(ma[1], typedefs))
                end
            end
            push!(funcs, CFunction(m[2], jltype(m[1], typedefs), args, clean_doc(doc)))
            doc = String[]
        elseif !isempty(l) && !startswith(l, "#") && !startswith(l, "/*") && !startswith(l, "*") &&
               !startswith(l, "//") && !startswith(l, "}") && !startswith(l, "extern") &&
               !startswith(l, ": ") && !startswith(l, "typedef enum")
            error("generator: cannot parse header line $i: `$l`")
        end
        i += 1
    end
    (consts = consts, constdocs = constdocs, enums = enums, structs = structs, funcs = funcs,
     aliases = aliases)
end

const JULIA_KEYWORDS = Set(["module", "baremodule", "begin", "end", "function", "macro", "quote",
    "let", "local", "global", "const", "do", "struct", "mutable", "abstract", "primitive", "type",
    "import", "export", "using", "if", "else", "elseif", "for", "while", "break", "continue",
    "return", "try", "catch", "finally", "true", "false", "where", "in", "isa"])

"A C name usable as a Julia argument name (`module` -> `module_`)."
safe_name(n) = n in JULIA_KEYWORDS ? n * "_" : String(n)

docstr(d) = isempty(d) ? "" : "\"\"\"\n" * replace(replace(d, "\\" => "\\\\"), "\$" => "\\\$") * "\n\"\"\"\n"

function emit(h)
    io = IOBuffer()
    println(io, "# generated from gen/kmm.h by gen/generator.jl; do not edit")
    println(io, "# Regenerate: julia gen/generator.jl   (CI: julia gen/generator.jl --check)")
    println(io)
    println(io, "module LibKmm")
    println(io)
    println(io, "using Libdl")
    println(io, "import ..check_status, ..throw_kmm_error")
    println(io)
    println(io, "# constants")
    for (k, v) in h.consts
        print(io, docstr(h.constdocs[k]))
        println(io, "const $k = $v")
    end
    println(io)
    println(io, "# enums (values are plain UInt32 constants, as in the C ABI)")
    for e in h.enums
        print(io, docstr(e.doc))
        println(io, "const $(e.name) = UInt32")
        for (k, v) in e.values
            println(io, "const $k = UInt32($v)")
        end
        println(io)
    end
    println(io, "# handle types")
    for (k, v) in h.aliases
        print(io, docstr(h.constdocs[k]))
        println(io, "const $k = $v")
    end
    println(io)
    println(io, "# structs (field order and types as in C; layout checked by test/bindings.jl)")
    for s in h.structs
        print(io, docstr(s.doc))
        println(io, "struct $(s.name)")
        for (f, t) in s.fields
            println(io, "    $f::$t")
        end
        println(io, "end")
        println(io)
    end
    println(io, "\"The path of the loaded library (set by `load!`; chosen by `Kmm.find_libkmm`).\"")
    println(io, "const libkmm = Ref{String}(\"\")")
    println(io)
    println(io, "# function pointers, filled by load! (one dlsym per function, once)")
    names = [f.name for f in h.funcs]
    for n in names
        println(io, "const _fp_$n = Ref{Ptr{Cvoid}}(C_NULL)")
    end
    println(io)
    println(io, "\"The names of every exported function of the header.\"")
    println(io, "const FUNCTIONS = (", join([":$n" for n in names], ", "), ")")
    println(io)
    println(io, """
    \"\"\"
        load!(path) -> handle

    Opens the library at `path` and resolves every function of the header. A function the
    library lacks is left unresolved: calling it throws (see `missing_functions`).
    \"\"\"
    function load!(path::AbstractString)
        lib = Libdl.dlopen(path, Libdl.RTLD_LAZY | Libdl.RTLD_DEEPBIND)""")
    for n in names
        println(io, "    _fp_$n[] = something(Libdl.dlsym(lib, :$n; throw_error = false), C_NULL)")
    end
    println(io, "    libkmm[] = path")
    println(io, "    return lib")
    println(io, "end")
    println(io)
    println(io, """
    \"\"\"
        missing_functions() -> Vector{Symbol}

    Functions of the header that the loaded library does not export (an older build); calling
    one throws a `KmmError` with `KMM_ERROR_NOT_SUPPORTED`.
    \"\"\"
    missing_functions() = [f for f in FUNCTIONS if getfield(LibKmm, Symbol("_fp_", f))[] == C_NULL]

    @noinline throw_missing(name) = throw_kmm_error(KMM_ERROR_NOT_SUPPORTED,
        "the loaded libkmm does not export \$name (it is older than gen/kmm.h): rebuild it")""")
    println(io)
    println(io, "# functions")
    for f in h.funcs
        argnames = join(first.(f.args), ", ")
        typed = argnames   # untyped: ccall converts (Int -> UInt64 checks the sign, Ref -> Ptr)
        argtypes = isempty(f.args) ? "()" : "(" * join(last.(f.args), ", ") * (length(f.args) == 1 ? ",)" : ")")
        callargs = isempty(f.args) ? "" : ", " * argnames
        status = f.ret == "KmmStatus"
        prefix = status ? "unchecked_" : ""
        d = f.doc * (status ? "\n\nReturns the status; `$(f.name)` is the checked form." : "")
        print(io, docstr(d))
        println(io, "@inline function $prefix$(f.name)($typed)")
        println(io, "    fp = _fp_$(f.name)[]")
        println(io, "    fp == C_NULL && throw_missing(:$(f.name))")
        println(io, "    ccall(fp, $(f.ret), $argtypes$callargs)")
        println(io, "end")
        if status
            print(io, docstr(f.doc * "\n\nThrows a `KmmError` unless the status is `KMM_OK`."))
            println(io, "@inline function $(f.name)($typed)")
            println(io, "    check_status(unchecked_$(f.name)($argnames))")
            println(io, "end")
        end
        println(io)
    end
    println(io, "end # module LibKmm")
    String(take!(io))
end

function main(args)
    text = emit(parse_header(read(HEADER, String)))
    if "--check" in args
        current = isfile(OUTPUT) ? read(OUTPUT, String) : ""
        if current != text
            println(stderr, "src/LibKmm.jl is stale: run `julia gen/generator.jl` and commit it")
            exit(1)
        end
        println("src/LibKmm.jl is current")
    else
        write(OUTPUT, text)
        println("wrote ", relpath(OUTPUT, ROOT))
    end
end

if abspath(PROGRAM_FILE) == @__FILE__()
    main(ARGS)
end

