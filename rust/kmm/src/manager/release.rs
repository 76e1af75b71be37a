//! Giving memory back: a lane's free chunks go upstream only after the fence of the work that
//! used them, waited for with no lock held (`release`); `trim` is the caller's request for it.

use super::{AllocMode, Manager, MemoryKind};
use crate::backend::Event;
use crate::error::{lock, Result};
use crate::pool::MemoryResource;
use std::sync::Arc;

impl Manager {
    /// Gives free chunks of `kind` back until the lanes together reserve at most `keep_bytes`,
    /// and reclaims what the deferred resources (pinned memory, direct and adopted memory) hold
    /// back. Under each lane's lock the chunks are taken out of its pool and an event is recorded
    /// after every free of theirs (the lane's ordering stream, then the manager's, which waits for
    /// it); the waits for those events and the frees upstream come after the lock is dropped, so
    /// a concurrent free, allocation or trim never sees a chunk that is being given back.
    pub(super) fn release(&self, kind: MemoryKind, keep_bytes: u64) -> Result<()> {
        if kind == MemoryKind::Device && self.config.alloc_mode == AllocMode::CudaAsync {
            // CUDA's pool keeps memory whose free is still queued on the stream by itself; waiting
            // for the stream lets the trim reach it.
            self.stream.synchronize()?;
        }
        let mut pending: Vec<Arc<dyn Event>> = Vec::new();
        self.detach_lanes(kind, keep_bytes, &mut pending)?;
        if !pending.is_empty() {
            // Deferred frees the stream had not yet passed: wait for them, then reclaim again.
            for event in pending.drain(..) {
                event.synchronize()?;
            }
            self.detach_lanes(kind, keep_bytes, &mut pending)?;
        }
        Ok(())
    }

    /// One pass of `release` over the lanes; the deferred resources' fences go to `pending`.
    fn detach_lanes(&self, kind: MemoryKind, keep_bytes: u64, pending: &mut Vec<Arc<dyn Event>>) -> Result<()> {
        let k = kind as usize;
        let trace = self.recording();
        let mut budget = keep_bytes;
        let mut detached: Vec<(Arc<dyn Event>, Vec<(u64, u64)>)> = Vec::new();
        let mut failure = None;
        for lane in self.lanes() {
            let mut st = self.lane(lane);
            let st = &mut *st;
            if kind == MemoryKind::Device {
                if let Err(e) = st.take_inbox() {
                    failure.get_or_insert(e);
                }
            }
            pending.extend(st.resources[k].pending_fence());
            pending.extend(st.adopted[k].pending_fence());
            if let Err(e) = st.adopted[k].detach_free(u64::MAX) {
                failure.get_or_insert(e);
            }
            let chunks = match st.resources[k].detach_free(budget) {
                Ok(chunks) => chunks,
                Err(e) => {
                    failure.get_or_insert(e);
                    continue;
                }
            };
            budget = budget.saturating_sub(st.resources[k].counters().reserved);
            if chunks.is_empty() {
                continue;
            }
            let fenced = self
                .backend
                .order_streams(st.reuse[k].free_stream(st.home), st.home)
                .and_then(|_| self.backend.create_event())
                .and_then(|e| self.stream.record(e.as_ref()).map(|_| Arc::<dyn Event>::from(e)));
            match fenced {
                Ok(event) => detached.push((event, chunks)),
                Err(e) => {
                    // Unfenced chunks stay cached; the lanes already detached still go back.
                    st.resources[k].take_chunks(&chunks);
                    failure.get_or_insert(e);
                    break;
                }
            }
        }
        for (event, chunks) in detached {
            if let Err(e) = event.synchronize() {
                // A failing device: the chunks are held back until teardown.
                lock(&self.unfenced).extend(chunks.iter().map(|&(base, size)| (k, base, size)));
                failure.get_or_insert(e);
                continue;
            }
            for (base, size) in chunks {
                // SAFETY: the chunk came from this upstream, no block of it is handed out any
                // more, and the work queued before its blocks' frees has run.
                // Recorded first: once the chunk is back, another lane may be given the same
                // address upstream, and its allocation must come after the trim in the trace.
                if let Some(t) = &trace {
                    t.record(super::trace::Action::Trim, kind, base, size, self.raw_stream(), 0, 0);
                }
                if let Err(e) = unsafe { self.upstreams[k].deallocate(base, size) } {
                    lock(&self.unfenced).push((k, base, size));
                    failure.get_or_insert(e);
                }
            }
        }
        if let Err(e) = self.free_queues.flush() {
            failure.get_or_insert(e);
        }
        failure.map_or(Ok(()), Err)
    }

    /// Waits for the stream, then gives cached memory back until each pool reserves at most
    /// `keep_bytes`. The wait is the call's promise to its caller; the memory's safety does not
    /// rest on it: each chunk goes back only after the fence of its lane (a free by another
    /// thread after the wait is covered too).
    pub fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.stream.synchronize()?;
        for kind in [MemoryKind::Device, MemoryKind::Pinned] {
            self.release(kind, keep_bytes)?;
        }
        self.release_spill()?;
        lock(&self.staging).release()
    }
}
