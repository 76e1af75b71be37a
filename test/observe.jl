# Traces, memory maps, figures and the out-of-memory error, from Julia.

let m = KmmManager(backend = :host, chunk_size = 2 << 20)
    Kmm.trace_start!(m; capacity = 100)
    x = KmmArray{Float32}(undef, 250; manager = m)
    p = PinnedArray{UInt8}(undef, 64; manager = m)
    copyto!(x, ones(Float32, 250))
    Kmm.unsafe_free!(x)
    t = Kmm.trace(m)
    names = [Kmm.action_name(r) for r in t.records]
    @test names[1:2] == ["allocate", "allocate"]
    @test "free" in names
    r = t.records[1]
    @test (r.bytes, r.kind, r.in_use) == (1000, 0, 1000)
    @test t.dropped == 0 && r.thread > 0
    @test issorted([r.time_ns for r in t.records])
    @test occursin("Memory timeline", sprint(show, MIME"image/svg+xml"(), t))
    @test occursin("records", sprint(show, t))
    Kmm.trace_stop!(m)
    n = length(Kmm.trace(m).records)
    Kmm.unsafe_free!(KmmArray{UInt8}(undef, 10; manager = m))
    @test length(Kmm.trace(m).records) == n            # stopped: kept, not added to

    # CSV: RMM's columns first; the RMM form keeps RMM's three actions.
    dir = mktempdir()
    full, rmm = joinpath(dir, "full.csv"), joinpath(dir, "rmm.csv")
    Kmm.save_trace(m, full)
    Kmm.save_trace(m, rmm; rmm_only = true)
    lines = readlines(full)
    @test startswith(lines[1], "Thread,Time,Action,Pointer,Size,Stream,")
    @test length(lines) == n + 1
    @test all(l -> split(l, ',')[3] in ("allocate", "free", "allocate failure"), readlines(rmm)[2:end])

    # A file trace is written as events happen.
    live = joinpath(dir, "live.csv")
    Kmm.trace_start!(m; path = live)
    Kmm.unsafe_free!(KmmArray{UInt8}(undef, 300; manager = m))
    Kmm.trace_stop!(m)
    @test [split(l, ',')[3:5] for l in readlines(live)[2:end]] ==
          [["allocate", split(readlines(live)[2], ',')[4], "300"], ["free", split(readlines(live)[3], ',')[4], "300"]]
    @test_throws KmmError Kmm.trace(m)                 # no ring trace now

    # The map and the status.
    a = KmmArray{UInt8}(undef, 100_000; manager = m)
    b = KmmArray{UInt8}(undef, 3 << 20; manager = m)
    mm = Kmm.memory_map(m)
    used = [s for s in mm.segments if s.state != 0]
    @test sort([Int(s.requested) for s in used]) == [100_000, 3 << 20]
    @test sum(Int(s.bytes) for s in mm.segments) == memory_status(m).device.reserved
    @test occursin("Device memory map", sprint(show, MIME"image/svg+xml"(), mm))
    @test occursin("chunks", sprint(show, mm))
    @test Kmm.memory_map(m; kind = :pinned).kind === :pinned
    st = memory_status(m)
    html = sprint(show, MIME"text/html"(), st)
    @test startswith(html, "<pre>Kmm manager on") && occursin("Device memory map", html)
    @test occursin("Pinned memory map", st.svg)      # the pinned array reserved a chunk
    @test !occursin("Memory timeline", st.svg)       # the last trace was a file
    Kmm.trace_start!(m)
    @test occursin("Memory timeline", memory_status(m).svg)

    # Bad arguments name the argument and the bound.
    @test_throws KmmError Kmm.trace_start!(m; capacity = -1)
    e = try Kmm.trace_start!(m; capacity = 2^24 + 1) catch err; err end
    @test occursin("capacity = 16777217 must be in 0..16777216", e.message)
    @test_throws ArgumentError Kmm.trace_start!(m; rmm_only = true)
    @test_throws ArgumentError Kmm.trace_start!(m; path = "")
    @test_throws ArgumentError Kmm.trace_start!(m; capacity = 5, path = live)
    @test_throws KmmError Kmm.trace_start!(m; path = joinpath(dir, "no", "such", "x.csv"))
    @test_throws ArgumentError Kmm.memory_map(m; kind = :shared)
    Kmm.unsafe_free!(a); Kmm.unsafe_free!(b); Kmm.unsafe_free!(p)
    close(m)
    rm(dir; recursive = true)
end

# Out of memory explains itself and shows the map in a notebook.
let m = KmmManager(backend = :host, chunk_size = 2 << 20, hard_limit = 4 << 20)
    keep = KmmArray{UInt8}(undef, 3 << 20; manager = m)
    e = try KmmArray{UInt8}(undef, 3 << 20; manager = m) catch err; err end
    @test e isa KmmOutOfMemoryError
    msg = sprint(showerror, e)
    for words in ("3.00 MiB (3145728 bytes) of device memory", "largest free block", "fragmentation",
                  "largest holders", "hard limit 4.00 MiB", "Kmm.memory_map(manager)")
        @test occursin(words, msg)
    end
    html = sprint(show, MIME"text/html"(), e)
    @test startswith(html, "<pre>KmmOutOfMemoryError") && occursin("Device memory map", html)
    @test occursin("<svg", sprint(show, MIME"image/svg+xml"(), e))
    Kmm.unsafe_free!(keep)
    close(m)
end

# Texts from libkmm are read again when they grew between the length query and the copy (other
# threads change what is drawn), and end at their NUL when they shrank.
let texts = ["abc", "abcdefgh", "ab"], calls = Ref(0)
    function fake(buf, n, needed)
        t = texts[min(calls[] += 1, 3)]
        needed[] = sizeof(t) + 1
        if buf !== C_NULL && n > 0
            k = min(sizeof(t), n - 1)
            copyto!(buf, 1, codeunits(t), 1, k)
            buf[k+1] = 0
        end
    end
    @test Kmm.c_text(fake) == "ab"
    @test calls[] == 3
end
