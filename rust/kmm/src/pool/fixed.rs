//! Blocks of one size: a free list per pool, O(1) both ways. Serves any request up to the block
//! size; a larger one is refused before it reaches here (see `max_request`).

use super::{Block, Suballocator};

struct Chunk {
    base: u64,
    size: u64,
    capacity: u32,
    free: u32,
}

pub struct FixedSuballocator {
    block: u64,
    /// (address, chunk index) of each free block.
    free_list: Vec<(u64, u32)>,
    chunks: Vec<Option<Chunk>>,
}

impl FixedSuballocator {
    pub fn new(block: u64) -> Self {
        FixedSuballocator { block: block.max(1), free_list: Vec::new(), chunks: Vec::new() }
    }
}

impl Suballocator for FixedSuballocator {
    fn add_chunk(&mut self, base: u64, size: u64) {
        let capacity = (size / self.block).min(u32::MAX as u64) as u32;
        if capacity == 0 {
            return;
        }
        let index = match self.chunks.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.chunks.push(None);
                self.chunks.len() - 1
            }
        };
        self.chunks[index] = Some(Chunk { base, size, capacity, free: capacity });
        // Reversed so blocks are handed out in address order.
        for i in (0..capacity as u64).rev() {
            self.free_list.push((base + i * self.block, index as u32));
        }
    }

    fn alloc(&mut self, size: u64) -> Option<Block> {
        if size > self.block {
            return None;
        }
        let (addr, chunk) = self.free_list.pop()?;
        self.chunks[chunk as usize].as_mut().expect("free block of a live chunk").free -= 1;
        Some(Block { addr, size: self.block, token: chunk })
    }

    fn free(&mut self, block: Block) -> bool {
        self.free_list.push((block.addr, block.token));
        let chunk = self.chunks[block.token as usize].as_mut().expect("block of a live chunk");
        chunk.free += 1;
        chunk.free == chunk.capacity
    }

    fn remove_free_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let mut whole: Vec<usize> = (0..self.chunks.len())
            .filter(|&i| matches!(&self.chunks[i], Some(c) if c.free == c.capacity))
            .collect();
        whole.sort_by_key(|&i| std::cmp::Reverse(self.chunks[i].as_ref().map_or(0, |c| c.size)));
        let mut removed = Vec::new();
        let mut total = 0;
        for i in whole {
            if total >= bytes {
                break;
            }
            let chunk = self.chunks[i].take().expect("chunk listed as whole");
            removed.push((chunk.base, chunk.size));
            total += chunk.size;
        }
        if !removed.is_empty() {
            let chunks = &self.chunks;
            self.free_list.retain(|&(_, c)| chunks[c as usize].is_some());
        }
        removed
    }

    fn largest_free(&self) -> u64 {
        if self.free_list.is_empty() { 0 } else { self.block }
    }

    fn free_bytes(&self) -> u64 {
        self.free_list.len() as u64 * self.block
    }

    fn max_request(&self) -> u64 {
        self.block
    }

    fn chunk_for(&self, _size: u64, chunk_size: u64) -> u64 {
        super::round_up(chunk_size.max(self.block), self.block)
    }

    fn least_chunk(&self, _size: u64) -> u64 {
        self.block
    }
}
