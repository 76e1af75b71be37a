//! The manager's bytes in use and their exact peak, as the lanes change them.
//!
//! Every allocation and free changes this figure. A shared atomic counter costs a locked
//! instruction per operation (`lock xadd`), which also waits for the operation's earlier stores
//! (a trace's record among them) to leave the store buffer: on the Xeon hosts of the H100
//! machines that was about 10 ns of an untraced and 15-20 ns of a traced operation (kmm-bench,
//! trace S, alternating builds in one lease). Most managers are used by one thread, so one lane.
//!
//! So the first lane to change the gauge becomes its writer and changes it with plain loads and
//! stores (its updates are serialized by that lane's lock: a lane's state is reached only
//! through it). When another lane first changes it, the gauge turns shared for good and every
//! update becomes a locked one, as before. The switch must not lose an update the writer is
//! making at that moment. The writer marks each update `busy` with plain stores and no fence,
//! and the switching lane pays for the fence instead: it publishes `SWITCHING`, makes every
//! running thread of the process execute a full barrier (`membarrier`, private expedited),
//! waits until the writer is not busy, and publishes `SHARED`. After the barrier, a writer's
//! update either began before it (and `busy` shows it) or reads `SWITCHING` (and waits, then is
//! a locked one). Every other lane that finds the gauge `SWITCHING` waits for `SHARED` too: a
//! locked add made before the writer's plain store would be overwritten by it. This is the
//! asymmetric fence of userspace RCU and of hazard pointers.
//!
//! Where the kernel has no `membarrier` (or refuses its registration) gauges start shared.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// No lane has changed the gauge yet.
const UNCLAIMED: usize = usize::MAX;
/// Several lanes change the gauge: every update is a locked instruction.
const SHARED: usize = usize::MAX - 1;
/// Turning shared: a lane waits for the writer's update in progress to end (see `claim_or_share`).
const SWITCHING: usize = usize::MAX - 2;

/// The figure and its peak, on a cache line (pair: x86 fetches lines in pairs) of their own.
#[derive(Debug, Default)]
#[repr(C, align(128))]
struct Counts {
    current: AtomicU64,
    peak: AtomicU64,
}

/// `writer` is read at every change and, once the gauge is shared, never written again: on the
/// line of the counts that every lane's locked add takes exclusive, each read would be a miss
/// and each change two transfers of that line instead of one.
#[derive(Debug)]
#[repr(C)]
pub struct LaneGauge {
    counts: Counts,
    /// The lane that changes the gauge with plain stores, `UNCLAIMED`, `SWITCHING` or `SHARED`.
    writer: AtomicUsize,
    /// Set by the writer lane for the length of a plain update.
    busy: AtomicBool,
    /// The process that made the gauge (a forked child's writer thread does not exist).
    pid: u32,
}

impl Default for LaneGauge {
    fn default() -> Self {
        let writer = if membarrier::available() { UNCLAIMED } else { SHARED };
        LaneGauge {
            counts: Counts::default(),
            writer: AtomicUsize::new(writer),
            busy: AtomicBool::new(false),
            pid: std::process::id(),
        }
    }
}

impl LaneGauge {
    /// Adds `n` bytes put in use by `lane` (whose lock the caller holds); the figure after it.
    #[inline]
    pub fn add(&self, n: u64, lane: usize) -> u64 {
        let now = self.change(n, false, lane);
        // A load first: the peak seldom moves, and a read keeps the cache line shared.
        if now > self.counts.peak.load(Ordering::Relaxed) {
            self.counts.peak.fetch_max(now, Ordering::AcqRel);
        }
        now
    }

    /// Takes away `n` bytes `lane` (whose lock the caller holds) no longer uses.
    #[inline]
    pub fn sub(&self, n: u64, lane: usize) -> u64 {
        self.change(n, true, lane)
    }

    /// The writer lane's change, with plain loads and stores; the total after it.
    #[inline(always)]
    fn change(&self, n: u64, take: bool, lane: usize) -> u64 {
        if self.writer.load(Ordering::Relaxed) == lane {
            self.busy.store(true, Ordering::Relaxed);
            // Keeps the compiler from moving the check below above the mark (the processor's
            // reordering is what the switching lane's barrier answers).
            compiler_fence(Ordering::SeqCst);
            let sole = self.writer.load(Ordering::Relaxed) == lane;
            if sole {
                let current = self.counts.current.load(Ordering::Relaxed);
                let now = if take { current - n } else { current + n };
                #[cfg(test)]
                tests::mid_update();
                self.counts.current.store(now, Ordering::Release);
                compiler_fence(Ordering::SeqCst);
                self.busy.store(false, Ordering::Release);
                return now;
            }
            self.busy.store(false, Ordering::Release);
        }
        self.change_shared(n, take, lane)
    }

    /// A change by a lane that is not the writer (or no longer is): the first one claims the
    /// gauge or turns it shared; shared, every change is a locked one.
    #[inline(never)]
    fn change_shared(&self, n: u64, take: bool, lane: usize) -> u64 {
        let writer = self.writer.load(Ordering::Acquire);
        if writer != SHARED {
            self.claim_or_share(lane);
            if self.writer.load(Ordering::Relaxed) == lane {
                return self.change(n, take, lane);
            }
        }
        if take {
            self.counts.current.fetch_sub(n, Ordering::AcqRel) - n
        } else {
            self.counts.current.fetch_add(n, Ordering::AcqRel) + n
        }
    }

    /// The first change by a lane that is not the writer: it becomes the writer if there is
    /// none yet; else the gauge turns shared, and this returns only once it is: once the
    /// writer's plain update in progress (if any) has ended. Every lane that arrives meanwhile
    /// waits too (`SWITCHING`): a locked add made before that end would be overwritten by the
    /// writer's plain store.
    #[cold]
    fn claim_or_share(&self, lane: usize) {
        let mut seen = self.writer.load(Ordering::Acquire);
        loop {
            match seen {
                SHARED => return,
                SWITCHING => break,
                _ if seen == lane => return,
                _ => {}
            }
            // Unclaimed: this lane claims it. Another lane's: this lane switches it.
            let next = if seen == UNCLAIMED { lane } else { SWITCHING };
            match self.writer.compare_exchange(seen, next, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) if next == lane => return,
                Ok(_) => {
                    membarrier::all_threads();
                    self.wait_while(|g| g.busy.load(Ordering::Acquire));
                    self.writer.store(SHARED, Ordering::Release);
                    return;
                }
                Err(now) => seen = now,
            }
        }
        self.wait_while(|g| g.writer.load(Ordering::Acquire) == SWITCHING);
    }

    /// Waits while `waiting` holds: a few instructions of the writer, unless it was preempted
    /// there. In a child forked during such an update the writer thread does not exist: the
    /// wait ends there (the child's copy of the parent's managers is not for use; see
    /// docs/reliability.md).
    fn wait_while(&self, waiting: impl Fn(&Self) -> bool) {
        let mut spins = 0u32;
        while waiting(self) {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else if std::process::id() != self.pid {
                return;
            } else {
                std::thread::yield_now();
            }
        }
    }

    pub fn current(&self) -> u64 {
        self.counts.current.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> u64 {
        self.counts.peak.load(Ordering::Acquire)
    }

    /// The peak becomes the figure now. An update between the figure's read and the peak's
    /// store compared itself with the old, higher peak and left it: the figure read again
    /// raises the new one to it, so no update in effect is left above its peak.
    pub fn reset_peak(&self) {
        let now = self.current();
        #[cfg(test)]
        tests::mid_reset();
        self.counts.peak.store(now, Ordering::SeqCst);
        self.counts.peak.fetch_max(self.counts.current.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Whether one lane changes the gauge with plain stores (for tests).
    pub fn has_sole_writer(&self) -> bool {
        self.writer.load(Ordering::Acquire) < SWITCHING
    }
}

/// Linux's `membarrier(2)`: a full memory barrier on every running thread of the process.
mod membarrier {
    use std::sync::OnceLock;

    const CMD_QUERY: libc::c_long = 0;
    const CMD_GLOBAL: libc::c_long = 1;
    const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    #[cfg(target_os = "linux")]
    fn call(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes a command and flags (0) and touches no memory of ours.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) }
    }

    #[cfg(not(target_os = "linux"))]
    fn call(_cmd: libc::c_long) -> libc::c_long {
        -1
    }

    /// Whether the process can make such barriers (registered once, at the first call).
    pub fn available() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| {
            let supported = call(CMD_QUERY);
            supported >= 0 && supported & CMD_PRIVATE_EXPEDITED != 0 && call(CMD_REGISTER_PRIVATE_EXPEDITED) == 0
        })
    }

    /// Every thread of the process that runs now executes a full barrier before this returns.
    /// A process forked after the registration is registered again; failing that, the global
    /// command (slower: it waits for every processor) does the same.
    pub fn all_threads() {
        if call(CMD_PRIVATE_EXPEDITED) == 0 {
            return;
        }
        if call(CMD_REGISTER_PRIVATE_EXPEDITED) == 0 && call(CMD_PRIVATE_EXPEDITED) == 0 {
            return;
        }
        // Gauges are made sole-writer only where the query found the command, and a registered
        // process is not refused it; the global command is the last resort.
        let _ = call(CMD_GLOBAL);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc, Barrier};

    thread_local! {
        /// Runs inside a plain update, between its load and its store (a test's pause).
        static MID_UPDATE: RefCell<Option<Box<dyn FnMut()>>> = RefCell::new(None);
    }

    thread_local! {
        /// Runs inside `reset_peak`, between the figure's read and the peak's store.
        static MID_RESET: RefCell<Option<Box<dyn FnMut()>>> = RefCell::new(None);
    }

    pub(super) fn mid_update() {
        MID_UPDATE.with(|hook| {
            if let Some(f) = hook.borrow_mut().as_mut() {
                f()
            }
        });
    }

    pub(super) fn mid_reset() {
        MID_RESET.with(|hook| {
            if let Some(f) = hook.borrow_mut().as_mut() {
                f()
            }
        });
    }

    /// A reset reads the figure, then an add raises it (comparing itself with the old, higher
    /// peak, so it leaves the peak), then the reset stores what it read: the peak must still
    /// come out at or above the figure.
    #[test]
    fn a_reset_racing_an_add_leaves_no_peak_below_the_figure() {
        let g = Arc::new(LaneGauge::default());
        g.add(100, 0);
        g.sub(100, 0);
        let (paused, wait_paused) = mpsc::channel();
        let (resume, wait_resume) = mpsc::channel::<()>();
        let resetter = {
            let g = g.clone();
            std::thread::spawn(move || {
                MID_RESET.with(|hook| {
                    *hook.borrow_mut() = Some(Box::new(move || {
                        let _ = paused.send(());
                        let _ = wait_resume.recv();
                    }))
                });
                g.reset_peak();
            })
        };
        wait_paused.recv().unwrap();
        g.add(10, 0);
        resume.send(()).unwrap();
        resetter.join().unwrap();
        assert_eq!(g.current(), 10);
        assert!(g.peak() >= 10, "the reset left the peak at {} under the figure 10", g.peak());
    }

    /// The writer is preempted in the middle of an update (here: it sleeps there) while another
    /// lane turns the gauge shared: the switch waits for that update to end.
    #[test]
    fn the_switch_waits_for_an_update_the_writer_was_preempted_in() {
        if !membarrier::available() {
            return; // gauges start shared: no switch to test
        }
        let g = Arc::new(LaneGauge::default());
        let (writer, resume) = writer_paused_mid_update(&g);
        let switcher = {
            let g = g.clone();
            std::thread::spawn(move || g.add(5, 1))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        resume.send(()).unwrap();
        writer.join().unwrap();
        switcher.join().unwrap();
        assert_eq!(g.current(), 7, "the other lane's update was lost under the writer's");
    }

    #[test]
    fn one_lane_writes_alone_and_counts_exactly() {
        let g = LaneGauge::default();
        g.add(100, 3);
        g.add(50, 3);
        g.sub(120, 3);
        assert_eq!((g.current(), g.peak()), (30, 150));
        assert_eq!(g.has_sole_writer(), membarrier::available());
        g.reset_peak();
        assert_eq!(g.peak(), 30);
    }

    /// A thread whose lane 0 becomes `g`'s writer (adding 1), then adds 1 more and stops between
    /// that update's load and its store (as if preempted there) until the sender is sent to.
    fn writer_paused_mid_update(g: &Arc<LaneGauge>) -> (std::thread::JoinHandle<()>, mpsc::Sender<()>) {
        let (paused, wait_paused) = mpsc::channel();
        let (resume, wait_resume) = mpsc::channel::<()>();
        let g = g.clone();
        let writer = std::thread::spawn(move || {
            g.add(1, 0);
            MID_UPDATE.with(|hook| {
                *hook.borrow_mut() = Some(Box::new(move || {
                    let _ = paused.send(());
                    let _ = wait_resume.recv();
                }))
            });
            g.add(1, 0);
        });
        wait_paused.recv().unwrap();
        (writer, resume)
    }

    /// A third lane arrives while the second turns the gauge shared and the writer is paused in
    /// an update: its change must wait for that update too (a locked add made meanwhile would be
    /// overwritten by the writer's plain store). Found by a reviewer.
    #[test]
    fn a_third_lane_during_the_switch_waits_for_the_writers_update() {
        if !membarrier::available() {
            return; // gauges start shared: no switch to test
        }
        let g = Arc::new(LaneGauge::default());
        let (writer, resume) = writer_paused_mid_update(&g);
        let on = |lane: usize, n: u64| {
            let g = g.clone();
            std::thread::spawn(move || {
                g.add(n, lane);
            })
        };
        let switcher = on(1, 5);
        while g.has_sole_writer() {
            std::thread::yield_now();
        }
        let third = on(2, 7);
        std::thread::sleep(std::time::Duration::from_millis(50));
        resume.send(()).unwrap();
        for t in [writer, switcher, third] {
            t.join().unwrap();
        }
        assert_eq!(g.current(), 1 + 1 + 5 + 7, "the third lane's add was lost under the writer's plain store");
    }

    /// A child forked while the writer thread was in an update: that thread does not exist in
    /// the child, so a switch there must not wait for it forever. Found by a reviewer.
    #[test]
    fn a_switch_in_a_child_forked_during_an_update_ends() {
        if !membarrier::available() {
            return;
        }
        let g = Arc::new(LaneGauge::default());
        let (writer, resume) = writer_paused_mid_update(&g);
        // SAFETY: the child only changes the gauge (no allocation, no lock) and exits at once;
        // an alarm ends it if the change hangs.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                libc::alarm(3);
                g.add(5, 1);
                libc::_exit(if g.current() == 6 { 0 } else { 1 });
            }
        }
        let mut status = 0;
        unsafe { libc::waitpid(pid, &mut status, 0) };
        resume.send(()).unwrap();
        writer.join().unwrap();
        assert!(!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGALRM), "the child's switch waited until SIGALRM (3 s)");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child's gauge was wrong (status {status})");
    }

    /// A second lane turns the gauge shared while the writer lane is changing it as fast as it
    /// can: no update of either may be lost, in any of many rounds (each a fresh gauge, so each
    /// has its switch).
    #[test]
    fn the_switch_to_shared_loses_no_update_of_the_writer() {
        let mut cold = vec![0u64; 1 << 22];
        for round in 0..10000u64 {
            let g = Arc::new(LaneGauge::default());
            let start = Arc::new(Barrier::new(2));
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let (g, start, stop) = (g.clone(), start.clone(), stop.clone());
                let mut cold = std::mem::take(&mut cold);
                std::thread::spawn(move || {
                    g.add(1, 0); // lane 0 becomes the writer
                    start.wait();
                    let mut net = 1u64;
                    // A store that misses the cache before each change holds the change's mark
                    // in the store buffer, behind it, while the change's loads run ahead: the
                    // reordering the switch's barrier must answer, made frequent.
                    let mut at = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        at = (at + 4099 * 8) & ((1 << 22) - 1);
                        // SAFETY: `at` is below the vector's length.
                        unsafe { std::ptr::write_volatile(cold.as_mut_ptr().add(at), net) };
                        g.add(3, 0);
                        g.sub(1, 0);
                        net += 2;
                    }
                    (net, cold)
                })
            };
            start.wait();
            for _ in 0..(round % 50) {
                std::hint::spin_loop();
            }
            let mut other = 0u64;
            for _ in 0..1000 {
                g.add(5, 1);
                other += 5;
            }
            stop.store(true, Ordering::Relaxed);
            let net;
            (net, cold) = writer.join().unwrap();
            assert!(!g.has_sole_writer());
            assert_eq!(g.current(), net + other, "round {round}: an update was lost at the switch");
            assert!(g.peak() >= g.current());
        }
    }
}
