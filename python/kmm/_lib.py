"""Raw ctypes declarations of libkmm's C ABI, written from gen/kmm.h (one entry per function).

Nothing here raises Kmm errors or wraps handles; the idiomatic layer (manager.py, buffer.py, ...)
does that. `tests/test_lib.py` checks this table against the header: every `kmm_*` function is
declared and the Structure sizes match the header's structs.
"""

import ctypes
import os
from ctypes import POINTER, c_bool, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

#: The ABI version of the header these declarations follow (KMM_ABI_VERSION in gen/kmm.h).
ABI_VERSION = 2

KMM_MAX_BUFFER_BYTES = 1 << 48
KMM_FREE_FORCE = 1
KMM_DESTROY_DEFERRED = 1
KMM_TORCH_OOM_ABORT = 0
KMM_TORCH_OOM_NULL = 1
KMM_MAX_KERNEL_ARGS = 256
KMM_IPC_HANDLE_BYTES = 64
KMM_QMRI_SKIP_CHECKS = 1
KMM_ARG_BUFFER, KMM_ARG_I32, KMM_ARG_I64, KMM_ARG_F32, KMM_ARG_F64, KMM_ARG_U64 = 0, 1, 2, 3, 4, 5

KMM_OK = 0
STATUS = {
    0: "KMM_OK",
    1001: "KMM_ERROR_NULL_POINTER",
    1002: "KMM_ERROR_INVALID_ARGUMENT",
    1003: "KMM_ERROR_OUT_OF_RANGE",
    1004: "KMM_ERROR_SIZE_OVERFLOW",
    2001: "KMM_ERROR_INVALID_HANDLE",
    2002: "KMM_ERROR_BUFFER_MAPPED",
    2003: "KMM_ERROR_WRONG_KIND",
    3001: "KMM_ERROR_OUT_OF_MEMORY",
    4001: "KMM_ERROR_BACKEND_UNAVAILABLE",
    4002: "KMM_ERROR_BACKEND",
    4003: "KMM_ERROR_NOT_SUPPORTED",
    4004: "KMM_ERROR_COMPILE",
    9001: "KMM_ERROR_INTERNAL",
}

KMM_BACKEND_AUTO, KMM_BACKEND_HOST, KMM_BACKEND_CUDA = 0, 1, 2
KMM_ALLOC_POOL, KMM_ALLOC_CUDA_ASYNC, KMM_ALLOC_DIRECT = 0, 1, 2
KMM_SUBALLOC_BINNED, KMM_SUBALLOC_HEAP, KMM_SUBALLOC_FIXED, KMM_SUBALLOC_RING = 0, 1, 2, 3
KMM_MEMORY_DEVICE, KMM_MEMORY_PINNED = 0, 1
KMM_BORROW, KMM_ADOPT = 0, 1


class KmmBufferInfo(ctypes.Structure):
    _fields_ = [("bytes", c_uint64), ("kind", c_uint32), ("pins", c_uint32)]


class KmmConfig(ctypes.Structure):
    _fields_ = [
        ("backend", c_uint32),
        ("device", c_int32),
        ("alloc_mode", c_uint32),
        ("suballocator", c_uint32),
        ("alignment", c_uint64),
        ("chunk_size", c_uint64),
        ("initial_pool_size", c_uint64),
        ("fixed_block_size", c_uint64),
        ("hard_limit", c_uint64),
        ("release_threshold", c_uint64),
        ("pinned_chunk_size", c_uint64),
        ("pinned_limit", c_uint64),
        ("staging_chunk_size", c_uint64),
        ("staging_chunks", c_uint32),
        ("compaction_ratio_pct", c_uint32),
    ]


class KmmManagerInfo(ctypes.Structure):
    _fields_ = [
        ("backend", c_uint32),
        ("device", c_int32),
        ("alloc_mode", c_uint32),
        ("suballocator", c_uint32),
        ("stream", c_uint64),
    ]


class KmmMemoryStats(ctypes.Structure):
    _fields_ = [
        (name, c_uint64)
        for name in (
            "in_use", "peak_in_use", "reserved", "peak_reserved", "allocs", "frees",
            "failed_allocs", "live_buffers", "pool_hits", "pool_misses", "upstream_allocs",
            "upstream_frees", "largest_free_block", "compactions", "relocated_bytes",
        )
    ]


class KmmKernelArg(ctypes.Structure):
    _fields_ = [("kind", c_uint32), ("reserved", c_uint32), ("value", c_uint64), ("offset", c_uint64)]


_f32p = POINTER(ctypes.c_float)


class KmmFispSequence(ctypes.Structure):
    _fields_ = [
        ("flip_angle", _f32p), ("phase", _f32p), ("profile", _f32p),
        ("ntr", c_uint32), ("max_state", c_uint32), ("nprofile", c_uint32),
        ("tr", ctypes.c_float), ("te", ctypes.c_float), ("ti", ctypes.c_float),
    ]


class KmmPssfpSequence(ctypes.Structure):
    _fields_ = [
        ("flip_angle", _f32p), ("phase", _f32p), ("rf_shape", _f32p), ("z", _f32p),
        ("ntr", c_uint32), ("nrf", c_uint32), ("nz", c_uint32),
        ("dt_ex", ctypes.c_float), ("dt_inv", ctypes.c_float), ("dt_pr", ctypes.c_float),
        ("gz_ex", ctypes.c_float), ("gz_pr", ctypes.c_float),
    ]


class KmmMatchOutputs(ctypes.Structure):
    _fields_ = [("index", c_uint64), ("score", c_uint64), ("pd", c_uint64), ("params", c_uint64)]


STRUCTS = {
    "KmmMatchOutputs": KmmMatchOutputs,
    "KmmKernelArg": KmmKernelArg,
    "KmmFispSequence": KmmFispSequence,
    "KmmPssfpSequence": KmmPssfpSequence,
    "KmmBufferInfo": KmmBufferInfo,
    "KmmConfig": KmmConfig,
    "KmmManagerInfo": KmmManagerInfo,
    "KmmMemoryStats": KmmMemoryStats,
}

_u64p = POINTER(c_uint64)
S = c_uint32  # KmmStatus

#: name -> (restype, argtypes), in the header's order.
FUNCTIONS = {
    "kmm_version": (c_char_p, []),
    "kmm_abi_version": (c_uint32, []),
    "kmm_last_error": (c_char_p, []),
    "kmm_status_name": (c_char_p, [c_uint32]),
    "kmm_buffer_alloc": (S, [c_uint64, c_uint64, c_uint32, _u64p]),
    "kmm_buffer_wrap": (S, [c_uint64, c_void_p, c_uint64, c_uint32, c_uint32, _u64p]),
    "kmm_buffer_free": (S, [c_uint64, c_uint64, c_uint32]),
    "kmm_buffer_info": (S, [c_uint64, c_uint64, POINTER(KmmBufferInfo)]),
    "kmm_buffer_map": (S, [c_uint64, c_uint64, _u64p]),
    "kmm_buffer_unmap": (S, [c_uint64, c_uint64]),
    "kmm_host_register": (S, [c_uint64, c_void_p, c_uint64]),
    "kmm_host_unregister": (S, [c_uint64, c_void_p]),
    "kmm_copy_to_device": (S, [c_uint64, c_uint64, c_uint64, c_void_p, c_uint64]),
    "kmm_copy_to_device_async": (S, [c_uint64, c_uint64, c_uint64, c_void_p, c_uint64, _u64p]),
    "kmm_copy_to_host": (S, [c_uint64, c_void_p, c_uint64, c_uint64, c_uint64]),
    "kmm_copy_to_host_async": (S, [c_uint64, c_void_p, c_uint64, c_uint64, c_uint64, _u64p]),
    "kmm_copy_buffer": (S, [c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64]),
    "kmm_fill": (S, [c_uint64, c_uint64, c_uint64, c_uint64, c_void_p, c_size_t]),
    "kmm_config_default": (S, [POINTER(KmmConfig)]),
    "kmm_manager_create": (S, [POINTER(KmmConfig), _u64p]),
    "kmm_manager_destroy": (S, [c_uint64, c_uint32]),
    "kmm_manager_synchronize": (S, [c_uint64]),
    "kmm_manager_info": (S, [c_uint64, POINTER(KmmManagerInfo)]),
    "kmm_manager_stats": (S, [c_uint64, c_uint32, POINTER(KmmMemoryStats)]),
    "kmm_manager_reset_peaks": (S, [c_uint64]),
    "kmm_manager_trim": (S, [c_uint64, c_uint64]),
    "kmm_manager_summary": (S, [c_uint64, c_char_p, c_size_t, POINTER(c_size_t)]),
    "kmm_manager_memory_info": (S, [c_uint64, _u64p, _u64p]),
    "kmm_manager_wait_stream": (S, [c_uint64, c_uint64]),
    "kmm_manager_signal_stream": (S, [c_uint64, c_uint64]),
    "kmm_manager_record_event": (S, [c_uint64, _u64p]),
    "kmm_event_query": (S, [c_uint64, c_uint64, POINTER(c_bool)]),
    "kmm_event_wait": (S, [c_uint64, c_uint64]),
    "kmm_event_destroy": (S, [c_uint64, c_uint64]),
    # Run-time CUDA modules and qMRI kernels (declared raw; not wrapped by the Python package yet).
    "kmm_module_compile": (S, [c_uint64, c_char_p, POINTER(c_char_p), c_uint32, _u64p]),
    "kmm_module_launch": (S, [c_uint64, c_uint64, c_char_p, POINTER(c_uint32), POINTER(c_uint32), c_uint32,
                              POINTER(KmmKernelArg), c_uint32]),
    "kmm_module_destroy": (S, [c_uint64]),
    "kmm_qmri_simulate_fisp": (S, [c_uint64, POINTER(KmmFispSequence), c_uint64, c_uint64, c_uint64, c_uint64,
                                   c_uint32]),
    "kmm_qmri_simulate_pssfp": (S, [c_uint64, POINTER(KmmPssfpSequence), c_uint64, c_uint64, c_uint64,
                                    c_uint64, c_uint32]),
    "kmm_qmri_match": (S, [c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint32,
                           c_uint64, POINTER(KmmMatchOutputs), c_uint32]),
    "kmm_buffer_record_stream": (S, [c_uint64, c_uint64, c_uint64]),
    # Plugins (rust/kmm/src/ffi/plugin.rs and by_address.rs). Out-pointers as c_void_p so callers can pass the
    # address of a preallocated scratch array as a plain int (the allocation fast path).
    "kmm_plugin_alloc": (S, [c_uint64, c_uint64, c_uint32, c_uint64, c_void_p, c_void_p]),
    "kmm_plugin_free": (S, [c_uint64, c_uint64, c_uint64]),
    "kmm_last_status": (c_uint32, []),
    "kmm_plugin_malloc": (c_uint64, [c_uint64, c_uint64, c_uint64]),
    "kmm_plugin_free_address": (S, [c_uint64, c_uint64, c_uint64]),
    "kmm_buffer_ipc_handle": (S, [c_uint64, c_uint64, c_void_p, _u64p]),
    "kmm_torch_manager": (S, [c_int32, _u64p]),
    "kmm_torch_set_oom_policy": (S, [c_uint32]),
    "kmm_torch_malloc": (c_void_p, [c_size_t, c_int32, c_void_p]),
    "kmm_torch_free": (None, [c_void_p, c_size_t, c_int32, c_void_p]),
    "kmm_torch_record_stream": (S, [c_void_p, c_void_p]),
    "kmm_torch_live_allocations": (S, [_u64p]),
    "kmm_cupy_set_manager": (S, [c_int32, c_uint64]),
    "kmm_cupy_set_stream_source": (S, [c_void_p, c_void_p]),
    "kmm_cupy_malloc": (c_void_p, [c_void_p, c_size_t, c_int32]),
    "kmm_cupy_free": (None, [c_void_p, c_void_p, c_int32]),
    "kmm_cupy_live_allocations": (S, [_u64p]),
}


#: Functions of the header that the loaded library lacks (an older build of libkmm).
MISSING = set()


def _candidates():
    env = os.environ.get("KMM_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libkmm.so")
    root = os.path.dirname(os.path.dirname(here))
    for profile in ("release", "debug"):
        yield os.path.join(root, "rust", "target", profile, "libkmm.so")


def find_library():
    """The path of libkmm: $KMM_LIBRARY, the bundled kmm/libkmm.so, or a source checkout's build."""
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            return path
        tried.append(path)
    raise ImportError(
        "kmm: cannot find libkmm.so (tried: %s). Set KMM_LIBRARY, install the wheel, or run "
        "`cargo build --release --manifest-path rust/Cargo.toml -p kmm`" % ", ".join(tried)
    )


def load(path=None):
    path = path or find_library()
    lib = ctypes.CDLL(path)
    MISSING.clear()
    for name, (restype, argtypes) in FUNCTIONS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:  # an older libkmm: the function fails when called
            MISSING.add(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    found = lib.kmm_abi_version()
    if found != ABI_VERSION:
        raise ImportError(
            "kmm: %s has ABI version %d but this package was written for %d; rebuild libkmm or "
            "reinstall kmm" % (path, found, ABI_VERSION)
        )
    return lib, path


def address_of(fn):
    """The address of one of `lib`'s functions, for code that calls it from C."""
    return ctypes.cast(fn, c_void_p).value


lib, path = load()
