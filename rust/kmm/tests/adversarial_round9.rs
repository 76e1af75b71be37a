//! Adversarial tests (ninth run, C ABI): each test here fails on the code it was written against
//! (beefa93) because of a confirmed, deterministic defect.
mod common;
use common::*;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

fn spilled(m: &Mgr, b: KmmBuffer) -> u32 {
    m.info(b).spilled
}

/// hard_limit 2 MiB, spill_limit 1 MiB in `mode`: a, b (1 MiB each), s1, s2 (64 KiB each)
/// written with their patterns, then b and a read: a and b on the device, s1 and s2 spilled.
fn host_near_its_limit(mode: KmmAllocMode, seed: u64) -> (Mgr, Vec<(KmmBuffer, Vec<u8>)>) {
    let m = Mgr::with(|c| {
        c.alloc_mode = mode as u32;
        c.chunk_size = MIB;
        c.hard_limit = 2 * MIB;
        c.spill_limit = MIB;
    });
    let bufs: Vec<(KmmBuffer, Vec<u8>)> = [MIB, MIB, 64 * KIB, 64 * KIB]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let b = m.alloc(n, DEVICE);
            let d = pattern(n as usize, seed + i as u64);
            m.upload(b, 0, &d);
            (b, d)
        })
        .collect();
    // Use b, then a: a's restore spills the least recently used small buffers.
    assert_eq!(m.download(bufs[1].0, 0, 16), bufs[1].1[..16]);
    assert_eq!(m.download(bufs[0].0, 0, 16), bufs[0].1[..16]);
    (m, bufs)
}

/// docs/spill.md: "The user sees time, not an out-of-memory error, while the live buffers fit the
/// device plus the limit" and "Out of memory comes when the device plus the limit cannot hold the
/// live buffers, or what is left on the device is mapped or marked never to spill".
///
/// hard_limit 2 MiB, spill_limit 1 MiB; live: a, b (1 MiB each), s1, s2 (64 KiB each), nothing
/// mapped, nothing never-spill: 2.125 MiB live against 3 MiB, and a placement exists (device: a,
/// s1, s2 = 1.125 MiB; host: b = 1 MiB). After the reads below leave a and b on the device and
/// s1, s2 on the host, a read of s1 fails with KMM_ERROR_OUT_OF_MEMORY: restoring s1 (64 KiB)
/// must spill a 1 MiB buffer, and s2 (still on the host) plus that 1 MiB passes the spill limit by
/// more than the restored buffer's own bytes, so the restore gives up. The data is still there
/// (on the host) but no copy, map or fill of s1 can reach it while the device holds a and b.
/// Pool and direct modes alike.
#[test]
fn a_small_spilled_buffer_can_be_read_back_while_the_live_set_fits_device_plus_limit() {
    for (mode, name) in [(KmmAllocMode::KMM_ALLOC_POOL, "pool"), (KmmAllocMode::KMM_ALLOC_DIRECT, "direct")] {
        let (m, bufs) = host_near_its_limit(mode, 90);
        let (a, b, s1, s2) = (bufs[0].0, bufs[1].0, bufs[2].0, bufs[3].0);
        let where_ = |m: &Mgr| [a, b, s1, s2].map(|x| spilled(m, x));
        let before = where_(&m);
        let live: u64 = bufs.iter().map(|x| x.1.len() as u64).sum();
        assert!(live <= 2 * MIB + MIB, "the live set ({live} bytes) fits the device plus the spill limit");
        let mut out = vec![0u8; (64 * KIB) as usize];
        let st = kmm_copy_to_host(m.0, out.as_mut_ptr().cast(), s1, 0, 64 * KIB);
        assert_eq!(
            st,
            KMM_OK,
            "{name} mode: spilled (a, b, s1, s2) = {before:?}; reading the 64 KiB spilled buffer s1 with 2.125 MiB live \
             under hard_limit 2 MiB + spill_limit 1 MiB (all unmapped, none never-spill) failed: {}",
            last_error()
        );
        assert_eq!(out, bufs[2].1, "{name} mode: s1's bytes");
        // The swap took the host past its limit for a moment; other spilled buffers came back
        // into the victim's room until the host is within its limit again.
        let s = m.stats(DEVICE);
        assert!(s.spilled_bytes <= MIB, "{name} mode: {} bytes stay spilled, past the 1 MiB spill limit: {s:?}", s.spilled_bytes);
        assert_eq!(s.in_use + s.spilled_bytes, live, "{name} mode: every live byte is on the device or the host: {s:?}");
        for (x, d) in &bufs {
            assert_eq!(&m.download(*x, 0, d.len()), d, "{name} mode: buffer {x:#x}'s bytes");
        }
    }
}

/// The same swap for an allocation (found with the restore above): with a and b on the device
/// and the small buffers on the host near the spill limit, a new 64 KiB buffer must spill a
/// 1 MiB one, which the limit alone cannot take: the allocation failed while the live set
/// (2.1875 MiB) fits the device plus the limit (3 MiB).
#[test]
fn a_small_allocation_spills_a_large_buffer_while_the_live_set_fits_device_plus_limit() {
    let (m, bufs) = host_near_its_limit(KmmAllocMode::KMM_ALLOC_POOL, 70);
    let mut c = 0;
    let st = kmm_buffer_alloc(m.0, 64 * KIB, DEVICE, &mut c);
    assert_eq!(st, KMM_OK, "a 64 KiB allocation with 2.125 MiB live under 2 MiB + 1 MiB failed: {}", last_error());
    let s = m.stats(DEVICE);
    assert!(s.spilled_bytes <= MIB, "{} bytes stay spilled, past the 1 MiB spill limit: {s:?}", s.spilled_bytes);
    for (x, d) in &bufs {
        assert_eq!(&m.download(*x, 0, d.len()), d, "buffer {x:#x}'s bytes");
    }
    ok(kmm_buffer_free(m.0, c, 0));
}
