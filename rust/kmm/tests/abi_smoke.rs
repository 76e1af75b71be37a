mod common;
use common::*;

#[test]
fn round_trip_small_and_staged() {
    let m = Mgr::new();
    for &len in &[1usize, 255, 4097, 300_000, 20 << 20] {
        let b = m.alloc(len as u64, DEVICE);
        let data = pattern(len, len as u64);
        m.upload(b, 0, &data);
        assert_eq!(m.download(b, 0, len), data, "len {len}");
        m.free(b);
    }
    let s = m.stats(DEVICE);
    assert_eq!((s.in_use, s.live_buffers), (0, 0));
}
