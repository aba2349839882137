//! `StartGate`: the once-only creation of a process-wide allocator on first use, shared by
//! `FallowAlloc` (`global.rs`) and the preload library.
//!
//! One 32-bit word, so that waiters can sleep on it with a futex:
//! - `UNINIT` (0): nobody has started;
//! - `tid << 2 | 1`: the thread whose kernel id is `tid` is creating the allocator;
//! - `READY` (2) or `FAILED` (3): final.
//!
//! Creating an allocator allocates (its `Arc`) and may register handlers that allocate, and those
//! requests come back to the caller's `malloc` / `GlobalAlloc`: only the creating thread's own
//! re-entrant requests see [`Entry::Reentrant`] and go to the system allocator. Every other
//! thread that finds the allocator being created waits (a short spin, then a futex sleep) and
//! uses it once it is ready, so that requests racing at program start are all served by fallow.
//! Nothing here allocates: the creator's id is in the word itself, compared with `gettid` only on
//! this slow path.
//!
//! `fork` while another thread is creating: the child has the word of a creator that does not
//! exist in it, and would wait forever. A waiter therefore checks, before each sleep, that the
//! creator is a live thread of its own process (`tgkill(getpid(), tid, 0)`); if it is not, the
//! creation was abandoned, and the waiter puts the word back to `UNINIT` (compare-and-swap on the
//! exact word, so that only one thread does) and starts over: the child creates its own
//! allocator. What the abandoned creation had reserved stays mapped, unused: address space only.
//!
//! A waiter gives up after [`MAX_WAIT_NS`] and uses the system allocator for that one request
//! ([`Entry::Stalled`]): a creation is a few system calls, so a wait that long means the creator
//! is blocked, possibly on a lock the waiting thread holds (`pthread_create` and
//! `dlopen` share the loader's locks, for example), and waiting on would hang the program.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::os;

const UNINIT: u32 = 0;
const CREATING: u32 = 1;
const READY: u32 = 2;
const FAILED: u32 = 3;

/// Spins before the first futex sleep: creation takes a few system calls, so a waiter usually
/// sleeps; the spin only catches a creation that is about to finish.
const SPINS: u32 = 64;
/// A sleeping waiter wakes at least this often to check that the creator is still alive.
const RECHECK_NS: u64 = 2_000_000;
/// The longest a request waits for a creation before going to the system allocator.
pub const MAX_WAIT_NS: u64 = 1_000_000_000;

/// What a caller that found the allocator not ready does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The allocator exists: use it.
    Ready,
    /// Creating it failed: use the system allocator.
    Failed,
    /// This caller must create it, then call [`StartGate::finish`].
    Create,
    /// This thread is creating it and came back here from inside the creation: use the system
    /// allocator (waiting would wait for itself).
    Reentrant,
    /// Another thread has been creating it for longer than `MAX_WAIT_NS` (1 s): use the system
    /// allocator for this request.
    Stalled,
}

pub struct StartGate {
    word: AtomicU32,
}

impl StartGate {
    pub const fn new() -> StartGate {
        StartGate { word: AtomicU32::new(UNINIT) }
    }

    /// Whether the allocator exists (acquire: what the creator wrote before `finish` is visible).
    #[inline]
    pub fn is_ready(&self) -> bool {
        self.word.load(Ordering::Acquire) == READY
    }

    /// The slow path of a request that found the allocator not ready: waits while another live
    /// thread of this process creates it.
    #[cold]
    pub fn enter(&self) -> Entry {
        let mut spins = 0;
        let mut deadline = 0;
        loop {
            let w = self.word.load(Ordering::Acquire);
            match w {
                READY => return Entry::Ready,
                FAILED => return Entry::Failed,
                UNINIT => {
                    let me = os::gettid();
                    let mine = (me as u32) << 2 | CREATING;
                    if self.word.compare_exchange(UNINIT, mine, Ordering::Acquire, Ordering::Acquire).is_ok() {
                        return Entry::Create;
                    }
                }
                _ => {
                    let creator = (w >> 2) as i32;
                    if creator == os::gettid() {
                        return Entry::Reentrant;
                    }
                    if spins < SPINS {
                        spins += 1;
                        core::hint::spin_loop();
                        continue;
                    }
                    if !os::thread_alive(creator) {
                        // Abandoned (a fork child, or the creator's thread ended): start over.
                        let _ = self.word.compare_exchange(w, UNINIT, Ordering::AcqRel, Ordering::Relaxed);
                        continue;
                    }
                    let now = os::now_ns();
                    if deadline == 0 {
                        deadline = now + MAX_WAIT_NS;
                    } else if now >= deadline {
                        return Entry::Stalled;
                    }
                    os::futex_wait(&self.word, w, Some(RECHECK_NS));
                }
            }
        }
    }

    /// The creator's last step: publish the outcome and wake the waiters. Everything written
    /// before this (the allocator itself) is visible to whoever then sees `Ready`.
    pub fn finish(&self, ok: bool) {
        self.word.store(if ok { READY } else { FAILED }, Ordering::Release);
        os::futex_wake_all(&self.word);
    }
}

impl Default for StartGate {
    fn default() -> Self {
        StartGate::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    #[test]
    fn one_creator_reentry_and_waiters() {
        let gate = Arc::new(StartGate::new());
        let created = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (gate, created, barrier) = (gate.clone(), created.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    match gate.enter() {
                        Entry::Create => {
                            // The creator's own request comes back: it must not wait for itself.
                            assert_eq!(gate.enter(), Entry::Reentrant);
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            created.fetch_add(1, Ordering::SeqCst);
                            gate.finish(true);
                            true
                        }
                        Entry::Ready => {
                            // A waiter returns only after the creator published.
                            assert_eq!(created.load(Ordering::SeqCst), 1);
                            true
                        }
                        _ => false,
                    }
                })
            })
            .collect();
        for h in handles {
            assert!(h.join().unwrap());
        }
        assert_eq!(created.load(Ordering::SeqCst), 1);
        assert!(gate.is_ready());
    }

    /// A thread that enters `gate` as its creator and finishes only when told to; returns once
    /// it is creating.
    fn creating_thread(gate: &Arc<StartGate>) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let creator = std::thread::spawn(move || {
            assert_eq!(g.enter(), Entry::Create);
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            g.finish(true);
        });
        started_rx.recv().unwrap();
        (creator, go_tx)
    }

    #[test]
    fn a_fork_child_of_a_creation_in_progress_creates_its_own() {
        let gate = Arc::new(StartGate::new());
        let (creator, go_tx) = creating_thread(&gate);
        // SAFETY: the child only calls the gate (system calls, no allocation) and `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above; a child that waits forever for the parent's creator is killed
            // by the alarm and fails the test.
            unsafe { libc::alarm(10) };
            let created = gate.enter() == Entry::Create;
            gate.finish(true);
            let ok = created && gate.enter() == Entry::Ready;
            // SAFETY: leaves the child without running the parent's test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `pid` is our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        go_tx.send(()).unwrap();
        creator.join().unwrap();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        assert!(gate.is_ready());
    }

    #[test]
    fn a_waiter_gives_up_on_a_creation_that_does_not_end() {
        let gate = Arc::new(StartGate::new());
        let (creator, go_tx) = creating_thread(&gate);
        // The creator is alive and blocked: this thread waits, then uses the system allocator.
        assert_eq!(gate.enter(), Entry::Stalled);
        go_tx.send(()).unwrap();
        creator.join().unwrap();
        assert_eq!(gate.enter(), Entry::Ready);
    }

    #[test]
    fn a_creation_abandoned_by_its_thread_is_started_over() {
        let gate = Arc::new(StartGate::new());
        let g = gate.clone();
        // A thread that starts creating and ends without finishing (as seen by a fork child).
        std::thread::spawn(move || assert_eq!(g.enter(), Entry::Create)).join().unwrap();
        assert_eq!(gate.enter(), Entry::Create);
        gate.finish(false);
        assert_eq!(gate.enter(), Entry::Failed);
        assert!(!gate.is_ready());
    }
}
