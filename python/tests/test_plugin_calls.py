"""kmm.numba's per-allocation calls: the compiled module and its Python equivalent pass the same
checks. tools/test.sh builds the compiled one and sets KMM_REQUIRE_COMPILED=1, so CI fails
instead of skipping when it is missing."""

import gc
import importlib
import os

import pytest

import kmm
from kmm import _lib
from conftest import BACKEND

IMPLEMENTATIONS = ["kmm._plugin_calls", "kmm._plugin_calls_py"]


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


def live(manager):
    return manager.stats("device")["live_buffers"]


def test_bind_rejects_null(calls):
    with pytest.raises(ValueError, match="must not be 0"):
        calls.bind(0, _lib.address_of(_lib.lib.kmm_plugin_free))


def test_allocation_frees_once_when_called(calls, manager):
    a = calls.allocate(manager._handle, 1 << 20, 0, None)
    assert a.alive and a.address % 256 == 0 and a.address != 0
    assert live(manager) == 1 and manager.stats("device")["in_use"] == 1 << 20
    a()
    assert not a.alive and live(manager) == 0
    a()  # a second call does nothing
    del a
    assert manager.stats("device")["frees"] == 1


def test_allocation_frees_when_collected(calls, manager):
    allocations = [calls.allocate(manager._handle, 4096, 0, None) for _ in range(8)]
    assert len({a.address for a in allocations}) == 8 and live(manager) == 8
    del allocations
    gc.collect()
    assert live(manager) == 0


def test_failure_returns_none_with_status(calls):
    m = kmm.Manager(backend=BACKEND, hard_limit=1 << 20, chunk_size=1 << 20)
    assert calls.allocate(m._handle, 2 << 20, 0, None) is None
    assert _lib.lib.kmm_last_status() == 3001  # KMM_ERROR_OUT_OF_MEMORY
    assert calls.allocate(m._handle, 1 << 60, 0, None) is None
    assert _lib.lib.kmm_last_status() == 1004  # KMM_ERROR_SIZE_OVERFLOW: past KMM_MAX_BUFFER_BYTES
    empty = calls.allocate(m._handle, 0, 0, None)
    assert empty.address == 0 and m.stats("device")["live_buffers"] == 1  # a buffer, no memory
    empty()
    assert m.stats("device")["live_buffers"] == 0
    handle = m._handle
    m.close()
    assert calls.allocate(handle, 4096, 0, None) is None
    assert _lib.lib.kmm_last_status() == 2001  # KMM_ERROR_INVALID_HANDLE


def test_deferral_holds_frees_until_the_outermost_exit(calls, manager):
    d = calls.Deferral()
    assert d.depth == 0 and d.pending == 0
    a = calls.allocate(manager._handle, 4096, 0, d)
    b = calls.allocate(manager._handle, 4096, 0, d)
    d.enter()
    d.enter()
    del a
    b()
    assert d.pending == 2 and live(manager) == 2 and not b.alive
    d.exit()
    assert d.depth == 1 and live(manager) == 2
    d.exit()
    assert d.depth == 0 and d.pending == 0 and live(manager) == 0
    with pytest.raises(RuntimeError, match="without a matching enter"):
        d.exit()
    c = calls.allocate(manager._handle, 4096, 0, d)
    del c  # not deferring: freed at once
    assert live(manager) == 0


def test_deferral_flush_and_discard(calls, manager):
    d = calls.Deferral()
    d.enter()
    for _ in range(40):  # past the first growth of the compiled list
        calls.allocate(manager._handle, 4096, 0, d)
    assert d.pending == 40 and live(manager) == 40
    assert d.flush() == 40
    assert d.pending == 0 and live(manager) == 0 and d.depth == 1
    calls.allocate(manager._handle, 4096, 0, d)
    d.discard()  # what reset() does once the manager is destroyed
    assert d.pending == 0 and live(manager) == 1
    d.exit()
    assert live(manager) == 1


def test_frees_after_the_manager_closed_are_harmless(calls):
    m = kmm.Manager(backend=BACKEND)
    a = calls.allocate(m._handle, 4096, 0, None)
    m.close()
    a()  # libkmm answers KMM_ERROR_INVALID_HANDLE; nothing raises, nothing crashes
    assert not a.alive
