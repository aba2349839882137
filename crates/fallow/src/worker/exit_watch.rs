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
//!   Where that cannot be done (a library loaded by another thread, no key left), the process
//!   is `UNWATCHED`, and the looks below run at most a second apart from the start.
//! - **Then fallow's threads look after every short sleep.** With `FIRST_GONE` set, a worker's
//!   sleep is cut into slices of 10 ms (the first `FAST_LOOKS` looks of the process), then 200
//!   ms (`slice_ns`); its deadline and its wake-ups stay what they were (`Worker::sleep`), and
//!   after each slice it reads the kernel's view (`/proc/self/stat`): once the first thread is a
//!   zombie and every other thread is one of fallow's (`OWN`), no thread of the program is left.
//!   The worker then stops as if asked to, and the last of fallow's threads to end makes glibc's
//!   `exit(0)`. A thread with a table of fallow's (slab heaps, page caches) that leaves
//!   meanwhile kicks them and makes the slices short again (`thread_leaves`): it may be the
//!   last. Before the first thread leaves, nothing of this costs more than two loads before a sleep
//!   (`looking`) and one at a thread's exit.
//! - **Counting errs on the side of living.** A thread counts itself in `OWN` from its first
//!   line to its last (`OwnThread`), inside the span in which the kernel counts it, and each
//!   change also bumps a generation in the same word: a look trusts the kernel's count only if
//!   the word did not change while it read the file (a thread of fallow's that ended in between,
//!   counted in `OWN` but no longer by the kernel, would hide a program thread). So a program
//!   thread is never taken for one of fallow's; a thread the program creates during a look is
//!   counted by the kernel at once.
//!
//! Limits: with two copies of this crate in one process (the preload library and a program
//! linked with `libfallow.so`), each counts its own threads only, and neither ever sees the
//! program gone; nor does a process with threads the kernel counts that are neither the
//! program's pthreads nor fallow's (io_uring's `SQPOLL` thread). A first thread that ends by a
//! raw `exit` system call runs no destructor (an `UNWATCHED` process still sees it). A worker
//! the table had no room for (`SLOTS`) learns of the first thread's end at its next wake, at
//! most `Worker::IDLE_MAX_NS` later.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::Worker;
use crate::lock::Locked;
use crate::os;

/// Set when the process's first thread has left by `pthread_exit`.
static FIRST_GONE: AtomicBool = AtomicBool::new(false);
/// Set when the first thread could not be watched (`at_load` ran on another thread, or no key).
static UNWATCHED: AtomicBool = AtomicBool::new(false);
/// Set once the program has no thread left (sticky: no program thread can come back).
static PROGRAM_GONE: AtomicBool = AtomicBool::new(false);
/// fallow's threads of this process that are running (`OwnThread`) in the low 32 bits, and in
/// the high 32 a generation that every change bumps (`look`).
static OWN: AtomicU64 = AtomicU64::new(0);
const ONE_MORE: u64 = (1 << 32) + 1;
const ONE_FEWER: u64 = (1 << 32) - 1;
/// Looks at the kernel's count by all of fallow's threads since the first thread left, or since
/// a thread with a table of fallow's left (`slice_ns`).
static LOOKS: AtomicU32 = AtomicU32::new(0);
/// The thread-specific key whose value the first thread carries; `NO_KEY` when none.
static KEY: AtomicU32 = AtomicU32::new(NO_KEY);
const NO_KEY: u32 = u32::MAX;

/// Running workers, for the kicks: a slot is written by the worker's own thread (its first and
/// last lines) and read by the kicker, both under the lock; a worker is alive while its slot
/// names it (its thread holds the `Arc` that owns it).
const SLOTS: usize = 64;
static WORKERS: Locked<Listed> = Locked::new(Listed([ptr::null(); SLOTS]));
struct Listed([*const Worker; SLOTS]);
// SAFETY: only addresses move between threads; a worker is reached through its slot only under
// the lock, while the slot names it (above).
unsafe impl Send for Listed {}

/// A slice of a sleep while looking: short for the first looks (the program's last threads
/// often end soon after its first), then a few looks a second; at most a second unwatched.
const SLICE_FAST_NS: u64 = 10_000_000;
const SLICE_SLOW_NS: u64 = 200_000_000;
const SLICE_UNWATCHED_NS: u64 = 1_000_000_000;
const FAST_LOOKS: u32 = 100;

/// Counts the calling thread as one of fallow's from its creation to its drop (and lists a
/// worker for the kicks), held for the whole of the thread's function: a worker's, after the
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
        OWN.fetch_add(ONE_MORE, Ordering::SeqCst);
        let slot = worker.and_then(|w| {
            let mut listed = WORKERS.lock();
            let free = listed.0.iter().position(|s| s.is_null())?;
            listed.0[free] = w;
            Some(free)
        });
        OwnThread { slot }
    }
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            WORKERS.lock().0[i] = ptr::null();
        }
        // The count less one (never below: this thread added one), the generation plus one.
        OWN.fetch_add(ONE_FEWER, Ordering::SeqCst);
    }
}

/// Whether fallow's threads look after their sleeps (`Worker::sleep`).
#[inline]
pub(crate) fn looking() -> bool {
    FIRST_GONE.load(Ordering::Relaxed) || UNWATCHED.load(Ordering::Relaxed)
}

/// The longest slice of a sleep while `looking`.
pub(crate) fn slice_ns() -> u64 {
    if !FIRST_GONE.load(Ordering::Relaxed) {
        SLICE_UNWATCHED_NS
    } else if LOOKS.load(Ordering::Relaxed) < FAST_LOOKS {
        SLICE_FAST_NS
    } else {
        SLICE_SLOW_NS
    }
}

/// Whether the program has no thread left, so that the caller ends: false at the cost of a
/// load until `looking`; then a read of `/proc/self/stat` (the first thread a zombie, and every
/// other thread one of fallow's).
#[inline]
pub fn program_gone() -> bool {
    looking() && look()
}

#[cold]
fn look() -> bool {
    if PROGRAM_GONE.load(Ordering::SeqCst) {
        return true;
    }
    LOOKS.fetch_add(1, Ordering::Relaxed);
    let before = OWN.load(Ordering::SeqCst);
    let gone = os::first_thread_gone_leaving(before as u32);
    // A thread of fallow's that ended during the read: the kernel's count may miss it where
    // `before` has it, and one program thread would hide in the difference.
    if gone && OWN.load(Ordering::SeqCst) == before {
        PROGRAM_GONE.store(true, Ordering::SeqCst);
        return true;
    }
    false
}

/// Run once when the program or the shared object holding this crate is loaded: create the key
/// and watch the first thread if this is it; else (a library loaded later by another thread)
/// the process goes `UNWATCHED`.
pub(crate) fn at_load() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is writable; the destructor is an `extern "C"` function of this object,
    // whose key `at_unload` deletes before the object can go.
    if unsafe { libc::pthread_key_create(&mut key, Some(first_thread_leaves)) } == 0 {
        KEY.store(key, Ordering::Relaxed);
    }
    watch_first_thread();
}

/// Run when the object holding this crate is unloaded (`dlclose` of `libfallow.so`) or the
/// process exits: delete the key, so that glibc never calls a destructor in unmapped code (nor
/// runs out of keys over repeated loads).
pub(crate) fn at_unload() {
    let key = KEY.swap(NO_KEY, Ordering::Relaxed);
    if key != NO_KEY {
        // SAFETY: a key this object created and nobody else deletes (the swap took it).
        unsafe { libc::pthread_key_delete(key) };
    }
}

/// In a `fork` child: its one thread (this one) is its first, fallow's threads are not there,
/// and the parent's watch says nothing of the child.
///
/// # Safety
/// Only in the child of a `fork`, before it starts a thread.
pub(crate) unsafe fn after_fork_child() {
    // SAFETY: the caller's contract: one thread, this one; a holder of the lock in the parent
    // does not exist here.
    unsafe { WORKERS.raw().reset_after_fork() };
    WORKERS.lock().0 = [ptr::null(); SLOTS];
    OWN.store(0, Ordering::SeqCst);
    LOOKS.store(0, Ordering::Relaxed);
    PROGRAM_GONE.store(false, Ordering::SeqCst);
    FIRST_GONE.store(false, Ordering::SeqCst);
    watch_first_thread();
}

/// Give the calling thread, if it is the first, the value whose destructor reports its end;
/// else, or without a key, `UNWATCHED`.
fn watch_first_thread() {
    let key = KEY.load(Ordering::Relaxed);
    let value = ptr::NonNull::<u8>::dangling().as_ptr() as *const c_void;
    // (glibc keeps the values of the first 32 keys in the thread's descriptor; a later key's
    // block comes from `calloc`, which the preload serves like any other.)
    let set = |key| {
        // SAFETY: `key` is a key this object created; any non-null value makes glibc call the
        // destructor when the thread leaves (the value is never dereferenced).
        unsafe { libc::pthread_setspecific(key, value) == 0 }
    };
    let watched = key != NO_KEY && os::gettid() == os::getpid() && set(key);
    UNWATCHED.store(!watched, Ordering::SeqCst);
}

/// A thread with a table of fallow's (slab heaps, page caches) is leaving: once the first
/// thread has left, it may be the program's last, so the workers look again soon (short slices
/// again, and a kick now; the look that sees this thread gone follows one short slice later).
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

/// Wake every listed worker, so that its next sleep is sliced and looked after.
fn kick_workers() {
    for &w in WORKERS.lock().0.iter().filter(|w| !w.is_null()) {
        // SAFETY: a listed worker is alive (its thread unlists it under this lock before the
        // `Arc` that owns it can go).
        unsafe { (*w).kick() };
    }
}
