"""Spill to host from Python: the setting, the stats and the buffer calls. Python's buffers keep
their address (mapped from allocation on) and so never spill: a live set past the hard limit runs
out of memory even with spill on, and says what it tried."""

import pytest

import kmm
from conftest import BACKEND

MIB = 1 << 20


def test_spill_settings_and_stats_are_reported():
    m = kmm.Manager(backend=BACKEND, chunk_size=2 * MIB, hard_limit=4 * MIB, spill_limit=64 * MIB)
    b = m.alloc(MIB)
    assert b.info()["spilled"] is False and b.spilled is False
    assert b.never_spill() is b and b.info()["never_spill"] is True
    b.never_spill(False)
    assert b.info()["never_spill"] is False
    s = m.stats("device")
    for field in ("spilled_bytes", "peak_spilled_bytes", "spilled_pageable_bytes", "spills", "restores",
                  "spilled_out_bytes", "restored_in_bytes", "spill_time_ns"):
        assert s[field] == 0, field
    assert "spill:" in m.summary()
    b.close()
    m.close()


def test_mapped_python_buffers_never_spill():
    m = kmm.Manager(backend=BACKEND, chunk_size=2 * MIB, hard_limit=4 * MIB, spill_limit=64 * MIB)
    held = []
    with pytest.raises(kmm.OutOfMemoryError) as e:
        for _ in range(8):
            held.append(m.alloc(MIB))
    assert "spill to host" in str(e.value) and "mapped" in str(e.value)
    assert m.stats("device")["spills"] == 0
    assert not any(b.spilled for b in held)
    for b in held:
        b.close()
    m.close()


def test_spill_limit_is_checked_like_every_setting():
    with pytest.raises(kmm.KmmError) as e:
        kmm.Manager(backend=BACKEND, spill_limit=-1)
    assert "spill_limit" in str(e.value)
