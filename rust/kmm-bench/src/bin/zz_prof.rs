use kmm::ffi::buffer::*;
use kmm::ffi::manager::*;
use kmm::ffi::types::*;
use std::time::Instant;
struct Rng(u64);
impl Rng { fn next(&mut self) -> u64 { self.0 ^= self.0 << 13; self.0 ^= self.0 >> 7; self.0 ^= self.0 << 17; self.0 } }
fn main() {
    let (min, max): (f64, f64) = if std::env::args().any(|a| a == "R") { (256.0, 4194304.0) } else { (8.0, 4096.0) };
    let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
    kmm_config_default(&mut c);
    c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
    let mut m = 0; kmm_manager_create(&c, &mut m);
    let mut rng = Rng(43);
    let mut ops = Vec::new(); let mut live = 0usize;
    for _ in 0..100_000 { let a = live == 0 || (live < 1000 && rng.next() & 1 == 0);
        if a { live += 1; let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64; ops.push((true, (min.ln() + u * (max.ln() - min.ln())).exp() as u64)); }
        else { let p = rng.next() % live as u64; live -= 1; ops.push((false, p)); } }
    let mut hs: Vec<u64> = Vec::with_capacity(1024);
    for rep in 0..30 {
        let t = Instant::now();
        for &(a, v) in &ops { if a { let mut b = 0; kmm_buffer_alloc(m, v, 0, &mut b); hs.push(b); } else { let h = hs.swap_remove(v as usize); kmm_buffer_free(m, h, 0); } }
        for h in hs.drain(..) { kmm_buffer_free(m, h, 0); }
        if rep % 10 == 9 { println!("{:.1} ns/op", t.elapsed().as_nanos() as f64 / 1e5); }
    }
}
