# Round 4 of the adversarial tests (a tester working from the docs alone): values that own
# libkmm handles are never duplicated field by field. Each testset failed before its fix.
using Serialization

@testset "deepcopy of a KmmArray copies its data; views of one array stay views of one copy" begin
    m = KmmManager(backend = :host)
    x = KmmArray(collect(1.0:8.0); manager = m)
    d = deepcopy(x)
    fill!(d, 0.0)
    @test Array(x) == 1:8
    Kmm.unsafe_free!(d)
    @test !Kmm.isfreed(x) && Array(x) == 1:8
    # a structure holding a view and its parent: the copies share one new storage
    s = (whole = x, part = view(x, 3:4), n = 7)
    s2 = deepcopy(s)
    @test s2.whole.storage === s2.part.storage && s2.whole.storage !== x.storage
    fill!(s2.part, -1.0)
    @test Array(s2.whole) == [1, 2, -1, -1, 5, 6, 7, 8] && Array(x) == 1:8
    Kmm.unsafe_free!(x)
    @test_throws KmmError deepcopy(x)
    close(m)
end

@testset "deepcopy of a PinnedArray copies its host memory" begin
    m = KmmManager(backend = :host)
    p = PinnedArray([1.0, 2.0]; manager = m)
    q = deepcopy(p)
    q[1] = 42.0
    @test p == [1.0, 2.0] && q == [42.0, 2.0]
    Kmm.unsafe_free!(q)
    r = PinnedArray(fill(-5.0, 2); manager = m)   # may reuse the freed block
    @test !Kmm.isfreed(p) && p == [1.0, 2.0]
    close(m)
end

@testset "a manager cannot be deep-copied, and the refusal leaves it open" begin
    m = KmmManager(backend = :host)
    x = KmmArray([1.0, 2.0]; manager = m)
    @test_throws ArgumentError deepcopy(m)
    @test_throws ArgumentError deepcopy((m, 1))
    @test isopen(m) && Array(x) == [1.0, 2.0]
    close(m)
end

@testset "arrays, storages and managers refuse to be serialized" begin
    m = KmmManager(backend = :host)
    a = KmmArray(collect(1.0:4.0); manager = m)
    p = PinnedArray([1.0]; manager = m)
    for v in (a, view(a, 1:2), p, a.storage, m, (data = a,))
        err = try serialize(IOBuffer(), v); nothing catch e; e end
        @test err isa ArgumentError && occursin("cannot be serialized", sprint(showerror, err))
    end
    @test Array(a) == 1:4
    close(m)
end
