//! Adaptor: a freed block is handed back to the inner resource only once the manager's stream
//! has run the work queued before the free (the manager has made that stream wait for every
//! other stream that used the block). Needed wherever reuse is not itself stream-ordered: pinned
//! host memory (the CPU writes it at once) and memory returned to the device. Nothing here waits:
//! blocks come back as their events are seen complete, and a caller that needs them sooner waits
//! for `pending_fence` without holding this resource's lock.

use super::{Block, MemoryResource, Owner, Relocator, ResourceCounters};
use crate::backend::{Backend, Event, Stream};
use crate::error::Result;
use std::collections::VecDeque;
use std::sync::Arc;

pub struct Deferred<R> {
    inner: R,
    backend: Arc<dyn Backend>,
    stream: Arc<dyn Stream>,
    pending: VecDeque<(Arc<dyn Event>, Vec<Block>)>,
    spare_events: Vec<Arc<dyn Event>>,
    /// Blocks freed when no event could be recorded (a failing device): they wait for the next
    /// event that can be, which `detach_free` records.
    orphans: Vec<Block>,
}

impl<R: MemoryResource> Deferred<R> {
    pub fn new(inner: R, backend: Arc<dyn Backend>, stream: Arc<dyn Stream>) -> Self {
        Deferred { inner, backend, stream, pending: VecDeque::new(), spare_events: Vec::new(), orphans: Vec::new() }
    }

    pub fn inner_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Batches of freed blocks the stream has not been seen to pass, and the event of the
    /// oldest: waiting for it (without this resource's lock) lets the next allocation reuse
    /// that batch instead of growing.
    pub fn oldest_pending(&self) -> (usize, Option<Arc<dyn Event>>) {
        (self.pending.len(), self.pending.front().map(|(event, _)| event.clone()))
    }

    /// Hands back every block whose free the stream has passed (never waits). A block the inner
    /// resource refuses stays queued, with the rest of its batch, for a later try.
    fn reclaim(&mut self) -> Result<()> {
        while let Some((event, _)) = self.pending.front() {
            if !event.query()? {
                break;
            }
            let (event, mut blocks) = self.pending.pop_front().expect("front exists");
            while let Some(block) = blocks.pop() {
                if let Err(e) = self.inner.deallocate(block) {
                    blocks.push(block);
                    self.pending.push_front((event, blocks));
                    return Err(e);
                }
            }
            // Recycled only when no waiter of `pending_fence` still holds it.
            if Arc::strong_count(&event) == 1 {
                self.spare_events.push(event);
            }
        }
        Ok(())
    }

    /// Queues `blocks` behind an event recorded now on the stream; on failure they stay orphans.
    fn defer(&mut self, blocks: Vec<Block>) {
        let event = match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.backend.create_event().map(Arc::from),
        };
        match event.and_then(|e| self.stream.record(e.as_ref()).map(|_| e)) {
            Ok(event) => self.pending.push_back((event, blocks)),
            Err(_) => self.orphans.extend(blocks),
        }
    }
}

impl<R: MemoryResource> MemoryResource for Deferred<R> {
    /// Out of memory is returned as it is: the manager waits for `pending_fence` outside its
    /// lock and asks again.
    fn allocate(&mut self, bytes: u64, owner: Owner, relocator: &mut dyn Relocator) -> Result<Block> {
        self.reclaim()?;
        self.inner.allocate(bytes, owner, relocator)
    }

    /// Never loses the block: without an event it waits, as an orphan, for a later one. Blocks
    /// already passed are reclaimed first, so memory given back by a loop of frees alone (adopted
    /// memory) does not pile up.
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.defer(vec![block]);
        // Housekeeping for earlier frees: their trouble is not this free's.
        let _ = self.reclaim();
        Ok(())
    }

    fn detach_free(&mut self, keep_bytes: u64) -> Result<Vec<(u64, u64)>> {
        if !self.orphans.is_empty() {
            let orphans = std::mem::take(&mut self.orphans);
            self.defer(orphans);
        }
        self.reclaim()?;
        self.inner.detach_free(keep_bytes)
    }

    fn give_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        self.inner.give_chunks(bytes)
    }

    fn take_chunks(&mut self, chunks: &[(u64, u64)]) {
        self.inner.take_chunks(chunks)
    }

    fn pending_fence(&self) -> Option<Arc<dyn Event>> {
        self.pending.back().map(|(event, _)| event.clone())
    }

    fn chunks(&self) -> Vec<(u64, u64)> {
        self.inner.chunks()
    }

    fn counters(&self) -> ResourceCounters {
        self.inner.counters()
    }

    fn reset_peak(&mut self) {
        self.inner.reset_peak()
    }
}
