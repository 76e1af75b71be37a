"""What a manager shows of its memory: its status (table and figures), its memory map and its
allocation trace. The figures are libkmm's SVG; Jupyter draws them (`_repr_svg_`,
`_repr_html_`)."""

import ctypes
import html
from collections import namedtuple

from . import _args, _lib
from ._errors import check

_lib_ = _lib.lib

ACTIONS = ("allocate", "free", "allocate failure", "map", "unmap", "move", "trim", "wrap", "spill", "restore")
STATES = ("free", "in use", "mapped")
FIGURES = {"device_map": 0, "pinned_map": 1, "timeline": 2, "overview": 3}

#: One event of a trace: `action` is its name ("allocate", ...), `kind` "device" or "pinned";
#: `reserved` is None where CUDA's own pool holds the memory.
Record = namedtuple(
    "Record", "time_ns thread action kind address bytes stream buffer moved_from status in_use reserved"
)
#: A stretch of a chunk: `state` is "free", "in use" or "mapped".
Segment = namedtuple("Segment", "chunk address bytes state buffer requested")


def figure_svg(handle, figure):
    """libkmm's SVG of a figure ("device_map", "pinned_map", "timeline", "overview")."""
    handle = _args.handle(handle)
    if not isinstance(figure, str) or figure not in FIGURES:
        raise ValueError("figure = %r must be one of %s" % (figure, ", ".join('"%s"' % f for f in FIGURES)))
    return _text(_lib_.kmm_manager_figure_svg, handle, FIGURES[figure])


def _text(call, handle, *args):
    """The text a two-call C function gives: its length first, then the text, again while it
    grew in between (other threads change what is drawn)."""
    needed = ctypes.c_size_t()
    check(call(handle, *args, None, 0, ctypes.byref(needed)))
    while True:
        size = needed.value
        buf = ctypes.create_string_buffer(size)
        check(call(handle, *args, buf, size, ctypes.byref(needed)))
        if needed.value <= size:
            return buf.value.decode("utf-8")


def _items(call, handle, ctype, *args, tail=()):
    """The items a two-call C function gives: the count first, then the array (again if the
    count grew in between)."""
    count = ctypes.c_size_t()
    check(call(handle, *args, None, 0, ctypes.byref(count), *tail))
    while True:
        n = count.value
        array = (ctype * n)()
        check(call(handle, *args, array, n, ctypes.byref(count), *tail))
        if count.value <= n:
            return list(array)[: count.value]


class MemoryMap:
    """Every chunk of one kind of memory in address order, cut into buffers' blocks and the free
    space between them (`segments`). Shows as a figure in Jupyter."""

    def __init__(self, handle, kind):
        """`handle`: a manager's handle (`Manager.memory_map(kind)` passes it); `kind`: "device"
        or "pinned"."""
        handle = _args.handle(handle)
        if kind not in ("device", "pinned"):
            raise ValueError("kind = %r must be \"device\" or \"pinned\"" % (kind,))
        code = _lib.KMM_MEMORY_DEVICE if kind == "device" else _lib.KMM_MEMORY_PINNED
        raw = _items(_lib_.kmm_manager_memory_map, handle, _lib.KmmMapSegment, code)
        self.kind = kind
        self.segments = [
            Segment(s.chunk, s.address, s.bytes, STATES[s.state], s.buffer, s.requested) for s in raw
        ]
        self.svg = figure_svg(handle, "device_map" if kind == "device" else "pinned_map")

    @property
    def free_bytes(self):
        return sum(s.bytes for s in self.segments if s.state == "free")

    @property
    def largest_free(self):
        return max((s.bytes for s in self.segments if s.state == "free"), default=0)

    @property
    def fragmentation(self):
        """1 - largest free block / free bytes (0 when the free space is one block or none)."""
        free = self.free_bytes
        return 0.0 if free == 0 else 1.0 - self.largest_free / free

    def __repr__(self):
        chunks = sum(1 for s in self.segments if s.address == s.chunk)  # a chunk's first segment
        return "<MemoryMap %s: %d chunks, %d segments, %d bytes free (largest %d)>" % (
            self.kind, chunks, len(self.segments), self.free_bytes, self.largest_free)

    def _repr_svg_(self):
        return self.svg


class MemoryTrace:
    """The records of a manager's ring trace, oldest first, and how many older ones the ring
    let go (`dropped`). Shows as a memory timeline in Jupyter."""

    def __init__(self, handle):
        """`handle`: a manager's handle (`Manager.trace()` passes it)."""
        handle = _args.handle(handle)
        dropped = ctypes.c_uint64()
        raw = _items(_lib_.kmm_manager_trace_records, handle, _lib.KmmTraceRecord, tail=(ctypes.byref(dropped),))
        self.dropped = dropped.value
        self.records = [
            Record(
                r.time_ns, r.thread, ACTIONS[r.action] if r.action < len(ACTIONS) else r.action,
                "device" if r.kind == 0 else "pinned", r.address, r.bytes, r.stream, r.buffer,
                r.moved_from, r.status, r.in_use, None if r.reserved == _args.U64_MAX else r.reserved)
            for r in raw
        ]
        self.svg = figure_svg(handle, "timeline")

    def __len__(self):
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __repr__(self):
        return "<MemoryTrace: %d records, %d dropped>" % (len(self.records), self.dropped)

    def _repr_svg_(self):
        return self.svg


class MemoryStatus:
    """A manager's memory at one moment: the counters (`device`, `pinned`: dicts), the readable
    table (`text`, its str) and the figures (device map, pinned map when pinned buffers or
    pool chunks exist, timeline when a ring trace exists; `svg`). Jupyter shows table and figures."""

    def __init__(self, manager):
        from .manager import Manager

        if not isinstance(manager, Manager):
            raise TypeError("manager = %r must be a kmm.Manager" % (manager,))
        self.device = manager.stats("device")
        self.pinned = manager.stats("pinned")
        self.text = manager.summary().rstrip()
        self.svg = figure_svg(manager._live(), "overview")

    def __str__(self):
        return self.text

    def __repr__(self):
        return self.text

    def _repr_svg_(self):
        return self.svg

    def _repr_html_(self):
        return "<pre>%s</pre>%s" % (html.escape(self.text), self.svg)


def trace_start(handle, capacity, path, rmm_only):
    handle = _args.handle(handle)
    flags = _lib.KMM_TRACE_RMM_ONLY if _args.flag(rmm_only, "rmm_only") else 0
    capacity = _args.integer(capacity, "capacity", 0, _lib.KMM_TRACE_MAX_RECORDS)
    if path is None:
        if rmm_only:
            raise ValueError("rmm_only applies to a file trace only; give a path")
        check(_lib_.kmm_manager_trace_start(handle, capacity, None, 0))
    else:
        if capacity:
            raise ValueError("capacity = %r applies to a ring trace only; a file trace has no capacity" % (capacity,))
        check(_lib_.kmm_manager_trace_start(handle, 0, _path(path), flags))


def save_trace(handle, path, rmm_only):
    handle = _args.handle(handle)
    flags = _lib.KMM_TRACE_RMM_ONLY if _args.flag(rmm_only, "rmm_only") else 0
    check(_lib_.kmm_manager_trace_save(handle, _path(path), flags))


def _path(path):
    import os

    try:
        text = os.fsencode(path)
    except TypeError:
        raise TypeError("path = %r must be a str, bytes or os.PathLike" % (path,)) from None
    if not text:
        raise ValueError("path is empty")
    if b"\0" in text:
        raise ValueError("path contains a NUL byte")
    return text
