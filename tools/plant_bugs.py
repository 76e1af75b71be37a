#!/usr/bin/env python3
"""Plants one known bug at a time in a scratch git worktree and runs the trust suite against it,
to show each test family catches the bug it targets. Never touches the main checkout.

    python3 tools/plant_bugs.py [--worktree /tmp/kmm-plant] [--only NAME[,NAME...]] [--check] [--gpu]

Each plant: (name, file, old text, new text, tests that must FAIL), or (name, [(file, old text,
new text), ...], tests) for a bug that takes edits in several places (each old text must occur).
A test is a cargo test binary of kmm (`--test NAME`), "lib" for the crate's unit tests (`--lib`),
"valgrind" for tools/valgrind_c_abi.sh, "bench:NAME" for a test binary of kmm-bench, "py:FILE" for a pytest file of python/tests (against
the worktree's libkmm), "jl:FILE" for a Julia test file of test/ (included in a testset as
test/runtests.jl does, on 2 threads, against the worktree's libkmm), or "gpu:NAME" for a test
binary whose checks need a GPU (KMM_TEST_GPU=1): those run only with --gpu; without it the plant
is applied and built, and its row says "needs GPU, not run here". --check only says whether each
plant's old text is in HEAD. Prints a table.
"""
import argparse, os, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PLANTS = [
    # State::free (manager/lane.rs since the stream-ordering split) accepts a dead handle.
    ("double-free-accepted", "rust/kmm/src/manager/lane.rs",
     "    pub fn free(&mut self, handle: u64, force: bool) -> Result<()> {\n",
     "    pub fn free(&mut self, handle: u64, force: bool) -> Result<()> {\n        if self.buffers.get(handle).is_err() {\n            return Ok(());\n        }\n",
     ["trust_model", "trust_stress"]),
    # The FISP profile's size is multiplied in 32 bits: 2^20 TRs x 4096 positions is 0 values.
    ("fisp-profile-size-wraps", "rust/kmm/src/ffi/qmri.rs",
     "self.ntr as usize * self.nprofile as usize",
     "self.ntr.wrapping_mul(self.nprofile) as usize",
     ["qmri_errors"]),
    # A trace start stops the trace before it checks that the new one can be had: a refused
    # start (a file that cannot be made) leaves no trace recording.
    ("trace-start-stops-first", "rust/kmm/src/manager/observe.rs",
     "        let cuda_pool = self.config.alloc_mode == AllocMode::CudaAsync;\n        let tracer = Arc::new(Tracer::start(",
     "        let _ = self.trace_stop();\n        let cuda_pool = self.config.alloc_mode == AllocMode::CudaAsync;\n        let tracer = Arc::new(Tracer::start(",
     ["observe"]),
    # A pool that cannot grow by a whole chunk (a limit below the chunk size) tries no smaller one.
    ("pool-grows-whole-chunks-only", "rust/kmm/src/pool/pooled.rs",
     "        let grown = self.grow(chunk).or_else(|e| self.grow_less(size, chunk, e));\n",
     "        let grown = self.grow(chunk);\n",
     ["abi_manager"]),
    # A forked child takes its parent's host streams for its own: a wait for them never ends.
    ("host-streams-live-on-after-fork", "rust/kmm/src/backend/host.rs",
     "        FORK_GENERATION.fetch_add(1, Ordering::Relaxed);\n",
     "",
     ["py:test_adversarial_python_round5.py"]),
    # A destroyed manager's allocations stay in the by-address tables as its: a library's late
    # free of such an address frees a new allocation there.
    ("by-address-keeps-no-orphans", "rust/kmm/src/ffi/manager.rs",
     "        super::by_address::orphan_everywhere(manager);\n",
     "",
     ["abi_stream_order"]),
    # An allocation by address made while its manager is destroyed is recorded as live: its late
    # free frees what a newer manager puts at that address.
    ("by-address-records-after-destroy", "rust/kmm/src/ffi/by_address.rs",
     "        if !super::registry::is_live(mgr) {\n",
     "        if false {\n",
     ["abi_stream_order"]),
    # An allocation held back at an orphaned address keeps its entry when its manager is
    # destroyed: the next one there is recorded as live, and the orphan's late free frees it.
    ("by-address-held-back-outlives-its-manager", "rust/kmm/src/ffi/by_address.rs",
     "            *held = None;\n",
     "",
     ["abi_stream_order"]),
    # kmm_plugin_free_address through a destroyed (or forged) manager answers "not allocated"
    # instead of KMM_ERROR_INVALID_HANDLE, and a free through a live manager of another's address
    # is taken for that manager's late free.
    ("plugin-free-address-skips-the-manager-check", "rust/kmm/src/ffi/by_address.rs",
     "        if let Some(m) = manager.filter(|&m| !super::registry::is_live(m)) {\n",
     "        if let Some(m) = manager.filter(|_| false) {\n",
     ["abi_plugin_by_address", "plugin_model"]),
    # kmm_plugin_malloc's table holds allocations back at a destroyed manager's addresses though
    # its frees name the manager: a manager's stats count buffers its caller never got.
    ("plugin-malloc-holds-allocations-back", "rust/kmm/src/ffi/plugin.rs",
     "STATE.get_or_init(ByAddress::naming_the_manager)",
     "STATE.get_or_init(ByAddress::by_address_alone)",
     ["abi_plugin_by_address"]),
    # Two managers' file traces write one file: each overwrites the other's rows.
    ("trace-file-shared-between-managers", "rust/kmm/src/manager/observe.rs",
     "        tracer.claim_file(shares_file)?;\n",
     "        tracer.claim_file(true)?;\n",
     ["observe"]),
    # A deferred destroy leaves a file trace's buffered rows unwritten: a process that ends
    # before the teardown loses them.
    ("deferred-destroy-leaves-trace-rows-buffered", "rust/kmm/src/ffi/manager.rs",
     "registry::retire(manager, |m| m.trace_flush())?",
     "registry::retire(manager, |_| ())?",
     ["observe"]),
    # The trace reader takes a row cut off mid-size for a smaller allocation.
    ("csv-reads-cut-off-rows", "rust/kmm/src/manager/csv.rs",
     "        if fields.len() != names.len() {\n",
     "        if fields.len() < 3 {\n",
     ["observe", "bench:replay"]),
    # Replay keeps a spilled buffer's device memory in use: the full form peaks above the run.
    ("replay-keeps-spilled-buffers-in-use", "rust/kmm-bench/src/replay.rs",
     "            Some(Action::Spill) if by_buffer => {\n",
     "            Some(Action::Spill) if false => {\n",
     ["bench:replay"]),
    # The memory map draws every block, however many share a pixel: the figure grows with the
    # buffers (36 MB for 200,000).
    ("map-figure-draws-every-block", "rust/kmm/src/figures.rs",
     "            if let Some(r) = run.as_mut().filter(|r| x < r.end && end <= r.end + 1.0 && r.takes(s)) {\n",
     "            if let Some(r) = run.as_mut().filter(|_| false) {\n",
     ["observe"]),
    # A trace save empties a file another manager's recording trace writes.
    ("trace-save-overwrites-a-traced-file", "rust/kmm/src/ffi/trace.rs",
     "        crate::manager::trace::check_not_traced(&path)?;\n",
     "",
     ["observe"]),
    # A plugin free on a host stream that has ended is refused: the buffer leaks for good.
    ("plugin-free-refuses-an-ended-stream", "rust/kmm/src/manager/lane.rs",
     "            if !self.backend.stream_ended(stream) {\n",
     "            if true {\n",
     ["abi_stream_order"]),
    # A manager made in a registry slot starts its buffer handles afresh, at its own seed: a
    # destroyed predecessor's handles come back after enough reuses of one table slot.
    ("handle-history-dropped", "rust/kmm/src/manager/mod.rs",
     "                buffers: HandleTable::resume(TAG_BUFFER, owner, lane, seed, buffer_history),\n",
     "                buffers: HandleTable::new(TAG_BUFFER, owner, lane, seed),\n",
     ["abi_buffers"]),
    # The manager's bytes in use are a gauge the lanes share (the lane's UsageCounters::in_use is
    # no longer what stats report): the free forgets to take its bytes off.
    ("stats-not-decremented", "rust/kmm/src/manager/lane.rs",
     "self.change_in_use(true, resident, Action::Free,",
     "self.change_in_use(true, 0, Action::Free,",
     ["trust_model", "trust_faults", "trust_stress"]),
    # The gauge of bytes in use turns shared (a second lane changes it) without the barrier
    # that makes the writer lane's plain update in flight visible: an update is lost.
    ("lane-gauge-switch-without-barrier", "rust/kmm/src/pool/lane_gauge.rs",
     "        membarrier::all_threads();\n",
     "",
     ["lib"]),
    # ... or without waiting for the writer's update in flight (one preempted mid-update).
    ("lane-gauge-switch-does-not-wait", "rust/kmm/src/pool/lane_gauge.rs",
     "                    self.wait_while(|g| g.busy.load(Ordering::Acquire));\n",
     "",
     ["lib"]),
    # A lane that finds the gauge turning shared changes it at once, with a locked add, while the
    # writer's plain update in flight may still overwrite it (only the switching lane waited).
    ("lane-gauge-others-skip-the-switch", "rust/kmm/src/pool/lane_gauge.rs",
     "                SWITCHING => break,\n",
     "                SWITCHING => return,\n",
     ["lib"]),
    # A child forked during the writer's update waits for that (missing) thread forever.
    ("lane-gauge-child-waits-for-a-missing-writer", "rust/kmm/src/pool/lane_gauge.rs",
     "            } else if std::process::id() != self.pid {\n",
     "            } else if false && std::process::id() != self.pid {\n",
     ["lib"]),
    # A reset of the peak stores the figure it read and stops: an add between the read and the
    # store (which compared itself with the old, higher peak) is left above the new peak.
    ("lane-gauge-reset-leaves-a-racing-add-above-the-peak", "rust/kmm/src/pool/lane_gauge.rs",
     "        self.counts.peak.fetch_max(self.counts.current.load(Ordering::SeqCst), Ordering::SeqCst);\n    }\n\n    /// Whether one lane",
     "    }\n\n    /// Whether one lane",
     ["lib"]),
    # A pinned request the pool rounds past the pinned limit moves every spilled buffer to
    # pageable memory first (the unrounded request is compared).
    ("unpin-for-a-request-past-the-limit", "rust/kmm/src/manager/spill.rs",
     "        crate::pool::round_up(bytes.max(1), self.config.alignment) <= limit.max().saturating_sub(held_by_others)\n",
     "        bytes <= limit.max().saturating_sub(held_by_others)\n",
     ["spill"]),
    # The spill store counts a host place as spilled bytes when it hands it out, before the
    # spill is made (the sixth adversarial run): a snapshot between shows spilled bytes above
    # their peak and above the spilled buffers' bytes.
    ("spill-counts-a-place-before-the-spill", [
        ("rust/kmm/src/manager/spill_store.rs",
         "        store.taken += bytes;\n        Ok(Some(place))\n",
         "        store.taken += bytes;\n        store.stats.spilled_bytes += bytes;\n        Ok(Some(place))\n"),
        ("rust/kmm/src/manager/spill_store.rs",
         "        s.bytes_out += bytes;\n        s.spilled_bytes += bytes;\n",
         "        s.bytes_out += bytes;\n"),
        ("rust/kmm/src/manager/spill_store.rs",
         "        store.taken -= bytes;\n        if spilled {\n            let s = &mut store.stats;\n            s.spilled_bytes -= bytes;\n",
         "        store.taken -= bytes;\n        store.stats.spilled_bytes -= bytes;\n        if spilled {\n            let s = &mut store.stats;\n"),
     ], ["adv6_core"]),
    # The room unpinning can make is the limit less what others hold (the user's pinned buffers);
    # the bug compares with the whole limit.
    ("unpin-for-a-request-beside-the-users-pinned-buffers", "rust/kmm/src/manager/spill.rs",
     "        let held_by_others = limit.used().current().saturating_sub(self.spill.pinned_reserved());\n",
     "        let held_by_others = 0;\n",
     ["spill"]),
    ("missing-stream-wait-copy-buffer", "rust/kmm/src/manager/copy.rs",
     "        other.backend.order_streams(other.raw_stream(), run.raw_stream())?;",
     "",
     ["trust_model", "trust_stress"]),
    ("staging-slot-reused-before-dma", "rust/kmm/src/manager/staging.rs",
     "let waited = event.synchronize();",
     "let waited: Result<()> = Ok(());",
     ["trust_model", "trust_stress"]),
    # Deferred no longer returns an error when no event can be recorded: the blocks wait as
    # orphans for the next event (defer). The bug drops them instead.
    ("deferred-free-loses-block-on-fault", "rust/kmm/src/pool/deferred.rs",
     "            Err(_) => self.orphans.extend(blocks),\n",
     "            Err(_) => drop(blocks),\n",
     ["trust_faults"]),
    ("sync-copy-returns-with-work-queued", "rust/kmm/src/manager/copy.rs",
     "                    for _ in 0..3 {\n                        if self.stream.synchronize().is_ok() {\n                            break;\n                        }\n                    }\n",
     "",
     ["trust_faults"]),
    # Compaction's moves live in LaneCaller::relocate (manager/lane.rs).
    ("compaction-moves-at-once-not-queued", "rust/kmm/src/manager/lane.rs",
     "unsafe { self.stream.copy_d2d(r.to.addr, r.from.addr, record.bytes.min(r.from.size))? };",
     "unsafe { std::ptr::copy_nonoverlapping(r.from.addr as *const u8, r.to.addr as *mut u8, record.bytes.min(r.from.size) as usize) };",
     ["abi_compaction"]),
    ("compaction-moves-mapped-buffers", "rust/kmm/src/manager/lane.rs",
     "self.buffers.at(owner).is_some_and(|r| r.pins == 0)",
     "self.buffers.at(owner).is_some()",
     ["abi_compaction"]),
    ("map-skips-the-move-fence", "rust/kmm/src/manager/lane.rs",
     "let wait = if r.settling { fence.clone() } else { None };",
     "let wait: Option<MovesFence> = { let _ = fence; None };",
     ["abi_compaction"]),
    ("lanes-no-cross-lane-rung", "rust/kmm/src/manager/mod.rs",
     "(0..=last).filter(move |&lane| lane != own)",
     "(0..=last).filter(move |&lane| lane != own && false)",
     ["lib"]),
    # trim_lanes became detach_lanes (chunks detached under the lock, freed after the fence).
    ("lanes-trim-budget-per-lane", "rust/kmm/src/manager/release.rs",
     "            budget = budget.saturating_sub(st.resources[k].counters().reserved);\n",
     "",
     ["abi_lanes"]),
    # The out-of-memory ladder (Manager::climb, manager/spill.rs) first gives back every lane's
    # cached chunks. The bug skips that rung: chunks cached in other lanes strand the memory.
    ("lanes-release-own-lane-only", "rust/kmm/src/manager/spill.rs",
     "        let released = self.release(kind, 0).and_then(",
     "        let released = Ok::<(), crate::error::Error>(()).and_then(",
     ["abi_lanes"]),
    ("summary-writes-past-buffer", "rust/kmm/src/ffi/mod.rs",
     "*buf.add(n) = 0;",
     "*buf.add(n + 1) = 0;",
     ["valgrind"]),

    # --- The stream-ordering fixes (d2f72ec, 5c89d27), each reversed. ---
    # A trim frees the chunks it detached without waiting for their fence.
    ("trim-frees-chunks-before-fence", "rust/kmm/src/manager/release.rs",
     "            if let Err(e) = event.synchronize() {\n",
     "            if let Err(e) = { let _ = &event; Result::<()>::Ok(()) } {\n",
     ["abi_stream_order", "stream_model"]),
    # A handle slot is reused after its generation came round: a freed handle lives again.
    ("handle-slot-never-retired", "rust/kmm/src/manager/handles.rs",
     "        if slot.generation != slot.first {\n            self.free.push(i as u32);\n        }\n",
     "        self.free.push(i as u32);\n",
     ["abi_stream_order", "lib"]),
    # A lane grows instead of taking another lane's free chunk.
    ("lanes-take-no-spare-chunks", "rust/kmm/src/manager/lane.rs",
     "        let Some(place) = self.place.filter(|_| matches!(self.growth, Growth::Allow | Growth::Defer)) else {\n",
     "        let Some(place) = self.place.filter(|_| false) else {\n",
     ["abi_lanes"]),
    # Python: a host view is made without waiting for the work queued on the manager's stream:
    # it shows bytes a queued fill or copy has not written yet.
    ("py-host-view-before-queued-work", "python/kmm/buffer.py",
     "        self._live()\n        self._manager.synchronize()\n",
     "        self._live()\n",
     ["py:test_buffer.py"]),
    # Python: a Buffer can be copied again: the copy is a second owner of the handle.
    ("py-buffer-copyable", "python/kmm/buffer.py",
     "class Buffer(NotCopyable):\n",
     "class Buffer:\n",
     ["py:test_adversarial_python_round3.py"]),
    # Python: an allocation reads its per-thread out-slots after making its object, where a
    # collection's finalizer may have allocated over them.
    ("py-alloc-reads-slots-late", "python/kmm/buffer.py",
     "        self._handle = handle\n        self._ptr = ptr\n",
     "        self._handle = scratch[0]\n        self._ptr = scratch[1]\n",
     ["py:test_adversarial_python_round3.py"]),
    # Python: the Numba plugin's manager closes with Numba's memory live.
    ("py-numba-close-frees-live-memory", "python/kmm/numba.py",
     "                if not force:\n                    m._refuse_close_while_held(",
     "                if False:\n                    m._refuse_close_while_held(",
     ["py:test_adversarial_python_round3.py"]),
    # Python: a DLPack export no longer holds the memory, so close() frees it under the consumer.
    ("py-dlpack-export-not-held", "python/kmm/dlpack.py",
     "    entry = (t, shape, strides, array, buffer._export())\n",
     "    entry = (t, shape, strides, array, lambda: None)\n",
     ["py:test_bindings_safety.py"]),
    # Python: frees asked for while the cyclic collector runs are made at once: a finalizer of
    # the same garbage writes through a host_view (or a consumer's pointer) into reused memory.
    ("py-gc-frees-during-collection", "python/kmm/_lifetime.py",
     "            if running[0]:\n                queued.append(call)\n                return\n",
     "            if False:\n                queued.append(call)\n                return\n",
     ["py:test_adversarial_python_round6.py", "py:test_bindings_safety.py"]),
    # Python: an export token finalized in a collection ends its export at once: a finalizer of
    # the garbage that kept the host_view past the collection shows freed, reused memory.
    ("py-export-ends-under-a-kept-view", "python/kmm/_lifetime.py",
     "            if running[0]:\n                # Holding the token keeps only it",
     "            if False:\n                # Holding the token keeps only it",
     ["py:test_adversarial_python_round6.py"]),
    # Python: a gc callback added during a collection (kmm imported by a finalizer) counts that
    # collection's end without its start: the count goes below 0 and no later collection defers.
    ("py-gc-count-goes-below-zero", "python/kmm/_lifetime.py",
     "running[0] + 1 if phase == \"start\" else max(running[0] - 1, 0)",
     "running[0] + 1 if phase == \"start\" else running[0] - 1",
     ["py:test_adversarial_review_export_watch.py"]),
    # Python: a DLPack import's deleter runs at the end of the collection that found its owner,
    # though a finalizer kept the kmm array over the producer's memory.
    ("py-dlpack-deleter-ignores-kept-imports", [
        ("python/kmm/dlpack.py", "from ._lifetime import end_export\n",
         "from ._lifetime import end_export, later\n"),
        ("python/kmm/dlpack.py", "    def __del__(self):\n        end_export(self)\n\n    def end(self):\n        if self.deleter",
         "    def __del__(self):\n        later(self.end)\n\n    def end(self):\n        if self.deleter")],
     ["py:test_adversarial_review_export_watch.py"]),
    # Python: exports end in the interpreter's last collections at exit (no gc callbacks run
    # there), under a finalizer of that garbage that still writes through a view (SIGSEGV).
    ("py-exports-end-at-exit", "python/kmm/_lifetime.py",
     "        if finalizing():\n            return\n",
     "",
     ["py:test_adversarial_review_export_watch.py"]),
    # Python: a host_view a finalizer kept keeps its watched, already finalized token: freed only
    # at a later collection (never with gc disabled), and a cycle through the manager leaks.
    # (The exit check was an atexit hook, never called when kmm is first imported in one.)
    ("py-kept-export-not-rearmed", "python/kmm/buffer.py",
     "        if type(referrer) is dict and referrer.get(\"_kmm_export\") is self:\n",
     "        if False:\n",
     ["py:test_adversarial_review_export_watch.py"]),
    # Python: a kept export's fresh token goes to the first holder found only: dropping a copy
    # of the array (its dict holds the token too) ends the export under the kept view.
    ("py-rearm-first-holder-only", "python/kmm/_lifetime.py",
     "                puts = [put for put in map(token.holding, referrers) if put is not None]\n",
     "                puts = [put for put in map(token.holding, referrers) if put is not None][:1]\n",
     ["py:test_adversarial_review_export_rearm.py"]),
    # Python: a child forked while another thread's collection runs inherits the count of
    # collections running: every free it asks for is queued for good.
    ("py-fork-child-inherits-a-collection", "python/kmm/_lifetime.py",
     "        os.register_at_fork(after_in_child=in_child)\n",
     "        pass\n",
     ["py:test_adversarial_review_export_rearm.py"]),
    # Python: kmm.cupy's compiled allocator does not hold the user's CuPy Stream its memory was
    # allocated for: the stream is destroyed before the free that is ordered after it.
    ("py-cupy-compiled-drops-user-stream", "python/kmm/_cupy_calls.c",
     "    a->stream_owner = stream_owner;\n",
     "    a->stream_owner = NULL;\n    Py_XDECREF(stream_owner);\n",
     ["py:test_cupy_plugin.py"]),
    # Python: the compiled allocation is not tracked by the collector: a Stream holding memory
    # allocated for it (a workspace) and that memory's allocation leak for good.
    ("py-cupy-allocation-not-collected", "python/kmm/_cupy_calls.c",
     "    Py_VISIT(a->stream_owner);\n",
     "",
     ["py:test_cupy_plugin.py"]),
    # Python: the same in kmm.cupy's Python path.
    ("py-cupy-python-path-drops-user-stream", "python/kmm/cupy.py",
     "    a.stream_owner = current if stream > 2 else None\n",
     "    a.stream_owner = None\n",
     ["py:test_cupy_plugin.py"]),
    # Python: the compiled allocator lets the user's stream go before the free recorded on it.
    ("py-cupy-stream-released-before-free", "python/kmm/_cupy_calls.c",
     "        plugin_free(a->handle, a->buffer, a->stream);\n        live--;\n    }\n    Py_CLEAR(a->stream_owner); /* after the free that records an event on it */\n",
     "        Py_CLEAR(a->stream_owner);\n        plugin_free(a->handle, a->buffer, a->stream);\n        live--;\n    }\n",
     ["py:test_cupy_plugin.py"]),
    # Python: a manager found in garbage is destroyed in the collector's finalizer pass, under a
    # host_view another finalizer of that garbage still writes through (SIGSEGV).
    ("py-manager-gc-destroys-at-once", "python/kmm/manager.py",
     "                # through a view of the manager's memory.\n                later(_lib_.kmm_manager_destroy, h, _lib.KMM_DESTROY_DEFERRED)\n",
     "                # through a view of the manager's memory.\n                _lib_.kmm_manager_destroy(h, _lib.KMM_DESTROY_DEFERRED)\n",
     ["py:test_bindings_safety.py"]),
    # Python: Buffer.__del__ frees the memory while a host_view of it lives.
    ("py-buffer-del-ignores-exports", "python/kmm/buffer.py",
     "                    self._handle = 0\n                    if self._exports:\n                        self._pending = h\n                        return\n                fn, args",
     "                    self._handle = 0\n                fn, args",
     ["py:test_bindings_safety.py"]),
    # Python: Manager.__del__ (kmm.numba calls it) destroys the manager while a host_view lives.
    ("py-manager-del-ignores-exports", "python/kmm/manager.py",
     "                    if self._exports:\n                        # As close(): the last export's end destroys it",
     "                    if False:\n                        # As close(): the last export's end destroys it",
     ["py:test_bindings_safety.py"]),
    # Python: copy_to_host / copy_from_host take the buffer's own host_view at a shifted range:
    # the staged copy leaves wrong bytes.
    ("py-copies-overlap-own-host-view", "python/kmm/buffer.py",
     "        if nbytes and addr < start + nbytes and start < addr + nbytes:\n",
     "        if False:\n",
     ["py:test_adversarial_python_round6.py"]),
    # Python: set() checks integers by a cast and back, which -1 passes between int32 and uint32.
    ("py-set-wraps-sign", "python/kmm/array.py",
     "        return info.min <= int(host.min()) and int(host.max()) <= info.max\n",
     "        return bool(np.array_equal(host.astype(dtype).astype(host.dtype), host))\n",
     ["py:test_adversarial_python_round6.py"]),
    # Python: manager= is taken as 'manager or default_manager()': 0, False, "" use the default.
    ("py-manager-argument-unchecked", "python/kmm/manager.py",
     "    if manager is None:\n        return default_manager()\n    if not isinstance(manager, Manager):\n",
     "    if not manager:\n        return default_manager()\n    if False:\n",
     ["py:test_adversarial_python_round6.py"]),
    # Python: a host_view memoryview no longer holds the memory.
    ("py-host-view-not-held", "python/kmm/buffer.py",
     "        memory._kmm_export = _ExportToken(self._export())\n",
     "",
     ["py:test_bindings_safety.py"]),
    # Python: an export checks that its buffer is live before taking the lock close() takes, so
    # a close() in between frees memory the export then shows.
    ("py-export-checks-liveness-outside-the-lock", "python/kmm/buffer.py",
     "        with _export_lock:\n            # Checked under the lock close() takes: checked before it, a close() in another\n            # thread could free the memory between the check and the count, and the export\n            # would then show freed memory.\n            self._live()\n",
     "        self._live()\n        with _export_lock:\n",
     ["py:test_adversarial_python.py"]),
    # Python: closing a manager libkmm owns (kmm.torch.manager) zeroes its handle, so none of its
    # buffers is freed again.
    ("py-borrowed-manager-close-leaks", "python/kmm/manager.py",
     "        if not self._owned:\n            return\n        with _export_lock:",
     "        with _export_lock:",
     ["py:test_adversarial_python.py"]),
    # Python: copies take host arrays of Python objects (device bytes over PyObject pointers).
    ("py-copies-take-object-arrays", "python/kmm/buffer.py",
     "    if a.dtype.hasobject:\n",
     "    if False:\n",
     ["py:test_adversarial_python.py"]),
    # Python: kmm.cupy's manager closes while CuPy arrays hold its memory.
    ("py-cupy-manager-closes-under-cupys-arrays", "python/kmm/cupy.py",
     "                if not force:\n                    self._refuse_close_while_held(",
     "                if False:\n                    self._refuse_close_while_held(",
     ["py:test_cupy_plugin.py"]),
    # Python: kmm.cupy's Python-path allocation runs outside the lock close() holds: it lands
    # between close()'s count of the manager's buffers and its destroy.
    ("py-cupy-python-alloc-races-close", "python/kmm/cupy.py",
     "    with _lock:  # the call releases the GIL: a close() meanwhile would not count this buffer\n        m = _serving(device)\n        handle = m._handle\n        status = _plugin_alloc(handle, nbytes, kind, stream, addr, addr + 8)\n",
     "    m = _serving(device)\n    handle = m._handle\n    status = _plugin_alloc(handle, nbytes, kind, stream, addr, addr + 8)\n",
     ["py:test_cupy_plugin.py"]),
    # Python: a DLPack capsule a C consumer refused (dropped with its exception set) fails in its
    # destructor's first ctypes call: the export never ends, the buffer is never freed.
    ("py-dlpack-refused-export-never-freed", "python/kmm/dlpack.py",
     "        try:\n            error_occurred()\n            pending = None\n        except BaseException as e:\n            pending = e\n        # Runs when a capsule dies",
     "        pending = None\n        # Runs when a capsule dies",
     ["py:test_adversarial_python.py"]),
    # Python: integers are taken as they come (int()), so sizes wrap in ctypes and floats pass.
    ("py-integers-unchecked", "python/kmm/_args.py",
     "    if isinstance(value, (bool, np.bool_)):\n",
     "    return int(value)\n    if isinstance(value, (bool, np.bool_)):\n",
     ["py:test_bindings_safety.py"]),
    # PyTorch's record_stream hook finds the buffer but records nothing.
    ("torch-record-stream-ignored", "rust/kmm/src/ffi/by_address.rs",
     "    with_manager(mgr, |m| m.record_stream(b, stream))\n",
     "    with_manager(mgr, |m| m.buffer_info(b).map(|_| ()))\n",
     ["abi_stream_order"]),
    # A lane grows while other lanes hold enough free blocks: it never defers to them.
    ("lanes-never-borrow-free-blocks", "rust/kmm/src/manager/lane.rs",
     "                self.place.is_some() && reserved_elsewhere.saturating_sub(used_elsewhere) >= size\n",
     "                self.place.is_some() && reserved_elsewhere.saturating_sub(used_elsewhere) >= size && false\n",
     ["abi_stream_order"]),
    # The peak in use is the sum of the lanes' peaks (as before the shared Gauge): each lane
    # counts its own peak again, merge adds them, and stats no longer takes the gauge's.
    ("peaks-summed-per-lane", [
        ("rust/kmm/src/pool/stats.rs",
         "        self.in_use += bytes;\n        self.allocs += 1;\n",
         "        self.in_use += bytes;\n        self.peak_in_use = self.peak_in_use.max(self.in_use);\n        self.allocs += 1;\n"),
        ("rust/kmm/src/pool/stats.rs",
         "        self.in_use += other.in_use;\n        self.allocs += other.allocs;\n",
         "        self.in_use += other.in_use;\n        self.peak_in_use += other.peak_in_use;\n        self.allocs += other.allocs;\n"),
        ("rust/kmm/src/manager/mod.rs",
         "        usage.peak_in_use = self.in_use[k].peak().max(usage.in_use);\n",
         ""),
     ], ["abi_stream_order", "abi_lanes"]),
    # Two managers are locked in argument order (destination, then source): copies A->B and B->A
    # take the two slot locks in opposite orders.
    ("two-managers-locked-destination-first", "rust/kmm/src/ffi/registry.rs",
     "    if (a & 0xFFF) < (b & 0xFFF) {\n",
     "    if true {\n",
     ["abi_stream_order"]),
    # A free through a Deferred (adopted memory) no longer reclaims what the stream has passed:
    # only synchronize and trim do.
    ("adopted-memory-not-reclaimed-on-free", "rust/kmm/src/pool/deferred.rs",
     "        // Housekeeping for earlier frees: their trouble is not this free's.\n        let _ = self.reclaim();\n",
     "",
     ["abi_stream_order"]),
    ("wrap-accepts-wrapping-range", "rust/kmm/src/manager/mod.rs",
     "        if ptr.checked_add(bytes).is_none() {\n            fail!(KMM_ERROR_INVALID_ARGUMENT, \"ptr = {ptr:#x} + bytes = {bytes} wraps around the address space\");\n        }\n",
     "",
     ["abi_stream_order"]),
    # Only a registration at the very same start is refused (on CUDA too: overlaps() is the same
    # check). trust_model registers the same
    # pointer twice only, which this still refuses: abi_stream_order alone sees the overlaps.
    ("host-register-overlap-accepted", "rust/kmm/src/backend/pinned_ranges.rs",
     "        let end = start.saturating_add(len.max(1));\n        ranges.range(..end).next_back().is_some_and(|(&base, &size)| base.saturating_add(size.max(1)) > start)\n",
     "        let _ = len;\n        ranges.contains_key(&start)\n",
     ["abi_stream_order"]),
    ("host-unregister-by-non-owner", "rust/kmm/src/manager/mod.rs",
     "        if !registered.contains_key(&(ptr as u64)) {\n            fail!(KMM_ERROR_INVALID_ARGUMENT, \"ptr = {ptr:?} was not registered through this manager\");\n        }\n",
     "",
     ["abi_stream_order", "trust_model"]),
    # kmm_cupy_malloc(0) makes an empty buffer, as before the fix. The fix refuses size 0 twice:
    # cupy.rs returns NULL at once, and alloc_by_address refuses 0 bytes (NULL with an error).
    # Either guard alone keeps the test passing, so the bug takes both out.
    ("cupy-malloc-zero-allocates", [
        ("rust/kmm/src/ffi/cupy.rs",
         "    if size == 0 {\n        return std::ptr::null_mut();\n    }\n",
         ""),
        ("rust/kmm/src/ffi/by_address.rs",
         "    if bytes == 0 {\n        fail!(KMM_ERROR_INVALID_ARGUMENT, \"bytes = 0: an empty allocation has no address to be freed by\");\n    }\n",
         ""),
     ], ["abi_stream_order"]),
    # A free hands the block back without ordering it after the buffer's recorded streams.
    ("free-ignores-recorded-streams", "rust/kmm/src/manager/lane.rs",
     "    order::order_free(backend, on, &record.users)\n}\n",
     "    let _ = (backend, on);\n    Ok(())\n}\n",
     ["stream_model"]),
    # A compaction's move copies a buffer while foreign work recorded on it may still run.
    ("compaction-move-ignores-recorded-streams", "rust/kmm/src/manager/lane.rs",
     "        order::order_free(self.backend, self.home, &record.users)?;\n",
     "",
     ["stream_model"]),
    # A block is handed out for work on another stream than its pool's without that stream
    # waiting for the pool's ordering stream.
    ("alloc-for-other-stream-unordered", "rust/kmm/src/manager/order.rs",
     "    let Reuse::Ordered { stream: order, follows } = *reuse else {\n",
     "    if stream != u64::MAX {\n        return Ok(());\n    }\n    let Reuse::Ordered { stream: order, follows } = *reuse else {\n",
     ["stream_model"]),
    # kmm_plugin_free frees after the stream the buffer was allocated for only, not after the
    # stream it is freed on. MISSED so far: stream_model frees a plugin buffer on the stream it
    # was allocated for, which the allocation already recorded; it takes a free on another stream
    # than the allocation's (with work queued there) to see it.
    ("plugin-free-ignores-its-stream", "rust/kmm/src/manager/lane.rs",
     "        let stream = self.stream_arg(stream);\n        if let Err(e) = self.record_stream(handle, stream) {\n",
     "        let stream = self.stream_arg(stream);\n        if let Err(e) = Ok::<(), crate::error::Error>(()) {\n",
     ["abi_stream_order"]),
    # A plugin allocation served by the caller's lane comes back unpinned: a compaction may move
    # it while the library that holds its address uses it.
    ("plugin-alloc-unpinned", "rust/kmm/src/manager/lane.rs",
     "            Ok(Some(handle)) => match self.map_stamped(handle, false, false) {\n",
     "            Ok(Some(handle)) => match self.buffer_info(handle).map(|(addr, ..)| Some((addr, Option::<MovesFence>::None))) {\n",
     ["abi_stream_order"]),
    # The same, for an allocation the lane did not serve at once (borrowed, after a spill).
    ("plugin-alloc-unpinned-slow-path", "rust/kmm/src/manager/mod.rs",
     "        match self.map(handle) {\n            Ok(addr) => Ok((handle, addr)),\n",
     "        match self.buffer_info(handle).map(|info| info.0) {\n            Ok(addr) => Ok((handle, addr)),\n",
     ["abi_stream_order"]),
    # A plugin allocation pinned under the lane's lock is handed out without waiting for the
    # copies (a spill's copy out) that may still read where it lies (found by review).
    ("plugin-alloc-skips-the-moves-fence", "rust/kmm/src/manager/mod.rs",
     "                return match self.settle_mapped(handle, addr, settle.map(|s| s.fence), false) {\n",
     "                let _ = settle;\n                return match Ok::<u64, crate::error::Error>(addr) {\n",
     ["abi_stream_order"]),
    # Recording (and so a plugin free) on a spilled buffer accepts a stream the backend refuses
    # (found by review).
    ("plugin-free-skips-the-stream-check", "rust/kmm/src/manager/lane.rs",
     "        if stream != self.home {\n            self.backend.check_stream(stream)?;\n        }\n        if record.is_spilled() {\n            return Ok(None);\n        }\n",
     "        if record.is_spilled() {\n            return Ok(None);\n        }\n        if stream != self.home {\n            self.backend.check_stream(stream)?;\n        }\n",
     ["abi_stream_order"]),
    # A compaction move forgets the streams recorded on the buffer: work they queue at the new
    # place after a map is not waited for at the free (found by review).
    ("move-forgets-recorded-streams", "rust/kmm/src/manager/lane.rs",
     "        record.users.insert(self.home);\n        record.settling = true;\n",
     "        record.users = StreamSet::of(self.home);\n        record.settling = true;\n",
     ["abi_compaction"]),
    # CUDA's per-thread default stream taken for one long-lived stream: two threads' work "on 2"
    # would share a pool unordered (found by review).
    ("per-thread-stream-taken-as-one", "rust/kmm/src/manager/order.rs",
     "    stream == home || (cuda && stream <= 1)\n",
     "    stream == home || (cuda && stream <= 2)\n",
     ["lib"]),
    # A free of a whole allocation (direct mode, adopted memory) frees upstream at once, under the
    # lane's lock and inside the free (cuMemFree waits for the whole device).
    ("free-frees-upstream-under-lock", "rust/kmm/src/pool/upstream.rs",
     "        lock(&self.queued).push((addr, bytes));\n        self.pending.raise();\n        Ok(())",
     "        self.inner.deallocate(addr, bytes)",
     ["trust_faults"]),
    # The host backend forgets a stream when its last reference drops, though its worker still
    # runs the work queued on it: work ordered after that stream no longer waits.
    ("host-dropped-stream-taken-for-done", "rust/kmm/src/backend/host.rs",
     "        let retired = self.record(&last).is_ok();\n",
     "        let retired = false && self.record(&last).is_ok();\n",
     ["lib"]),
    # No lane compacts to lend room: a request no free block fits grows the manager although
    # other lanes hold enough free bytes in holes.
    ("no-lending-compaction", "rust/kmm/src/manager/mod.rs",
     "            if kind != MemoryKind::Device || !self.pools_compact || (reserved",
     "            if true || kind != MemoryKind::Device || !self.pools_compact || (reserved",
     ["abi_stream_order"]),
    # The DLPack deleter and the exports table die with kmm.dlpack's globals: a consumer that
    # deletes its tensor in the interpreter's last collection calls into freed memory.
    ("py-dlpack-deleter-dies-at-exit", "python/kmm/dlpack.py",
     "        ctypes.pythonapi.Py_IncRef(ctypes.py_object(f))  # never freed: see above\n",
     "        pass\n",
     ["py:test_bindings_safety.py"]),
    # The exports lock is not reentrant and export() allocates under it: a collection started
    # there ends another export in the same thread and deadlocks.
    ("py-dlpack-exports-lock-deadlock", [
        ("python/kmm/dlpack.py",
         "exports, lock, finalizing = {}, threading.RLock(), sys.is_finalizing",
         "exports, lock, finalizing = {}, threading.Lock(), sys.is_finalizing"),
        ("python/kmm/dlpack.py",
         "    entry = (t, shape, strides, array, buffer._export())\n    with _exports_lock:  # nothing allocated here: see _export_table\n        _exports[address] = entry\n",
         "    release = buffer._export()\n    with _exports_lock:\n        _exports[address] = (t, shape, strides, array, release)\n"),
     ], ["py:test_bindings_safety.py"]),
    # A negative device passes validation and is reported as an unavailable backend.
    ("negative-device-accepted", "rust/kmm/src/manager/config.rs",
     "        if self.device < 0 {\n",
     "        if false && self.device < 0 {\n",
     ["abi_buffers"]),
    # A registration ends while another manager's copy may still read it by DMA.
    ("registration-ends-under-dma", "rust/kmm/src/backend/cuda/mod.rs",
     "            check(sys::cuCtxSynchronize(), \"cuCtxSynchronize\")\n        });",
     "            Ok(())\n        });",
     ["gpu:gpu_streams"]),
    # A Kmm CUDA call leaves its context current on the caller's thread. The host backend has no
    # contexts: only the GPU test sees it.
    ("cuda-context-not-restored", "rust/kmm/src/backend/cuda/mod.rs",
     "        if let Some(previous) = self.previous {\n",
     "        if let Some(previous) = self.previous.filter(|_| false) {\n",
     ["gpu:gpu_streams"]),

    # Kmm.jl's collection every GC_INTERVAL_BYTES of live growth never runs: arrays dropped in a
    # loop keep their memory until Julia's GC happens to run (it does not see device memory).
    ("jl-no-collection-on-growth", "src/storage.jl",
     "        GC.gc(false)\n        _live_bytes_after_gc[] = _live_bytes[]\n",
     "        _live_bytes_after_gc[] = _live_bytes[]\n",
     ["jl:gc.jl"]),
    # --- The eighth adversarial run's Python findings, each fix reversed. ---
    # An import's producer is let go at its buffer's free, before the stream has passed it: queued
    # work reads or writes memory the producer gave back.
    ("py-import-producer-released-at-free", "python/kmm/buffer.py",
     "    def _freeing(self, manager, handle):\n        return _free_import, (manager, handle, self._owner)\n",
     "    def _freeing(self, manager, handle):\n        return _free, (manager, handle)\n",
     ["py:test_adversarial_python_round8.py"]),
    # Buffer.close() raises InvalidHandleError when another thread destroyed its manager after
    # the handle was read (the destroy freed the buffer).
    ("py-buffer-close-raises-after-manager-close", "python/kmm/buffer.py",
     "    if raising and status and not (status == InvalidHandleError.status and not manager._handle):\n",
     "    if raising and status:\n",
     ["py:test_adversarial_python_round8.py"]),
    # A collected Numba plugin destroys its manager under Numba's live pointers.
    ("py-numba-plugin-collected-frees-live-memory", "python/kmm/numba.py",
     "        if held:\n            # Numba's pointers",
     "        if False:\n            # Numba's pointers",
     ["py:test_adversarial_python_round8.py"]),
    # close() with a live export leaves a file trace open: its buffered rows are lost at exit.
    ("py-close-leaves-trace-open", "python/kmm/manager.py",
     "                _lib_.kmm_manager_trace_stop(h)\n                return",
     "                return",
     ["py:test_adversarial_python_round8.py"]),
    # (Session 14 made every wrap a chunk of its own: the plants of a wrap taking a pool chunk's
    # blocks, of a wrap cut at a chunk's end and of aliases kept as one chunk reversed fixes that
    # this rule replaced, and were retired with them.)
    # A wrap of memory inside a pool chunk goes to that chunk, where the buffer it aliases hides it.
    ("map-wrap-joins-pool-chunk", "rust/kmm/src/manager/observe.rs",
     "            if !wrapped && holds(&chunks[..pool], addr, size) {\n",
     "            if holds(&chunks[..pool], addr, size) {\n",
     ["observe", "py:test_adversarial_python_round8.py"]),
    # A stopped file trace keeps its claim on the file while a call (a trim) still holds the trace:
    # a restart on the same path is refused as "another manager's".
    ("trace-claim-outlives-stop", "rust/kmm/src/manager/trace.rs",
     "            f.release_claim();\n            if let Some(e) = f.failed.take() {",
     "            if let Some(e) = f.failed.take() {",
     ["py:test_adversarial_python_round8.py"]),
    # --- The review of session 14's changes, each fix reversed. ---
    # A freed import's producer is queued under a lock that allocates: a collection there runs a
    # garbage import's queued free in the same thread, which takes the lock again (a hang).
    ("py-held-under-allocating-lock", "python/kmm/manager.py",
     "        done = ctypes.c_bool()\n        for _ in range(len(self._held)):\n",
     "        done = ctypes.c_bool()\n        with self._imports_lock:\n            gone = [e for e in self._held]  # noqa: F841 (allocates under the lock)\n        for _ in range(len(self._held)):\n",
     ["py:test_review_s14.py"]),
    # A kmm buffer imported through __cuda_array_interface__ is held as an object only: in one
    # garbage cycle with the import, its own finalizer frees it under the importer's queued work.
    ("py-cai-kmm-producer-not-exported", "python/kmm/array.py",
     "    return obj if buf is None else (obj, _ExportToken(buf._export()))\n",
     "    return obj\n",
     ["py:test_review_s14.py"]),
    # Chunks counted by base address: a wrap at a pool chunk's base, or two wraps of one array,
    # count as one chunk.
    ("py-map-chunks-by-base", "python/kmm/observe.py",
     "        chunks = sum(1 for s in self.segments if s.address == s.chunk)  # a chunk's first segment\n",
     "        chunks = len({s.chunk for s in self.segments})\n",
     ["py:test_review_s14.py"]),
    # Round 9 (Python): kmm.asarray hands back a view of another kind than asked for.
    ("py-asarray-view-ignores-kind", "python/kmm/__init__.py",
     "    if want is not None and want != have:\n",
     "    if False:\n",
     ["py:test_adversarial_python_round9.py"]),
    # Round 9 (Python): a trace path of the wrong type raises os.fsencode's error, naming nothing.
    ("py-trace-path-type-unnamed", "python/kmm/observe.py",
     "        raise TypeError(\"path = %r must be a str, bytes or os.PathLike\" % (path,)) from None\n",
     "        raise\n",
     ["py:test_adversarial_python_round9.py"]),
    # Round 9 (Python): a synchronize lets go of every held import producer, also one whose
    # import another thread freed after the wait (its copy still queued).
    ("py-sync-releases-late-imports", "python/kmm/manager.py",
     "        check(_lib_.kmm_manager_synchronize(self._live()))\n        self._release_passed()\n",
     "        check(_lib_.kmm_manager_synchronize(self._live()))\n        self._release_passed(waited=True)\n",
     ["py:test_adversarial_python_round9.py"]),
    # Round 9 (Julia): a device ordinal out of range is reported with Rust's half-open range,
    # "(0..1)" for one device, which reads as 1 included.
    ("peer-range-half-open", "rust/kmm/src/backend/mod.rs",
     "                if count == 0 { String::new() } else { format!(\", numbered 0 to {}\", count - 1) }\n",
     "                format!(\" (0..{count})\")\n",
     ["multi_device", "jl:adversarial_round9.jl"]),
    # Round 9 (C ABI): a small restore or allocation that must spill a buffer larger than the
    # room left under the spill limit fails while the live set fits the device plus the limit.
    ("spill-no-swap-past-limit", "rust/kmm/src/manager/spill.rs",
     "                if let Some(more) = self.swap_headroom(bytes, restoring) {\n",
     "                if let Some(more) = None::<u64> {\n",
     ["adversarial_round9"]),
    # The same swap not settled: the host stays past its spill limit.
    ("spill-swap-not-settled", "rust/kmm/src/manager/spill.rs",
     "        if swapped_past_limit {\n            self.settle();\n",
     "        if swapped_past_limit {\n",
     ["adversarial_round9"]),
    # Review of session 15: the settle restores most recently used first only (a small buffer
    # first, and then the one that alone would have sufficed finds no room).
    ("spill-settle-greedy", "rust/kmm/src/manager/spill.rs",
     "        for &(_, handle, _) in one_that_suffices.chain(spilled.iter()) {\n",
     "        for &(_, handle, _) in spilled.iter().chain(one_that_suffices) {\n",
     ["review_s15"]),
    # Review of session 15: a swap past the limit whose attempt still fails is not settled (the
    # victims stay on the host, past its limit).
    ("spill-failed-swap-not-settled", "rust/kmm/src/manager/spill.rs",
     "        if swapped_past_limit {\n            self.settle();\n",
     "        if swapped_past_limit && result.is_ok() {\n            self.settle();\n",
     ["review_s15"]),
    # Review of session 15: an import freed while close() waits for the stream (the handle
    # already 0) lets go of its producer at once.
    ("py-close-releases-during-wait", "python/kmm/manager.py",
     "        if h or self._closing:\n",
     "        if h:\n",
     ["py:test_review_s15.py"]),
    # PinnedArray's setindex! checks the handle before converting the value: a conversion that
    # reaches a safepoint lets an unsafe_free! pass, and the store lands in freed memory.
    ("jl-setindex-converts-after-check", "src/pinned.jl",
     "    x = convert(T, v)   # before the handle's check: a conversion may reach a safepoint\n    GC.@preserve p unsafe_store!(hostptr(p), x, i)\n",
     "    GC.@preserve p unsafe_store!(hostptr(p), convert(T, v), i)\n",
     ["jl:review_s14.jl"]),
    # Kmm.jl's collection mark is not lowered by frees: after a large peak, dropped arrays pile
    # up until live bytes pass that peak again (found on the GPU machine's full suite).
    ("jl-gc-mark-not-lowered", "src/storage.jl",
     "    live < base && (_live_bytes_after_gc[] = base = live)\n",
     "",
     ["jl:gc.jl"]),
    # --- The eighth adversarial run's Julia findings, each fix reversed. ---
    # A PinnedArray's 5-argument copyto! with an Array falls to Base's, whose range check wraps
    # for an unsigned n and then writes @inbounds past the pinned memory.
    ("jl-pinned-copyto-wraps", "src/pinned.jl",
     "Base.copyto!(dest::PinnedArray, doffs::Integer, src::AbstractArray, soffs::Integer, n::Integer) =\n    copy_host!(dest, doffs, src, soffs, n)\n",
     "",
     ["jl:adversarial_round8.jl"]),
    # view's lengths of UInt or BigInt ranges reach the Int-only constructor: a MethodError.
    ("jl-view-length-not-int", "src/array.jl",
     "    lens = map(j -> Int(length(j)), J)\n    dims = Tuple(Int(length(j)) for j in J if !(j isa Integer))",
     "    lens = map(length, J)\n    dims = Tuple(length(j) for j in J if !(j isa Integer))",
     ["jl:adversarial_round8.jl"]),
    # close destroys the manager while another thread still copies into one of its PinnedArrays.
    ("jl-close-under-cpu-copy", "src/manager.jl",
     "        quiesce_cpu_access()   # a PinnedArray of `m` read or written in place on another thread\n",
     "",
     ["jl:adversarial_round8.jl"]),
    # An explicit free of a PinnedArray while another thread is between its check and its load.
    ("jl-pinned-free-under-access", "src/pinned.jl",
     "unsafe_free!(p::PinnedArray) = (free!(p.storage; cpu_visible = true); nothing)",
     "unsafe_free!(p::PinnedArray) = (free!(p.storage); nothing)",
     ["jl:adversarial_round8.jl"]),
    # --- The Julia binding's fixes of issue 16 (5a1b3bb, 53ec015), each reversed. ---
    # The CUDA extension's record_stream(x, s) records s on x's storage but does not make s
    # wait for the manager's queued work: a kernel on s may run before Kmm's writes to x.
    ("jl-ext-record-stream-unordered", "ext/KmmCUDAExt.jl",
     "    Kmm.signal_stream(Kmm.manager(x), s)       # work on s sees what Kmm queued on x\n",
     "",
     ["jl:ext.jl"]),
    # Kmm.synchronize finishes every pending copy task, also one another thread queued after its
    # wait: that task's wait returns before its copy has run.
    ("jl-synchronize-finishes-later-copies", "src/manager.jl",
     "    complete_pending!(m, before)\n",
     "    complete_pending!(m, lock(() -> Base.IdSet{Any}(m.pending), m.lock))\n",
     ["jl:adversarial_round5_threads.jl"]),
    # MR-STAT's residual leaves the signal it computed allocated until the next collection.
    ("jl-residual-keeps-signal", "src/qmri/mrstat.jl",
     "    s = with_temporaries(made -> Array(temp!(made, signal(model, m))))   # the signal is a temporary\n",
     "    s = Array(signal(model, m))\n",
     ["jl:adversarial_round4_qmri.jl"]),
    # deepcopy of a KmmArray copies its fields: a second owner of the same buffer handle.
    ("jl-deepcopy-second-owner", "src/copying.jl",
     "function Base.deepcopy_internal(s::KmmStorage, dict::IdDict)\n",
     "function _unused_deepcopy(s::KmmStorage, dict::IdDict)\n",
     ["jl:adversarial_round4.jl"]),
    # A KmmArray serializes (nothing refuses it): its handles would name another process's buffers.
    ("jl-serialize-ships-handles", "src/copying.jl",
     "    throw(ArgumentError(\"a $what cannot be serialized: its libkmm handle names memory of this \" *\n",
     "    (ArgumentError(\"a $what cannot be serialized: its libkmm handle names memory of this \" *\n",
     ["jl:adversarial_round4.jl"]),
    # A copy on manager A that reads or writes a PinnedArray of manager B leaves B's stream
    # unordered: B's stream-ordered free, and close(B), may come while the copy runs.
    ("jl-pinned-of-another-manager-not-ordered", "src/pinned.jl",
     "    signal_stream(m, stream(pm))\n    return true\n",
     "    return true\n",
     ["jl:adversarial.jl"]),
    # A task polling a KmmCopyTask takes the failed query of an event another task finished
    # (and destroyed) meanwhile for an error, and `wait` throws.
    ("jl-copy-task-finished-elsewhere-throws", "src/async.jl",
     "    t.event != ev && return true\n",
     "",
     ["jl:adversarial.jl"]),
    # Calls that may wait for the device inside libkmm (allocation, map, trim, destroy) are no
    # longer marked GC-safe: every other thread that needs a collection waits for the device.
    ("jl-blocking-ccalls-hold-the-collector", "src/library.jl",
     "        local state = ccall(:jl_gc_safe_enter, Int8, ())\n",
     "        local state = Int8(0)\n",
     ["jl:adversarial.jl"]),
    # copyto!'s range check sums offset and count: an offset near typemax(Int) wraps and passes.
    ("jl-copyto-range-wraps", "src/array.jl",
     "    (n <= length(a) && f <= offs <= f + (length(a) - Int(n))) ||\n        throw(BoundsError(a, big(offs):big(offs) + n - 1))  # (no type of the arguments' holds every sum)\n",
     "    (offs >= f && offs + n - 1 <= f + length(a) - 1) || throw(BoundsError(a, offs:offs+n-1))\n",
     ["jl:safety.jl"]),
    # KmmManager keywords are converted as they come: wrapped, rounded or InexactError.
    ("jl-config-keywords-unchecked", "src/manager.jl",
     "    ok = v isa Integer && !(v isa Bool) && lo <= v <= typemax(T)\n",
     "    return convert(T, v)\n    ok = v isa Integer && !(v isa Bool) && lo <= v <= typemax(T)\n",
     ["jl:safety.jl"]),
    # A storage's handle is claimed without the lock: two tasks on two threads both free it.
    # The spin only widens the window between the read and the write (a preemption could), so
    # that the test's 50 rounds of four tasks on 2 threads meet it.
    ("jl-free-claim-unlocked", "src/manager.jl",
     "    lock(_claim_lock)\n    h = x.handle\n    x.handle = 0\n    unlock(_claim_lock)\n",
     "    h = x.handle\n    t = time_ns(); while time_ns() - t < 20_000 end\n    x.handle = 0\n",
     ["jl:safety.jl"]),
    # synchronize and wait(::KmmCopyTask) block in libkmm instead of polling and yielding.
    # safety.jl sees synchronize; whether wait yields it does not check (timing).
    ("jl-waits-block", [
        ("src/manager.jl",
         "        poll_until(() -> event_done(m, ev))\n",
         "        GC.@preserve m LibKmm.kmm_event_wait(handle(m), ev)\n"),
        ("src/async.jl",
         "    poll_until(() -> isdone(t))   # yields to other tasks while the copy runs\n",
         "    t.manager.handle != 0 && LibKmm.kmm_event_wait(t.manager.handle, t.event)\n"),
     ], ["jl:safety.jl"]),
    # The synchronous copies behind Array(x), copyto! and scalar access wait inside libkmm's
    # blocking copy instead of queueing it and polling.
    ("jl-copies-block", [
        ("src/array.jl",
         "    check_restoring(s) do\n        GC.@preserve s @gcsafe LibKmm.unchecked_kmm_copy_to_device_async(mh, h, UInt64(offset), Ptr{Cvoid}(ptr), UInt64(bytes), ev)\n    end\n    try\n        order_host_memory!(s.manager, host)\n    finally\n        wait_event(s.manager, ev[])\n    end\n",
         "    GC.@preserve s LibKmm.kmm_copy_to_device(mh, h, offset, ptr, bytes)\n    order_host_memory!(s.manager, host)\n"),
        ("src/array.jl",
         "    check_restoring(s) do\n        GC.@preserve s @gcsafe LibKmm.unchecked_kmm_copy_to_host_async(mh, Ptr{Cvoid}(ptr), h, UInt64(offset), UInt64(bytes), ev)\n    end\n    try\n        order_host_memory!(s.manager, host)\n    finally\n        wait_event(s.manager, ev[])\n    end\n",
         "    GC.@preserve s LibKmm.kmm_copy_to_host(mh, ptr, h, offset, bytes)\n    order_host_memory!(s.manager, host)\n"),
     ], ["jl:safety.jl"]),
    # A wait that finds its manager's handle gone returns before close's destroy has drained
    # the stream (close drops the handle first): the copy returns with its bytes not there yet.
    ("jl-closed-handle-taken-for-drained", "src/manager.jl",
     "    mh == 0 && return m.destroyed[]\n",
     "    mh == 0 && return true\n",
     ["jl:threads_body.jl"]),
    # close reads and zeroes the handle unlocked: two threads closing one manager both destroy
    # it, the second fails and marks it destroyed while the first still drains the stream.
    ("jl-close-claims-unlocked", "src/manager.jl",
     "    h = claim_handle!(m)\n    h == 0 && return wait_destroyed(m)",
     "    h = m.handle\n    t0 = time_ns(); while time_ns() - t0 < 20_000 end\n    m.handle = 0\n    h == 0 && return wait_destroyed(m)",
     ["jl:threads_body.jl"]),
    # close takes the manager's lock (which may yield, and be interrupted) before the destroy,
    # and marks the manager destroyed in a finally whether or not the destroy ran.
    ("jl-close-marks-destroyed-before-destroy", "src/manager.jl",
     "        try\n            # waits for what is left (work queued meanwhile), frees every buffer\n            check_status(@gcsafe LibKmm.unchecked_kmm_manager_destroy(h, UInt32(0)))\n        finally\n            m.destroyed[] = true\n",
     "        m.destroyed[] = true\n        lock(() -> empty!(m.pending), m.lock)\n        try\n            check_status(@gcsafe LibKmm.unchecked_kmm_manager_destroy(h, UInt32(0)))\n        finally\n",
     ["jl:safety.jl"]),
    # A copy, fill or map of a spilled array that finds no memory for its restore fails at once,
    # where an allocation would have collected garbage and trimmed first.
    ("jl-restore-no-oom-retry", "src/storage.jl",
     "    st == LibKmm.KMM_OK || retry_out_of_memory(call, st, s.manager, s.bytes)\n",
     "    st == LibKmm.KMM_OK || throw_kmm_error(st)\n",
     ["jl:adversarial_round3.jl"]),
    # A simulation that fails leaves its output array allocated until the next collection.
    ("jl-failed-simulate-keeps-output", "src/qmri/simulate.jl",
     "        out = result!(made, KmmArray{ComplexF32}(undef, length(seq), n; manager = manager))\n",
     "        out = KmmArray{ComplexF32}(undef, length(seq), n; manager = manager)\n",
     ["jl:adversarial_round3.jl"]),
    # A manager collected while a copy into a host array is queued is destroyed at once.
    ("jl-manager-finalized-under-copy", "src/manager.jl",
     "    if !finished_pending(m)\n        finalizer(finalize_manager, m)\n        return nothing\n    end\n",
     "",
     ["jl:safety.jl"]),
    # The CUDA.jl extension: a view's collection drops the storage's pin again (as before issue
    # 16), so an array CUDA.jl derived from the view sees its memory moved by compaction.
    ("jl-ext-view-unpins-at-collection", "ext/KmmCUDAExt.jl",
     "(::HoldStorage)(_) = nothing\n",
     "(h::HoldStorage)(_) = (Kmm.unmap_storage(h.storage); nothing)\n",
     ["jl:ext.jl"]),
    # The extension pins but records no task stream: the storage's free does not wait for it.
    ("jl-ext-task-stream-not-recorded", "ext/KmmCUDAExt.jl",
     "        Kmm.record_stream(s, raw)                   # also the check that s is still allocated\n",
     "        Kmm.handles(s)                              # also the check that s is still allocated\n",
     ["jl:ext.jl"]),
    # Issue 18: compressed scores normalised by the projected signal (as before): each one-atom
    # batch's own rank-1 basis holds its atom, every score is 1 and the first batch wins.
    ("match-norms-of-projected-signal", "rust/kmm/src/qmri/run.rs",
     "                            cpu::match_columns(&dc, rank, &svd::project(&u, ntr, rank, sig), &cpu::column_norms(&dc, rank), &xn)\n",
     "                            { let px = svd::project(&u, ntr, rank, sig); cpu::match_columns(&dc, rank, &px, &cpu::column_norms(&dc, rank), &cpu::column_norms(&px, rank)) }\n",
     ["qmri_compressed"]),
    # The argmax kernel's signal norms from the compressed signals (the GPU's form of the above).
    ("match-kernel-norms-of-projected-signal", "rust/kmm/src/qmri/gpu.rs",
     "                    sig + (v0 * ntr * 8) as u64,\n                    ntr as u64,\n",
     "                    csig + (v0 * k * 8) as u64,\n                    k as u64,\n",
     ["gpu:qmri_compressed"]),
    # The Julia batches each compressed on their own subspace again (no shared basis).
    ("jl-match-batches-own-basis", "src/qmri/match.jl",
     "    if u === nothing && 0 < rank < ntr\n",
     "    if false\n",
     ["jl:qmri.jl"]),
    # Generate-and-match leaves its uploads (signals, parameters, basis) to the next collection.
    ("jl-match-keeps-its-uploads", [
        ("src/qmri/match.jl", "        p = temp!(made, as_params(params, m), params)\n        match_batches(",
         "        p = as_params(params, m)\n        match_batches("),
        ("src/qmri/match.jl", "    temp!(made, s, signals)\n    u = temp!(made, choose_basis(basis, rank, ntr, m), basis)\n    check_basis",
         "    u = choose_basis(basis, rank, ntr, m)\n    check_basis")],
     ["jl:qmri.jl"]),
    # A worker leaves its part of the maps allocated on its default manager.
    ("jl-worker-keeps-its-maps", "src/qmri/distributed.jl",
     "        foreach(x -> temp!(made, x), maps)            # freed also when a copy back fails\n",
     "",
     ["jl:distributed.jl"]),
    # With CUDA usable, an auto manager on a device CUDA lacks falls back to a host stand-in.
    ("auto-falls-back-to-host", "rust/kmm/src/backend/mod.rs",
     "        BackendChoice::Auto if cuda_usable() => cuda::CudaBackend::get(device)?,\n        BackendChoice::Auto => host::HostBackend::get(device)?,\n",
     "        BackendChoice::Auto => match cuda::CudaBackend::get(device) {\n            Ok(b) => b,\n            Err(_) => host::HostBackend::get(device)?,\n        },\n",
     ["gpu:backend_env"]),
    # The device's check of an MR-STAT model lets non-finite coil sensitivities through.
    ("mrstat-device-check-skips-coils", "rust/kmm/src/qmri/mrstat_model.cu",
     "        if (!(isfinite(c.x) && isfinite(c.y))) atomicMin(&found[1], (unsigned long long)i);\n",
     "",
     ["gpu:mrstat_abi"]),
    # The column path of MR-STAT takes one term fewer of the readout's series than its bound needs.
    ("mrstat-columns-one-term-short", "rust/kmm/src/qmri/mrstat_columns.rs",
     "            return Some(n);\n",
     "            return Some(n.max(2) - 1);\n",
     ["lib"]),
    # The column path's grouping ignores its bound on a segment's voxels.
    ("mrstat-columns-segments-uncut", "rust/kmm/src/qmri/mrstat_columns.rs",
     " || i - first == most {",
     " {",
     ["lib"]),
    # The positions' hash leaves out the voxel's index: reordered voxels reuse a stale grouping.
    ("mrstat-columns-hash-ignores-order", "rust/kmm/src/qmri/mrstat_model.cu",
     "        h1 = mix64(key ^ mix64((unsigned long long)i));\n        h2 = mix64(key + mix64((unsigned long long)i ^ 0x9E3779B97F4A7C15ull));\n",
     "        h1 = mix64(key);\n        h2 = mix64(key + 0x9E3779B97F4A7C15ull);\n",
     ["gpu:mrstat_abi"]),
    # The column adjoint's T2 decay term reads the series' term l instead of l + 1.
    ("mrstat-columns-adjoint-decay-term", "rust/kmm/src/qmri/mrstat_columns.cu",
     "make_float2(c * cur.x + h * next.x, c * cur.y + h * next.y)",
     "make_float2(c * cur.x + h * cur.x, c * cur.y + h * cur.y)",
     ["gpu:mrstat_abi"]),
    # The column path's synthesis leaves out the factor exp(c z) of a piece's centre.
    ("mrstat-columns-piece-centre-dropped", "rust/kmm/src/qmri/mrstat_columns.cu",
     "        const float2 ce = cmulf(coil[v], centre_factor(z, c)), cr = cmulf(ce, rho[v]);",
     "        const float2 ce = coil[v], cr = cmulf(ce, rho[v]);",
     ["gpu:mrstat_abi"]),
    # A piece's centre factor exp(c z) decays the wrong way.
    ("mrstat-columns-centre-decay-sign", "rust/kmm/src/qmri/mrstat_columns.cu",
     "    const float mag = expf((float)(c * z.x));",
     "    const float mag = expf((float)(-c * z.x));",
     ["gpu:mrstat_abi"]),
    # The column path's adjoint runs however many piece-terms its reduction must read.
    ("mrstat-columns-adjoint-rule-dropped", "rust/kmm/src/qmri/mrstat_columns.rs",
     "    if adjoint && npieces * (nterms + 1) > ADJOINT_TERMS {\n",
     "    if false && adjoint && npieces * (nterms + 1) > ADJOINT_TERMS {\n",
     ["lib"]),
    # A generate-and-match call that fails (on a worker, say) leaves its batch and outputs.
    ("jl-failed-match-keeps-its-arrays", "src/qmri/match.jl",
     "        temp!(made, d)          # freed below once matched; noted for a batch that fails\n",
     "",
     ["jl:distributed.jl"]),
    # A match of a dictionary in memory that fails leaves its outputs.
    ("jl-failed-dictionary-match-keeps-outputs", "src/qmri/match.jl",
     "        o = result!(made, RawOutputs(m, nvox, p !== nothing))\n",
     "        o = RawOutputs(m, nvox, p !== nothing)\n",
     ["jl:qmri.jl"]),
    # Signals are uploaded before their shape is checked (a bad call leaves the upload).
    ("jl-signals-uploaded-before-the-check", "src/qmri/match.jl",
     "    signals isa AbstractArray && signal_shape(size(signals), ntr)\n",
     "",
     ["jl:qmri.jl"]),
    # A worker unmaps (finalizes) whatever signals it received, the caller's own array included.
    ("jl-worker-frees-fetched-signals", "src/qmri/shipped_signals.jl",
     "    mapping === nothing && return f(Distributed.remotecall_fetch(shipped_array, s.owner, s.id))\n",
     "    mapping === nothing && return (x = Distributed.remotecall_fetch(shipped_array, s.owner, s.id); r = f(x); fill!(x, 0); r)\n",
     ["jl:distributed.jl"]),
    # The caller writes the shared signals before it sends the calls (no overlap).
    ("jl-signals-written-before-the-calls", "src/qmri/distributed.jl",
     "    calls = Any[try send(i, w) catch err caught(err) end for (i, w) in enumerate(ws)]\n    sent()\n",
     "    sent()\n    calls = Any[try send(i, w) catch err caught(err) end for (i, w) in enumerate(ws)]\n",
     ["jl:distributed.jl"]),
    # deepcopy takes every pinned storage for a PinnedArray's (mapped): an unmapped one (a
    # KmmArray with kind = :pinned) is copied from its NULL host address.
    ("jl-deepcopy-pinned-by-kind", [
        ("src/copying.jl",
         "    return dict[s] = s.hostptr == C_NULL ? copy_unmapped(s) : copy_mapped(s)\n",
         "    return dict[s] = s.kind != LibKmm.KMM_MEMORY_PINNED ? copy_unmapped(s) : copy_mapped(s)\n"),
        ("src/copying.jl",
         "Ptr{UInt8}(mapped_address(s))",
         "Ptr{UInt8}(s.hostptr)"),
     ], ["jl:adversarial_round6.jl"]),
    # A sequence's vectors are checked on construction only: resized since, the library reads
    # phases and profile (or rf_shape, z) past their ends.
    ("jl-sequence-sizes-at-construction-only", [
        ("src/qmri/sequences.jl",
         "    check_fisp_sizes(\"FISPSequence\" * RESIZED, s.flip_angles, s.phases, s.profile)\n", ""),
        ("src/qmri/sequences.jl",
         "    check_pssfp_sizes(\"PSSFPSequence\" * RESIZED, s.flip_angles, s.phases, s.rf_shape, s.z)\n", ""),
     ], ["jl:adversarial_round6.jl", "jl:qmri.jl"]),
    # An MR-STAT model made field by field passes counts its arrays do not have.
    ("jl-mrstat-model-unchecked", "src/qmri/mrstat.jl",
     "function cmodel(model::MRSTATModel)\n    check_model(model)\n",
     "function cmodel(model::MRSTATModel)\n",
     ["jl:qmri.jl"]),
    # An explicit finalize destroys (deferred) a manager a synchronous copy waits on: the wait
    # takes the destroy for completion and returns before its bytes arrived.
    ("jl-finalize-ignores-waits", "src/manager.jl",
     "    waited = m.waits > 0\n",
     "    waited = false\n",
     ["jl:adversarial_round6.jl"]),
    # copyto! between element types makes view(src, soffs:soffs+n-1) before checking the range.
    ("jl-converting-copy-unchecked", "src/array.jl",
     "    check_range(dest, doffs, n); check_range(src, soffs, n)   # before the view: its sum wraps\n",
     "",
     ["jl:adversarial_round6.jl"]),
    # A voxel that matches nothing reports atom 0 (the reference starts from a score of -1).
    ("match-zero-signal-reports-atom-0", "rust/kmm/src/qmri/cpu.rs",
     "            let mut best = (0.0f32, -1i64, C64::ZERO);\n",
     "            let mut best = (-1.0f32, 0i64, C64::ZERO);\n",
     ["qmri_compressed"]),
    # The argmax kernel likewise (run on the CPU by the kernel harness).
    ("match-kernel-zero-signal-reports-atom-0", "rust/kmm/src/qmri/kernels.cu",
     "    float bv = 0.f;\n    int bi = -1;\n",
     "    float bv = -1.f;\n    int bi = 0;\n",
     ["qmri_kernels_on_cpu"]),
    # FISP in the next pulse's frame: the frame change between pulses dropped (phase-cycled RF
    # then runs as if every pulse had the first one's phase).
    ("fisp-frame-change-dropped", "rust/kmm/src/qmri/kernels.cu",
     "            const float2 u = cmul(half_tr, cmul(e, make_float2(next.y, -next.z)));\n",
     "            const float2 u = half_tr;\n",
     ["qmri_kernels_on_cpu"]),
    # The same kernel: Z(0)'s regrowth over a TR dropped.
    ("fisp-regrowth-dropped", "rust/kmm/src/qmri/kernels.cu",
     "                V[0].y += regrow;\n",
     "",
     ["qmri_kernels_on_cpu"]),
    # Accumulating, a batch that matches nothing overwrites the earlier result.
    ("match-unmatched-batch-overwrites", "rust/kmm/src/qmri/run.rs",
     "            if if f.index >= 0 { earlier >= f.score } else { earlier >= 0.0 } {\n",
     "            if f.index >= 0 && earlier >= f.score {\n",
     ["qmri_compressed"]),
    # Review (issue 18): accumulating, a voxel a batch matches nothing in is always skipped, so
    # one that never matches keeps the caller's uninitialised index (score still -1).
    ("match-unmatched-from-start-keeps-garbage", "rust/kmm/src/qmri/run.rs",
     "            if if f.index >= 0 { earlier >= f.score } else { earlier >= 0.0 } {\n",
     "            if if f.index >= 0 { earlier >= f.score } else { true } {\n",
     ["qmri_compressed"]),
    # Issue 21: a copy between devices does not wait for the source's earlier work.
    ("peer-copy-skips-source-wait", "rust/kmm/src/manager/peer.rs",
     "        src.backend.order_streams(src_raw, dst_raw)?;\n        dst.stream.copy_peer",
     "        dst.stream.copy_peer",
     ["multi_device"]),
    # The source's later work (a fill, a free and reuse) does not wait for the copy.
    ("peer-copy-source-does-not-wait", "rust/kmm/src/manager/peer.rs",
     "        super::copy::order_after_copy(dst, src)\n",
     "        Ok(())\n",
     ["multi_device"]),
    # Review (issue 21): when the source's wait for a queued peer copy cannot be queued, the
    # call returns its error with the copy still in flight and nothing ordering it.
    ("failed-ordering-leaves-copy-in-flight", "rust/kmm/src/manager/copy.rs",
     "        for _ in 0..3 {\n            if run.stream.synchronize().is_ok() {\n                break;\n            }\n        }\n        Err(e)",
     "        Err(e)",
     ["multi_device"]),
    # The staged path: the destination's copy out of a slot does not wait for the source's copy in.
    ("staged-copy-skips-source-wait", "rust/kmm/src/manager/peer.rs",
     "                .and_then(|_| src.backend.order_streams(src_raw, dst_raw))\n",
     "",
     ["multi_device"]),
    # The staged path releases a slot after the source's copy into it, not the destination's out.
    ("staged-slot-released-early", "rust/kmm/src/manager/peer.rs",
     "            staging.submit(dst.stream.as_ref(), block, None)?;",
     "            staging.submit(src.stream.as_ref(), block, None)?;",
     ["multi_device"]),
    # Ending a registration no longer excludes copies being queued: a small copy from the range
    # queued after the drain is DMA after the unregister (trust_model's deferred teardown
    # against the walk's next copy; intermittent, about one run in four on two H200s).
    ("registration-ends-under-queued-copy", "rust/kmm/src/backend/cuda/mod.rs",
     "        let _no_copy_queued = REGISTRATIONS.write().unwrap_or_else(|e| e.into_inner());\n",
     "",
     ["gpu:trust_model"]),
    # A given basis is not checked: a basis of ones is accepted.
    ("match-basis-not-checked", "rust/kmm/src/qmri/run.rs",
     "            if check_basis_first {\n",
     "            if false && check_basis_first {\n",
     ["qmri_compressed"]),
    # Traces (issue 20). The RMM form writes a move as it is: RMM's parser refuses the row.
    ("trace-rmm-form-keeps-moves", "rust/kmm/src/manager/csv.rs",
     "                    line(out, &freed, Action::Free, old, 0)?;\n                    line(out, r, Action::Allocate, r.address, 0)\n",
     "                    let _ = (old, freed);\n                    line(out, r, Action::Move, r.address, 0)\n",
     ["observe"]),
    # A compaction's move is not recorded: later frees name addresses no record gave.
    ("trace-misses-moves", "rust/kmm/src/manager/lane.rs",
     "        if let Some(t) = self.trace.as_deref_mut() {\n            t.record(Action::Move,",
     "        if let Some(t) = self.trace.as_deref_mut().filter(|_| false) {\n            t.record(Action::Move,",
     ["observe"]),
    # Chunks given back are not recorded (the trim's row).
    ("trace-misses-trims", "rust/kmm/src/manager/release.rs",
     "                    t.record(super::trace::Action::Trim, kind, base, size, self.raw_stream(), 0, 0);\n",
     "",
     ["observe"]),
    # A full ring stops taking records instead of dropping the oldest.
    ("trace-ring-keeps-the-oldest", "rust/kmm/src/manager/trace.rs",
     "        self.slots[self.next].write(record);\n",
     "        if self.recorded < capacity as u64 {\n            self.slots[self.next].write(record);\n        }\n",
     ["observe"]),
    # The memory map shows mapped buffers as merely in use (they never move; the map must say so).
    ("map-forgets-mapped-buffers", "rust/kmm/src/manager/observe.rs",
     "let state = if mapped { SegmentState::Mapped } else { SegmentState::InUse };",
     "let state = if mapped && false { SegmentState::Mapped } else { SegmentState::InUse };",
     ["observe", "py:test_observe.py"]),
    # A wrap that aliases another buffer's memory gives overlapping segments.
    ("map-segments-overlap-for-aliases", "rust/kmm/src/manager/observe.rs",
     "let (start, stop) = (addr.max(at), (addr + bytes).min(end));",
     "let (start, stop) = (addr, addr + bytes);",
     ["observe"]),
    # The RMM form writes pinned rows, which RMM's replay allocates as device memory.
    ("rmm-form-keeps-pinned-rows", "rust/kmm/src/manager/csv.rs",
     "        if r.kind != 0 {\n            return Ok(());\n        }\n",
     "",
     ["observe"]),
    # A call that took a file trace before its stop writes after the stop flushed the file.
    ("trace-file-written-after-stop", "rust/kmm/src/manager/trace.rs",
     "if failed.is_none() && !*closed {",
     "if failed.is_none() {",
     ["lib"]),
    # Spill to host (manager/spill.rs). The copy out no longer waits for the streams that used
    # the buffer: a recorded stream's late write is lost.
    ("spill-skips-the-users-fence", "rust/kmm/src/manager/spill.rs",
     "        order::order_free(backend, home, &r.users)?;\n        // SAFETY: the buffer's block is live pool memory",
     "        // SAFETY: the buffer's block is live pool memory",
     ["spill"]),
    # Mapped buffers spill (their address stops holding their bytes).
    ("spill-takes-mapped-buffers", "rust/kmm/src/manager/spill.rs",
     "        self.kind == MemoryKind::Device\n            && self.pins == 0\n",
     "        self.kind == MemoryKind::Device\n",
     ["spill"]),
    # A restored buffer is not marked settling: a map returns before the copy in has run.
    ("restore-map-skips-the-copy-fence", "rust/kmm/src/manager/spill.rs",
     "        r.settling = true;\n        // Off the spilled bytes",
     "        // Off the spilled bytes",
     ["spill"]),
    # Freeing a spilled buffer keeps its host bytes counted (and held).
    ("spilled-free-keeps-host-memory", "rust/kmm/src/manager/lane.rs",
     "            Origin::Spilled(place) => {\n                self.spill.give_back(place, record.bytes, true);\n",
     "            Origin::Spilled(_place) => {\n",
     ["spill", "stream_model"]),
    # The out-of-memory ladder never spills.
    ("alloc-ladder-never-spills", "rust/kmm/src/manager/spill.rs",
     "        if kind != MemoryKind::Device || self.spill.limit == 0 || self.never_fits_device(bytes).is_some() {",
     "        if kind != MemoryKind::Device || self.spill.limit != u64::MAX || self.never_fits_device(bytes).is_some() {",
     ["spill"]),
    # The pinned ladder forgets the spill store's idle pinned chunks (they count against the
    # pinned limit): pinned allocations fail after spills.
    ("pinned-ladder-keeps-the-spill-store", "rust/kmm/src/manager/spill.rs",
     "if kind == MemoryKind::Pinned { self.release_spill() } else { Ok(()) }",
     "Ok(())",
     ["spill"]),
    # The pinned ladder has no rung that moves spilled data from pinned to pageable memory: a
    # pinned allocation fails while spilled buffers hold the pinned limit (the fifth adversarial
    # run's finding).
    ("pinned-ladder-keeps-spilled-data-pinned", "rust/kmm/src/manager/spill.rs",
     "        if kind == MemoryKind::Pinned && self.spill.limit != 0 && self.unpinning_may_serve(bytes) {\n",
     "        if kind == MemoryKind::Pinned && self.spill.limit == u64::MAX && self.unpinning_may_serve(bytes) {\n",
     ["spill"]),
    # That rung copies a spilled buffer's pinned place without waiting for the fence after its
    # copy out: it reads bytes the copy out has not written yet.
    ("unpin-spilled-skips-the-copy-out-fence", "rust/kmm/src/manager/spill.rs",
     "            Ok(fence) => fence.synchronize()?,\n",
     "            Ok(fence) => drop(fence),\n",
     ["spill"]),
    # A failed never_spill keeps the new setting.
    ("failed-never-spill-keeps-the-setting", "rust/kmm/src/manager/spill.rs",
     "                    r.never_spill = was;\n",
     "",
     ["spill"]),
    # A spill leaves no moves' fence: a new buffer in the spilled place maps before the copy out
    # has read it, and the host's writes reach the spilled copy.
    ("spill-leaves-no-moves-fence", "rust/kmm/src/manager/spill.rs",
     "        // waits for the copy), as after a compaction move.\n        self.fence_moves();\n",
     "        // waits for the copy), as after a compaction move.\n",
     ["spill"]),
    # kmm.cupy's compiled allocator (python/kmm/_cupy_calls.c): the owner CuPy drops never frees
    # the buffer.
    ("cupy-compiled-owner-never-frees", "python/kmm/_cupy_calls.c",
     "        plugin_free(a->handle, a->buffer, a->stream);\n        live--;\n",
     "        live--;\n",
     ["py:test_cupy_plugin.py"]),
    # ... or allocates for the legacy default stream instead of CuPy's current one.
    ("cupy-compiled-ignores-cupys-stream", "python/kmm/_cupy_calls.c",
     "plugin_alloc(handle, size, KMM_MEMORY_DEVICE, (uint64_t)stream, &buffer, &address)",
     "plugin_alloc(handle, size, KMM_MEMORY_DEVICE, 0, &buffer, &address)",
     ["py:test_cupy_plugin.py"]),
    # Round 10 (C ABI): a restore that fails is not counted in failed_allocs ...
    ("spill-failed-restore-uncounted", "rust/kmm/src/manager/spill.rs",
     "                        let mut own = self.lane(lane);\n                        own.usage[MemoryKind::Device as usize].on_failure();\n",
     "                        let own = self.lane(lane);\n",
     ["spill"]),
    # ... nor traced as an allocate failure.
    ("spill-failed-restore-untraced", "rust/kmm/src/manager/spill.rs",
     "                    if let Some(t) = self.recording() {\n                        t.record(super::trace::Action::AllocateFailure",
     "                    if let Some(t) = self.recording().filter(|_| false) {\n                        t.record(super::trace::Action::AllocateFailure",
     ["spill"]),
    # Round 10 (Julia): a request larger than the hard limit on its own spills every buffer.
    ("spill-for-a-request-that-cannot-fit", "rust/kmm/src/manager/spill.rs",
     "        if kind != MemoryKind::Device || self.spill.limit == 0 || self.never_fits_device(bytes).is_some() {\n",
     "        if kind != MemoryKind::Device || self.spill.limit == 0 {\n",
     ["spill"]),
    # Round 10 (Julia): the BoundsError of an out-of-range copy is built in Int128, which an
    # unsigned 128-bit count turns into an InexactError.
    ("jl-bounds-error-in-int128", "src/array.jl",
     "        throw(BoundsError(a, big(offs):big(offs) + n - 1))",
     "        throw(BoundsError(a, Int128(offs):Int128(offs) + n - 1))",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Julia): scalar access of an element type of no bytes recurses without end.
    ("jl-zero-size-scalar-recurses", "src/scalar.jl",
     "    sizeof(T) == 0 && return T.instance\n",
     "",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Julia): elements of no bytes let the dimensions' product wrap.
    ("jl-zero-size-length-wraps", "src/array.jl",
     "    n = 1\n    overflow = false\n    for d in dims\n        d >= 0 || throw_bad_dims(dims, \"negative dimension\")\n",
     "    n = sizeof(T) == 0 ? 0 : 1\n    overflow = false\n    for d in dims\n        d >= 0 || throw_bad_dims(dims, \"negative dimension\")\n",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Julia): a copy task shows its event field, "pending" after the copy ran.
    ("jl-copy-task-show-reads-field", "src/async.jl",
     "(try isdone(t) catch; false end) ? \"done\"",
     "t.event == 0 ? \"done\"",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Julia): KmmArray{T}(a) allocates before converting a.
    ("jl-constructor-allocates-before-converting", "src/array.jl",
     "    filled(host_dense(T, a)) do   # converted first: a conversion that fails allocates nothing\n        KmmArray{T,N}(undef, size(a); kw...)\n    end\n",
     "    copyto!(KmmArray{T,N}(undef, size(a); kw...), host_dense(T, a))\n",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Julia): a failed copy into a new PinnedArray leaves it allocated.
    ("jl-pinned-constructor-keeps-failed-copy", "src/pinned.jl",
     "PinnedArray(a::AbstractArray{T,N}; kw...) where {T,N} = filled(() -> PinnedArray{T,N}(undef, size(a); kw...), a)\n",
     "PinnedArray(a::AbstractArray{T,N}; kw...) where {T,N} = copyto!(PinnedArray{T,N}(undef, size(a); kw...), a)\n",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Julia): showing a view of a freed PinnedArray throws.
    ("jl-freed-pinned-view-show-throws", "src/wrappers.jl",
     "function Base.show(io::IO, m::MIME\"text/plain\", v::WrappedKmm)\n    root_freed(v) &&",
     "function Base.show(io::IO, m::MIME\"text/plain\", v::WrappedKmm)\n    false &&",
     ["jl:adversarial_round10.jl"]),
    # Round 10 (Python): an `__index__` that returns a bool passes for 0 or 1.
    ("py-index-returning-bool-accepted", "python/kmm/_args.py",
     "    if isinstance(v, bool) or not isinstance(v, int):\n",
     "    if not isinstance(v, int):\n",
     ["py:test_adversarial_python_round10.py"]),
    # Round 10 (Python): a dtype NumPy does not know raises NumPy's error, naming nothing.
    ("py-dtype-error-unnamed", "python/kmm/_args.py",
     "    try:\n        return np.dtype(dtype)\n    except (TypeError, ValueError) as e:\n",
     "    try:\n        return np.dtype(dtype)\n    except ZeroDivisionError as e:\n",
     ["py:test_adversarial_python_round10.py"]),
    # Round 10 (Python): a backend of the wrong type is a ValueError, not a TypeError.
    ("py-backend-type-is-value-error", "python/kmm/__init__.py",
     "    if not isinstance(backend, str):\n        raise TypeError(",
     "    if not isinstance(backend, str):\n        raise InvalidArgumentError(",
     ["py:test_adversarial_python_round10.py"]),
    # Round 10 (Python): a DLPack export orders and records the consumer's stream before the
    # checks that may refuse it.
    ("py-dlpack-orders-before-refusing", "python/kmm/dlpack.py",
     "    buffer._live()\n    # Every refusal before the streams are touched: a refused export changes nothing.\n",
     "    buffer._live()\n    order_for_consumer(buffer.manager, dev_type, stream)\n",
     ["py:test_adversarial_python_round10.py"]),
    # Round 11 (Python): an int subclass is read through its own __int__, not its value.
    ("py-int-subclass-read-by-its-int", "python/kmm/_args.py",
     "        return int.__index__(value)\n",
     "        return int(value)\n",
     ["py:test_adversarial_python_round11.py"]),
    # Round 11 (Python): NumPy's "safe" cast to a finer time unit wraps large counts.
    ("py-datetime-unit-change-wraps", "python/kmm/array.py",
     "    if host.dtype.kind in \"mM\" and host.dtype != dtype:\n",
     "    if False:\n",
     ["py:test_adversarial_python_round11.py"]),
    # Round 11 (Python): non-ASCII bytes into a str array raise NumPy's UnicodeDecodeError.
    ("py-set-unicode-error-unnamed", "python/kmm/array.py",
     "        except UnicodeError:\n            # Bytes into a str array",
     "        except ZeroDivisionError:\n            # Bytes into a str array",
     ["py:test_adversarial_python_round11.py"]),
    # Round 11 (observability): a block under a pixel joins the whole next block, in its colour.
    ("map-small-block-joins-the-next-whole", "rust/kmm/src/figures.rs",
     "            if let Some(r) = run.as_mut().filter(|r| x < r.end && end <= r.end + 1.0 && r.takes(s)) {\n",
     "            if let Some(r) = run.as_mut().filter(|r| x < r.end && r.takes(s)) {\n",
     ["observe"]),
    # Round 11 (observability): a timeline of records in its last pixels draws nothing seen.
    ("timeline-of-one-record-blank", "rust/kmm/src/figures.rs",
     "    if right - points[0].0 < 4.0 {\n",
     "    if false {\n",
     ["observe"]),
    # Round 11 (observability): the note of chunks not drawn shares the legend's line.
    ("map-note-over-the-legend", "rust/kmm/src/figures.rs",
     "{more} more not drawn</text>\", WIDTH - RIGHT, TOP - 6.0);",
     "{more} more not drawn</text>\", WIDTH - RIGHT, height - 12.0);",
     ["observe"]),
    # Round 11 (observability): the replay leaves wrapped buffers out of its peak and counts.
    ("replay-drops-wraps", "rust/kmm-bench/src/replay.rs",
     "            Some(Action::Allocate) | Some(Action::Wrap) => {\n",
     "            Some(Action::Allocate) => {\n",
     ["bench:replay"]),
    # Round 11 (observability): live bytes past 2^64 are capped and printed as a peak.
    ("replay-peak-saturates", "rust/kmm-bench/src/replay.rs",
     "        self.in_use = self.in_use.checked_add(bytes)?;\n",
     "        self.in_use = self.in_use.saturating_add(bytes);\n",
     ["bench:replay"]),
    # Round 11 (observability): a quoted header (csv.QUOTE_ALL) is refused.
    ("csv-quoted-fields-refused", "rust/kmm/src/manager/csv.rs",
     "    let names: Vec<&str> = header.split(',').map(unquoted).collect();",
     "    let names: Vec<&str> = header.split(',').map(str::trim).collect();",
     ["bench:replay"]),
    # Round 11 (observability): rows of a buffer-keyed trace without a buffer are one buffer.
    ("replay-empty-buffer-is-one-buffer", "rust/kmm-bench/src/replay.rs",
     "if by_buffer && r.buffer != 0 { r.buffer }",
     "if by_buffer { r.buffer }",
     ["bench:replay"]),
    # Round 11 (observability): `replay | head` panics on the broken pipe.
    ("replay-broken-pipe-panics", "rust/kmm-bench/src/bin/replay.rs",
     "    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };\n",
     "",
     ["bench:replay"]),
    # Newcomer's walk-through: a replayed run ends with its frees pending (direct mode's peak
    # reserved grows with --repeat).
    ("replay-runs-end-with-frees-pending", "rust/kmm-bench/src/bin/replay.rs",
     "        check(kmm_manager_synchronize(self.0)).expect(\"a replayed run's synchronize\");\n",
     "",
     ["bench:replay"]),
    # Review of ext/ against CUDA.jl: an empty KmmArray (address 0) is passed to unsafe_wrap.
    ("jl-ext-empty-array-wrapped", "ext/KmmCUDAExt.jl",
     "    isempty(x) ? CuArray{T,N}(undef, size(x)) :",
     "    false ? CuArray{T,N}(undef, size(x)) :",
     ["jl:ext.jl"]),
    # Review of ext/: a manager on another device than CUDA.jl's current one is viewed anyway.
    ("jl-ext-device-unchecked", "ext/KmmCUDAExt.jl",
     "    d == current || throw(ArgumentError(",
     "    true || throw(ArgumentError(",
     ["jl:ext.jl"]),
    # Review of ext/: only CUDA.jl 5.2's name of the kernel adaptor is known.
    ("jl-ext-kernel-adaptor-new-name-only", "ext/KmmCUDAExt.jl",
     "kernel_adaptor(cuda::Module) = isdefined(cuda, :KernelAdaptor) ? cuda.KernelAdaptor : cuda.Adaptor",
     "kernel_adaptor(cuda::Module) = cuda.KernelAdaptor",
     ["jl:ext.jl"]),
    # Round 11 (multi-device): a CAI import of another device's memory is taken.
    ("py-cai-other-device-accepted", "python/kmm/array.py",
     "        _refuse_other_device(producer, manager)\n",
     "",
     ["py:test_devices.py"]),
    # Round 11 (multi-device): asarray hands back another device's array for a manager.
    ("py-asarray-other-device-returns-view", "python/kmm/__init__.py",
     "            _refuse_other_device(host, m)  # a view, never a copy to another device\n",
     "            pass\n",
     ["py:test_devices.py"]),
    # Round 11 (multi-device): a copy's handle error does not say dst or src.
    ("copy-handle-error-unnamed", "rust/kmm/src/manager/copy.rs",
     "KMM_ERROR_INVALID_HANDLE if arg != \"buffer\" =>",
     "KMM_ERROR_INVALID_HANDLE if false =>",
     ["adversarial_round11"]),
    # Round 11 (multi-device): KMM_HOST_DEVICES's bound in Rust's range syntax.
    ("host-devices-bound-as-rust-range", "rust/kmm/src/backend/host.rs",
     "is not a device count in 1..{MAX_HOST_DEVICES}",
     "is not a device count in 1..={MAX_HOST_DEVICES}",
     ["multi_device"]),
    # Round 11 (multi-device): default_manager(true) finds device 1's manager.
    ("jl-default-manager-takes-bool", "src/manager.jl",
     "    device isa Bool && throw_kmm_error(",
     "    false && throw_kmm_error(",
     ["jl:adversarial_round11.jl"]),
    # Round 11 (multi-device): a device's bound said -2147483648.
    ("jl-device-bound-from-typemin", "src/manager.jl",
     "    lo = name === :device ? zero(T) : typemin(T)",
     "    lo = typemin(T)",
     ["jl:adversarial_round11.jl"]),
    # Review of round 11: a block's end from its summed size rounds past the next block's start.
    ("map-block-end-from-summed-size", "rust/kmm/src/figures.rs",
     "            let end = (MAP_LEFT + (offset + s.bytes) as f64 * scale).max(x + 1.0);\n",
     "            let end = x + (s.bytes as f64 * scale).max(1.0);\n",
     ["observe"]),
    # Review of round 11: a kmm Buffer of another device is imported through CAI.
    ("py-buffer-other-device-accepted", "python/kmm/array.py",
     "    if isinstance(obj, (DeviceArray, Buffer)):\n",
     "    if isinstance(obj, DeviceArray):\n",
     ["py:test_devices.py"]),
    # Review of round 11: a view of a freed PinnedArray passes a zero-length copy with a KmmArray.
    ("jl-view-of-freed-pinned-passes", "src/array.jl",
     "check_live(x::AbstractArray) = (r = kmm_root(x); r === nothing || check_live(r); nothing)\n",
     "",
     ["jl:adversarial_round11.jl"]),
    # Round 12 (C ABI): a deferred destroy takes the slot's write lock, waiting for calls in flight.
    ("deferred-destroy-waits-for-calls", "rust/kmm/src/ffi/manager.rs",
     "                .spawn(move || drop(retired.take()));\n",
     "                .spawn({\n                    let m = retired.take();\n                    move || drop(m)\n                });\n",
     ["abi_manager"]),
    # Round 12 (observability): a copy's lease ends with a recorded unmap of an unrecorded map.
    ("copy-lease-records-unmap", "rust/kmm/src/manager/copy.rs",
     "        let _ = self.manager.state_of(self.handle).end_lease(self.handle, false);\n",
     "        let _ = self.manager.state_of(self.handle).end_lease(self.handle, true);\n",
     ["observe"]),
    # Round 12 (observability): a trace's pinned reserved counts the spill store's chunks.
    ("trace-pinned-reserved-counts-spill-store", "rust/kmm/src/manager/trace.rs",
     ".saturating_sub(self.spill_pinned.used().current()),",
     ".saturating_sub(0),",
     ["observe"]),
    # Round 12 (observability): legends never wrap (a spill line's entry ran off the figure).
    ("legend-never-wraps", "rust/kmm/src/figures.rs",
     "        if x > left && x + width > WIDTH - RIGHT {\n",
     "        if false {\n",
     ["observe"]),
    # Round 12 (observability): an empty axis draws the ticks 0 and 1 on one spot.
    ("empty-axis-draws-two-ticks", "rust/kmm/src/figures.rs",
     "(0.0, vec![0.0])",
     "(0.0, ticks(max))",
     ["observe"]),
    # Round 12 (observability): the replay command reads its arguments as UTF-8 (a panic).
    ("replay-args-utf8-only", "rust/kmm-bench/src/bin/replay.rs",
     "std::env::args_os().skip(1).collect();",
     "std::env::args().skip(1).map(Into::into).collect();",
     ["bench:replay"]),
    # Round 12 (Julia): wrappers of Kmm memory covered one deep only.
    ('jl-wrappers-one-deep', 'src/wrappers.jl',
     'const WrappedKmm = Wrapping{Union{KmmMemory,Wrapped1,Wrapped2}}',
     'const WrappedKmm = Wrapped1',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): reinterpret of a KmmArray gives Base's wrapper.
    ('jl-reinterpret-kmm-base-wrapper', 'src/wrappers.jl',
     'function Base.reinterpret(::Type{T}, x::KmmArray{S,N}) where {T,S,N}',
     'function unused_reinterpret(::Type{T}, x::KmmArray{S,N}) where {T,S,N}',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): showing a spilled array with no room to come back throws.
    ('jl-spilled-show-throws', 'src/wrappers.jl',
     '        e isa KmmOutOfMemoryError || rethrow()\n',
     '        rethrow()\n',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): copyto_async! passes a freed PinnedArray of no elements.
    ('jl-async-freed-empty-pinned', 'src/async.jl',
     '    check_live(src)   # a freed PinnedArray, also of no elements\n',
     '',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): iterating a freed PinnedArray of no elements passes.
    ('jl-iterate-freed-empty-pinned', 'src/pinned.jl',
     'Base.iterate(p::PinnedArray) = (check_live(p); ',
     'Base.iterate(p::PinnedArray) = (nothing; ',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): similar of a freed KmmArray makes a new one.
    ('jl-similar-of-freed', 'src/array.jl',
     '(check_live(x); KmmArray{S,M}(undef',
     '(nothing; KmmArray{S,M}(undef',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): similar's integer dimensions go through Base's conversion.
    ('jl-similar-dims-inexact', 'src/array.jl',
     'Base.similar(x::KmmArray, ::Type{S}, d::DimOrOneTo, dims::DimOrOneTo...) where {S} = similar(x, S, to_dims((d, dims...)))\n',
     '',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): a PinnedArray's element-type error names KmmArray.
    ('jl-pinned-eltype-names-kmmarray', 'src/pinned.jl',
     'check_eltype(T, "PinnedArray")',
     'check_eltype(T)',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Julia): a freed KmmArray's scalar index says scalar indexing is disallowed.
    ('jl-scalar-error-before-freed', 'src/scalar.jl',
     '    check_live(x)   # a freed array says so, also where scalar indexing is not allowed\n',
     '',
     ["jl:adversarial_round12.jl"]),
    # Round 12 (Python, a core class): a free during a copy releases the memory under it.
    ("free-ignores-copy-leases", "rust/kmm/src/manager/lane.rs",
     "        if record.leases > 0 {\n            // Its pool block",
     "        if false {\n            // Its pool block",
     ["abi_copies"]),
    # Round 12 (C ABI): a call with a handle a deferred destroy ended queues behind its teardown.
    ('registry-dead-handle-queues', 'rust/kmm/src/ffi/registry.rs',
     '    if cell.generation.load(Ordering::Acquire) != generation {\n        fail!(KMM_ERROR_INVALID_HANDLE, "manager {handle:#x} is not live (destroyed or never created)");\n    }\n    Ok((cell, generation))',
     '    Ok((cell, generation))',
     ["abi_manager"]),
    # Round 12 (Python): a bare CAI dict of a kmm array holds nothing.
    ('py-cai-dict-holds-nothing', 'python/kmm/array.py',
     '        producers = _dict_producers(cai, ptr, lo, hi) if obj is cai else [obj]\n',
     '        producers = [obj]\n',
     ["py:test_adversarial_python_round12.py"]),
    # Round 12 (Python): buffer-protocol formats NumPy cannot read are refused.
    ('py-ctypes-formats-refused', 'python/kmm/buffer.py',
     '    except (ValueError, TypeError, NotImplementedError):\n        if "O" in view.format:',
     '    except ():\n        if "O" in view.format:',
     ["py:test_adversarial_python_round12.py"]),
    # Round 12 (Python): a nested sub-array dtype adds only its outer dimensions.
    ('py-nested-subarray-once', 'python/kmm/_args.py',
     '    while d.subdtype is not None and not d.hasobject:',
     '    if d.subdtype is not None and not d.hasobject:',
     ["py:test_adversarial_python_round12.py"]),
    # Round 12 (Python): a record type's refusal suggests a cast to void.
    ('py-structured-hint-void-cast', 'python/kmm/array.py',
     '            elif self.dtype.kind == "V":',
     '            elif False:',
     ["py:test_adversarial_python_round12.py"]),
    # Round 12 (Python): times stored into the generic unit lose their unit.
    ('py-time-into-generic-unit', 'python/kmm/array.py',
     '        if np.datetime_data(dtype)[0] == "generic" and',
     '        if False and',
     ["py:test_adversarial_python_round12.py"]),
    # Review of round 12: a dying buffer's handle slot goes to the next buffer (its block is moved for it).
    ("dying-slot-reused", "rust/kmm/src/manager/lane.rs",
     "            self.buffers.hold_slot(handle);\n",
     "",
     ["abi_compaction"]),
    # Review of round 12: the memory map draws a block freed under a copy as free.
    ("map-leaves-dying-blocks-out", "rust/kmm/src/manager/observe.rs",
     "st.buffers.iter().chain(dying).filter(",
     "st.buffers.iter().filter(",
     ["abi_compaction"]),
    # Review of round 12 (Julia): typed read-backs of a KmmArray's wrappers take Base's scalar path.
    ("jl-typed-readback-of-wrapper-scalar", "src/wrappers.jl",
     "Base.copyto!(dest::Array, v::WrappedKmm) =",
     "unused_copyto!(dest::Array, v::WrappedKmm) =",
     ["jl:adversarial_round12.jl"]),
    # Review of round 12 (Python): an import's entry refuses a valid dict larger than the import.
    ('py-cai-table-enters-imports', 'python/kmm/array.py',
     '    allocated = [buf for buf in live if not isinstance(buf, _Imported)]',
     '    allocated = sorted(live, key=lambda buf: buf.nbytes)',
     ["py:test_adversarial_python_round12.py"]),
    # Review of round 12 (Python): a closed buffer's entry refuses valid dicts.
    ('py-cai-closed-entry-refuses', 'python/kmm/array.py',
     'if not buf.closed and buf._ptr <= ptr < buf._ptr + buf.nbytes]',
     'if buf._ptr <= ptr < buf._ptr + buf.nbytes]',
     ["py:test_adversarial_python_round12.py"]),
    # Review of round 12 (Python): records go through NumPy's safe cast, which wraps time fields.
    ('py-record-time-fields-safe-cast', 'python/kmm/array.py',
     '    if host.dtype.names is not None and dtype.names is not None:\n        # Records field by field',
     '    if False:\n        # Records field by field',
     ["py:test_adversarial_python_round12.py"]),
    # Round 13 (C ABI): another thread's copy counted as the caller's map: a plain free refused.
    ("free-counts-copy-leases-as-maps", "rust/kmm/src/manager/lane.rs",
     "let callers_pins = record.callers_pins();",
     "let callers_pins = record.pins;",
     ["abi_copies"]),
    ("info-counts-copy-leases-as-maps", "rust/kmm/src/manager/lane.rs",
     "Ok((r.addr, r.bytes, r.kind, r.callers_pins()))",
     "Ok((r.addr, r.bytes, r.kind, r.pins))",
     ["abi_copies"]),
    # Round 13 (Python): the bare CAI dict of a kmm import holds nothing.
    ('py-cai-table-leaves-imports-out', 'python/kmm/array.py',
     '    return [cai] + live\n',
     '    return [cai]\n',
     ["py:test_adversarial_python_round13.py"]),
    # Round 13 (Python): one buffer per CAI address: an empty view at a buffer's end takes the next one's.
    ('py-cai-table-one-buffer-per-address', 'python/kmm/array.py',
     '    entries.add(buf)\n',
     '    entries.clear()\n    entries.add(buf)\n',
     ["py:test_adversarial_python_round13.py"]),
    # Round 13 (Python): an ndarray subclass's properties are trusted by copies.
    ('py-host-address-trusts-subclass', 'python/kmm/buffer.py',
     '    if type(obj) is np.ndarray:',
     '    if isinstance(obj, np.ndarray):',
     ["py:test_adversarial_python_round13.py"]),
    # Round 13 (Python): complex numbers checked as a whole against a float type's range.
    ('py-complex-range-as-a-whole', 'python/kmm/array.py',
     '        return (a.real, a.imag) if a.dtype.kind == "c" else (a,)',
     '        return (a,)',
     ["py:test_adversarial_python_round13.py"]),
    # Round 13 (Python): a non-CAI object raises AttributeError.
    ('py-cai-import-attribute-error', 'python/kmm/array.py',
     '        if cai is None:\n            raise TypeError("obj = %r has no',
     '        if cai is None:\n            cai.x\n            raise TypeError("obj = %r has no',
     ["py:test_adversarial_python_round13.py"]),
    # Round 13 (Julia): copyto!'s converting paths sum offsets in the arguments' type (wraps).
    ("jl-copied-range-in-argument-type", "src/array.jl",
     "copied_range(offs::Integer, n::Integer) = Int(offs):(Int(offs) + Int(n) - 1)",
     "copied_range(offs::Integer, n::Integer) = offs:(offs + n - 1)",
     ["jl:adversarial_round13.jl"]),
    # Round 13 (Julia): reductions, hash and broadcasts of a freed array of no elements pass.
    ("jl-freed-empty-reduction-passes", "src/pinned.jl",
     "Base.mapreduce(f, op, x::KmmArray; kw...) = (check_live(x); device_mapreduce(f, op, x; kw...))",
     "Base.mapreduce(f, op, x::KmmArray; kw...) = device_mapreduce(f, op, x; kw...)",
     ["jl:adversarial_round13.jl"]),
    ("jl-freed-empty-broadcast-passes", "src/wrappers.jl",
     "Base.Broadcast.broadcastable(x::KmmOrWrapped) = (check_live(x); x)",
     "Base.Broadcast.broadcastable(x::KmmOrWrapped) = x",
     ["jl:adversarial_round13.jl"]),
    ("jl-freed-empty-hash-passes", "src/wrappers.jl",
     "Base.hash(x::KmmOrWrapped, h::UInt) = (check_live(x); invoke(",
     "Base.hash(x::KmmOrWrapped, h::UInt) = (invoke(",
     ["jl:adversarial_round13.jl"]),
    # Round 13 (Julia): Base's copies of a freed pinned array of no elements behind a wrapper pass.
    ("jl-freed-pinned-wrapper-copy-passes", "src/wrappers.jl",
     "(check_live(v); invoke(copyto!, Tuple{AbstractArray,AbstractArray}, dest, v))",
     "invoke(copyto!, Tuple{AbstractArray,AbstractArray}, dest, v)",
     ["jl:adversarial_round13.jl"]),
    # Round 13 (observability): an out-of-memory message's reserved read apart from its pass.
    ("oom-message-reserved-apart", "rust/kmm/src/manager/observe.rs",
     "            MemoryKind::Device => reserved,\n",
     "            MemoryKind::Device => stats.resource.reserved,\n",
     ["abi_lanes"]),
    # Round 13 (observability): a start replacing a file trace whose writing failed drops the failure.
    ("trace-start-drops-write-failure", "rust/kmm/src/manager/observe.rs",
     "            if let Some(failure) = before.write_failure().or_else(|| slot.replaced_failure.clone()) {",
     "            if let Some(failure) = None::<String> {",
     ["observe"]),
    # Round 13 (observability): an `allocate failure` row of a size past the limit fails the read.
    ("replay-refuses-refused-sizes", "rust/kmm/src/manager/csv.rs",
     "                b if action == Action::AllocateFailure => b,\n",
     "",
     ["bench:replay"]),
    # Round 13 (observability): the full form drops the restore of a buffer older than the trace.
    ("replay-drops-restores-of-older-buffers", "rust/kmm-bench/src/replay.rs",
     "Some(Action::Restore) if by_buffer && !p.live.contains_key(&key(r)) => {",
     "Some(Action::Restore) if by_buffer && spilled.contains(&key(r)) => {",
     ["bench:replay"]),
    # Round 13 (observability): a map run of several states is drawn in the busiest's colour.
    ("map-mixed-run-in-busiest-colour", "rust/kmm/src/figures.rs",
     "        if states == 1 || self.bytes == 0 {\n            let colour = [FREE, IN_USE, MAPPED][s.state as usize];",
     "        if states > 0 {\n            let colour = if self.count[2] > 0 { MAPPED } else if self.count[1] > 0 { IN_USE } else { FREE };",
     ["observe"]),
    # Round 13 (observability): a timeline of no records (or a span of ns) ticks 0, 0, 0.001 µs.
    ("timeline-ticks-of-no-span", [
        ("rust/kmm/src/figures.rs",
         "        n if n >= 10_000 => (1e3, \"µs\"),\n        _ => (1.0, \"ns\"),\n",
         "        _ => (1e3, \"µs\"),\n"),
        ("rust/kmm/src/figures.rs",
         "let span = if records.is_empty() { 0.0 } else { end_ns as f64 / t_div };",
         "let span = end_ns as f64 / t_div;"),
     ], ["observe"]),
    # Review of round 13: an out-of-memory message's reserved taken from the pools' chunks (0 B in direct mode).
    ("oom-message-reserved-from-chunks", "rust/kmm/src/manager/observe.rs",
     "            MemoryKind::Device => reserved,\n",
     "            MemoryKind::Device => chunk_bytes,\n",
     ["abi_lanes"]),
    # Review of round 13: a write failure found as a start closes the trace it replaces is dropped.
    ("trace-start-drops-late-write-failure", "rust/kmm/src/manager/observe.rs",
     "            Some(Err(e)) => Some(e.message),",
     "            Some(Err(_)) => None,",
     ["observe"]),
    # Review of round 13 (Python): the table of CAI addresses changed by threads without a lock.
    ('py-cai-table-unlocked', 'python/kmm/array.py',
     '_cai_lock = threading.Lock()',
     '_cai_lock = type("NoLock", (), {"__enter__": lambda self: self, "__exit__": lambda self, *a: None})()',
     ["py:test_adversarial_python_round13.py"]),
    # Review of round 13 (Julia): reductions, iteration and broadcasts behind wrappers of freed arrays pass.
    ("jl-freed-wrapper-reduction-passes", "src/wrappers.jl",
     "    (check_live(v); invoke(mapreduce, Tuple{Any,Any,AbstractArray}, f, op, v; kw...))",
     "    invoke(mapreduce, Tuple{Any,Any,AbstractArray}, f, op, v; kw...)",
     ["jl:adversarial_round13.jl"]),
    ("jl-freed-wrapper-iterate-passes", "src/wrappers.jl",
     "Base.iterate(v::WrappedKmm) = (check_live(v); invoke(",
     "Base.iterate(v::WrappedKmm) = (invoke(",
     ["jl:adversarial_round13.jl"]),
    # Round 14 (C ABI): a qMRI output sharing memory with another argument is not refused.
    ("qmri-outputs-may-alias", "rust/kmm/src/qmri/operands.rs",
     "            if !(a.written || b.written) {",
     "            if true {",
     ["qmri_errors", "mrstat_abi"]),
    # Round 14: wrapped memory overlapping another buffer is not compared by address.
    ("qmri-alias-by-handle-only", "rust/kmm/src/qmri/operands.rs",
     "a_addr.zip(b_addr).is_some_and(",
     "a_addr.zip(b_addr).is_some_and(|_| false) && a_addr.zip(b_addr).is_some_and(",
     ["qmri_errors"]),
    # Round 14: the out-of-memory message calls a buffer held by the failing copy "mapped".
    ("oom-holders-count-leases-as-maps", "rust/kmm/src/manager/observe.rs",
     "h.top.push((handle, r.bytes, r.callers_pins() > 0));",
     "h.top.push((handle, r.bytes, r.pins > 0));",
     ["observe"]),
    # Round 14: kmm_config_check passes an initial pool above the hard limit.
    ("config-initial-pool-over-limit-passes", "rust/kmm/src/manager/config.rs",
     "if self.alloc_mode == AllocMode::Pool && self.hard_limit != 0 && self.initial_pool_size > self.hard_limit {",
     "if false {",
     ["abi_manager"]),
    # Round 14 (observability): a file trace's rows written in another order than the lanes' changes.
    ("trace-file-change-outside-lock", "rust/kmm/src/manager/trace.rs",
     "let mut f = file.lock();\n                let in_use = change();",
     "let in_use = change();\n                let mut f = file.lock();",
     ["observe"]),
    # Round 14 (Python): asarray trusts a NumPy subclass's shape and dtype properties.
    ('py-asarray-trusts-subclass-properties', 'python/kmm/array.py',
     'host = np.require(np.asarray(host), requirements="C")',
     'host = np.require(host, requirements="C")',
     ["py:test_adversarial_python_round14.py"]),
    ('py-float-subclass-index-is-integer', 'python/kmm/_args.py',
     '    if (isinstance(value, _NOT_INTEGERS) or',
     '    if False and (isinstance(value, _NOT_INTEGERS) or',
     ["py:test_adversarial_python_round14.py"]),
    ('py-copy-from-default-truncates', 'python/kmm/buffer.py',
     '            nbytes = max(src.nbytes - src_offset, 0)',
     '            nbytes = max(min(self.nbytes - dst_offset, src.nbytes - src_offset), 0)',
     ["py:test_adversarial_python_round14.py"]),
    ('py-cai-descr-ignored', 'python/kmm/array.py',
     '    return described if described.names is not None else dtype',
     '    return dtype',
     ["py:test_adversarial_python_round14.py"]),
    ('py-cai-version-unchecked', 'python/kmm/array.py',
     'version = _args.integer(_cai_field(cai, "version"), "__cuda_array_interface__ version", 0, 3)',
     'version = 3',
     ["py:test_adversarial_python_round14.py"]),
    ('py-cai-v2-stream-read', 'python/kmm/array.py',
     '_foreign_stream_wait(manager, cai.get("stream") if version >= 3 else None)',
     '_foreign_stream_wait(manager, cai.get("stream"))',
     ["py:test_adversarial_python_round14.py"]),
    ('py-from-dlpack-other-device-manager', 'python/kmm/array.py',
     '            _refuse_other_device(obj, manager)\n            dev_type = obj.__dlpack_device__()',
     '            dev_type = obj.__dlpack_device__()',
     ["py:test_adversarial_python_round14.py"]),
    ('py-from-dlpack-non-producer-unnamed', 'python/kmm/array.py',
     '        elif type(obj).__name__ == "PyCapsule":\n',
     '        elif True:\n',
     ["py:test_adversarial_python_round14.py"]),
    ('py-memorymap-kind-unchecked', 'python/kmm/observe.py',
     '        if kind not in ("device", "pinned"):\n',
     '        if False:\n',
     ["py:test_adversarial_python_round14.py"]),
    # Round 14 (Julia): an out-of-memory error keeps the first try's figures beside the last status.
    ("jl-oom-message-first-try-figures", "src/storage.jl",
     "    msg = last_error_message()\n    status = memory_status(m)\n",
     "    msg = first\n    status = memory_status(m)\n",
     ["jl:adversarial_round14.jl"]),
    # Review of round 14: the CAI export raises for records NumPy gives no descr.
    ('py-cai-descr-export-raises', 'python/kmm/array.py',
     '            "descr": _cai_descr(self.dtype),',
     '            "descr": self.dtype.descr,',
     ["py:test_adversarial_python_round14.py"]),
    ('py-cai-descr-lists-not-normalised', 'python/kmm/array.py',
     '        fields = [tuple(f) if isinstance(f, (list, tuple)) else f for f in descr]',
     '        fields = list(descr)',
     ["py:test_adversarial_python_round14.py"]),
    ('py-decimal-fraction-are-integers', 'python/kmm/_args.py',
     'or (isinstance(value, numbers.Number) and not isinstance(value, numbers.Integral))',
     'or (isinstance(value, (float, complex, np.floating, np.complexfloating)))',
     ["py:test_adversarial_python_round14.py"]),
    # Review of round 14: an RMM-form move's free half carries the figure after the move.
    ("rmm-move-free-row-in-use-after", "rust/kmm/src/manager/csv.rs",
     "let freed = Record { in_use: r.in_use.saturating_sub(r.bytes), ..*r };",
     "let freed = *r;",
     ["observe"]),
    # Round 14 (Julia): log_grid's ends from exp(log(x)); a zero dimension after an overflow;
    # the dictionary follows its sequence; mul! of host inputs.
    ("jl-log-grid-inexact-ends", "src/qmri/parameters.jl",
     "[i == 1 ? Float64(lo) : i == n ? Float64(hi) : exp(a + (b - a) * (i - 1) / (n - 1)) for i in 1:n]",
     "[exp(a + (b - a) * (i - 1) / (n - 1)) for i in 1:n]",
     ["jl:adversarial_round14.jl"]),
    ("jl-zero-dim-after-overflow-refused", "src/array.jl",
     "(overflow | o) && !any(iszero, dims) && throw_bad_dims(dims, \"the size overflows\")",
     "(overflow | o) && throw_bad_dims(dims, \"the size overflows\")",
     ["jl:adversarial_round14.jl"]),
    ("jl-dictionary-shares-sequence", "src/qmri/dictionary.jl",
     "    seq = deepcopy(seq)\n",
     "",
     ["jl:adversarial_round14.jl"]),
    ("jl-jacobian-mul-host-input-methoderror", "src/qmri/mrstat.jl",
     "function LinearAlgebra.mul!(y::KmmArray{ComplexF32}, J::Jacobian, v::AbstractArray{<:Real})",
     "function unused_mul!(y::KmmArray{ComplexF32}, J::Jacobian, v::AbstractArray{<:Real})",
     ["jl:adversarial_round14.jl"]),
    # Round 15 (qMRI): the CPU match compares f64 scores, a batched one the stored f32 scores;
    # the calls that wait for the stream inside libkmm do so without yielding.
    ("qmri-cpu-match-compares-f64", [
        ("rust/kmm/src/qmri/cpu.rs", "let mut best = (0.0f32, -1i64, C64::ZERO);", "let mut best = (0.0f32, -1i64, C64::ZERO, 0.0f64);"),
        ("rust/kmm/src/qmri/cpu.rs",
         "                let s = (c.norm_sqr().sqrt() / xnorm) as f32;\n                if s > best.0 {\n                    best = (s, j as i64, c);",
         "                let s = c.norm_sqr().sqrt() / xnorm;\n                if s > best.3 {\n                    best = (s as f32, j as i64, c, s);"),
     ], ["jl:adversarial_round15_qmri.jl"]),
    ("jl-qmri-waits-inside-the-ccall", "src/manager.jl",
     "after_queued_work(call, m::KmmManager) = waiting(() -> (wait_queued(m); call()), m)",
     "after_queued_work(call, m::KmmManager) = call()",
     ["jl:adversarial_round15_qmri.jl"]),
    ("jl-simulate-check-waits-inside-the-ccall", "src/qmri/simulate.jl",
     "    check ? after_queued_work(call, Kmm.manager(p)) : call()\n",
     "    call()\n",
     ["jl:adversarial_round15_qmri.jl"]),
    # Round 15 (C ABI): the fixed suballocator's refusal names a bound the caller never set.
    ("fixed-block-refusal-hides-the-rounding", "rust/kmm/src/pool/pooled.rs",
     " (config.fixed_block_size rounded up to config.alignment)\",",
     "\",",
     ["abi_manager"]),
    # Round 15 (Python): observe's entry points pass a raw handle to ctypes unchecked (a handle
    # + 2^64 wraps to a live manager's) and figure_svg looks an unknown figure up bare.
    ('py-observe-handle-unchecked', 'python/kmm/_args.py',
     'libkmm says whether it names a live manager."""\n    return integer(value, name)',
     'libkmm says whether it names a live manager."""\n    return value',
     ["py:test_adversarial_python_round15.py"]),
    ('py-figure-svg-name-unchecked', 'python/kmm/observe.py',
     '    if not isinstance(figure, str) or figure not in FIGURES:\n',
     '    if False:\n',
     ["py:test_adversarial_python_round15.py"]),
    # Round 15 (Python): a kmm pinned buffer imported through CAI is wrapped as device memory.
    ('py-cai-import-of-pinned-is-device', 'python/kmm/array.py',
     'buf = _Imported._wrap(manager, base, hi - lo, _import_kind(producers),',
     'buf = _Imported._wrap(manager, base, hi - lo, _lib.KMM_MEMORY_DEVICE,',
     ["py:test_adversarial_python_round15.py"]),
    # Round 15 (Python): set() stores numbers into str, bytes, void and duration arrays.
    ('py-set-across-value-families', 'python/kmm/array.py',
     '    if _family(host.dtype.kind) != _family(dtype.kind):\n',
     '    if host.dtype.kind in "mM" and host.dtype.kind != dtype.kind:\n',
     ["py:test_adversarial_python_round15.py"]),
    # Round 15 (Python): live_managers' docstring says closed managers are not counted.
    ('py-live-managers-doc-says-closed', 'python/kmm/__init__.py',
     '    """How many managers are alive in this process: created and not yet torn down. A closed',
     '    """How many managers are alive in this process (created and not yet closed). A closed',
     ["py:test_adversarial_python_round15.py"]),
    ("jl-mrstat-model-unchecked-until-the-call", "src/qmri/mrstat.jl",
     "    check_voxel_values(\"MRSTATModel\", (x = x, y = y, B0 = B0, ρ = ρ, coils = coils), T2)\n",
     "",
     ["jl:adversarial_round15_qmri.jl"]),
    # Round 15 (Julia): copy offsets counted from 1, not firstindex: a view with offset axes
    # (IdentityUnitRange(4:6)) copies the parent's first elements.
    ("jl-offset-axes-copy-from-one", "src/array.jl",
     "    f = firstindex(a)\n    (n <= length(a) && f <= offs <= f + (length(a) - Int(n))) ||",
     "    f = 1\n    (n <= length(a) && f <= offs <= f + (length(a) - Int(n))) ||",
     ["jl:adversarial_round15.jl"]),
    # Round 15 (Julia): KmmArray(x::KmmArray) leaves its allocation live when the copy fails.
    ("jl-kmmarray-copy-leaks-on-error", "src/devices.jl",
     "    filled(() -> KmmArray{T,N}(undef, size(x); manager = manager, kind = kind), src)\n",
     "    copyto!(KmmArray{T,N}(undef, size(x); manager = manager, kind = kind), src)\n",
     ["jl:adversarial_round15.jl"]),
    # Round 15 (Julia): KmmArray{T}(x) of a KmmArray of another eltype lands on the default manager.
    ("jl-converting-constructor-default-manager", "src/devices.jl",
     "function KmmArray{T,N}(x::KmmArray{S,N}; manager::KmmManager = Kmm.manager(x),\n",
     "function KmmArray{T,N}(x::KmmArray{S,N}; manager::KmmManager = S === T ? Kmm.manager(x) : default_manager(),\n",
     ["jl:adversarial_round15.jl"]),
    # Round 15 (Julia): similar(x, dims...) without an eltype converts dims past Int: InexactError.
    ("jl-similar-untyped-dims-inexact", "src/array.jl",
     "Base.similar(x::KmmArray{T}, dims::Tuple{DimOrOneTo,Vararg{DimOrOneTo}}) where {T} = similar(x, T, dims)\n"
     "Base.similar(x::KmmArray{T}, d::DimOrOneTo, dims::DimOrOneTo...) where {T} = similar(x, T, d, dims...)\n",
     "",
     ["jl:adversarial_round15.jl"]),
    # Review of round 15: the basis call's flags assigned twice, boxed by the closure.
    ("jl-match-flags-boxed-in-gcsafe-call", [
        ("src/qmri/match.jl", "            bflags = check_basis ? flags : flags | UInt32(LibKmm.KMM_MATCH_SKIP_CHECKS)\n",
         "            check_basis || (flags |= UInt32(LibKmm.KMM_MATCH_SKIP_CHECKS))\n"),
        ("src/qmri/match.jl", "bh, r, ph, outs, bflags))", "bh, r, ph, outs, flags))"),
     ], ["jl:adversarial_round15_qmri.jl"]),
    # After round 15: OneTo dimensions past Int; offset-axes signals on the workers' path.
    ("jl-similar-oneto-dims-inexact", "src/array.jl",
     "    lengths = map(d -> d isa Base.OneTo ? last(d) : d, dims)\n",
     "    lengths = map(d -> d isa Base.OneTo ? Int(last(d)) : d, dims)\n",
     ["jl:adversarial_round15.jl"]),
    ("jl-distributed-signals-converted", "src/qmri/distributed.jl",
     "copyto!(Array{ComplexF32}(undef, size(signals)), signals)",
     "convert(Array{ComplexF32}, signals)",
     ["jl:distributed.jl"]),
    # Review of round 15: deepcopy of a PinnedArray reads the source's address before the
    # allocation, which may collect and free the source.
    ("jl-deepcopy-pinned-address-read-early", [
        ("src/copying.jl", "    mapped_address(s)   # a freed source's error", "    from = Ptr{UInt8}(mapped_address(s))   # a freed source's error"),
        ("src/copying.jl", "unsafe_copyto!(pointer(c), Ptr{UInt8}(mapped_address(s)), s.bytes)", "unsafe_copyto!(pointer(c), from, s.bytes)"),
     ], ["jl:adversarial_round15.jl"]),
    # Round 11 (Julia): a zero-length copy with a freed PinnedArray returns before the check.
    ("jl-pinned-zero-copy-skips-liveness", "src/pinned.jl",
     "    nothing_to_copy(n, dest, src) && return dest\n    if eltype(dest) === eltype(src) && dest isa HostMem",
     "    n == 0 && return dest\n    if eltype(dest) === eltype(src) && dest isa HostMem",
     ["jl:adversarial_round11.jl"]),
    # Round 11 (Julia): the generic host <- Kmm copy checks only the KmmArray side at n = 0.
    ("jl-generic-zero-copy-checks-one-side", "src/array.jl",
     "    nothing_to_copy(n, dest, src) && return dest\n    copyto!(dest, doffs, Array(view(src",
     "    nothing_to_copy(n, src) && return dest\n    copyto!(dest, doffs, Array(view(src",
     ["jl:adversarial_round11.jl"]),
    # Round 11 (Julia): a reinterpretation of a freed PinnedArray throws when shown.
    ("jl-freed-pinned-reinterpret-show-throws", "src/wrappers.jl",
     "                          Base.ReinterpretArray{<:Any,<:Any,<:Any,<:P},\n",
     "",
     ["jl:adversarial_round11.jl"]),
    # Round 11 (Julia): a Symbol is taken as a trace's file path.
    ("jl-trace-path-symbol-accepted", "src/observe.jl",
     "    path isa AbstractString || throw(",
     "    true || throw(",
     ["jl:adversarial_round11.jl"]),
]

def sh(cmd, cwd, env=None, timeout=900):
    """(exit status, output, seconds); a command still running after `timeout` seconds (a test
    that hangs under a plant) is killed and fails with status 124."""
    t = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, shell=True, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return 124, out + "\ntimed out after %d s (hangs)" % timeout, time.time() - t
    return p.returncode, (p.stdout + p.stderr), time.time() - t

def edits_of(plant):
    """(name, [(file, old, new), ...], tests) of either form of a plant."""
    if len(plant) == 5:
        name, path, old, new, tests = plant
        return name, [(path, old, new)], tests
    return plant

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worktree", default="/tmp/kmm-plant")
    ap.add_argument("--only", help="plant names, comma-separated")
    ap.add_argument("--check", action="store_true", help="only check that each plant's old text is in HEAD")
    ap.add_argument("--gpu", action="store_true", help="also run the gpu: tests (KMM_TEST_GPU=1; needs a GPU)")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    plants = [edits_of(p) for p in PLANTS]
    if only:
        unknown = only - {p[0] for p in plants}
        if unknown:
            sys.exit(f"no plant named {', '.join(sorted(unknown))}")
        plants = [p for p in plants if p[0] in only]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    if a.check:
        bad = 0
        for name, edits, tests in plants:
            missing = []
            for path, old, _ in edits:
                shown = subprocess.run(["git", "show", f"{head}:{path}"], cwd=ROOT, capture_output=True, text=True)
                if shown.returncode != 0 or old not in shown.stdout:
                    missing.append(path)
            bad += bool(missing)
            print(f"{name}: {'pattern not found in ' + ', '.join(missing) if missing else 'applies'} -> {', '.join(tests)}")
        sys.exit(1 if bad else 0)
    wt = a.worktree
    if not os.path.isdir(wt):
        subprocess.run(["git", "worktree", "add", "--detach", wt, head], cwd=ROOT, check=True)
    # A worktree left by an earlier run is moved to this HEAD (dropping whatever an interrupted
    # run left planted): plants are judged on today's code.
    subprocess.run(["git", "checkout", "-q", "--force", "--detach", head], cwd=wt, check=True)
    env = dict(os.environ, CARGO_TARGET_DIR=os.environ.get("KMM_PLANT_TARGET", "/tmp/kmm-plant-target"),
               CARGO_PROFILE_RELEASE_LTO="false", CARGO_PROFILE_RELEASE_CODEGEN_UNITS="16",
               KMM_TRUST_CASES="12", KMM_TRUST_STEPS="1500", KMM_TRUST_STRESS_SECS="4",
               KMM_TRUST_FAULT_ROUNDS="200", RUST_BACKTRACE="0")
    rows = []
    for name, edits, tests in plants:
        originals = {}
        planted = {}
        for path, old, new in edits:
            f = os.path.join(wt, path)
            if f not in originals:
                originals[f] = planted[f] = open(f).read()
            if old not in planted[f]:
                break
            planted[f] = planted[f].replace(old, new, 1)
        else:
            path = None
        if path is not None:
            rows.append((name, f"PLANT FAILED: pattern not found in {path}", "")); continue
        for f, text in planted.items():
            open(f, "w").write(text)
        try:
            for t in tests:
                gpu_only = t.startswith("gpu:")
                binary = t[len("gpu:"):] if gpu_only else t
                if t == "valgrind":
                    rc, out, dt = sh("tools/valgrind_c_abi.sh", wt, env)
                elif t.startswith("py:"):
                    lib = os.path.join(env["CARGO_TARGET_DIR"], "release", "libkmm.so")
                    rc, out, dt = sh("cargo build -q --release -p kmm --lib", os.path.join(wt, "rust"), env)
                    if rc == 0:
                        # The compiled plugin calls (kmm._plugin_calls) of the worktree's sources;
                        # where they cannot be built, the tests of the Python paths still run.
                        sh(f"{sys.executable} setup.py -q build_ext --inplace --force", os.path.join(wt, "python"), env)
                        # This interpreter (run the tool in the venv): a python3 without pytest
                        # fails too, which is not the plant being caught.
                        rc, out, dt = sh(f"{sys.executable} -m pytest -q -p no:warnings -p no:cacheprovider tests/{t[3:]}",
                                         os.path.join(wt, "python"), dict(env, KMM_LIBRARY=lib))
                elif t.startswith("jl:"):
                    lib = os.path.join(env["CARGO_TARGET_DIR"], "release", "libkmm.so")
                    rc, out, dt = sh("cargo build -q --release -p kmm --lib", os.path.join(wt, "rust"), env)
                    if rc == 0:
                        code = f'using Test, Kmm; const ROOT = pwd(); @testset "{t[3:]}" begin include("test/{t[3:]}") end'
                        rc, out, dt = sh(f"julia --project=. --startup-file=no -e '{code}'", wt,
                                         dict(env, KMM_LIBRARY=lib, JULIA_NUM_THREADS="2"))
                elif gpu_only and not a.gpu:
                    # Not run here; the plant must still build.
                    rc, out, dt = sh("cargo build -q --release -p kmm --lib", os.path.join(wt, "rust"), env)
                elif binary == "lib":
                    rc, out, dt = sh("cargo test -q --release -p kmm --lib", os.path.join(wt, "rust"), env)
                elif t.startswith("bench:"):
                    rc, out, dt = sh(f"cargo test -q --release -p kmm-bench --test {t[6:]}", os.path.join(wt, "rust"), env)
                else:
                    run_env = dict(env, KMM_TEST_GPU="1") if gpu_only else env
                    rc, out, dt = sh(f"cargo test -q --release -p kmm --test {binary}", os.path.join(wt, "rust"), run_env)
                lines = [l for l in out.splitlines() if "panicked" in l or l.startswith("FAILED") or "seed" in l or "Invalid" in l
                         or "ERROR SUMMARY" in l or "leak" in l or "SIGSEGV" in l or "assertion" in l or "expects" in l
                         or "failures" in l or "Test Failed" in l or "Error During Test" in l]
                if not lines and rc != 0:  # e.g. an abort or a signal: the end of the output says which
                    lines = [l.strip() for l in out.splitlines() if l.strip()][-2:]
                why = " | ".join(lines[:3])[:300]
                if "could not compile" in out:
                    verdict = "PLANT DID NOT BUILD"
                elif "no test target named" in out:
                    verdict = f"NO TEST BINARY {binary} at HEAD"
                elif "No module named pytest" in out:
                    verdict = "PYTEST MISSING (run the tool with the venv's python3)"
                elif gpu_only and not a.gpu:
                    verdict = "needs GPU, not run here (plant builds)" if rc == 0 else "BUILD FAILED"
                else:
                    verdict = "CAUGHT (failed)" if rc != 0 else "MISSED (passed)"
                rows.append((name, t, f"{verdict} in {dt:.0f}s: {why}"))
                print(rows[-1], flush=True)
        finally:
            for f, text in originals.items():
                open(f, "w").write(text)
    print("\n| planted bug | test | result |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")

if __name__ == "__main__":
    main()
