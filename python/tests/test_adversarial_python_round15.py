"""Adversarial round 15 (host backend): the observe module's raw handles and figure names, the
memory kind of a kmm pinned buffer imported through `__cuda_array_interface__`, `DeviceArray.set`
storing values into arrays of another family (floats into str, bytes and void), and what
`live_managers` counts. Each test failed on the code before the fix it names, except
MemoryMap's cases (checked since round 14, here beside the others), another library's CAI
producer and the values `set` still stores, which keep the fixes from reaching too far."""

import gc
import time

import numpy as np
import pytest

import kmm
from kmm import observe
from conftest import expect_named


def observe_calls(tmp_path):
    """Every public entry point of kmm.observe that takes a raw manager handle, as fn(handle)."""
    return {
        "MemoryTrace": observe.MemoryTrace,
        "MemoryMap": lambda h: observe.MemoryMap(h, "device"),
        "figure_svg": lambda h: observe.figure_svg(h, "timeline"),
        "trace_start": lambda h: observe.trace_start(h, 0, None, False),
        "save_trace": lambda h: observe.save_trace(h, tmp_path / "trace.csv", False),
    }


@pytest.mark.parametrize("call", ["MemoryTrace", "MemoryMap", "figure_svg", "trace_start", "save_trace"])
def test_observe_refuses_a_handle_past_uint64_instead_of_wrapping_it(manager, tmp_path, call):
    # MemoryTrace(m.handle + 2**64) read m's trace (ctypes passes the handle modulo 2^64), and
    # figure_svg drew m's timeline; trace_start and save_trace would start or save m's trace.
    fn = observe_calls(tmp_path)[call]
    if call != "trace_start":
        manager.trace_start()
        manager.alloc(64)
    before = len(manager.trace()) if call != "trace_start" else None
    e = expect_named(kmm.InvalidArgumentError, "handle", fn, manager.handle + 2**64)
    assert "2^64 - 1" in str(e)
    if call == "trace_start":
        with pytest.raises(kmm.InvalidArgumentError, match="no ring trace"):
            manager.trace()  # none was started
    else:
        assert len(manager.trace()) == before
    assert not (tmp_path / "trace.csv").exists()


@pytest.mark.parametrize("call", ["MemoryTrace", "MemoryMap", "figure_svg", "trace_start", "save_trace"])
@pytest.mark.parametrize("handle", [1.5, "x", True, None])
def test_observe_names_a_handle_that_is_no_integer(manager, tmp_path, call, handle):
    # A float or str gave a bare ctypes.ArgumentError ("argument 1: TypeError: wrong type").
    expect_named(TypeError, "handle", observe_calls(tmp_path)[call], handle)


@pytest.mark.parametrize("figure", ["nope", "", ["timeline"], 2, None])
def test_figure_svg_names_an_unknown_figure(manager, figure):
    # figure_svg(h, "nope") raised a bare KeyError('nope'), a list an unhashable-type TypeError.
    e = expect_named(ValueError, "figure", observe.figure_svg, manager.handle, figure)
    assert '"timeline"' in str(e) and '"overview"' in str(e)
    assert observe.figure_svg(manager.handle, "overview").startswith("<svg")


def counts(manager):
    return {kind: (s["in_use"], s["live_buffers"]) for kind, s in manager.stats().items()}


@pytest.mark.parametrize("how", ["asarray", "array", "buffer", "dict"])
def test_a_kmm_pinned_buffer_imported_through_cai_stays_pinned(manager, how):
    # The import was wrapped as device memory: its kind said device, the device counters held
    # its bytes and the trace recorded a device wrap.
    source = manager.empty(256, "float32", kind="pinned")
    source.set(np.arange(256, dtype=np.float32))
    manager.trace_start()
    before = counts(manager)
    if how == "asarray":
        a = kmm.asarray(source.buffer, manager=manager)
    elif how == "array":
        a = kmm.DeviceArray.from_cuda_array_interface(source, manager=manager)
    elif how == "buffer":
        a = kmm.from_cuda_array_interface(source.buffer, manager=manager)
    else:
        a = kmm.from_cuda_array_interface(source.__cuda_array_interface__, manager=manager)
    assert a.buffer.kind == "pinned" and a.buffer.info()["kind"] == "pinned"
    after = counts(manager)
    assert after["device"] == before["device"]
    assert after["pinned"] == (before["pinned"][0] + 1024, before["pinned"][1] + 1)
    assert [(r.action, r.kind, r.bytes) for r in manager.trace()] == [("wrap", "pinned", 1024)]
    assert "pinned" in repr(a)
    assert np.array_equal(a.get().view(np.float32), np.arange(256, dtype=np.float32))


def test_asarray_of_a_pinned_buffer_takes_kind_pinned_and_names_the_pinned_kind(manager):
    # kind="pinned" was refused ("a view of device memory") and kind="device" accepted.
    pb = manager.alloc(4096, kind="pinned")
    assert kmm.asarray(pb, manager=manager, kind="pinned").buffer.kind == "pinned"
    manager.trace_start()
    before = counts(manager)
    e = expect_named(ValueError, "kind", kmm.asarray, pb, manager=manager, kind="device")
    assert "pinned memory" in str(e)
    assert counts(manager) == before and len(manager.trace()) == 0  # nothing imported


def test_other_cai_producers_stay_device_memory(manager):
    # As documented: CAI names no kind, so only kmm's own buffers carry theirs.
    class Foreign:
        def __init__(self, cai):
            self.__cuda_array_interface__ = cai

    pinned = manager.empty(16, "float32", kind="pinned")
    device = manager.empty(16, "float32")
    assert kmm.asarray(Foreign(pinned.__cuda_array_interface__), manager=manager).buffer.kind == "device"
    assert kmm.from_cuda_array_interface(device, manager=manager).buffer.kind == "device"
    expect_named(ValueError, "kind", kmm.asarray, Foreign(pinned.__cuda_array_interface__),
                 manager=manager, kind="pinned")


@pytest.mark.parametrize("dst, host", [
    ("U32", np.array([0.1, 1e300])),             # stored as the text '0.1', '1e+300'
    ("S32", np.array([0.1, 1e300])),
    ("V8", np.array([0.1, 1e300])),              # stored as the floats' bits
    ("U32", np.array([1, 2], np.int64)),
    ("S32", np.array([7, 8], np.uint64)),
    ("U8", np.array([True, False])),
    ("V8", np.array([1, 2], np.int64)),
    ("U32", np.array([1.5, 2], np.float16)),
    ("m8[s]", np.array([5, 6], np.int64)),       # a count read in the array's unit
    ("m8[s]", np.array([True, False])),
    ("V1", np.array([b"a", b"b"], "S1")),        # text into raw bytes
])
def test_set_stores_no_value_into_an_array_of_another_family(manager, dst, host):
    a = manager.empty(2, dst)
    a.buffer.fill(b"\x5a")
    kept = a.get()
    e = expect_named(TypeError, "host", a.set, host)
    assert "arrays only" in str(e)
    assert a.get().tobytes() == kept.tobytes()  # nothing stored


@pytest.mark.parametrize("dst, host", [
    ("float32", np.array([True, False])),
    ("int8", np.array([True, False])),
    ("bool", np.array([0, 1], np.int64)),
    ("float64", np.array([1, 2], np.int64)),
    ("complex64", np.array([1.5, 2.5], np.float32)),
    ("complex64", np.array([1 + 2j, 3j], np.complex128)),
    ("U4", np.array([b"ab", b"c"], "S2")),
    ("S4", np.array([b"ab", b"c"], "S2")),
])
def test_set_still_stores_values_of_the_arrays_own_family(manager, dst, host):
    a = manager.empty(2, dst)
    a.set(host)
    assert a.get().tolist() == host.astype(dst).tolist()


def test_live_managers_counts_a_closed_manager_until_its_teardown_as_documented():
    # The docstring said "created and not yet closed"; libkmm counts managers not yet torn down,
    # and a closed manager whose buffer a host_view still shows is torn down at its end.
    doc = kmm.live_managers.__doc__
    assert "torn down" in doc and "not yet closed" not in doc
    base = kmm.live_managers()
    m = kmm.Manager(backend="host")
    b = m.alloc(64)
    view = b.host_view()
    m.close()
    assert m.closed and kmm.live_managers() == base + 1
    del view, b
    gc.collect()
    for _ in range(500):  # a destroy may tear down on a background thread
        if kmm.live_managers() == base:
            break
        time.sleep(0.01)
    assert kmm.live_managers() == base
