"""Loads libkmm and applies the raw ctypes declarations of its C ABI to it.

The declarations themselves (constants, enum values, Structures, every function's restype and
argtypes) are generated from gen/kmm.h into `_capi.py` (`python3 gen/python_generator.py`) and
re-exported here, so `from kmm._lib import KMM_MEMORY_DEVICE` and `_lib.KmmConfig` keep working.
This module is hand-written: the library search, the ABI check, and the few deliberate departures
from the header's argument types (VOID_POINTER_ARGS). Nothing here raises Kmm errors or wraps
handles; the idiomatic layer (manager.py, buffer.py, ...) does that. `tests/test_lib.py` and
`tests/test_generated_bindings.py` check these declarations against the header.
"""

import ctypes
import os
from ctypes import c_void_p

from . import _capi
from ._capi import *  # noqa: F401,F403 (the generated declarations are this module's names too)

#: The ABI version of the header these declarations follow (KMM_ABI_VERSION in gen/kmm.h).
ABI_VERSION = _capi.KMM_ABI_VERSION

#: Status code -> name ("KMM_ERROR_OUT_OF_MEMORY"), the header's KmmStatus enum.
STATUS = _capi.ENUMS["KmmStatus"]

#: Typed pointer arguments declared c_void_p instead (the same ABI), by function and position: the
#: plugin fast path passes kmm_plugin_alloc the addresses of a preallocated scratch array as ints.
VOID_POINTER_ARGS = {"kmm_plugin_alloc": (4, 5)}


def _declarations():
    """_capi.FUNCTIONS with VOID_POINTER_ARGS applied (a fresh argtypes list per function)."""
    table = {}
    for name, (restype, argtypes) in _capi.FUNCTIONS.items():
        argtypes = list(argtypes)
        for i in VOID_POINTER_ARGS.get(name, ()):
            if not issubclass(argtypes[i], ctypes._Pointer):  # the header changed under us
                raise ImportError("kmm: VOID_POINTER_ARGS: argument %d of %s is %s, not a pointer"
                                  % (i, name, argtypes[i].__name__))
            argtypes[i] = c_void_p
        table[name] = (restype, argtypes)
    return table


#: name -> (restype, argtypes), in the header's order (_capi.FUNCTIONS with VOID_POINTER_ARGS).
FUNCTIONS = _declarations()


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
        if os.path.isfile(path):
            return path
        tried.append(path)
    if os.environ.get("KMM_LIBRARY"):
        raise ImportError(
            "kmm: KMM_LIBRARY=%s names no file (when it is set, nothing else is tried): point it at a "
            "libkmm.so, or unset it to use the bundled or locally built library" % os.environ["KMM_LIBRARY"])
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
