# Run by `Pkg.build("Kmm")`. When no libkmm artifact fits this platform (and KMM_LIBRARY is not
# set), builds rust/ with cargo so that Kmm finds rust/target/release/libkmm.
import Pkg.Artifacts

const ROOT = normpath(joinpath(@__DIR__, ".."))

function artifact_ready()
    toml = joinpath(ROOT, "Artifacts.toml")
    isfile(toml) || return false
    hash = Artifacts.artifact_hash("libkmm", toml)
    hash === nothing && return false
    Artifacts.artifact_exists(hash) && return true
    all(iszero, hash.bytes) && return false   # placeholder entry: no release has filled it in
    try                                   # a release fills in the entry; placeholders fail here
        Artifacts.ensure_artifact_installed("libkmm", toml)
        return true
    catch err
        @info "libkmm artifact not available for this platform; building from source" err
        return false
    end
end

function main()
    if !isempty(get(ENV, "KMM_LIBRARY", ""))
        @info "KMM_LIBRARY is set; nothing to build" ENV["KMM_LIBRARY"]
        return
    end
    artifact_ready() && return @info "using the libkmm artifact"
    manifest = joinpath(ROOT, "rust", "Cargo.toml")
    isfile(manifest) || error("no artifact fits and $manifest is missing: set KMM_LIBRARY")
    cargo = Sys.which("cargo")
    cargo === nothing && error("no artifact fits and cargo is not installed: install Rust " *
                               "(https://rustup.rs) or set KMM_LIBRARY to a libkmm")
    # `cargo` by name: Sys.which resolves the rustup proxy symlink, which must be called as cargo
    run(`cargo build --release --manifest-path $manifest -p kmm`)
    @info "built libkmm" joinpath(ROOT, "rust", "target", "release")
end

main()
