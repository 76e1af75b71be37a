"""The Python binding cannot corrupt memory: every public function checks its arguments (exact
integers in range, plain-data dtypes, sizes libkmm can hold) and names the argument and the bound;
exports hold their memory past `close()`; closed objects hand out no address. Property-based
tests (Hypothesis) throw arbitrary values at each argument; the rest is one test per defect found
by the adversarial run."""

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kmm
from conftest import expect_named
from kmm._args import MAX_BUFFER_BYTES, U64_MAX

# Values a hostile caller passes where an integer is expected.
NOT_INTEGERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.complex_numbers(),
)
OUT_OF_U64 = st.one_of(st.integers(max_value=-1), st.integers(min_value=U64_MAX + 1))


def _run_child(script):
    """Runs `script` in a fresh interpreter importing this kmm (a crash there is not this test
    process's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(kmm.__file__)), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def m():
    with kmm.Manager(backend="host") as mgr:
        yield mgr


def stats_unchanged(m, before):
    after = m.stats("device")
    assert (after["live_buffers"], after["in_use"]) == (before["live_buffers"], before["in_use"])


# -- property-based: every integer argument ----------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(value=st.one_of(NOT_INTEGERS, OUT_OF_U64))
def test_alloc_refuses_every_non_size(m, value):
    before = m.stats("device")
    expect_named((TypeError, kmm.KmmError), "nbytes", m.alloc, value)
    stats_unchanged(m, before)


@settings(max_examples=40, deadline=None)
@given(nbytes=st.integers(min_value=0, max_value=1 << 20))
def test_alloc_gives_exactly_what_was_asked(m, nbytes):
    with m.alloc(nbytes) as b:
        assert b.nbytes == nbytes == b.info()["bytes"]


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(NOT_INTEGERS, OUT_OF_U64), which=st.sampled_from(["offset", "nbytes"]))
def test_fill_and_copies_refuse_bad_ranges(m, value, which):
    if value is None and which == "nbytes":
        return  # nbytes=None is "the rest of the buffer"
    with m.alloc(64) as b:
        b.fill(b"\x07")
        kwargs = {"offset": 0, "nbytes": 8}
        kwargs[which] = value
        expect_named((TypeError, kmm.KmmError, IndexError), which, b.fill, b"\x01", **kwargs)
        if which == "offset":
            expect_named((TypeError, kmm.KmmError, IndexError), "offset", b.copy_from_host, b"12345678", offset=value)
            expect_named((TypeError, kmm.KmmError, IndexError), "offset", b.copy_to_host, offset=value)
        assert bytes(b.copy_to_host()) == b"\x07" * 64, "a refused call changed the buffer"


@settings(max_examples=60, deadline=None)
@given(offset=st.integers(min_value=-(1 << 70), max_value=1 << 70), nbytes=st.integers(min_value=-(1 << 70), max_value=1 << 70))
def test_byte_ranges_are_checked_without_wrap(m, offset, nbytes):
    with m.alloc(256) as b:
        b.fill(b"\x05")
        ok = 0 <= offset and 0 <= nbytes and offset + nbytes <= 256
        if ok:
            b.fill(b"\x09", offset=offset, nbytes=nbytes)
            data = bytes(b.copy_to_host())
            assert data == b"\x05" * offset + b"\x09" * nbytes + b"\x05" * (256 - offset - nbytes)
        else:
            with pytest.raises((kmm.KmmError, IndexError)):
                b.fill(b"\x09", offset=offset, nbytes=nbytes)
            assert bytes(b.copy_to_host()) == b"\x05" * 256


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["hard_limit", "chunk_size", "compaction_ratio_pct", "device", "alignment", "staging_chunks"]),
       value=st.one_of(NOT_INTEGERS, st.integers(max_value=-1), st.integers(min_value=1 << 64)))
def test_config_refuses_values_outside_its_c_types(key, value):
    if value is None and key == "release_threshold":
        return
    expect_named((TypeError, kmm.KmmError, ValueError), key, kmm.Manager, backend="host", **{key: value})


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(NOT_INTEGERS, OUT_OF_U64))
def test_stream_and_trim_arguments(m, value):
    expect_named((TypeError, kmm.KmmError), "keep_bytes", m.trim, value)
    expect_named((TypeError, kmm.KmmError), "stream", m.wait_stream, value)
    expect_named((TypeError, kmm.KmmError), "stream", m.signal_stream, value)
    with m.alloc(8) as b:
        expect_named((TypeError, kmm.KmmError), "stream", b.record_stream, value)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(min_value=-4, max_value=1 << 62), min_size=0, max_size=3),
       dtype=st.sampled_from(["u1", "f4", "c16", "V3", "S5", "O", "V0"]))
def test_empty_shapes_and_dtypes(m, shape, dtype):
    dt = np.dtype(dtype)
    n = dt.itemsize * int(np.prod(shape, dtype=object)) if shape else dt.itemsize
    if any(d < 0 for d in shape):
        with pytest.raises(kmm.KmmError, match=r"shape\[\d\]"):
            m.empty(tuple(shape), dtype)
    elif dt.hasobject or dt.itemsize == 0:
        with pytest.raises(TypeError, match="dtype"):
            m.empty(tuple(shape), dtype)
    elif n > MAX_BUFFER_BYTES:
        with pytest.raises(kmm.SizeOverflowError, match="2\\^48"):
            m.empty(tuple(shape), dtype)
    elif n > 1 << 28:
        try:  # within 2^48 bytes: the host may or may not have the memory
            m.empty(tuple(shape), dtype).close()
        except kmm.OutOfMemoryError as e:
            assert "bytes" in str(e)
    else:
        a = m.empty(tuple(shape), dtype)
        assert a.shape == tuple(shape) and a.nbytes == n == a.buffer.nbytes
        a.close()


# -- one test per defect ------------------------------------------------------------------------

def test_object_arrays_are_refused(m):
    with pytest.raises(TypeError, match="Python objects"):
        m.asarray(np.array([object(), 1], dtype=object))
    with pytest.raises(TypeError, match="Python objects"):
        m.empty((4,), dtype=object)
    with pytest.raises(TypeError, match="Python objects"):
        m.empty((4,), dtype=[("a", "f4"), ("b", "O")])
    with m.alloc(16) as b:
        with pytest.raises(TypeError, match="Python objects"):
            b.as_array(dtype=object)


def test_sizes_never_wrap(m):
    before = m.stats("device")
    for bad in (2 ** 64 + 5, -1):
        expect_named(kmm.SizeOverflowError, "nbytes", m.alloc, bad)
    for bad in (1.5, "10", b"12", True):
        expect_named(TypeError, "nbytes", m.alloc, bad)
    expect_named(kmm.SizeOverflowError, "2^48", m.empty, (2 ** 62, 4))
    expect_named(kmm.KmmError, "hard_limit", kmm.Manager, backend="host", hard_limit=-1)
    expect_named(kmm.KmmError, "hard_limit", kmm.Manager, backend="host", hard_limit=2 ** 64 + 1024)
    expect_named(kmm.KmmError, "compaction_ratio_pct", kmm.Manager, backend="host", compaction_ratio_pct=2 ** 32 + 108)
    expect_named(kmm.KmmError, "keep_bytes", m.trim, -1)
    stats_unchanged(m, before)
    with m.alloc(8) as b:
        expect_named(TypeError, "offset", b.as_array, offset=1.5)


def test_numpy_integers_are_integers(m):
    with m.alloc(np.uint32(64)) as b:
        b.fill(b"\x01", offset=np.int64(8), nbytes=np.uint8(8))
        assert bytes(b.copy_to_host())[8:16] == b"\x01" * 8


def test_zero_d_arrays_stay_zero_d(m):
    a = m.asarray(np.float64(2.5))
    assert a.shape == () and a.get().shape == () and a.get() == 2.5
    a.close()


def test_no_implicit_host_conversion(m):
    a = m.empty((3,), "f4")
    with pytest.raises(TypeError, match=r"\.get\(\)"):
        np.asarray(a)
    a.close()


def test_host_view_holds_memory_past_close(m):
    b = m.alloc(4096)
    b.fill(b"\x11")
    view = b.host_view()
    live = m.stats("device")["live_buffers"]
    b.close()
    with pytest.raises(kmm.InvalidHandleError):
        b.ptr
    others = [m.alloc(4096) for _ in range(8)]
    for o in others:
        o.fill(b"\x22")
    view[:] = b"\x33" * 4096  # writes the closed buffer's own memory, nobody else's
    for o in others:
        assert bytes(o.copy_to_host()) == b"\x22" * 4096
    assert m.stats("device")["live_buffers"] == live + 8
    derived = np.frombuffer(view, np.uint8)
    del view
    gc.collect()
    assert m.stats("device")["live_buffers"] == live + 8, "freed while a NumPy array still reads it"
    assert derived[0] == 0x33
    del derived
    gc.collect()
    assert m.stats("device")["live_buffers"] == live + 7
    for o in others:
        o.close()


def test_dlpack_export_holds_memory_past_close(m):
    x = m.asarray(np.arange(1024, dtype=np.int32))
    live = m.stats("device")["live_buffers"]
    a = np.from_dlpack(x)
    x.close()
    with pytest.raises(kmm.InvalidHandleError):
        x.__cuda_array_interface__
    y = m.asarray(np.zeros(1024, np.int32))
    a[:] = 7  # the closed array's memory, still held by the NumPy consumer
    assert not y.get().any(), "a write through the export landed in another array"
    assert m.stats("device")["live_buffers"] == live + 1
    del a
    gc.collect()
    assert m.stats("device")["live_buffers"] == live
    y.close()


def test_manager_close_waits_for_exports():
    mgr = kmm.Manager(backend="host")
    b = mgr.alloc(1024)
    b.fill(b"\x44")
    view = b.host_view()
    mgr.close()
    assert mgr.closed and b.closed
    for fn in (lambda: mgr.stream, lambda: b.ptr, lambda: b.__cuda_array_interface__, lambda: b.as_array(), mgr.stats):
        with pytest.raises(kmm.InvalidHandleError):
            fn()
    assert bytes(view[:4]) == b"\x44" * 4, "the memory went with the manager while a view held it"
    view.release()
    gc.collect()


def test_closed_manager_hands_out_no_address():
    mgr = kmm.Manager(backend="host")
    b = mgr.alloc(64)
    a = b.as_array()
    mgr.close()
    for fn in (lambda: b.ptr, lambda: a.ptr, lambda: a.__cuda_array_interface__, lambda: b.as_array(), lambda: mgr.stream):
        with pytest.raises(kmm.InvalidHandleError):
            fn()


def test_cai_import_checks_its_fields(m):
    base = m.alloc(64)
    good = dict(base.__cuda_array_interface__)
    for key, value, name in [("shape", (-1,), "shape[0]"), ("shape", (1.5,), "shape[0]"),
                             ("typestr", "|O", "typestr"), ("data", (-5, False), "data[0]"),
                             ("strides", (1, 1), "strides")]:
        cai = dict(good, **{key: value})
        expect_named((TypeError, ValueError, kmm.KmmError), name, kmm.DeviceArray.from_cuda_array_interface, cai, m)
    base.close()


def test_dlpack_export_deleted_at_interpreter_exit():
    # A consumer may delete an exported tensor in the interpreter's last collection, after
    # kmm.dlpack's globals are gone (PyTorch and JAX did, on the GPU machine): the struct the
    # consumer points at and the deleter it calls must still be there (it was a segfault).

    script = (
        "import gc, numpy as np, kmm\n"
        "gc.disable()\n"
        "m = kmm.Manager(backend='host')\n"
        "a = m.asarray(np.arange(1000, dtype=np.float32))\n"
        "class Holder: pass\n"
        "h = Holder(); h.me = h; h.x = np.from_dlpack(a)\n"
        "del h, a\n"
        "print('exiting')\n"
    )

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(kmm.__file__)), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "exiting"
    assert "Fatal" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


def test_dlpack_export_survives_a_collection_that_ends_another_export():
    # A collection that starts inside export() (any GC-tracked allocation may start one) can
    # free an array a consumer imported from another export, whose deleter ends that export in
    # the same thread: the exports lock must not deadlock there (it hung at threshold 45).

    script = (
        "import gc, numpy as np, kmm\n"
        "m = kmm.Manager(backend='host')\n"
        "a = m.asarray(np.arange(16, dtype=np.float32)); b = m.asarray(np.arange(16, dtype=np.float32))\n"
        "class Holder: pass\n"
        "for k in range(1, 200):\n"
        "    gc.collect(); gc.set_threshold(k)\n"
        "    h = Holder(); h.me = h; h.x = np.from_dlpack(b); del h\n"
        "    cap = a.__dlpack__(); del cap\n"
        "    gc.set_threshold(700)\n"
        "print('no deadlock')\n"
    )
    p = _run_child(script)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "no deadlock"


def test_collected_cycles_free_memory_after_their_finalizers(m):
    # A DeviceArray and its raw address (as a CAI consumer holds one) in a garbage cycle with an
    # object whose __del__ still writes there. The collector runs the cycle's finalizers in no set
    # order: Buffer.__del__ freed the memory first, the __del__'s allocation got the same address
    # and the write landed in that new buffer. Frees asked for in a collection wait for its end.
    import ctypes

    out = {}

    class Holder:
        def __del__(self):
            nb = m.alloc(self.n)
            nb.fill(b"\0")
            m.synchronize()
            out["same_address"] = nb.ptr == self.ptr
            ctypes.memset(self.ptr, 0xAB, 4)  # through the consumer's pointer
            out["new_buffer"] = bytes(nb.copy_to_host(nbytes=4))
            out["keep"] = nb

    for n in (1 << 16, 1 << 20):
        a = m.empty(n, np.uint8)
        h = Holder()
        h.me, h.a, h.n, h.ptr = h, a, n, a.__cuda_array_interface__["data"][0]
        del a, h
        gc.collect()
        assert out.pop("same_address") is False, "an address was handed out again while the garbage used it"
        assert out.pop("new_buffer") == b"\0" * 4, "a write of a finalizer corrupted another buffer"
        out.pop("keep").close()


def test_finalizers_defer_while_exports_live():
    # Buffer.__del__ and Manager.__del__ (which kmm.numba calls on its manager) freed the memory
    # while a host_view still showed it; they defer to the last export's end, as close() does.
    mgr = kmm.Manager(backend="host")
    b = mgr.alloc(1 << 16)
    mv = b.host_view()
    b.__del__()
    assert mgr.stats("device")["live_buffers"] == 1, "Buffer.__del__ freed memory a host_view shows"
    managers = kmm.live_managers()
    mgr.__del__()
    for _ in range(50):  # a destroy tears down on a background thread
        assert kmm.live_managers() == managers, "Manager.__del__ destroyed memory a host_view shows"
        time.sleep(0.01)
    mv[:] = b"\xab" * len(mv)
    del mv, b
    gc.collect()
    assert kmm.live_managers() == managers - 1


def test_a_collected_manager_outlives_the_finalizers_of_its_garbage():
    # A manager, its array and the array's raw address (as a CAI consumer holds one) in garbage
    # with an object whose __del__ writes there after a while: the manager's teardown (on a
    # background thread) unmapped the memory first (SIGSEGV). No export is involved: the
    # collection's end is what it waits for.

    script = (
        "import ctypes, gc, time, kmm\n"
        "m = kmm.Manager(backend='host')\n"
        "a = m.empty(16 << 20, 'uint8')\n"
        "class Holder:\n"
        "    def __del__(self):\n"
        "        time.sleep(0.3)\n"
        "        ctypes.memset(self.ptr, 0xAB, 16 << 20)\n"
        "h = Holder(); h.me = h; h.a = a; h.ptr = a.__cuda_array_interface__['data'][0]\n"
        "del m, a, h\n"
        "gc.collect()\n"
        "print('survived')\n"
    )
    p = _run_child(script)
    assert p.returncode == 0 and p.stdout.strip() == "survived", (p.returncode, p.stderr[-2000:])
