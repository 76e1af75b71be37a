"""Frees that finalizers ask for while the cyclic garbage collector runs wait for its end.

The collector calls every `__del__` of a garbage cycle before it breaks the cycle, in no set
order. A `__del__` that frees memory (a buffer's, a manager's, the end of an export, an imported
tensor's deleter) could so free it while another finalizer of the same garbage still writes
through a `host_view` memoryview, an array or a consumer's pointer to it: the memory is reused
under the writes, or unmapped (a crash). So a free asked for during a collection is queued and
made when the collection ends, once that garbage is gone. Frees outside a collection (an object's
last reference dropped) are made at once, as before.

The collector runs those finalizers before it knows what they kept: one may store an export (a
`host_view` memoryview) of the garbage somewhere that outlives the collection. So an export
whose token is finalized during a collection is not ended then: the token is watched, and ended
at the end of the first collection after which nothing but the watch holds it.

A collection may release the GIL (a finalizer that sleeps or waits): a free another thread asks
for meanwhile waits for the end as well, a little later than it would have been."""

import gc
import sys
import threading


def _deferral():
    """(later, end_export, on_gc): `later(fn, *args)` calls fn(*args) now, or at the end of the
    collection running now; `end_export(token)` calls `token.end()` now, or, in a collection,
    at the end of the first one after which only the watch holds the token; `on_gc` is the
    collector's callback that marks their start and end."""
    # Closures, not globals: a collection at interpreter exit may run after this module's
    # globals are gone (see kmm.dlpack).
    running, queued, watched, lock = [0], [], [], threading.Lock()
    refcount = sys.getrefcount

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
        with lock:
            if running[0]:
                # Holding the token keeps only it (and what it ends) alive, not the export.
                watched.append(token)
                return
        token.end()

    def on_gc(phase, info):
        with lock:
            running[0] += 1 if phase == "start" else -1
            if running[0]:
                return
            calls = queued[:]
            del queued[:]
            # Held by more than the watch list: a finalizer kept the export holding the token
            # (it is watched until a later collection's end).
            ended = [i for i in range(len(watched)) if held(i) <= unheld]
            tokens = [watched[i] for i in ended]
            for i in reversed(ended):
                del watched[i]
        calls.extend((t.end, ()) for t in tokens)
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:  # as a __del__'s error: never raised into the collector's caller
                pass

    return later, end_export, on_gc


later, end_export, _on_gc = _deferral()
gc.callbacks.append(_on_gc)
