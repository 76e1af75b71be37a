# What a manager shows of its memory: traces, memory maps and the figures notebooks draw.
# The figures are libkmm's SVG; `show` with MIME"image/svg+xml" passes them on, and
# MIME"text/html" shows a status's table with them.

const FIGURES = (device_map = 0, pinned_map = 1, timeline = 2, overview = 3)

"libkmm's SVG of one figure (`:device_map`, `:pinned_map`, `:timeline` or `:overview`)."
figure_svg(m::KmmManager, figure::Symbol) =
    GC.@preserve m c_text(LibKmm.kmm_manager_figure_svg, handle(m), getfield(FIGURES, figure))

"""The text of a two-call C function: its length first, then the text, again while it grew in
between (other threads change what is drawn); read up to its NUL."""
function c_text(call, args...)
    needed = Ref{Csize_t}(0)
    call(args..., C_NULL, 0, needed)
    while true
        buf = zeros(UInt8, needed[])
        n = length(buf)
        GC.@preserve buf call(args..., buf, n, needed)
        needed[] <= n && return String(buf[1:something(findfirst(iszero, buf), n + 1) - 1])
    end
end

"The items of a two-call C function: the count first, then the array (again if it grew)."
function c_items(::Type{T}, call, args...; tail = ()) where {T}
    count = Ref{Csize_t}(0)
    call(args..., C_NULL, 0, count, tail...)
    while true
        out = Vector{T}(undef, count[])
        n = length(out)
        GC.@preserve out call(args..., out, n, count, tail...)
        count[] <= n && return resize!(out, count[])
    end
end

"""
    Kmm.MemoryMap

What `memory_map` returns: every chunk of one kind of memory in address order, cut into
buffers' blocks and the free space between them (`segments`, `LibKmm.KmmMapSegment`s: `chunk`,
`address`, `bytes`, `state` (0 free, 1 in use, 2 mapped), `buffer`, `requested`). Shows as a
figure in notebooks.
"""
struct MemoryMap
    kind::Symbol
    segments::Vector{LibKmm.KmmMapSegment}
    svg::String
end

"""
    Kmm.memory_map(mgr = Kmm.default_manager(); kind = :device) -> Kmm.MemoryMap

The map of the manager's `:device` or `:pinned` memory now: each chunk a row of blocks (in use,
mapped) and free space. A mapped buffer never moves; an unmapped one may (compaction).
"""
function memory_map(m::KmmManager = default_manager(); kind::Symbol = :device)
    code = kind_value(kind)
    segments = GC.@preserve m c_items(LibKmm.KmmMapSegment, LibKmm.kmm_manager_memory_map, handle(m), code)
    MemoryMap(kind, segments, figure_svg(m, kind === :device ? :device_map : :pinned_map))
end

free_bytes(map::MemoryMap) = sum(Int[s.bytes for s in map.segments if s.state == 0])
function largest_free(map::MemoryMap)
    free = Int[s.bytes for s in map.segments if s.state == 0]
    isempty(free) ? 0 : maximum(free)
end

function Base.show(io::IO, map::MemoryMap)
    chunks = count(s -> s.address == s.chunk, map.segments)   # a chunk's first segment
    print(io, "Kmm.MemoryMap(:", map.kind, ", ", chunks, " chunks, ", length(map.segments),
          " segments, ", free_bytes(map), " bytes free, largest ", largest_free(map), ")")
end
Base.show(io::IO, ::MIME"image/svg+xml", map::MemoryMap) = print(io, map.svg)

"""
    Kmm.MemoryTrace

What `trace` returns: the ring trace's records, oldest first (`records`,
`LibKmm.KmmTraceRecord`s: `time_ns`, `thread`, `action`, `kind`, `address`, `bytes`, `stream`,
`buffer`, `moved_from`, `status`, `in_use`, `reserved`), and how many older ones the ring let go
(`dropped`). `Kmm.action_name(r)` names a record's action. Shows as a memory timeline.
"""
struct MemoryTrace
    records::Vector{LibKmm.KmmTraceRecord}
    dropped::Int
    svg::String
end

"The name of a trace record's action: \"allocate\", \"free\", \"allocate failure\", \"map\", ..."
action_name(r::LibKmm.KmmTraceRecord) = unsafe_string(LibKmm.kmm_trace_action_name(r.action))

Base.show(io::IO, t::MemoryTrace) =
    print(io, "Kmm.MemoryTrace(", length(t.records), " records, ", t.dropped, " dropped)")
Base.show(io::IO, ::MIME"image/svg+xml", t::MemoryTrace) = print(io, t.svg)

function path_arg(path, name)
    # Not a Symbol or anything else String() converts: a file named after it is not asked for.
    path isa AbstractString || throw(ArgumentError("$name = $(repr(path)) must be a string (a file path)"))
    text = String(path)
    isempty(text) && throw(ArgumentError("$name is empty"))
    occursin('\0', text) && throw(ArgumentError("$name contains a NUL character"))
    text
end

"""
    Kmm.trace_start!(mgr = Kmm.default_manager(); capacity = 0, path = nothing, rmm_only = false)

Records every allocation, free, map, unmap, move, trim and failed allocation of the manager:
into rings of the last `capacity` records (0 means 65,536; at most 2^24; one per lane of the
manager, so threads record in parallel), read merged in time order with `trace` and
`save_trace`; or, with `path`, into that CSV file as the events happen (`rmm_only`: only
what RMM's replay benchmark reads). Replaces the manager's last trace. Off by default.
"""
function trace_start!(m::KmmManager = default_manager(); capacity::Integer = 0, path = nothing,
                      rmm_only::Bool = false)
    limit = Int(LibKmm.KMM_TRACE_MAX_RECORDS)
    !(capacity isa Bool) && 0 <= capacity <= limit || throw_kmm_error(LibKmm.KMM_ERROR_INVALID_ARGUMENT,
        "trace_start!: capacity = $capacity must be in 0..$limit, an integer and not a Bool (0: $(Int(LibKmm.KMM_TRACE_DEFAULT_RECORDS)))")
    if path === nothing
        rmm_only && throw(ArgumentError("trace_start!: rmm_only applies to a file trace; give a path"))
        GC.@preserve m LibKmm.kmm_manager_trace_start(handle(m), capacity, C_NULL, 0)
    else
        capacity == 0 || throw(ArgumentError("trace_start!: capacity = $capacity applies to a ring trace; a file trace has none"))
        text = path_arg(path, "path")
        flags = rmm_only ? LibKmm.KMM_TRACE_RMM_ONLY : UInt32(0)
        GC.@preserve m text LibKmm.kmm_manager_trace_start(handle(m), 0, text, flags)
    end
    m
end

"""
    Kmm.trace_stop!(mgr = Kmm.default_manager())

Stops the manager's trace (a file trace is flushed and closed); a ring's records stay readable.
"""
function trace_stop!(m::KmmManager = default_manager())
    GC.@preserve m LibKmm.kmm_manager_trace_stop(handle(m))
    m
end

"""
    Kmm.trace(mgr = Kmm.default_manager()) -> Kmm.MemoryTrace

The records of the manager's ring trace, oldest first, drawn as a memory timeline in notebooks.
"""
function trace(m::KmmManager = default_manager())
    dropped = Ref{UInt64}(0)
    records = GC.@preserve m c_items(LibKmm.KmmTraceRecord, LibKmm.kmm_manager_trace_records, handle(m);
                                     tail = (dropped,))
    MemoryTrace(records, Int(dropped[]), figure_svg(m, :timeline))
end

"""
    Kmm.save_trace(mgr, path; rmm_only = false)

Writes the manager's ring trace to the CSV file `path`: RMM's logging columns first (Thread,
Time, Action, Pointer, Size, Stream), Kmm's after. `rmm_only` keeps what RMM's replay
benchmark reads. Replay it with `kmm-bench`'s `replay` (docs/observability.md).
"""
function save_trace(m::KmmManager, path; rmm_only::Bool = false)
    text = path_arg(path, "path")
    flags = rmm_only ? LibKmm.KMM_TRACE_RMM_ONLY : UInt32(0)
    GC.@preserve m text LibKmm.kmm_manager_trace_save(handle(m), text, flags)
    path
end

# A status shows its figures: the device map, the pinned map when pinned buffers or pool chunks exist,
# and the timeline when the manager has a ring trace.
Base.show(io::IO, ::MIME"image/svg+xml", s::MemoryStatus) = print(io, s.svg)
Base.show(io::IO, ::MIME"text/html", s::MemoryStatus) = print(io, "<pre>", html_escape(s.text), "</pre>", s.svg)

Base.show(io::IO, ::MIME"image/svg+xml", e::KmmOutOfMemoryError) = print(io, e.status.svg)
Base.show(io::IO, ::MIME"text/html", e::KmmOutOfMemoryError) =
    print(io, "<pre>", html_escape(sprint(showerror, e)), "</pre>", e.status.svg)

html_escape(s::AbstractString) = replace(replace(replace(s, "&" => "&amp;"), "<" => "&lt;"), ">" => "&gt;")
