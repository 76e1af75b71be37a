"""Adversarial review of 70b5a61 + d584124 (`kmm._lifetime.end_export`: an export token
finalized during a cyclic collection is watched, and ended at the collection's end unless a
finalizer kept its export). The first six tests failed on that code; fixed since: a kept export
gets a fresh token, DLPack imports are watched too, the count of running collections stays at 0
or above, and exports stay live at exit. Each test targets one suspected defect (its docstring
says which); gc-order-sensitive cases run in a fresh interpreter (`_run`). Host backend."""

import pytest

from _gc_scripts import BACKEND, KIND, ok as _ok, lines as _lines, run as _run



def _assert_counted_and_kept(r):
    """After kmm was imported during a collection: no collection counted as running, and the
    view kept by #KEEP_AND_REUSE kept its memory."""
    out = _ok(r)
    assert out.get("running") == "0", "the collection counter is off after an import during a collection:\n" + r.stdout
    assert out.get("same_address") == "False" and out.get("new_buffer") == "b'\\x00\\x00\\x00\\x00'", (
        "a kept view's memory was freed and reused:\n" + r.stdout)

# =============================================================================================
# Findings (expected to FAIL on d584124)
# =============================================================================================

def test_kmm_first_imported_inside_a_finalizer_inverts_the_collection_bookkeeping():
    """`_lifetime` appends its gc callback at import. Imported for the first time while a
    collection runs (a lazy `import kmm` in a `__del__`), the callback sees that collection's
    "stop" without its "start": `running` becomes -1 for the life of the process, so every later
    collection runs with `running == 0` (frees and export ends made at once, inside the
    collection) and the stop-time sweep never runs. The kept-view fix (and the older deferral)
    are then both off: the kept view's memory is freed and handed out again."""
    r = _run("""
        class Importer:
            def __del__(self):
                import kmm          # first import, during a collection
        i = Importer(); i.me = i
        del i
        gc.collect()
        import kmm
        #WATCHED
        print("running", running[0])
        #KEEP_AND_REUSE
    """)
    _assert_counted_and_kept(r)


def test_kmm_imported_by_another_thread_while_a_collection_waits_inverts_the_bookkeeping():
    """As above, without any import inside a finalizer: another thread imports kmm while the
    main thread's collection waits in a finalizer (the GIL released: a join, a sleep, I/O).
    The callback is registered between the collection's "start" and "stop"; `running` ends at
    -1 and the deferral is off for good."""
    r = _run("""
        def importer():
            import kmm
        class Waits:
            def __del__(self):
                t = threading.Thread(target=importer)
                t.start(); t.join()   # the GIL is released while the collection runs
        w = Waits(); w.me = w
        del w
        gc.collect()
        import kmm
        #WATCHED
        print("running", running[0])
        #KEEP_AND_REUSE
    """)
    _assert_counted_and_kept(r)


def test_a_kept_host_view_of_a_dlpack_import_keeps_the_producers_memory():
    """The fix covers `host_view` tokens only. A kmm buffer imported by DLPack from another kmm
    buffer (closed by its owner: "frees the memory when the last export lets go") is released by
    the DLPack deleter, which `dlpack._Imported.__del__` defers with `later` to the end of the
    collection, not to the end of the kept view. A finalizer keeps a `host_view()` of the
    imported buffer: at the collection's end the deleter ends the producer's export, the
    producer's memory is freed while the kept view shows it, the next allocation gets the
    address and writes through the kept view land in the new buffer."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(1 << 20)
        addr = b.ptr
        arr = kmm.from_dlpack(b, manager=m)     # a kmm array over b's memory
        mv = arr.buffer.host_view()
        b.close()                                 # freed when the last export (the import) ends
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.mv)
        h = Holder(); h.me = h; h.mv = mv; h.arr = arr
        del b, arr, mv, h
        gc.collect()
        nb = m.alloc(1 << 20)
        nb.copy_from_host(np.zeros(1 << 20, np.uint8))
        print("same_address", nb.ptr == addr)
        kept[0][:4] = b"\\xab\\xab\\xab\\xab"
        print("new_buffer", bytes(nb.copy_to_host(nbytes=4)))
    """)
    out = _ok(r)
    assert out.get("same_address") == "False", "a freed address was handed out while a kept view showed it:\n" + r.stdout
    assert out.get("new_buffer") == "b'\\x00\\x00\\x00\\x00'", "a write through a kept view corrupted another buffer:\n" + r.stdout


def test_a_view_kept_past_the_last_collection_at_exit_keeps_its_memory():
    """The interpreter's last collections (`_PyGC_CollectNoFail` at exit) call no gc callbacks:
    `running` is 0 there, so `end_export` ends a token of the garbage at once, the buffer is
    freed and the manager destroyed inside that collection, while an object a finalizer made
    (and that dies after the finalizers) still holds the view and writes through it: SIGSEGV at
    exit (the export count is already 0 when the writer runs)."""
    r = _run("""
        import kmm
        def _w(s, write=os.write): write(1, s.encode())
        class Writer:
            def __init__(self, mv, b): self.mv = mv; self.b = b
            def __del__(self, _w=_w, sleep=time.sleep):
                _w("exports %d\\n" % self.b._exports)
                sleep(0.3)                      # the deferred teardown runs on a background thread
                self.mv[:4] = b"\\xab\\xab\\xab\\xab"
                _w("wrote 1\\n")
        class Holder:
            def __del__(self, Writer=Writer):
                self.w = Writer(self.mv, self.b)   # keeps the view past the finalizers
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(16 << 20)
        mv = b.host_view()
        h = Holder(); h.me = h; h.mv = mv; h.b = b
        del m, b, mv
        print("exiting", flush=True)
    """)
    assert r.returncode == 0, "exit status %d (a write through a view kept at the last collection)\n%s\n%s" % (
        r.returncode, r.stdout, r.stderr[-2000:])
    out = _lines(r)
    assert out.get("exports") == "1", "the export ended while a kept view lived:\n" + r.stdout
    assert out.get("wrote") == "1", r.stdout


def test_a_view_kept_on_its_own_manager_is_never_freed():
    """A watched token is a GC root (the watch list holds it strongly), and it holds its release
    closure, the buffer and the manager. A finalizer that keeps the view somewhere reachable
    from them (an attribute of the manager here) builds a cycle manager -> view -> token ->
    manager that the watch list keeps reachable: once the user drops the manager, no collection
    ever frees it (nor its memory), where the same cycle made without a collection in between is
    collected."""
    r = _run("""
        import kmm
        def scenario(through_finalizer):
            m = kmm.Manager(backend=BACKEND)
            b = m.alloc(1 << 20)
            mv = b.host_view()
            class Holder:
                def __del__(self):
                    self.m.keep = self.mv           # kept on the manager
            if through_finalizer:
                h = Holder(); h.me = h; h.mv = mv; h.m = m
                del h
            else:
                m.keep = mv
            del b, mv
            gc.collect()
            wr = weakref.ref(m)
            del m
            for _ in range(3):
                gc.collect()
            return wr() is None
        print("control_freed", scenario(False))
        print("kept_freed", scenario(True))
    """)
    out = _ok(r)
    assert out.get("control_freed") == "True", r.stdout
    assert out.get("kept_freed") == "True", "the manager (and its memory) leaked for good:\n" + r.stdout


def test_releasing_a_kept_view_frees_its_memory_without_waiting_for_a_collection():
    """`host_view` promises "a close() meanwhile frees it once the view ... is released or
    collected", and a view released outside a collection ends its export at once. A view kept
    by a finalizer past a collection, once released (`release()` and dropped), frees nothing
    until some later cyclic collection runs: with `gc.disable()` (common in latency-sensitive
    loops) never. (docs/python.md's new sentence states the delay; the `host_view` docstring
    and the Buffer docstring do not.)"""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(1 << 20)
        mv = b.host_view()
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.mv)
        h = Holder(); h.me = h; h.mv = mv
        del b, mv, h
        gc.collect()
        gc.disable()
        print("held", m.stats(KIND)["live_buffers"])
        kept[0].release()
        del kept[:]
        x = [[] for _ in range(10000)]          # no collection: gc is disabled
        print("released", m.stats(KIND)["live_buffers"])
    """)
    out = _ok(r)
    assert out.get("held") == "1", r.stdout
    assert out.get("released") == "0", "a released kept view's memory stays held until a collection:\n" + r.stdout


# =============================================================================================
# Claims checked (expected to pass)
# =============================================================================================

KEPT_FORMS = {
    "frombuffer": "np.frombuffer(self.mv, np.uint8)",
    "asarray": "np.asarray(self.mv)",
    "slice": "self.mv[16:]",
    "cast": "self.mv.cast('I')",
    "toreadonly": "self.mv.toreadonly()",
    "ctypes_obj": "self.mv.obj",
    "from_buffer": "(ctypes.c_ubyte * 64).from_buffer(self.mv)",
    "memoryview_of_obj": "memoryview(self.mv.obj)",
}


def test_views_in_every_form_a_finalizer_keeps_hold_their_memory_until_dropped():
    """Kept as a NumPy array (frombuffer/asarray), a slice, a cast, a read-only view, the
    ctypes array, a ctypes array over it, a new memoryview of the ctypes array: the memory stays
    with the kept object (no address reuse, writes never reach new buffers), and is freed at the
    first collection after it is dropped."""
    r = _run("""
        import kmm
        FORMS = %r
        for name, expr in FORMS.items():
            m = kmm.Manager(backend=BACKEND)
            b = m.alloc(1 << 16)
            addr = b.ptr
            mv = b.host_view()
            kept = []
            ns = {"np": np, "ctypes": ctypes}
            class Holder:
                def __del__(self):
                    kept.append(eval(expr, ns, {"self": self}))
            h = Holder(); h.me = h; h.mv = mv
            del b, mv, h
            gc.collect()
            held = m.stats(KIND)["live_buffers"]
            news = [m.alloc(1 << 16) for _ in range(8)]
            for nb in news:
                nb.fill(b"\\x00")
            k = kept[0]
            target = np.frombuffer(k, np.uint8) if not isinstance(k, np.ndarray) else k.view(np.uint8).reshape(-1)
            if target.flags.writeable:
                target[:4] = 0xAB
            clean = all(bytes(nb.copy_to_host(nbytes=1 << 16)) == bytes(1 << 16) for nb in news)
            reused = any(nb.ptr == addr for nb in news)
            del news, nb, target, k
            del kept[:]
            gc.collect()
            print(name, held, reused, clean, m.stats(KIND)["live_buffers"])
            m.close()
    """ % KEPT_FORMS)
    out = _ok(r)
    for name in KEPT_FORMS:
        assert out.get(name) == "1 False True 0", "%s: held reused clean after = %s\n%s" % (name, out.get(name), r.stdout)


def test_several_tokens_some_kept_some_not():
    """Three buffers (one of them with two views) in one garbage cycle; the finalizer keeps one
    view of b1 and nothing of b2, b3: after the collection only b1 is live, and the kept view's
    export has a fresh token (the watch list is empty); after the kept view is dropped, none."""
    r = _run("""
        import kmm
        #WATCHED
        m = kmm.Manager(backend=BACKEND)
        bs = [m.alloc(4096) for _ in range(3)]
        views = [bs[0].host_view(), bs[0].host_view(), bs[1].host_view(), bs[2].host_view()]
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.views[1])
        h = Holder(); h.me = h; h.views = views
        del bs, views, h
        gc.collect()
        print("after_collect", m.stats(KIND)["live_buffers"], len(watched))
        kept[0][:] = b"\\x01" * 4096
        del kept[:]
        gc.collect()
        print("after_drop", m.stats(KIND)["live_buffers"], len(watched))
    """)
    out = _ok(r)
    assert out.get("after_collect") == "1 0", r.stdout
    assert out.get("after_drop") == "0 0", r.stdout


def test_kept_view_with_its_manager_collected_in_the_same_cycle():
    """Manager, buffer, view and a keeping finalizer in one garbage cycle: the manager is not
    destroyed while the kept view lives (writes and reads through it work after other managers
    allocate, none of their buffers sees them), and it is destroyed once the view is dropped and
    a collection ran (`kmm.live_managers()`)."""
    r = _run("""
        import kmm
        base = kmm.live_managers()
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(16 << 20)
        mv = b.host_view()
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.mv)
        h = Holder(); h.me = h; h.mv = mv; h.m = m
        del m, b, mv, h
        gc.collect()
        time.sleep(0.3)                                 # any deferred teardown has run by now
        alive = kmm.live_managers() - base
        others = [kmm.Manager(backend=BACKEND) for _ in range(2)]
        bufs = [o.alloc(16 << 20) for o in others]
        for x in bufs:
            x.fill(b"\\x00")
        kept[0][:] = b"\\xcd" * (16 << 20)
        print("ok", bytes(kept[0][:2]) == b"\\xcd\\xcd" and not any(bytes(x.copy_to_host(nbytes=2)) == b"\\xcd\\xcd" for x in bufs))
        print("alive", alive)
        del bufs, x
        for o in others:
            o.close()
        del kept[:]
        gc.collect()
        time.sleep(0.5)                                 # the deferred destroy completes on its thread
        print("freed", kmm.live_managers() - base)
    """)
    out = _ok(r)
    assert (out.get("ok"), out.get("alive"), out.get("freed")) == ("True", "1", "0"), r.stdout


def test_kept_view_of_an_explicitly_closed_buffer():
    """`close()` before the collection (export live): the kept view's memory stays live, the
    address is not handed out, and the memory is freed after the drop and a collection."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(1 << 20)
        addr = b.ptr
        mv = b.host_view()
        b.close()
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.mv)
        h = Holder(); h.me = h; h.mv = mv
        del mv, h
        gc.collect()
        news = [m.alloc(1 << 20) for _ in range(4)]
        print("reused", any(n.ptr == addr for n in news))
        print("held", m.stats(KIND)["live_buffers"])
        del kept[:]
        del news
        gc.collect()
        print("after", m.stats(KIND)["live_buffers"])
    """)
    out = _ok(r)
    assert (out.get("reused"), out.get("held"), out.get("after")) == ("False", "5", "0"), r.stdout


def test_gc_collect_inside_the_keeping_finalizer():
    """A finalizer that keeps the view and calls gc.collect() (a no-op nested collection): the
    kept view's memory is not freed by the nested call; freed after drop + collect."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(1 << 20)
        addr = b.ptr
        mv = b.host_view()
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.mv)
                gc.collect()
                gc.collect(0)
        h = Holder(); h.me = h; h.mv = mv
        del b, mv, h
        gc.collect()
        news = [m.alloc(1 << 20) for _ in range(4)]
        print("reused", any(n.ptr == addr for n in news))
        del news
        del kept[:]
        gc.collect()
        print("after", m.stats(KIND)["live_buffers"])
    """)
    out = _ok(r)
    assert (out.get("reused"), out.get("after")) == ("False", "0"), r.stdout


def test_ten_thousand_unkept_cyclic_views_leave_nothing_behind():
    """10k garbage cycles each holding a view (none kept), collected by automatic collections:
    live buffers and the watch list stay bounded during the loop and are empty at the end."""
    r = _run("""
        import kmm
        #WATCHED
        m = kmm.Manager(backend=BACKEND)
        peak_watch, peak_live = [0], [0]
        def probe(phase, info):
            if phase == "stop":
                peak_watch[0] = max(peak_watch[0], len(watched))
        gc.callbacks.append(probe)
        class Holder:
            pass
        for i in range(10000):
            b = m.alloc(256)
            h = Holder(); h.me = h; h.mv = b.host_view(); h.b = b
            del b, h
            if i % 500 == 0:
                peak_live[0] = max(peak_live[0], m.stats(KIND)["live_buffers"])
        gc.collect()
        print("end", m.stats(KIND)["live_buffers"], len(watched), running[0])
        print("peaks", peak_watch[0], peak_live[0])
    """, timeout=300)
    out = _ok(r)
    assert out.get("end") == "0 0 0", r.stdout
    watch_peak, live_peak = map(int, out["peaks"].split())
    assert watch_peak == 0 and live_peak < 5000, r.stdout


def test_threads_making_cyclic_garbage_with_views_concurrently():
    """Four threads make garbage cycles whose finalizers release the GIL (sleep(0)) and then
    check their view still holds their own pattern (memory neither freed nor reused under a
    finalizer), while every thread allocates; some finalizers keep their view. At the end,
    after dropping the kept ones and a collection: no corruption, nothing live, nothing watched."""
    r = _run("""
        import kmm
        #WATCHED
        m = kmm.Manager(backend=BACKEND)
        bad, kept, lock = [], [], threading.Lock()
        class Holder:
            def __del__(self):
                time.sleep(0)
                if bytes(self.mv[:8]) != self.pat:
                    bad.append(self.pat)
                if self.keep:
                    with lock:
                        kept.append((self.mv, self.pat))
        def work(t):
            for i in range(1500):
                b = m.alloc(64)
                pat = bytes([t + 1, i & 255]) * 4
                b.fill(pat)
                h = Holder(); h.me = h; h.mv = b.host_view(); h.pat = pat; h.keep = (i % 7 == 0)
                del b, h
                if i % 50 == 0:
                    gc.collect()
        ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        gc.collect()
        stale = sum(bytes(v[:8]) != p for v, p in kept)
        del kept[:]
        gc.collect()
        print("result", len(bad), stale, m.stats(KIND)["live_buffers"], len(watched), running[0])
    """, timeout=300)
    out = _ok(r)
    assert out.get("result") == "0 0 0 0 0", r.stdout


def test_exit_with_a_watched_token_still_held_is_clean():
    """A view kept past a collection still alive (and one dropped but not yet swept) at
    interpreter exit: the process exits 0, without a hang or an ignored exception."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        kept = []
        class Holder:
            def __del__(self):
                kept.append(self.mv)
        for _ in range(2):
            b = m.alloc(1 << 20)
            h = Holder(); h.me = h; h.mv = b.host_view()
            del b, h
        gc.collect()
        kept.pop()                      # dropped, watched, never swept
        gc.disable()
        print("exiting", flush=True)
    """, timeout=60)
    assert r.returncode == 0 and "exiting" in r.stdout, r.stderr[-2000:]
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_an_end_that_raises_does_not_stop_the_other_watched_tokens():
    """A watched token whose `end` raises (swallowed) does not keep the other tokens of the same
    sweep from ending: their buffers are freed."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        bs = [m.alloc(4096) for _ in range(3)]
        views = [b.host_view() for b in bs]
        def boom():
            raise RuntimeError("boom")
        views[0].obj._kmm_export.end = boom
        class Holder:
            pass
        h = Holder(); h.me = h; h.views = views
        del bs, views, h
        gc.collect()
        print("live", m.stats(KIND)["live_buffers"])
    """)
    out = _ok(r)
    assert out.get("live") == "1", r.stdout


def test_debug_saveall_keeps_the_memory_of_saved_views():
    """With gc.DEBUG_SAVEALL the garbage (views included) goes to gc.garbage: the memory stays
    valid while it is there, and is freed after gc.garbage is cleared and a collection ran."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(1 << 20)
        addr = b.ptr
        class Holder:
            pass
        h = Holder(); h.me = h; h.mv = b.host_view()
        del b, h
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        gc.set_debug(0)
        news = [m.alloc(1 << 20) for _ in range(4)]
        print("reused", any(n.ptr == addr for n in news))
        del news
        gc.garbage.clear()
        gc.collect()
        print("after", m.stats(KIND)["live_buffers"])
    """)
    out = _ok(r)
    assert (out.get("reused"), out.get("after")) == ("False", "0"), r.stdout


def test_kept_view_dropped_into_new_cyclic_garbage_is_freed_at_that_collection():
    """A kept view later stored in a new garbage cycle (not dropped by refcount) whose finalizer
    writes through it: the memory stays valid during that collection's finalizers and is freed
    at its end."""
    r = _run("""
        import kmm
        m = kmm.Manager(backend=BACKEND)
        b = m.alloc(1 << 20)
        addr = b.ptr
        kept = []
        class Keeper:
            def __del__(self):
                kept.append(self.mv)
        k = Keeper(); k.me = k; k.mv = b.host_view()
        del b, k
        gc.collect()
        seen = []
        class Writer:
            def __del__(self):
                nb = m.alloc(1 << 20)
                seen.append(nb.ptr == addr)
                self.mv[:4] = b"\\x01\\x02\\x03\\x04"
                seen.append(bytes(self.mv[:4]))
                seen.append(nb)
        w = Writer(); w.me = w; w.mv = kept.pop()
        del w
        gc.collect()
        print("during", seen[0], seen[1])
        del seen[:]
        gc.collect()
        print("after", m.stats(KIND)["live_buffers"])
    """)
    out = _ok(r)
    assert out.get("during") == "False b'\\x01\\x02\\x03\\x04'", r.stdout
    assert out.get("after") == "0", r.stdout
