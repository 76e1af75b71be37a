//! Adaptor: a hard limit on what an upstream may hand out, counted atomically before the
//! upstream call so that allocations in flight on other threads count too. The count is what the
//! manager reserves of that upstream, across its lanes, with its exact peak.

use super::stats::Gauge;
use super::Upstream;
use crate::error::Result;
use crate::fail;
use std::sync::Arc;

pub struct Limit {
    max: u64,
    used: Gauge,
    /// What the limit is called in messages: "hard limit", "pinned limit (pinned_limit)".
    name: &'static str,
}

impl Limit {
    /// `max == 0` means no limit.
    pub fn new(max: u64, name: &'static str) -> Self {
        Limit { max: if max == 0 { u64::MAX } else { max }, used: Gauge::default(), name }
    }

    pub fn acquire(&self, bytes: u64) -> Result<()> {
        if let Err(before) = self.used.add_within(bytes, self.max) {
            fail!(
                KMM_ERROR_OUT_OF_MEMORY,
                "{}: {bytes} more bytes would exceed the limit of {} bytes ({before} held)",
                self.name,
                self.max
            );
        }
        Ok(())
    }

    pub fn release(&self, bytes: u64) {
        self.used.sub(bytes);
    }

    /// The most bytes the limit lets be held (`u64::MAX` for none).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Bytes held now and their peak.
    pub fn used(&self) -> &Gauge {
        &self.used
    }
}

pub struct LimitedUpstream {
    pub inner: Arc<dyn Upstream>,
    pub limit: Arc<Limit>,
}

impl Upstream for LimitedUpstream {
    fn headroom(&self) -> u64 {
        self.limit.max.saturating_sub(self.limit.used.current()).min(self.inner.headroom())
    }

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
