# Finding libkmm, in this order: the KMM_LIBRARY variable, a local build of rust/, the libkmm
# artifact of Artifacts.toml. The choice is kept for `libkmm_path()` / `libkmm_source()`.

const PKGROOT = normpath(joinpath(@__DIR__, ".."))
const LIBNAME = Sys.iswindows() ? "kmm.dll" : "libkmm." * Libdl.dlext

const _libkmm_path = Ref{String}("")
const _libkmm_source = Ref{Symbol}(:none)
const _libkmm_handle = Ref{Ptr{Cvoid}}(C_NULL)

"""
    Kmm.libkmm_path() -> String

The path of the libkmm that this session loaded. `Kmm.libkmm_source()` says how it was chosen:
`:env` (the `KMM_LIBRARY` variable), `:local` (a build of `rust/` in this repository) or
`:artifact` (the `libkmm` artifact of `Artifacts.toml`).
"""
libkmm_path() = _libkmm_path[]

"""
    Kmm.libkmm_source() -> Symbol

How the loaded libkmm was found: `:env`, `:local` or `:artifact` (see [`Kmm.libkmm_path`](@ref)).
"""
libkmm_source() = _libkmm_source[]

"The local builds of rust/ that are looked for, release first."
local_build_paths() =
    [joinpath(PKGROOT, "rust", "target", p, LIBNAME) for p in ("release", "debug")]

"The path of the libkmm artifact for this platform when it is installed, else `nothing`."
function artifact_library()
    toml = joinpath(PKGROOT, "Artifacts.toml")
    isfile(toml) || return nothing
    hash = try
        Artifacts.artifact_hash("libkmm", toml)
    catch
        nothing
    end
    hash === nothing && return nothing
    Artifacts.artifact_exists(hash) || return nothing
    dir = Artifacts.artifact_path(hash)
    for sub in ("lib", "bin")
        p = joinpath(dir, sub, LIBNAME)
        isfile(p) && return p
    end
    return nothing
end

"""
    Kmm.find_libkmm() -> (path, source)

Chooses libkmm: `KMM_LIBRARY` when set (it must name an existing file), else a local build of
`rust/` (release, then debug), else the `libkmm` artifact. Throws a `KmmLibraryError` saying what
to do when none is found.
"""
function find_libkmm()
    env = get(ENV, "KMM_LIBRARY", "")
    if !isempty(env)
        isfile(env) || throw(KmmLibraryError("KMM_LIBRARY=$env is not a file (when it is set, nothing else " *
                                             "is tried): point it at a libkmm, or unset it to use the local build"))
        return (abspath(env), :env)
    end
    for p in local_build_paths()
        isfile(p) && return (p, :local)
    end
    art = artifact_library()
    art === nothing || return (art, :artifact)
    throw(KmmLibraryError("libkmm not found: set KMM_LIBRARY to a libkmm, build rust/ " *
        "(`cargo build --release --manifest-path rust/Cargo.toml -p kmm` or `Pkg.build(\"Kmm\")`), " *
        "or install a release that provides the libkmm artifact"))
end

"""
    Kmm.check_abi_version(found; expected = LibKmm.KMM_ABI_VERSION, path = libkmm_path())

Throws a `KmmLibraryError` unless the library's ABI version `found` equals the version of the
header the bindings were generated from.
"""
function check_abi_version(found::Integer; expected::Integer = LibKmm.KMM_ABI_VERSION,
                           path::AbstractString = libkmm_path())
    found == expected && return nothing
    throw(KmmLibraryError("libkmm at $path has ABI version $found, but these bindings " *
        "(src/LibKmm.jl, from gen/kmm.h) need ABI version $expected: rebuild the library from " *
        "this checkout or use a Kmm.jl release that matches it"))
end

"Loads libkmm (see `find_libkmm`), resolves every function and checks the ABI version."
function load_libkmm!()
    path, source = find_libkmm()
    handle = try
        LibKmm.load!(path)
    catch err
        throw(KmmLibraryError("cannot load libkmm from $path ($source): " * sprint(showerror, err)))
    end
    _libkmm_path[] = path
    _libkmm_source[] = source
    _libkmm_handle[] = handle
    check_abi_version(LibKmm.kmm_abi_version(); path = path)
    return path
end

"""
    Kmm.version() -> VersionNumber

The version of the loaded libkmm.
"""
version() = VersionNumber(unsafe_string(LibKmm.kmm_version()))

"""
    @gcsafe LibKmm.unchecked_kmm_f(args...)

Makes the libkmm call marked safe for the garbage collector while it runs, as CUDA.jl's
`@gcsafe_ccall` does (`jl_gc_safe_enter`/`jl_gc_safe_leave`, which Julia exports from 1.5 on):
a call that may wait for the device inside libkmm (an allocation's out-of-memory ladder waits
for the stream before it gives cached memory back, a map for a compaction's copies, a pageable
copy for a staging slot, a manager's creation for the device's context) then does not stop every
other thread that needs a collection until the device is done.

Between the marks nothing may allocate, throw or reach a safepoint: the arguments are evaluated
(and kept alive) before, and must already have the C types of the call (no conversion that
could throw runs between the marks); the function pointer is checked before, so the wrapper's
own check for a missing symbol cannot throw there; libkmm never calls back into Julia. Check the
returned status after.
"""
macro gcsafe(call)
    (call isa Expr && call.head === :call && call.args[1] isa Expr && call.args[1].head === :.) ||
        throw(ArgumentError("@gcsafe takes a call of LibKmm.unchecked_kmm_..."))
    wrapper = call.args[1].args[2].value::Symbol
    cname = Symbol(replace(String(wrapper), r"^unchecked_" => ""))
    fp = Symbol("_fp_", cname)
    names = [gensym("arg") for _ in 2:length(call.args)]
    bind = [:(local $n = $(esc(a))) for (n, a) in zip(names, call.args[2:end])]
    quote
        $(bind...)
        LibKmm.$fp[] == C_NULL && LibKmm.throw_missing($(QuoteNode(cname)))
        GC.@preserve $(names...) begin
            local state = ccall(:jl_gc_safe_enter, Int8, ())
            local status = $(esc(call.args[1]))($(names...))
            ccall(:jl_gc_safe_leave, Cvoid, (Int8,), state)
            status
        end
    end
end
