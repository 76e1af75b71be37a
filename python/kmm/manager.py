"""`kmm.Manager`: a stream, device and pinned pools, and the buffers allocated from them."""

import collections
import ctypes
import threading

from . import _args, _lib
from ._errors import BufferMappedError, InvalidHandleError, NotCopyable, check
from ._lifetime import later
from .buffer import KIND_NAMES, KINDS, Buffer, _export_lock

_lib_ = _lib.lib

BACKENDS = {"auto": _lib.KMM_BACKEND_AUTO, "host": _lib.KMM_BACKEND_HOST, "cuda": _lib.KMM_BACKEND_CUDA}
ALLOC_MODES = {"pool": _lib.KMM_ALLOC_POOL, "cuda_async": _lib.KMM_ALLOC_CUDA_ASYNC, "direct": _lib.KMM_ALLOC_DIRECT}
SUBALLOCATORS = {
    "binned": _lib.KMM_SUBALLOC_BINNED,
    "heap": _lib.KMM_SUBALLOC_HEAP,
    "fixed": _lib.KMM_SUBALLOC_FIXED,
    "ring": _lib.KMM_SUBALLOC_RING,
}
_ENUMS = {"backend": BACKENDS, "alloc_mode": ALLOC_MODES, "suballocator": SUBALLOCATORS}


def _name(table, value):
    return next((k for k, v in table.items() if v == value), value)


def kind_code(kind):
    """"device" | "pinned" (or the KmmMemoryKind integer, Python or NumPy) -> the integer."""
    kind = _args.kind(kind)
    if isinstance(kind, int) and not isinstance(kind, bool) and kind in KIND_NAMES:
        return kind
    try:
        return KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError("kind = %r must be \"device\" or \"pinned\" (or its code: 0 or 1)" % (kind,)) from None


#: The range of each C integer type of KmmConfig's fields.
_RANGES = {
    ctypes.c_uint64: (0, _args.U64_MAX),
    ctypes.c_uint32: (0, (1 << 32) - 1),
    ctypes.c_int32: (_args.I32_MIN, _args.I32_MAX),
}


def make_config(**config):
    """A KmmConfig from keyword arguments named like its fields; enums as strings or integers.
    Every value must be an integer in its C field's range (no wrap or truncation); libkmm then
    checks the bounds of each option."""
    c = _lib.KmmConfig()
    check(_lib_.kmm_config_default(ctypes.byref(c)))
    fields = dict(_lib.KmmConfig._fields_)
    for key, value in config.items():
        if key not in fields:
            raise TypeError("unknown Kmm config option %r (options: %s)" % (key, ", ".join(sorted(fields))))
        if key in _ENUMS and isinstance(value, str):
            try:
                value = _ENUMS[key][value]
            except KeyError:
                raise ValueError("%s = %r must be one of %s" % (key, value, ", ".join(_ENUMS[key]))) from None
        if value is None and key == "release_threshold":
            value = _args.U64_MAX
        lo, hi = _RANGES[fields[key]]
        if key == "device":
            lo = 0  # an ordinal: the bound libkmm and can_access_peer state too
        setattr(c, key, _args.integer(value, key, lo, hi))
    return c


def checked_config(**config):
    """`make_config`, then every option's bounds checked as a manager's creation checks them
    (`kmm_config_check`): for options kept for managers made later (the plugins' `configure`),
    so that a bad one raises at once."""
    c = make_config(**config)
    check(_lib_.kmm_config_check(ctypes.byref(c)))
    return c


class Manager(NotCopyable):
    """A Kmm manager: owns a stream and memory pools. Options are KmmConfig's fields:
    `backend` ("auto" | "host" | "cuda"), `device`, `alloc_mode` ("pool" | "cuda_async" |
    "direct"), `suballocator` ("binned" | "heap" | "fixed" | "ring"), `alignment`,
    `chunk_size`, `initial_pool_size`, `fixed_block_size`, `hard_limit`, `release_threshold`,
    `pinned_chunk_size`, `pinned_limit`, `staging_chunk_size`, `staging_chunks`,
    `compaction_ratio_pct` (0 never moves unmapped buffers; default 108), `spill_limit` (bytes
    of unmapped device buffers that may spill to host memory when the device or `hard_limit`
    is full, least recently used first, and come back on their next use; 0, the default,
    never spills; buffers handed out by address stay mapped and never spill).

    Destroyed by `close()` (waits for the stream), on garbage collection (deferred, never
    blocks; when a collection finds it in garbage, at the end of that collection, and never
    while an export of its memory lives) or at the end of a `with` block. Buffers keep their
    manager alive."""

    def __init__(self, **config):
        self._handle = 0
        self._owned = True
        self._exports = 0
        self._pending = 0
        self._init_imports()
        cfg = make_config(**config)
        out = ctypes.c_uint64()
        check(_lib_.kmm_manager_create(ctypes.byref(cfg), ctypes.byref(out)))
        self._handle = out.value
        self._init_info()

    @classmethod
    def _borrow(cls, handle):
        """A Manager object for a handle Kmm owns (e.g. PyTorch's default manager); never destroyed here."""
        self = cls.__new__(cls)
        self._handle = handle
        self._owned = False
        self._exports = 0
        self._pending = 0
        self._init_imports()
        self._init_info()
        return self

    # -- imports' producers: kept until the stream has passed their buffers' frees ---------------
    # No lock is held while anything is allocated: a collection starting there may run a queued
    # `_free_import` of garbage in this thread, which comes back here. The deque's append and
    # popleft are atomic and allocate no tracked object.
    def _init_imports(self):
        self._imports = 0                   # imported buffers not yet freed
        self._held = collections.deque()    # (event, producer) of freed imports; event 0: none
        self._closing = False               # close() waits for the stream: it lets go of them
        self._imports_lock = threading.Lock()

    def _count_import(self, n):
        with self._imports_lock:  # an int's update: nothing in it starts a collection
            self._imports += n

    def _hold_until_stream_passes(self, owner):
        """After an import's buffer was freed (stream-ordered): keeps its producer `owner` until
        an event recorded now on the stream has completed, so that no work queued before the
        free runs on memory the producer gave back. With no handle left the manager is closing
        (close() lets go once its wait has run), was closed (its destroy waited) or is
        destroyed by its finalizer (which waits first while it has imports)."""
        h = self._handle
        ev = ctypes.c_uint64()
        if h and _lib_.kmm_manager_record_event(h, ctypes.byref(ev)) != 0:
            # Destroyed meanwhile (see above), or no event to be had: wait for the work now.
            if self._handle:
                _lib_.kmm_manager_synchronize(h)
            h = 0
        if h or self._closing:
            self._held.append((ev.value if h else 0, owner))
        self._count_import(-1)
        del owner
        self._release_passed()

    def _release_passed(self, waited=False):
        """Lets go of the producers whose events have completed; of all of them when `waited`:
        the stream was waited for after the frees, and the manager takes no more work (close,
        destroy). With no handle left that holds unless close() is still waiting."""
        h = self._handle or self._pending
        if not h and not waited:
            if self._closing:
                return  # close() lets go of them when its wait has run
            waited = True
        done = ctypes.c_bool()
        for _ in range(len(self._held)):
            try:
                entry = self._held.popleft()
            except IndexError:  # another thread took the rest
                return
            ev = entry[0]
            if waited or (ev and _lib_.kmm_event_query(h, ev, ctypes.byref(done)) == 0 and done.value):
                if h and ev:
                    _lib_.kmm_event_destroy(h, ev)
                del entry  # the producer goes
            else:
                self._held.append(entry)  # still queued: looked at again later

    def _closed(self):
        """close()'s wait has run: the producers it held go, and so do those of frees that
        came meanwhile (a free that finds `_closing` cleared lets go of its own)."""
        self._closing = False
        self._release_passed(waited=True)

    def _init_info(self):
        info = _lib.KmmManagerInfo()
        check(_lib_.kmm_manager_info(self._handle, ctypes.byref(info)))
        self._stream = info.stream
        self._backend = _name(BACKENDS, info.backend)
        self._device = info.device
        self._alloc_mode = _name(ALLOC_MODES, info.alloc_mode)
        self._suballocator = _name(SUBALLOCATORS, info.suballocator)
        self._local = threading.local()

    # -- identity -------------------------------------------------------------------------
    @property
    def handle(self):
        """The raw KmmManager handle (0 once closed)."""
        return self._handle

    @property
    def stream(self):
        """The manager's raw stream: a CUstream (as an int) on CUDA, an opaque id on the host
        backend. Raises once the manager is closed (the stream is gone)."""
        self._live()
        return self._stream

    @property
    def backend(self):
        """"host" or "cuda"."""
        return self._backend

    @property
    def device(self):
        return self._device

    @property
    def alloc_mode(self):
        return self._alloc_mode

    @property
    def suballocator(self):
        return self._suballocator

    @property
    def closed(self):
        return self._handle == 0

    def _live(self):
        if not self._handle:
            raise InvalidHandleError("the manager is closed")
        return self._handle

    # -- memory ---------------------------------------------------------------------------
    def alloc(self, nbytes, kind="device"):
        """A new `Buffer` of `nbytes` bytes of "device" or "pinned" memory."""
        return Buffer._alloc(self, _args.nbytes(nbytes), kind_code(kind))

    def empty(self, shape, dtype="float32", kind="device"):
        """A new uninitialized `DeviceArray`."""
        from .array import DeviceArray

        return DeviceArray.empty(shape, dtype, manager=self, kind=kind)

    def asarray(self, host, kind="device"):
        """A `DeviceArray` holding a copy of a host array (anything NumPy accepts)."""
        from .array import DeviceArray

        return DeviceArray.from_host(host, manager=self, kind=kind)

    def stats(self, kind=None):
        """Counters as a dict: {"device": {...}, "pinned": {...}} or one kind's dict."""
        if kind is not None:
            s = _lib.KmmMemoryStats()
            check(_lib_.kmm_manager_stats(self._live(), kind_code(kind), ctypes.byref(s)))
            return {name: getattr(s, name) for name, _ in s._fields_}
        return {name: self.stats(name) for name in KINDS}

    def summary(self):
        """A readable table of the manager's memory (in use, reserved, peaks, counts)."""
        from .observe import _text

        return _text(_lib_.kmm_manager_summary, self._live())

    def status(self):
        """The memory now: counters, the readable table and figures (`kmm.observe.MemoryStatus`;
        Jupyter shows the table, the memory maps and, with a ring trace, the timeline)."""
        from .observe import MemoryStatus

        return MemoryStatus(self)

    def memory_map(self, kind="device"):
        """Every chunk of "device" or "pinned" memory, cut into blocks and free space
        (`kmm.observe.MemoryMap`; a figure in Jupyter)."""
        from .observe import MemoryMap

        return MemoryMap(self._live(), KIND_NAMES[kind_code(kind)])

    def trace_start(self, capacity=0, path=None, rmm_only=False):
        """Records every allocation, free, map, unmap, move, trim and failed allocation: into
        rings of the last `capacity` records (0: 65,536; one per lane of the manager, so threads
        record in parallel), or, with `path`, into that CSV file as they happen (`rmm_only`: only
        what RMM's replay benchmark reads). Replaces the last trace."""
        from .observe import trace_start

        trace_start(self._live(), capacity, path, rmm_only)

    def trace_stop(self):
        """Stops the trace (a file trace is closed); a ring's records stay readable."""
        check(_lib_.kmm_manager_trace_stop(self._live()))

    def trace(self):
        """The ring trace's records, oldest first (`kmm.observe.MemoryTrace`; a timeline in
        Jupyter)."""
        from .observe import MemoryTrace

        return MemoryTrace(self._live())

    def save_trace(self, path, rmm_only=False):
        """Writes the ring trace to the CSV file `path` (RMM's columns first)."""
        from .observe import save_trace

        save_trace(self._live(), path, rmm_only)

    def memory_info(self):
        """(free, total) bytes of the device."""
        free, total = ctypes.c_uint64(), ctypes.c_uint64()
        check(_lib_.kmm_manager_memory_info(self._live(), ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def reset_peaks(self):
        check(_lib_.kmm_manager_reset_peaks(self._live()))

    def trim(self, keep_bytes=0):
        """Waits for the stream, then gives cached memory back down to `keep_bytes` per pool."""
        check(_lib_.kmm_manager_trim(self._live(), _args.nbytes(keep_bytes, "keep_bytes")))

    def synchronize(self):
        """Waits for all work queued on the manager's stream."""
        check(_lib_.kmm_manager_synchronize(self._live()))
        self._release_passed()

    def wait_stream(self, stream):
        """The manager's stream waits for the work queued so far on the raw `stream`."""
        check(_lib_.kmm_manager_wait_stream(self._live(), _args.stream(stream)))

    def signal_stream(self, stream):
        """The raw `stream` waits for the work queued so far on the manager's stream."""
        check(_lib_.kmm_manager_signal_stream(self._live(), _args.stream(stream)))

    # -- lifetime -------------------------------------------------------------------------
    def close(self):
        """Destroys the manager (waits for its stream, frees what is left). Idempotent. While
        `host_view` memoryviews or DLPack exports of its buffers live, the manager closes at once
        for Python (its methods raise; its trace stops, a file trace is complete) and is
        destroyed when the last export lets go. A manager
        libkmm owns (`kmm.torch.manager`) is not closed: its buffers free themselves only through
        an open handle, so closing it for Python would leak every one of them."""
        if not self._owned:
            return
        with _export_lock:
            # Before the handle goes: an import freed meanwhile sees one or the other.
            self._closing = bool(self._handle)
            h, self._handle = self._handle, 0
            if h and self._exports:
                self._pending = h
                # As a destroy would: the work queued so far has run when close returns, so what
                # the exports show is what that work wrote. Under the lock: the last export's
                # end cannot destroy the manager meanwhile.
                try:
                    check(_lib_.kmm_manager_synchronize(h))
                finally:
                    self._closed()
                # Its trace ends here, as a destroy would end it: a file trace is complete when
                # close() returns (the export may live until the process exits, with no destroy).
                _lib_.kmm_manager_trace_stop(h)
                return
        if h:
            try:
                check(_lib_.kmm_manager_destroy(h, 0))
            finally:
                self._closed()

    def _refuse_close_while_held(self, whose, users):
        """For plugins' managers: raises `BufferMappedError` (naming `whose` manager and its
        `users`) while the manager holds live buffers of either kind."""
        held = sum(self.stats(kind)["live_buffers"] for kind in ("device", "pinned"))
        if held:
            raise BufferMappedError("%s of device %d holds %d live buffers (%s): drop them before close(), "
                                    "or close(force=True)" % (whose, self._device, held, users))

    def _end_deferred_close(self):
        """After an export ended: destroys a closed manager once no export is left."""
        with _export_lock:
            h = self._pending if self._exports == 0 else 0
            self._pending = 0 if h else self._pending
        if h:
            later(_lib_.kmm_manager_destroy, h, _lib.KMM_DESTROY_DEFERRED)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        h = getattr(self, "_handle", 0)
        if h and getattr(self, "_owned", False):
            try:
                with _export_lock:
                    self._handle = 0
                    if self._exports:
                        # As close(): the last export's end destroys it (only a garbage cycle
                        # that holds an export, which holds its buffer and manager, comes here so).
                        self._pending = h
                        return
                # Imports whose producers go with this garbage may still be read or written by
                # queued work: it runs before they are let go (the only wait of a finalizer).
                if self._imports or self._held:
                    _lib_.kmm_manager_synchronize(h)
                    self._release_passed()
                # In a collection, at its end: a finalizer of the same garbage may still write
                # through a view of the manager's memory.
                later(_lib_.kmm_manager_destroy, h, _lib.KMM_DESTROY_DEFERRED)
            except Exception:  # interpreter shutdown: the module's globals may be gone
                pass

    def __repr__(self):
        if not self._handle:
            return "<kmm.Manager closed>"
        return "<kmm.Manager %#x backend=%s device=%d mode=%s stream=%#x>" % (
            self._handle, self._backend, self._device, self._alloc_mode, self._stream)

    def __str__(self):
        return self.summary() if self._handle else repr(self)


_default = {}
_default_lock = threading.Lock()


def chosen(manager, name="manager"):
    """A `manager=` argument: None for the default manager, or a `Manager`. (`manager or
    default_manager()` took 0, False, "" and {} for None, and failed deep inside on others.)"""
    if manager is None:
        return default_manager()
    if not isinstance(manager, Manager):
        raise TypeError("%s = %r must be a kmm.Manager or None (the default manager)" % (name, manager))
    return manager


def default_manager(device=0):
    """The process-wide manager of `device` (default configuration; created on first use)."""
    device = _args.device(device)
    m = _default.get(device)
    if m is None or m.closed:
        with _default_lock:
            m = _default.get(device)
            if m is None or m.closed:
                m = _default[device] = Manager(device=device)
    return m
