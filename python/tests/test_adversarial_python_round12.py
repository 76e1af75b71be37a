"""Adversarial round 12 (host backend): a buffer closed while another thread copies into or out
of it, a bare `__cuda_array_interface__` dict imported after its array is freed, buffer-protocol
objects NumPy has no dtype for, nested sub-array dtypes, and `set()`'s hints and time units. Each
test failed on the code before the fix it names."""

import ctypes
import gc
import threading
import time

import numpy as np
import pytest

import kmm
from conftest import expect_named


def _host_manager(**kw):
    # Small staging slots: a copy of a few MiB is queued slot by slot, long enough to be caught
    # in the middle by a close() in another thread.
    return kmm.Manager(backend="host", staging_chunk_size=64 << 10, staging_chunks=2, **kw)


@pytest.mark.parametrize("direction", ["from_host", "to_host"])
def test_a_close_during_a_copy_in_another_thread_frees_after_the_copy(direction):
    # The free released the memory while the copy still queued its slots: the next buffer at that
    # address got the old copy's bytes (from_host), or the copy read the next buffer's (to_host).
    m = _host_manager()
    n = 8 << 20
    bad = []
    try:
        for _ in range(6):
            buf = m.alloc(n)
            buf.fill(b"\x11")
            m.synchronize()
            src, dst = np.full(n, 0xAA, np.uint8), np.zeros(n, np.uint8)
            started = threading.Event()

            def copy():
                started.set()
                buf.copy_from_host(src) if direction == "from_host" else buf.copy_to_host(dst)

            t = threading.Thread(target=copy)
            t.start()
            started.wait()
            time.sleep(0.002)
            buf.close()
            nxt = m.alloc(n)
            nxt.fill(b"\xbb")
            t.join()
            m.synchronize()
            got = np.empty(n, np.uint8)
            nxt.copy_to_host(got)
            if direction == "from_host":
                bad.append(int((got != 0xBB).sum()))
            else:
                bad.append(int((dst == 0xBB).sum()))
            nxt.close()
        assert bad == [0] * 6, "bytes of the other buffer per round: %s" % bad
    finally:
        m.close()


def test_a_bare_cai_dict_holds_its_kmm_buffer(manager):
    # Given only the dict, the import held the dict: the array's buffer was freed, its address
    # handed out again, and the import wrote into the new array.
    a = manager.asarray(np.arange(1024, dtype=np.int32))
    b = kmm.from_cuda_array_interface(a.__cuda_array_interface__, manager=manager)
    del a
    gc.collect()
    c = manager.asarray(np.full(1024, -7, np.int32))
    assert c.ptr != b.ptr
    b.set(np.zeros(1024, np.int32))
    assert (c.get() == -7).all() and (b.get() == 0).all()
    # A dict claiming more bytes than its buffer holds is refused.
    e = manager.asarray(np.arange(4, dtype=np.int32))
    longer = dict(e.__cuda_array_interface__, shape=(8,))
    expect_named(ValueError, "reach past", kmm.from_cuda_array_interface, longer, manager=manager)
    # Its own bytes, or fewer, import as before.
    shorter = dict(e.__cuda_array_interface__, shape=(2,))
    assert kmm.from_cuda_array_interface(shorter, manager=manager).get().tolist() == [0, 1]


def test_the_table_of_cai_addresses_refuses_no_valid_dict(manager):
    # Found by the review of the fix above: a closed import of foreign memory, a closed buffer
    # whose address a new buffer took, and a smaller import at the same address made valid
    # dicts refused.
    host = np.arange(8, dtype=np.float32)
    d = {"shape": (8,), "typestr": "<f4", "data": (host.ctypes.data, False), "version": 3}
    imp = kmm.from_cuda_array_interface(d, manager=manager)
    imp.__cuda_array_interface__
    imp.close()
    assert kmm.from_cuda_array_interface(d, manager=manager).get().tolist() == host.tolist()
    b1 = manager.empty((256,), "uint8")
    b1.__cuda_array_interface__
    b1.close()
    b2 = manager.empty((256,), "uint8")
    b2.set(np.full(256, 9, np.uint8))
    by_hand = {"shape": (256,), "typestr": "|u1", "data": (b2.ptr, False), "version": 3}
    assert (kmm.from_cuda_array_interface(by_hand, manager=manager).get() == 9).all()
    a = manager.empty((16,), "float32")
    full = a.__cuda_array_interface__
    sub = kmm.from_cuda_array_interface(a.buffer.as_array((2,), np.float32), manager=manager)
    sub.__cuda_array_interface__
    assert kmm.from_cuda_array_interface(full, manager=manager).shape == (16,)


def test_set_checks_time_fields_of_records(manager):
    # Found by the review: record dtypes went through NumPy's "safe" cast, which takes a finer
    # time unit and wraps (2500-01-01 in seconds stored as 1915 in nanoseconds).
    a = kmm.empty((2,), [("d", "M8[ns]")], manager=manager)
    expect_named(TypeError, "without changing values", a.set,
                 np.array([("2500-01-01",), ("1970-01-02",)], [("d", "M8[s]")]))
    ok = np.array([("2000-01-01",), ("1970-01-02",)], [("d", "M8[s]")])
    a.set(ok)
    assert a.get()["d"].tolist() == ok["d"].astype("M8[ns]").tolist()


def test_buffer_protocol_objects_numpy_cannot_read_copy_as_bytes(manager):
    # ctypes pointers, long doubles, wide chars and bit fields raised NumPy's errors, naming no
    # argument; python.md says any buffer-protocol object.
    b = manager.alloc(64)
    src = (ctypes.c_void_p * 2)(0x1234, 0x5678)
    b.copy_from_host(src)
    back = (ctypes.c_void_p * 2)()
    b.copy_to_host(back)
    assert list(back) == [0x1234, 0x5678]
    b.copy_from_host((ctypes.c_longdouble * 2)(1.5, 2.5))
    b.copy_from_host((ctypes.c_wchar * 3)(*"abc"))

    class Bits(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int, 3)]

    b.copy_to_host((Bits * 4)())
    expect_named(TypeError, "src", b.copy_from_host, (ctypes.py_object * 2)())
    expect_named(TypeError, "src", b.copy_from_host, 5)


def test_nested_sub_array_dtypes_add_their_dimensions(manager):
    a = kmm.empty(2, ("(2,)f4", (3,)), manager=manager)
    assert a.shape == np.empty(2, ("(2,)f4", (3,))).shape == (2, 3, 2)
    assert a.dtype == np.float32


def test_set_hints_and_time_units(manager):
    a = kmm.empty(1, [("a", "i2")], manager=manager)
    err = expect_named(TypeError, "fields whose types hold", a.set, np.array([(1.5,)], [("a", "f4")]))
    assert "astype('|V" not in str(err)
    # Field by field as plain arrays: an integer into a float field is stored (rounded), one past
    # the float's range is refused, as for plain arrays.
    f = kmm.empty(1, [("a", "f2")], manager=manager)
    f.set(np.array([(300,)], [("a", "i2")]))
    assert f.get()["a"].tolist() == [300.0]
    expect_named(ValueError, "inf", f.set, np.array([(70000,)], [("a", "i4")]))
    t = kmm.empty(2, "m8", manager=manager)
    expect_named(TypeError, "generic unit", t.set, np.array([1, 2], "m8[s]"))
    t.set(np.array([1, 2], "m8"))
    assert t.get().tolist() == np.array([1, 2], "m8").tolist()
