//! The heap's side of the background workers: after a free, wake a worker that sleeps idle if
//! the free made work for it (start it, in a `fork` child where it does not exist yet); start
//! and stop their threads; count the allocator's handles, the last of which stops them.

use core::sync::atomic::Ordering;
use std::sync::Arc;

use crate::lock::Guard;
use crate::os;
use crate::worker::{self, Worker};

use super::{Heap, Shared};

/// Whether a worker whose word reads `word` is asleep with nothing to do (or absent in a `fork`
/// child and due for a restart), so that a free that creates work must wake it.
#[inline]
fn asleep(w: &Worker, word: u32) -> bool {
    word == worker::IDLE || (word == worker::ABSENT && w.restart_wanted.load(Ordering::Relaxed))
}

impl Shared {
    /// Start the thread of worker `w` (the reporter or the zeroer of this allocator) unless it
    /// runs or another thread is starting it. Without a thread the allocator works as without
    /// workers.
    pub(crate) fn start_worker(self: &Arc<Self>, w: &Worker) {
        if w.running() || !w.claim_start() {
            return;
        }
        let entry = if core::ptr::eq(w, &self.reporter) { self.entries.report } else { self.entries.zero };
        let arg = Arc::into_raw(self.clone()) as *mut libc::c_void;
        if w.start(entry, arg).is_err() {
            // No thread: nothing runs in the background, the allocator works as without workers.
            // SAFETY: `arg` came from `Arc::into_raw` just above and no thread was created to own it.
            drop(unsafe { Arc::from_raw(arg as *const Shared) });
            w.release_claim();
        } else {
            w.restart_wanted.store(false, Ordering::Relaxed);
        }
    }

    /// After a free (any path that puts memory on the lists): release the lock, and wake a
    /// worker only if it sleeps idle and the free made work for it. Costs two relaxed loads when
    /// the workers are busy; a `FUTEX_WAKE` (outside the lock) only on the idle-to-busy edge.
    pub(crate) fn wake_workers_after_free(self: &Arc<Self>, h: Guard<'_, Heap>) {
        let s = &**self;
        let report_word = s.reporter.word.load(Ordering::Relaxed);
        let zero_word = s.zeroer.word.load(Ordering::Relaxed);
        if report_word == worker::RUNNING && zero_word == worker::RUNNING {
            return;
        }
        let t = &h.tunables;
        let wake_report = asleep(&s.reporter, report_word) && t.report && h.has_unreported_for(t);
        // Before any `ZERO` request the zeroing worker has nothing to do (but the opt-in
        // populated reserve): waking it would only have it look and sleep again.
        let demand = s.zero_requested.load(Ordering::Relaxed) || t.populated_reserve > 0;
        let wake_zero = asleep(&s.zeroer, zero_word) && t.zeroing && demand && h.has_dirty(t.zero_lowest());
        drop(h);
        if wake_report {
            self.wake(&s.reporter);
        }
        if wake_zero {
            self.wake(&s.zeroer);
        }
    }

    /// A thread freed a large block into its cache (off the hit path): tell the zeroing worker,
    /// which looks for such blocks in idle threads' caches (zero.rs), and wake it if it is idle.
    /// At most once between two of its looks: then one load of a line it writes at each look.
    /// `SeqCst` with its check of the flag after it stores `IDLE`: no lost wake-up.
    pub(crate) fn note_large_cached(self: &Arc<Self>) {
        // No `ZERO` request yet: nothing would be zeroed for it.
        if !self.zero_requested.load(Ordering::Relaxed) {
            return;
        }
        if self.large_cached.load(Ordering::Relaxed) || self.large_cached.swap(true, Ordering::SeqCst) {
            return;
        }
        let word = self.zeroer.word.load(Ordering::SeqCst);
        if asleep(&self.zeroer, word) {
            self.wake(&self.zeroer);
        }
    }

    fn wake(self: &Arc<Self>, w: &Worker) {
        if w.word.load(Ordering::Relaxed) == worker::ABSENT {
            self.start_worker(w);
        } else {
            w.wake_idle();
        }
    }

    /// Another handle, unless the last is already gone (then the workers are stopped or
    /// stopping, and nothing may start them again): `false` then.
    pub(crate) fn acquire_handle(&self) -> bool {
        let mut n = self.handles.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return false;
            }
            match self.handles.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(m) => n = m,
            }
        }
    }

    /// A handle more, from one that exists.
    pub(crate) fn clone_handle(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    /// A handle gone; the last one stops and joins the workers (which hold the `Arc` but no
    /// handle).
    pub(crate) fn release_handle(&self) {
        if self.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.stop_workers();
        }
    }

    /// `wake_workers_after_free` under a handle taken for the moment, so that a cache drained at
    /// its thread's exit never restarts the workers of an allocator whose last handle is gone.
    pub(crate) fn wake_workers_if_alive(self: &Arc<Self>, h: Guard<'_, Heap>) {
        if self.acquire_handle() {
            self.wake_workers_after_free(h);
            self.release_handle();
        }
    }

    fn stop_workers(&self) {
        self.reporter.stop_and_join();
        self.zeroer.stop_and_join();
        self.close_worker_descriptors();
    }

    /// Close what the workers keep open for the allocator's life, the pidfd: once they are
    /// joined, or in a `fork` child, where they do not exist.
    pub(crate) fn close_worker_descriptors(&self) {
        let fd = self.pidfd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the swap took the pidfd out of `pidfd`, the workers that used it are joined
            // or (in a `fork` child) do not exist, and no trim runs (a trim is made through a
            // handle, and this runs when the last one goes, or in the child's one thread):
            // nobody else uses or closes it.
            unsafe { os::close(fd) };
        }
    }
}
