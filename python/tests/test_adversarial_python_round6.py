"""Round 6 of the adversarial tests of the Python binding (host backend). Each test fails on the
code it was written against (de09b4f), for the defect its docstring names."""

import pickle

import numpy as np
import pytest

import kmm
from conftest import BACKEND, fresh_interpreter as _run
from _gc_scripts import KIND, run as run_script

MiB = 1 << 20




# -- exports and garbage collection: __del__ ignores live exports -------------------------------

def test_gc_of_a_buffer_in_a_cycle_does_not_free_memory_its_host_view_still_shows():
    """A `host_view()` memoryview "holds the memory" (docs/python.md), and `Buffer.close()`
    honours it, but `Buffer.__del__` frees the handle regardless of `_exports`. When the view
    and the buffer become cyclic garbage together with an object whose finalizer still uses the
    view, the cyclic collector runs `Buffer.__del__` first: the memory goes back to the pool while
    the view is live, the next allocation gets the same address, and writes through the view land
    in that new buffer (memory corruption / use after free)."""
    r = _run("""
        import gc, numpy as np, kmm
        m = kmm.Manager(backend=%r)
        b = m.alloc(1 << 20)
        addr = b.ptr
        mv = b.host_view()
        out = {}
        class Holder:
            def __del__(self):
                m.synchronize()
                nb = m.alloc(1 << 20)
                nb.copy_from_host(np.zeros(1 << 20, np.uint8))
                out["same_address"] = nb.ptr == addr
                self.mv[:4] = b"\\xab\\xab\\xab\\xab"     # through the live export
                out["new_buffer"] = bytes(nb.copy_to_host(nbytes=4))
                out["keep"] = nb
        h = Holder(); h.me = h; h.mv = mv
        del b, mv, h
        gc.collect()
        print("same_address", out["same_address"])
        print("new_buffer", out["new_buffer"])
    """ % BACKEND)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "same_address False" in r.stdout, "a freed address was handed out while its export lived:\n" + r.stdout
    assert "new_buffer b'\\x00\\x00\\x00\\x00'" in r.stdout, "a write through a live export corrupted another buffer:\n" + r.stdout


def test_gc_of_a_manager_in_a_cycle_does_not_destroy_memory_a_host_view_still_shows():
    """As above for the manager: `Manager.__del__` destroys the manager (and with it all its
    memory) even while `_exports` counts live exports. A finalizer of the same cyclic garbage that
    still writes through the view then writes into unmapped memory: the interpreter dies with
    SIGSEGV (crash)."""
    r = _run("""
        import gc, time, kmm
        m = kmm.Manager(backend=%r)
        b = m.alloc(16 << 20)
        mv = b.host_view()
        class Holder:
            def __del__(self):
                time.sleep(0.3)          # the deferred teardown runs on a background thread
                self.mv[:] = b"\\xab" * len(self.mv)
                print("wrote", flush=True)
        h = Holder(); h.me = h; h.mv = mv
        del m, b, mv, h
        gc.collect()
        print("survived", flush=True)
    """ % BACKEND)
    assert r.returncode == 0 and "survived" in r.stdout, (
        "exit status %d (a write through a live host_view after the collector destroyed its manager)\n%s"
        % (r.returncode, r.stderr[-2000:]))


# -- DeviceArray.set: signedness wrap ------------------------------------------------------------

@pytest.mark.parametrize("src, dst, value", [
    (np.int8, np.uint8, -128),
    (np.int32, np.uint32, -1),
    (np.int64, np.uint64, -(1 << 63)),
    (np.uint64, np.int64, (1 << 64) - 1),
    (np.uint16, np.int16, 65535),
])
def test_set_refuses_values_that_wrap_between_signed_and_unsigned_of_one_width(manager, src, dst, value):
    """`set` promises "integers must fit the array's type" (no wrap; "not -1 into uint8"). Its
    check casts to the target type and back and compares: between a signed and an unsigned type
    of the same width that round trip is the identity, so -1 (int32) is stored as 4294967295 in a
    uint32 array and 2^64 - 1 (uint64) as -1 in an int64 array (silent wrap)."""
    a = manager.empty(1, dst)
    a.set(np.zeros(1, dst))
    with pytest.raises(TypeError):
        a.set(np.array([value], src))
    assert a.get()[0] == 0, "the refused value was stored as %r" % (a.get()[0],)


def test_set_refuses_floats_that_overflow_to_inf(manager):
    """`set` refuses an integer that a float type would store as inf ("NumPy would store it as
    inf, with a warning only"), but a float64 beyond float32's range goes in as inf all the same
    (only NumPy's RuntimeWarning): the value changes silently. (Arguable: the docs also say floats
    are "rounded to their precision, as NumPy assigns".)"""
    a = manager.empty((), np.float32)
    a.set(np.float32(1))
    with pytest.raises((TypeError, ValueError)):
        a.set(np.float64(1e300))
    assert a.get() == 1


# -- aliasing: a copy between a buffer and its own host_view -------------------------------------

@pytest.mark.parametrize("direction", ["to_host", "to_device"])
def test_copies_between_a_buffer_and_its_own_host_view_are_not_silently_wrong(direction):
    """`Buffer.copy_from` refuses ranges of one buffer that overlap ("source range ... and
    destination range ... of one buffer overlap"), but `copy_to_host` into (or
    `copy_from_host` from) the buffer's own `host_view()` at a shifted range is accepted, and for
    staged device copies (here 64 KiB staging chunks, 1 and 8 MiB buffers) it leaves wrong bytes
    in most runs: neither memmove's result nor an error (pinned buffers give memmove's result).
    Silent data corruption."""
    m = kmm.Manager(backend=BACKEND, staging_chunk_size=1 << 16)
    wrong = []
    for n in (MiB, 8 * MiB):
        for shift in (1, 100, 70000):
            b = m.alloc(n)
            ref = (np.arange(n, dtype=np.uint32) % 251).astype(np.uint8)
            b.copy_from_host(ref)
            mv = b.host_view()
            expected = ref.copy()
            expected[shift:] = ref[:n - shift]
            try:
                if direction == "to_host":
                    b.copy_to_host(mv[shift:], offset=0, nbytes=n - shift)
                else:
                    b.copy_from_host(mv[:n - shift], offset=shift)
            except (ValueError, kmm.KmmError):
                assert bytes(mv) == ref.tobytes(), "a refused copy changed the buffer"
            else:
                bad = int((np.frombuffer(mv, np.uint8) != expected).sum())
                if bad:
                    wrong.append((n, shift, bad))
            del mv
            b.close()
    m.close()
    assert not wrong, "(size, shift, wrong bytes) after overlapping copies: %s" % wrong


# -- argument checks -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, False, {}, "", "device", 1.5, object()])
def test_manager_argument_must_be_a_manager(bad):
    """`manager=` of `kmm.empty`/`zeros`/`asarray`/`DeviceArray.empty`/`from_dlpack`/... is not
    checked: a falsy non-manager (0, False, {}, "") is taken for "no manager" and the array lands
    silently in the default manager; anything else fails deep inside with
    `AttributeError: 'str' object has no attribute '_local'` (no argument named)."""
    with pytest.raises(TypeError) as e:
        kmm.empty(4, manager=bad)
    assert "manager" in str(e.value)


def test_dlpack_export_stream_and_device_must_be_exact_integers(manager):
    """Every integer argument must be an int, "not a bool, float or string", but `__dlpack__`
    takes `stream=-1.0` for -1 (no ordering) and `dl_device=(1.0, 0)` or `(True, False)` for
    (kDLCPU, 0)."""
    a = manager.asarray(np.arange(4, dtype=np.float32))
    with pytest.raises(TypeError):
        a.__dlpack__(stream=-1.0)
    with pytest.raises(TypeError):
        a.__dlpack__(dl_device=(1.0, 0))
    with pytest.raises(TypeError):
        a.__dlpack__(dl_device=(True, False))


def test_cai_import_names_missing_and_mistyped_fields(manager):
    """`from_cuda_array_interface` with a dict lacking `typestr` raises a bare `KeyError:
    'typestr'`; `typestr=None` is read as float64 (`np.dtype(None)`) and imported; `data={}`
    raises `KeyError: 0`. A clear error naming the field is promised."""
    a = manager.asarray(np.arange(4, dtype=np.float32))
    base = {"shape": (4,), "typestr": "<f4", "data": (a.ptr, False), "version": 3}
    for field, value in (("typestr", None), ("data", {})):
        cai = dict(base, **{field: value})
        with pytest.raises((TypeError, ValueError)) as e:
            kmm.from_cuda_array_interface(cai, manager=manager)
        assert field in str(e.value), e.value
    cai = dict(base)
    del cai["typestr"]
    with pytest.raises((TypeError, ValueError)) as e:  # not a bare KeyError
        kmm.from_cuda_array_interface(cai, manager=manager)
    assert "typestr" in str(e.value)


def test_torch_oom_policy_names_the_argument():
    """`kmm.torch.set_oom_policy([])` (and `allocator(on_oom=[])`) raises `TypeError: unhashable
    type: 'list'`, naming neither `on_oom` nor the allowed values (torch is not needed)."""
    import kmm.torch as kt

    with pytest.raises((TypeError, ValueError)) as e:
        kt.set_oom_policy([])
    assert "on_oom" in str(e.value)


# -- errors: pickling ----------------------------------------------------------------------------

def test_kmm_errors_survive_pickling():
    """Kmm errors raised in a worker (multiprocessing, concurrent.futures) reach the parent by
    pickle. `KmmError.__init__` formats "NAME: message" into args, so an unpickled error gets
    "NAME: NAME: message" as its str and "NAME: message" as its `message`; a `KmmError` with an
    unknown status loses its `status` (None)."""
    m = kmm.Manager(backend=BACKEND)
    with pytest.raises(kmm.KmmError) as info:
        m.alloc(1 << 49)
    m.close()
    e = info.value
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is type(e)
    assert (str(e2), e2.message, e2.status, e2.name) == (str(e), e.message, e.status, e.name)
    u = kmm.KmmError("boom", 1234)
    u2 = pickle.loads(pickle.dumps(u))
    assert (str(u2), u2.message, u2.status) == (str(u), u.message, u.status)


def test_buffer_cannot_be_constructed_empty():
    """`kmm.Buffer()` (the public class, called as one would call `kmm.Manager()`) returns an
    object with no slots set: `repr`, `closed`, `ptr`, `len`, `close()` and `host_view()` then
    raise `AttributeError: 'Buffer' object has no attribute '_handle'` instead of a clear error
    at construction (use `Manager.alloc`)."""
    with pytest.raises(TypeError) as e:
        kmm.Buffer()
    assert "alloc" in str(e.value)


def test_a_host_view_a_finalizer_keeps_past_the_collection_keeps_its_memory():
    """A finalizer of cyclic garbage may store a `host_view` memoryview of the garbage somewhere
    that outlives the collection (a global here). The collector runs the finalizers of the view's
    export token with the others, before it knows what they kept: ending the export there freed
    the buffer while the kept view still showed it. The next allocation got the address, and
    writes through the kept view landed in the new buffer. The memory is freed once the kept view
    is dropped."""
    r = run_script("""
        import kmm
        #KEEP_AND_REUSE
        print("held", m.stats(KIND)["live_buffers"])
        del kept[:]
        gc.collect()
        print("after", m.stats(KIND)["live_buffers"])
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "same_address False" in r.stdout, "a freed address was handed out while a kept view showed it:\n" + r.stdout
    assert "new_buffer b'\\x00\\x00\\x00\\x00'" in r.stdout, "a write through a kept view corrupted another buffer:\n" + r.stdout
    assert "held 2" in r.stdout and "after 1" in r.stdout, "the kept view's buffer was not freed once dropped:\n" + r.stdout
