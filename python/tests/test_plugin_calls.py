"""kmm.numba's per-allocation calls: the compiled module and its Python equivalent pass the same
checks. tools/test.sh builds the compiled one and sets KMM_REQUIRE_COMPILED=1, so CI fails
instead of skipping when it is missing.

The pointers subclass a stand-in for Numba's MemoryPointer (a plain class, as Numba's is), so
these checks need no Numba; tests/test_numba_plugin.py checks them against Numba's."""

import gc
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

import kmm
from kmm import _lib
from conftest import BACKEND

IMPLEMENTATIONS = ["kmm._plugin_calls", "kmm._plugin_calls_py"]


class StandInMemoryPointer:
    """What the pointers inherit from Numba's MemoryPointer: methods over their attributes."""

    __cuda_memory__ = True

    @property
    def owner(self):
        return self if self._owner is None else self._owner

    @property
    def device_pointer_value(self):
        return int(self.device_pointer) or None


class DevicePointer(int):
    """Stands in for cuda-python's CUdeviceptr and counts how many were made."""

    made = 0

    def __new__(cls, address):
        DevicePointer.made += 1
        return super().__new__(cls, address)


@pytest.fixture(params=IMPLEMENTATIONS)
def calls(request):
    try:
        module = importlib.import_module(request.param)
    except ImportError as e:
        if os.environ.get("KMM_REQUIRE_COMPILED") == "1":
            raise
        pytest.skip("%s not built (%s): `python setup.py build_ext --inplace` in python/" % (request.param, e))
    module.bind(_lib.address_of(_lib.lib.kmm_plugin_alloc), _lib.address_of(_lib.lib.kmm_plugin_free))
    return module


class Fallback:
    """An Allocator's fallback that records what it was handed."""

    def __init__(self):
        self.sizes = []

    def __call__(self, size):
        self.sizes.append(size)
        return "fallback"


def allocator(calls, manager, deferral=None, fallback=None):
    a = calls.Allocator(calls.pointer_type(StandInMemoryPointer, DevicePointer), deferral, fallback or Fallback())
    a.manager = manager._handle
    a.context = "the context"
    return a


def live(manager):
    return manager.stats("device")["live_buffers"]


def test_bind_rejects_null(calls):
    with pytest.raises(ValueError, match="must not be 0"):
        calls.bind(0, _lib.address_of(_lib.lib.kmm_plugin_free))


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_allocator_needs_bind(name):
    if name == "kmm._plugin_calls":
        pytest.importorskip(name)
    code = (
        "import %s as calls\n"
        "class Base: pass\n"
        "try:\n"
        "    calls.Allocator(calls.pointer_type(Base, int), None, print)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n" % name
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "bind() was not called" in out.stdout


def test_pointer_has_numbas_attributes(calls, manager):
    DevicePointer.made = 0
    p = allocator(calls, manager).memalloc(1 << 20)
    assert isinstance(p, StandInMemoryPointer) and p.__cuda_memory__
    assert p.size == p._cuda_memsize_ == 1 << 20 and p.is_managed and p.alive
    assert p.address != 0 and p.address % 256 == 0
    assert p.context == "the context" and p.owner is p and p.refct == 1
    assert DevicePointer.made == 0  # made when first asked for
    assert p.device_pointer == p.address and p.device_pointer_value == p.address
    assert p.handle is p.device_pointer and DevicePointer.made == 1
    p.refct += 1  # Numba's OwnedPointer counts in it
    assert p.refct == 2
    assert live(manager) == 1 and manager.stats("device")["in_use"] == 1 << 20


def test_pointer_frees_once_when_freed(calls, manager):
    p = allocator(calls, manager).memalloc(1 << 20)
    p.free()
    assert not p.alive and live(manager) == 0
    with pytest.raises(RuntimeError, match="Freeing dead memory"):  # Numba's message
        p.free()
    del p
    assert manager.stats("device")["frees"] == 1


def test_pointers_free_when_dropped_or_collected(calls, manager):
    a = allocator(calls, manager)
    pointers = [a.memalloc(4096) for _ in range(8)]
    assert len({p.address for p in pointers}) == 8 and live(manager) == 8
    del pointers  # reference counting alone frees them
    assert live(manager) == 0
    p = a.memalloc(4096)
    p.cycle = [p]  # a reference cycle through the pointer's dict: only the collector frees it
    q = a.memalloc(4096)
    q.context = [q]  # and one through a field
    del p, q
    gc.collect()
    assert live(manager) == 0 and manager.stats("device")["frees"] == 10


def test_memalloc_hands_what_it_cannot_serve_to_the_fallback(calls):
    fallback = Fallback()
    m = kmm.Manager(backend=BACKEND, hard_limit=1 << 20, chunk_size=1 << 20)
    a = allocator(calls, m, fallback=fallback)
    assert a.memalloc(0) == "fallback"  # empty
    assert a.memalloc(-1) == "fallback"  # invalid: the fallback says what is wrong
    assert a.memalloc(np.int64(64)) == "fallback"  # not an int
    assert a.memalloc(2 << 20) == "fallback"  # libkmm failed: out of memory
    assert _lib.lib.kmm_last_status() == 3001
    a.manager = 0
    assert a.memalloc(64) == "fallback"  # no manager yet
    assert fallback.sizes == [0, -1, 64, 2 << 20, 64] and type(fallback.sizes[2]) is np.int64
    assert m.stats("device")["live_buffers"] == 0
    m.close()


def test_allocate_returns_none_with_the_status(calls):
    m = kmm.Manager(backend=BACKEND, hard_limit=1 << 20, chunk_size=1 << 20)
    a = allocator(calls, m)
    assert a.allocate(2 << 20) is None
    assert _lib.lib.kmm_last_status() == 3001  # KMM_ERROR_OUT_OF_MEMORY
    assert a.allocate(1 << 60) is None
    assert _lib.lib.kmm_last_status() == 1004  # KMM_ERROR_SIZE_OVERFLOW: past KMM_MAX_BUFFER_BYTES
    for bad in (0, -1, 1 << 64):
        with pytest.raises(ValueError, match=r"size must be an int in \[1, 2\*\*64\)"):
            a.allocate(bad)
    handle = m._handle
    m.close()
    assert a.allocate(4096) is None
    assert _lib.lib.kmm_last_status() == 2001  # KMM_ERROR_INVALID_HANDLE
    a.manager = 0
    with pytest.raises(RuntimeError, match="manager is 0"):
        a.allocate(4096)
    assert handle != 0


def test_allocator_checks_its_arguments(calls):
    ptype = calls.pointer_type(StandInMemoryPointer, DevicePointer)
    with pytest.raises(TypeError, match="pointer_type must come from pointer_type"):
        calls.Allocator(StandInMemoryPointer, None, Fallback())
    with pytest.raises(TypeError, match="deferral must be"):
        calls.Allocator(ptype, object(), Fallback())
    with pytest.raises(TypeError, match="fallback must be callable"):
        calls.Allocator(ptype, None, 42)


def test_compiled_pointer_type_guards_its_layout():
    calls = pytest.importorskip("kmm._plugin_calls")
    ptype = calls.pointer_type(StandInMemoryPointer, DevicePointer)
    with pytest.raises(TypeError):  # only memalloc makes them (their fields would be empty)
        ptype()

    class Wider:
        __slots__ = ("a", "b", "c")

    with pytest.raises(TypeError, match="lays out"):  # its fields would sit elsewhere
        calls.pointer_type(Wider, DevicePointer)


def test_deferral_holds_frees_until_the_outermost_exit(calls, manager):
    d = calls.Deferral()
    assert d.depth == 0 and d.pending == 0
    a = allocator(calls, manager, deferral=d)
    p, q = a.memalloc(4096), a.memalloc(4096)
    d.enter()
    d.enter()
    del p
    q.free()
    assert d.pending == 2 and live(manager) == 2 and not q.alive
    d.exit()
    assert d.depth == 1 and live(manager) == 2
    d.exit()
    assert d.depth == 0 and d.pending == 0 and live(manager) == 0
    with pytest.raises(RuntimeError, match="without a matching enter"):
        d.exit()
    r = a.memalloc(4096)
    del r  # not deferring: freed at once
    assert live(manager) == 0


def test_deferral_flush_and_discard(calls, manager):
    d = calls.Deferral()
    a = allocator(calls, manager, deferral=d)
    d.enter()
    for _ in range(40):  # past the first growth of the compiled list
        a.memalloc(4096)
    assert d.pending == 40 and live(manager) == 40
    assert d.flush() == 40
    assert d.pending == 0 and live(manager) == 0 and d.depth == 1
    a.memalloc(4096)
    d.discard()  # what reset() does once the manager is destroyed
    assert d.pending == 0 and live(manager) == 1
    d.exit()
    assert live(manager) == 1


def test_frees_after_the_manager_closed_are_harmless(calls):
    m = kmm.Manager(backend=BACKEND)
    p = allocator(calls, m).memalloc(4096)
    m.close()
    p.free()  # libkmm answers KMM_ERROR_INVALID_HANDLE; nothing raises, nothing crashes
    assert not p.alive
