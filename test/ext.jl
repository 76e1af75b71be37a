# ext/KmmCUDAExt.jl against stand-ins for CUDA.jl and Adapt.jl (neither can be installed here).
# The stand-ins mirror the documented API the extension uses; on the host backend a "device
# pointer" is a host address, so the view's memory, pins and stream ordering can be checked.
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
    end
    Base.size(c::CuArray) = c.dims
    host(c::CuArray{T}) where {T} = unsafe_wrap(Array, Ptr{T}(c.ptr.addr), c.dims)
    Base.getindex(c::CuArray, i::Int) = host(c)[i]
    Base.unsafe_wrap(::Type{CuArray}, p::CuPtr{T}, dims::NTuple{N,Int}; own::Bool = false) where {T,N} =
        CuArray{T,N}(p, dims)
    Base.copyto!(d::CuArray{T}, s::CuArray{T}) where {T} = (copyto!(host(d), host(s)); d)
    struct CuStream
        handle::Ptr{Cvoid}
    end
    const current = Ref{CuStream}()
    stream() = current[]
    struct KernelAdaptor end
    struct CuDeviceArray{T,N}
        ptr::CuPtr{T}
        dims::NTuple{N,Int}
    end
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

m = KmmManager(backend = :host)
other = KmmManager(backend = :host)          # its stream stands in for CUDA.jl's task stream
CUDA.current[] = CUDA.CuStream(Ptr{Cvoid}(UInt(Kmm.stream(other))))

x = KmmArray(collect(1.0:10.0); manager = m)
@test_throws ArgumentError CUDA.CuArray(x)                # the host backend is refused
err = try CUDA.CuArray(x) catch e e end
@test occursin("CUDA backend", sprint(showerror, err))

# past the backend check, the view's mechanics on the host backend
KmmCUDAExt.check_cuda(::KmmArray) = nothing
v = view(x, 3:6)
c = CUDA.CuArray(v)
@test c isa CUDA.CuArray{Float64,1} && size(c) == (4,)
@test CUDA.host(c) == 3:6                                  # zero-copy: the same memory, offset
@test pins(x) == 1                                         # pinned while the view lives
CUDA.host(c) .= -1                                         # "kernel" writes through the view
Kmm.wait_stream(m, CUDA.stream())                          # the CuStream method
@test Array(x) == [1, 2, -1, -1, -1, -1, 7, 8, 9, 10]
finalize(c)
@test pins(x) == 0                                         # the view's finalizer dropped the pin
@test_throws ArgumentError CUDA.CuArray(KmmArray([1.0]; manager = m, kind = :pinned))

d = Adapt.adapt_storage(CUDA.KernelAdaptor(), x)           # what @cuda does to an argument
@test d isa CUDA.CuDeviceArray{Float64,1} && d.dims == (10,)

src = KmmArray(collect(1:5); manager = other)             # stands in for a CuArray's memory
csrc = CUDA.CuArray(src)
y = KmmArray(csrc; manager = m)                            # copy into Kmm's pool
@test y isa KmmArray{Int,1} && Kmm.manager(y) === m
@test Array(y) == 1:5
@test pins(y) == 0                                         # the temporary view was finalized
@test y.storage !== src.storage
Kmm.signal_stream(m, CUDA.stream())                        # the other CuStream method

# a view outliving its manager: the finalizer's work does not throw
m2 = KmmManager(backend = :host)
x2 = KmmArray(zeros(4); manager = m2)
c2 = CUDA.CuArray(x2)
close(m2)
@test KmmCUDAExt.release_view(x2, CUDA.stream()) isa LibKmm.KmmStatus
close(m); close(other)
