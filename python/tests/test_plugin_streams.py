"""The stream ordering of libkmm's plugin calls (kmm_plugin_alloc / kmm_plugin_free), on the host
backend where other managers' streams stand in for foreign streams."""

import ctypes

import pytest

import kmm
from kmm import _lib
from conftest import BACKEND

L = _lib.lib


def alloc(m, nbytes, stream, kind=0):
    s = (ctypes.c_uint64 * 2)()
    a = ctypes.addressof(s)
    status = L.kmm_plugin_alloc(m.handle, nbytes, kind, stream, a, a + 8)
    return status, s[0], s[1]


pytestmark = pytest.mark.skipif(BACKEND != "host", reason="uses host-backend stream ids")


def test_alloc_free_on_own_stream(manager):
    status, buf, ptr = alloc(manager, 4096, manager.stream)
    assert status == 0 and buf and ptr
    assert manager.stats("device")["live_buffers"] == 1
    assert L.kmm_plugin_free(manager.handle, buf, manager.stream) == 0
    assert manager.stats("device")["live_buffers"] == 0
    assert L.kmm_plugin_free(manager.handle, buf, manager.stream) == 2001  # double free


def test_a_forged_stream_is_refused_and_leaves_nothing_behind(manager):
    bogus = 0x7777_0000
    for kind in (0, 1):  # device and pinned memory alike
        status, buf, _ = alloc(manager, 256, bogus, kind=kind)
        assert status == 1002 and buf == 0  # KMM_ERROR_INVALID_ARGUMENT
        assert "not a live host-backend stream" in L.kmm_last_error().decode()
    assert manager.stats("device")["live_buffers"] == 0
    # The refused stream is not remembered: later calls on real streams work.
    with kmm.Manager(backend="host") as other:
        status, buf, _ = alloc(manager, 256, other.stream)
        assert status == 0
        assert L.kmm_plugin_free(manager.handle, buf, other.stream) == 0


def test_a_stream_that_is_gone_does_not_break_later_calls(manager):
    with kmm.Manager(backend="host") as other:
        status, buf, _ = alloc(manager, 256, other.stream)
        assert status == 0
        assert L.kmm_plugin_free(manager.handle, buf, other.stream) == 0
    # The stream those blocks were freed on is destroyed; its work had all run.
    with kmm.Manager(backend="host") as third:
        for s in (third.stream, manager.stream):
            status, buf, _ = alloc(manager, 256, s)
            assert status == 0
            assert L.kmm_plugin_free(manager.handle, buf, s) == 0
    b = manager.alloc(64)  # the manager's own use of the same pool
    b.close()


def test_many_streams_and_raw_allocations_share_a_pool(manager):
    with kmm.Manager(backend="host") as a, kmm.Manager(backend="host") as b:
        bufs = []
        for s in (a.stream, b.stream, manager.stream, a.stream, b.stream):
            status, buf, _ = alloc(manager, 1024, s)
            assert status == 0
            bufs.append((buf, s))
        own = manager.alloc(4096)
        for buf, s in bufs:
            assert L.kmm_plugin_free(manager.handle, buf, s) == 0
        own.close()
    assert manager.stats("device")["live_buffers"] == 0


def test_plugin_malloc_by_address(manager):
    ptr = L.kmm_plugin_malloc(manager.handle, 4096, manager.stream)
    assert ptr and ptr % 256 == 0
    assert manager.stats("device")["in_use"] == 4096
    assert L.kmm_plugin_free_address(manager.handle, ptr + 8, manager.stream) == 1002  # not an allocation
    assert "was not allocated by kmm_plugin_malloc" in L.kmm_last_error().decode()
    assert L.kmm_plugin_free_address(manager.handle, ptr, manager.stream) == 0
    assert manager.stats("device")["in_use"] == 0
    assert L.kmm_plugin_free_address(manager.handle, ptr, manager.stream) == 1002  # double free


def test_plugin_malloc_failures_set_the_last_status():
    m = kmm.Manager(backend=BACKEND, hard_limit=1 << 20)
    assert L.kmm_plugin_malloc(m.handle, 2 << 20, m.stream) == 0
    assert L.kmm_last_status() == 3001 and "1048576" in L.kmm_last_error().decode()
    assert L.kmm_plugin_malloc(m.handle, 0, m.stream) == 0
    assert L.kmm_last_status() == 1002 and "bytes = 0" in L.kmm_last_error().decode()
    handle = m.handle
    ptr = L.kmm_plugin_malloc(handle, 4096, m.stream)
    m.close()  # the late free of a destroyed manager's memory fails, and cannot hit a newer one
    other = kmm.Manager(backend=BACKEND)
    newer = [L.kmm_plugin_malloc(other.handle, 4096, other.stream) for _ in range(4)]
    assert L.kmm_plugin_free_address(handle, ptr, 0) != 0
    assert other.stats("device")["live_buffers"] == 4
    for p in newer:
        assert L.kmm_plugin_free_address(other.handle, p, other.stream) == 0
    assert other.stats("device")["live_buffers"] == 0
    other.close()
