"""DeviceArray, __cuda_array_interface__ and DLPack on the host backend: dictionaries,
capsules (shapes, strides, dtypes, devices, stream values) and zero-copy imports."""

import ctypes
import gc
import sys

import numpy as np
import pytest

import kmm
from kmm import dlpack


def test_empty_zeros_from_host(manager):
    a = kmm.DeviceArray.empty((3, 4), "float32", manager=manager)
    assert a.shape == (3, 4) and a.dtype == np.float32 and a.strides == (16, 4)
    assert a.size == 12 and a.nbytes == 48 and a.ndim == 2 and len(a) == 3
    z = kmm.zeros((5,), "int16", manager=manager)
    np.testing.assert_array_equal(z.get(), np.zeros(5, np.int16))
    h = np.arange(24, dtype=np.complex64).reshape(2, 3, 4)
    d = manager.asarray(h)
    np.testing.assert_array_equal(d.get(), h)
    d.set(h * 2)
    np.testing.assert_array_equal(d.get(), h * 2)
    assert d.reshape(6, 4).get().shape == (6, 4)
    assert d.view(np.float64).dtype == np.float64


def test_bounds_are_checked(manager):
    b = manager.alloc(64)
    with pytest.raises(ValueError, match="reaches"):
        kmm.DeviceArray(b, (17,), np.float32)
    with pytest.raises(ValueError, match="reaches"):
        kmm.DeviceArray(b, (4,), np.float32, strides=(-4,))


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "float32", "float64", "complex128", "bool"])
def test_cuda_array_interface(manager, dtype):
    a = manager.asarray(np.ones((2, 5), dtype))
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (2, 5)
    assert cai["typestr"] == np.dtype(dtype).str
    assert cai["data"] == (a.buffer.ptr, False)
    assert cai["strides"] is None  # C-contiguous
    assert cai["stream"] == manager.stream


def test_cai_strided_view(manager):
    b = manager.alloc(4 * 6 * 8)
    a = kmm.DeviceArray(b, (6, 4), np.float64, strides=(8, 48))  # Fortran order
    cai = a.__cuda_array_interface__
    assert cai["strides"] == (8, 48)
    assert not a.is_c_contiguous
    h = np.asfortranarray(np.arange(24.0).reshape(6, 4))
    b.copy_from_host(h.T.copy())
    np.testing.assert_array_equal(a.get(), h)


def test_buffer_exports_bytes(manager):
    b = manager.alloc(100)
    cai = b.__cuda_array_interface__
    assert cai["shape"] == (100,) and cai["typestr"] == "|u1" and cai["data"][0] == b.ptr
    assert b.__dlpack_device__() == (dlpack.kDLCPU, 0)


def test_from_cuda_array_interface_is_zero_copy(manager):
    a = manager.asarray(np.arange(10, dtype=np.int32))

    class Producer:
        __cuda_array_interface__ = a.__cuda_array_interface__

    p = Producer()
    v = kmm.DeviceArray.from_cuda_array_interface(p, manager=manager)
    assert v.ptr == a.ptr and v.shape == (10,) and v.dtype == np.int32
    assert v.buffer._owner is p  # keeps the producer alive
    a.set(np.full(10, 7, np.int32))
    np.testing.assert_array_equal(v.get(), np.full(10, 7))
    # a strided, offset CAI: every other element from the third
    cai = dict(a.__cuda_array_interface__, shape=(4,), strides=(8,), data=(a.ptr + 8, False))
    w = kmm.DeviceArray.from_cuda_array_interface(cai, manager=manager)
    a.set(np.arange(10, dtype=np.int32))
    np.testing.assert_array_equal(w.get(), [2, 4, 6, 8])
    # negative strides
    cai = dict(a.__cuda_array_interface__, shape=(10,), strides=(-4,), data=(a.ptr + 36, False))
    r = kmm.DeviceArray.from_cuda_array_interface(cai, manager=manager)
    np.testing.assert_array_equal(r.get(), np.arange(10)[::-1])
    with pytest.raises(ValueError, match="mask"):
        kmm.DeviceArray.from_cuda_array_interface(dict(cai, mask=object()), manager=manager)


def test_cai_import_waits_for_producer_stream(manager):
    with kmm.Manager(backend=manager.backend) as other:
        a = other.asarray(np.arange(4.0))
        v = kmm.DeviceArray.from_cuda_array_interface(a, manager=manager)
        np.testing.assert_array_equal(v.get(), np.arange(4.0))


def _tensor(capsule, name):
    ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
    ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = ctypes.pythonapi.PyCapsule_GetPointer(capsule, name)
    if name == b"dltensor":
        return dlpack.DLManagedTensor.from_address(address), address
    return dlpack.DLManagedTensorVersioned.from_address(address), address


def test_dlpack_legacy_capsule(manager):
    a = manager.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    cap = a.__dlpack__()
    assert type(cap).__name__ == "PyCapsule"
    t, _ = _tensor(cap, b"dltensor")
    dl = t.dl_tensor
    assert dl.data == a.buffer.ptr and dl.byte_offset == 0
    assert (dl.device.device_type, dl.device.device_id) == (dlpack.kDLCPU, 0)  # host backend
    assert dl.ndim == 2
    assert [dl.shape[i] for i in range(2)] == [3, 4]
    assert [dl.strides[i] for i in range(2)] == [4, 1]  # in elements
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (dlpack.kDLFloat, 32, 1)
    n = len(dlpack._exports)
    del cap
    gc.collect()
    assert len(dlpack._exports) == n - 1  # an unconsumed capsule frees its tensor


def test_dlpack_versioned_capsule(manager):
    a = manager.asarray(np.arange(6, dtype=np.int64))
    cap = a.__dlpack__(max_version=(1, 0))
    t, _ = _tensor(cap, b"dltensor_versioned")
    assert (t.version.major, t.version.minor) == (1, 0)
    assert t.flags == 0
    assert (t.dl_tensor.dtype.code, t.dl_tensor.dtype.bits) == (dlpack.kDLInt, 64)
    assert t.dl_tensor.shape[0] == 6
    cap2 = a.__dlpack__(max_version=(0, 8))
    _tensor(cap2, b"dltensor")


def test_dlpack_offset_and_strides(manager):
    b = manager.alloc(80)
    a = kmm.DeviceArray(b, (3,), np.float64, strides=(16,), offset=8)
    t, _ = _tensor(a.__dlpack__(), b"dltensor")
    assert t.dl_tensor.byte_offset == 8 and t.dl_tensor.strides[0] == 2


def test_numpy_from_dlpack_sees_same_memory(manager):
    a = manager.asarray(np.arange(8, dtype=np.float32))
    x = np.from_dlpack(a)
    assert x.ctypes.data == a.ptr
    a.set(np.full(8, 3, np.float32))
    np.testing.assert_array_equal(x, np.full(8, 3))
    x[0] = 42  # the consumer writes, Kmm reads
    assert a.get()[0] == 42
    del a
    gc.collect()
    np.testing.assert_array_equal(x[1:], np.full(7, 3))  # the export keeps the buffer alive


def test_dlpack_stream_argument(manager):
    a = manager.asarray(np.arange(4, dtype=np.float32))
    a.__dlpack__(stream=None)
    a.__dlpack__(stream=-1)
    a.__dlpack__(stream=manager.stream)
    with kmm.Manager(backend=manager.backend) as other:
        a.__dlpack__(stream=other.stream)  # the consumer's stream waits for the manager's
    with pytest.raises(BufferError, match="device"):
        a.__dlpack__(dl_device=(dlpack.kDLCUDA, 0))
    with pytest.raises(BufferError, match="copy"):
        a.__dlpack__(copy=True)


def test_dlpack_stream_rules_for_cuda(manager, monkeypatch):
    """The CUDA stream convention, checked with the ordering calls recorded."""
    calls = []
    monkeypatch.setattr(kmm.Manager, "signal_stream", lambda self, s: calls.append(s))
    a = manager.asarray(np.arange(4, dtype=np.float32))
    dlpack.order_for_consumer(manager, dlpack.kDLCUDA, None)
    dlpack.order_for_consumer(manager, dlpack.kDLCUDA, 1)
    dlpack.order_for_consumer(manager, dlpack.kDLCUDA, 2)
    dlpack.order_for_consumer(manager, dlpack.kDLCUDA, -1)
    dlpack.order_for_consumer(manager, dlpack.kDLCUDA, manager.stream)
    dlpack.order_for_consumer(manager, dlpack.kDLCUDA, 0xABC0)
    assert calls == [1, 1, 2, 0xABC0]
    with pytest.raises(BufferError, match="ambiguous"):
        dlpack.order_for_consumer(manager, dlpack.kDLCUDA, 0)
    del a


def test_from_dlpack_numpy_zero_copy(manager):
    h = np.arange(20, dtype=np.float64).reshape(4, 5)
    v = kmm.DeviceArray.from_dlpack(h, manager=manager)
    assert v.ptr == h.ctypes.data and v.shape == (4, 5) and v.strides == h.strides
    h[0, 0] = -1
    assert v.get()[0, 0] == -1
    t = h.T  # strided
    w = kmm.from_dlpack(t, manager=manager)
    np.testing.assert_array_equal(w.get(), t)
    rc = sys.getrefcount(h)
    del v, w
    gc.collect()
    assert sys.getrefcount(h) <= rc


def test_kmm_to_kmm_dlpack(manager):
    a = manager.asarray(np.arange(5, dtype=np.uint8))
    b = kmm.DeviceArray.from_dlpack(a, manager=manager)
    assert b.ptr == a.ptr
    np.testing.assert_array_equal(b.get(), np.arange(5))


def test_dtype_mapping():
    for dt in ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "?"]:
        assert dlpack.dl_to_dtype(dlpack.dtype_to_dl(dt)) == np.dtype(dt)
    with pytest.raises(BufferError):
        dlpack.dtype_to_dl(">f4")
