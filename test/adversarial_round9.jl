# Adversarial round 9: failing tests for defects found from the documentation and the public API.
# Each @test states the documented behaviour and fails on the code as it was found.

using Test, Kmm

# Promise: bad input gets a clear error naming the argument *and the bound*. For a device
# ordinal one past the last, `Kmm.can_access_peer` reports a range that contains the rejected
# value ("peer = 1 is not a device of this backend (0..1)" with one device; Rust's half-open
# `0..count` printed to users who read `0..1` as 1 included, as every other Kmm.jl bound is
# printed inclusive, e.g. trace_start!'s "capacity ... must be in 0..16777216", and as the
# manager's own error for the same mistake says "numbered 0 to 0").
@testset "can_access_peer's error gives the valid device range, which excludes the rejected ordinal" begin
    n = Kmm.device_count(:host)
    for (dev, peer, name, bad) in ((0, n, "peer", n), (n, 0, "device", n))
        err = try
            Kmm.can_access_peer(dev, peer; backend = :host)
            nothing
        catch e
            e
        end
        @test err isa KmmError
        err isa KmmError || continue
        @test occursin("$name = $bad", err.message)
        # the bound stated must not include the rejected ordinal
        @test !occursin("(0..$bad)", err.message)
        @test occursin("0..$(n - 1)", err.message) || occursin("0 to $(n - 1)", err.message)
    end
end
