"""Defects found by the third adversarial run against the Python package (host backend), one
test each: copies of owners, finalizers that allocate during an allocation, the Numba plugin's
manager, sub-array dtypes, flags and sizes given as other types, reprs after close."""

import copy
import ctypes
import gc

import numpy as np
import pytest

import kmm
from conftest import cupy_on_host

BACKEND = "host"


# -- 1. copy.copy of a Buffer / Manager duplicates ownership -----------------------------------

def test_copy_of_buffer_does_not_alias_freed_memory():
    # copy.copy(b) made a second Buffer with b's handle: after b.close() and a new allocation of
    # the same block, the copy's host_view wrote into the new buffer.
    import pickle

    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(64)
    for owner in (b, m):
        for f in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                f(owner)
    # An array's copy is a copy of its data, as NumPy's and CuPy's are.
    a = m.asarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    t = kmm.DeviceArray(a.buffer, (4, 3), np.int32, strides=(4, 16))  # a transposed view
    copies = [copy.copy(a), copy.deepcopy(a), a.copy(), copy.copy(t)]
    assert all(c.buffer is not a.buffer for c in copies)
    expected = [a.get(), a.get(), a.get(), t.get()]
    a.set(np.zeros((3, 4), np.int32))
    for c, e in zip(copies, expected):
        assert np.array_equal(c.get(), e) and c.shape == e.shape
        c.close()
    m.close()


def _run(code, env=None):
    """Runs `code` in a fresh interpreter with the same kmm; (returncode, output)."""
    import os
    import subprocess
    import sys

    e = dict(os.environ)
    # the kmm under test, wherever pytest runs from (it may not be installed)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(kmm.__file__)), e.get("PYTHONPATH")]))
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=e)
    return p.returncode, p.stdout + p.stderr


# -- 2. An allocation made by a finalizer during another allocation steals its handle ---------

def _reentrant_allocations(alloc, extra=2):
    """Allocates 50 buffers with alloc() while garbage collections (threshold 1) run a finalizer
    that allocates too, in the same thread; returns every Buffer made."""
    inner = []

    class Bomb:
        def __init__(self):
            self.me = self  # a cycle: only the collector frees it

        def __del__(self):
            if len(inner) < 100:
                inner.append(alloc())
                inner.append([[] for _ in range(extra)])
                Bomb()

    Bomb()
    gc.set_threshold(1)
    try:
        outers = [alloc() for _ in range(50)]
    finally:
        gc.set_threshold(700)
    made = outers + [b for b in inner if not isinstance(b, list)]
    inner.clear()
    return made


def test_finalizer_allocating_during_an_allocation_does_not_share_handles():
    m = kmm.Manager(backend=BACKEND)
    bufs = _reentrant_allocations(lambda: m.alloc(64))
    handles = [b.handle for b in bufs]
    live = m.stats("device")["live_buffers"]
    # Each Python Buffer must own its own libkmm buffer: two objects with one handle free it
    # twice (the second close frees memory the first still shows), and the lost one leaks.
    assert len(set(handles)) == len(handles), "%d Buffer objects share %d handles" % (len(handles), len(set(handles)))
    assert live == len(handles)
    for b in bufs:
        b.close()
    assert m.stats("device")["live_buffers"] == 0, "buffers leaked"
    m.close()


def test_cupy_python_path_finalizer_allocating_during_an_allocation_does_not_share_buffers(monkeypatch):
    # kmm.cupy's Python path (the first allocation on a device, pinned_allocator) reads the same
    # per-thread scratch slots after creating its owner object (a collection can run there).
    kc = cupy_on_host(monkeypatch)
    kc.configure(backend=BACKEND)
    kc._clear_managers()
    try:
        m = kc.manager(0)
        pointers = _reentrant_allocations(lambda: kc.pinned_allocator(64))
        buffers = [p.mem.buffer for p in pointers]
        live = m.stats("pinned")["live_buffers"]
        assert len(set(buffers)) == len(buffers), "%d pinned pointers share %d buffers" % (len(buffers), len(set(buffers)))
        assert live == len(buffers)
        del pointers, buffers
        gc.collect()
        assert m.stats("pinned")["live_buffers"] == 0, "buffers leaked"
    finally:
        kc._clear_managers()
        kc.configure()


# -- 3-5. kmm.numba ------------------------------------------------------------------------------

def _numba():
    try:
        import kmm.numba as kn
    except Exception as e:  # pragma: no cover
        pytest.skip("numba unavailable: %s" % e)
    return kn


def test_numba_closing_the_plugins_manager_does_not_free_numbas_live_memory():
    # p.manager.close() freed Numba's live memory (another manager then handed out its address),
    # and every later memalloc failed with InvalidHandleError.
    kn = _numba()
    kn.configure(backend=BACKEND)
    try:
        p = kn.KmmNumbaMemoryManager(context=None)
        mem = p.memalloc(1 << 20)
        ctypes.memset(mem.address, 0x5A, 1 << 20)
        m = p.manager
        with pytest.raises(kmm.BufferMappedError, match="live buffers"):
            m.close()
        with pytest.raises(TypeError, match="force"):
            m.close(force="no")
        assert not m.closed and ctypes.string_at(mem.address, 16) == b"\x5a" * 16
        q = p.memalloc(4096)                      # still served by the same manager
        assert q.size == 4096 and p.manager is m
        del mem, q
        gc.collect()
        m.close()                                 # nothing live: closes
        assert m.closed
        r = p.memalloc(4096)                      # the plugin makes a new manager
        assert r.size == 4096 and p.manager is not m and not p.manager.closed
        del r
        p.reset()
    finally:
        kn.configure()


def test_numba_memory_info_reports_the_managers_own_hard_limit():
    kn = _numba()
    kn.configure(backend=BACKEND, hard_limit=4 << 20)
    try:
        p = kn.KmmNumbaMemoryManager(context=None)
        p.initialize()
        kn.configure(backend=BACKEND)  # options for managers made *from now on*
        info = p.get_memory_info()
        # p's manager still refuses past 4 MiB, so Numba must not be told more exists.
        with pytest.raises(kmm.OutOfMemoryError):
            p.memalloc(8 << 20)
        assert info.total <= 4 << 20, "get_memory_info reports total %d for a manager limited to 4 MiB" % info.total
        p.reset()
    finally:
        kn.configure()


def test_numba_configure_device_does_not_move_a_contexts_memory():
    _numba()
    # "initialize: creates the context's Kmm manager (device of the context)". Two host stand-in
    # devices (KMM_HOST_DEVICES is read once per process): a subprocess.
    rc, out = _run('''
import kmm.numba as kn
class Dev: id = 0
class Ctx: device = Dev()
kn.configure(backend="host", device=1)
p = kn.KmmNumbaMemoryManager(context=Ctx())
p.initialize()
print("DEVICE", p.manager.device)
''', env={"KMM_HOST_DEVICES": "2"})
    assert rc == 0, out
    assert "DEVICE 0" in out, "the context on device 0 got a manager on another device: " + out


# -- 6. Sub-array dtypes ---------------------------------------------------------------------------

def test_subarray_dtype_array_round_trips():
    # empty((2,), (float32, (3,))) had shape (2,) while get() gave (2, 3) and set() refused it.
    m = kmm.Manager(backend=BACKEND)
    dt = np.dtype((np.float32, (3,)))
    a = m.empty((2,), dt)                         # as NumPy: the dimensions join the shape
    assert a.shape == (2, 3) and a.dtype == np.float32
    host = a.get()
    assert host.shape == a.shape and host.dtype == a.dtype
    a.set(np.ones(host.shape, host.dtype))
    assert (a.get() == 1).all()
    with pytest.raises(TypeError, match="sub-array"):   # a view cannot move them
        a.buffer.as_array((2,), dt)
    m.close()


# -- 7. kmm.cupy close(force=...) flag -----------------------------------------------------------

def test_cupy_manager_close_force_must_be_a_bool(monkeypatch):
    kc = cupy_on_host(monkeypatch)
    monkeypatch.setattr(kc, "_c_malloc", None)
    monkeypatch.setattr(kc, "allocator", kc._uncompiled_allocator)
    kc.configure(backend=BACKEND)
    kc._clear_managers()
    try:
        m = kc.manager(0)
        mp = kc.allocator(4096)  # CuPy holds memory
        with pytest.raises(TypeError, match="force"):
            m.close(force="no")  # a string is not the caller's word that nothing uses the memory
        assert not m.closed and m.stats("device")["live_buffers"] == 1
        del mp
        gc.collect()
        m.close()
    finally:
        kc._clear_managers()
        kc.configure()


# -- 8. copy_to_host(nbytes=<float>) -------------------------------------------------------------

@pytest.mark.parametrize("bad", [10.0, np.float64(10)])
def test_copy_to_host_refuses_a_float_nbytes_equal_to_the_destination(bad):
    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(100)
    with pytest.raises(TypeError, match="nbytes"):
        b.copy_to_host(bytearray(10), nbytes=bad)
    m.close()


def test_copy_to_host_refuses_a_bool_nbytes():
    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(100)
    with pytest.raises(TypeError, match="nbytes"):
        b.copy_to_host(bytearray(1), nbytes=True)
    m.close()


# -- 9. repr of a buffer whose manager is closed ---------------------------------------------------

def test_repr_of_a_buffer_of_a_closed_manager_says_closed():
    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(10)
    addr = b.ptr
    m.close()
    assert b.closed
    r = repr(b)
    assert "closed" in r and ("%#x" % addr) not in r, r


# -- 10. A 1-D ndarray shape (a sequence of integers) is misread as one dimension ------------------

def test_shape_given_as_a_1d_ndarray_is_a_sequence_of_dimensions():
    m = kmm.Manager(backend=BACKEND)
    # NumPy takes np.empty(np.array([2, 3])); kmm's shape is "an integer or a sequence of
    # integers", yet the array is taken for one dimension: "shape[0] = array([2, 3]) must be an
    # integer".
    assert m.empty(np.array([2, 3])).shape == (2, 3)
    assert m.empty((2, 3)).reshape(np.array([3, 2])).shape == (3, 2)
    m.close()


def test_numba_allocations_on_other_threads_survive_a_close_of_the_plugins_manager():
    # The close detached the compiled allocator while it counted live buffers; an allocation on
    # another thread meanwhile failed with "manager is 0", even when the close was refused.
    import threading

    kn = _numba()
    kn.configure(backend=BACKEND)
    try:
        p = kn.KmmNumbaMemoryManager(context=None)
        held = p.memalloc(64)                  # keeps every close refused
        errors, stop = [], threading.Event()

        def allocate():
            while not stop.is_set():
                try:
                    p.memalloc(256).free()
                except Exception as e:  # noqa: BLE001 - any failure is the defect
                    errors.append(repr(e))
                    return

        t = threading.Thread(target=allocate)
        t.start()
        m = p.manager
        try:
            for _ in range(5000):
                with pytest.raises(kmm.BufferMappedError):
                    m.close()
        finally:
            stop.set()
            t.join()
        assert errors == [] and p.manager is m and not m.closed
        del held
        p.reset()
    finally:
        kn.configure()
