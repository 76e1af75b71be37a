//! Which host ranges are page-locked: Kmm's pinned allocations and registered memory. Backends
//! keep this themselves rather than asking the driver, whose probe (`cuPointerGetAttribute`)
//! fails on pageable memory and shows up as an API error under compute-sanitizer.

use crate::error::lock;
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct PinnedRanges(Mutex<BTreeMap<u64, u64>>);

impl PinnedRanges {
    /// Returns false when the range overlaps one already held (as CUDA refuses to register
    /// memory twice, in part or whole).
    pub fn insert(&self, start: u64, len: u64) -> bool {
        let mut ranges = lock(&self.0);
        if Self::overlapping(&ranges, start, len) {
            return false;
        }
        ranges.insert(start, len);
        true
    }

    /// Whether `start..start+len` shares a byte with a range held.
    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        Self::overlapping(&lock(&self.0), start, len)
    }

    fn overlapping(ranges: &BTreeMap<u64, u64>, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len.max(1));
        ranges.range(..end).next_back().is_some_and(|(&base, &size)| base.saturating_add(size.max(1)) > start)
    }

    /// The length of the range that starts at `start`, taken out; `None` when none does.
    pub fn remove(&self, start: u64) -> Option<u64> {
        lock(&self.0).remove(&start)
    }

    pub fn contains(&self, start: u64, len: u64) -> bool {
        let ranges = lock(&self.0);
        match ranges.range(..=start).next_back() {
            Some((&base, &size)) => start.checked_add(len).is_some_and(|end| end <= base + size),
            None => false,
        }
    }
}
