//! Adaptor: a freed block is handed back to the inner resource only once the manager's stream
//! has run the work queued before the free. Needed wherever reuse is not itself stream-ordered:
//! pinned host memory (the CPU writes it at once) and memory returned to the device.

use super::{Block, MemoryResource, Owner, Relocator, ResourceCounters};
use crate::backend::{self, Backend, Event, Stream};
use crate::error::{KmmStatus, Result};
use std::collections::VecDeque;
use std::sync::Arc;

pub struct Deferred<R> {
    inner: R,
    backend: Arc<dyn Backend>,
    stream: Arc<dyn Stream>,
    pending: VecDeque<(Box<dyn Event>, Block)>,
    spare_events: Vec<Box<dyn Event>>,
    /// Blocks freed when no event could be recorded nor the stream waited for (a failing
    /// device): handed back at the next `trim`, which runs with the stream idle.
    orphans: Vec<Block>,
}

impl<R: MemoryResource> Deferred<R> {
    pub fn new(inner: R, backend: Arc<dyn Backend>, stream: Arc<dyn Stream>) -> Self {
        Deferred { inner, backend, stream, pending: VecDeque::new(), spare_events: Vec::new(), orphans: Vec::new() }
    }

    pub fn inner_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Hands back every block whose free the stream has passed; with `wait`, all of them.
    fn reclaim(&mut self, wait: bool) -> Result<()> {
        while let Some((event, _)) = self.pending.front() {
            if wait {
                event.synchronize()?;
            } else if !event.query()? {
                break;
            }
            let (event, block) = self.pending.pop_front().expect("front exists");
            self.spare_events.push(event);
            self.inner.deallocate(block)?;
        }
        Ok(())
    }
}

impl<R: MemoryResource> MemoryResource for Deferred<R> {
    fn allocate(&mut self, bytes: u64, owner: Owner, relocator: &mut dyn Relocator) -> Result<Block> {
        self.reclaim(false)?;
        match self.inner.allocate(bytes, owner, relocator) {
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY && !self.pending.is_empty() => {
                self.reclaim(true)?;
                self.inner.allocate(bytes, owner, relocator)
            }
            other => other,
        }
    }

    /// Never loses the block: when the event cannot be recorded, the block goes back once the
    /// stream is idle (now, or at the next trim).
    fn deallocate(&mut self, block: Block) -> Result<()> {
        match backend::record_reusing(self.backend.as_ref(), self.stream.as_ref(), &mut self.spare_events) {
            Ok(event) => {
                self.pending.push_back((event, block));
                Ok(())
            }
            Err(_) if self.stream.synchronize().is_ok() => self.inner.deallocate(block),
            Err(_) => {
                self.orphans.push(block);
                Ok(())
            }
        }
    }

    fn trim(&mut self, keep_bytes: u64) -> Result<()> {
        self.reclaim(true)?;
        while let Some(block) = self.orphans.pop() {
            self.inner.deallocate(block)?;
        }
        self.inner.trim(keep_bytes)
    }

    fn counters(&self) -> ResourceCounters {
        self.inner.counters()
    }

    fn reset_peak(&mut self) {
        self.inner.reset_peak()
    }
}
