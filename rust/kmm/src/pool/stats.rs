//! What the manager counts per memory kind on top of its resource's own counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// A figure that several lanes change at once, with its exact high-water mark (a sum of per-lane
/// peaks would only bound it).
#[derive(Debug, Default)]
pub struct Gauge {
    current: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    pub fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Ordering::AcqRel) + n;
        self.raise_peak(now);
    }

    /// Adds `n` unless the total would pass `max`; returns the total before.
    pub fn add_within(&self, n: u64, max: u64) -> Result<u64, u64> {
        let before = self.current.fetch_add(n, Ordering::AcqRel);
        match before.checked_add(n) {
            Some(now) if now <= max => {
                self.raise_peak(now);
                Ok(before)
            }
            _ => {
                self.current.fetch_sub(n, Ordering::AcqRel);
                Err(before)
            }
        }
    }

    fn raise_peak(&self, now: u64) {
        // A load first: the peak seldom moves, and a read keeps the cache line shared.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::AcqRel);
        }
    }

    pub fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// As `LaneGauge::reset_peak`: the figure read again after the store raises the new peak
    /// to an add that raced the reset.
    pub fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::SeqCst);
        self.peak.fetch_max(self.current.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Bytes are the bytes callers asked for, so rounding and fragmentation show up as the gap
/// between `in_use` and the resource's `reserved`. A lane counts its own calls; the manager's
/// bytes in use and their peak are kept by a [`Gauge`] all lanes share.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageCounters {
    pub in_use: u64,
    pub peak_in_use: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failed_allocs: u64,
    pub live_buffers: u64,
}

impl UsageCounters {
    pub fn on_alloc(&mut self, bytes: u64) {
        self.in_use += bytes;
        self.allocs += 1;
        self.live_buffers += 1;
    }

    pub fn on_free(&mut self, bytes: u64) {
        self.in_use -= bytes;
        self.frees += 1;
        self.live_buffers -= 1;
    }

    pub fn on_failure(&mut self) {
        self.failed_allocs += 1;
    }

    /// Adds another lane's counters (the peak comes from the manager's gauge).
    pub fn merge(&mut self, other: &UsageCounters) {
        self.in_use += other.in_use;
        self.allocs += other.allocs;
        self.frees += other.frees;
        self.failed_allocs += other.failed_allocs;
        self.live_buffers += other.live_buffers;
    }
}
