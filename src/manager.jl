# KmmManager: owns a libkmm manager handle (a stream and pools). Finalizer-backed; `close` is
# explicit, idempotent and blocking; the finalizer uses the deferred (non-blocking) destroy.

"""
    KmmManager(; backend = :auto, device = 0, alloc_mode = :pool, suballocator = :binned,
               alignment, chunk_size, initial_pool_size, fixed_block_size, hard_limit,
               release_threshold, pinned_chunk_size, pinned_limit, staging_chunk_size,
               staging_chunks, compaction_ratio_pct, spill_limit)

Creates a manager: its own stream and memory pools on one device. Keywords mirror `KmmConfig`
of the C ABI; those left out keep libkmm's defaults (`kmm_config_default`).

- `backend`: `:auto` (CUDA when usable, else host; `KMM_BACKEND` decides first), `:host`, `:cuda`
- `alloc_mode`: `:pool` (Kmm's suballocator), `:cuda_async` (a private CUDA pool), `:direct`
- `suballocator`: `:binned`, `:heap`, `:fixed`, `:ring`
- sizes in bytes; `hard_limit = 0` means none; `release_threshold` is the cached memory kept
  across `synchronize`.
- `compaction_ratio_pct` (default 108): once growing the device pool would take its reserved
  bytes past this percentage of the bytes in use, Kmm first makes room by moving device buffers
  that are not mapped (no `CuArray` view holds them); also before giving up with out of memory.
  `0` never moves buffers.
- `spill_limit` (default 0: never): bytes of device arrays that may move to host memory when the
  device (or `hard_limit`) is full. Arrays that no `CuArray` view or kernel holds mapped, and not
  marked `Kmm.never_spill!`, spill least recently used first (pinned memory while `pinned_limit`
  leaves room, then pageable; a pinned allocation that needs the room moves them on to pageable)
  and come back on their next use: a working set larger than the device runs, slower, instead of
  failing. `Kmm.is_spilled(x)` tells where an array is.

Arrays keep their manager alive. The manager is destroyed by `close(mgr)` (waits for its stream)
or, once unreachable, by its finalizer (never waits). Many managers may coexist. An explicit
`finalize(mgr)` while a synchronous copy or wait of the manager runs (on another task) destroys
it once the last such call has returned: a synchronous copy returns only once its bytes arrived.
"""
mutable struct KmmManager
    handle::UInt64
    device::Int
    lock::ReentrantLock
    pending::Vector{Any}      # async copies in flight (KmmCopyTask), see async.jl
    # Set once libkmm's destroy has returned (`close` waited for the stream; the finalizer's
    # deferred destroy runs when nothing of Julia's can be waiting). `handle` is 0 from the
    # start of `close`, before the stream has drained: a wait that finds it 0 waits for this.
    destroyed::Threads.Atomic{Bool}
    # Synchronous calls in flight that queued work and wait for it (`waiting`), and whether a
    # finalizer run was put off for them: under `_claim_lock`.
    waits::Int
    finalize_asked::Bool
    function KmmManager(handle::UInt64, device::Integer)
        m = new(handle, device, ReentrantLock(), Any[], Threads.Atomic{Bool}(false), 0, false)
        finalizer(finalize_manager, m)
        return m
    end
end

const BACKENDS = Dict(:auto => LibKmm.KMM_BACKEND_AUTO, :host => LibKmm.KMM_BACKEND_HOST,
                      :cuda => LibKmm.KMM_BACKEND_CUDA)
const ALLOC_MODES = Dict(:pool => LibKmm.KMM_ALLOC_POOL, :cuda_async => LibKmm.KMM_ALLOC_CUDA_ASYNC,
                         :direct => LibKmm.KMM_ALLOC_DIRECT)
const SUBALLOCATORS = Dict(:binned => LibKmm.KMM_SUBALLOC_BINNED, :heap => LibKmm.KMM_SUBALLOC_HEAP,
                           :fixed => LibKmm.KMM_SUBALLOC_FIXED, :ring => LibKmm.KMM_SUBALLOC_RING)

function enum_value(table, name, what)
    haskey(table, name) && return table[name]
    throw(ArgumentError("$what must be one of $(sort!(collect(keys(table)))), got $(repr(name))"))
end

"A keyword's value as the C field's type `T`: an integer within `T`'s range, never wrapped,
truncated or rounded (a `KmmError` naming the keyword and the bound otherwise)."
function config_value(::Type{T}, name::Symbol, v) where {T<:Integer}
    lo = name === :device ? zero(T) : typemin(T)     # an ordinal, as libkmm bounds it
    ok = v isa Integer && !(v isa Bool) && lo <= v <= typemax(T)
    ok || throw_kmm_error(LibKmm.KMM_ERROR_INVALID_ARGUMENT,
                          "KmmManager: $name = $(repr(v)) must be an integer in $lo..$(typemax(T))")
    return T(v)
end
config_value(::Type{T}, name::Symbol, v) where {T} = convert(T, v)

"""A positional argument `name` of `fname` as the C parameter's type `T`: an integer within
`T`'s range, never wrapped or truncated (a `KmmError` naming the argument and the bound otherwise,
not an `InexactError` from the `ccall`)."""
function arg_value(::Type{T}, fname::AbstractString, name::Symbol, v::Integer) where {T<:Integer}
    (!(v isa Bool) && typemin(T) <= v <= typemax(T)) ||
        throw_kmm_error(LibKmm.KMM_ERROR_INVALID_ARGUMENT,
                        "$fname: $name = $(repr(v)) must be an integer in $(typemin(T))..$(typemax(T))")
    return T(v)
end

"The default `KmmConfig` with the given fields replaced (`nothing` keeps the default)."
function make_config(; kw...)
    ref = Ref{LibKmm.KmmConfig}()
    LibKmm.kmm_config_default(ref)
    cfg = ref[]
    names = fieldnames(LibKmm.KmmConfig)
    for k in keys(kw)
        k in names || throw(ArgumentError("unknown KmmManager keyword `$k`"))
    end
    vals = map(names) do f
        v = get(kw, f, nothing)
        v === nothing ? getfield(cfg, f) : config_value(fieldtype(LibKmm.KmmConfig, f), f, v)
    end
    LibKmm.KmmConfig(vals...)
end

function KmmManager(; backend::Symbol = :auto, device::Integer = 0, alloc_mode::Symbol = :pool,
                    suballocator::Symbol = :binned, kw...)
    cfg = make_config(; backend = enum_value(BACKENDS, backend, "backend"), device = device,
                      alloc_mode = enum_value(ALLOC_MODES, alloc_mode, "alloc_mode"),
                      suballocator = enum_value(SUBALLOCATORS, suballocator, "suballocator"), kw...)
    out = Ref{UInt64}(0)
    # On CUDA the device's context is made (or retained) inside: it can take long.
    check_status(@gcsafe LibKmm.unchecked_kmm_manager_create(Ref(cfg), out))
    KmmManager(out[], device)
end

# A manager's and a storage's handle are each taken by exactly one caller (two tasks closing
# one manager, `close` and a finalizer, two `unsafe_free!`s): it is read and zeroed under this
# lock, held for those two field accesses only (no allocation, no safepoint), so a finalizer
# taking it cannot deadlock with its own thread.
const _claim_lock = Threads.SpinLock()

"Takes `x.handle` (0 if another caller took it first)."
@inline function claim_handle!(x)
    lock(_claim_lock)
    h = x.handle
    x.handle = 0
    unlock(_claim_lock)
    return h
end

function finalize_manager(m::KmmManager)
    # Copies into (or from) host arrays may still be queued: their tasks, in `m.pending`, hold
    # the host arrays. Until they have run the manager stays alive (the finalizer is registered
    # again, to look at the next collection), so no collection frees a host array under a copy.
    if !finished_pending(m)
        finalizer(finalize_manager, m)
        return nothing
    end
    # A synchronous call waits on the manager (only an explicit `finalize` can come then: the
    # call keeps it reachable). The deferred destroy would end that wait before its copy ran:
    # the last such call destroys the manager when it returns (`leave_wait!`).
    h = claim_unless_waited!(m)
    h == 0 && return nothing    # put off, or taken by a `close` (which sets `destroyed` once done)
    # never blocks: the handle dies now, the teardown runs on a background thread
    LibKmm.unchecked_kmm_manager_destroy(h, LibKmm.KMM_DESTROY_DEFERRED)
    m.destroyed[] = true
    return nothing
end

"Takes `m.handle` as `claim_handle!` does unless a synchronous call waits on `m` (then 0, and the finalizer is asked for)."
@inline function claim_unless_waited!(m::KmmManager)
    lock(_claim_lock)
    waited = m.waits > 0
    m.finalize_asked |= waited
    h = waited ? UInt64(0) : m.handle
    waited || (m.handle = 0)
    unlock(_claim_lock)
    return h
end

"""
    waiting(f, m::KmmManager)

Runs `f()`, a call that queues work on `m` and waits for it (a synchronous copy, `synchronize`):
while it runs the finalizer does not destroy `m`, since the deferred destroy would end the wait
before the work has run. Enter it before the manager's handle is read.
"""
function waiting(f, m::KmmManager)
    enter_wait!(m)
    try
        return f()
    finally
        leave_wait!(m) && finalize_manager(m)
    end
end

enter_wait!(m::KmmManager) = (lock(_claim_lock); m.waits += 1; unlock(_claim_lock); nothing)

"Ends a synchronous call; whether it was the last and a `finalize` was put off for it."
function leave_wait!(m::KmmManager)
    lock(_claim_lock)
    m.waits -= 1
    run = m.waits == 0 && m.finalize_asked
    run && (m.finalize_asked = false)
    unlock(_claim_lock)
    return run
end

"From a finalizer (no blocking, no task switch): drops the pending copies that have run; whether none is left."
function finished_pending(m::KmmManager)
    isempty(m.pending) && return true
    # Held by anyone, this task included (a finalizer may run inside `complete_pending!`, and
    # the lock is reentrant): look again at the next collection.
    islocked(m.lock) && return false
    trylock(m.lock) || return false
    try
        return isempty(drop_finished!(m.pending))
    finally
        unlock(m.lock)
    end
end

"""
    close(mgr::KmmManager)

Destroys the manager now: waits for its stream and frees every buffer it still holds. Arrays of
a closed manager throw a `KmmError` when used. Closing twice is allowed.
"""
function Base.close(m::KmmManager)
    h = claim_handle!(m)
    h == 0 && return wait_destroyed(m)    # another task closes it: return once that is done
    # Whoever took the handle destroys the manager: nothing may keep it from the destroy, and
    # `destroyed` says so only once it has (waiters rely on it). The stream is drained first
    # by polling (yielding), so the destroy seldom blocks the thread inside its `ccall`.
    drained = false
    try
        quiesce_cpu_access()   # a PinnedArray of `m` read or written in place on another thread
        drain_stream(h)
        drained = true
    finally
        try
            # waits for what is left (work queued meanwhile), frees every buffer
            check_status(@gcsafe LibKmm.unchecked_kmm_manager_destroy(h, UInt32(0)))
        finally
            m.destroyed[] = true
            # The queued copies have run: drop their tasks' arrays. Interrupted, never wait
            # for the lock (its holder may be waiting for this close).
            if drained
                lock(() -> empty!(m.pending), m.lock)
            elseif trylock(m.lock)
                try empty!(m.pending) finally unlock(m.lock) end
            end
        end
    end
    return nothing
end

"""
Waits, polling and yielding, for the work queued so far on the stream of the manager handle `mh`
(taken by `close`: no longer in the manager). Returns early if the handle fails.
"""
function drain_stream(mh::UInt64)
    ev = Ref{UInt64}(0)
    LibKmm.unchecked_kmm_manager_record_event(mh, ev) == LibKmm.KMM_OK || return nothing
    ev[] == 0 && return nothing
    done = Ref{Bool}(false)
    poll_until(() -> LibKmm.unchecked_kmm_event_query(mh, ev[], done) != LibKmm.KMM_OK || done[])
    LibKmm.unchecked_kmm_event_destroy(mh, ev[])
    nothing
end

"Waits (yielding) until the destroy of a closed manager has returned: its stream has drained."
wait_destroyed(m::KmmManager) = poll_until(() -> m.destroyed[])

Base.isopen(m::KmmManager) = m.handle != 0

@noinline throw_closed() = throw_kmm_error(LibKmm.KMM_ERROR_INVALID_HANDLE,
                                           "the manager has been closed")

"The raw handle of an open manager (a `KmmError` for a closed one)."
@inline function handle(m::KmmManager)
    h = m.handle
    h == 0 && throw_closed()
    return h
end

Base.unsafe_convert(::Type{UInt64}, m::KmmManager) = handle(m)

"""
Waits until `done()` is true without blocking the thread: polls, yielding to other tasks, and
after the first thousand polls sleeps a millisecond between them (a long wait costs no CPU).
"""
function poll_until(done)
    polls = 0
    while !done()
        polls += 1
        polls < 1000 ? yield() : sleep(0.001)
    end
    nothing
end

"""
Whether the event `ev` of `m` has completed (non-blocking). Once `m` is closed: whether its
destroy has returned (it waits for the stream); closed during the query counts as not yet.
"""
function event_done(m::KmmManager, ev::UInt64)
    mh = m.handle
    mh == 0 && return m.destroyed[]
    done = Ref{Bool}(false)
    st = GC.@preserve m LibKmm.unchecked_kmm_event_query(mh, ev, done)
    st == LibKmm.KMM_OK && return done[]
    m.handle == 0 && return false
    throw_kmm_error(st)
end

"""
Waits for the event `ev` of `m` (0: nothing queued) and destroys it. It polls and yields, as
CUDA.jl does: a wait inside a blocking `ccall` would hold up every other task of this thread,
and every thread that needs a collection. A manager closed meanwhile ends the wait once its
destroy has returned (it waits for the stream), not when its handle is gone. Callers free or
reuse the memory the queued work touches once this returns, so on an error or an interrupt it
still waits for the event (in libkmm), or for the destroy, before passing the exception on.
"""
function wait_event(m::KmmManager, ev::UInt64)
    ev == 0 && return nothing
    finished = false
    try
        poll_until(() -> event_done(m, ev))
        finished = true
    finally
        mh = m.handle
        if !finished
            mh == 0 || @gcsafe LibKmm.unchecked_kmm_event_wait(mh, ev)
            m.handle == 0 && wait_destroyed(m)
        end
        mh == 0 || LibKmm.unchecked_kmm_event_destroy(mh, ev)
    end
    nothing
end

function info(m::KmmManager)
    out = Ref{LibKmm.KmmManagerInfo}()
    GC.@preserve m LibKmm.kmm_manager_info(handle(m), out)
    out[]
end

"""
    Kmm.backend(mgr) -> Symbol

The backend the manager runs on: `:host` or `:cuda`.
"""
backend(m::KmmManager) = info(m).backend == LibKmm.KMM_BACKEND_CUDA ? :cuda : :host

"""
    Kmm.stream(mgr = Kmm.default_manager()) -> UInt64

The manager's raw stream handle (a `CUstream` on CUDA), for third parties to queue work on. It
stays owned by the manager.
"""
stream(m::KmmManager = default_manager()) = info(m).stream

"Waits for the work queued so far on `m`'s stream, yielding to other tasks meanwhile (`wait_event`)."
function wait_queued(m::KmmManager)
    ev = Ref{UInt64}(0)
    GC.@preserve m LibKmm.kmm_manager_record_event(handle(m), ev)
    wait_event(m, ev[])
end

"""
Runs `call()`, a libkmm call that waits for `m`'s stream inside (the qMRI calls that read their
inputs back to check them, the eigensolver of a compression basis), after `wait_queued(m)`: the
call's own wait is then only for work queued meanwhile, and other tasks run during the long
one. The call itself should be `@gcsafe`, so that other threads' collections go on during it.
"""
after_queued_work(call, m::KmmManager) = waiting(() -> (wait_queued(m); call()), m)

"""
    Kmm.synchronize(mgr = Kmm.default_manager())

Waits until all work queued on the manager's stream has run (then cached memory above the
release threshold is given back). Completes the manager's pending asynchronous copies.
"""
synchronize(m::KmmManager = default_manager()) = waiting(() -> synchronize_waiting(m), m)

function synchronize_waiting(m::KmmManager)
    # The copies queued before the event have run once it has; a copy another thread queues
    # meanwhile may still be running when the wait returns.
    before = lock(() -> Base.IdSet{Any}(m.pending), m.lock)
    wait_queued(m)
    # The stream has drained: this returns at once and gives cached memory back as configured.
    check_status(GC.@preserve m @gcsafe LibKmm.unchecked_kmm_manager_synchronize(handle(m)))
    complete_pending!(m, before)
    return nothing
end

"""
    trim!(mgr = Kmm.default_manager(), keep_bytes = 0)

Waits for the stream, then gives cached memory back until each pool reserves at most
`keep_bytes`. Live arrays are never moved or freed.
"""
function trim!(m::KmmManager = default_manager(), keep_bytes::Integer = 0)
    keep = arg_value(UInt64, "trim!", :keep_bytes, keep_bytes)
    waiting(() -> trim_waiting!(m, keep), m)
end

function trim_waiting!(m::KmmManager, keep::UInt64)
    # Waits for the stream by polling (as `synchronize`): the trim then finds it drained and
    # does not block the thread inside its `ccall`.
    wait_queued(m)
    # Giving chunks back may still wait for other streams' work on them.
    check_status(GC.@preserve m @gcsafe LibKmm.unchecked_kmm_manager_trim(handle(m), keep))
    return m
end

"""
    Kmm.reset_peaks!(mgr = Kmm.default_manager())

Resets the peak counters (in use and reserved) to the current values.
"""
reset_peaks!(m::KmmManager = default_manager()) = (GC.@preserve m LibKmm.kmm_manager_reset_peaks(handle(m)); m)

const KINDS = Dict(:device => LibKmm.KMM_MEMORY_DEVICE, :pinned => LibKmm.KMM_MEMORY_PINNED)
"The C value of a `kind` keyword (`:device` or `:pinned`), else an `ArgumentError` naming them."
@inline kind_value(kind::Symbol) =
    kind === :device ? LibKmm.KMM_MEMORY_DEVICE :
    kind === :pinned ? LibKmm.KMM_MEMORY_PINNED : enum_value(KINDS, kind, "kind")

"""
    Kmm.memory_stats(mgr = Kmm.default_manager(), kind = :device) -> LibKmm.KmmMemoryStats

The counters of one memory kind (`:device` or `:pinned`): `in_use`, `peak_in_use`, `reserved`,
`peak_reserved`, `allocs`, `frees`, `failed_allocs`, `live_buffers`, `pool_hits`,
`pool_misses`, `upstream_allocs`, `upstream_frees`, `largest_free_block`, `compactions`
(allocations served by moving unmapped buffers instead of growing the pool),
`relocated_bytes` (what those moves copied), and for device memory the spill figures:
`spilled_bytes` and `peak_spilled_bytes` (on the host now, and the most), `spilled_pageable_bytes`,
`spilled_buffers` (arrays on the host now), `spills`, `restores`, `spilled_out_bytes`, `restored_in_bytes` and `spill_time_ns`.
"""
function memory_stats(m::KmmManager = default_manager(), kind::Symbol = :device)
    out = Ref{LibKmm.KmmMemoryStats}()
    GC.@preserve m LibKmm.kmm_manager_stats(handle(m), kind_value(kind), out)
    out[]
end

"""
    MemoryStatus

What `memory_status` returns: the `device` and `pinned` counters (`LibKmm.KmmMemoryStats`),
the library's readable table (`text`), which is how it displays as text, and its figures
(`svg`: the device map, the pinned map when pinned buffers or pool chunks exist, the memory timeline when
the manager has a ring trace), which notebooks show with the table.
"""
struct MemoryStatus
    device::LibKmm.KmmMemoryStats
    pinned::LibKmm.KmmMemoryStats
    text::String
    svg::String
end
Base.show(io::IO, s::MemoryStatus) = print(io, s.text)
Base.show(io::IO, ::MIME"text/plain", s::MemoryStatus) = print(io, s.text)

"""
    memory_status(mgr = Kmm.default_manager()) -> MemoryStatus

A readable table of the manager's memory: in use, reserved, peaks, counts and the largest free
block, for device and pinned memory. Its fields hold the numbers (`memory_status(m).device.in_use`).
In a notebook it also shows the memory maps and, while a ring trace exists (`Kmm.trace_start!`),
the memory timeline.
"""
function memory_status(m::KmmManager = default_manager())
    text = GC.@preserve m c_text(LibKmm.kmm_manager_summary, handle(m))
    MemoryStatus(memory_stats(m, :device), memory_stats(m, :pinned), rstrip(text), figure_svg(m, :overview))
end

function Base.show(io::IO, m::KmmManager)
    if m.handle == 0
        print(io, "KmmManager(closed)")
    else
        print(io, "KmmManager(", backend(m), ", device ", m.device, ", handle 0x",
              string(m.handle, base = 16), ")")
    end
end

const _default_managers = Dict{Int,KmmManager}()
const _default_lock = ReentrantLock()

"""
    Kmm.default_manager(device = 0) -> KmmManager

The manager used when none is given: one per device, created on first use with the defaults.
If it was closed, a new one is created.
"""
function default_manager(device::Integer = 0)
    # true == 1 as a Dict key: a Bool would find device 1's manager, where KmmManager refuses it
    device isa Bool && throw_kmm_error(LibKmm.KMM_ERROR_INVALID_ARGUMENT,
                                       "default_manager: device = $device must be an integer, not a Bool")
    lock(_default_lock) do
        m = get(_default_managers, device, nothing)
        if m === nothing || m.handle == 0
            m = KmmManager(device = device)
            _default_managers[device] = m
        end
        m
    end
end

"""
    Kmm.wait_stream(mgr, stream)

Makes the manager's stream wait for the work queued so far on `stream` (a raw `CUstream` as a
`UInt64`, or with CUDA.jl loaded a `CuStream`; on the host backend, another manager's
`Kmm.stream`). Use it after work on another stream wrote memory the manager will use.
"""
wait_stream(m::KmmManager, s::Integer) =
    (GC.@preserve m LibKmm.kmm_manager_wait_stream(handle(m), arg_value(UInt64, "wait_stream", :stream, s)); m)

"""
    Kmm.signal_stream(mgr, stream)

Makes `stream` wait for the work queued so far on the manager's stream. Use it before work on
another stream reads or writes memory of the manager.
"""
signal_stream(m::KmmManager, s::Integer) =
    (GC.@preserve m LibKmm.kmm_manager_signal_stream(handle(m), arg_value(UInt64, "signal_stream", :stream, s)); m)
