//! The Rust API without the C ABI's registry: a manager made with `Manager::new` keeps its lanes
//! in cells of its own.

use super::cells::thread_lane;
use super::handles::lane_of;
use super::{Config, FreeMode, Manager, MemoryKind};
use crate::backend::BackendChoice;
use std::sync::Arc;

const CHUNK: u64 = 2 << 20;

fn host_config() -> Config {
    Config { backend: BackendChoice::Host, chunk_size: CHUNK, compaction_ratio_pct: 0, ..Config::default() }
}

#[test]
fn a_manager_of_its_own_allocates_frees_and_drops_without_the_registry() {
    let a = Manager::new(host_config()).expect("manager a");
    let b = Manager::new(host_config()).expect("manager b");
    assert!(!Arc::ptr_eq(&a.cells, &b.cells), "each manager has cells of its own");
    let cells = a.cells.clone();
    // Held by the manager and by its queues of upstream frees, whose flag the cells keep (a
    // cycle through the lanes' states, which teardown breaks: checked after the drop below).
    assert!(Arc::strong_count(&cells) > 1);

    // Both managers live at once, each with its own buffers and handles.
    let x = a.alloc(1000, MemoryKind::Device).expect("alloc in a");
    let p = a.alloc(64, MemoryKind::Pinned).expect("pinned alloc in a");
    let y = b.alloc(3000, MemoryKind::Device).expect("alloc in b");
    assert_eq!((a.live_buffers(), b.live_buffers()), (2, 1));
    assert_eq!(a.stats(MemoryKind::Device).usage.in_use, 1000);
    assert_eq!(b.stats(MemoryKind::Device).usage.in_use, 3000);
    assert!(a.buffer_info(y).is_err(), "b's buffer is not a's");
    assert!(b.free(x, FreeMode::Checked).is_err(), "a's buffer is not b's");
    let addr = a.map(x).expect("map");
    assert_ne!(addr, 0);
    assert!(a.free(x, FreeMode::Checked).is_err(), "a mapped buffer is not freed unforced");
    a.unmap(x).expect("unmap");
    a.free(x, FreeMode::Checked).expect("free x");
    a.free(p, FreeMode::Checked).expect("free p");
    assert!(a.free(x, FreeMode::Checked).is_err(), "a freed handle is dead");
    assert_eq!((a.live_buffers(), a.stats(MemoryKind::Device).usage.in_use), (0, 0));

    // Teardown takes the states out, and nothing else held the cells.
    a.alloc(500, MemoryKind::Device).expect("a buffer left live for teardown to free");
    drop(a);
    assert!(cells.is_vacant(), "teardown took every lane's state out");
    assert_eq!(Arc::strong_count(&cells), 1);

    // The other manager is untouched.
    assert_eq!(b.buffer_info(y).expect("y lives").1, 3000);
    b.free(y, FreeMode::Checked).expect("free y");
    drop(b);
}

#[test]
fn a_lane_of_a_manager_of_its_own_takes_another_lanes_spare_chunk() {
    // The sibling lanes are reached through the manager's own cells (`Place::cells`).
    let m = Manager::new(host_config()).expect("manager");
    m.free(m.alloc(CHUNK / 2, MemoryKind::Device).expect("first lane's buffer"), FreeMode::Checked).expect("free");
    let mine = thread_lane();
    let (buffer, lane) = std::thread::scope(|s| {
        // Threads are dealt lanes in turn: a few new ones make sure one differs from this one.
        (0..32)
            .find_map(|_| s.spawn(|| (thread_lane() != mine).then(|| (m.alloc(CHUNK / 4, MemoryKind::Device), thread_lane()))).join().expect("thread"))
            .expect("a thread with another lane")
    });
    let buffer = buffer.expect("alloc on another lane");
    assert_eq!(lane_of(buffer), lane, "allocated in the other thread's lane");
    let s = m.stats(MemoryKind::Device);
    assert_eq!((s.resource.reserved, s.resource.upstream_allocs), (CHUNK, 1), "the first lane's free chunk moved instead of a new one");
    m.free(buffer, FreeMode::Checked).expect("free");
}

/// The out-of-memory rung that tries the other lanes with their locks taken (`alloc_after_release`):
/// a lane at the hard limit whose look at the other lanes' free blocks found them busy (`borrow`
/// only tries their locks) is still served by a lane with room once that lane is free again. The
/// C-ABI test of the same rung no longer reaches it: borrowing serves that case first.
#[test]
fn a_lane_at_the_limit_that_found_the_others_busy_is_served_by_them() {
    let config = Config { hard_limit: CHUNK, ..host_config() };
    let m = Manager::new(config).expect("manager");
    let kept = m.alloc(CHUNK / 2, MemoryKind::Device).expect("half of the one chunk");
    let mine = thread_lane();
    let m = &m;
    let served = std::thread::scope(|s| {
        let busy = m.cells.lane(mine).lock(); // as another call of that lane would hold it
        // Threads are dealt lanes in turn: among a few new ones, one has another lane.
        for _ in 0..32 {
            let (tx, rx) = std::sync::mpsc::channel();
            let other = s.spawn(move || {
                let lane = thread_lane();
                tx.send(lane).expect("send");
                (lane != mine).then(|| m.alloc(CHUNK / 4, MemoryKind::Device))
            });
            if rx.recv().expect("lane") == mine {
                other.join().expect("thread");
                continue;
            }
            std::thread::sleep(std::time::Duration::from_millis(100)); // it meets the lock
            drop(busy);
            return other.join().expect("thread").expect("another lane");
        }
        panic!("no thread with another lane among 32");
    });
    let served = served.expect("served by the lane with room once its lock was free");
    assert_eq!(lane_of(served), lane_of(kept), "served by the lane that had room");
    m.free(served, FreeMode::Checked).expect("free");
    m.free(kept, FreeMode::Checked).expect("free");
}
