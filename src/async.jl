# Asynchronous copies: they return a KmmCopyTask that `wait` (or `fetch`) completes. Until then
# the task, and the manager's list of pending copies, keep the host and device arrays alive, so
# dropping the task early is safe.

"""
    KmmCopyTask

What `copyto_async!` returns: `wait(t)` blocks until the copy has run; `fetch(t)` does too and
returns the copy's destination (as `fetch(::Task)` returns the task's result); `Kmm.isdone(t)`
asks without blocking. A copy that failed throws from `wait` and `fetch` alike. Until the copy
has run, the task (and its manager) keep both arrays alive; after, the task keeps only the
destination, for `fetch`.
"""
mutable struct KmmCopyTask
    manager::KmmManager
    event::UInt64                 # 0 once completed
    host::Any
    device::Any
    dest::Any                     # what `fetch` returns: kept once the copy has run
end

"""
    copyto_async!(dest, src) -> KmmCopyTask

Queues a copy between a `KmmArray` and host memory (`Array`, a contiguous view of one, or a
`PinnedArray`) in either direction. The host array must not be changed (host to device) or read
(device to host) before `wait(t)` or `fetch(t)` returns; `fetch(t)` returns `dest`. Lengths must
match.

With a `PinnedArray` it returns at once. Pageable memory (an `Array`) cannot be copied by the
GPU directly: the copy goes through Kmm's pinned staging slots (`KmmManager`'s `staging_chunks`
of `staging_chunk_size` bytes), and the call returns once all but the last slots' worth is
queued, so a copy larger than the slots takes most of its time before returning (other tasks
do not run meanwhile). Use a `PinnedArray` for copies that should overlap other work.
"""
function copyto_async!(dest::KmmArray{T}, src::HostMem{T}) where {T}
    length(dest) == length(src) || throw(DimensionMismatch(
        "copyto_async!: lengths differ ($(length(dest)) and $(length(src)))"))
    # Queuing (and ordering) a copy is one of the manager's synchronous calls (`waiting`) until
    # its task is registered as pending: a `finalize` cannot destroy the manager in between.
    waiting(() -> queue_to_device(dest, src), manager(dest))
end

function queue_to_device(dest::KmmArray{T}, src::HostMem{T}) where {T}
    ds = dest.storage
    mh, h = handles(ds)
    check_live(src)   # a freed PinnedArray, also of no elements
    ev = Ref{UInt64}(0)
    if !isempty(src)
        check_restoring(ds) do
            GC.@preserve ds src @gcsafe LibKmm.unchecked_kmm_copy_to_device_async(mh, h, UInt64(dest.offset),
                Ptr{Cvoid}(pointer(src)), UInt64(sizeof(T) * length(src)), ev)
        end
        order_task_host!(manager(dest), src, ev[])
    end
    register_task!(KmmCopyTask(manager(dest), ev[], src, dest, dest))
end

function copyto_async!(dest::HostMem{T}, src::KmmArray{T}) where {T}
    length(dest) == length(src) || throw(DimensionMismatch(
        "copyto_async!: lengths differ ($(length(dest)) and $(length(src)))"))
    waiting(() -> queue_to_host(dest, src), manager(src))
end

function queue_to_host(dest::HostMem{T}, src::KmmArray{T}) where {T}
    ss = src.storage
    mh, h = handles(ss)
    check_live(dest)
    ev = Ref{UInt64}(0)
    if !isempty(src)
        check_restoring(ss) do
            GC.@preserve ss dest @gcsafe LibKmm.unchecked_kmm_copy_to_host_async(mh, Ptr{Cvoid}(pointer(dest)), h,
                UInt64(src.offset), UInt64(sizeof(T) * length(src)), ev)
        end
        order_task_host!(manager(src), dest, ev[])
    end
    register_task!(KmmCopyTask(manager(src), ev[], dest, src, dest))
end

"""Orders a pinned host array of another manager after the copy just queued (event `ev`);
if that fails (its manager closed meanwhile), waits for the copy before passing the error on."""
function order_task_host!(m::KmmManager, host, ev::UInt64)
    ok = false
    try
        ordered = order_host_memory!(m, host)
        ok = true
        # Not ordered (a pinned array of another backend's manager): the task is done only
        # once the copy has run, so its arrays' frees cannot come first.
        ordered || poll_until(() -> event_done(m, ev))
    finally
        ok || wait_event(m, ev)
    end
    nothing
end

function register_task!(t::KmmCopyTask)
    t.event == 0 && return t
    m = t.manager
    complete_pending!(m)
    lock(m.lock) do
        push!(m.pending, t)
    end
    t
end

"Destroys the event and drops the references of a task whose copy has run."
function finish!(t::KmmCopyTask)
    ev = claim_event!(t)   # of two tasks finishing it (two waits, a wait and a synchronize), one destroys it
    mh = t.manager.handle
    ev != 0 && mh != 0 && LibKmm.unchecked_kmm_event_destroy(mh, ev)
    t.host = nothing
    t.device = nothing
    nothing
end

"""
Completes the manager's pending copies that have run: those found done, and those of `ran`,
known to have run (the tasks pending before an event that has completed; never the tasks other
threads queued after it).
"""
function complete_pending!(m::KmmManager, ran = ())
    lock(() -> drop_finished!(m.pending, ran), m.lock)
    nothing
end

"Finishes and drops the tasks of `pending` whose copies have run (see `complete_pending!`); the caller holds the manager's lock."
function drop_finished!(pending::Vector{Any}, ran = ())
    filter!(pending) do t
        t.event == 0 && return false
        (t in ran || isdone(t)) || return true
        finish!(t)
        false
    end
end

"""
    Kmm.isdone(t::KmmCopyTask) -> Bool

Whether the copy has run (non-blocking).
"""
function isdone(t::KmmCopyTask)
    ev = t.event
    ev == 0 && return true
    m = t.manager
    mh = m.handle
    mh == 0 && return m.destroyed[]
    done = Ref{Bool}(false)
    st = GC.@preserve m LibKmm.unchecked_kmm_event_query(mh, ev, done)
    st == LibKmm.KMM_OK && return done[]
    # Another task finished the copy meanwhile (it claims the event before destroying it,
    # and only once the copy has run), or the manager was closed: not an error.
    t.event != ev && return true
    m.handle == 0 && return m.destroyed[]
    throw_kmm_error(st)
end

"Takes `t.event` (0 if another caller took it first); see `claim_handle!`."
@inline function claim_event!(t::KmmCopyTask)
    lock(_claim_lock)
    ev = t.event
    t.event = 0
    unlock(_claim_lock)
    return ev
end

function Base.wait(t::KmmCopyTask)
    t.event == 0 && return nothing
    poll_until(() -> isdone(t))   # yields to other tasks while the copy runs
    m = t.manager
    lock(m.lock) do
        filter!(x -> x !== t, m.pending)
    end
    finish!(t)
    nothing
end

"""
    fetch(t::KmmCopyTask) -> dest

Waits for the copy as `wait(t)` does (polling and yielding to other tasks; a failure throws)
and returns its destination, the `dest` of `copyto_async!(dest, src)`.
"""
function Base.fetch(t::KmmCopyTask)
    wait(t)
    t.dest
end

# Asks whether the copy ran (as `isdone`); a failure to ask shows as pending, never throws.
Base.show(io::IO, t::KmmCopyTask) =
    print(io, "KmmCopyTask(", (try isdone(t) catch; false end) ? "done" : "pending", ")")
