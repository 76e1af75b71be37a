//! Memory resources that compose, after RMM and the OptiX Toolkit's pools: an upstream
//! allocator hands out chunks, a suballocator carves blocks from them, and adaptors add one
//! concern each (limits, deferred reuse, statistics). Nothing here calls CUDA: leaves reach the
//! device only through the [`crate::backend`] traits.

pub mod binned;
pub mod deferred;
pub mod direct;
pub mod fixed;
pub mod heap;
pub mod lane_gauge;
pub mod limit;
pub mod pooled;
pub mod ring;
pub mod stats;
pub mod stream_async;
pub mod upstream;

#[cfg(test)]
mod conformance;

use crate::error::Result;

/// A block handed out by a resource. `size` is what the resource set aside (the request rounded
/// up); `token` is the resource's own bookkeeping index, given back on free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    pub token: u32,
}

/// Who holds a movable block, as its allocator's caller names it: a compaction reports each
/// block it relocates by this tag, so the caller can point its record at the new place.
pub type Owner = u32;
/// The tag of a block that never moves (slabs, staging, pinned memory).
pub const NO_OWNER: Owner = u32::MAX;

/// A live block a compaction relocates: its owner's bytes go from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relocation {
    pub owner: Owner,
    pub from: Block,
    pub to: Block,
}

/// Bookkeeping over address ranges: no memory is touched, so every suballocator is tested on
/// made-up addresses.
pub trait Suballocator: Send {
    /// Adds `[base, base + size)` to the ranges blocks are carved from.
    fn add_chunk(&mut self, base: u64, size: u64);
    /// A block of at least `size` bytes (`size` is a multiple of the alignment), or `None`. The
    /// block never moves.
    fn alloc(&mut self, size: u64) -> Option<Block>;
    /// As `alloc`, for a block that `make_room` may relocate, reporting it as `owner`'s.
    /// Suballocators that cannot relocate ignore the owner.
    fn alloc_movable(&mut self, size: u64, owner: Owner) -> Option<Block> {
        let _ = owner;
        self.alloc(size)
    }
    /// Whether `make_room` can ever make room (the suballocator relocates blocks).
    fn relocates(&self) -> bool {
        false
    }
    /// Serves `size` bytes, for `owner`, by moving movable blocks out of the way one at a time
    /// through `mover`; `None` when no room could be made. Blocks moved before a failure stay
    /// moved: every move is complete in itself.
    fn make_room(&mut self, size: u64, owner: Owner, mover: &mut dyn Relocator) -> Option<Block> {
        let _ = (size, owner, mover);
        None
    }
    /// Takes a block back. Returns true when the block's chunk became entirely free.
    fn free(&mut self, block: Block) -> bool;
    /// Removes entirely free chunks, largest first, until at least `bytes` were removed or none
    /// is left; returns them as (base, size).
    fn remove_free_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)>;
    fn largest_free(&self) -> u64;
    fn free_bytes(&self) -> u64;
    /// The largest request this suballocator can ever serve.
    fn max_request(&self) -> u64 {
        u64::MAX
    }
    /// The chunk size that serves a request of `size` bytes when the pool grows by `chunk_size`.
    fn chunk_for(&self, size: u64, chunk_size: u64) -> u64 {
        chunk_size.max(round_up(size, 2 << 20))
    }
    /// The smallest chunk that serves a request of `size` bytes (before the pool's alignment):
    /// what the pool grows by when a whole chunk does not fit.
    fn least_chunk(&self, size: u64) -> u64 {
        size
    }
}

/// Hands out chunks of memory: the device, pinned host memory, or another resource.
pub trait Upstream: Send + Sync {
    fn allocate(&self, bytes: u64) -> Result<u64>;
    /// Bytes it may still hand out as far as it knows (a limit's room; else no bound known).
    fn headroom(&self) -> u64 {
        u64::MAX
    }
    /// # Safety
    /// `addr` came from `allocate(bytes)` and nothing uses it any more.
    unsafe fn deallocate(&self, addr: u64, bytes: u64) -> Result<()>;
}

/// Counters a resource keeps about itself (seed 004's reserved and high-water figures).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResourceCounters {
    pub reserved: u64,
    pub peak_reserved: u64,
    pub pool_hits: u64,
    pub pool_misses: u64,
    pub upstream_allocs: u64,
    pub upstream_frees: u64,
    pub largest_free: u64,
    /// Allocations served by relocating live blocks instead of growing.
    pub compactions: u64,
    /// Bytes compaction moved, also in attempts that then grew the pool.
    pub relocated_bytes: u64,
}

impl ResourceCounters {
    pub fn add_reserved(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    /// Adds another lane's counters (the manager takes the peak from its upstream's gauge).
    pub fn merge(&mut self, other: &ResourceCounters) {
        self.reserved += other.reserved;
        self.peak_reserved = self.peak_reserved.max(other.peak_reserved);
        self.pool_hits += other.pool_hits;
        self.pool_misses += other.pool_misses;
        self.upstream_allocs += other.upstream_allocs;
        self.upstream_frees += other.upstream_frees;
        self.largest_free = self.largest_free.max(other.largest_free);
        self.compactions += other.compactions;
        self.relocated_bytes += other.relocated_bytes;
    }
}

/// What a pool needs from its caller: free chunks from elsewhere before it grows (another lane's,
/// made ready for this pool's stream order), and for relocating live blocks, whose blocks may
/// move now and the move itself: queue the copy (where every later use of either place is
/// ordered after it) and point the owner at the new block. An error leaves the block where it
/// was.
pub trait Relocator {
    fn movable(&mut self, owner: Owner) -> bool;
    fn relocate(&mut self, relocation: &Relocation) -> Result<()>;
    /// Entirely free chunks of the same upstream, `bytes` or more in all if there are, that the
    /// pool may add instead of growing (none by default).
    fn spare_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let _ = bytes;
        Vec::new()
    }
    /// Whether a caller that declined growth still lets the pool compact to serve the request.
    fn may_compact_instead(&mut self) -> bool {
        false
    }
    /// Whether the pool may compact or grow for a request of `size` bytes that its free blocks
    /// and the spare chunks did not serve; the pool reserves `reserved` bytes. A caller that
    /// would rather serve the request elsewhere (another lane's free blocks) says no, and the
    /// pool returns out of memory without moving or reserving anything.
    fn may_grow(&mut self, size: u64, reserved: u64) -> bool {
        let _ = (size, reserved);
        true
    }
}

/// A source of blocks, as the manager sees one. Blocks go back stream-ordered: the manager
/// orders the free first (see `manager::order`), so a resource never waits for a stream.
pub trait MemoryResource: Send {
    /// A block of at least `bytes`, held by `owner`. A pool that compacts may relocate other
    /// owners' blocks through `relocator` to make room.
    fn allocate(&mut self, bytes: u64, owner: Owner, relocator: &mut dyn Relocator) -> Result<Block>;
    /// A block of at least `bytes` from what the resource holds free now, or `None`: the common
    /// case of `allocate`, for its caller to try before it builds a `Relocator`. `None` says
    /// nothing about `allocate`, which counts the miss.
    fn allocate_free(&mut self, bytes: u64, owner: Owner) -> Option<Block> {
        let _ = (bytes, owner);
        None
    }
    /// Takes a block back; the manager has ordered its reuse already.
    fn deallocate(&mut self, block: Block) -> Result<()>;
    /// Takes entirely free chunks out, largest first, until at most `keep_bytes` stay reserved,
    /// and returns them (base, size): the caller gives them upstream once the work that may still
    /// use them has run, without holding this resource's lock while it waits. Resources that give
    /// memory back safely by themselves (CUDA's pool, a deferred resource's reclaimed blocks) do
    /// so here.
    fn detach_free(&mut self, keep_bytes: u64) -> Result<Vec<(u64, u64)>>;
    /// Takes entirely free chunks out for another resource of the same upstream (another lane),
    /// `bytes` or more in all if there are; they stop counting here.
    fn give_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let _ = bytes;
        Vec::new()
    }
    /// Adds chunks given by `give_chunks` or `detach_free` of a resource of the same upstream.
    fn take_chunks(&mut self, chunks: &[(u64, u64)]) {
        assert!(chunks.is_empty(), "a resource without chunks was given {} chunk(s)", chunks.len());
    }
    /// The event after which every block freed so far may be reclaimed (deferred resources).
    fn pending_fence(&self) -> Option<std::sync::Arc<dyn crate::backend::Event>> {
        None
    }
    fn counters(&self) -> ResourceCounters;
    fn reset_peak(&mut self);
    /// The chunks a pool holds (base, size), for the memory map; none for resources whose
    /// blocks are whole allocations.
    fn chunks(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }
}

/// `value` rounded up to a multiple of `multiple` (u64::MAX if that overflows).
pub fn round_up(value: u64, multiple: u64) -> u64 {
    if multiple.is_power_of_two() {
        // Alignments are powers of two: a mask, not a division, on the allocation path.
        value.checked_add(multiple - 1).map_or(u64::MAX, |v| v & !(multiple - 1))
    } else {
        value.div_ceil(multiple).saturating_mul(multiple)
    }
}

/// Which suballocator a pool uses (`KmmSuballocator` in the C ABI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuballocatorKind {
    Heap,
    Binned,
    Fixed,
    Ring,
}

pub fn new_suballocator(kind: SuballocatorKind, alignment: u64, fixed_block_size: u64) -> Box<dyn Suballocator> {
    match kind {
        SuballocatorKind::Heap => Box::new(heap::HeapSuballocator::new(alignment)),
        SuballocatorKind::Binned => Box::new(binned::BinnedSuballocator::new(alignment)),
        SuballocatorKind::Fixed => Box::new(fixed::FixedSuballocator::new(round_up(fixed_block_size, alignment))),
        SuballocatorKind::Ring => Box::new(ring::RingSuballocator::new()),
    }
}
