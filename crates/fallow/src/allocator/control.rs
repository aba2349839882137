//! The control surface of an allocator: the workers' settings at run time, starting them,
//! cache drains on request, `fork`, and the whole-allocator checks that tests run.

use core::sync::atomic::Ordering;

use crate::cache;
use crate::config::Tunables;
use crate::error::Error;
use crate::heap::INFLIGHT;
use crate::os::PAGE_SHIFT;
use crate::page::{PageState, Tag};

use super::Allocator;

/// A trim's looks for the idle threads' caches while a worker's drain is under way, and the wait
/// between two (10 ms in all at most).
const DRAIN_TRIES: u32 = 50;
const DRAIN_RETRY_NS: u64 = 200_000;

impl Allocator {
    /// The current settings of the background workers (orders and chunk clamped to the largest
    /// block).
    pub fn tunables(&self) -> Tunables {
        self.shared.heap.lock().tunables
    }

    /// Change the settings of the background workers at run time (validated: a bad value is an
    /// error naming the setting and its accepted range, and changes nothing). Starts a worker
    /// that is switched on; one switched off finishes its batch and sleeps.
    pub fn set_tunables(&self, t: Tunables) -> Result<(), Error> {
        t.validate(&self.shared.config)?;
        self.shared.heap.lock().tunables = t.clamped(&self.shared.config);
        self.shared.reporter.kick();
        self.shared.zeroer.kick();
        self.start_workers();
        Ok(())
    }

    /// Make the reporting worker act as if memory pressure had been signalled (a PSI stall
    /// event): idle free memory goes back at once, the zeroed reserve first. For tests.
    #[doc(hidden)]
    pub fn simulate_pressure(&self) {
        self.shared.pressure_injected.store(true, Ordering::Relaxed);
        self.shared.reporter.kick();
    }

    /// Start the workers that are switched on and not running (also after `fork`, in the child).
    pub fn start_workers(&self) {
        let t = self.tunables();
        if t.report {
            self.shared.start_worker(&self.shared.reporter);
        }
        if t.zeroing {
            self.shared.start_worker(&self.shared.zeroer);
        }
    }

    /// Whether the background workers are running in this process: `(reporter, zeroer)`.
    pub fn workers_running(&self) -> (bool, bool) {
        (self.shared.reporter.running(), self.shared.zeroer.running())
    }

    /// Ask every thread's cache of this allocator to drain back to the free lists (for the
    /// reporting worker, when memory has been idle past its delay). Each thread does so at its
    /// next free on this allocator, or its next allocation that refills its cache (an
    /// allocation served from the cache only takes blocks out of it); a cache never holds more
    /// than the bound stated in docs/design.md ("Per-thread caches").
    pub fn request_cache_drain(&self) {
        cache::ask_to_drain(&self.shared, &self.shared.heap.lock());
    }

    /// Drain the calling thread's cache of this allocator back to the free lists now, after its
    /// small-object heap gave back its empty spans (those with live objects stay).
    pub fn drain_thread_cache(&self) {
        self.drain_thread_cache_trimmed();
    }

    /// `drain_thread_cache`; returns the pages of live spans its trims gave back.
    fn drain_thread_cache_trimmed(&self) -> u64 {
        let pages = self.slab.trim_current();
        let _ = cache::drain_current(&self.shared);
        pages
    }

    /// Give free memory back to the kernel now, but at least `keep_bytes` of it (glibc's
    /// `malloc_trim`, whose `pad` it is; blocks are not split for it, so a block that would take
    /// the free memory below it stays): the calling thread's cache and its heap's empty spans of small
    /// objects first (spans with live objects are trimmed), then the caches of idle threads (a
    /// busy thread's drains at its next call, as when the reporter asks), then every free
    /// block with resident pages on the lists, whatever its age, dirty ones before zeroed ones
    /// (trim.rs). Runs in the calling thread, in batches, never holding the lock across a system
    /// call; works with the workers off too. Returns the bytes given back that were resident,
    /// those of the calling thread's live spans included. Other threads' heaps of small objects
    /// are theirs: their empty spans go back as they always do, at their owner's next look.
    pub fn trim(&self, keep_bytes: usize) -> u64 {
        let spans = self.drain_thread_cache_trimmed() << PAGE_SHIFT;
        let s = &*self.shared;
        let g = cache::ask_to_drain(s, &s.heap.lock());
        // `None`: a worker's drain is under way (its membarrier takes a moment): try again, or
        // idle threads' caches would keep their blocks until their threads call again.
        for _ in 0..DRAIN_TRIES {
            if cache::drain_unanswered(s, cache::Scope::All, g, s.now_ms()).is_some() {
                break;
            }
            crate::os::sleep_ns(DRAIN_RETRY_NS);
        }
        spans + crate::trim::trim(s, (keep_bytes >> PAGE_SHIFT) as u64)
    }

    /// Lock the allocator before `fork` (pair with `after_fork_parent` / `after_fork_child`, as
    /// `pthread_atfork` handlers). Calling it twice in a row without either deadlocks.
    pub fn before_fork(&self) {
        // The slab's lock first: the slab never takes it while holding the allocator's.
        self.slab.before_fork();
        self.shared.heap.raw().lock();
    }

    /// In the parent after `fork`: release the lock `before_fork` took.
    ///
    /// # Safety
    /// The calling thread called `before_fork` on this allocator and has not released the lock
    /// since (by `after_fork_parent`): otherwise this releases a lock another thread holds, and
    /// two threads then change the free lists at once.
    pub unsafe fn after_fork_parent(&self) {
        // SAFETY: the caller's contract: `before_fork` took the lock in this thread, and this is
        // its parent-side release.
        unsafe { self.shared.heap.raw().unlock() }
        // SAFETY: the same contract: `before_fork` took the slab's lock in this thread.
        unsafe { self.slab.after_fork_parent() }
    }

    /// In the child: the lock is free again, the workers do not exist here. The heaps of the
    /// parent's other threads (small objects) are given up, their spans collected as their
    /// objects are freed. Blocks they had
    /// isolated go back on the lists in the states they had before (a conservative choice: a
    /// reported or zeroed page recorded as dirty costs a memset at worst). The workers restart
    /// when a free next makes work for them, or at `start_workers`.
    ///
    /// # Safety
    /// Only in the child of a `fork`, before it starts any thread, and only when the parent's
    /// forking thread called `before_fork` on this allocator just before the `fork` (so that no
    /// other thread was changing it when the address space was copied).
    pub unsafe fn after_fork_child(&self) {
        // SAFETY: the caller's contract: the child has one thread, this one, whose parent took the
        // lock in `before_fork`.
        unsafe { self.shared.heap.raw().reset_after_fork() }
        let s = &*self.shared;
        s.reporter.forget_after_fork();
        s.zeroer.forget_after_fork();
        // The parent's pidfd: the child's workers make their own.
        s.close_worker_descriptors();
        s.squeezed.store(false, Ordering::Relaxed);
        let mut h = s.heap.lock();
        cache::thaw_after_fork(&mut h);
        h.isolation_waiters = 0;
        h.trimming = false;
        for slot in 0..INFLIGHT {
            if h.inflight[slot].used {
                h.unisolate(slot, |st| st);
            }
        }
        drop(h);
        // SAFETY: the caller's contract, which `before_fork` extends to the slab's lock.
        unsafe { self.slab.after_fork_child() }
    }

    /// Check every invariant of the free lists and counters (for tests; walks everything). Other
    /// threads are kept out of their per-thread caches meanwhile (`membarrier`); an error says so
    /// when that cannot be done.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let Some(h) = cache::lock_owners_out(&self.shared) else {
            return Err("cannot keep other threads out of their caches (busy for 1 s, or no membarrier)".into());
        };
        let mut listed_pages = 0u64;
        let mut total = 0u64;
        for (ai, a) in h.arenas.iter().enumerate() {
            total += a.npages as u64;
            listed_pages += a.check_lists().map_err(|e| format!("arena {ai}: {e}"))?;
        }
        let c = &h.counters;
        let inflight: u64 = h.inflight.iter().filter(|r| r.used).map(|r| 1u64 << r.order).sum();
        if inflight != c.isolated_pages {
            return Err(format!("{inflight} pages in flight but isolated_pages = {}", c.isolated_pages));
        }
        for r in h.inflight.iter().filter(|r| r.used) {
            if h.arena(r.arena as usize).meta(r.pfn).tag() != Tag::Isolated {
                return Err(format!("in-flight block {} is not tagged isolated", r.pfn));
            }
        }
        // Wrapping: a cache's unfolded hits move pages between `in_use` and `cached` (cache/).
        let sum = listed_pages.wrapping_add(c.in_use_pages).wrapping_add(c.cached_pages).wrapping_add(c.isolated_pages);
        if sum != total {
            return Err(format!(
                "pages do not add up: {listed_pages} listed + {} in use + {} cached + {} isolated != {total}",
                c.in_use_pages as i64, c.cached_pages as i64, c.isolated_pages
            ));
        }
        cache::check(&h)?;
        // The slab's check takes its own lock, never while holding the allocator's (`fork`
        // takes them in the other order).
        drop(h);
        self.slab.check()
    }

    /// Every free page's recorded state, as runs `(address, bytes, state)` (for tests). Other
    /// threads are kept out of their per-thread caches meanwhile, as by `check_invariants`.
    ///
    /// # Panics
    /// When that cannot be done (a thread stayed inside its cache for a second, or no `membarrier`).
    #[doc(hidden)]
    pub fn free_runs(&self) -> Vec<(usize, usize, PageState)> {
        let mut out = Vec::new();
        self.free_runs_with(|addr, len, state| out.push((addr, len, state)));
        out
    }

    /// `free_runs`, handing each run to `f` while the lock is still held: the workers cannot take
    /// a listed run (to zero, populate or report it) while `f` looks at its pages, so what `f`
    /// reads is what the states say. (A run read after the lock is dropped may have been reported
    /// meanwhile, and reading a reported page maps the zero page in: resident.) `f` must not call
    /// into this allocator (its lock is held).
    ///
    /// # Panics
    /// As `free_runs`.
    #[doc(hidden)]
    pub fn free_runs_with(&self, mut f: impl FnMut(usize, usize, PageState)) {
        let h = cache::lock_owners_out(&self.shared).expect("free_runs: cannot keep other threads out of their caches");
        for a in h.arenas.iter() {
            a.for_each_listed(|pfn, order| {
                a.for_each_run(pfn, 1 << order, |p, n, s| f(a.addr(p), (n as usize) << PAGE_SHIFT, s))
            });
        }
        cache::free_runs(&h, &mut f);
        drop(h);
    }
}
