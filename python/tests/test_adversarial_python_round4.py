"""Defects found by the fourth adversarial run against the Python package (host backend), one
test each: shapes whose C strides leave int64, integers past a float array's range in set(), the
limit kmm.cupy's out-of-memory error reports, and smaller argument checks (stats' kind as a NumPy
integer, __dlpack__'s max_version, bool() of a 0-d array)."""

import gc
import warnings

import numpy as np
import pytest

import kmm
from conftest import cupy_on_host

BACKEND = "host"
I64_MAX = (1 << 63) - 1


@pytest.fixture
def m():
    mgr = kmm.Manager(backend=BACKEND)
    yield mgr
    mgr.close()


# -- 3. shapes whose C strides leave int64 --------------------------------------------------------

@pytest.mark.parametrize("shape, dtype", [
    ((0, 2, 1 << 62), "uint8"),        # strides[0] would be 2^63
    ((0, 1 << 61), "float64"),         # strides[0] would be 2^64
    ((1 << 62, 0), "int32"),           # NumPy's count (a 0 as 1): 2^64 bytes
    ((0, 3, 5, 1 << 60), "uint8"),
])
def test_empty_array_strides_stay_within_int64(m, shape, dtype):
    # m.empty((0, 2, 2**62), "u1") was accepted with strides[0] == 2^63 (NumPy refuses the
    # shape); its DLPack export wrapped the stride to -2^63 and get() failed inside NumPy.
    for make in (lambda: m.empty(shape, dtype), lambda: kmm.DeviceArray.zeros(shape, dtype, manager=m)):
        with pytest.raises(kmm.SizeOverflowError) as info:
            make()
        text = str(info.value)
        assert str(shape) in text and "2^63 - 1" in text, text
    # Views and imports of such a shape are refused the same way.
    buf = m.alloc(16)
    a = m.empty(0, dtype)
    live = m.stats("device")["live_buffers"]
    with pytest.raises(kmm.SizeOverflowError, match=r"2\^63 - 1"):
        kmm.DeviceArray(buf, shape, dtype)
    with pytest.raises(kmm.SizeOverflowError, match=r"2\^63 - 1"):
        kmm.DeviceArray(buf, shape, dtype, strides=(0,) * len(shape))
    with pytest.raises(kmm.SizeOverflowError, match=r"2\^63 - 1"):
        a.reshape(shape)
    cai = {"shape": shape, "typestr": np.dtype(dtype).str, "data": (buf.ptr, False), "version": 3}
    with pytest.raises(kmm.SizeOverflowError, match=r"2\^63 - 1"):
        kmm.DeviceArray.from_cuda_array_interface(cai, manager=m)
    assert m.stats("device")["live_buffers"] == live  # nothing made
    a.close()
    buf.close()


def test_empty_arrays_within_int64_keep_working(m):
    # The bound is NumPy's: the largest empty shapes it takes are still taken, and round-trip.
    for shape, dtype in [((0, 2, 1 << 61), "uint8"), (((1 << 63) - 1, 0), "uint8"), ((0, (1 << 60) - 1), "float64")]:
        a = m.empty(shape, dtype)
        assert all(0 <= s <= I64_MAX for s in a.strides), a.strides
        back = kmm.DeviceArray.from_dlpack(a, manager=m)
        assert back.strides == a.strides and back.shape == a.shape
        assert a.get().shape == shape
        assert np.empty(shape, dtype).shape == shape  # NumPy takes it too


# -- 4. set() stores an integer that does not fit a float16 array as inf --------------------------

@pytest.mark.parametrize("value", [
    np.array([70000, 1], np.int64),
    np.array([1, -70000], np.int32),
    np.array([1 << 17, 1], np.uint64),
    [70000, 1],
])
def test_set_refuses_integers_that_overflow_a_float_array(m, value):
    # set(): "an integer must fit the array's type"; 70000 into float16 (max 65504) was stored as
    # inf (NumPy only warns).
    a = m.empty(2, "float16")
    a.set(np.zeros(2, np.float16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy overflow warning on the way either
        with pytest.raises(ValueError) as info:
            a.set(value)
    text = str(info.value)
    bad = next(int(v) for v in np.asarray(value).ravel() if abs(int(v)) > 65504)
    assert str(bad) in text and "float16" in text and "65504" in text, text
    assert a.get().tolist() == [0, 0], "a refused set() changed the array"


def test_set_refuses_a_python_int_past_float16_in_a_0d_array(m):
    a = m.empty((), "float16")
    a.set(np.float16(3))
    with pytest.raises(ValueError, match="70000.*float16"):
        a.set(70000)
    assert a.get() == 3


def test_set_keeps_storing_integers_within_a_float_range(m):
    a = m.empty(3, "float16")
    a.set(np.array([65504, -65504, 7], np.int64))
    assert a.get().tolist() == [65504, -65504, 7]
    b = m.empty(2, "float32")
    b.set(np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min]))  # rounded, finite
    assert np.isfinite(b.get()).all()
    c = m.empty(2, "complex64")
    c.set(np.array([np.iinfo(np.uint64).max, 1], np.uint64))
    assert np.isfinite(c.get()).all()
    # Other refusals are unchanged: floats into integers, integers that do not fit an integer type.
    with pytest.raises(TypeError):
        m.empty(2, "int32").set(np.array([1.5, 2.0]))
    with pytest.raises(TypeError):
        m.empty(1, "uint8").set(np.array([-1]))


# -- 6. kmm.cupy's out-of-memory error reports the device's size as the limit ----------------------


def test_cupy_oom_error_reports_the_managers_hard_limit(monkeypatch):
    # kmm.cupy raised cupy.cuda.memory.OutOfMemoryError(size, total, limit) with limit = the
    # device's total memory, even when the manager's hard_limit refused the allocation. Numba's
    # plugin reports the manager's own hard limit (round 3).
    kc = cupy_on_host(monkeypatch, python_path=True)
    import cupy

    limit = 16 << 20
    kc.configure(backend=BACKEND, hard_limit=limit, chunk_size=1 << 20)
    kc._clear_managers()
    try:
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as info:
            kc.allocator(32 << 20)
        text = str(info.value)
        assert "limit set to: {:,} bytes".format(limit) in text, text
        assert isinstance(info.value.__cause__, kmm.OutOfMemoryError)
        # configure() later changes only the managers made later.
        kc.configure(backend=BACKEND)
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError, match="{:,}".format(limit)):
            kc.allocator(32 << 20)
    finally:
        kc._clear_managers()
        kc.configure()
        gc.collect()


def test_cupy_pinned_oom_error_reports_the_pinned_limit(monkeypatch):
    kc = cupy_on_host(monkeypatch, python_path=True)
    import cupy

    limit = 64 << 20
    kc.configure(backend=BACKEND, pinned_limit=limit)
    kc._clear_managers()
    try:
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as info:
            kc.pinned_allocator(128 << 20)
        assert "limit set to: {:,} bytes".format(limit) in str(info.value), str(info.value)
    finally:
        kc._clear_managers()
        kc.configure()
        gc.collect()


def test_cupy_oom_error_without_a_hard_limit_reports_the_device_memory(monkeypatch):
    kc = cupy_on_host(monkeypatch, python_path=True)
    import cupy

    kc.configure(backend=BACKEND)
    kc._clear_managers()
    try:
        total = kc.manager(0).memory_info()[1]
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as info:
            kc.allocator(1 << 47)  # within libkmm's 2^48, beyond any host
        assert "limit set to: {:,} bytes".format(total) in str(info.value), str(info.value)
    finally:
        kc._clear_managers()
        kc.configure()
        gc.collect()


# -- smaller ones ---------------------------------------------------------------------------------

def test_stats_accepts_a_numpy_integer_kind(m):
    # stats(kind=np.int64(0)) raised ValueError, where every other integer argument takes NumPy
    # integers.
    keep = m.empty(4, "uint8", kind=np.int64(0))
    also = m.alloc(8, kind=np.int32(0))
    assert repr(m.memory_map(np.int64(0))) == repr(m.memory_map("device"))
    for kind in (np.int64(0), np.uint8(0), np.int32(0)):
        assert m.stats(kind) == m.stats(0) == m.stats("device")
    assert m.stats(np.int64(kmm.buffer.KINDS["pinned"])) == m.stats("pinned")
    for bad in (True, np.bool_(False), 0.0, "host", np.int64(99)):
        with pytest.raises(ValueError, match="kind"):
            m.stats(bad)
    keep.close()
    also.close()


@pytest.mark.parametrize("bad", [1, 1.0, "1.0", (1,), (1, 0, 0), {"major": 1}])
def test_dlpack_max_version_must_be_a_major_minor_tuple(m, bad):
    # __dlpack__(max_version=1) raised "'int' object is not iterable", naming nothing.
    a = m.empty(2, "float32")
    with pytest.raises(TypeError, match=r"max_version.*\(major, minor\)"):
        a.__dlpack__(max_version=bad)
    with pytest.raises(TypeError, match=r"max_version\[0\]"):
        a.__dlpack__(max_version=("1", 0))
    for good in (None, (1, 0), [1, 0], (np.int64(1), np.int64(2)), (0, 5)):
        kmm.DeviceArray.from_dlpack(_Producer(a, good), manager=m)


class _Producer:
    """An object whose __dlpack__ calls the array's with a fixed max_version."""

    def __init__(self, a, version):
        self.a, self.version = a, version

    def __dlpack__(self, stream=None, max_version=None):
        return self.a.__dlpack__(stream=stream, max_version=self.version)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_bool_of_a_0d_array_is_its_elements(m):
    # bool() of a 0-d DeviceArray raised "len() of a 0-d array"; NumPy gives its element's truth.
    for value, dtype in [(0, "int32"), (3, "int32"), (0.0, "float64"), (-0.5, "float64"), (True, "bool"), (False, "bool")]:
        a = m.asarray(np.array(value, dtype))
        assert bool(a) is bool(np.array(value, dtype)), (value, dtype)
    # Other arrays keep their length's truth.
    assert bool(m.empty(3, "int32")) and not bool(m.empty(0, "int32"))
