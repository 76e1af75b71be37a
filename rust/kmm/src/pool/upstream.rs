//! Leaf upstreams (chunks of device memory and of pinned host memory from a backend) and the
//! queue that takes their frees out from under the manager's locks.

use super::Upstream;
use crate::backend::Backend;
use crate::error::{lock, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct DeviceUpstream(pub Arc<dyn Backend>);

impl Upstream for DeviceUpstream {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        self.0.alloc_device(bytes)
    }
    unsafe fn deallocate(&self, addr: u64, _bytes: u64) -> Result<()> {
        self.0.free_device(addr)
    }
}

pub struct PinnedUpstream(pub Arc<dyn Backend>);

impl Upstream for PinnedUpstream {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        self.0.alloc_pinned(bytes).map(|p| p as u64)
    }
    unsafe fn deallocate(&self, addr: u64, _bytes: u64) -> Result<()> {
        self.0.free_pinned(addr as *mut u8)
    }
}

/// An upstream whose frees wait in a queue until `flush`: a free upstream may block
/// (`cuMemFree` waits for the whole device), so it must run neither under a lane's lock, which
/// every free of the lane needs, nor inside a buffer's free, which never blocks. The manager
/// flushes after allocations, adoptions, trims and at teardown, with no lock held.
pub struct QueuedFrees {
    inner: Arc<dyn Upstream>,
    queued: Mutex<Vec<(u64, u64)>>,
    /// Whether `queued` may be non-empty: the allocation path checks this one load.
    pending: AtomicBool,
}

impl QueuedFrees {
    pub fn new(inner: Arc<dyn Upstream>) -> Arc<QueuedFrees> {
        Arc::new(QueuedFrees { inner, queued: Mutex::new(Vec::new()), pending: AtomicBool::new(false) })
    }

    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Frees everything queued upstream; the caller holds no lock. Blocks that fail stay queued
    /// for the next flush, and the first error is returned.
    pub fn flush(&self) -> Result<()> {
        if !self.pending() {
            return Ok(());
        }
        let blocks = {
            let mut queued = lock(&self.queued);
            self.pending.store(false, Ordering::Release);
            std::mem::take(&mut *queued)
        };
        let mut failure = None;
        for (addr, bytes) in blocks {
            // SAFETY: `deallocate`'s caller gave the promise for every queued block.
            if let Err(e) = unsafe { self.inner.deallocate(addr, bytes) } {
                lock(&self.queued).push((addr, bytes));
                self.pending.store(true, Ordering::Release);
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

impl Upstream for QueuedFrees {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        self.inner.allocate(bytes)
    }
    unsafe fn deallocate(&self, addr: u64, bytes: u64) -> Result<()> {
        let mut queued = lock(&self.queued);
        queued.push((addr, bytes));
        self.pending.store(true, Ordering::Release);
        Ok(())
    }
}

/// Every queue of frees of one manager, shared by its lanes.
#[derive(Default)]
pub struct FreeQueues(Vec<Arc<QueuedFrees>>);

impl FreeQueues {
    pub fn add(&mut self, inner: Arc<dyn Upstream>) -> Arc<QueuedFrees> {
        let q = QueuedFrees::new(inner);
        self.0.push(q.clone());
        q
    }

    pub fn pending(&self) -> bool {
        self.0.iter().any(|q| q.pending())
    }

    /// Flushes every queue (see `QueuedFrees::flush`); the first error is returned.
    pub fn flush(&self) -> Result<()> {
        self.0.iter().map(|q| q.flush()).fold(Ok(()), |acc, r| acc.and(r))
    }
}
