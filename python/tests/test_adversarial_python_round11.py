"""Adversarial round 11: integer arguments are read by their value (an `int` subclass's own
`__int__` is not the value), and `DeviceArray.set` stores datetime and text values as given or
refuses them with `TypeError` (docs/python.md, "Arguments"). Each test failed on the code before
the fix it names."""

import numpy as np
import pytest

import kmm
from conftest import expect_named


class IntSaysOther(int):
    """An `int` whose value is one number and whose `__int__` says another."""

    def __int__(self):
        return 5


def test_an_int_subclass_is_checked_by_its_value_not_its_int(manager):
    minus_one = IntSaysOther(-1)
    expect_named(kmm.SizeOverflowError, "nbytes", manager.alloc, minus_one)
    expect_named((kmm.KmmError, ValueError), "hard_limit", kmm.Manager, backend="host", hard_limit=minus_one)
    b = manager.alloc(16)
    try:
        b.fill(b"\xaa")
        expect_named((kmm.KmmError, ValueError), "offset", b.copy_to_host, offset=minus_one, nbytes=4)
        # The value, not __int__'s 5, is what a valid argument passes on.
        seven = type("IntSaysFive", (int,), {"__int__": lambda self: 5})(7)
        assert manager.alloc(seven).nbytes == 7
    finally:
        b.close()


@pytest.mark.parametrize("dst, host", [
    ("M8[ns]", np.array([2**62], "M8[s]")),      # a finer unit multiplies: wraps past int64
    ("m8[us]", np.array([10**15], "m8[h]")),
    ("M8[s]", np.array([2**60], "M8[D]")),
    ("M8[s]", np.array([1500], "M8[ms]")),       # a coarser one truncates: 1.5 s is not 1 s
])
def test_set_refuses_a_datetime_the_unit_change_would_alter(manager, dst, host):
    a = manager.asarray(np.array([7], dst))
    expect_named(TypeError, "host", a.set, host)
    assert a.get().view(np.int64)[0] == 7          # what was stored is kept


def test_set_stores_a_datetime_that_converts_exactly(manager):
    a = manager.asarray(np.zeros(3, "M8[ns]"))
    host = np.array(["2026-11-29T10:00:00", "NaT", "1970-01-01"], "M8[s]")
    a.set(host)
    assert (a.get().astype("M8[s]").view(np.int64) == host.view(np.int64)).all()
    expect_named(TypeError, "host", a.set, np.array([1], "m8[s]"))    # a duration is not a date


def test_set_refuses_non_ascii_bytes_into_a_str_array_with_a_type_error(manager):
    a = manager.asarray(np.array(["ok"], "U2"))
    expect_named(TypeError, "host", a.set, np.array([b"\xff\xfe"]))
    assert a.get()[0] == "ok"
    a.set(np.array([b"hi"]))
    assert a.get()[0] == "hi"
