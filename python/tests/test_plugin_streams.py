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


def test_one_foreign_stream_needs_no_ordering(manager):
    bogus = 0x7777_0000  # never used while only one stream is seen: no call reaches it
    for _ in range(3):
        status, buf, _ = alloc(manager, 256, bogus)
        assert status == 0
        assert L.kmm_plugin_free(manager.handle, buf, bogus) == 0


def test_second_stream_orders_with_the_first(manager):
    bogus = 0x7777_0001
    status, buf, _ = alloc(manager, 256, bogus)
    assert status == 0
    with kmm.Manager(backend="host") as other:
        # A second stream appears: the manager's stream must wait for the first one, which
        # reaches the (bogus) first stream and fails: proof that the ordering happens.
        status, _, _ = alloc(manager, 256, other.stream)
        assert status != 0
        assert L.kmm_plugin_free(manager.handle, buf, bogus) == 0  # still bound to it


def test_multi_stream_mode_orders_every_call(manager):
    with kmm.Manager(backend="host") as a, kmm.Manager(backend="host") as b:
        bufs = []
        for s in (a.stream, b.stream, a.stream, b.stream):
            status, buf, _ = alloc(manager, 1024, s)
            assert status == 0
            bufs.append((buf, s))
        for buf, s in bufs:
            assert L.kmm_plugin_free(manager.handle, buf, s) == 0
        assert alloc(manager, 64, 0x7777_0002)[0] != 0  # every call is ordered now
    assert manager.stats("device")["live_buffers"] == 0


def test_pinned_memory_is_always_ordered(manager):
    status, _, _ = alloc(manager, 256, 0x7777_0003, kind=1)
    assert status != 0  # the signal reaches the (bogus) stream at once
    with kmm.Manager(backend="host") as a:
        status, buf, ptr = alloc(manager, 256, a.stream, kind=1)
        assert status == 0 and ptr
        assert L.kmm_plugin_free(manager.handle, buf, a.stream) == 0


def test_own_use_of_a_plugin_pool_is_ordered(manager):
    status, buf, _ = alloc(manager, 256, 0x7777_0004)
    assert status == 0  # the pool is bound to that (bogus) stream
    with pytest.raises(kmm.KmmError):
        manager.alloc(64)  # the manager's own stream joins: it must wait for the bound stream
    assert L.kmm_plugin_free(manager.handle, buf, 0x7777_0004) == 0


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
