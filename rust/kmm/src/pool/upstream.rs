//! Leaf upstreams (chunks of device memory and of pinned host memory from a backend) and the
//! queue that takes their frees out from under the manager's locks.

use super::Upstream;
use crate::backend::Backend;
use crate::error::{lock, Result};
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

/// Pageable host memory from the system allocator, page-aligned: where spilled buffers go once
/// the pinned memory they may use is taken.
pub struct PageableUpstream;

const PAGE: usize = 4096;

impl Upstream for PageableUpstream {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1) as usize, PAGE)
            .map_err(|_| crate::err!(KMM_ERROR_SIZE_OVERFLOW, "bytes = {bytes} is too large for host memory"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            crate::fail!(KMM_ERROR_OUT_OF_MEMORY, "the host has no {bytes} bytes of pageable memory left");
        }
        Ok(ptr as u64)
    }

    unsafe fn deallocate(&self, addr: u64, bytes: u64) -> Result<()> {
        let layout = std::alloc::Layout::from_size_align_unchecked(bytes.max(1) as usize, PAGE);
        std::alloc::dealloc(addr as *mut u8, layout);
        Ok(())
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
    /// Shared by every queue of one `FreeQueues`: raised when any of them may hold a block.
    pending: Arc<dyn PendingFrees>,
}

/// The flag that says a manager's queues may hold a block. Every allocation reads it, so its
/// owner keeps it where that read costs least (the manager's lane cells keep it beside the lane
/// mask that every call reads anyway: no pointer to follow).
pub trait PendingFrees: Send + Sync {
    fn raise(&self);
    /// Lowers the flag; whether it was raised.
    fn take(&self) -> bool;
}

impl QueuedFrees {
    /// Frees everything queued upstream; the caller holds no lock. Blocks that fail stay queued
    /// (and the queues pending) for the next flush, and the first error is returned.
    fn flush(&self) -> Result<()> {
        let blocks = std::mem::take(&mut *lock(&self.queued));
        let mut failure = None;
        for (addr, bytes) in blocks {
            // SAFETY: `deallocate`'s caller gave the promise for every queued block.
            if let Err(e) = unsafe { self.inner.deallocate(addr, bytes) } {
                lock(&self.queued).push((addr, bytes));
                self.pending.raise();
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
        lock(&self.queued).push((addr, bytes));
        self.pending.raise();
        Ok(())
    }
}

/// Every queue of frees of one manager, shared by its lanes. One flag says whether any may hold
/// a block: every allocation reads it, and only a raised flag costs a flush.
pub struct FreeQueues {
    queues: Vec<Arc<QueuedFrees>>,
    pending: Arc<dyn PendingFrees>,
}

impl FreeQueues {
    pub fn new(pending: Arc<dyn PendingFrees>) -> FreeQueues {
        FreeQueues { queues: Vec::new(), pending }
    }

    pub fn add(&mut self, inner: Arc<dyn Upstream>) -> Arc<QueuedFrees> {
        let q = Arc::new(QueuedFrees { inner, queued: Mutex::new(Vec::new()), pending: self.pending.clone() });
        self.queues.push(q.clone());
        q
    }

    /// Flushes every queue (see `QueuedFrees::flush`) when any may hold a block; the first error
    /// is returned. The flag is cleared before the queues are emptied, so a block queued
    /// meanwhile sets it again for the next flush.
    pub fn flush(&self) -> Result<()> {
        if !self.pending.take() {
            return Ok(());
        }
        self.queues.iter().map(|q| q.flush()).fold(Ok(()), |acc, r| acc.and(r))
    }
}
