//! A pool: chunks from an upstream, blocks from a suballocator. Grows by whole chunks on a miss
//! and gives chunks back only through `trim` (the manager calls it when its stream is idle, at
//! synchronization against the release threshold, and when an allocation runs out of memory).

use super::{round_up, Block, MemoryResource, ResourceCounters, Suballocator, Upstream};
use crate::error::Result;
use crate::{err, fail};
use std::sync::Arc;

pub struct PoolResource {
    upstream: Arc<dyn Upstream>,
    sub: Box<dyn Suballocator>,
    chunk_size: u64,
    alignment: u64,
    counters: ResourceCounters,
    /// Every chunk held, so teardown returns them even if blocks were never freed.
    chunks: Vec<(u64, u64)>,
}

impl PoolResource {
    pub fn new(upstream: Arc<dyn Upstream>, sub: Box<dyn Suballocator>, chunk_size: u64, alignment: u64) -> Self {
        PoolResource { upstream, sub, chunk_size, alignment, counters: ResourceCounters::default(), chunks: Vec::new() }
    }

    /// Adds a chunk up front (the configured initial pool size).
    pub fn reserve(&mut self, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let base = self.upstream.allocate(bytes)?;
        self.counters.upstream_allocs += 1;
        self.counters.add_reserved(bytes);
        self.chunks.push((base, bytes));
        self.sub.add_chunk(base, bytes);
        Ok(())
    }
}

impl MemoryResource for PoolResource {
    fn allocate(&mut self, bytes: u64) -> Result<Block> {
        let size = round_up(bytes.max(1), self.alignment);
        if size > self.sub.max_request() {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "bytes = {bytes} exceeds the fixed suballocator's block size {}",
                self.sub.max_request()
            );
        }
        if let Some(block) = self.sub.alloc(size) {
            self.counters.pool_hits += 1;
            return Ok(block);
        }
        self.counters.pool_misses += 1;
        let chunk = self.sub.chunk_for(size, self.chunk_size);
        let base = self.upstream.allocate(chunk)?;
        self.counters.upstream_allocs += 1;
        self.counters.add_reserved(chunk);
        self.chunks.push((base, chunk));
        self.sub.add_chunk(base, chunk);
        self.sub.alloc(size).ok_or_else(|| err!(KMM_ERROR_INTERNAL, "a fresh chunk of {chunk} bytes did not serve {size}"))
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.sub.free(block);
        Ok(())
    }

    fn trim(&mut self, keep_bytes: u64) -> Result<()> {
        if self.counters.reserved <= keep_bytes {
            return Ok(());
        }
        for (base, size) in self.sub.remove_free_chunks(self.counters.reserved - keep_bytes) {
            // SAFETY: the chunk came from this upstream and the manager's stream is idle.
            unsafe { self.upstream.deallocate(base, size)? };
            self.chunks.retain(|&(b, _)| b != base);
            self.counters.reserved -= size;
            self.counters.upstream_frees += 1;
        }
        Ok(())
    }

    fn counters(&self) -> ResourceCounters {
        ResourceCounters { largest_free: self.sub.largest_free(), ..self.counters }
    }

    fn reset_peak(&mut self) {
        self.counters.peak_reserved = self.counters.reserved;
    }
}

impl Drop for PoolResource {
    fn drop(&mut self) {
        for &(base, size) in &self.chunks {
            // SAFETY: the owning manager has synchronized its stream before dropping the pool.
            let _ = unsafe { self.upstream.deallocate(base, size) };
        }
    }
}
