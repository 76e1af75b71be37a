"""An independent review of session 14's changes (2026-11-28): its reproducers, each of which
failed on the code it reviewed and passes since the fix (host backend)."""
import gc

import numpy as np

import kmm
from conftest import fresh_interpreter as _run

MiB = 1 << 20


def _chunks(segments):
    """The map's chunks as lists of segments: a chunk's first segment starts at its base (the
    documented rule that tells apart chunks of one base)."""
    chunks = []
    for s in segments:
        if s.address == s.chunk:
            chunks.append([])
        chunks[-1].append(s)
    return chunks


def test_import_freed_in_a_collection_inside_held_lock_deadlocks():
    """A collection that starts inside `Manager._release_passed` (under `_held_lock`, which
    allocates) runs the queued `_free_import` of a garbage import of the same manager at its end,
    in the same thread: `_hold_until_stream_passes` takes the non-reentrant `_held_lock` again."""
    r = _run("""
        import faulthandler, gc, numpy as np, kmm
        faulthandler.dump_traceback_later(30, exit=True)
        m = kmm.Manager(backend="host")
        for threshold in range(1, 300):    # where the collection starts: some land in the lock
            for rep in range(2):
                gc.collect()
                gc.set_threshold(10**6)
                keep = kmm.from_dlpack(np.ones(16, np.uint8), manager=m)
                g = kmm.from_dlpack(np.ones(16, np.uint8), manager=m)
                c = [g]; c.append(c)
                del g, c                   # an import in a garbage cycle, not collected yet
                gc.set_threshold(threshold)
                keep.close()               # _free_import -> _hold_until_stream_passes (lock)
                gc.set_threshold(700)
        print("done")
    """)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]


def test_a_wrap_at_a_pool_chunks_base_is_a_chunk_apart():
    """A wrap of the first block of a pool chunk is a chunk of the same base: the review found it
    merged with the pool chunk (one 'chunk' whose segments overlap and sum to more than it)."""
    m = kmm.Manager(backend="host")
    try:
        a = m.asarray(np.arange(4096, dtype=np.uint8))
        same = kmm.from_dlpack(a, manager=m)
        chunks = _chunks(m.memory_map().segments)
        assert len(chunks) == 2 and "2 chunks" in repr(m.memory_map()), chunks
        wrap = [c for c in chunks if any(s.buffer == same.buffer.handle for s in c)]
        assert len(wrap) == 1 and [(s.address, s.bytes) for s in wrap[0]] == [(a.buffer.ptr, 4096)]
        pool = [c for c in chunks if c is not wrap[0]][0]
        assert all(x.address + x.bytes == y.address for x, y in zip(pool, pool[1:])), "the pool chunk tiles"
        del same
    finally:
        m.close()


def test_two_imports_of_one_foreign_array_are_two_chunks_of_its_size():
    m = kmm.Manager(backend="host")
    try:
        x = np.zeros(1 << 16, np.uint8)
        w1 = kmm.from_dlpack(x, manager=m)
        w2 = kmm.from_dlpack(x, manager=m)
        chunks = _chunks(m.memory_map().segments)
        assert [sum(s.bytes for s in c) for c in chunks] == [x.nbytes, x.nbytes], chunks
        assert {c[0].buffer for c in chunks} == {w1.buffer.handle, w2.buffer.handle}
        del w1, w2
    finally:
        m.close()


def test_cai_import_in_a_garbage_cycle_lets_its_producer_free_under_queued_work():
    """The producer (a Buffer of m1) is 'kept until m2's stream passes the free', but in a
    garbage cycle its own finalizer runs in the same collection: m1 frees it at the collection's
    end, and reuses the memory while m2's copy out of it is still queued."""
    m1 = kmm.Manager(backend="host")
    m2 = kmm.Manager(backend="host")
    try:
        n = MiB
        src = m1.alloc(n)
        src.copy_from_host(np.full(n, 0x22, np.uint8))
        imp = kmm.from_cuda_array_interface(src, manager=m2)
        slow = m2.alloc(256 * MiB)
        dst = m2.alloc(n)
        slow.fill(b"\0")
        dst.copy_from(imp.buffer)
        cyc = [imp, src]
        cyc.append(cyc)
        del imp, src, cyc
        gc.collect()
        b = m1.alloc(n)
        b.fill(b"\xee")
        m1.synchronize()
        m2.synchronize()
        got = np.frombuffer(dst.copy_to_host(), np.uint8)
        assert (got == 0x22).all(), np.unique(got)
    finally:
        m1.close()
        m2.close()
