//! Atomics and the futex of the lock-free protocols that `tests/loom/` model-checks with the
//! real code (`worker/mod.rs`). A normal build gets `core`'s atomics and `os`'s futex calls, so this
//! costs nothing; a build with the `loom` feature (`make test-loom`) gets loom's atomics and a futex
//! modelled by a mutex and a condition variable, and `lib.rs` then exports what the models call
//! (`loom_support`). Protocols whose code cannot run under loom (`cache/`, `report.rs`,
//! `start.rs`: they need an allocator, or a kernel thread id per thread) are modelled line by
//! line in the test instead.

#[cfg(not(feature = "loom"))]
pub(crate) use core::sync::atomic;
#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic;

#[cfg(not(feature = "loom"))]
pub(crate) use crate::os::{futex_wait, futex_wake_all};

#[cfg(feature = "loom")]
pub use self::model::{futex_wait, futex_wake_all};

/// The futex under loom: one mutex and condition variable for every word (a hash table of one
/// bucket). `futex_wait` checks the word under the mutex and sleeps only if it still holds the
/// value the caller saw; `futex_wake_all` takes the mutex after the caller changed the word and
/// wakes every sleeper. So a wake cannot fall between a waiter's check and its sleep: what
/// `FUTEX_WAIT`'s atomic check-and-sleep in the kernel provides. There is no clock: a timed
/// wait sleeps until woken, so a lost wake-up shows as a deadlock, which loom reports. A model
/// that needs a timeout (a nap that ends on its own) adds a thread that calls `futex_wake_all`,
/// which loom then runs at every possible moment. A wake of another word wakes this one's
/// sleepers too: a spurious wake-up, which a futex may also have.
#[cfg(feature = "loom")]
mod model {
    use loom::sync::atomic::{AtomicU32, Ordering};
    use loom::sync::{Condvar, Mutex};

    loom::lazy_static! {
        static ref BUCKET: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    pub fn futex_wait(word: &AtomicU32, expected: u32, _timeout_ns: Option<u64>) {
        let (m, cv) = &*BUCKET;
        let g = m.lock().unwrap();
        if word.load(Ordering::SeqCst) == expected {
            drop(cv.wait(g).unwrap());
        }
    }

    pub fn futex_wake_all(_word: &AtomicU32) {
        let (m, cv) = &*BUCKET;
        let _g = m.lock().unwrap();
        cv.notify_all();
    }
}
