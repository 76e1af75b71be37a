"""Defects a hostile caller found through the public Python API (one test per class of defect):
each test fails without its fix. Host backend: no GPU needed."""

import ctypes
import gc
import threading

import numpy as np
import pytest

import kmm
from conftest import expect_named
from kmm import buffer as kbuffer
from kmm import dlpack


@pytest.fixture
def m():
    with kmm.Manager(backend="host") as mgr:
        yield mgr


# -- host objects of Python objects ------------------------------------------------------------

def test_copies_refuse_object_host_arrays(m):
    # copy_to_host into an object array wrote device bytes over its PyObject pointers (a crash
    # at the next reference count); copy_from_host out of one copied the pointers' values.
    b = m.alloc(24).fill(b"\0")  # zeros: without the check the pointers become NULL, not garbage
    dst = np.array([None, None, None], dtype=object)
    expect_named(TypeError, "dst", b.copy_to_host, dst)
    assert list(dst) == [None, None, None]
    b.fill(b"\x5a")
    expect_named(TypeError, "src", b.copy_from_host, np.array([object()] * 3, dtype=object))
    assert bytes(b.copy_to_host()) == b"\x5a" * 24


# -- read-only memory ---------------------------------------------------------------------------

def test_read_only_imports_are_refused(m):
    # A read-only producer (here NumPy over an immutable bytes object) became a writable kmm
    # array: fill, set and host_view wrote into the bytes object.
    data = b"immutable bytes!"
    ro = np.frombuffer(data, np.uint8)
    with pytest.raises(BufferError, match="read-only"):
        kmm.from_dlpack(ro, manager=m)
    cai = {"shape": (len(data),), "typestr": "|u1", "data": (ro.ctypes.data, True), "version": 3}
    with pytest.raises(BufferError, match="read-only"):
        kmm.from_cuda_array_interface(cai, manager=m)
    assert data == b"immutable bytes!"
    assert m.stats("device")["live_buffers"] == 0
    # Writable memory still imports.
    w = np.arange(4, dtype=np.int32)
    assert kmm.from_dlpack(w, manager=m).get().tolist() == [0, 1, 2, 3]


# -- geometry the bounds checks trust ----------------------------------------------------------

def test_buffer_and_array_geometry_is_read_only(m):
    # `buf.nbytes = 1 << 40` then `host_view()` made a memoryview of 1 TiB over a 16-byte
    # buffer (a segfault on write); `a.shape = ...` (NumPy's reshape idiom) or `a.buffer = small`
    # exported arrays reaching past the memory to DLPack and CAI consumers.
    b = m.alloc(16)
    with pytest.raises(AttributeError):
        b.nbytes = 1 << 40
    assert b.nbytes == 16 and len(b.host_view()) == 16
    a = m.asarray(np.arange(4, dtype=np.uint8))
    for name, value in (("shape", (1 << 30,)), ("strides", (1 << 20,)), ("offset", 1 << 20),
                        ("dtype", np.dtype("f8")), ("buffer", m.alloc(1))):
        with pytest.raises(AttributeError):
            setattr(a, name, value)
    assert (a.shape, a.strides, a.offset, a.dtype) == ((4,), (1,), 0, np.uint8)
    assert np.from_dlpack(a).tolist() == [0, 1, 2, 3]


def test_array_views_are_bounded_like_allocations(m):
    b = m.alloc(8)
    # A dimension past int64 wrapped negative in the DLPack export (NumPy then failed with
    # "SystemError: ... returned NULL without setting an exception").
    expect_named(kmm.InvalidArgumentError, "shape[0]", kmm.DeviceArray, b, (1 << 63,), "u1", strides=(0,))
    # Shapes are at most 2^48 bytes, views (stride 0) included, as the docs say.
    e = expect_named(kmm.SizeOverflowError, "shape", kmm.DeviceArray, b, (1 << 49,), "u1", strides=(0,))
    assert "2^48" in str(e)
    expect_named(kmm.InvalidArgumentError, "shape[1]", kmm.empty, (0, 1 << 63), "u1", manager=m)
    # A DeviceArray is not a buffer (its methods differ: the view failed later, half made).
    a = m.asarray(np.arange(4, dtype=np.uint8))
    expect_named(TypeError, "buffer", kmm.DeviceArray, a, (4,), "u1")
    assert kmm.DeviceArray(b, (1 << 40,), "u1", strides=(0,)).shape == (1 << 40,)  # within the bound


def test_shapes_refuse_bytes_and_unordered_collections(m):
    # b"\x02\x03" was read as the shape (2, 3), a set as its (arbitrary) iteration order.
    for shape in (b"\x02\x03", bytearray(b"\x02"), {2, 3}, {2: 0}, "23"):
        expect_named(TypeError, "shape", m.empty, shape, "u1")
    b = m.alloc(16)
    expect_named(TypeError, "strides", kmm.DeviceArray, b, (2,), "u1", strides=b"\x01")
    assert m.empty([2, 3], "u1").shape == (2, 3) and m.empty(range(1, 3), "u1").shape == (1, 2)


# -- integers and flags -------------------------------------------------------------------------

def test_status_name_and_can_access_peer_take_exact_integers():
    # status_name(2**32 + 2001) wrapped to 2001; can_access_peer(2**32, 1) asked about device 0;
    # floats were truncated by int().
    expect_named(kmm.InvalidArgumentError, "status", kmm.status_name, (1 << 32) + 2001)
    expect_named(TypeError, "status", kmm.status_name, 2001.7)
    assert kmm.status_name(2001) == "KMM_ERROR_INVALID_HANDLE"
    expect_named(kmm.InvalidArgumentError, "device", kmm.can_access_peer, 1 << 32, 0, backend="host")
    expect_named(TypeError, "peer", kmm.can_access_peer, 0, 0.9, backend="host")
    expect_named(TypeError, "device", kmm.can_access_peer, True, 0, backend="host")
    assert kmm.can_access_peer(0, 0, backend="host") in (True, False)


def test_flags_are_bools(m, tmp_path):
    # never_spill("no") kept the buffer on the device (a non-empty string is true); a file
    # trace took capacity=0.0 and rmm_only="no" by their truth values.
    b = m.alloc(64)
    expect_named(TypeError, "never", b.never_spill, "no")
    assert b.info()["never_spill"] is False
    assert b.never_spill(np.bool_(True)).info()["never_spill"] is True
    path = str(tmp_path / "t.csv")
    expect_named(TypeError, "rmm_only", m.trace_start, path=path, rmm_only="no")
    expect_named(TypeError, "capacity", m.trace_start, capacity=0.0, path=path)
    expect_named(TypeError, "rmm_only", m.save_trace, path, rmm_only=1)
    m.trace_start(capacity=16)
    m.alloc(8).close()
    assert len(m.trace()) >= 1


def test_cai_import_stream_is_an_integer(m):
    # On the host backend, "stream": True or 1.0 passed for the legacy default stream 1.
    b = m.alloc(8)
    for stream in (True, 1.0, 2.0):
        cai = dict(b.__cuda_array_interface__, stream=stream)
        expect_named(TypeError, "stream", kmm.from_cuda_array_interface, cai, manager=m)
    assert kmm.from_cuda_array_interface(dict(b.__cuda_array_interface__, stream=1), manager=m).shape == (8,)


# -- dtypes -------------------------------------------------------------------------------------

def test_set_refuses_casts_that_change_values(m):
    # set() cast with NumPy's unsafe rules: 1.7 was stored as 1 and 2**40 as -2147483648.
    a = m.asarray(np.array([5, 6], np.int32))
    expect_named(TypeError, "host", a.set, np.array([1.7, 2.0 ** 40]))
    expect_named(TypeError, "host", a.set, np.array([1, 2 ** 40], np.int64))
    u = m.asarray(np.array([5, 6], np.uint8))
    expect_named(TypeError, "host", u.set, [-1, 2])
    assert a.get().tolist() == [5, 6] and u.get().tolist() == [5, 6]
    a.set(np.array([7, 8], np.int16))  # a safe cast
    assert a.get().tolist() == [7, 8]
    a.set([9, 10])  # Python ints (int64) that fit
    u.set([255, 0])
    assert a.get().tolist() == [9, 10] and u.get().tolist() == [255, 0]
    f = m.asarray(np.array([0, 0], np.float32))
    f.set([0.5, 1e-3])  # Python floats (float64) rounded to float32, as NumPy assigns them
    assert f.get().tolist() == np.array([0.5, 1e-3], np.float32).tolist()


def _legacy_capsule_with_bits(a, bits):
    capsule = a.__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    address = get_pointer(capsule, dlpack.NAME_LEGACY)
    dlpack.DLManagedTensor.from_address(address).dl_tensor.dtype.bits = bits
    return capsule


def test_dlpack_import_refuses_partial_byte_types(m):
    # A 12-bit type was read as 1-byte items (bits // 8), a 4-bit one failed as "u0".
    a = m.asarray(np.arange(8, dtype=np.uint16))
    for bits in (12, 4):
        with pytest.raises(BufferError, match="%d bits" % bits):
            kmm.from_dlpack(_legacy_capsule_with_bits(a, bits), manager=m)
    assert kmm.from_dlpack(_legacy_capsule_with_bits(a, 16), manager=m).get().tolist() == list(range(8))


# -- a close() racing an export -----------------------------------------------------------------

class _CloseFirst:
    """Stands in for buffer._export_lock: runs `before` when an export is about to take the lock,
    i.e. a close() in another thread wins the race after the export's liveness check."""

    def __init__(self, lock, before):
        self._lock, self._before = lock, before

    def __enter__(self):
        before, self._before = self._before, None
        if before is not None:
            t = threading.Thread(target=before)
            t.start()
            t.join()
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


def test_export_checks_liveness_under_the_close_lock(m, monkeypatch):
    # host_view() checked that the buffer was open, then counted the export under the lock:
    # a close() in between freed the memory and the view showed freed memory.
    b = m.alloc(4096)
    monkeypatch.setattr(kbuffer, "_export_lock", _CloseFirst(kbuffer._export_lock, b.close))
    with pytest.raises(kmm.InvalidHandleError):
        b.host_view()
    assert m.stats("device")["live_buffers"] == 0
    assert b._exports == 0 and m._exports == 0


# -- plugins' options and sizes -------------------------------------------------------------------

def test_plugin_configure_refuses_bad_options():
    # configure() stored anything; the error came at the next allocation (CuPy's, Numba's).
    modules = []
    for name in ("kmm.cupy", "kmm.numba"):
        try:
            modules.append(__import__(name, fromlist=["configure"]))
        except Exception:  # not installed, or no CUDA runtime library
            pass
    if not modules:
        pytest.skip("neither kmm.cupy nor kmm.numba imports here")
    for mod in modules:
        mod.configure(hard_limit=1 << 20)
        expect_named(TypeError, "no_such_option", mod.configure, no_such_option=1)
        expect_named(TypeError, "hard_limit", mod.configure, hard_limit=1.5)
        assert mod._config == {"hard_limit": 1 << 20}  # unchanged
        mod.configure()


def test_numba_memalloc_refuses_bools():
    try:
        import kmm.numba as kn
    except Exception as e:
        pytest.skip("kmm.numba unavailable: %s" % type(e).__name__)
    kn.configure(backend="host")
    p = kn.KmmNumbaMemoryManager(context=None)
    try:
        p.initialize()
        expect_named(TypeError, "size", p.memalloc, True)  # allocated 1 byte
        expect_named(TypeError, "size", p.memalloc, 4.0)
        assert p.manager.stats("device")["live_buffers"] == 0
    finally:
        p.reset()
        kn.configure()


def test_closing_a_borrowed_manager_leaks_nothing():
    # kmm.torch.manager(0).close() marked libkmm's manager closed for Python only: every buffer
    # allocated through that object then skipped its free (the manager's handle read 0) and stayed
    # allocated in libkmm's manager for good, one more per call.
    import kmm.torch as kt

    live = {k: v["live_buffers"] for k, v in kt.manager(0).stats().items()}
    for _ in range(3):
        m = kt.manager(0)
        b, v = m.alloc(4096), m.alloc(64, "pinned").host_view()
        m.close()  # documented to do nothing
        assert not m.closed and b.ptr
        del b, v
        m.synchronize()  # pinned frees wait for the stream
        assert {k: v["live_buffers"] for k, v in kt.manager(0).stats().items()} == live


# -- hostile DLPack producers and imports past the address space ----------------------------------

class _Producer:
    """A DLPack producer of its own making over 64 bytes: each capsule's struct, shape and strides
    say what the test wants; `deleted` counts the deleter's calls."""

    def __init__(self):
        self.memory = np.zeros(64, np.uint8)
        self.deleted = 0
        self._keep = []

        @dlpack.DELETER
        def deleter(address):
            self.deleted += 1

        self._deleter = deleter

    def capsule(self, shape=(4,), ndim=None, strides=None, byte_offset=0, bits=8, code=dlpack.kDLUInt):
        t = dlpack.DLManagedTensor()
        dims = (ctypes.c_int64 * max(len(shape or ()), 1))(*(shape or ()))
        self._keep += [t, dims]
        dl = t.dl_tensor
        dl.data = self.memory.ctypes.data
        dl.device = dlpack.DLDevice(dlpack.kDLCPU, 0)
        dl.ndim = len(shape or ()) if ndim is None else ndim
        dl.dtype = dlpack.DLDataType(code, bits, 1)
        dl.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if shape is not None else None
        if strides is not None:
            steps = (ctypes.c_int64 * len(strides))(*strides)
            self._keep.append(steps)
            dl.strides = ctypes.cast(steps, ctypes.POINTER(ctypes.c_int64))
        dl.byte_offset = byte_offset
        t.deleter = self._deleter
        return dlpack._api.PyCapsule_New(ctypes.addressof(t), dlpack.NAME_LEGACY, None)


def test_dlpack_import_checks_the_producers_struct(m):
    # from_dlpack trusted the producer's ndim, shape and strides: ndim = -1 imported a 0-d array
    # (range(-1) is empty), a huge ndim read past the shape array until a segfault, and a
    # negative dimension reached libkmm as a 2^64 - 5 byte buffer.
    p = _Producer()
    for capsule, name in ((p.capsule(ndim=-1), "ndim"), (p.capsule(ndim=1 << 20), "ndim"),
                          (p.capsule(shape=None, ndim=1), "shape"), (p.capsule(shape=(-5,)), "shape[0]"),
                          (p.capsule(shape=(2,), strides=(1 << 62,), bits=32, code=dlpack.kDLInt), "strides[0]")):
        expect_named((BufferError, ValueError), name, kmm.from_dlpack, capsule, manager=m)
    gc.collect()
    assert p.deleted == 5  # every refused tensor still given back once
    assert m.stats("device")["live_buffers"] == 0
    assert kmm.from_dlpack(p.capsule(shape=(2, 3)), manager=m).shape == (2, 3)


def test_imports_refuse_memory_past_the_address_space(m):
    # ctypes passes ints to uint64_t modulo 2^64: a DLPack byte_offset of 2^64 - 1 made the
    # buffer start one byte before the producer's memory (get() read it), and a CAI view of 5
    # bytes 2^62 apart became a 1-byte libkmm buffer while Python checked against 2^64 + 1.
    p = _Producer()
    expect_named(BufferError, "byte_offset", kmm.from_dlpack, p.capsule(byte_offset=(1 << 64) - 1), manager=m)
    gc.collect()
    assert p.deleted == 1
    base = p.memory.ctypes.data
    for cai in ({"shape": (5,), "typestr": "|u1", "data": (base, False), "strides": (1 << 62,), "version": 3},
                {"shape": (2,), "typestr": "<i8", "data": (8, False), "strides": (-16,), "version": 3}):
        expect_named(BufferError, "data[0]", kmm.from_cuda_array_interface, cai, manager=m)
    assert m.stats("device")["live_buffers"] == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # NumPy's reason, shown
def test_a_refused_dlpack_export_is_still_freed(m):
    # NumPy refuses a tensor of more than 64 dimensions and drops the capsule with its exception
    # set: the capsule's destructor then failed at its first ctypes call, the export never ended,
    # and the buffer (and, once closed, the manager) stayed allocated for good.
    a = m.empty((1,) * 4, "uint8")

    class Producer:  # kmm's export, told to have 65 dimensions (kmm makes no such array)
        def __dlpack__(self, **kwargs):
            capsule = a.__dlpack__()
            address = ctypes.pythonapi.PyCapsule_GetPointer(capsule, dlpack.NAME_LEGACY)
            dlpack.DLManagedTensor.from_address(address).dl_tensor.ndim = 65
            return capsule  # NumPy holds the only reference

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    with pytest.raises(Exception):  # SystemError: the destructor took NumPy's exception (reported)
        np.from_dlpack(Producer())
    gc.collect()
    gc.collect()
    assert a.buffer._exports == 0
    a.close()
    assert m.stats("device")["live_buffers"] == 0


def test_longdouble_has_no_dlpack_equivalent(m):
    # float128 (x87's 80-bit longdouble, padded) was exported as DLPack's 128-bit float, IEEE
    # binary128, and a 128-bit DLPack float imported as longdouble: other numbers either way.
    for dtype, double in ((np.longdouble, np.float64), (np.clongdouble, np.complex128)):
        if np.dtype(dtype).itemsize == np.dtype(double).itemsize:
            continue  # longdouble is double here (MSVC)
        a = m.asarray(np.ones(2, dtype))
        with pytest.raises(BufferError, match="no DLPack equivalent"):
            a.__dlpack__()
        assert a.get().tolist() == [1, 1]  # still a kmm array
    p = _Producer()
    with pytest.raises(BufferError, match="128 bits"):
        kmm.from_dlpack(p.capsule(bits=128, code=dlpack.kDLFloat), manager=m)
    assert kmm.from_dlpack(p.capsule(bits=16, code=dlpack.kDLFloat), manager=m).dtype == np.float16


# -- third round ----------------------------------------------------------------------------------

def test_copy_to_host_copies_nbytes_into_dst(m):
    # nbytes was ignored when dst was given: the whole of dst was copied.
    b = m.alloc(64)
    b.copy_from_host(bytes(range(64)))
    dst = bytearray(b"\xff" * 16)
    b.copy_to_host(dst, offset=8, nbytes=4)
    assert dst == bytes(range(8, 12)) + b"\xff" * 12
    expect_named(ValueError, "nbytes", b.copy_to_host, bytearray(8), nbytes=9)
    expect_named((TypeError, kmm.KmmError), "nbytes", b.copy_to_host, bytearray(8), nbytes=-1)


def test_shapes_have_at_most_64_dimensions(m):
    # NumPy takes no more: get() and exports to it failed deep inside NumPy.
    expect_named(ValueError, "64", m.empty, (1,) * 65, "uint8")
    a = m.empty((1,) * 64, "uint8")
    assert a.get().shape == (1,) * 64


def test_dlpack_cpu_tensors_are_on_device_0(m):
    a = m.asarray(np.arange(4, dtype=np.uint8))
    capsule = a.__dlpack__()
    address = ctypes.pythonapi.PyCapsule_GetPointer(capsule, dlpack.NAME_LEGACY)
    dlpack.DLManagedTensor.from_address(address).dl_tensor.device.device_id = 1
    with pytest.raises(BufferError, match="device_id"):
        kmm.from_dlpack(capsule, manager=m)
