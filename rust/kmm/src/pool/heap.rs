//! Variable-size blocks with splitting and coalescing. Free blocks sit in segregated lists
//! (two-level, 32 sub-classes per power of two, as TLSF), so finding a fit is O(1); within the
//! request's own class the smallest fitting block is taken, which keeps the choice close to best
//! fit. Physical neighbours are linked, so coalescing on free is O(1).
//!
//! Blocks allocated as movable can be relocated to make room (`make_room`): a scan of each
//! chunk's blocks in address order finds the windows cheapest to empty, and each block in the
//! chosen window moves, one whole step at a time, to a free block outside it, or to room made
//! for it the same way, a level deeper.

use super::{Block, Owner, Relocation, Relocator, Suballocator, NO_OWNER};

const SL_BITS: u32 = 5;
const SL_COUNT: usize = 1 << SL_BITS;
const FL_COUNT: usize = 64;
const NONE: u32 = u32::MAX;
/// How many blocks of the request's own class are examined for the best fit.
const BEST_FIT_SCAN: usize = 16;
/// What one relocation costs beyond its bytes, in bytes: a queued copy has a fixed price, so of
/// two windows moving the same bytes the one with fewer blocks wins.
const RELOCATION_COST: u64 = 64 << 10;
/// How many windows one level of `make_room` tries, cheapest first, before giving up: a window
/// fails when a block it would move finds no place outside it.
const WINDOW_CANDIDATES: usize = 4;
/// How many levels deep room is made for a block that has to move and finds no free block.
const MAX_DEPTH: u32 = 2;
/// The most blocks one `make_room` moves, over all levels and tries.
const MAX_RELOCATIONS: u32 = 64;

#[derive(Clone, Copy)]
struct Node {
    addr: u64,
    size: u64,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    free: bool,
    /// Part of a window being emptied: neither allocated from nor moved.
    held: bool,
    owner: Owner,
    /// The first node of the node's chunk.
    chunk: u32,
}

/// An address range `[start, end)` of chunk `chunk` (an index into `chunks`) to empty. Kept as
/// addresses, since moving blocks out of one window changes the nodes of others.
#[derive(Clone, Copy)]
struct Window {
    chunk: usize,
    start: u64,
    end: u64,
}

/// One `make_room` in progress.
struct Compaction<'a> {
    mover: &'a mut dyn Relocator,
    moves_left: u32,
}

pub struct HeapSuballocator {
    /// log2 of the alignment: sizes are multiples of it, and classes count in its units (a shift,
    /// not a division, on every alloc and free).
    unit_shift: u32,
    nodes: Vec<Node>,
    spare_nodes: Vec<u32>,
    heads: Vec<[u32; SL_COUNT]>,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    /// First node of each chunk (stable: merging keeps the lower node).
    chunks: Vec<u32>,
    free_bytes: u64,
    /// Free bytes of each chunk, by the chunk's first node.
    chunk_free: Vec<u64>,
}

fn mapping(units: u64) -> (usize, usize) {
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let log = 63 - units.leading_zeros();
        ((log - SL_BITS + 1) as usize, ((units >> (log - SL_BITS)) as usize) - SL_COUNT)
    }
}

impl HeapSuballocator {
    /// `alignment` is a power of two (the manager's configuration checks it).
    pub fn new(alignment: u64) -> Self {
        assert!(alignment.is_power_of_two(), "heap alignment {alignment} is not a power of two");
        HeapSuballocator {
            unit_shift: alignment.trailing_zeros(),
            nodes: Vec::new(),
            spare_nodes: Vec::new(),
            heads: vec![[NONE; SL_COUNT]; FL_COUNT],
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            chunks: Vec::new(),
            free_bytes: 0,
            chunk_free: Vec::new(),
        }
    }

    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.chunk_free.push(0);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn class_of(&self, size: u64) -> (usize, usize) {
        mapping(size >> self.unit_shift)
    }

    fn insert_free(&mut self, id: u32) {
        let (fl, sl) = self.class_of(self.nodes[id as usize].size);
        let head = self.heads[fl][sl];
        {
            let n = &mut self.nodes[id as usize];
            n.free = true;
            n.prev_free = NONE;
            n.next_free = head;
        }
        if head != NONE {
            self.nodes[head as usize].prev_free = id;
        }
        self.heads[fl][sl] = id;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
        let n = &self.nodes[id as usize];
        self.free_bytes += n.size;
        self.chunk_free[n.chunk as usize] += n.size;
    }

    fn remove_free(&mut self, id: u32) {
        let Node { size, prev_free, next_free, .. } = self.nodes[id as usize];
        let (fl, sl) = self.class_of(size);
        if prev_free != NONE {
            self.nodes[prev_free as usize].next_free = next_free;
        } else {
            self.heads[fl][sl] = next_free;
            if next_free == NONE {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if next_free != NONE {
            self.nodes[next_free as usize].prev_free = prev_free;
        }
        self.nodes[id as usize].free = false;
        self.free_bytes -= size;
        self.chunk_free[self.nodes[id as usize].chunk as usize] -= size;
    }

    /// The smallest block of the request's own class that fits, looking at a bounded number.
    fn best_in_own_class(&self, size: u64) -> Option<u32> {
        let (fl, sl) = self.class_of(size);
        let mut id = self.heads[fl][sl];
        let mut best: Option<(u64, u32)> = None;
        for _ in 0..BEST_FIT_SCAN {
            if id == NONE {
                break;
            }
            let n = &self.nodes[id as usize];
            if n.size >= size && best.is_none_or(|(s, _)| n.size < s) {
                best = Some((n.size, id));
                if n.size == size {
                    break;
                }
            }
            id = n.next_free;
        }
        best.map(|(_, id)| id)
    }

    /// Any block of a class above the request's: every block there fits.
    fn first_in_larger_class(&self, size: u64) -> Option<u32> {
        let (fl, sl) = self.class_of(size);
        let sl_above = if sl + 1 < SL_COUNT { self.sl_bitmap[fl] & (!0u32 << (sl + 1)) } else { 0 };
        let (fl, sl) = if sl_above != 0 {
            (fl, sl_above.trailing_zeros() as usize)
        } else {
            let fl_above = if fl + 1 < FL_COUNT { self.fl_bitmap & (!0u64 << (fl + 1)) } else { 0 };
            if fl_above == 0 {
                return None;
            }
            let fl = fl_above.trailing_zeros() as usize;
            (fl, self.sl_bitmap[fl].trailing_zeros() as usize)
        };
        Some(self.heads[fl][sl])
    }

    /// Allocates `size` bytes at the start of free block `id`, splitting off the rest.
    fn take(&mut self, id: u32, size: u64, owner: Owner) -> Block {
        self.remove_free(id);
        let node = self.nodes[id as usize];
        if node.size > size {
            let rest = self.new_node(Node {
                addr: node.addr + size,
                size: node.size - size,
                prev_phys: id,
                next_phys: node.next_phys,
                prev_free: NONE,
                next_free: NONE,
                free: false,
                held: false,
                owner: NO_OWNER,
                chunk: node.chunk,
            });
            if node.next_phys != NONE {
                self.nodes[node.next_phys as usize].prev_phys = rest;
            }
            let n = &mut self.nodes[id as usize];
            n.size = size;
            n.next_phys = rest;
            self.insert_free(rest);
        }
        self.nodes[id as usize].owner = owner;
        Block { addr: node.addr, size, token: id }
    }

    /// Frees node `id`, merging it with free neighbours; returns the merged node.
    fn release(&mut self, mut id: u32) -> u32 {
        let next = self.nodes[id as usize].next_phys;
        if next != NONE && self.nodes[next as usize].free {
            self.remove_free(next);
            let absorbed = self.nodes[next as usize];
            let n = &mut self.nodes[id as usize];
            n.size += absorbed.size;
            n.next_phys = absorbed.next_phys;
            if absorbed.next_phys != NONE {
                self.nodes[absorbed.next_phys as usize].prev_phys = id;
            }
            self.spare_nodes.push(next);
        }
        let prev = self.nodes[id as usize].prev_phys;
        if prev != NONE && self.nodes[prev as usize].free {
            self.remove_free(prev);
            let absorbed = self.nodes[id as usize];
            let p = &mut self.nodes[prev as usize];
            p.size += absorbed.size;
            p.next_phys = absorbed.next_phys;
            if absorbed.next_phys != NONE {
                self.nodes[absorbed.next_phys as usize].prev_phys = prev;
            }
            self.spare_nodes.push(id);
            id = prev;
        }
        self.insert_free(id);
        id
    }

    /// Whether node `id` may be part of a window: free, or live and movable now.
    fn in_window_allowed(&self, id: u32, c: &mut Compaction) -> bool {
        let n = &self.nodes[id as usize];
        !n.held && (n.free || (n.owner != NO_OWNER && c.mover.movable(n.owner)))
    }

    /// Windows of at least `size` bytes inside one chunk that hold only free and movable
    /// blocks, cheapest to empty first, none overlapping another. A block costs its bytes plus
    /// `RELOCATION_COST`, three times its bytes when no free block could take it (it would need
    /// room made a level deeper). For each right end the window starts as late as it can.
    fn candidate_windows(&self, size: u64, c: &mut Compaction) -> Vec<Window> {
        let largest_free = self.largest_free();
        let cost_of = |n: &Node| match (n.free, n.size <= largest_free) {
            (true, _) => 0,
            (false, true) => n.size + RELOCATION_COST,
            (false, false) => 3 * n.size + RELOCATION_COST,
        };
        let mut found: Vec<(u64, Window)> = Vec::new();
        // Chunks with the most free bytes first: a window of `size` bytes in a chunk with `free`
        // free bytes moves at least `size - free`, so once that exceeds the cost of the
        // `WINDOW_CANDIDATES`-th cheapest chunk's best window, no later chunk can offer better.
        let mut order: Vec<usize> = (0..self.chunks.len()).collect();
        order.sort_unstable_by_key(|&c| std::cmp::Reverse(self.chunk_free[self.chunks[c] as usize]));
        let mut best_per_chunk: Vec<u64> = Vec::new();
        for chunk in order {
            let head = self.chunks[chunk];
            if best_per_chunk.len() >= WINDOW_CANDIDATES
                && size.saturating_sub(self.chunk_free[head as usize]) >= best_per_chunk[WINDOW_CANDIDATES - 1]
            {
                break;
            }
            let mut chunk_best = u64::MAX;
            let (mut start, mut span, mut cost) = (head, 0u64, 0u64);
            let mut id = head;
            while id != NONE {
                let next = self.nodes[id as usize].next_phys;
                if !self.in_window_allowed(id, c) {
                    (start, span, cost) = (next, 0, 0);
                    id = next;
                    continue;
                }
                let n = &self.nodes[id as usize];
                span += n.size;
                cost += cost_of(n);
                loop {
                    let first = &self.nodes[start as usize];
                    if start == id || span - first.size < size {
                        break;
                    }
                    span -= first.size;
                    cost -= cost_of(first);
                    start = first.next_phys;
                }
                if span >= size {
                    let begin = self.nodes[start as usize].addr;
                    found.push((cost, Window { chunk, start: begin, end: n.addr + n.size }));
                    chunk_best = chunk_best.min(cost);
                }
                id = next;
            }
            if chunk_best != u64::MAX {
                let at = best_per_chunk.partition_point(|&c| c <= chunk_best);
                best_per_chunk.insert(at, chunk_best);
            }
        }
        found.sort_unstable_by_key(|&(cost, _)| cost);
        let mut chosen: Vec<Window> = Vec::new();
        for (_, w) in found {
            if chosen.len() == WINDOW_CANDIDATES {
                break;
            }
            if !chosen.iter().any(|o| o.chunk == w.chunk && o.start < w.end && w.start < o.end) {
                chosen.push(w);
            }
        }
        chosen
    }

    /// Empties a window of at least `size` bytes; returns the free node that covers it.
    fn room(&mut self, size: u64, c: &mut Compaction, depth: u32) -> Option<u32> {
        for window in self.candidate_windows(size, c) {
            if let Some(id) = self.vacate(window, c, depth) {
                return Some(id);
            }
        }
        None
    }

    /// Moves every live block out of `window` and returns the free node covering it. On failure
    /// the blocks moved so far stay moved (each move is complete) and the rest is as it was.
    fn vacate(&mut self, window: Window, c: &mut Compaction, depth: u32) -> Option<u32> {
        let mut pieces = Vec::new();
        let mut id = self.chunks[window.chunk];
        while id != NONE && self.nodes[id as usize].addr < window.end {
            let n = &self.nodes[id as usize];
            if n.addr + n.size > window.start {
                pieces.push(id);
            }
            id = n.next_phys;
        }
        if !pieces.iter().all(|&id| self.in_window_allowed(id, c)) {
            return None;
        }
        // Free pieces leave the free lists, so nothing moved lands in the window.
        for &id in &pieces {
            if self.nodes[id as usize].free {
                self.remove_free(id);
                self.nodes[id as usize].owner = NO_OWNER;
            }
            self.nodes[id as usize].held = true;
        }
        let mut emptied = true;
        for &id in &pieces {
            let n = self.nodes[id as usize];
            if n.owner == NO_OWNER {
                continue;
            }
            if c.moves_left == 0 {
                emptied = false;
                break;
            }
            let to = match self.alloc_movable(n.size, n.owner) {
                Some(to) => Some(to),
                None if depth < MAX_DEPTH => self.room(n.size, c, depth + 1).map(|free| self.take(free, n.size, n.owner)),
                None => None,
            };
            let Some(to) = to else {
                emptied = false;
                break;
            };
            c.moves_left -= 1;
            if c.mover.relocate(&Relocation { owner: n.owner, from: Block { addr: n.addr, size: n.size, token: id }, to }).is_err() {
                self.release(to.token);
                emptied = false;
                break;
            }
            // The old place is now an empty piece of the window.
            self.nodes[id as usize].owner = NO_OWNER;
        }
        for &id in &pieces {
            self.nodes[id as usize].held = false;
        }
        if !emptied {
            for &id in &pieces {
                if self.nodes[id as usize].owner == NO_OWNER {
                    self.release(id);
                }
            }
            return None;
        }
        // Released in address order, the pieces merge into one free node.
        Some(pieces.iter().fold(NONE, |_, &id| self.release(id)))
    }
}

impl Suballocator for HeapSuballocator {
    fn add_chunk(&mut self, base: u64, size: u64) {
        let size = size >> self.unit_shift << self.unit_shift;
        if size == 0 {
            return;
        }
        let id = self.new_node(Node {
            addr: base,
            size,
            prev_phys: NONE,
            next_phys: NONE,
            prev_free: NONE,
            next_free: NONE,
            free: false,
            held: false,
            owner: NO_OWNER,
            chunk: NONE,
        });
        self.nodes[id as usize].chunk = id;
        self.chunks.push(id);
        self.insert_free(id);
    }

    fn alloc(&mut self, size: u64) -> Option<Block> {
        self.alloc_movable(size, NO_OWNER)
    }

    fn alloc_movable(&mut self, size: u64, owner: Owner) -> Option<Block> {
        let size = super::round_up(size.max(1), 1 << self.unit_shift);
        let id = self.best_in_own_class(size).or_else(|| self.first_in_larger_class(size))?;
        Some(self.take(id, size, owner))
    }

    fn free(&mut self, block: Block) -> bool {
        debug_assert!(!self.nodes[block.token as usize].free && self.nodes[block.token as usize].addr == block.addr);
        let id = self.release(block.token);
        let n = &self.nodes[id as usize];
        n.prev_phys == NONE && n.next_phys == NONE
    }

    fn relocates(&self) -> bool {
        true
    }

    fn make_room(&mut self, request: u64, owner: Owner, mover: &mut dyn Relocator) -> Option<Block> {
        let size = super::round_up(request.max(1), 1 << self.unit_shift);
        let mut c = Compaction { mover, moves_left: MAX_RELOCATIONS };
        let free = self.room(size, &mut c, 0)?;
        Some(self.take(free, size, owner))
    }

    fn remove_free_chunks(&mut self, bytes: u64) -> Vec<(u64, u64)> {
        let mut whole: Vec<u32> = self
            .chunks
            .iter()
            .copied()
            .filter(|&id| {
                let n = &self.nodes[id as usize];
                n.free && n.next_phys == NONE
            })
            .collect();
        whole.sort_by_key(|&id| std::cmp::Reverse(self.nodes[id as usize].size));
        let mut removed = Vec::new();
        let mut total = 0;
        for id in whole {
            if total >= bytes {
                break;
            }
            self.remove_free(id);
            let n = self.nodes[id as usize];
            self.spare_nodes.push(id);
            self.chunks.retain(|&c| c != id);
            removed.push((n.addr, n.size));
            total += n.size;
        }
        removed
    }

    fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut id = self.heads[fl][sl];
        let mut largest = 0;
        while id != NONE {
            largest = largest.max(self.nodes[id as usize].size);
            id = self.nodes[id as usize].next_free;
        }
        largest
    }

    fn free_bytes(&self) -> u64 {
        self.free_bytes
    }
}
