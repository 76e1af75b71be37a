"""Round 8 of the adversarial tests of the Python binding (host backend), written from the docs
and docstrings alone by an independent tester (against e34a772). Each test that failed then
names the defect it demonstrates in its docstring; all pass since their fixes."""

import gc
import random
import sys
import threading

import numpy as np
import pytest

import kmm
from conftest import BACKEND, fresh_interpreter as _run

MiB = 1 << 20




# -- imports: the producer's memory is let go before the importing manager's queued work ran ---

def test_dlpack_import_dropped_with_a_copy_queued_keeps_the_source_bytes():
    """`kmm.from_dlpack(a, manager=m2)` wraps `a`'s memory as a *borrowed* buffer of m2. The C
    contract of `kmm_buffer_wrap` says that with KMM_BORROW "the caller keeps it and must keep it
    valid until the buffer is freed and the manager synchronized", and `kmm_buffer_free` is
    stream-ordered ("work already queued ... still sees the memory"). The binding calls the
    producer's DLPack deleter as soon as the kmm array dies, with m2's copy out of that memory
    still queued: `a`'s export ends, `a` is freed on m1's stream (which knows nothing of m2's
    queued copy), the next allocation of m1 gets the same address, and its fill lands in the
    destination of a copy the user queued *before* dropping anything."""
    m1 = kmm.Manager(backend=BACKEND)
    m2 = kmm.Manager(backend=BACKEND)
    try:
        n = MiB
        a = m1.asarray(np.full(n, 0x11, np.uint8))
        imp = kmm.from_dlpack(a, manager=m2)
        slow = m2.alloc(256 * MiB)
        dst = m2.alloc(n)
        slow.fill(b"\0")            # keeps m2's stream busy for a while
        dst.copy_from(imp.buffer)   # queued behind it: reads a's memory
        del imp                     # "frees never block (they are ordered on the manager's stream)"
        a.close()                   # the export is gone, so this frees a now
        b = m1.alloc(n)
        b.fill(b"\xee")             # m1's idle stream writes the same place at once
        m1.synchronize()
        m2.synchronize()
        got = np.frombuffer(dst.copy_to_host(), np.uint8)
        assert (got == 0x11).all(), "the queued copy read memory reused after the import was dropped: %s" % (
            np.unique(got),)
    finally:
        m1.close()
        m2.close()


def test_cai_import_dropped_with_a_copy_queued_keeps_the_source_bytes():
    """As the DLPack case, through `__cuda_array_interface__`: `from_cuda_array_interface`
    holds the producer (a Buffer of m1) only as long as the kmm array; dropping the array drops
    the producer, which frees its memory on m1's stream while m2's copy out of it is queued."""
    m1 = kmm.Manager(backend=BACKEND)
    m2 = kmm.Manager(backend=BACKEND)
    try:
        n = MiB
        src = m1.alloc(n)
        src.copy_from_host(np.full(n, 0x22, np.uint8))
        imp = kmm.from_cuda_array_interface(src, manager=m2)
        slow = m2.alloc(256 * MiB)
        dst = m2.alloc(n)
        slow.fill(b"\0")
        dst.copy_from(imp.buffer)
        del imp, src                # the producer is freed here (GC, no explicit close)
        b = m1.alloc(n)
        b.fill(b"\xee")
        m1.synchronize()
        m2.synchronize()
        got = np.frombuffer(dst.copy_to_host(), np.uint8)
        assert (got == 0x22).all(), "the queued copy read memory reused after the import was dropped: %s" % (
            np.unique(got),)
    finally:
        m1.close()
        m2.close()


@pytest.mark.parametrize("direction", ["read", "write"])
def test_numpy_dlpack_import_dropped_with_work_queued_does_not_crash(direction):
    """A NumPy array imported with `kmm.from_dlpack(x, manager=m)` (host backend: kDLCPU) and
    used by queued work (a copy out of it, or a fill into it), then dropped with the NumPy array:
    NumPy's deleter runs at once, its 64 MiB mapping goes back to the OS, and m's stream worker
    then reads or writes unmapped memory: the process dies with SIGSEGV (use after free).
    Docs: "the producer stays alive as long as the array"; the C contract of a borrowed wrap:
    valid "until the buffer is freed and the manager synchronized"."""
    r = _run("""
        import numpy as np, kmm
        m = kmm.Manager(backend=%r)
        n = 64 << 20
        for trial in range(3):
            x = np.ones(n, np.uint8)       # its own mapping (above malloc's mmap threshold)
            imp = kmm.from_dlpack(x, manager=m)
            slow = m.alloc(512 << 20)
            slow.fill(b"\\0")              # keeps the stream busy
            if %r == "write":
                imp.buffer.fill(b"\\x07")
            else:
                dst = m.alloc(n)
                dst.copy_from(imp.buffer)
            del imp, x
            m.synchronize()
            slow.close()
        print("survived")
    """ % (BACKEND, direction))
    assert r.returncode == 0 and "survived" in r.stdout, (
        "queued work on a dropped DLPack import touched freed memory: rc %d %s" % (r.returncode, r.stderr[-1500:]))


# -- plugins ---------------------------------------------------------------------------------

def test_numba_plugin_collected_with_a_live_pointer_does_not_free_its_memory():
    """`KmmNumbaMemoryManager.__del__` calls its manager's `__del__`, which destroys the manager
    whatever it still holds. `_NumbaManager.close()` refuses (BufferMappedError) while Numba's
    arrays are live, and the docs' rule for finalizers is "no finalizer frees memory an export or
    a view still shows"; but a plugin instance collected while a `MemoryPointer` it handed out is
    alive frees that memory: another manager is handed the same address, and a write through
    Numba's still-live pointer lands in the other manager's buffer."""
    r = _run("""
        import ctypes, gc, time, kmm
        try:
            import kmm.numba as kn
        except Exception as e:
            print("SKIP", e); raise SystemExit(0)
        kn.configure(backend=%r)
        p = kn.KmmNumbaMemoryManager(context=None)
        p.initialize()
        mem = p.memalloc(1 << 20)          # a live Numba allocation
        ptr = int(mem.device_pointer)
        del p
        gc.collect(); time.sleep(0.3)
        other = kmm.Manager(backend=%r)
        bs = [other.alloc(1 << 20) for _ in range(8)]
        for b in bs:
            b.fill(b"\\0")
        other.synchronize()
        print("reused", any(b.ptr == ptr for b in bs))
        ctypes.memset(ptr, 0xAB, 16)       # Numba still owns this address
        print("corrupted", any(bytes(b.copy_to_host(nbytes=1)) == b"\\xab" for b in bs))
        del mem
        print("done")
    """ % (BACKEND, BACKEND))
    if "SKIP" in r.stdout:
        pytest.skip(r.stdout)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "reused False" in r.stdout and "corrupted False" in r.stdout, r.stdout


# -- traces ----------------------------------------------------------------------------------

def test_restarting_a_stopped_file_trace_on_its_own_path_is_not_refused_during_trims(tmp_path):
    """One manager, one file: `trace_start(path=p); trace_stop()` in a loop while another thread
    of the same manager allocates, frees and trims. docs/observability.md: "A start replaces the
    trace recording (it is stopped, and a file trace flushed, first)"; the file check refuses
    only a file *another manager's* trace writes. Yet about a third of the restarts are refused
    with "another manager's trace writes this file" (there is no other manager): a trim in
    flight keeps the stopped trace's claim on the file."""
    m = kmm.Manager(backend=BACKEND)
    p = str(tmp_path / "t.csv")
    stop = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)

    def trimmer():
        while not stop.is_set():
            m.alloc(70000).close()
            m.trim(0)

    t = threading.Thread(target=trimmer)
    t.start()
    refused = []
    try:
        for _ in range(1500):
            try:
                m.trace_start(path=p)
                m.trace_stop()
            except kmm.KmmError as e:
                refused.append(str(e))
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
        m.close()
    assert not refused, "%d of 1500 restarts refused, e.g. %s" % (len(refused), refused[0])


# -- close racing close ----------------------------------------------------------------------

def test_buffer_close_racing_its_managers_close_does_not_raise(monkeypatch):
    """`Buffer.close()` reads its manager's handle outside the lock `Manager.close()` takes and
    then frees with it: when another thread's `Manager.close()` destroys the manager in between,
    `Buffer.close()` raises `InvalidHandleError` ("manager ... is not live"). Done one after the
    other, in either order, the two closes never raise (close() is idempotent, and a buffer of a
    closed manager closes silently). The interleaving is forced here by running the other
    thread's close() at the moment the free is made."""
    import kmm.buffer as kb

    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(64)
    real = kb._buffer_free

    def free_after_the_other_threads_close(mh, bh, flags):
        t = threading.Thread(target=m.close)
        t.start()
        t.join()
        return real(mh, bh, flags)

    monkeypatch.setattr(kb, "_buffer_free", free_after_the_other_threads_close)
    try:
        b.close()
    finally:
        monkeypatch.setattr(kb, "_buffer_free", real)
        m.close()
    assert b.closed and m.closed


# -- memory map: wraps of the pool's own memory ----------------------------------------------

def test_imports_of_the_managers_own_memory_are_in_its_memory_map():
    """Importing an array on its own manager (`kmm.from_dlpack(a, manager=m)`, or a view of it
    through `__cuda_array_interface__`) wraps memory of the pool's own chunk. docs/observability.md:
    "A wrap that reaches into or out of a pool chunk (memory borrowed from the pool's own) is a
    chunk of its own beside it", and "for wrapped memory, each buffer is a chunk of its own".
    The map shows neither wrap (stats count 3 live buffers, the map 1)."""
    m = kmm.Manager(backend=BACKEND)
    try:
        a = m.asarray(np.arange(4096, dtype=np.uint8))
        same = kmm.from_dlpack(a, manager=m)
        part = kmm.from_cuda_array_interface(a.buffer.as_array(shape=(16,), offset=8), manager=m)
        shown = {s.buffer for s in m.memory_map().segments if s.state != "free"}
        assert m.stats("device")["live_buffers"] == 3
        missing = [name for name, arr in (("the whole-buffer import", same), ("the view import", part))
                   if arr.buffer.handle not in shown]
        assert not missing, "not in the memory map: %s (map shows %s)" % (missing, sorted(map(hex, shown)))
    finally:
        m.close()


def test_a_wrap_overlapping_another_wrap_hides_neither():
    """Two imports of foreign memory where one range contains the other (a NumPy array, and a
    CAI import of a wider range around it): the map lists the wider one only, and the NumPy
    import's buffer disappears from it, though both are live ("every chunk ... cut into its
    buffers' blocks"). The memory is never read: a borrowed wrap is only an address range."""
    m = kmm.Manager(backend=BACKEND)
    try:
        x = np.zeros(1 << 16, np.uint8)
        w = kmm.from_dlpack(x, manager=m)
        base = x.ctypes.data - 4096
        wide = kmm.from_cuda_array_interface(
            {"shape": ((1 << 16) + 8192,), "typestr": "|u1", "data": (base, False), "version": 3}, manager=m)
        shown = {s.buffer for s in m.memory_map().segments if s.state != "free"}
        assert w.buffer.handle in shown and wide.buffer.handle in shown, (
            "live wraps missing from the map: %s" % sorted(map(hex, {w.buffer.handle, wide.buffer.handle} - shown)))
    finally:
        m.close()


# -- a model of every byte: random sequences of public calls (guards; these pass) ------------

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

_CONFIGS = [dict(), dict(staging_chunk_size=4096, staging_chunks=2), dict(alloc_mode="direct"),
            dict(suballocator="heap", chunk_size=1 << 16, compaction_ratio_pct=100), dict(alloc_mode="cuda_async"),
            dict(suballocator="ring")]


class ByteModel(RuleBasedStateMachine):
    """Buffers of two managers (device and pinned), each with a bytearray model; copies, fills,
    copies between managers, host views, DLPack exports kept past close(), closes and
    collections. Every read is checked against the model; a view kept past its buffer's close()
    must keep showing the bytes it showed (the memory is not reused under it)."""

    def __init__(self):
        super().__init__()
        self.mgrs = []
        self.live = {}
        self.kept = []      # (view, snapshot) of closed buffers
        self.next = 0

    @precondition(lambda self: not self.mgrs)
    @rule(c0=st.sampled_from(_CONFIGS), c1=st.sampled_from(_CONFIGS))
    def start(self, c0, c1):
        self.mgrs = [kmm.Manager(backend=BACKEND, **c0), kmm.Manager(backend=BACKEND, **c1)]

    @precondition(lambda self: self.mgrs and len(self.live) < 8)
    @rule(mi=st.integers(0, 1), n=st.sampled_from([1, 3, 64, 4095, 4096, 4097, 70001]),
          kind=st.sampled_from(["device", "pinned"]), seed=st.integers(0, 255))
    def alloc(self, mi, n, kind, seed):
        b = self.mgrs[mi].alloc(n, kind)
        data = bytearray((np.arange(n) * 7 + seed).astype(np.uint8).tobytes())
        b.copy_from_host(bytes(data))
        self.live[self.next] = (b, data)
        self.next += 1

    def _pick(self, data):
        k = data.draw(st.sampled_from(sorted(self.live)))
        return (k,) + self.live[k]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fill(self, data):
        k, b, d = self._pick(data)
        pat = data.draw(st.binary(min_size=1, max_size=9))
        off = data.draw(st.integers(0, len(d)))
        n = data.draw(st.integers(0, len(d) - off))
        n -= n % len(pat)
        b.fill(pat, off, n)
        d[off:off + n] = (pat * (n // len(pat) + 1))[:n]

    @precondition(lambda self: len(self.live) >= 2)
    @rule(data=st.data())
    def copy_between(self, data):
        ka, a, da = self._pick(data)
        kb, b, db = self._pick(data)
        if ka == kb:
            return
        so = data.draw(st.integers(0, len(db)))
        do = data.draw(st.integers(0, len(da)))
        n = data.draw(st.integers(0, min(len(db) - so, len(da) - do)))
        a.copy_from(b, dst_offset=do, src_offset=so, nbytes=n)
        da[do:do + n] = db[so:so + n]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def write_through_view(self, data):
        k, b, d = self._pick(data)
        v = b.host_view()
        assert bytes(v) == bytes(d)
        if d:
            i = data.draw(st.integers(0, len(d) - 1))
            v[i] = (v[i] + 1) % 256
            d[i] = v[i]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), form=st.sampled_from(["view", "dlpack"]))
    def close_with_an_export(self, data, form):
        k, b, d = self._pick(data)
        x = b.host_view() if form == "view" else np.from_dlpack(b)
        del self.live[k]
        b.close()
        self.kept.append((x, bytes(d)))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def close(self, data):
        k, b, d = self._pick(data)
        del self.live[k]
        b.close()

    @precondition(lambda self: self.kept)
    @rule(data=st.data())
    def drop_kept(self, data):
        self.kept.pop(data.draw(st.integers(0, len(self.kept) - 1)))
        gc.collect()

    @precondition(lambda self: self.mgrs)
    @rule(mi=st.integers(0, 1))
    def trim(self, mi):
        self.mgrs[mi].trim(0)

    @invariant()
    def every_byte(self):
        for m in self.mgrs:
            m.synchronize()
        for k, (b, d) in self.live.items():
            assert bytes(b.copy_to_host()) == bytes(d), "buffer %d" % k
        for x, snap in self.kept:
            got = bytes(x) if isinstance(x, memoryview) else x.tobytes()
            assert got == snap, "an export kept past close() changed"

    def teardown(self):
        self.kept.clear()
        self.live.clear()
        for m in self.mgrs:
            m.close()
        gc.collect()


ByteModel.TestCase.settings = settings(max_examples=25, stateful_step_count=40, deadline=None,
                                       suppress_health_check=list(HealthCheck))
test_random_sequences_keep_every_byte = ByteModel.TestCase


def test_threads_sharing_managers_keep_every_byte_while_others_observe_and_collect():
    """Four threads with their own buffers on two shared managers (copies within and across them,
    fills, views, DLPack exports kept and dropped) while a fifth restarts ring traces, reads
    them, draws maps and figures, trims and collects; every read is checked (guard)."""
    fails = []
    mgrs = [kmm.Manager(backend=BACKEND, staging_chunk_size=4096, staging_chunks=2), kmm.Manager(backend=BACKEND)]
    stop = threading.Event()

    def worker(seed):
        r = random.Random(seed)
        live, views = {}, []
        try:
            while not stop.is_set():
                op = r.randrange(7)
                if op == 0 or len(live) < 2:
                    n = r.choice([1, 64, 4097, 70000])
                    b = r.choice(mgrs).alloc(n, r.choice(["device", "pinned"]))
                    d = bytearray(r.randbytes(n))
                    b.copy_from_host(bytes(d))
                    live[len(live) + r.random()] = (b, d)
                elif op == 1:
                    live.pop(r.choice(list(live)))[0].close()
                elif op == 2:
                    (a, da), (b, db) = r.sample(list(live.values()), 2)
                    n = min(len(da), len(db))
                    a.copy_from(b, nbytes=n)
                    da[:n] = db[:n]
                elif op == 3:
                    b, d = live[r.choice(list(live))]
                    if bytes(b.copy_to_host()) != bytes(d):
                        fails.append("copy_to_host")
                        return
                elif op == 4:
                    b, d = live[r.choice(list(live))]
                    v = b.host_view()
                    if bytes(v) != bytes(d):
                        fails.append("host_view")
                        return
                    views.append(v)
                elif op == 5:
                    b, d = live[r.choice(list(live))]
                    x = np.from_dlpack(b)
                    if x.tobytes() != bytes(d):
                        fails.append("dlpack")
                        return
                    views.append(x)
                elif views:
                    views.pop(r.randrange(len(views)))
        except Exception as e:  # noqa: BLE001
            fails.append(repr(e))

    def observer():
        r = random.Random(99)
        try:
            while not stop.is_set():
                m = r.choice(mgrs)
                op = r.randrange(5)
                if op == 0:
                    m.trace_start(capacity=r.choice([1, 100]))
                    m.trace()
                elif op == 1:
                    m.status()._repr_html_()
                elif op == 2:
                    m.memory_map(r.choice(["device", "pinned"]))
                elif op == 3:
                    m.trim(0)
                else:
                    gc.collect()
        except kmm.InvalidArgumentError as e:
            if "ring trace" not in str(e):  # a figure drawn as another thread replaces the ring
                fails.append(repr(e))
        except Exception as e:  # noqa: BLE001
            fails.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)] + [threading.Thread(target=observer)]
    for t in ts:
        t.start()
    threading.Event().wait(3)
    stop.set()
    for t in ts:
        t.join()
    for m in mgrs:
        m.close()
    assert not fails, fails[:3]


def test_a_file_trace_of_a_manager_closed_with_a_live_export_keeps_its_rows_at_exit(tmp_path):
    """A file trace records 100 allocations (and their maps); the manager is closed while a
    `host_view` of one buffer lives (documented: closed for Python at once, destroyed when the
    export lets go), and the process exits with the view alive (documented: exports no longer
    end at exit). The trace is "closed by the stop (or the manager's destruction)": neither ever
    comes (trace_stop() of the closed manager raises), and the rows still buffered are lost: the
    file ends with about 83 of the 100 allocate rows. Events that happened before close()
    returned are silently missing from the file."""
    p = str(tmp_path / "trace.csv")
    r = _run("""
        import kmm
        m = kmm.Manager(backend=%r)
        m.trace_start(path=%r)
        bs = [m.alloc(4096) for _ in range(100)]
        v = bs[0].host_view()
        m.close()
        print("exiting")
    """ % (BACKEND, p))
    assert r.returncode == 0, r.stderr[-1500:]
    rows = open(p).read().splitlines()
    actions = [row.split(",")[2] for row in rows[1:]]
    assert actions.count("allocate") == 100 and actions.count("map") == 100, (
        "allocate rows: %d, map rows: %d of 100 each" % (actions.count("allocate"), actions.count("map")))
