"""Frees that finalizers ask for while the cyclic garbage collector runs wait for its end.

The collector calls every `__del__` of a garbage cycle before it breaks the cycle, in no set
order. A `__del__` that frees memory (a buffer's, a manager's, the end of an export, an imported
tensor's deleter) could so free it while another finalizer of the same garbage still writes
through a `host_view` memoryview, an array or a consumer's pointer to it: the memory is reused
under the writes, or unmapped (a crash). So a free asked for during a collection is queued and
made when the collection ends, once that garbage is gone. Frees outside a collection (an object's
last reference dropped) are made at once, as before.

The collector runs those finalizers before it knows what they kept: one may store an export (a
`host_view` memoryview, or a kmm array over an imported DLPack tensor) of the garbage somewhere
that outlives the collection. So an export whose token (the object whose death ends it) is
finalized during a collection is not ended then: the token is watched. At the collection's end,
a token nothing else holds is ended; one an export still holds is rearmed: each object that
holds it gets one fresh token (the collector runs a finalizer once only), whose death ends the
export as any export's. One scan of the heap finds the holders of all the tokens kept.

A callback added during a collection (kmm imported by a finalizer, or by another thread while a
finalizer released the GIL) sees that collection's end without its start: the count of
collections running stays at 0 or above. A child forked during a collection starts with none
running and nothing queued (the parent's pending frees are not the child's). The interpreter's
last collections at exit call no callbacks: exports no longer end once it finalizes (the
process's end gives their memory back), as a finalizer of that garbage may still write through
one.

A collection may release the GIL (a finalizer that sleeps or waits): a free another thread asks
for meanwhile waits for the end as well, a little later than it would have been."""

import gc
import os
import sys
import threading


def _deferral():
    """(later, end_export, on_gc): `later(fn, *args)` calls fn(*args) now, or at the end of the
    collection running now; `end_export(token)` calls `token.end()` now, or, in a collection, at
    its end if nothing else holds the token then, else rearms it (`token.holding(referrer)`: how
    to put a fresh token where `referrer` holds this one, or None; `token.fresh()`: the fresh
    token); `on_gc` is the collector's callback that marks their start and end."""
    # Closures, not globals: a collection at interpreter exit may run after this module's
    # globals are gone (see kmm.dlpack).
    running, queued, watched, unmovable = [0], [], [], set()
    lock = threading.Lock()
    refcount, finalizing, referrers_of = sys.getrefcount, sys.is_finalizing, gc.get_referrers

    def held(i):
        return refcount(watched[i])

    # What `held` says of a token only the watch list holds, asked the same way (interpreters
    # differ in the references a call's argument adds).
    watched.append(object())
    unheld = held(0)
    del watched[:]

    def later(fn, *args):
        call = (fn, args)  # made outside the lock: an allocation may start a collection
        with lock:
            if running[0]:
                queued.append(call)
                return
        fn(*args)

    def end_export(token):
        if finalizing():
            return
        with lock:
            if running[0]:
                # Holding the token keeps only it (and what it ends) alive, not the export.
                watched.append(token)
                return
        token.end()

    def on_gc(phase, info):
        with lock:
            running[0] = running[0] + 1 if phase == "start" else max(running[0] - 1, 0)
            if running[0]:
                return
            calls = queued[:]
            del queued[:]
            # Held by more than the watch list: a finalizer kept the export holding the token.
            ended = [i for i in range(len(watched)) if held(i) <= unheld]
            tokens = [watched[i] for i in ended]
            for i in reversed(ended):
                del watched[i]
            # Each rearmed once: one whose holders were not found is only watched from then on
            # (by id: `unmovable` holds the ids of watched tokens only, which are alive).
            unmovable.intersection_update(id(t) for t in watched)
            kept = [t for t in watched if id(t) not in unmovable]
        calls.extend((t.end, ()) for t in tokens)
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:  # as a __del__'s error: never raised into the collector's caller
                pass
        if kept:
            rearm(kept)
            del kept[:]

    def rearm(kept):
        referrers = referrers_of(*kept)  # one scan of the heap for all of them
        for token in kept:
            try:
                puts = [put for put in map(token.holding, referrers) if put is not None]
                if puts:
                    fresh = token.fresh()
                    for put in puts:
                        put(fresh)
            except Exception:
                puts = []
            with lock:
                if puts:
                    # By identity: a token's equality is not ours to call here.
                    watched[:] = [w for w in watched if w is not token]
                else:
                    unmovable.add(id(token))
        del referrers[:]

    def in_child():
        # The parent's collection in flight, its queued frees and watched exports are not the
        # child's; a lock another thread held at the fork stays held in the child.
        nonlocal lock
        lock = threading.Lock()
        running[0] = 0
        del queued[:], watched[:]
        unmovable.clear()

    if hasattr(os, "register_at_fork"):  # POSIX
        os.register_at_fork(after_in_child=in_child)
    return later, end_export, on_gc


later, end_export, _on_gc = _deferral()
gc.callbacks.append(_on_gc)
