"""Adversarial round 9: argument checks the public API promises (docs/python.md, "Arguments":
bad input raises `TypeError` or a `kmm.KmmError` subclass naming the argument) that the
current code misses. Each test fails on the current code because of the defect it names."""

import numpy as np
import pytest

import kmm
from conftest import expect_named, import_holding_its_producer, lib_call_with_window


def test_asarray_checks_kind_of_a_device_array_or_cai_object(manager):
    # kmm.asarray checks `manager` "even where unused" for a DeviceArray, but takes any `kind`
    # ("bogus", 7, 1.5, True; None is the default: the view's own kind) without a word, for DeviceArray and CAI inputs alike, while
    # the same call with a host array refuses it (ValueError naming kind).
    a = manager.asarray(np.arange(3.0))
    expect_named((ValueError, TypeError), "kind", kmm.asarray, [1.0, 2.0], manager=manager, kind="bogus")
    for bad in ("bogus", 7, 1.5, True):
        expect_named((ValueError, TypeError), "kind", kmm.asarray, a, manager=manager, kind=bad)
        expect_named((ValueError, TypeError), "kind", kmm.asarray, a.buffer, manager=manager, kind=bad)
    # the default and the view's own kind are accepted, for the array and its buffer's CAI
    assert kmm.asarray(a, manager=manager) is a
    assert kmm.asarray(a, manager=manager, kind="device") is a
    assert kmm.asarray(a.buffer, manager=manager, kind="device").buffer.kind == "device"
    p = manager.asarray(np.arange(3.0), kind="pinned")
    assert kmm.asarray(p, manager=manager) is p
    expect_named(ValueError, "kind", kmm.asarray, p, manager=manager, kind="device")


def test_asarray_of_a_device_array_never_hands_back_another_kind_than_asked(manager):
    # kind="pinned" of a device array silently returns the device array: the caller asked for
    # page-locked host memory (to host_view() it on CUDA, say) and got device memory. Either
    # the memory is of the kind asked for, or the call refuses.
    a = manager.asarray(np.arange(3.0))
    try:
        r = kmm.asarray(a, manager=manager, kind="pinned")
    except (ValueError, TypeError, kmm.KmmError):
        return
    assert r.buffer.kind == "pinned", "asked for pinned memory, got %s memory" % r.buffer.kind


@pytest.mark.parametrize("bad", [["host"], {"host": 1}, {"host"}])
def test_backend_of_device_count_and_can_access_peer_is_named_when_refused(bad):
    # `backend not in BACKENDS` on an unhashable value raises "unhashable type: 'list'",
    # naming neither the argument nor what it may be.
    expect_named((TypeError, ValueError, kmm.KmmError), "backend", kmm.device_count, bad)
    expect_named((TypeError, ValueError, kmm.KmmError), "backend", kmm.can_access_peer, 0, 0, bad)


@pytest.mark.parametrize("bad", [5, 1.5, ["/tmp/x.csv"]])
def test_trace_paths_of_the_wrong_type_are_named(manager, bad, tmp_path):
    # os.fsencode's own TypeError ("expected str, bytes or os.PathLike object, not int") names
    # no argument; path is empty / NUL errors do name it.
    expect_named(TypeError, "path", manager.trace_start, path=bad)
    manager.trace_start()
    expect_named(TypeError, "path", manager.save_trace, bad)
    expect_named(TypeError, "path", manager.save_trace, None)


def test_an_import_freed_after_a_synchronize_waited_keeps_its_producer(monkeypatch):
    # Another thread frees an import (its producer held until an event recorded at the free
    # passes) after this thread's synchronize has waited but before it let go of the passed
    # producers: synchronize let go of every held producer, that late one too, while the work
    # queued before its free (a copy out of its memory) was still to run. The late free is
    # played in the window itself, in this thread, so the interleaving is certain.
    MiB = 1 << 20
    m1 = kmm.Manager(backend="host")
    m2 = kmm.Manager(backend="host")
    try:
        imports = import_holding_its_producer(m1, m2, MiB)
        slow = m2.alloc(256 * MiB)
        dst = m2.alloc(MiB)

        def late_free():  # the other thread, in the window after the wait
            if imports:
                slow.fill(b"\0")
                dst.copy_from(imports[0].buffer)
                imports.clear()  # the import is freed: its producer is held

        restore = lib_call_with_window(monkeypatch, "kmm_manager_synchronize", late_free, after=True)
        m2.synchronize()
        restore()
        reuse = m1.alloc(MiB)  # the producer's memory, if it was let go
        reuse.fill(b"\xee")
        m1.synchronize()
        m2.synchronize()
        got = np.frombuffer(dst.copy_to_host(), np.uint8)
        assert (got == 0x22).all(), "the queued copy read memory its producer gave back: %s" % (np.unique(got),)
    finally:
        m1.close()
        m2.close()
