"""Adversarial round 13 (host backend): the bare `__cuda_array_interface__` dict of a kmm import,
NumPy subclasses whose properties lie to a copy, a zero-size view's dict at a buffer's end,
complex parts past a float type's range, and a non-CAI object given to the CAI import. Each test
failed on the code before the fix it names."""

import gc

import numpy as np
import pytest

import kmm
from conftest import expect_named


@pytest.fixture
def manager():
    m = kmm.Manager(backend="host")
    yield m
    m.close()


def test_the_bare_dict_of_a_kmm_import_holds_its_producer(manager):
    # The dict of an array made by from_dlpack held nothing: once that array went, NumPy's memory
    # went with its producer, and writes through the dict's import landed in the next array there.
    host = np.ones(1 << 20)
    x = kmm.from_dlpack(host, manager=manager)
    d = x.__cuda_array_interface__
    y = kmm.from_cuda_array_interface(d, manager=manager)
    del host, x
    gc.collect()
    manager.synchronize()
    # The producer is still there: y reads NumPy's ones, not whatever took the memory.
    assert (y.get() == 1).all()
    y.buffer.fill(b"\x00")
    manager.synchronize()
    assert (y.get() == 0).all()


def test_the_bare_dict_of_an_import_of_foreign_memory_holds_the_import(manager):
    # Same, through an import of another library's dict (a CAI producer that is not kmm).
    host = np.arange(1 << 16, dtype=np.float64)

    class Producer:
        def __init__(self, a):
            self.a = a
            self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                             "data": (a.ctypes.data, False), "version": 3}

    x = kmm.from_cuda_array_interface(Producer(host), manager=manager)
    want = host.copy()
    del host
    y = kmm.from_cuda_array_interface(x.__cuda_array_interface__, manager=manager)
    del x
    gc.collect()
    manager.synchronize()
    assert (y.get() == want).all()


def test_a_zero_size_view_at_a_buffers_end_leaves_the_next_buffers_dict_valid(manager):
    # The empty view's dict has the address where the next buffer starts; it took that address's
    # entry, and the next buffer's own valid dict was refused as reaching past the first buffer.
    a, c = manager.alloc(256), manager.alloc(256)
    if c.ptr != a.ptr + a.nbytes:
        pytest.skip("the pool did not place the buffers side by side")
    d = c.__cuda_array_interface__
    a.as_array((0,), "u1", offset=a.nbytes).__cuda_array_interface__
    c.fill(b"\x07")
    imported = kmm.from_cuda_array_interface(d, manager=manager)
    assert (imported.get() == 7).all()
    # ... and it still holds c: a dict past c's end is refused.
    d_past = dict(d, shape=(512,))
    expect_named(ValueError, "reach past", kmm.from_cuda_array_interface, d_past, manager=manager)


class _LyingSize(np.ndarray):
    @property
    def nbytes(self):
        return 1 << 20


class _ClaimsWritable(np.ndarray):
    @property
    def flags(self):
        class Flags:
            c_contiguous = True
            writeable = True
        return Flags()


def test_a_numpy_subclass_cannot_lie_a_copy_past_its_memory(manager):
    # host_address trusted nbytes, flags, dtype and ctypes of an ndarray subclass (Python
    # properties): copy_from_host read 1 MiB from an 8-byte array, copy_to_host wrote 1 MiB into
    # one (a segfault), and a "writable" subclass over a bytes object let a copy change it.
    buf = manager.alloc(1 << 20)
    buf.fill(b"\0")
    src = np.arange(8, dtype=np.uint8).view(_LyingSize)
    buf.copy_from_host(src)
    back = np.frombuffer(buf.copy_to_host(), np.uint8)
    assert back[:8].tolist() == list(range(8))
    assert not back[8:].any(), "the copy read past the 8-byte source"
    buf.fill(b"\xab")
    guard = np.zeros(64, np.uint8)
    dst = guard[:8].view(_LyingSize)
    buf.copy_to_host(dst)
    assert (guard[:8] == 0xAB).all() and not guard[8:].any(), "the copy wrote past the 8-byte destination"
    frozen = bytes(b"abcd")
    read_only = np.frombuffer(frozen, np.uint8).view(_ClaimsWritable)
    expect_named(ValueError, "read-only", buf.copy_to_host, read_only)
    assert frozen == b"abcd"


@pytest.mark.parametrize("value", [complex(np.nan, 1e300), complex(1e300, np.inf), complex(np.inf, -1e300)])
def test_set_refuses_a_finite_complex_part_stored_as_inf(manager, value):
    # The range check tested the number as a whole: with the other part inf or nan, 1e300 into
    # complex64 was stored as inf silently.
    a = manager.empty(1, np.complex64)
    a.set(np.zeros(1, np.complex64))
    expect_named(ValueError, "cannot hold", a.set, np.array([value]))
    assert a.get()[0] == 0
    a.set(np.array([complex(np.nan, np.inf)]))  # inf and nan given as such are stored as such
    got = a.get()[0]
    assert np.isnan(got.real) and np.isinf(got.imag)


def test_the_cai_import_of_an_object_without_cai_raises_type_error(manager):
    # An AttributeError from inside the import, naming nothing.
    for obj in (5, np.zeros(3), object()):
        expect_named(TypeError, "obj", kmm.from_cuda_array_interface, obj, manager=manager)


def test_the_table_of_cai_addresses_takes_threads_exporting_at_once(manager):
    # Found by the review of these fixes: the table's prune iterated it while other threads
    # entered addresses ("dictionary changed size during iteration" from a property read), and
    # a prune could drop an entry just being added.
    import threading
    import traceback

    errors = []

    def export(seed):
        try:
            for r in range(30):
                big = manager.empty((100000,), "float32")
                base = ((r * 6 + seed) * 400) % 95000
                for k in range(base, base + 400):
                    kmm.DeviceArray(big.buffer, (1,), "float32", offset=4 * k).__cuda_array_interface__
                del big
        except Exception as e:  # noqa: BLE001 - any error from a property read is the finding
            errors.append("".join(traceback.format_exception(type(e), e, e.__traceback__)))

    import sys
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: the races show in one run
    try:
        threads = [threading.Thread(target=export, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
