"""
    Kmm

GPU memory manager for quantitative MRI: Julia bindings to libkmm. `KmmManager` owns a stream
and memory pools; `KmmArray` is an array in its memory; `PinnedArray` is page-locked host
memory. Without a GPU the host backend stands in. See docs/julia-getting-started.md.
"""
module Kmm

using Libdl
import LinearAlgebra
import Pkg.Artifacts
import Serialization

export KmmManager, KmmArray, PinnedArray, KmmCopyTask, KmmError, KmmOutOfMemoryError,
       memory_status, trim!, copyto_async!

include("errors.jl")
include("LibKmm.jl")
include("library.jl")
include("manager.jl")
include("observe.jl")
include("storage.jl")
include("array.jl")
include("devices.jl")
include("scalar.jl")
include("pinned.jl")
include("wrappers.jl")   # Base's wrappers over Kmm memory: display, read back, reinterpret
include("async.jl")
include("copying.jl")   # deepcopy copies data; serialization is refused
include("qmri/QMRI.jl")    # Kmm.QMRI: MRF simulation and matching (not exported)

function __init__()
    load_libkmm!()
end

end # module Kmm
