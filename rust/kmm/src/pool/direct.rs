//! One upstream allocation per request (`cuMemAlloc`): the baseline and the debugging mode.
//! Wrap it in [`super::deferred::Deferred`] so frees wait for the stream.

use super::{round_up, Block, MemoryResource, Owner, Relocator, ResourceCounters, Upstream};
use crate::error::Result;
use std::sync::Arc;

pub struct DirectResource {
    upstream: Arc<dyn Upstream>,
    alignment: u64,
    counters: ResourceCounters,
}

impl DirectResource {
    pub fn new(upstream: Arc<dyn Upstream>, alignment: u64) -> Self {
        DirectResource { upstream, alignment, counters: ResourceCounters::default() }
    }

    /// Takes ownership of a block allocated elsewhere by the same upstream.
    pub fn adopt(&mut self, block: Block) {
        self.counters.add_reserved(block.size);
    }
}

impl MemoryResource for DirectResource {
    fn allocate(&mut self, bytes: u64, _owner: Owner, _relocator: &mut dyn Relocator) -> Result<Block> {
        let size = round_up(bytes.max(1), self.alignment);
        let addr = self.upstream.allocate(size)?;
        self.counters.pool_misses += 1;
        self.counters.upstream_allocs += 1;
        self.counters.add_reserved(size);
        Ok(Block { addr, size, token: 0 })
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        // SAFETY: the deferring adaptor calls this only once the stream has passed the free.
        unsafe { self.upstream.deallocate(block.addr, block.size)? };
        self.counters.reserved -= block.size;
        self.counters.upstream_frees += 1;
        Ok(())
    }

    fn detach_free(&mut self, _keep_bytes: u64) -> Result<Vec<(u64, u64)>> {
        Ok(Vec::new())
    }

    fn counters(&self) -> ResourceCounters {
        self.counters
    }

    fn reset_peak(&mut self) {
        self.counters.peak_reserved = self.counters.reserved;
    }
}
