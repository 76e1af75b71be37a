//! A ring per chunk for short-lived temporaries (staging): blocks are carved at the head and
//! space comes back as the oldest blocks are freed. Frees out of order are allowed; their space
//! returns once everything older is free.

use super::{Block, Suballocator};
use std::collections::VecDeque;

struct Ring {
    base: u64,
    size: u64,
    /// Next free offset; the live region runs from the oldest block to here, wrapping.
    head: u64,
    /// (offset, size, freed) in allocation order.
    live: VecDeque<(u64, u64, bool)>,
}

impl Ring {
    fn tail(&self) -> u64 {
        self.live.front().map_or(self.head, |b| b.0)
    }

    fn alloc(&mut self, size: u64) -> Option<u64> {
        if self.live.is_empty() {
            self.head = 0;
        }
        let tail = self.tail();
        let offset = if self.live.is_empty() || self.head > tail {
            // Free space is [head, size) and [0, tail).
            if self.size - self.head >= size {
                self.head
            } else if tail >= size || (self.live.is_empty() && self.size >= size) {
                0
            } else {
                return None;
            }
        } else if tail - self.head >= size {
            self.head
        } else {
            return None;
        };
        self.head = offset + size;
        self.live.push_back((offset, size, false));
        Some(self.base + offset)
    }

    fn free(&mut self, addr: u64) {
        let offset = addr - self.base;
        if let Some(entry) = self.live.iter_mut().find(|b| b.0 == offset && !b.2) {
            entry.2 = true;
        }
        while self.live.front().is_some_and(|b| b.2) {
            self.live.pop_front();
        }
    }
}

pub struct RingSuballocator {
    rings: Vec<Option<Ring>>,
}

impl RingSuballocator {
    pub fn new() -> Self {
        RingSuballocator { rings: Vec::new() }
    }
}

impl Default for RingSuballocator {
    fn default() -> Self {
        Self::new()
    }
}

impl Suballocator for RingSuballocator {
    fn add_chunk(&mut self, base: u64, size: u64) {
        let ring = Some(Ring { base, size, head: 0, live: VecDeque::new() });
        match self.rings.iter().position(Option::is_none) {
            Some(i) => self.rings[i] = ring,
            None => self.rings.push(ring),
        }
    }

    fn alloc(&mut self, size: u64) -> Option<Block> {
        for (i, ring) in self.rings.iter_mut().enumerate() {
            if let Some(addr) = ring.as_mut().and_then(|r| r.alloc(size)) {
                return Some(Block { addr, size, token: i as u32 });
            }
        }
        None
    }

    fn free(&mut self, block: Block) -> bool {
        let ring = self.rings[block.token as usize].as_mut().expect("block of a live ring");
        ring.free(block.addr);
        ring.live.is_empty()
    }

    fn remove_free_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let mut removed = Vec::new();
        let mut total = 0;
        for slot in self.rings.iter_mut() {
            if total >= bytes {
                break;
            }
            if slot.as_ref().is_some_and(|r| r.live.is_empty()) {
                let r = slot.take().expect("checked above");
                removed.push((r.base, r.size));
                total += r.size;
            }
        }
        removed
    }

    fn largest_free(&self) -> u64 {
        self.rings
            .iter()
            .flatten()
            .map(|r| {
                if r.live.is_empty() {
                    r.size
                } else if r.head > r.tail() {
                    (r.size - r.head).max(r.tail())
                } else {
                    r.tail() - r.head
                }
            })
            .max()
            .unwrap_or(0)
    }

    fn free_bytes(&self) -> u64 {
        self.rings
            .iter()
            .flatten()
            .map(|r| r.size - r.live.iter().filter(|b| !b.2).map(|b| b.1).sum::<u64>())
            .sum()
    }
}
