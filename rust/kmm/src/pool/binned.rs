//! Size classes for small requests, a heap above: each class is a fixed-size suballocator over
//! slabs carved from the heap, and a slab goes back to the heap once all its blocks are free.

use super::fixed::FixedSuballocator;
use super::heap::HeapSuballocator;
use super::{round_up, Block, Owner, Relocator, Suballocator};
use std::collections::HashMap;

/// Requests up to this size are served from size classes.
pub const MAX_BINNED: u64 = 16 << 10;
/// Blocks per slab at least (slabs are at least 64 KiB and a whole number of blocks).
const BLOCKS_PER_SLAB: u64 = 8;

struct Bin {
    fixed: FixedSuballocator,
    /// Heap block behind each slab, by slab base address.
    slabs: HashMap<u64, Block>,
}

pub struct BinnedSuballocator {
    heap: HeapSuballocator,
    /// Class sizes ascending: multiples of the alignment, four classes per power of two.
    sizes: Vec<u64>,
    /// The class of each request size up to `MAX_BINNED`, by size in alignment units rounded up
    /// (a table lookup, not a search, on every alloc and free).
    class_of_units: Vec<u8>,
    unit_shift: u32,
    bins: Vec<Bin>,
}

impl BinnedSuballocator {
    pub fn new(alignment: u64) -> Self {
        let alignment = alignment.max(1);
        let mut sizes: Vec<u64> = Vec::new();
        let mut power = alignment;
        while power <= MAX_BINNED {
            for quarter in 0..4 {
                let size = round_up(power + power * quarter / 4, alignment);
                if size <= MAX_BINNED && sizes.last() != Some(&size) {
                    sizes.push(size);
                }
            }
            power *= 2;
        }
        let bins = sizes.iter().map(|&s| Bin { fixed: FixedSuballocator::new(s), slabs: HashMap::new() }).collect();
        let unit_shift = alignment.trailing_zeros();
        let class_of_units = (0..=MAX_BINNED >> unit_shift)
            .map(|units| sizes.partition_point(|&s| s < units << unit_shift) as u8)
            .collect();
        BinnedSuballocator { heap: HeapSuballocator::new(alignment), sizes, class_of_units, unit_shift, bins }
    }

    fn bin_for(&self, size: u64) -> Option<usize> {
        if size > MAX_BINNED {
            return None;
        }
        let units = (size + (1 << self.unit_shift) - 1) >> self.unit_shift;
        Some(self.class_of_units[units as usize] as usize)
    }

    /// Adds `slab` (a heap block) to class `bin` and serves `size` bytes from it.
    fn serve_from_new_slab(&mut self, bin: usize, slab: Block, size: u64) -> Option<Block> {
        let bin = &mut self.bins[bin];
        bin.fixed.add_chunk(slab.addr, slab.size);
        bin.slabs.insert(slab.addr, slab);
        bin.fixed.alloc(size)
    }

    fn slab_size(&self, bin: usize) -> u64 {
        let size = self.sizes[bin];
        size * BLOCKS_PER_SLAB.max((64u64 << 10).div_ceil(size))
    }
}

impl Suballocator for BinnedSuballocator {
    fn add_chunk(&mut self, base: u64, size: u64) {
        self.heap.add_chunk(base, size);
    }

    fn alloc(&mut self, size: u64) -> Option<Block> {
        self.alloc_movable(size, super::NO_OWNER)
    }

    /// Only blocks above the size classes move: a slab holds many owners' blocks.
    fn alloc_movable(&mut self, size: u64, owner: Owner) -> Option<Block> {
        let Some(bin) = self.bin_for(size) else {
            return self.heap.alloc_movable(size, owner);
        };
        if let Some(b) = self.bins[bin].fixed.alloc(size) {
            return Some(b);
        }
        let slab = self.heap.alloc(self.slab_size(bin))?;
        self.serve_from_new_slab(bin, slab, size)
    }

    fn free(&mut self, block: Block) -> bool {
        let Some(bin) = self.bin_for(block.size) else {
            return self.heap.free(block);
        };
        let bin = &mut self.bins[bin];
        // Keep one slab per class so a class at the edge of a slab does not thrash.
        if bin.fixed.free(block) && bin.slabs.len() > 1 {
            let mut chunk_empty = false;
            for (base, _) in bin.fixed.remove_free_chunks(1) {
                let slab = bin.slabs.remove(&base).expect("slab recorded when added");
                chunk_empty |= self.heap.free(slab);
            }
            return chunk_empty;
        }
        false
    }

    fn relocates(&self) -> bool {
        true
    }

    /// A small request needs a slab of its class from the heap.
    fn least_chunk(&self, size: u64) -> u64 {
        self.bin_for(size).map_or(size, |bin| self.slab_size(bin))
    }

    /// A small request makes room for a slab of its class.
    fn make_room(&mut self, size: u64, owner: Owner, mover: &mut dyn Relocator) -> Option<Block> {
        let Some(bin) = self.bin_for(size) else {
            return self.heap.make_room(size, owner, mover);
        };
        let slab = self.heap.make_room(self.slab_size(bin), super::NO_OWNER, mover)?;
        self.serve_from_new_slab(bin, slab, size)
    }

    fn remove_free_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        // Empty slabs go back to the heap first so whole chunks can appear.
        for bin in &mut self.bins {
            for (base, _) in bin.fixed.remove_free_chunks(u64::MAX) {
                let slab = bin.slabs.remove(&base).expect("slab recorded when added");
                self.heap.free(slab);
            }
        }
        self.heap.remove_free_chunks(bytes)
    }

    fn largest_free(&self) -> u64 {
        self.heap.largest_free().max(self.bins.iter().map(|b| b.fixed.largest_free()).max().unwrap_or(0))
    }

    fn free_bytes(&self) -> u64 {
        self.heap.free_bytes() + self.bins.iter().map(|b| b.fixed.free_bytes()).sum::<u64>()
    }
}
