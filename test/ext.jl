# ext/KmmCUDAExt.jl against stand-ins for CUDA.jl and Adapt.jl (neither can be installed here).
# The stand-ins mirror the documented API the extension uses; on the host backend a "device
# pointer" is a host address, so the view's memory, pins and stream ordering can be checked.
# Like CUDA.jl, arrays derived from a CuArray (reshape, vec, contiguous views) are new CuArrays
# over the same memory that do not refer to the first one; a "kernel" (broadcast, mapreduce,
# copyto!) runs on the host over the memory its arguments adapt to, and is recorded in `calls`.
# What this cannot check: CUDA.jl itself, real device memory, Julia >= 1.9 extension loading.

module ExtHarness

module CUDA
    export CuArray, CuPtr, CuStream                   # as CUDA.jl exports them
    struct CuPtr{T}
        addr::UInt
    end
    mutable struct CuArray{T,N} <: AbstractArray{T,N}
        ptr::CuPtr{T}
        dims::NTuple{N,Int}
        owned::Any                                    # memory CUDA.jl allocated (host here), or nothing
    end
    CuArray{T,N}(p::CuPtr{T}, dims::NTuple{N,Int}) where {T,N} = CuArray{T,N}(p, dims, nothing)
    function alloc(::Type{T}, dims::NTuple{N,Int}) where {T,N}
        a = Array{T,N}(undef, dims)
        CuArray{T,N}(CuPtr{T}(UInt(pointer(a))), dims, a)
    end
    Base.size(c::CuArray) = c.dims
    host(c::CuArray{T}) where {T} = unsafe_wrap(Array, Ptr{T}(c.ptr.addr), c.dims)
    Base.getindex(c::CuArray, i::Int) = error("scalar indexing of a CuArray")
    CuArray{T,N}(::UndefInitializer, dims::NTuple{N,Int}) where {T,N} = alloc(T, dims)
    function Base.unsafe_wrap(::Type{CuArray}, p::CuPtr{T}, dims::NTuple{N,Int}; own::Bool = false) where {T,N}
        # CUDA.jl asks the driver what memory the pointer is: a null one is an error (CUDA.jl#1985)
        p.addr == 0 && error("unsafe_wrap: cuPointerGetAttribute failed for a null pointer")
        CuArray{T,N}(p, dims)
    end
    Base.reshape(c::CuArray{T}, dims::Dims{N}) where {T,N} = CuArray{T,N}(c.ptr, dims)
    Base.view(c::CuArray{T,1}, r::UnitRange{Int}) where {T} =
        CuArray{T,1}(CuPtr{T}(c.ptr.addr + (first(r) - 1) * sizeof(T)), (length(r),))

    const calls = Tuple{Symbol,UInt}[]               # (what ran, the destination's or source's address)
    Base.copyto!(d::CuArray{T}, s::CuArray{T}) where {T} =
        (push!(calls, (:copyto, s.ptr.addr)); copyto!(host(d), host(s)); d)
    Base.copyto!(d::CuArray{T}, s::Array{T}) where {T} =      # CUDA.jl's uploads and downloads
        (push!(calls, (:upload, d.ptr.addr)); copyto!(host(d), s); d)
    Base.Array(c::CuArray) = (push!(calls, (:download, c.ptr.addr)); copy(host(c)))

    struct CuArrayStyle{N} <: Broadcast.AbstractArrayStyle{N} end
    CuArrayStyle{M}(::Val{N}) where {M,N} = CuArrayStyle{N}()
    Base.BroadcastStyle(::Type{<:CuArray{T,N}}) where {T,N} = CuArrayStyle{N}()
    Base.similar(bc::Broadcast.Broadcasted{CuArrayStyle{N}}, ::Type{T}) where {N,T} =
        alloc(T, length.(axes(bc)))
    struct KernelAdaptor end
    struct CuDeviceArray{T,N}
        ptr::CuPtr{T}
        dims::NTuple{N,Int}
    end
    # a kernel's view of its arguments: what Adapt makes of them, read through host memory
    on_device(x) = parentmodule(@__MODULE__).Adapt.adapt_storage(KernelAdaptor(), x)
    on_device(bc::Broadcast.Broadcasted) = Broadcast.Broadcasted{Nothing}(bc.f, map(on_device, bc.args), bc.axes)
    hostside(d::CuDeviceArray{T}) where {T} = unsafe_wrap(Array, Ptr{T}(d.ptr.addr), d.dims)
    hostside(bc::Broadcast.Broadcasted) = Broadcast.Broadcasted{Nothing}(bc.f, map(hostside, bc.args), bc.axes)
    hostside(x) = x
    function Base.copyto!(d::CuArray, bc::Broadcast.Broadcasted{Nothing})
        push!(calls, (:broadcast, d.ptr.addr))
        copyto!(host(d), hostside(on_device(bc)))
        d
    end
    function Base.mapreduce(f, op, c::CuArray; dims = :, kw...)
        push!(calls, (:mapreduce, c.ptr.addr))
        r = mapreduce(f, op, host(c); dims = dims, kw...)
        dims === (:) ? r : (g = alloc(eltype(r), size(r)); host(g) .= r; g)
    end

    mutable struct CuStream                           # mutable, with a finalizer, as CUDA.jl's
        handle::Ptr{Cvoid}
    end
    const current = Ref{CuStream}()
    stream() = current[]

    struct CuDevice                                   # 0-based ordinal, as CUDA.jl's handle
        handle::Int
    end
    const current_device = Ref(0)
    device() = CuDevice(current_device[])
    deviceid(d::CuDevice) = d.handle
end

module Adapt
    adapt_storage(to, x) = x
end

Adapt.adapt_storage(::CUDA.KernelAdaptor, c::CUDA.CuArray{T,N}) where {T,N} =
    CUDA.CuDeviceArray{T,N}(c.ptr, c.dims)

const source = replace(replace(read(joinpath(@__DIR__, "..", "ext", "KmmCUDAExt.jl"), String),
                               "using CUDA\n" => "using ..CUDA\n"), "using Adapt\n" => "using ..Adapt\n")
include_string(ExtHarness, source, "ext/KmmCUDAExt.jl")
end

using .ExtHarness: CUDA, Adapt, KmmCUDAExt
using Kmm: LibKmm

pins(x) = (r = Ref{LibKmm.KmmBufferInfo}();
           LibKmm.kmm_buffer_info(x.storage.manager.handle, x.storage.handle, r); r[].pins)
address(x) = (a = Kmm.map_storage(x.storage); Kmm.unmap_storage(x.storage); a)
task_stream(m) = CUDA.CuStream(Ptr{Cvoid}(UInt(Kmm.stream(m))))
ran(what) = [c[1] for c in CUDA.calls if c[1] == what]

m = KmmManager(backend = :host)
other = KmmManager(backend = :host)          # its stream stands in for CUDA.jl's task stream
CUDA.current[] = task_stream(other)

x = KmmArray(collect(1.0:10.0); manager = m)
@test_throws ArgumentError CUDA.CuArray(x)                # the host backend is refused
err = try CUDA.CuArray(x) catch e e end
@test occursin("CUDA backend", sprint(showerror, err))
@test pins(x) == 0

# past the backend check, the view's mechanics on the host backend
KmmCUDAExt.on_cuda(::KmmArray) = true

@testset "the view: zero-copy, pinned for the storage's life" begin
    v = view(x, 3:6)
    c = CUDA.CuArray(v)
    @test c isa CUDA.CuArray{Float64,1} && size(c) == (4,)
    @test CUDA.host(c) == 3:6                              # zero-copy: the same memory, offset
    @test pins(x) == 1                                     # the storage is pinned
    CUDA.host(c) .= -1                                     # "kernel" writes through the view
    Kmm.wait_stream(m, CUDA.stream())                      # the CuStream method
    @test Array(x) == [1, 2, -1, -1, -1, -1, 7, 8, 9, 10]
    c2 = CUDA.CuArray(x)                                   # a second view: the same pin
    @test pins(x) == 1 && CUDA.host(c2)[3] == -1
    finalize(c); finalize(c2)
    @test pins(x) == 1                                     # no view's death unpins
    @test_throws ArgumentError CUDA.CuArray(KmmArray([1.0]; manager = m, kind = :pinned))

    d = Adapt.adapt_storage(CUDA.KernelAdaptor(), x)       # what @cuda does to an argument
    @test d isa CUDA.CuDeviceArray{Float64,1} && d.dims == (10,)

    src = KmmArray(collect(1:5); manager = other)         # stands in for a CuArray's memory
    csrc = CUDA.CuArray(src)
    y = KmmArray(csrc; manager = m)                        # copy into Kmm's pool
    @test y isa KmmArray{Int,1} && Kmm.manager(y) === m
    @test Array(y) == 1:5
    @test pins(y) == 0                                     # the copy's own view is not kept
    @test y.storage !== src.storage
    Kmm.signal_stream(m, CUDA.stream())                    # the other CuStream method
    Kmm.unsafe_free!(x)
    @test_throws Kmm.KmmError CUDA.CuArray(x)              # a freed storage hands out no address
end

# An array CUDA.jl derived from the view, the view itself collected: the storage stays pinned,
# and a compaction that would move it (it does without a view) leaves it where the derived
# array points.
@noinline derive(x) = (c = CUDA.CuArray(x); view(vec(reshape(c, 512, 512)), 1:1024))  # no ref to c or x
function compaction_scenario(with_view::Bool)
    mc = KmmManager(backend = :host, chunk_size = 2 * 2^20, compaction_ratio_pct = 100)
    xs = [KmmArray(fill(UInt8(i), 256 * 2^10); manager = mc) for i in 1:8]
    derived = with_view ? derive(xs[3]) : nothing
    GC.gc(); GC.gc()                                       # the view c is gone
    before = address(xs[3])
    pinned = pins(xs[3])
    foreach(Kmm.unsafe_free!, xs[2:2:8])
    big = KmmArray{UInt8}(undef, 768 * 2^10; manager = mc)     # makes room by moving arrays
    fill!(big, 0xff)
    moved = address(xs[3]) != before
    seen = derived === nothing ? nothing : copy(CUDA.host(derived))
    compactions = Kmm.memory_stats(mc).compactions
    close(mc)
    return (pinned = pinned, moved = moved, seen = seen, compactions = compactions)
end

@testset "derived arrays and a collection: the storage stays pinned and in place" begin
    control = compaction_scenario(false)
    @test control.compactions >= 1 && control.moved && control.pinned == 0   # it would move
    r = compaction_scenario(true)
    @test r.pinned == 1                                    # the view's collection left the pin
    @test r.compactions >= 1 && !r.moved                   # compaction moved others, not it
    @test r.seen == fill(0x03, 1024)                       # the derived array reads its memory
end

"""
Whether a fresh manager's stream, after `action(setup(manager))`, has waited for long work
queued on the task stream (another fresh manager's stream) before the action.
"""
function waits_for_task_stream(setup, action)
    mk = KmmManager(backend = :host)
    ok = KmmManager(backend = :host)
    main = CUDA.current[]
    CUDA.current[] = task_stream(ok)
    busy = KmmArray{UInt8}(undef, 256 * 2^20; manager = ok)
    action(setup(mk))                                      # compiled before it is timed
    Kmm.synchronize(mk); Kmm.synchronize(ok)
    state = setup(mk)
    foreach(i -> fill!(busy, UInt8(i)), 1:4)               # long work on the task stream
    ev = Ref{UInt64}(0)
    LibKmm.kmm_manager_record_event(ok.handle, ev)
    action(state)
    Kmm.synchronize(mk)
    done = Ref{Bool}(false)
    LibKmm.kmm_event_query(ok.handle, ev[], done)
    Kmm.synchronize(ok)
    LibKmm.kmm_event_destroy(ok.handle, ev[])
    CUDA.current[] = main
    close(mk); close(ok)
    return done[]
end

@testset "the free waits for the recorded task stream; operations order Kmm after CUDA.jl" begin
    plain(mk) = KmmArray(zeros(16); manager = mk)
    viewed(mk) = (z = plain(mk); CUDA.CuArray(z); z)
    @test !waits_for_task_stream(plain, Kmm.unsafe_free!)  # nothing recorded: no reason to wait
    @test waits_for_task_stream(viewed, Kmm.unsafe_free!)  # the release of the pin, stream-ordered
    # an operation's temporary views: the manager's later work waits for CUDA.jl's
    @test waits_for_task_stream(plain, a -> a .+ 1)
    @test waits_for_task_stream(plain, a -> sum(a))
end

# The scenario runs in functions: top-level code may keep its intermediate values alive.
@noinline function view_on_own_stream!(keep, m3, o3, seen_in_use)
    s = task_stream(o3)
    finalizer(_ -> (seen_in_use[] = Kmm.memory_stats(m3).in_use), s)
    z = KmmArray(ones(64); manager = m3)
    main = CUDA.current[]
    CUDA.current[] = s
    CUDA.CuArray(z)
    CUDA.current[] = main
    keep[] = z                                             # the only reference to z
    return nothing
end
@noinline fresh_view(m) = (CUDA.CuArray(KmmArray(ones(4); manager = m)); nothing)
function stream_hold_scenario(m)
    m3 = KmmManager(backend = :host)
    o3 = KmmManager(backend = :host)
    seen_in_use = Ref{Any}(nothing)                        # m3's bytes in use when the stream died
    keep = Ref{Any}(nothing)
    view_on_own_stream!(keep, m3, o3, seen_in_use)
    GC.gc(); GC.gc()
    held = seen_in_use[] === nothing                       # held while z's storage lives
    keep[] = nothing
    GC.gc(); GC.gc()                                       # z's storage is freed
    fresh_view(m)                                          # a later view lets unused streams go
    GC.gc(); GC.gc()
    after = seen_in_use[]
    close(m3); close(o3)
    return (held = held, in_use_at_death = after)
end

@testset "a recorded stream is held until the storage is freed" begin
    r = stream_hold_scenario(m)
    @test r.held
    @test r.in_use_at_death == 0                           # the stream died after the free
end

@testset "copies, broadcasts, map and reductions run through the views" begin
    a = KmmArray(collect(1.0:8.0); manager = m)
    b = KmmArray(fill(2.0, 8); manager = m)
    empty!(CUDA.calls)
    r = a .* b .+ 1                                        # no scalar indexing: it would throw
    @test r isa KmmArray{Float64,1} && Kmm.manager(r) === m
    @test Array(r) == 2 .* (1:8) .+ 1
    @test CUDA.calls == [(:broadcast, address(r))]         # one kernel, writing r's memory
    @test pins(a) == pins(b) == pins(r) == 0               # its views were temporary
    a .= a .- 1                                            # in place, into a KmmArray
    @test Array(a) == 0:7
    g = CUDA.alloc(Float64, (8,))
    g .= a .+ b                                            # into a CuArray, mixed styles
    @test CUDA.host(g) == (0:7) .+ 2
    h = a .+ g                                             # KmmArray and CuArray: a KmmArray
    @test h isa KmmArray && Array(h) == 2 .* (0:7) .+ 2
    @test length(ran(:broadcast)) == 4
    mp = map(+, a, b)
    @test mp isa KmmArray && Array(mp) == (0:7) .+ 2
    @test Array(map(abs2, a)) == (0:7) .^ 2
    @test length(ran(:broadcast)) == 6
    @test sum(a) == 28 && maximum(b) == 2 && mapreduce(abs2, +, a) == 140
    @test length(ran(:mapreduce)) == 3
    s2 = sum(reshape(a, 2, 4); dims = 1)                   # a `dims` reduction stays in Kmm
    @test s2 isa KmmArray{Float64,2} && Array(s2) == [1.0 5.0 9.0 13.0]
    empty!(CUDA.calls)
    copyto!(g, b)                                          # KmmArray -> CuArray
    @test CUDA.host(g) == fill(2.0, 8) && CUDA.calls == [(:copyto, address(b))]
    CUDA.host(g) .= 5
    copyto!(a, g)                                          # CuArray -> KmmArray
    @test Array(a) == fill(5.0, 8) && CUDA.calls[end] == (:copyto, g.ptr.addr)
    @test pins(a) == pins(b) == 0
    # memory CUDA.jl cannot use (pinned host memory) keeps Base's element loop and its rules
    p = KmmArray(collect(1.0:3.0); manager = m, kind = :pinned)
    @test_throws ErrorException p .+ 1
    @test Array(Kmm.@allowscalar(p .+ 1)) == 2:4
    @test Kmm.@allowscalar(sum(p)) == 6
    # no ambiguity between the extension's methods and those it extends
    fs = (copyto!, similar, map, mapreduce, Kmm.device_mapreduce, Base.BroadcastStyle)
    @test count(mt -> mt.module === KmmCUDAExt, collect(Iterators.flatten(methods.(fs)))) == 9
    @test isempty([(e, mt) for f in fs for e in methods(f) if e.module === KmmCUDAExt
                   for mt in methods(f) if mt !== e && Base.isambiguous(e, mt)])
end

# Found by a review against CUDA.jl's source (2026-11-29): an empty KmmArray's address is 0,
# which unsafe_wrap refuses; a manager on another device than CUDA.jl's current one gave views
# tagged with the wrong context; and CUDA.jl before 5.2 calls its kernel adaptor `Adaptor`.
@testset "empty arrays, the current device and the kernel adaptor's name" begin
    e = KmmArray{Float64}(undef, 0; manager = m)
    c = CUDA.CuArray(e)
    @test c isa CUDA.CuArray{Float64,1} && isempty(c) && pins(e) == 0
    @test isempty(e .+ 1) && (e .= 2; true)
    @test Adapt.adapt_storage(CUDA.KernelAdaptor(), e) isa CUDA.CuDeviceArray{Float64,1}
    x2 = KmmArray([1.0, 2.0]; manager = m)
    CUDA.current_device[] = 1
    try
        err = try CUDA.CuArray(x2) catch ex ex end
        @test err isa ArgumentError && occursin("CUDA.device!(0)", sprint(showerror, err))
        @test_throws ArgumentError x2 .+ 1
        @test pins(x2) == 0
    finally
        CUDA.current_device[] = 0
    end
    @test Array(x2 .+ 1) == [2.0, 3.0]
    Before52 = Module(:Before52)
    Core.eval(Before52, :(struct Adaptor end))
    @test KmmCUDAExt.kernel_adaptor(Before52) === Before52.Adaptor
    @test KmmCUDAExt.kernel_adaptor(CUDA) === CUDA.KernelAdaptor
end

# the adversarial runs' regressions that need these stand-ins
include("adversarial_ext.jl")
adversarial_ext_tests(CUDA, task_stream)

# views left from above hold other's stream (recorded): their storages go before the managers
GC.gc()
close(m); close(other)
