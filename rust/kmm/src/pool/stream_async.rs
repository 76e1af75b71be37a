//! CUDA's own stream-ordered pool (`cuMemAllocFromPoolAsync` on a private `cuMemPool` with a
//! release threshold and a maximum size), as one more resource the manager can choose.

use super::{Block, MemoryResource, Owner, Relocator, ResourceCounters};
use crate::backend::{AsyncPool, Stream};
use crate::error::Result;
use std::sync::Arc;

pub struct AsyncResource {
    pool: Box<dyn AsyncPool>,
    stream: Arc<dyn Stream>,
    counters: ResourceCounters,
}

impl AsyncResource {
    pub fn new(pool: Box<dyn AsyncPool>, stream: Arc<dyn Stream>) -> Self {
        AsyncResource { pool, stream, counters: ResourceCounters::default() }
    }
}

impl MemoryResource for AsyncResource {
    fn allocate(&mut self, bytes: u64, _owner: Owner, _relocator: &mut dyn Relocator) -> Result<Block> {
        let addr = self.pool.alloc(bytes, self.stream.as_ref())?;
        self.counters.upstream_allocs += 1;
        Ok(Block { addr, size: bytes, token: 0 })
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        // SAFETY: the block came from this pool.
        unsafe { self.pool.free(block.addr, self.stream.as_ref())? };
        self.counters.upstream_frees += 1;
        Ok(())
    }

    /// The driver keeps memory of frees still pending on the stream: trimming is safe at once.
    fn detach_free(&mut self, keep_bytes: u64) -> Result<Vec<(u64, u64)>> {
        self.pool.trim(keep_bytes)?;
        Ok(Vec::new())
    }

    fn counters(&self) -> ResourceCounters {
        let (reserved, high) = self.pool.reserved().unwrap_or((0, 0));
        ResourceCounters { reserved, peak_reserved: high.max(self.counters.peak_reserved), ..self.counters }
    }

    fn reset_peak(&mut self) {
        // The driver's high-water mark cannot be lowered below its own; track ours from here.
        self.counters.peak_reserved = self.pool.reserved().map(|r| r.0).unwrap_or(0);
    }
}
