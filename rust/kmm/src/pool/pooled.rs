//! A pool: chunks from an upstream, blocks from a suballocator. On a miss it first takes spare
//! chunks from its caller (another lane's free ones), then, if the caller agrees (it may rather
//! serve the request from another lane's free blocks), compacts or grows by whole chunks. Free chunks
//! leave only through `detach_free` (the manager gives them upstream once their fence passed)
//! and `give_chunks` (to another lane).
//!
//! A pool may compact: when growing would take what it reserves past a set ratio of what its
//! blocks hold, or when growing fails, it first tries to make room by relocating movable blocks
//! (the caller's `Relocator` says which may move and queues the copies).

use super::{round_up, Block, MemoryResource, Owner, Relocation, Relocator, ResourceCounters, Suballocator, Upstream};
use crate::error::{Error, KmmStatus, Result};
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
    /// Reserved bytes as a percentage of the bytes in blocks above which the pool compacts
    /// before it grows; 0: never compacts.
    compaction_ratio_pct: u32,
    /// The suballocator's `max_request`, asked once.
    max_request: u64,
}

impl PoolResource {
    pub fn new(upstream: Arc<dyn Upstream>, sub: Box<dyn Suballocator>, chunk_size: u64, alignment: u64) -> Self {
        PoolResource {
            upstream,
            max_request: sub.max_request(),
            sub,
            chunk_size,
            alignment,
            counters: ResourceCounters::default(),
            chunks: Vec::new(),
            compaction_ratio_pct: 0,
        }
    }

    /// Lets the pool relocate movable blocks rather than grow past `ratio_pct` percent of the
    /// bytes its blocks hold (0: never; also when the suballocator cannot relocate).
    pub fn with_compaction(mut self, ratio_pct: u32) -> Self {
        self.compaction_ratio_pct = if self.sub.relocates() { ratio_pct } else { 0 };
        self
    }

    /// Adds a chunk up front (the configured initial pool size).
    pub fn reserve(&mut self, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.grow(bytes)
    }

    fn grow(&mut self, chunk: u64) -> Result<()> {
        let base = self.upstream.allocate(chunk)?;
        self.counters.upstream_allocs += 1;
        self.counters.add_reserved(chunk);
        self.chunks.push((base, chunk));
        self.sub.add_chunk(base, chunk);
        Ok(())
    }

    /// After growing by a whole `chunk` for `size` bytes failed out of memory (`e`): grows by
    /// what a limit still leaves room for (a chunk's worth at most, so that pooling goes on),
    /// else by the least chunk that serves the request (a limit below the chunk size, the last
    /// megabytes of a device). The error of the last try otherwise.
    fn grow_less(&mut self, size: u64, chunk: u64, e: Error) -> Result<()> {
        if e.status != KmmStatus::KMM_ERROR_OUT_OF_MEMORY {
            return Err(e);
        }
        let least = round_up(self.sub.least_chunk(size), self.alignment);
        let fit = (self.upstream.headroom() / self.alignment * self.alignment).min(chunk);
        let mut last = e;
        if least < fit && fit < chunk {
            match self.grow(fit) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        if least < chunk {
            return self.grow(least);
        }
        Err(last)
    }

    /// Whether growing by `chunk` for a request of `size` would take what the pool reserves past
    /// the compaction ratio of what its blocks would then hold.
    fn growth_passes_ratio(&self, size: u64, chunk: u64) -> bool {
        if self.compaction_ratio_pct == 0 {
            return false;
        }
        let reserved = self.counters.reserved;
        let held = reserved - self.sub.free_bytes() + size;
        (reserved + chunk) as u128 * 100 > held as u128 * self.compaction_ratio_pct as u128
    }

    /// A free block of `size` (rounded, within `max_request`), counted as a hit, or `None`.
    #[inline]
    fn hit(&mut self, size: u64, owner: Owner) -> Option<Block> {
        let block = self.sub.alloc_movable(size, owner)?;
        self.counters.pool_hits += 1;
        Some(block)
    }

    /// Serves `size` bytes by relocating movable blocks, or `None`.
    fn compact(&mut self, size: u64, owner: Owner, relocator: &mut dyn Relocator) -> Option<Block> {
        if self.compaction_ratio_pct == 0 || self.sub.free_bytes() < size {
            return None;
        }
        let mut counted = Counted { inner: relocator, bytes: 0 };
        let block = self.sub.make_room(size, owner, &mut counted);
        self.counters.relocated_bytes += counted.bytes;
        self.counters.compactions += block.is_some() as u64;
        block
    }
}

impl PoolResource {
    /// Removes entirely free chunks, largest first, until `bytes` or more are out.
    fn detach(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let chunks = self.sub.remove_free_chunks(bytes);
        for &(base, size) in &chunks {
            self.chunks.retain(|&(b, _)| b != base);
            self.counters.reserved -= size;
        }
        chunks
    }
}

/// Counts the bytes a compaction moves.
struct Counted<'a> {
    inner: &'a mut dyn Relocator,
    bytes: u64,
}

impl Relocator for Counted<'_> {
    fn spare_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        self.inner.spare_chunks(bytes)
    }
    fn may_grow(&mut self, size: u64, reserved: u64) -> bool {
        self.inner.may_grow(size, reserved)
    }
    fn movable(&mut self, owner: Owner) -> bool {
        self.inner.movable(owner)
    }
    fn relocate(&mut self, r: &Relocation) -> Result<()> {
        self.inner.relocate(r)?;
        self.bytes += r.from.size;
        Ok(())
    }
}

impl MemoryResource for PoolResource {
    #[inline]
    fn allocate_free(&mut self, bytes: u64, owner: Owner) -> Option<Block> {
        let size = round_up(bytes.max(1), self.alignment);
        (size <= self.max_request).then(|| self.hit(size, owner)).flatten()
    }

    fn allocate(&mut self, bytes: u64, owner: Owner, relocator: &mut dyn Relocator) -> Result<Block> {
        let size = round_up(bytes.max(1), self.alignment);
        if size > self.max_request {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "bytes = {bytes} exceeds the fixed suballocator's block size {} (config.fixed_block_size rounded up to config.alignment)",
                self.max_request
            );
        }
        if let Some(block) = self.hit(size, owner) {
            return Ok(block);
        }
        self.counters.pool_misses += 1;
        let spare = relocator.spare_chunks(size);
        if !spare.is_empty() {
            self.take_chunks(&spare);
            if let Some(block) = self.sub.alloc_movable(size, owner) {
                return Ok(block);
            }
        }
        if !relocator.may_grow(size, self.counters.reserved) {
            if relocator.may_compact_instead() {
                if let Some(block) = self.compact(size, owner, relocator) {
                    return Ok(block);
                }
            }
            fail!(KMM_ERROR_OUT_OF_MEMORY, "{size} bytes: no free block, and the caller declined compaction and growth");
        }
        let chunk = self.sub.chunk_for(size, self.chunk_size);
        let past_ratio = self.growth_passes_ratio(size, chunk);
        if past_ratio {
            if let Some(block) = self.compact(size, owner, relocator) {
                return Ok(block);
            }
        }
        let grown = self.grow(chunk).or_else(|e| self.grow_less(size, chunk, e));
        match grown {
            Ok(()) => self
                .sub
                .alloc_movable(size, owner)
                .ok_or_else(|| err!(KMM_ERROR_INTERNAL, "a fresh chunk did not serve {size} bytes")),
            // Out of device memory or past the hard limit: moving blocks may still make room.
            Err(e) if !past_ratio && e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => {
                self.compact(size, owner, relocator).ok_or(e)
            }
            Err(e) => Err(e),
        }
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.sub.free(block);
        Ok(())
    }

    fn detach_free(&mut self, keep_bytes: u64) -> Result<Vec<(u64, u64)>> {
        if self.counters.reserved <= keep_bytes {
            return Ok(Vec::new());
        }
        let chunks = self.detach(self.counters.reserved - keep_bytes);
        self.counters.upstream_frees += chunks.len() as u64;
        Ok(chunks)
    }

    fn give_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        self.detach(bytes)
    }

    fn take_chunks(&mut self, chunks: &[(u64, u64)]) {
        for &(base, size) in chunks {
            self.counters.add_reserved(size);
            self.chunks.push((base, size));
            self.sub.add_chunk(base, size);
        }
    }

    fn chunks(&self) -> Vec<(u64, u64)> {
        self.chunks.clone()
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
            // SAFETY: the owning manager has synchronized its streams before dropping the pool.
            let _ = unsafe { self.upstream.deallocate(base, size) };
        }
    }
}
