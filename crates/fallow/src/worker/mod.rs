//! Background-thread plumbing shared by the reporting worker (`report.rs`) and the zeroing worker
//! (`zero.rs`): start a thread that keeps to idle CPU time (`IdleGate`), let it sleep and be woken
//! without a heap allocation, stop it, and restart it in a `fork` child.
//!
//! Design. Each worker has one futex word, `Worker::word`, in one of these states:
//!
//! ```text
//!   ABSENT --claim_start, start--> RUNNING --nap(t)--> NAPPING --timeout/kick--> RUNNING
//!                        |                                            ^
//!                        +--idle()--> IDLE --wake_idle/kick-----------+
//!   (fork child: any --> ABSENT; the next free that finds work, or start_workers, restarts it)
//! ```
//!
//! Invariants:
//! - The allocation and free paths never make a system call for a worker unless the free just
//!   created work for it and the worker is `IDLE` (asleep with nothing to do: a futex wake) or,
//!   in a `fork` child whose parent ran it, `ABSENT` (a thread start): otherwise a free costs
//!   one relaxed load of each worker's `word`.
//! - No lost wake-up: a worker going idle stores `IDLE` *before* it checks for work under the
//!   allocator lock; a free creates work under that lock and reads `word` after it, so either the
//!   worker sees the work or the free sees `IDLE` and wakes it (futex semantics do the rest).
//! - A worker holds an `Arc<Shared>` (not an `Allocator` handle): the last `Allocator` handle
//!   stops and joins the workers, then the `Arc`s go away.
//! - Starting a thread uses `pthread_create` directly (`os::spawn_thread`): no Rust heap
//!   allocation (the preload library's `malloc` may be the one that ends up here).

pub(crate) mod exit_watch;

use crate::os::{self, BackgroundPolicy};
// `core`'s atomics and `os`'s futex; loom's under the `loom` feature (`tests/loom/` model-checks the
// word protocol below with this very code).
use crate::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};
use crate::sync::{futex_wait, futex_wake_all};

/// No thread (never started, disabled at start, or a `fork` child).
pub const ABSENT: u32 = 4;
/// Working, or about to sleep.
pub const RUNNING: u32 = 0;
/// Asleep with nothing to do: a free that creates work wakes it.
pub const IDLE: u32 = 1;
/// Asleep for a set time (waiting for blocks to age, or for demand): only `kick` wakes it early.
pub const NAPPING: u32 = 2;
/// Woken: the next sleep returns at once.
pub const KICKED: u32 = 3;

/// Longest nap of a worker's thread before it sets itself up (`Worker::start_after_nap`): 20 ms, the
/// default `zero_delay`. The set-up (its name, its scheduling policy, the CPU load's and the
/// cgroup's files, the reporter's probe of `MADV_DONTNEED`, memory limit and pressure file) is
/// about 50 system calls a worker: with small objects on, the allocator is made at a program's
/// first `malloc`, and that set-up was a sixth of the CPU time of a shell's `ls` (0.41 of 2.47
/// ms, docs/measurements.md).
pub const START_NAP_NS: u64 = 20_000_000;

pub struct Worker {
    pub word: AtomicU32,
    stop: AtomicBool,
    /// `pthread_t` of the thread, 0 when none.
    thread: AtomicUsize,
    /// The process that started the thread (a `fork` child has none of its parent's threads).
    pid: AtomicI32,
    /// Set in a `fork` child whose parent ran this worker: restart it when work appears.
    pub restart_wanted: AtomicBool,
    pub name: &'static [u8],
    /// Times the thread set itself up (`on_thread_start`), for the tests.
    #[cfg(test)]
    pub(crate) setups: core::sync::atomic::AtomicU32,
}

pub type Entry = os::ThreadEntry;

impl Worker {
    /// (Not a `const fn`: loom's atomics have no const constructor.)
    pub fn new(name: &'static [u8]) -> Worker {
        Worker {
            word: AtomicU32::new(ABSENT),
            stop: AtomicBool::new(false),
            thread: AtomicUsize::new(0),
            pid: AtomicI32::new(0),
            restart_wanted: AtomicBool::new(false),
            name,
            #[cfg(test)]
            setups: core::sync::atomic::AtomicU32::new(0),
        }
    }

    pub fn running(&self) -> bool {
        self.thread.load(Ordering::Acquire) != 0 && self.pid.load(Ordering::Relaxed) == os::getpid()
    }

    /// Start the thread running `entry(arg)`. `Err(errno)` when `pthread_create` refuses; the
    /// caller then still owns `arg`. Called with no allocator lock held, by one thread at a time
    /// (the caller serialises through `claim_start`).
    pub(crate) fn start(&self, entry: Entry, arg: *mut core::ffi::c_void) -> Result<(), i32> {
        self.stop.store(false, Ordering::Relaxed);
        self.word.store(RUNNING, Ordering::SeqCst);
        // (`entry` takes ownership of `arg` only if the thread is created.)
        let tid = match os::spawn_thread(entry, arg) {
            Ok(tid) => tid,
            Err(e) => {
                self.word.store(ABSENT, Ordering::SeqCst);
                return Err(e);
            }
        };
        self.pid.store(os::getpid(), Ordering::Relaxed);
        self.thread.store(tid, Ordering::Release);
        Ok(())
    }

    /// Whether this caller won the right to start the worker (`ABSENT` -> `RUNNING` claimed by
    /// swapping in `KICKED`, so that two frees cannot both start it).
    pub fn claim_start(&self) -> bool {
        self.word.compare_exchange(ABSENT, KICKED, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// Give the claim back (start refused or not wanted).
    pub fn release_claim(&self) {
        self.word.store(ABSENT, Ordering::SeqCst);
    }

    /// Called by the thread itself first: sleep `min(delay_ms, START_NAP_NS)`, `delay_ms` being
    /// how long the worker's work waits anyway (a block is zeroed once it stayed free
    /// `zero_delay`, reported once it stayed free `report_delay`), then set the thread up
    /// (`on_thread_start`; the reporter then sets up its limit and pressure watch). A kick
    /// (settings changed, stop) ends the nap early. So a process that lives a few milliseconds
    /// never pays for the workers' set-up. `None`: asked to stop meanwhile, the thread sets
    /// nothing up and ends.
    pub fn start_after_nap(&self, delay_ms: u32) -> Option<IdleGate> {
        let ns = (delay_ms as u64 * 1_000_000).min(START_NAP_NS);
        if ns > 0 {
            self.nap_unless_kicked(ns);
        }
        (!self.stopping()).then(|| self.on_thread_start())
    }

    /// Name the calling thread and schedule it as a background thread (see `IdleGate` for how
    /// it keeps to idle CPU time).
    fn on_thread_start(&self) -> IdleGate {
        #[cfg(test)]
        self.setups.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        os::set_thread_name(self.name);
        let load = os::CpuLoad::open();
        let wanted = if load.is_some() { BackgroundPolicy::Batch } else { BackgroundPolicy::Idle };
        let policy = os::set_background_priority(wanted);
        IdleGate { load: load.filter(|_| policy == BackgroundPolicy::Batch), backoff_ns: IdleGate::MIN_BACKOFF_NS }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Wake the worker whatever it is doing (tunables changed, stop).
    pub fn kick(&self) {
        let mut old = self.word.load(Ordering::SeqCst);
        loop {
            if old == ABSENT {
                return;
            }
            match self.word.compare_exchange(old, KICKED, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        if old == IDLE || old == NAPPING {
            futex_wake_all(&self.word);
        }
    }

    /// Wake the worker if it sleeps idle (the free path; the caller has seen `IDLE`).
    pub fn wake_idle(&self) {
        if self.word.compare_exchange(IDLE, KICKED, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
            futex_wake_all(&self.word);
        }
    }

    /// Sleep for `ns` unless kicked meanwhile.
    pub fn nap(&self, ns: u64) {
        self.nap_unless_kicked(ns);
    }

    /// `nap`, telling whether it ended by a kick (tunables changed, stop) rather than the time.
    pub fn nap_unless_kicked(&self, ns: u64) -> bool {
        // A stop whose kick an earlier nap consumed: as in `idle`, the flag is read after
        // announcing `NAPPING`, so either it is seen here or the kick finds `NAPPING` and wakes
        // us. (Without it a worker could nap through a stop for the whole of a long nap.)
        let announced = self.word.compare_exchange(RUNNING, NAPPING, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        if announced && !self.stopping() {
            self.sleep(NAPPING, ns);
        }
        // One swap: a kick that lands after the wait is seen here, never overwritten.
        self.word.swap(RUNNING, Ordering::SeqCst) == KICKED
    }

    /// Sleep until woken or `timeout_ns` has passed, unless `has_work` (checked after announcing
    /// `IDLE`) says otherwise.
    pub fn idle(&self, timeout_ns: u64, has_work: impl FnOnce() -> bool) {
        // (On a failed exchange the word was KICKED: do not sleep.)
        let announced = self.word.compare_exchange(RUNNING, IDLE, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        // A stop whose kick an earlier nap consumed: `request_stop` sets the flag before it
        // kicks, so either the flag is seen here or the kick finds `IDLE` and wakes us.
        if announced && !self.stopping() && !has_work() {
            self.sleep(IDLE, timeout_ns);
        }
        self.word.store(RUNNING, Ordering::SeqCst);
    }

    /// Sleep while the word holds `expected` (a kick or a wake changes it), for at most `ns`.
    /// While the exit watch looks (exit_watch.rs), the same sleep in slices, each followed by
    /// a look: once no thread of the program is left, this worker stops as if asked to, lest
    /// it keep the process alive.
    fn sleep(&self, expected: u32, ns: u64) {
        if exit_watch::looking() {
            self.sleep_looking(expected, ns);
        } else {
            futex_wait(&self.word, expected, Some(ns));
        }
    }

    #[cold]
    fn sleep_looking(&self, expected: u32, ns: u64) {
        let deadline = os::now_ns().saturating_add(ns);
        loop {
            let now = os::now_ns();
            if now >= deadline {
                return;
            }
            futex_wait(&self.word, expected, Some((deadline - now).min(exit_watch::slice_ns())));
            if exit_watch::program_gone() {
                // The program's exit handlers may run on this thread (the last to end calls
                // `exit`): at the program's own scheduling, as far as it may go back.
                os::set_normal_priority();
                self.stop.store(true, Ordering::Release);
                return;
            }
            if self.word.load(Ordering::SeqCst) != expected {
                return;
            }
        }
    }

    /// A safety net for `idle`: wake once a minute even if a wake-up were ever missed.
    pub const IDLE_MAX_NS: u64 = 60_000_000_000;

    /// Ask the thread to stop: the flag first, then a kick, so that a worker whose nap consumed
    /// the kick still sees the flag in `idle` (see there).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.kick();
    }

    /// Stop and join the thread (the last allocator handle is going away).
    pub fn stop_and_join(&self) {
        if !self.running() {
            return;
        }
        self.request_stop();
        let tid = self.thread.swap(0, Ordering::AcqRel);
        if tid != 0 {
            // SAFETY: `tid` is a thread this process started (`running` checked the pid) and nobody
            // else joins (the swap above took it).
            unsafe { os::join_thread(tid) };
        }
        self.word.store(ABSENT, Ordering::SeqCst);
    }

    /// In a `fork` child: the thread does not exist here. Forget it; ask for a restart if it ran.
    pub fn forget_after_fork(&self) {
        let ran = self.thread.swap(0, Ordering::AcqRel) != 0;
        self.word.store(ABSENT, Ordering::SeqCst);
        self.stop.store(false, Ordering::Relaxed);
        self.restart_wanted.store(ran, Ordering::Relaxed);
    }
}

/// Keeps a worker to CPU time that nobody else wants.
///
/// A worker runs under `SCHED_BATCH` at the process's own priority, not `SCHED_IDLE`: a
/// `SCHED_IDLE` thread that is starved in the middle of its work (or that ran recently under
/// load) keeps the whole process from finishing its exit until it gets a CPU again, measured at
/// 0.3-2.5 s under two CPU hogs on two cores, against under 5 ms for a `SCHED_BATCH` thread
/// (docs/design.md, "Exit under load"). Instead of the scheduler, the worker itself then keeps
/// off busy CPUs: before each step (one chunk zeroed, one batch reported) it checks that a CPU is
/// idle, and while none is it naps, 10 ms at first, doubling up to 100 ms. What it can take from a
/// busy program is therefore one step's work when the load rises in the middle of a step.
/// Where the load cannot be read, the worker falls back to `SCHED_IDLE`.
pub struct IdleGate {
    load: Option<os::CpuLoad>,
    backoff_ns: u64,
}

impl IdleGate {
    const MIN_BACKOFF_NS: u64 = 10_000_000;
    const MAX_BACKOFF_NS: u64 = 100_000_000;

    /// Return once a CPU is idle (at once under `SCHED_IDLE`, where the scheduler sees to it),
    /// the worker is stopping or kicked, or `max_wait_ns` have passed waiting (the reporter's
    /// bound: memory goes back to the kernel even on a machine that is never idle). Returns how
    /// many naps it took.
    pub fn wait(&mut self, w: &Worker, max_wait_ns: u64) -> u64 {
        let Some(load) = &self.load else { return 0 };
        let mut naps = 0;
        let mut waited = 0u64;
        while !w.stopping() && waited < max_wait_ns && !load.cpu_idle() {
            naps += 1;
            if w.nap_unless_kicked(self.backoff_ns) {
                break;
            }
            waited += self.backoff_ns;
            self.backoff_ns = (self.backoff_ns * 2).min(Self::MAX_BACKOFF_NS);
        }
        if naps == 0 {
            self.backoff_ns = Self::MIN_BACKOFF_NS;
        }
        naps
    }
}
