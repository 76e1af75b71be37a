# Arrays on several host stand-in devices (run by devices.jl in a child process with
# KMM_HOST_DEVICES set): managers per device, copies between every pair of devices.

n = Kmm.device_count()
@test n == parse(Int, ENV["KMM_HOST_DEVICES"])
@test Kmm.device_count(:host) == n
managers = [KmmManager(device = d, staging_chunk_size = 16384, staging_chunks = 2) for d in 0:n-1]
@test [Kmm.device(m) for m in managers] == 0:n-1

@testset "peer pairs" begin
    for a in 0:n-1, b in 0:n-1
        @test Kmm.can_access_peer(a, b) == (a != b && a ÷ 2 == b ÷ 2)
    end
    @test_throws KmmError Kmm.can_access_peer(0, n)
    @test_throws ArgumentError Kmm.device_count(:gpu)
end

@testset "copies between devices $a -> $b" for a in 0:n-1, b in 0:n-1
    a == b && continue
    host = rand(Float32, 3000, 7)    # 84 kB: six slots of the 16 kB staging ring
    x = KmmArray(host; manager = managers[a+1])
    @test Kmm.device(x) == a
    y = KmmArray(x; manager = managers[b+1])          # device to device
    @test Kmm.device(y) == b && Kmm.manager(y) === managers[b+1]
    @test Array(y) == host
    z = KmmArray{Float32}(undef, 5000; manager = managers[b+1])
    fill!(z, -1f0)
    copyto!(z, 11, view(x, 100:3099), 1, 3000)        # offsets on both sides
    zh = Array(z)
    @test zh[11:3010] == vec(host)[100:3099]
    @test all(==(-1f0), zh[1:10]) && all(==(-1f0), zh[3011:end])
    # The source is changed right after the copy is queued: the copy saw the old values.
    w = KmmArray{Float32}(undef, size(host); manager = managers[b+1])
    copyto!(w, x)
    fill!(x, 0f0)
    @test Array(w) == host
    foreach(Kmm.unsafe_free!, (x, y, z, w))
end

@testset "bad devices" begin
    err = try KmmManager(device = n); nothing catch e; e end
    @test err isa KmmError && occursin("device $n", sprint(showerror, err))
    @test_throws KmmError KmmManager(device = -1)
end
foreach(close, managers)
@test Kmm.live_managers() == 0 || Kmm.live_managers() == 1    # a default manager may exist
