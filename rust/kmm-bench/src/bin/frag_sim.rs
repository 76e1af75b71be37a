//! What a single contiguous, growable heap would reserve on trace R under different placement
//! policies, to choose the pool's policy and to see what any non-moving allocator can reach:
//! - contiguous: the high-water mark of the highest allocated byte;
//! - paged: the peak number of 1 or 2 MiB pages backing live bytes, when pages whose bytes are all
//!   free can be unmapped and remapped where the heap needs them (virtual memory management,
//!   `cuMemMap`; 2 MiB is the device's granularity), so holes of whole pages cost nothing.
//!
//! Three trace seeds. None reaches 1.10: only moving live blocks (compaction) would.
use std::collections::{BTreeMap, BTreeSet, HashMap};

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

/// Pages backing live bytes; a page that needs backing takes one whose bytes are all free.
struct Pages { size: u64, live: HashMap<u64, u64>, backed: BTreeSet<u64>, count: u64, peak: u64 }
impl Pages {
    fn on_alloc(&mut self, a: u64, s: u64) {
        for p in a / self.size..=(a + s - 1) / self.size {
            let bytes = ((p + 1) * self.size).min(a + s) - (p * self.size).max(a);
            *self.live.entry(p).or_insert(0) += bytes;
            if self.backed.insert(p) {
                let idle = self.backed.iter().copied().find(|q| *q != p && self.live.get(q).copied().unwrap_or(0) == 0);
                match idle { Some(q) => { self.backed.remove(&q); } None => self.count += 1 }
            }
        }
        self.peak = self.peak.max(self.count);
    }
    fn on_free(&mut self, a: u64, s: u64) {
        for p in a / self.size..=(a + s - 1) / self.size {
            let bytes = ((p + 1) * self.size).min(a + s) - (p * self.size).max(a);
            *self.live.get_mut(&p).unwrap() -= bytes;
        }
    }
}

fn main() {
    for seed in [42u64, 7, 99] {
        for (policy, name) in [(0u8, "best fit, lowest address"), (1, "address-ordered first fit")] {
            let mut heap = Heap { by_addr: BTreeMap::new(), by_size: BTreeSet::new(), policy };
            heap.insert(0, 1 << 40);
            let page = |mib: u64| Pages { size: mib << 20, live: HashMap::new(), backed: BTreeSet::new(), count: 0, peak: 0 };
            let mut pages = [page(1), page(2)];
            let mut x: u64 = seed | 1;
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
                    pages.iter_mut().for_each(|p| p.on_alloc(a, rounded));
                    in_use += size;
                    peak_use = peak_use.max(in_use);
                    top = top.max(a + rounded);
                    live.push((a, rounded, size));
                } else {
                    let i = (rnd() % live.len() as u64) as usize;
                    let (a, r, size) = live.swap_remove(i);
                    heap.free(a, r);
                    pages.iter_mut().for_each(|p| p.on_free(a, r));
                    in_use -= size;
                }
            }
            let ratio = |bytes: u64| bytes as f64 / peak_use as f64;
            println!(
                "seed {seed:>2}, {name}: contiguous {:.3}, paged 1 MiB {:.3}, paged 2 MiB {:.3}",
                ratio(top),
                ratio(pages[0].peak * pages[0].size),
                ratio(pages[1].peak * pages[1].size)
            );
        }
    }
}
