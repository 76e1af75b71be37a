"""DLPack capsules (producer and consumer) with ctypes: the legacy `dltensor` and the
versioned `dltensor_versioned` (DLPack 1.0) forms."""

import ctypes
import sys
import threading
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p

import numpy as np

from . import _args
from ._errors import NotCopyable
from ._lifetime import end_export

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 4, 5, 6
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2
VERSION = (1, 0)
#: The most dimensions an imported tensor may have (NumPy's limit; DLPack sets none).
MAX_NDIM = _args.MAX_NDIM


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", DELETER),
        ("flags", c_uint64),
        ("dl_tensor", DLTensor),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_GetName.restype = c_void_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]

# Capsule names must outlive the capsules: module-level bytes.
NAME_LEGACY = b"dltensor"
NAME_VERSIONED = b"dltensor_versioned"
NAME_USED_LEGACY = b"used_dltensor"
NAME_USED_VERSIONED = b"used_dltensor_versioned"

# A consumer (NumPy, PyTorch, JAX) may delete an exported tensor during the interpreter's last
# collection, after this module's globals are gone. So the table of exports and the two
# functions C calls (the tensor's deleter, the capsule's destructor) reach what they need
# through closures, never through globals, and those two are kept alive for good (one
# reference leaked on purpose): the structs, shapes and strides C points at outlive the module.


def _export_table():
    """The exports alive in C (struct address -> (struct, shape, strides, owner, release), where
    release ends the buffer's export count: a close() meanwhile frees the memory then), its lock,
    and the function that ends one export."""
    # Reentrant: a collection that starts in this thread while it holds the lock (any allocation
    # of a GC-tracked object may start one) can free an array a consumer imported, whose deleter
    # ends its export here, in the same thread.
    exports, lock, finalizing = {}, threading.RLock(), sys.is_finalizing

    def end(address):
        with lock:
            entry = exports.pop(address, None)
        if entry is not None:
            try:
                entry[-1]()
            except Exception:
                if not finalizing():
                    raise  # at exit the library may be gone: the process frees everything anyway

    return exports, lock, end


_exports, _exports_lock, _end_export = _export_table()


def _c_callbacks(end, error_occurred, is_valid, get_pointer, names):
    # A C consumer that refuses a tensor (NumPy: more than 64 dimensions, an unsupported type)
    # drops the capsule, or calls the deleter, with its own exception still set; Python code
    # and every ctypes call into Python's C API then fail at their first error check, so the
    # export never ended (neither the buffer nor its manager was ever freed). So each callback
    # first calls PyErr_Occurred through ctypes, which raises the pending exception (if any)
    # and so takes it; the callback then does its work and raises it again (Python reports it
    # as unraisable: the consumer's message is not lost).

    @DELETER
    def deleter(address):
        try:
            error_occurred()
            pending = None
        except BaseException as e:
            pending = e
        end(address)
        if pending is not None:
            raise pending

    # The destructor gets the dying capsule as a raw pointer: never turn it into a Python object.
    @ctypes.CFUNCTYPE(None, c_void_p)
    def capsule_destructor(capsule):
        try:
            error_occurred()
            pending = None
        except BaseException as e:
            pending = e
        # Runs when a capsule dies; a consumer that took the tensor renamed it to "used_*".
        for name in names:
            if is_valid(capsule, name):
                end(get_pointer(capsule, name))
                break
        if pending is not None:
            raise pending

    for f in (deleter, capsule_destructor):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(f))  # never freed: see above
    return deleter, capsule_destructor


_deleter, _capsule_destructor = _c_callbacks(
    _end_export,
    ctypes.PYFUNCTYPE(c_void_p)(("PyErr_Occurred", _api)),
    ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _api)),
    ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", _api)),
    (NAME_LEGACY, NAME_VERSIONED),
)
_DESTRUCTOR_ADDR = ctypes.cast(_capsule_destructor, c_void_p).value


def dtype_to_dl(dtype):
    dtype = np.dtype(dtype)
    kind = dtype.kind
    code = {"i": kDLInt, "u": kDLUInt, "f": kDLFloat, "c": kDLComplex, "b": kDLBool}.get(kind)
    if code is None or not dtype.isnative or _extended(kind, dtype.itemsize):
        raise BufferError("dtype %s has no DLPack equivalent" % dtype)
    return DLDataType(code, dtype.itemsize * 8, 1)


def _extended(kind, itemsize):
    """Whether floats (or complex numbers) of `itemsize` bytes are NumPy's longdouble: x87's
    80-bit format padded to 12 or 16 bytes on x86, double-double on POWER. DLPack's 128-bit
    float is IEEE binary128 (as NumPy and PyTorch read it): a consumer would read other numbers."""
    return (kind == "f" and itemsize > 8) or (kind == "c" and itemsize > 16)


def dl_to_dtype(dl):
    if dl.lanes != 1:
        raise BufferError("DLPack vector types (lanes = %d) are not supported" % dl.lanes)
    kind = {kDLInt: "i", kDLUInt: "u", kDLFloat: "f", kDLComplex: "c", kDLBool: "b"}.get(dl.code)
    if kind is None:
        raise BufferError("DLPack type code %d is not supported (bfloat16 and opaque types are not)" % dl.code)
    # Whole bytes only: bits // 8 would read a 12-bit type as 1-byte items, a 4-bit one as 0-byte.
    if dl.bits == 0 or dl.bits % 8 or (kind == "b" and dl.bits != 8):
        raise BufferError("DLPack type code %d with %d bits is not supported" % (dl.code, dl.bits))
    if kind == "b":
        return np.dtype(bool)
    if _extended(kind, dl.bits // 8):
        # np.dtype("f16") is longdouble, not IEEE binary128: the bits would read as other numbers.
        raise BufferError("DLPack type code %d with %d bits (IEEE binary128) has no NumPy dtype" % (dl.code, dl.bits))
    try:
        return np.dtype("%s%d" % (kind, dl.bits // 8))
    except TypeError:
        raise BufferError("DLPack type code %d with %d bits has no NumPy dtype" % (dl.code, dl.bits)) from None


def device_of(buffer):
    """(device_type, device_id) of a Buffer's memory."""
    m = buffer.manager
    if m.backend == "host":
        return (kDLCPU, 0)
    if buffer.kind == "pinned":
        return (kDLCUDAHost, 0)
    return (kDLCUDA, m.device)


def order_for_consumer(manager, device_type, stream):
    """Makes the consumer's `stream` (DLPack's convention) wait for the manager's work."""
    if device_type == kDLCPU:
        if stream is not None and stream != -1 and stream != manager.stream:
            if manager.backend == "host" and stream not in (1, 2):
                manager.signal_stream(stream)  # another Kmm host manager's stream
                return
            raise BufferError("stream = %r is not allowed for CPU memory (must be None)" % (stream,))
        if stream is None:
            manager.synchronize()  # a CPU consumer reads at once
        return
    if stream == -1:
        return
    if stream == 0:
        raise BufferError("stream = 0 is ambiguous and not allowed by DLPack; use 1 (legacy default) or 2 (per-thread)")
    if stream is None:
        stream = 1  # the legacy default stream
    if stream != manager.stream:
        manager.signal_stream(stream)


def consumer_stream(manager, device_type, stream):
    """The raw stream a DLPack consumer works on, when it is not the manager's own (None: none
    to record: CPU memory read at once, or -1, a consumer that asked for no ordering)."""
    if device_type == kDLCPU or stream == -1:
        return None
    if stream is None:
        stream = 1  # the legacy default stream
    return None if stream == manager.stream else stream


def _max_version(value):
    """`__dlpack__`'s max_version: None or a (major, minor) tuple of integers."""
    if value is None:
        return None
    try:
        major, minor = value
    except (TypeError, ValueError):
        raise TypeError("max_version = %r must be None or a (major, minor) tuple of integers, e.g. (1, 0)"
                        % (value,)) from None
    return (_args.integer(major, "max_version[0]", 0, _args.U32_MAX),
            _args.integer(minor, "max_version[1]", 0, _args.U32_MAX))


def _stream(value):
    """`__dlpack__`'s stream: None or an integer (-1: no ordering), not a bool or float (-1.0
    and True passed for -1 and the legacy stream 1)."""
    return None if value is None else _args.integer(value, "stream", -1, _args.U64_MAX)


def _dl_device(value):
    """`__dlpack__`'s dl_device: None or a (device_type, device_id) pair of integers (not
    (1.0, 0) or (True, False), which compared equal to (kDLCPU, 0))."""
    if value is None:
        return None
    pair = _args.shape_like(value, "dl_device")
    if len(pair) != 2:
        raise TypeError("dl_device = %r must be None or a (device_type, device_id) pair of integers" % (value,))
    return (_args.integer(pair[0], "dl_device[0]", _args.I32_MIN, _args.I32_MAX),
            _args.integer(pair[1], "dl_device[1]", _args.I32_MIN, _args.I32_MAX))


def export(array, stream=None, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule for a DeviceArray (the DeviceArray stays alive until the consumer deletes it)."""
    max_version = _max_version(max_version)
    stream, dl_device = _stream(stream), _dl_device(dl_device)
    if copy is not None:
        copy = _args.flag(copy, "copy")
    buffer = array.buffer
    dev_type, dev_id = device_of(buffer)
    if dl_device is not None and dl_device != (dev_type, dev_id):
        raise BufferError("cannot export to device %r: the memory is on %r" % (dl_device, (dev_type, dev_id)))
    if copy:
        raise BufferError("kmm exports without copying only (copy=True is not supported)")
    buffer._live()
    # Every refusal before the streams are touched: a refused export changes nothing.
    ndim = len(array.shape)
    itemsize = array.dtype.itemsize
    shape = (c_int64 * max(ndim, 1))(*array.shape)
    for s in array.strides:
        if s % itemsize:
            raise BufferError("stride %d is not a multiple of the item size %d" % (s, itemsize))
    strides = (c_int64 * max(ndim, 1))(*[s // itemsize for s in array.strides])
    dl_dtype = dtype_to_dl(array.dtype)
    consumer = consumer_stream(buffer.manager, dev_type, stream)
    order_for_consumer(buffer.manager, dev_type, stream)
    if consumer is not None:
        # The consumer's kernels may still read the memory after the array is freed here.
        buffer.record_stream(consumer)
    versioned = max_version is not None and max_version >= VERSION
    t = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    dl = t.dl_tensor
    dl.data = buffer._ptr or None
    dl.device = DLDevice(dev_type, dev_id)
    dl.ndim = ndim
    dl.dtype = dl_dtype
    dl.shape = ctypes.cast(shape, POINTER(c_int64))
    dl.strides = ctypes.cast(strides, POINTER(c_int64))
    dl.byte_offset = array.offset
    t.deleter = _deleter
    if versioned:
        t.version = DLPackVersion(*VERSION)
        t.flags = 0
    address = ctypes.addressof(t)
    entry = (t, shape, strides, array, buffer._export())
    with _exports_lock:  # nothing allocated here: see _export_table
        _exports[address] = entry
    return _api.PyCapsule_New(address, NAME_VERSIONED if versioned else NAME_LEGACY, _DESTRUCTOR_ADDR)


class _Imported(NotCopyable):
    """Owns a consumed DLPack tensor (held by the kmm buffer over it, as its `_owner`): calls
    its deleter when it dies (`kmm._lifetime.end_export`: in a collection, at its end, unless a
    finalizer kept the kmm array over the producer's memory)."""

    def __init__(self, address, deleter, producer):
        self.address = address
        self.producer = producer  # the object __dlpack__ was called on
        self.deleter = deleter

    @classmethod
    def of(cls, address, deleter_offset, producer):
        fn = ctypes.cast(address + deleter_offset, POINTER(c_void_p)).contents.value
        return cls(address, DELETER(fn) if fn else None, producer)

    def __del__(self):
        end_export(self)

    def end(self):
        if self.deleter is not None:
            d, self.deleter = self.deleter, None
            _call_deleter(d, self.address)

    # Rearmed when a finalizer kept the kmm buffer over the tensor past a collection: it gets a
    # fresh owner, which calls the deleter.
    def holding(self, referrer):
        from .buffer import _Imported as ImportedBuffer

        if isinstance(referrer, ImportedBuffer) and referrer._owner is self:
            return lambda fresh: setattr(referrer, "_owner", fresh)
        return None

    def fresh(self):
        fresh = _Imported(self.address, self.deleter, self.producer)
        self.deleter = None
        return fresh


def _call_deleter(deleter, address):
    try:
        deleter(address)
    except Exception:
        pass


def consume(capsule, producer):
    """(DLTensor, owner, readonly) from a capsule; the capsule is marked used."""
    if _api.PyCapsule_IsValid(capsule, NAME_VERSIONED):
        address = _api.PyCapsule_GetPointer(capsule, NAME_VERSIONED)
        t = DLManagedTensorVersioned.from_address(address)
        if t.version.major > VERSION[0]:
            raise BufferError("DLPack version %d.%d is newer than kmm understands" % (t.version.major, t.version.minor))
        _api.PyCapsule_SetName(capsule, NAME_USED_VERSIONED)
        owner = _Imported.of(address, DLManagedTensorVersioned.deleter.offset, producer)
        return t.dl_tensor, owner, bool(t.flags & FLAG_READ_ONLY)
    if _api.PyCapsule_IsValid(capsule, NAME_LEGACY):
        address = _api.PyCapsule_GetPointer(capsule, NAME_LEGACY)
        t = DLManagedTensor.from_address(address)
        _api.PyCapsule_SetName(capsule, NAME_USED_LEGACY)
        owner = _Imported.of(address, DLManagedTensor.deleter.offset, producer)
        return t.dl_tensor, owner, False
    raise BufferError("not a live DLPack capsule (already consumed?)")
