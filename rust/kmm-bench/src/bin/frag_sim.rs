//! What a single contiguous, growable heap would reserve on trace R under different placement
//! policies (high-water mark of the highest allocated byte), to choose the pool's policy.
use std::collections::{BTreeMap, BTreeSet};

struct Heap { by_addr: BTreeMap<u64, u64>, by_size: BTreeSet<(u64, u64)>, policy: u8 }
impl Heap {
    fn insert(&mut self, a: u64, s: u64) { self.by_addr.insert(a, s); self.by_size.insert((s, a)); }
    fn remove(&mut self, a: u64, s: u64) { self.by_addr.remove(&a); self.by_size.remove(&(s, a)); }
    fn alloc(&mut self, size: u64) -> u64 {
        let (a, s) = match self.policy {
            0 => { let &(s, a) = self.by_size.range((size, 0)..).next().unwrap(); (a, s) }
            _ => { let (&a, &s) = self.by_addr.iter().find(|(_, &s)| s >= size).unwrap(); (a, s) }
        };
        self.remove(a, s);
        if s > size { self.insert(a + size, s - size); }
        a
    }
    fn free(&mut self, mut a: u64, mut s: u64) {
        if let Some((&na, &ns)) = self.by_addr.range(a + s..).next() { if na == a + s { self.remove(na, ns); s += ns; } }
        if let Some((&pa, &ps)) = self.by_addr.range(..a).next_back() { if pa + ps == a { self.remove(pa, ps); a = pa; s += ps; } }
        self.insert(a, s);
    }
}

fn main() {
    for (policy, name) in [(0u8, "best fit, lowest address"), (1, "address-ordered first fit")] {
        let mut heap = Heap { by_addr: BTreeMap::new(), by_size: BTreeSet::new(), policy };
        heap.insert(0, 1 << 40);
        let mut x: u64 = 42 | 1;
        let mut rnd = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let (lmin, lmax) = ((256f64).ln(), ((4u64 << 20) as f64).ln());
        let mut live = Vec::new();
        let (mut in_use, mut peak_use, mut top) = (0u64, 0u64, 0u64);
        for _ in 0..100_000 {
            let r = rnd();
            if live.is_empty() || (live.len() < 1000 && r & 1 == 0) {
                let u = (rnd() >> 11) as f64 / (1u64 << 53) as f64;
                let size = (lmin + u * (lmax - lmin)).exp() as u64;
                let rounded = size.div_ceil(256) * 256;
                let a = heap.alloc(rounded);
                in_use += size;
                peak_use = peak_use.max(in_use);
                top = top.max(a + rounded);
                live.push((a, rounded, size));
            } else {
                let i = (rnd() % live.len() as u64) as usize;
                let (a, r, size) = live.swap_remove(i);
                heap.free(a, r);
                in_use -= size;
            }
        }
        println!("{name}: peak top {} peak in use {} ratio {:.3}", top, peak_use, top as f64 / peak_use as f64);
    }
}
