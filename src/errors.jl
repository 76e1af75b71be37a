# Errors: a status code from libkmm becomes a `KmmError`; out of memory after every retry is a
# `KmmOutOfMemoryError` carrying the manager's memory table.

"""
    KmmError(status, name, message)

A call into libkmm failed. `status` is the `KmmStatus` code (see `Kmm.LibKmm`), `name` its name
(`"KMM_ERROR_INVALID_HANDLE"`) and `message` the library's text for the failure (from
`kmm_last_error`), or Kmm.jl's own text when the failure is caught on the Julia side (a closed
manager, a freed array).
"""
struct KmmError <: Exception
    status::UInt32
    name::String
    message::String
end

function Base.showerror(io::IO, e::KmmError)
    print(io, "KmmError: ", e.name, " (", Int(e.status), ")")
    isempty(e.message) || print(io, ": ", e.message)
end

"""
    KmmOutOfMemoryError

An allocation of `bytes` (a new array, or a spilled one coming back to the device) failed with
`KMM_ERROR_OUT_OF_MEMORY` even after Kmm.jl ran
`GC.gc(false)`, `GC.gc(true)` and `trim!` and retried. The message gives the request, the free
space and the largest free block, the largest holders and what was tried. `status` is the
manager's `memory_status` at the time, shown with the error; in a notebook, showing the caught
error draws its memory map.
"""
struct KmmOutOfMemoryError <: Exception
    bytes::Int
    message::String
    status::Any    # a MemoryStatus (defined in manager.jl)
end

function Base.showerror(io::IO, e::KmmOutOfMemoryError)
    print(io, "KmmOutOfMemoryError: could not allocate ", e.bytes, " bytes")
    # libkmm's message runs over several lines (the ladder, the figures): on lines of its own,
    # not in a parenthesis that closes pages later.
    isempty(e.message) || print(io, ":\n", e.message)
    print(io, "\n", e.status)
end

"""
    KmmLibraryError(message)

libkmm could not be found or loaded, or its ABI version differs from the bindings'.
"""
struct KmmLibraryError <: Exception
    message::String
end
Base.showerror(io::IO, e::KmmLibraryError) = print(io, "KmmLibraryError: ", e.message)

status_name(status::Integer) = unsafe_string(LibKmm.kmm_status_name(UInt32(status)))
last_error_message() = unsafe_string(LibKmm.kmm_last_error())

@noinline throw_kmm_error(status::UInt32) =
    throw(KmmError(status, status_name(status), last_error_message()))

@noinline throw_kmm_error(status::UInt32, message::AbstractString) =
    throw(KmmError(status, status_name(status), message))

"Throws a `KmmError` unless `status` is `KMM_OK` (used by the checked wrappers of LibKmm)."
@inline check_status(status::UInt32) = status == 0x0 ? nothing : throw_kmm_error(status)
