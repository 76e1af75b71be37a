//! One suite run against every suballocator (as RMM tests every resource): blocks are aligned,
//! inside a chunk, never overlap, come back whole, and a fully free pool can be given back.
//! Each suballocator adds only its special cases below.

use super::binned::BinnedSuballocator;
use super::fixed::FixedSuballocator;
use super::heap::HeapSuballocator;
use super::ring::RingSuballocator;
use super::{Block, Owner, Relocation, Relocator, Suballocator};
use std::collections::BTreeMap;

const ALIGN: u64 = 256;
const CHUNK: u64 = 4 << 20;
const BASE: u64 = 0x1000_0000;

fn all() -> Vec<(&'static str, Box<dyn Suballocator>, u64)> {
    vec![
        ("heap", Box::new(HeapSuballocator::new(ALIGN)), CHUNK),
        ("binned", Box::new(BinnedSuballocator::new(ALIGN)), CHUNK),
        ("fixed", Box::new(FixedSuballocator::new(64 << 10)), 64 << 10),
        ("ring", Box::new(RingSuballocator::new()), CHUNK),
    ]
}

/// Small deterministic generator so failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Live blocks by address; checks alignment, containment and overlap on every insert.
struct Ledger {
    chunks: Vec<(u64, u64)>,
    live: BTreeMap<u64, Block>,
}

impl Ledger {
    fn insert(&mut self, name: &str, b: Block, asked: u64) {
        assert!(b.size >= asked, "{name}: block {b:?} smaller than the {asked} bytes asked");
        assert_eq!(b.addr % ALIGN, 0, "{name}: block {b:?} misaligned");
        assert!(
            self.chunks.iter().any(|&(base, size)| b.addr >= base && b.addr + b.size <= base + size),
            "{name}: block {b:?} outside every chunk"
        );
        if let Some((_, prev)) = self.live.range(..=b.addr).next_back() {
            assert!(prev.addr + prev.size <= b.addr, "{name}: {b:?} overlaps {prev:?}");
        }
        if let Some((_, next)) = self.live.range(b.addr + 1..).next() {
            assert!(b.addr + b.size <= next.addr, "{name}: {b:?} overlaps {next:?}");
        }
        self.live.insert(b.addr, b);
    }
}

fn random_sizes(rng: &mut Rng, limit: u64) -> u64 {
    // Log-uniform from 1 byte to `limit`.
    let bits = 64 - limit.leading_zeros() as u64;
    let top = 1u64 << rng.below(bits);
    (top + rng.below(top)).clamp(1, limit)
}

#[test]
fn conformance_random_alloc_free() {
    for (name, mut sub, chunk) in all() {
        let limit = sub.max_request().min(1 << 20);
        let mut ledger = Ledger { chunks: Vec::new(), live: BTreeMap::new() };
        for i in 0..8 {
            let base = BASE + i * 2 * CHUNK;
            sub.add_chunk(base, chunk);
            ledger.chunks.push((base, chunk));
        }
        let total_free = sub.free_bytes();
        let mut rng = Rng(0xC0FFEE);
        for _ in 0..20_000 {
            if ledger.live.is_empty() || rng.below(2) == 0 {
                let asked = super::round_up(random_sizes(&mut rng, limit), ALIGN);
                if let Some(b) = sub.alloc(asked) {
                    ledger.insert(name, b, asked);
                }
            } else if name == "ring" {
                let (&addr, _) = ledger.live.iter().next().expect("non-empty");
                let b = ledger.live.remove(&addr).expect("present");
                sub.free(b);
            } else {
                let k = rng.below(ledger.live.len() as u64) as usize;
                let addr = *ledger.live.keys().nth(k).expect("in range");
                let b = ledger.live.remove(&addr).expect("present");
                sub.free(b);
            }
        }
        for (_, b) in std::mem::take(&mut ledger.live) {
            sub.free(b);
        }
        assert_eq!(sub.free_bytes(), total_free, "{name}: free bytes not restored");
        let removed = sub.remove_free_chunks(u64::MAX);
        assert_eq!(removed.len(), 8, "{name}: every chunk should be whole again");
        assert_eq!(sub.free_bytes(), 0, "{name}");
        assert_eq!(sub.alloc(ALIGN), None, "{name}: allocated from removed chunks");
    }
}

#[test]
fn conformance_exhaustion_and_reuse() {
    for (name, mut sub, chunk) in all() {
        sub.add_chunk(BASE, chunk);
        let size = sub.max_request().min(64 << 10);
        let mut blocks = Vec::new();
        while let Some(b) = sub.alloc(size) {
            blocks.push(b);
            assert!(blocks.len() <= (chunk / size) as usize, "{name}: more blocks than fit");
        }
        assert!(!blocks.is_empty(), "{name}");
        assert_eq!(sub.largest_free() >= size, false, "{name}: claims room after exhaustion");
        let first = blocks.remove(0);
        sub.free(first);
        assert_eq!(sub.alloc(size).map(|b| b.addr), Some(first.addr), "{name}: freed block not reused");
    }
}

#[test]
fn heap_coalesces_neighbours_into_one_block() {
    let mut heap = HeapSuballocator::new(ALIGN);
    heap.add_chunk(BASE, CHUNK);
    let a = heap.alloc(CHUNK / 4).unwrap();
    let b = heap.alloc(CHUNK / 4).unwrap();
    let c = heap.alloc(CHUNK / 4).unwrap();
    assert!(!heap.free(a));
    assert!(!heap.free(c));
    assert_eq!(heap.largest_free(), CHUNK / 2, "c merges with the tail");
    assert!(heap.free(b), "freeing the middle block makes the chunk whole");
    assert_eq!(heap.largest_free(), CHUNK);
    assert_eq!(heap.alloc(CHUNK).map(|x| x.addr), Some(BASE));
}

#[test]
fn heap_prefers_the_tightest_fit() {
    let mut heap = HeapSuballocator::new(ALIGN);
    heap.add_chunk(BASE, CHUNK);
    // Holes of 40 KiB and 33 KiB separated by live blocks; 33 KiB must go to the 33 KiB hole.
    let h1 = heap.alloc(40 << 10).unwrap();
    let _s1 = heap.alloc(ALIGN).unwrap();
    let h2 = heap.alloc(33 << 10).unwrap();
    let _s2 = heap.alloc(ALIGN).unwrap();
    heap.free(h1);
    heap.free(h2);
    assert_eq!(heap.alloc(33 << 10).unwrap().addr, h2.addr);
}

#[test]
fn fixed_refuses_larger_requests() {
    let mut fixed = FixedSuballocator::new(4096);
    fixed.add_chunk(BASE, 1 << 20);
    assert_eq!(fixed.max_request(), 4096);
    assert!(fixed.alloc(4097).is_none());
    assert_eq!(fixed.alloc(1).unwrap().size, 4096);
}

#[test]
fn binned_returns_empty_slabs_to_the_heap() {
    let mut binned = BinnedSuballocator::new(ALIGN);
    binned.add_chunk(BASE, CHUNK);
    let small: Vec<Block> = (0..2000).map(|_| binned.alloc(1024).unwrap()).collect();
    assert!(binned.largest_free() < CHUNK);
    for b in small {
        binned.free(b);
    }
    assert_eq!(binned.remove_free_chunks(u64::MAX), vec![(BASE, CHUNK)]);
}

#[test]
fn ring_reclaims_in_order_and_wraps() {
    let mut ring = RingSuballocator::new();
    ring.add_chunk(BASE, 4 * 1024);
    let a = ring.alloc(1024).unwrap();
    let b = ring.alloc(1024).unwrap();
    let c = ring.alloc(1024).unwrap();
    let d = ring.alloc(1024).unwrap();
    assert!(ring.alloc(1024).is_none(), "ring is full");
    ring.free(b);
    assert!(ring.alloc(1024).is_none(), "b's space waits for a, which is older");
    ring.free(a);
    let e = ring.alloc(2048).unwrap();
    assert_eq!(e.addr, BASE, "wraps to the start once a and b are free");
    ring.free(c);
    ring.free(d);
    assert!(ring.free(e), "last free empties the ring");
}

/// Owners' blocks as a pool's caller keeps them, moved by `make_room` through `Relocator`.
struct Owners {
    blocks: BTreeMap<Owner, Block>,
    pinned: std::collections::BTreeSet<Owner>,
    /// Every k-th relocation fails (0: none), as a failing copy would.
    fail_every: u64,
    relocations: u64,
}

impl Relocator for Owners {
    fn movable(&mut self, owner: Owner) -> bool {
        !self.pinned.contains(&owner)
    }
    fn relocate(&mut self, r: &Relocation) -> crate::error::Result<()> {
        self.relocations += 1;
        if self.fail_every != 0 && self.relocations % self.fail_every == 0 {
            crate::fail!(KMM_ERROR_BACKEND, "injected copy failure");
        }
        assert!(!self.pinned.contains(&r.owner), "pinned owner {} moved", r.owner);
        let held = self.blocks.get_mut(&r.owner).expect("relocated block has a live owner");
        assert_eq!(*held, r.from, "relocated from where the owner's block is");
        assert!(r.to.size >= r.from.size);
        *held = r.to;
        Ok(())
    }
}

/// Random allocations and frees where every failed allocation asks `make_room`: blocks stay
/// inside their chunks and apart, pinned owners never move, failed moves leave every block where
/// it was, and after everything is freed the chunks are whole.
#[test]
fn make_room_relocates_movable_blocks_only() {
    for (name, fail_every) in [("heap", 0u64), ("heap", 3), ("binned", 0), ("binned", 5)] {
        let mut sub: Box<dyn Suballocator> =
            if name == "heap" { Box::new(HeapSuballocator::new(ALIGN)) } else { Box::new(BinnedSuballocator::new(ALIGN)) };
        assert!(sub.relocates());
        let chunks: Vec<(u64, u64)> = (0..4).map(|i| (BASE + i * 2 * CHUNK, CHUNK)).collect();
        for &(base, size) in &chunks {
            sub.add_chunk(base, size);
        }
        let total_free = sub.free_bytes();
        let mut owners = Owners { blocks: BTreeMap::new(), pinned: Default::default(), fail_every, relocations: 0 };
        let mut rng = Rng(0xFEED ^ fail_every);
        let (mut next, mut made) = (0 as Owner, 0);
        for _ in 0..20_000 {
            if owners.blocks.is_empty() || rng.below(2) == 0 {
                let asked = super::round_up(random_sizes(&mut rng, 1 << 20), ALIGN);
                let block = match sub.alloc_movable(asked, next) {
                    Some(b) => Some(b),
                    None => sub.make_room(asked, next, &mut owners).inspect(|_| made += 1),
                };
                if let Some(b) = block {
                    owners.blocks.insert(next, b);
                    if rng.below(8) == 0 {
                        owners.pinned.insert(next);
                    }
                    next += 1;
                }
            } else {
                let k = rng.below(owners.blocks.len() as u64) as usize;
                let owner = *owners.blocks.keys().nth(k).expect("in range");
                sub.free(owners.blocks.remove(&owner).expect("present"));
                owners.pinned.remove(&owner);
            }
            let mut ledger = Ledger { chunks: chunks.clone(), live: BTreeMap::new() };
            for b in owners.blocks.values() {
                ledger.insert(name, *b, b.size);
            }
        }
        assert!(made >= 10, "{name}: only {made} allocations needed room made");
        assert!(owners.relocations > made, "{name}: room was made without moving blocks");
        for (_, b) in std::mem::take(&mut owners.blocks) {
            sub.free(b);
        }
        assert_eq!(sub.free_bytes(), total_free, "{name}: free bytes not restored");
        assert_eq!(sub.remove_free_chunks(u64::MAX).len(), 4, "{name}: every chunk should be whole again");
    }
}

#[test]
fn make_room_moves_the_cheapest_blocks_and_skips_pinned_ones() {
    let mib = CHUNK / 4;
    let mut heap = HeapSuballocator::new(ALIGN);
    let mut owners = Owners { blocks: BTreeMap::new(), pinned: Default::default(), fail_every: 0, relocations: 0 };
    // Chunk 1: pinned 2 MiB | 0.5 free | block 2 (1/8) | 1.375 free. Chunk 2: 3.5 MiB | 0.5 free.
    heap.add_chunk(BASE, CHUNK);
    for (owner, size) in [(0, 2 * mib), (1, mib / 2), (2, mib / 8), (3, CHUNK - 2 * mib - mib / 2 - mib / 8)] {
        owners.blocks.insert(owner, heap.alloc_movable(size, owner).unwrap());
    }
    heap.add_chunk(BASE + 2 * CHUNK, CHUNK);
    owners.blocks.insert(4, heap.alloc_movable(3 * mib + mib / 2, 4).unwrap());
    owners.pinned.insert(0);
    heap.free(owners.blocks.remove(&1).unwrap());
    heap.free(owners.blocks.remove(&3).unwrap());
    assert_eq!(heap.largest_free(), CHUNK - 2 * mib - mib / 2 - mib / 8);

    // 2.5 MiB: chunk 1 has 2 MiB beside the pinned block; in chunk 2, block 4 finds no place.
    assert!(heap.alloc_movable(2 * mib + mib / 2, 9).is_none());
    assert!(heap.make_room(2 * mib + mib / 2, 9, &mut owners).is_none());
    assert_eq!(owners.relocations, 0);

    // 1.75 MiB: block 2 is the cheapest to move, into chunk 2's tail.
    let placed = heap.make_room(mib + 3 * mib / 4, 9, &mut owners).expect("room around block 2");
    assert_eq!(owners.relocations, 1, "only block 2 moved");
    assert_eq!(placed.addr, BASE + 2 * mib, "the room is where block 2 was");
    assert_eq!(owners.blocks[&2].addr, BASE + 2 * CHUNK + 3 * mib + mib / 2, "block 2 went to chunk 2");
    assert_eq!(owners.blocks[&0].addr, BASE, "the pinned block stayed");
}
