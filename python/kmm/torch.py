"""PyTorch allocator backed by Kmm, through `torch.cuda.memory.CUDAPluggableAllocator`.

    import torch, kmm.torch
    torch.cuda.memory.change_current_allocator(kmm.torch.allocator())   # before any CUDA tensor

libkmm exports the two functions PyTorch loads: `kmm_torch_malloc(size, device, stream)` and
`kmm_torch_free(ptr, size, device, stream)`. Each device gets a default Kmm manager
(`manager(device)`), and the pointer -> buffer map lives in libkmm. Allocations are ready for
work on the stream PyTorch passes; frees are ordered after the work queued on it.

Out of memory: PyTorch does not check the pointer its allocator returns, so by default
`kmm_torch_malloc` prints the error to stderr and aborts the process (after Kmm has already
synchronized and returned its cached memory once). `allocator(on_oom="null")` returns NULL
instead, for PyTorch builds that check it.
"""

import ctypes

from . import _args, _lib
from ._errors import check
from .manager import Manager

__all__ = ["allocator", "manager", "set_oom_policy", "live_allocations", "library_path"]

_POLICIES = {"abort": _lib.KMM_TORCH_OOM_ABORT, "null": _lib.KMM_TORCH_OOM_NULL}
_allocator = None

#: The shared library holding kmm_torch_malloc / kmm_torch_free.
library_path = _lib.path


def set_oom_policy(on_oom):
    """"abort" (default: message and abort, since PyTorch would use NULL) or "null"."""
    if not isinstance(on_oom, str):
        # (A list reached the table's lookup: "unhashable type", naming neither.)
        raise TypeError("on_oom = %r must be \"abort\" or \"null\" (got %s)" % (on_oom, type(on_oom).__name__))
    try:
        code = _POLICIES[on_oom]
    except KeyError:
        raise ValueError("on_oom = %r must be \"abort\" or \"null\"" % (on_oom,)) from None
    check(_lib.lib.kmm_torch_set_oom_policy(code))


def allocator(on_oom="abort"):
    """The `CUDAPluggableAllocator` to pass to `torch.cuda.memory.change_current_allocator`
    (one object per process: PyTorch accepts one allocator change before the first CUDA
    allocation)."""
    global _allocator
    set_oom_policy(on_oom)
    if _allocator is None:
        import torch

        _allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path, "kmm_torch_malloc", "kmm_torch_free")
    return _allocator


def manager(device=0):
    """The Kmm manager serving PyTorch on `device` (owned by libkmm; `close()` does nothing)."""
    out = ctypes.c_uint64()
    check(_lib.lib.kmm_torch_manager(_args.device(device), ctypes.byref(out)))
    return Manager._borrow(out.value)


def record_stream(tensor, stream):
    """`tensor.record_stream(stream)` for a tensor whose memory came from Kmm's allocator: its
    free, and any move or trim of its memory, then waits for the work queued on `stream`
    (a `torch.cuda.Stream` or a raw `cudaStream_t` as an int). PyTorch's Python
    `CUDAPluggableAllocator` registers no record-stream function, so `Tensor.record_stream`
    itself does nothing with a pluggable allocator: call this instead."""
    raw = _args.stream(getattr(stream, "cuda_stream", stream))
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    check(_lib.lib.kmm_torch_record_stream(ctypes.c_void_p(storage.data_ptr()), ctypes.c_void_p(raw)))


def live_allocations():
    """How many PyTorch allocations through Kmm are live."""
    out = ctypes.c_uint64()
    check(_lib.lib.kmm_torch_live_allocations(ctypes.byref(out)))
    return out.value
