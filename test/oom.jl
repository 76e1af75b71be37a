# Out of memory with a small hard limit: GC and trim make room; else KmmOutOfMemoryError.

m = KmmManager(backend = :host, hard_limit = 8 * 2^20, chunk_size = 2^20)
function fill_up(m)
    for i in 1:100                                        # 100 MiB through an 8 MiB limit
        KmmArray{UInt8}(undef, 2^20; manager = m)
    end
end
fill_up(m)                                                # dropped arrays are reclaimed by GC
@test memory_status(m).device.peak_reserved <= 8 * 2^20

keep = [KmmArray{UInt8}(undef, 2^20; manager = m) for _ in 1:6]
err = try
    KmmArray{UInt8}(undef, 4 * 2^20; manager = m); nothing
catch e
    e
end
@test err isa KmmOutOfMemoryError
@test err.bytes == 4 * 2^20
msg = sprint(showerror, err)
@test occursin("could not allocate 4194304 bytes", msg)
@test occursin("in use", msg) && occursin("reserved", msg)   # the memory_status table
@test memory_status(m).device.failed_allocs >= 1
keep = nothing
x = KmmArray{UInt8}(undef, 4 * 2^20; manager = m)          # fits once keep is collected
@test length(x) == 4 * 2^20
close(m)
