//! What the manager counts per memory kind on top of its resource's own counters.

/// Bytes are the bytes callers asked for, so rounding and fragmentation show up as the gap
/// between `in_use` and the resource's `reserved`.
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
        self.peak_in_use = self.peak_in_use.max(self.in_use);
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

    pub fn reset_peak(&mut self) {
        self.peak_in_use = self.in_use;
    }

    /// Adds another lane's counters (peaks add up to an upper bound of the joint peak).
    pub fn merge(&mut self, other: &UsageCounters) {
        self.in_use += other.in_use;
        self.peak_in_use += other.peak_in_use;
        self.allocs += other.allocs;
        self.frees += other.frees;
        self.failed_allocs += other.failed_allocs;
        self.live_buffers += other.live_buffers;
    }
}
