//! Adaptor: a hard limit on what an upstream may hand out, counted atomically before the
//! upstream call so that allocations in flight on other threads count too.

use super::Upstream;
use crate::error::Result;
use crate::fail;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Limit {
    max: u64,
    used: AtomicU64,
}

impl Limit {
    /// `max == 0` means no limit.
    pub fn new(max: u64) -> Self {
        Limit { max: if max == 0 { u64::MAX } else { max }, used: AtomicU64::new(0) }
    }

    pub fn acquire(&self, bytes: u64) -> Result<()> {
        let before = self.used.fetch_add(bytes, Ordering::AcqRel);
        if before.checked_add(bytes).is_none_or(|after| after > self.max) {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            fail!(
                KMM_ERROR_OUT_OF_MEMORY,
                "hard limit: {bytes} more bytes would exceed the limit of {} bytes ({before} held)",
                self.max
            );
        }
        Ok(())
    }

    pub fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

pub struct LimitedUpstream {
    pub inner: Arc<dyn Upstream>,
    pub limit: Arc<Limit>,
}

impl Upstream for LimitedUpstream {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        self.limit.acquire(bytes)?;
        self.inner.allocate(bytes).inspect_err(|_| self.limit.release(bytes))
    }

    unsafe fn deallocate(&self, addr: u64, bytes: u64) -> Result<()> {
        self.inner.deallocate(addr, bytes)?;
        self.limit.release(bytes);
        Ok(())
    }
}
