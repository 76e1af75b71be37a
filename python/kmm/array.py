"""`kmm.DeviceArray`: a typed, strided view (shape, dtype, strides in bytes, byte offset) of a
Kmm `Buffer`, exchanged without copies through `__cuda_array_interface__` (v3) and DLPack."""

import math
import threading
import warnings
import weakref

import numpy as np

from . import _args, _lib, dlpack
from .buffer import Buffer, _ExportToken, _Imported
from .manager import chosen, kind_code


def c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def extent(shape, strides, itemsize):
    """(lowest, highest+1) byte offsets an array touches, relative to its first element."""
    if any(n == 0 for n in shape):
        return 0, 0
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + itemsize
    return lo, hi


def _foreign_stream_wait(manager, stream):
    """The manager's stream waits for a producer's stream (CAI / DLPack conventions)."""
    if stream is None:
        return
    stream = _args.stream(stream, "stream")  # True or 1.0 would pass for the legacy stream 1 below
    if stream == manager.stream:
        return
    if manager.backend == "host" and stream in (1, 2):
        return  # no legacy or per-thread default stream exists on the host backend
    manager.wait_stream(stream)


#: The families of values by dtype kinds, as (the values, the arrays that store them): a value
#: goes into an array of its own family only (NumPy calls 1.5 into a str array "safe", and any
#: number into raw bytes, which stores its bits).
_FAMILIES = {"biufc": ("numbers", "bool, integer, float or complex"), "SU": ("text", "str or bytes"),
             "m": ("durations", "timedelta64"), "M": ("dates", "datetime64"),
             "V": ("records and raw bytes", "record or void")}


def _family(kind):
    """(the values, the arrays that store them) of a dtype kind; Python objects go into none."""
    return next((family for kinds, family in _FAMILIES.items() if kind in kinds), ("Python objects", "no Kmm"))


def _stores_as_given(host, dtype):
    """Whether `host`'s values are stored as `dtype` without another value in their place."""
    if _family(host.dtype.kind) != _family(dtype.kind):
        # Numbers, text, dates, durations and records are not turned into one another.
        return False
    if host.dtype.kind in "mM" and host.dtype != dtype:
        # NumPy calls a finer unit "safe" (s into ns), but the count is multiplied and wraps
        # (2^62 s into ns); a coarser one truncates. Only values that come back are as given.
        # Into the generic unit: the values would lose their unit (1 s stored as 1).
        if np.datetime_data(dtype)[0] == "generic" and np.datetime_data(host.dtype)[0] != "generic":
            return False
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                back = host.astype(dtype).astype(host.dtype)
            except (OverflowError, ValueError):
                return False  # newer NumPy refuses the wrap itself
        return bool((back.view(np.int64) == host.view(np.int64)).all())
    if host.dtype.names is not None and dtype.names is not None:
        # Records field by field (by position, as NumPy assigns them): NumPy calls a record cast
        # safe when each field's is, a finer time unit included, which wraps.
        if len(host.dtype.names) != len(dtype.names):
            return False
        for hn, dn in zip(host.dtype.names, dtype.names):
            hf, df = host.dtype.fields[hn][0], dtype.fields[dn][0]
            if hf.shape != df.shape or not _stores_as_given(host[hn], df.base):
                return False
        return True
    if np.can_cast(host.dtype, dtype, "safe"):
        return True
    if dtype.kind in "fc":
        # Integers and floats into floats: rounded to the precision, never wrapped.
        return np.can_cast(host.dtype, dtype, "same_kind")
    if host.dtype.kind in "biu" and dtype.kind in "iu":
        # Integers into a narrower or other-signed integer type: only values in its range
        # ([1, 2, 3] into int32 or uint8, not -1 into uint8). Compared as Python ints: a cast
        # and back is the identity between int32 and uint32, and would pass -1 as 4294967295.
        if host.size == 0:
            return True
        info = np.iinfo(dtype)
        return info.min <= int(host.min()) and int(host.max()) <= info.max
    if host.dtype.kind in "biu" and dtype.kind == "b":
        return bool(np.isin(host, (0, 1)).all())
    return False


def _refuse_finite_values_past_float_range(host, dtype):
    """ValueError where a finite number of `host` (integer or float) is beyond the finite range
    of the float (or complex) `dtype`: NumPy would store it as inf (70000 into float16, 1e300
    into float32), with a warning only. inf and nan given as such are stored as such."""
    if host.dtype.names is not None and dtype.names is not None:
        for hn, dn in zip(host.dtype.names, dtype.names):  # records: each field (see _stores_as_given)
            _refuse_finite_values_past_float_range(host[hn], dtype.fields[dn][0].base)
        return
    if host.dtype.kind not in "iufc" or dtype.kind not in "fc" or host.size == 0:
        return
    big = float(np.finfo(dtype).max)
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stored = host.astype(dtype)
    # Complex numbers part by part: a finite part stored as inf is no less lost beside a part
    # that is inf or nan.
    def parts(a):
        return (a.real, a.imag) if a.dtype.kind == "c" else (a,)
    bad = np.zeros(host.shape, bool)
    for given, kept in zip(parts(host), parts(stored)):
        bad |= ~np.isfinite(kept) & np.isfinite(given)
    if bad.any():
        value = host[bad].flat[0]
        value = int(value) if host.dtype.kind in "iu" else value
        raise ValueError("host holds the number %r, which %s cannot hold: it would be stored as inf "
                         "(%s's finite range is -%g..%g)" % (value, dtype, dtype, big, big))


def _refuse_other_device(obj, manager):
    """ValueError when `obj` says its memory is on another device than `manager`'s: a Kmm array
    or buffer by its `device`, another library's by `__dlpack_device__` (CUDA memory). CAI itself
    names no device; a producer that says none is taken to be on the manager's."""
    if isinstance(obj, (DeviceArray, Buffer)):
        device = obj.device
    elif hasattr(obj, "__dlpack_device__") and manager.backend == "cuda":
        try:
            kind, device = obj.__dlpack_device__()
        except Exception:
            return
        if kind not in (dlpack.kDLCUDA, dlpack.kDLCUDAManaged):
            return
    else:
        return
    if device != manager.device:
        raise ValueError("manager = %r: the array's memory is on device %s, the manager's device is %d"
                         % (manager, device, manager.device))


def _cai_field(cai, name):
    """A field `__cuda_array_interface__` must have (ValueError naming it, not a bare KeyError)."""
    try:
        return cai[name]
    except KeyError:
        raise ValueError("__cuda_array_interface__ has no %r field (it needs shape, typestr, data, version)"
                         % name) from None


def _cai_descr(dtype):
    """The CAI `descr` of an element type: NumPy's (the fields of a record type), or the type as
    one unnamed field where NumPy has none (records whose fields overlap or are out of order)."""
    try:
        return dtype.descr
    except ValueError:
        return [("", dtype.str)]


def _cai_dtype(dtype, descr):
    """The element type of a CAI dict: `typestr`, or the record type its `descr` gives (the
    fields of a structured type, which a typestr of "|V12" leaves out). A descr that contradicts
    the typestr is refused rather than one of them believed."""
    if descr is None:
        return dtype
    try:
        if not isinstance(descr, (list, tuple)):
            raise TypeError("not a list of fields")
        # Lists and tuples alike ([["", "<f4"]] as [("", "<f4")]), as JSON-minded producers give.
        fields = [tuple(f) if isinstance(f, (list, tuple)) else f for f in descr]
        if len(fields) == 1 and isinstance(fields[0], tuple) and fields[0][:1] == ("",):
            # One unnamed field is the plain type itself ([("", "<f4")]), not a record of it.
            described = np.dtype(fields[0][1] if len(fields[0]) == 2 else tuple(fields[0][1:]))
        else:
            described = np.lib.format.descr_to_dtype(fields)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise ValueError("__cuda_array_interface__ descr = %r is not a valid array-interface descr (%s)" % (descr, e)) from None
    described = _args.plain_dtype(described, "descr")
    if described.itemsize != dtype.itemsize or (described.names is None and described != dtype):
        raise ValueError("__cuda_array_interface__ descr = %r (%s) contradicts typestr %r"
                         % (descr, described, dtype.str))
    return described if described.names is not None else dtype


def _refuse_read_only(why):
    # A DeviceArray has no read-only mode: fill, set, copies into it and its writable exports
    # (host_view, DLPack, CAI) would write into memory the producer said must not change
    # (e.g. the bytes object under a NumPy array).
    raise BufferError("cannot import read-only memory: %s; kmm arrays are writable (copy it first)" % why)


#: The buffers whose memory was handed out in a `__cuda_array_interface__` dict, by the dict's
#: address (weakly): an import of such a dict alone, without the object that made it, holds them
#: as an import of the object would (a dict holds nothing; a free would hand its memory out under
#: the import). Several per address: an import may overlap another, or a buffer Kmm allocated.
_cai_addresses = {}
_cai_prune_at = [256]
#: Guards the table: threads exporting and importing at once would change it (and its sets)
#: while another iterates them, and a prune could drop an entry just being added.
_cai_lock = threading.Lock()


def _enter_cai_address(ptr, buf):
    with _cai_lock:
        entries = _cai_addresses.get(ptr)
        if entries is None:
            if len(_cai_addresses) >= _cai_prune_at[0]:
                # Addresses whose buffers are all gone, dropped once the table doubled.
                for key in [key for key, bufs in _cai_addresses.items() if not bufs]:
                    del _cai_addresses[key]
                _cai_prune_at[0] = max(256, 2 * len(_cai_addresses))
            entries = _cai_addresses[ptr] = weakref.WeakSet()
        entries.add(buf)


def _dict_producers(cai, ptr, lo, hi):
    """What an import of the bare CAI dict `cai` keeps: the live buffer Kmm allocated that holds
    `ptr` (checked to hold the dict's whole range), else the live imports whose dicts gave that
    address, with the dict. A closed buffer's entry says nothing: its address may be another
    buffer's now, whose own dicts enter it again."""
    with _cai_lock:
        entered = list(_cai_addresses.get(ptr, ()))
    live = [buf for buf in entered if not buf.closed and buf._ptr <= ptr < buf._ptr + buf.nbytes]
    allocated = [buf for buf in live if not isinstance(buf, _Imported)]
    if allocated:
        # Live buffers Kmm allocated do not overlap: this one is the memory's only owner.
        buf = allocated[0]
        if not (buf._ptr <= ptr + lo and ptr + hi <= buf._ptr + buf.nbytes):
            raise ValueError("the __cuda_array_interface__ dict's bytes %#x..%#x reach past its kmm buffer's %d bytes at %#x"
                             % (ptr + lo, ptr + hi, buf.nbytes, buf._ptr))
        return [buf]
    # Others' memory, whose extent Kmm does not know: each import that handed the address out
    # holds its producer, which owns it (a dict larger than one of them is no error).
    return [cai] + live


def _kmm_buffer(obj):
    """The kmm buffer a producer `obj` is or views (None for another library's object)."""
    return obj.buffer if isinstance(obj, DeviceArray) else obj if isinstance(obj, Buffer) else None


def _producer(obj):
    """What an import through `__cuda_array_interface__` keeps of its producer `obj`: `obj`, and
    for a kmm buffer or array an export of its buffer, so that the buffer's free (by the
    collector too, in one garbage cycle with the import) waits until the import lets go."""
    buf = _kmm_buffer(obj)
    return obj if buf is None else (obj, _ExportToken(buf._export()))


def _import_kind(producers):
    """The memory kind of an import through `__cuda_array_interface__` of `producers`: a kmm
    buffer's or array's own (its pinned memory is pinned in the import's kind, stats and trace
    too), else device memory, since CAI names no kind."""
    for producer in producers:
        buf = _kmm_buffer(producer)
        if buf is not None:
            return buf._kind
    return _lib.KMM_MEMORY_DEVICE


class DeviceArray:
    """An n-dimensional array in Kmm memory. Create with `DeviceArray.empty`, `zeros`,
    `from_host`, `Manager.empty`/`asarray`, or import with `from_cuda_array_interface` /
    `from_dlpack` (no copy; the producer stays alive as long as the array)."""

    __slots__ = ("_buffer", "_shape", "_dtype", "_strides", "_offset", "__weakref__")

    def __init__(self, buffer, shape, dtype, strides=None, offset=0):
        if not isinstance(buffer, Buffer):
            raise TypeError("buffer = %r must be a kmm.Buffer" % (buffer,))
        dtype = _args.plain_dtype(dtype)
        shape = _args.shape(shape)
        # As `empty`: a view (a stride of 0 repeats bytes) is no larger than an allocation could be.
        _args.array_bytes(shape, dtype)
        if strides is None:
            strides = c_strides(shape, dtype.itemsize)
        else:
            strides = _args.strides(strides)
        offset = _args.integer(offset, "offset", -(1 << 63), (1 << 63) - 1)
        if len(strides) != len(shape):
            raise ValueError("strides %s do not match shape %s" % (strides, shape))
        lo, hi = extent(shape, strides, dtype.itemsize)
        if offset + lo < 0 or offset + hi > buffer.nbytes:
            raise ValueError(
                "an array of shape %s, strides %s, offset %d reaches bytes %d..%d of a %d-byte buffer"
                % (shape, strides, offset, offset + lo, offset + hi, buffer.nbytes))
        self._buffer = buffer
        self._shape = shape
        self._dtype = dtype
        self._strides = strides
        self._offset = offset

    # -- creation -------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, dtype="float32", manager=None, kind="device"):
        shape, dtype = _args.shape_and_dtype(shape, dtype)
        nbytes = _args.array_bytes(shape, dtype)
        manager = chosen(manager)
        return cls(Buffer._alloc(manager, nbytes, kind_code(kind)), shape, dtype)

    @classmethod
    def zeros(cls, shape, dtype="float32", manager=None, kind="device"):
        a = cls.empty(shape, dtype, manager, kind)
        if a.nbytes:
            a.buffer.fill(b"\0")
        return a

    @classmethod
    def from_host(cls, host, manager=None, kind="device"):
        """A copy of a host array (anything `numpy.asarray` accepts; 0-d arrays stay 0-d)."""
        manager = chosen(manager)  # before the host array is converted
        # np.asarray views a NumPy subclass as a base array: its C-level shape and dtype, not
        # properties a subclass may override (a shape claiming more than the memory made an
        # array whose extra bytes were a freed buffer's).
        host = np.require(np.asarray(host), requirements="C")
        _args.plain_dtype(host.dtype, "the host array's dtype")
        a = cls.empty(host.shape, host.dtype, manager, kind)
        a.buffer.copy_from_host(host)
        return a

    @classmethod
    def from_cuda_array_interface(cls, obj, manager=None):
        """A view of `obj`'s memory (`__cuda_array_interface__` v0 to v3, or the dict itself)
        without copying; the array keeps `obj` alive, and after the array's free until the
        manager's stream has passed it (let go at the manager's next allocation, import,
        synchronize or close). The manager's stream waits for the producer's `stream`. A dict
        keeps nothing alive by itself: the dict of a live kmm array or buffer is imported as that
        buffer (its free waits for the import), the dict of a live kmm import holds that import's
        producer; any other dict is the caller's to keep valid (pass the exporting object
        instead). The import is memory of the kind of the kmm buffer it views (pinned stays
        pinned), device memory where another library made it (CAI names no kind)."""
        cai = obj if isinstance(obj, dict) else getattr(obj, "__cuda_array_interface__", None)
        if cai is None:
            raise TypeError("obj = %r has no __cuda_array_interface__ (pass an object that exports it, or its dict)"
                            % type(obj).__name__)
        manager = chosen(manager)
        if not isinstance(cai, dict):
            raise TypeError("__cuda_array_interface__ = %r must be a dict" % (cai,))
        if cai.get("mask") is not None:
            raise ValueError("masked arrays (__cuda_array_interface__ 'mask') are not supported")
        version = _args.integer(_cai_field(cai, "version"), "__cuda_array_interface__ version", 0, 3)
        typestr = _cai_field(cai, "typestr")
        if not isinstance(typestr, str):
            # np.dtype(None) is float64: the memory would be read as another type.
            raise TypeError("__cuda_array_interface__ typestr = %r must be a string (e.g. '<f4')" % (typestr,))
        dtype = _cai_dtype(_args.plain_dtype(typestr, "typestr"), cai.get("descr"))
        shape = _args.shape(_cai_field(cai, "shape"), "shape")
        _args.array_bytes(shape, dtype)  # before anything waits or is wrapped
        strides = cai.get("strides")
        strides = c_strides(shape, dtype.itemsize) if strides is None else _args.strides(strides)
        data = _cai_field(cai, "data")
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError("__cuda_array_interface__ data = %r must be a (pointer, read_only) pair" % (data,))
        ptr = _args.integer(0 if data[0] is None else data[0], "data[0]")
        if data[1]:
            _refuse_read_only("__cuda_array_interface__ data[1] (read-only) is True")
        if len(strides) != len(shape):
            raise ValueError("strides %s do not match shape %s" % (strides, shape))
        lo, hi = extent(shape, strides, dtype.itemsize)
        producers = _dict_producers(cai, ptr, lo, hi) if obj is cai else [obj]
        for producer in producers:
            _refuse_other_device(producer, manager)
        # The stream field came with version 3: an older dict's "stream" is no part of it.
        _foreign_stream_wait(manager, cai.get("stream") if version >= 3 else None)
        base = ptr + lo if hi > lo else 0
        kept = [_producer(producer) for producer in producers]
        buf = _Imported._wrap(manager, base, hi - lo, _import_kind(producers), kept[0] if len(kept) == 1 else tuple(kept), "data[0]")
        return cls(buf, shape, dtype, strides=strides, offset=-lo)

    @classmethod
    def from_dlpack(cls, obj, manager=None):
        """A view of a DLPack producer's memory (an object with `__dlpack__`, or a capsule)
        without copying; keeps the producer's tensor alive until the array is freed and the
        manager's stream has passed that free (let go at the manager's next allocation, import,
        synchronize or close)."""
        manager = chosen(manager)
        if hasattr(obj, "__dlpack__"):
            # A kmm array says its device (the host backend's stand-in devices included, which
            # DLPack calls CPU device 0): another device's manager is refused, as asarray does.
            _refuse_other_device(obj, manager)
            dev_type = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else dlpack.kDLCUDA
            if dev_type == dlpack.kDLCPU:
                stream = None
            elif manager.backend == "host":
                raise BufferError("a host-backend manager cannot import device memory (DLPack device %d)" % dev_type)
            else:
                stream = manager.stream
            try:
                capsule = obj.__dlpack__(stream=stream, max_version=dlpack.VERSION)
            except TypeError:
                capsule = obj.__dlpack__(stream=stream)
        elif type(obj).__name__ == "PyCapsule":
            capsule = obj
        else:
            raise TypeError("obj = %r (%s) is neither a DLPack producer (no __dlpack__) nor a DLPack capsule"
                            % (obj, type(obj).__name__))
        t, owner, readonly = dlpack.consume(capsule, obj)
        if readonly:
            _refuse_read_only("the DLPack tensor is flagged read-only")
        dev_type = t.device.device_type
        if manager.backend == "host":
            if dev_type != dlpack.kDLCPU:
                raise BufferError("a host-backend manager cannot import DLPack device type %d" % dev_type)
            if t.device.device_id != 0:
                raise BufferError("a DLPack CPU tensor has device_id 0, not %d" % t.device.device_id)
            kind = _lib.KMM_MEMORY_DEVICE
        elif dev_type in (dlpack.kDLCUDA, dlpack.kDLCUDAManaged):
            if t.device.device_id != manager.device:
                raise BufferError("the tensor is on device %d, the manager on device %d" % (t.device.device_id, manager.device))
            kind = _lib.KMM_MEMORY_DEVICE
        elif dev_type == dlpack.kDLCUDAHost:
            kind = _lib.KMM_MEMORY_PINNED
        else:
            raise BufferError("DLPack device type %d cannot be used by a CUDA manager" % dev_type)
        dtype = dlpack.dl_to_dtype(t.dtype)
        # The producer's struct is read through raw pointers: its ndim decides how far past
        # `shape` and `strides` we read (a negative one read as 0-d, 2^31 - 1 read until a
        # crash), and its numbers are checked before they become a buffer's geometry.
        ndim = _args.integer(t.ndim, "the DLPack tensor's ndim", 0, dlpack.MAX_NDIM, BufferError)
        if ndim and not t.shape:
            raise BufferError("the DLPack tensor's shape is NULL (ndim = %d)" % ndim)
        shape = _args.shape([t.shape[i] for i in range(ndim)], "the DLPack tensor's shape")
        _args.array_bytes(shape, dtype, "the DLPack tensor's shape")
        if t.strides:
            strides = _args.strides([t.strides[i] * dtype.itemsize for i in range(ndim)],
                                    "the DLPack tensor's byte strides")
        else:
            strides = c_strides(shape, dtype.itemsize)
        ptr = (t.data or 0) + t.byte_offset
        lo, hi = extent(shape, strides, dtype.itemsize)
        base = ptr + lo if hi > lo else 0
        buf = _Imported._wrap(manager, base, hi - lo, kind, owner, "the DLPack tensor's data + byte_offset")
        return cls(buf, shape, dtype, strides=strides, offset=-lo)

    # -- properties -----------------------------------------------------------------------
    # Read-only, unlike NumPy's `shape` and `strides`: the bounds were checked against the buffer
    # once, in __init__, and copies and exports trust them (`reshape` makes a new view).
    @property
    def buffer(self):
        return self._buffer

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def strides(self):
        """Byte strides."""
        return self._strides

    @property
    def offset(self):
        """Byte offset of the first element in `buffer`."""
        return self._offset

    @property
    def manager(self):
        return self.buffer.manager

    @property
    def device(self):
        """The device (ordinal) whose memory holds the array (its manager's)."""
        return self.buffer.device

    @property
    def ptr(self):
        """Address of the first element."""
        return self.buffer.ptr + self.offset if self.buffer.nbytes else 0

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def is_c_contiguous(self):
        return self.size <= 1 or all(
            n == 1 or s == c for n, s, c in zip(self.shape, self.strides, c_strides(self.shape, self.itemsize)))

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __bool__(self):
        # As NumPy: a 0-d array is true when its one element is (read from the memory, after the
        # work queued on it). Other arrays keep their length's truth (__len__).
        if not self.shape:
            return bool(self.get())
        return len(self) > 0

    def __array__(self, dtype=None, copy=None):
        # As CuPy: device memory is never copied to the host behind the caller's back (NumPy
        # would otherwise make a 0-d object array holding this object).
        raise TypeError("a kmm.DeviceArray is not converted implicitly: use .get() for a NumPy copy")

    # -- copies ---------------------------------------------------------------------------
    def get(self):
        """A NumPy copy of the content."""
        out = np.empty(self.shape, self.dtype)
        if self.size == 0:
            return out
        if self.is_c_contiguous:
            self.buffer.copy_to_host(out, offset=self.offset)
            return out
        lo, hi = extent(self.shape, self.strides, self.itemsize)
        raw = np.empty(hi - lo, np.uint8)
        self.buffer.copy_to_host(raw, offset=self.offset + lo)
        view = np.ndarray(self.shape, self.dtype, buffer=raw, offset=-lo, strides=self.strides)
        out[...] = view
        return out

    copy_to_host = get

    def set(self, host):
        """Copies a host array of the same shape (C-contiguous arrays only). Values are stored
        as given or refused: numbers (bools too) go into number arrays only, text into str or
        bytes arrays, durations, dates and records into their own kind. An integer must fit the
        array's type (its exact range: no wrap, not -1 into uint32), a float goes into a float or
        complex array only (rounded to its precision, as NumPy assigns), a complex number into a
        complex one; a finite number the type would store as inf (1e300 into float32) is refused,
        inf and nan are stored as given."""
        if not self.is_c_contiguous:
            raise ValueError("set() needs a C-contiguous DeviceArray")
        host = np.asarray(host)
        if not _stores_as_given(host, self.dtype):
            # 1.7 would be stored as 1, 2**40 wrapped into int32.
            if host.dtype.kind == "O":
                how = "Python objects are not stored: give an array of numbers, text, dates or records"
            elif _family(host.dtype.kind) != _family(self.dtype.kind):
                how = "%s go into %s arrays only: convert them yourself, e.g. host.astype(%r)" % (
                    _family(host.dtype.kind) + (self.dtype.str,))
            elif host.dtype.kind in "mM":
                how = ("convert it yourself, checking its range: NumPy's astype wraps times a finer unit "
                       "cannot hold, and a generic unit drops the unit")
            elif self.dtype.kind == "V":
                # A cast to the record type would change values too: the fields must hold them.
                how = "give an array of %s, or fields whose types hold their values" % (self.dtype,)
            else:
                how = "cast it first, e.g. host.astype(%r)" % self.dtype.str
            raise TypeError("host = array of %s cannot be stored as %s without changing values (%s)"
                            % (host.dtype, self.dtype, how))
        _refuse_finite_values_past_float_range(host, self.dtype)
        try:
            host = np.require(host, dtype=self.dtype, requirements="C")
        except UnicodeError:
            # Bytes into a str array decode as ASCII: other bytes have no one character.
            raise TypeError("host = array of %s holds bytes that are not ASCII, which %s cannot store "
                            "(decode them first)" % (host.dtype, self.dtype)) from None
        if host.shape != self.shape:
            raise ValueError("shape %s does not match %s" % (host.shape, self.shape))
        self.buffer.copy_from_host(host, offset=self.offset)
        return self

    copy_from_host = set

    def copy(self):
        """A C-contiguous copy in a new buffer of the same manager and kind: device to device
        (stream-ordered) when this array is C-contiguous, through the host otherwise."""
        out = DeviceArray.empty(self.shape, self.dtype, manager=self.manager, kind=self.buffer.kind)
        if self.is_c_contiguous:
            if self.nbytes:
                out.buffer.copy_from(self.buffer, src_offset=self.offset, nbytes=self.nbytes)
        else:
            out.set(self.get())
        return out

    # As NumPy's and CuPy's: copying an array copies its data (a copy sharing the buffer would
    # share its close(); the buffer itself cannot be copied).
    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def view(self, dtype):
        """The same memory read as another dtype of the same item size."""
        dtype = _args.plain_dtype(dtype)
        if dtype.itemsize != self.itemsize:
            raise ValueError("view() needs a dtype of the same item size")
        return DeviceArray(self.buffer, self.shape, dtype, self.strides, self.offset)

    def reshape(self, *shape):
        if len(shape) == 1:  # reshape(n), reshape((m, n)), reshape(np.array([m, n]))
            shape = shape[0]
        shape = _args.shape(shape)
        if not self.is_c_contiguous or math.prod(shape) != self.size:
            raise ValueError("cannot reshape %s to %s" % (self.shape, shape))
        return DeviceArray(self.buffer, shape, self.dtype, None, self.offset)

    # -- exchange -------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self):
        self.buffer._live()
        if self.ptr:
            _enter_cai_address(self.ptr, self.buffer)
        stream = self.buffer.manager.stream
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None if self.is_c_contiguous else self.strides,
            "descr": _cai_descr(self.dtype),
            "stream": stream if stream else None,
        }

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return dlpack.export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return dlpack.device_of(self.buffer)

    def close(self):
        """Frees the underlying buffer (other views of it become invalid)."""
        self.buffer.close()

    def __repr__(self):
        return "<kmm.DeviceArray shape=%s dtype=%s %s at %#x>" % (
            self.shape, self.dtype, self.buffer.kind, self.ptr if not self.buffer.closed else 0)


def from_dlpack(obj, manager=None):
    return DeviceArray.from_dlpack(obj, manager)


def from_cuda_array_interface(obj, manager=None):
    return DeviceArray.from_cuda_array_interface(obj, manager)
