//! fallow's own threads never keep a process alive.
//!
//! A process ends when its last thread does: the last thread to end calls `exit(0)` in glibc
//! (`start_thread`, and `pthread_exit` in the first thread), which runs the program's `atexit`
//! handlers and flushes its streams. The workers (and the preload's sampler under `fallow run`)
//! are threads of the process too. A program whose first thread leaves by `pthread_exit` (the C
//! idiom that lets the other threads run on), or a `fork` child whose one thread ends that way
//! (a thread that forked and then returns: Python's `os.fork` in a thread), would otherwise live
//! on with nothing left but fallow's threads, asleep, for ever.
//!
//! - **The first thread is watched.** At load time (`at_load`) and in a `fork` child
//!   (`after_fork_child`), the thread whose id is the process's gets a thread-specific value
//!   whose destructor (`first_thread_leaves`) runs when it leaves by `pthread_exit` (never on a
//!   return from `main`, which is `exit`). It sets `FIRST_GONE` and kicks every running worker.
//! - **Then every sleep of fallow's threads is short and ends with a look.** With `FIRST_GONE`
//!   set, a worker sleeps at most 10 ms for its first `FAST_LOOKS` looks, 200 ms after (`cap_sleep`),
//!   and after each sleep reads the kernel's view (`/proc/self/stat`): once the first thread is
//!   a zombie and every other thread is one of fallow's (`OWN`), no thread of the program is
//!   left. The worker then stops as if asked to (`Worker::idle`, `nap_unless_kicked`), and the
//!   last of fallow's threads to end makes glibc's `exit(0)`. A thread with a table of fallow's
//!   (slab heaps, page caches) that leaves meanwhile kicks them and makes their sleeps short
//!   again (`thread_leaves`): it may be the last. Before the first thread leaves, nothing of
//!   this costs more than the load of `FIRST_GONE` after a sleep or at a thread's exit.
//! - **Counting errs on the side of living.** A thread counts itself in `OWN` from its first
//!   line to its last (`OwnThread`), inside the span in which the kernel counts it: the kernel's
//!   count is never below `OWN` plus the program's threads, so a program thread is never taken
//!   for one of fallow's. A thread the program creates while fallow's threads look is counted
//!   by the kernel at once.
//!
//! Limits: with two copies of this crate in one process (the preload library and a program
//! linked with `libfallow.so`), each counts its own threads only, and neither ever sees the
//! program gone. A worker the registry had no room for (`SLOTS`) learns of the first thread's
//! end at its next wake, at most `Worker::IDLE_MAX_NS` later.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use crate::lock::RawLock;
use crate::os;
use super::Worker;

/// Set when the process's first thread has left by `pthread_exit`.
static FIRST_GONE: AtomicBool = AtomicBool::new(false);
/// Set once the program has no thread left (sticky: no program thread can come back).
static PROGRAM_GONE: AtomicBool = AtomicBool::new(false);
/// fallow's threads of this process that are running (`OwnThread`).
static OWN: AtomicU32 = AtomicU32::new(0);
/// Looks at the kernel's count since the first thread left (`poll_ns`).
static LOOKS: AtomicU32 = AtomicU32::new(0);
/// The thread-specific key whose value the first thread carries; `NO_KEY` when none.
static KEY: AtomicU32 = AtomicU32::new(NO_KEY);
const NO_KEY: u32 = u32::MAX;

/// Running workers, for the kick of `first_thread_leaves`: each slot written under `SLOTS_LOCK`
/// by the worker's own thread (its first and last lines), read under it by the kicker; a
/// worker is alive while its slot names it (its thread holds the `Arc` that owns it).
const SLOTS: usize = 64;
static WORKERS: [AtomicPtr<Worker>; SLOTS] = [const { AtomicPtr::new(ptr::null_mut()) }; SLOTS];
static SLOTS_LOCK: RawLock = RawLock::new();

/// A sleep of fallow's threads while the first thread is gone: short for a second (the
/// program's last threads usually end soon after), then a few looks a second.
const POLL_FAST_NS: u64 = 10_000_000;
const POLL_SLOW_NS: u64 = 200_000_000;
const FAST_LOOKS: u32 = 100;

/// Counts the calling thread as one of fallow's from its creation to its drop (and lists a
/// worker for the kick), held for the whole of the thread's function: a worker's, after the
/// `Arc` that owns the worker, so that it is unlisted before the worker can go.
pub struct OwnThread {
    slot: Option<usize>,
}

impl OwnThread {
    /// A worker's thread (`report.rs`, `zero.rs`).
    pub(crate) fn worker(w: &Worker) -> OwnThread {
        OwnThread::enter(Some(w))
    }

    /// Another thread of fallow's (the preload's sampler under `fallow run`), which ends by
    /// itself once `program_gone` says so.
    pub fn helper() -> OwnThread {
        OwnThread::enter(None)
    }

    fn enter(worker: Option<&Worker>) -> OwnThread {
        OWN.fetch_add(1, Ordering::SeqCst);
        let slot = worker.and_then(|w| {
            SLOTS_LOCK.lock();
            let free = WORKERS.iter().position(|s| s.load(Ordering::Relaxed).is_null());
            if let Some(i) = free {
                WORKERS[i].store(w as *const Worker as *mut Worker, Ordering::Relaxed);
            }
            // SAFETY: taken above by this thread.
            unsafe { SLOTS_LOCK.unlock() };
            free
        });
        OwnThread { slot }
    }
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            SLOTS_LOCK.lock();
            WORKERS[i].store(ptr::null_mut(), Ordering::Relaxed);
            // SAFETY: taken above by this thread.
            unsafe { SLOTS_LOCK.unlock() };
        }
        OWN.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The longest sleep of fallow's threads now: `ns`, or a short poll once the first thread left.
#[inline]
pub(crate) fn cap_sleep(ns: u64) -> u64 {
    if !FIRST_GONE.load(Ordering::Relaxed) {
        return ns;
    }
    ns.min(if LOOKS.load(Ordering::Relaxed) < FAST_LOOKS {
        POLL_FAST_NS
    } else {
        POLL_SLOW_NS
    })
}

/// After a sleep: whether the program has no thread left, so that the caller ends (the first
/// thread gone, and every other thread one of fallow's). A load of `FIRST_GONE` until the first
/// thread leaves; then a read of `/proc/self/stat`.
#[inline]
pub fn program_gone() -> bool {
    if !FIRST_GONE.load(Ordering::Relaxed) {
        return false;
    }
    look()
}

#[cold]
fn look() -> bool {
    if PROGRAM_GONE.load(Ordering::SeqCst) {
        return true;
    }
    LOOKS.fetch_add(1, Ordering::Relaxed);
    let gone = os::first_thread_gone_leaving(OWN.load(Ordering::SeqCst));
    if gone {
        PROGRAM_GONE.store(true, Ordering::SeqCst);
    }
    gone
}

/// Run once when the program or the shared object holding this crate is loaded: create the key
/// and watch the first thread, if this is it (a library loaded later by another thread cannot
/// watch the first thread: it goes without).
pub(crate) fn at_load() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is writable; the destructor is an `extern "C"` function that lives as long
    // as the code holding it. (glibc's keys are a static table: no allocation.)
    if unsafe { libc::pthread_key_create(&mut key, Some(first_thread_leaves)) } != 0 {
        return;
    }
    KEY.store(key, Ordering::Relaxed);
    watch_if_first();
}

/// In a `fork` child: its one thread (this one) is its first, fallow's threads are not there,
/// and the parent's watch says nothing of the child.
///
/// # Safety
/// Only in the child of a `fork`, before it starts a thread.
pub(crate) unsafe fn after_fork_child() {
    // SAFETY: the caller's contract: one thread, this one; a holder of the lock in the parent
    // does not exist here.
    unsafe { SLOTS_LOCK.reset_after_fork() };
    for s in &WORKERS {
        s.store(ptr::null_mut(), Ordering::Relaxed);
    }
    OWN.store(0, Ordering::SeqCst);
    LOOKS.store(0, Ordering::Relaxed);
    PROGRAM_GONE.store(false, Ordering::SeqCst);
    FIRST_GONE.store(false, Ordering::SeqCst);
    watch_if_first();
}

fn watch_if_first() {
    let key = KEY.load(Ordering::Relaxed);
    if key == NO_KEY || os::gettid() != os::getpid() {
        return;
    }
    // SAFETY: `key` is a key this crate created; any non-null value makes glibc call the
    // destructor when the thread leaves (the value is never dereferenced).
    unsafe {
        libc::pthread_setspecific(
            key,
            ptr::NonNull::<u8>::dangling().as_ptr() as *const c_void,
        )
    };
}

/// A thread with a table of fallow's (slab heaps, page caches) is leaving: once the first
/// thread has left, it may be the program's last, so the workers look again soon (short sleeps
/// again, and a kick now; the look that sees this thread gone follows one short sleep later).
pub(crate) fn thread_leaves() {
    if FIRST_GONE.load(Ordering::Relaxed) {
        LOOKS.store(0, Ordering::Relaxed);
        kick_workers();
    }
}

/// The destructor of the first thread's value: it is leaving by `pthread_exit`.
extern "C" fn first_thread_leaves(_: *mut c_void) {
    FIRST_GONE.store(true, Ordering::SeqCst);
    kick_workers();
}

/// Wake every listed worker, so that its next sleep is short and ends with a look.
fn kick_workers() {
    SLOTS_LOCK.lock();
    for s in &WORKERS {
        let w = s.load(Ordering::Relaxed);
        if !w.is_null() {
            // SAFETY: a listed worker is alive (its thread unlists it under this lock before
            // the `Arc` that owns it can go).
            unsafe { (*w).kick() };
        }
    }
    // SAFETY: taken above by this thread.
    unsafe { SLOTS_LOCK.unlock() };
}
