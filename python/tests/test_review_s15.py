"""Review s15: import producers held until the stream passes their frees (manager.py
`_hold_until_stream_passes`, `_release_passed`, `close`). Each test fails on the code it was
written against because of the defect it names."""

import numpy as np

import kmm
from conftest import import_holding_its_producer, lib_call_with_window


def test_an_import_freed_while_close_waits_for_the_stream_keeps_its_producer(monkeypatch):
    # close() sets the handle to 0 and only then waits for the stream (kmm_manager_destroy, or
    # kmm_manager_synchronize with exports live). Another thread freeing an import in that
    # window reads handle 0 and lets go of the producer at once ("destroyed by close(), which
    # waited for the stream"), while work queued before the free (here a copy INTO the
    # producer's memory, behind a slow fill) has still to run: the producer's memory is reused
    # by its owner and the late copy writes over the new owner's bytes. The other thread's free
    # is played in the window itself, in this thread, so the interleaving is certain.
    MiB = 1 << 20
    m1 = kmm.Manager(backend="host")
    m2 = kmm.Manager(backend="host")
    try:
        imports = import_holding_its_producer(m1, m2, MiB)
        ones = m2.alloc(MiB)
        ones.fill(b"\x77")
        m2.synchronize()
        slow = m2.alloc(256 * MiB)
        slow.fill(b"\0")                     # keeps m2's stream busy
        imports[0].buffer.copy_from(ones)    # queued behind it: writes the producer's memory
        seen = {}

        def free_in_window():  # the other thread, in the window before close's wait
            if imports:
                imports.clear()  # the import is freed: its producer must stay held
                reuse = m1.alloc(MiB)  # the producer's memory, if it was let go
                reuse.fill(b"\xee")
                m1.synchronize()
                seen["reuse"] = reuse

        restore = lib_call_with_window(monkeypatch, "kmm_manager_destroy", free_in_window, after=False)
        m2.close()
        restore()
        m1.synchronize()
        got = np.frombuffer(seen["reuse"].copy_to_host(), np.uint8)
        assert (got == 0xEE).all(), (
            "a copy queued on the closing manager's stream before an import's free wrote into memory "
            "its producer had given back (and its owner reused): %s" % (np.unique(got),))
    finally:
        m1.close()
        m2.close()
