//! Synchronisation with the kernel: the futex under the allocator lock (`lock.rs`), the worker
//! words (`worker/mod.rs`) and the start gate (`start.rs`), and `membarrier`, the heavy side of the
//! page caches' asymmetric fences (`cache.rs`).

use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use rustix::thread::futex;
use rustix::thread::{MembarrierCommand, Pid};

/// Sleep while `*word == expected`, at most `timeout_ns` (`None`: until woken). It may also
/// return early (a signal, a spurious wake-up): callers re-check their word.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|ns| futex::Timespec {
        tv_sec: (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as i64,
    });
    // `EAGAIN` (the word had changed), `ETIMEDOUT` and `EINTR` all mean "look again".
    let _ = futex::wait(word, futex::Flags::PRIVATE, expected, ts.as_ref());
}

/// Wake one thread sleeping on `word`.
pub fn futex_wake_one(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::PRIVATE, 1);
}

/// Wake every thread sleeping on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::PRIVATE, i32::MAX as u32);
}

/// The process for which `membarrier` was registered (0: none yet; -1: not available).
static MEMBARRIER_PID: AtomicI32 = AtomicI32::new(0);

/// A full memory barrier on every running thread of this process (`membarrier(2)`, private
/// expedited): the heavy side of an asymmetric fence, whose light side is a compiler fence.
/// Registers the process first (again in a `fork` child, which is a new process to the kernel).
/// `false`: not available here.
pub fn membarrier() -> bool {
    let pid = Pid::as_raw(Some(rustix::process::getpid()));
    let seen = MEMBARRIER_PID.load(Ordering::Relaxed);
    if seen == -1 {
        return false;
    }
    if seen != pid {
        if rustix::thread::membarrier(MembarrierCommand::RegisterPrivateExpedited).is_err() {
            MEMBARRIER_PID.store(-1, Ordering::Relaxed);
            return false;
        }
        MEMBARRIER_PID.store(pid, Ordering::Relaxed);
    }
    rustix::thread::membarrier(MembarrierCommand::PrivateExpedited).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn futex_wait_returns_on_changed_word_and_timeout() {
        let w = AtomicU32::new(1);
        // The word is not 0: returns at once (`EAGAIN`).
        futex_wait(&w, 0, None);
        // The word is 1 and nobody wakes it: returns once the millisecond has passed.
        futex_wait(&w, 1, Some(1_000_000));
        futex_wake_one(&w);
        futex_wake_all(&w);
    }

    #[test]
    fn futex_wake_ends_a_wait() {
        let w = std::sync::Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                futex_wait(&w2, 0, None);
            }
        });
        w.store(1, Ordering::Release);
        futex_wake_all(&w);
        t.join().unwrap();
    }

    #[test]
    fn membarrier_is_stable() {
        let first = membarrier();
        assert_eq!(membarrier(), first);
    }
}
