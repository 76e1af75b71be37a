"""Adversarial round 10: argument checks the public API promises (docs/python.md, "Arguments":
integers are "not a bool", bad input raises `TypeError` or a `kmm.KmmError` subclass naming the
argument) and a refused DLPack export that must change nothing. Each test failed on the code
before the fix it names."""

import warnings

import numpy as np
import pytest

import kmm
from conftest import expect_named


class IndexReturnsBool:
    """An integer-like whose `__index__` returns a bool (Python only warns about it)."""

    def __init__(self, value=True):
        self.value = value

    def __index__(self):
        return self.value


@pytest.mark.parametrize("value", [True, False])
def test_an_index_returning_a_bool_is_refused_as_a_bool_is(manager, value):
    flag = IndexReturnsBool(value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        expect_named(TypeError, "nbytes", manager.alloc, flag)
        expect_named(TypeError, "shape", kmm.empty, flag, "f8", manager=manager)
        expect_named(TypeError, "chunk_size", kmm.Manager, backend="host", chunk_size=IndexReturnsBool(value))
        expect_named(TypeError, "backend", kmm.Manager, backend=flag)
        expect_named((TypeError, ValueError), "kind", manager.alloc, 8, kind=flag)
        expect_named(TypeError, "stream", manager.wait_stream, flag)
    # Where warnings are errors, the warning is not what the caller sees either.
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        expect_named(TypeError, "nbytes", manager.alloc, flag)
    assert manager.stats("device")["live_buffers"] == 0


def test_a_dtype_numpy_does_not_know_is_refused_naming_dtype(manager):
    a = kmm.empty(4, "f4", manager=manager)
    expect_named(TypeError, "dtype", kmm.empty, 4, "float33", manager=manager)
    expect_named(TypeError, "dtype", a.view, "zz")
    b = manager.alloc(8)
    expect_named(TypeError, "dtype", b.as_array, dtype=3.5)
    assert manager.stats("device")["live_buffers"] == 2  # a and b, nothing more


def test_a_backend_of_the_wrong_type_is_a_type_error_naming_backend():
    expect_named(TypeError, "backend", kmm.device_count, 3)
    expect_named(TypeError, "backend", kmm.can_access_peer, 0, 0, backend=False)
    expect_named(kmm.InvalidArgumentError, "backend", kmm.device_count, "gpu")


def test_a_refused_dlpack_export_orders_and_records_no_stream(manager, monkeypatch):
    # Before the fix, __dlpack__ made the consumer's stream wait and recorded it on the buffer,
    # then refused the dtype: a refused export had changed the buffer's streams.
    other = kmm.Manager(backend="host")
    try:
        a = manager.alloc(64).as_array((8,), "M8[s]")  # plain data, no DLPack type
        calls = []
        for name in ("signal_stream", "synchronize"):
            real = getattr(kmm.Manager, name)
            monkeypatch.setattr(kmm.Manager, name, lambda self, *args, _real=real, _name=name:
                                (calls.append(_name), _real(self, *args))[1])
        real_record = kmm.Buffer.record_stream
        monkeypatch.setattr(kmm.Buffer, "record_stream", lambda self, s: (calls.append("record_stream"), real_record(self, s))[1])
        with pytest.raises(BufferError, match="DLPack"):
            a.__dlpack__(stream=other.stream)
        assert calls == [], "a refused export ran %s" % calls
        # An export that is accepted still orders the consumer's stream.
        np.from_dlpack(manager.alloc(64).as_array((8,), "i8"))
        assert calls, "an accepted export ordered nothing"
    finally:
        other.close()
