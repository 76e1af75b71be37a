"""Adversarial round 14 (host backend): NumPy subclasses whose shape or dtype lie to asarray,
float and str subclasses with an `__index__`, a default `copy_from` that cut the copy short,
structured dtypes and versions through `__cuda_array_interface__`, `from_dlpack` given another
device's manager or no producer, and the observe classes' arguments. Each test failed on the code
before the fix it names."""

import decimal
import fractions
import os
import subprocess
import sys

import numpy as np
import pytest

import kmm
from kmm import observe
from conftest import expect_named


@pytest.fixture
def manager():
    m = kmm.Manager(backend="host")
    yield m
    m.close()


class LyingShape(np.ndarray):
    shape = property(lambda self: (16,))


class LyingDtype(np.ndarray):
    dtype = property(lambda self: np.dtype("V32"))


@pytest.mark.parametrize("cls", [LyingShape, LyingDtype])
def test_asarray_reads_a_subclass_by_its_memory_not_its_properties(manager, cls):
    # The array took the claimed 128 bytes and copied the real 32: the rest was a freed buffer's.
    old = manager.alloc(128)
    old.fill(b"\xab")
    old.close()
    manager.synchronize()
    host = np.arange(4, dtype=np.float64)
    a = manager.asarray(host.view(cls))
    assert a.shape == (4,) and a.dtype == np.float64 and a.nbytes == 32
    assert np.array_equal(a.get(), host)
    b = kmm.asarray(host.view(cls), manager=manager)
    assert np.array_equal(b.get(), host)


def with_index(base, value=8):
    """A subclass of `base` whose `__index__` says `value`: still not an integer."""
    return type(base.__name__ + "WithIndex", (base,), {"__index__": lambda self: value})


F, S, B, C, FloatArray = (with_index(t) for t in (float, str, bytes, complex, np.ndarray))
Dec, Frac = with_index(decimal.Decimal, 3), with_index(fractions.Fraction, 3)


@pytest.mark.parametrize("value", [F(3.0), S("x"), B(b"x"), C(1j), np.float64(3.0), Dec("3.5"), Frac(7, 2),
                                   np.array(3.0).view(FloatArray)])
def test_float_and_str_subclasses_are_not_integers(manager, value):
    # alloc(F(3.0)) allocated 8 bytes (what __index__ said) while alloc(3.0) was refused.
    expect_named(TypeError, "nbytes", manager.alloc, value)
    expect_named(TypeError, "shape", manager.empty, value)
    b = manager.alloc(16)
    expect_named(TypeError, "nbytes", b.copy_to_host, nbytes=value)
    expect_named(TypeError, "device", kmm.Manager, backend="host", device=value)


def test_copy_from_by_default_copies_the_whole_source_or_refuses(manager):
    # The default nbytes was min(the room here, the source's rest): 64 bytes into 32 copied 32.
    src = manager.alloc(64)
    src.fill(b"\x11")
    small = manager.alloc(32)
    small.fill(b"\x00")
    expect_named(IndexError, "outside the buffer of 32 bytes", small.copy_from, src)
    expect_named(IndexError, "outside the buffer of 0 bytes", manager.alloc(0).copy_from, src)
    manager.synchronize()
    assert small.copy_to_host() == b"\x00" * 32, "the refused copy wrote nothing"
    small.copy_from(src, src_offset=32)  # the source's rest fits
    assert small.copy_to_host() == b"\x11" * 32
    big = manager.alloc(128)
    big.fill(b"\x00")
    big.copy_from(src, dst_offset=8)
    assert big.copy_to_host() == b"\x00" * 8 + b"\x11" * 64 + b"\x00" * 56


def test_a_structured_dtype_goes_through_cai_with_its_fields(manager):
    # The dict's descr was [('', '|V12')]: the import got raw bytes, not the record type.
    dt = np.dtype([("a", "<i4"), ("b", "<f8")])
    host = np.array([(1, 0.5), (2, 1.5)], dtype=dt)
    a = manager.asarray(host)
    cai = a.__cuda_array_interface__
    assert cai["descr"] == host.__array_interface__["descr"]
    back = kmm.from_cuda_array_interface(a, manager=manager)
    assert back.dtype == dt
    assert np.array_equal(back.get(), host)
    # A padded (aligned) record type too: its descr names the padding.
    aligned = np.dtype([("a", "u1"), ("b", "<f8")], align=True)
    x = manager.asarray(np.zeros(3, dtype=aligned))
    assert kmm.from_cuda_array_interface(x, manager=manager).dtype == aligned
    # Records NumPy gives no descr for (fields out of order, or overlapping) export as one
    # unnamed field of their bytes: the export raised ValueError once descr came from NumPy.
    odd = np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i4"], "offsets": [4, 0]})
    y = manager.empty((3,), odd)
    assert y.__cuda_array_interface__["descr"] == [("", "|V8")]
    assert kmm.from_cuda_array_interface(y, manager=manager).dtype == np.dtype("V8")
    # A plain type's descr given as lists or tuples (JSON-minded producers) is that type.
    f4 = manager.asarray(np.arange(4, dtype=np.float32))
    for descr in ([["", "<f4"]], (("", "<f4"),), [("", "<f4")]):
        got = kmm.from_cuda_array_interface(dict(f4.__cuda_array_interface__, descr=descr), manager=manager)
        assert got.dtype == np.float32 and np.array_equal(got.get(), np.arange(4, dtype=np.float32))
    # A descr that contradicts the typestr is refused, not one of them believed.
    f = manager.asarray(np.zeros(4, np.float32))
    bad = dict(f.__cuda_array_interface__, descr=[("", "<i4")])
    expect_named(ValueError, "contradicts typestr", kmm.from_cuda_array_interface, bad, manager=manager)
    bad = dict(f.__cuda_array_interface__, descr=[("", "<f8")])
    expect_named(ValueError, "contradicts typestr", kmm.from_cuda_array_interface, bad, manager=manager)


def test_the_cai_version_is_checked(manager):
    # Dicts without a version, or with 4, 99, -1, "3", True or None, were all imported.
    a = manager.asarray(np.zeros(4, np.float32))
    good = a.__cuda_array_interface__
    no_version = {k: v for k, v in good.items() if k != "version"}
    expect_named(ValueError, "'version'", kmm.from_cuda_array_interface, no_version, manager=manager)
    for bad, error in [(4, kmm.KmmError), (99, kmm.KmmError), (-1, kmm.KmmError), ("3", TypeError), (True, TypeError), (None, TypeError)]:
        expect_named(error, "version", kmm.from_cuda_array_interface, dict(good, version=bad), manager=manager)
    # Version 2 has no stream field: a "stream" key there is no part of the dict (a forged stream
    # would be refused if it were read).
    v2 = dict(good, version=2, stream=0xDEAD0000)
    assert np.array_equal(kmm.from_cuda_array_interface(v2, manager=manager).get(), np.zeros(4, np.float32))
    expect_named(kmm.KmmError, "stream", kmm.from_cuda_array_interface, dict(good, stream=0xDEAD0000), manager=manager)


def test_from_dlpack_names_what_is_not_a_producer(manager):
    # from_dlpack(5) raised "BufferError: not a live DLPack capsule (already consumed?)".
    for obj in (5, None, [1, 2], "tensor"):
        expect_named(TypeError, "obj = ", kmm.from_dlpack, obj, manager=manager)


def test_from_dlpack_refuses_another_devices_manager():
    # asarray and the CAI import refused a manager of another device; from_dlpack took it, and
    # the import said device 1 for memory of device 0 (host stand-in devices).
    code = """
import numpy as np, kmm
m0, m1 = kmm.Manager(backend="host", device=0), kmm.Manager(backend="host", device=1)
a = m0.asarray(np.arange(4.0))
try:
    kmm.from_dlpack(a, manager=m1)
    print("ACCEPTED")
except ValueError as e:
    print("REFUSED", e)
print("SAME DEVICE", kmm.from_dlpack(a, manager=m0).device)
"""
    env = dict(os.environ, KMM_HOST_DEVICES="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(kmm.__file__)), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "REFUSED manager = " in out.stdout and "device 0" in out.stdout, out.stdout
    assert "SAME DEVICE 0" in out.stdout, out.stdout


def test_the_observe_classes_check_their_arguments(manager):
    # MemoryMap(h, "foo") drew the pinned map labelled "foo"; MemoryMap(1.5, ...) raised a bare
    # ctypes ArgumentError; MemoryStatus(None) an AttributeError.
    for kind in ("foo", 7, "DEVICE"):
        expect_named(ValueError, "kind", observe.MemoryMap, manager.handle, kind)
    expect_named(TypeError, "handle", observe.MemoryMap, 1.5, "device")
    expect_named(TypeError, "manager", observe.MemoryStatus, None)
    assert observe.MemoryMap(manager.handle, "device").kind == "device"


def test_an_integer_kind_is_its_documented_code(manager):
    # Codes 0 and 1 are documented now; any other integer names the names and the codes.
    assert manager.alloc(8, kind=1).kind == "pinned"
    expect_named(ValueError, "or its code: 0 or 1", manager.alloc, 8, kind=2)
