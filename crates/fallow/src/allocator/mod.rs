//! The public allocator: `Allocator`, a handle to one allocator's shared state (`heap::Shared`),
//! with the per-thread caches' hit paths inlined into `alloc` and `free` and everything else
//! passed down: to the thread's cache (`cache`), then to the locked paths (`heap`). `control`
//! holds the settings of the workers, `fork` and the checks for tests. The top of the core's
//! layers: it may import every module below and none imports it but `global`.

mod control;
#[cfg(test)]
mod tests;

use core::ptr::NonNull;
use core::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cache;
use crate::config::Config;
use crate::error::Error;
use crate::flags::Flags;
use crate::heap::{Heap, Shared, WorkerEntries};
use crate::os::{PAGE_SHIFT, PAGE_SIZE};
use crate::page::{PageState, StateCounts};
use crate::stats::Stats;

/// A page allocator. Cloning gives another handle to the same allocator.
pub struct Allocator {
    pub(crate) shared: Arc<Shared>,
}

impl Clone for Allocator {
    fn clone(&self) -> Allocator {
        self.shared.clone_handle();
        Allocator { shared: self.shared.clone() }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        self.shared.release_handle();
    }
}

impl Allocator {
    /// An allocator with its first arena. Under `RLIMIT_AS` the arena is sized to fit the
    /// address space left (`arena::reserve_fitting`), and when not even one largest block fits,
    /// the largest block is made smaller (down to 2 MiB, order 9) rather than failing:
    /// `config().max_order` and `max_block()` then say what was used.
    pub fn new(mut config: Config) -> Result<Allocator, Error> {
        config.validate()?;
        config.max_order = crate::arena::fitting_max_order(config.max_order, config.max_order.min(9), config.thp);
        let cache_orders = cache::orders_served(&config);
        let entries = WorkerEntries { report: crate::report::thread_main, zero: crate::zero::thread_main };
        let shared = Shared::new(config, cache::new_allocator_id(), cache_orders, entries);
        let alloc = Allocator { shared: Arc::new(shared) };
        alloc.shared.grow(0, 0)?;
        alloc.start_workers();
        Ok(alloc)
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The largest block, in bytes.
    pub fn max_block(&self) -> usize {
        self.shared.max_block()
    }

    /// Allocate `size` bytes aligned to `align` (a power of two up to the largest block).
    ///
    /// Always inlined: the hit path is a few dozen instructions and no call, as a malloc's
    /// thread-cache hit; out of line it would also return its `Result` through memory.
    #[inline(always)]
    pub fn alloc(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        // The hit path (cache/): a plain request for an exact power-of-two block of a cached
        // order, served by the cache this thread used last. Everything else goes to `alloc_slow`.
        if flags.0 == 0 {
            if let (Some(order), Some(tc)) = (self.cached_order(size, align), cache::last(&self.shared)) {
                // `enter` written out rather than `inside`: a closure is a function of its own
                // that the compiler may leave out of line. Dropping `e` leaves the cache.
                let hit = match tc.enter() {
                    Some(e) => e.alloc_hit(&self.shared, order),
                    None => None,
                };
                if let Some((addr, state)) = hit {
                    // SAFETY: `state` is the first state byte of the block just handed out, an
                    // aligned block of `2^order` pages (`alloc_hit`).
                    unsafe { crate::arena::fill_block(state, 1 << order, PageState::Allocated) };
                    // SAFETY: `addr` is not zero.
                    return Ok(unsafe { NonNull::new_unchecked(addr.get() as *mut u8) });
                }
            }
        }
        self.alloc_slow(size, align, flags)
    }

    /// The order of the block the caches' hit path would serve for `size` and `align`: an exact
    /// power of two of pages, of a stacked order, aligned to its size at most.
    #[inline(always)]
    fn cached_order(&self, size: usize, align: usize) -> Option<u8> {
        // `size - 1` below the largest stacked block (0 wraps to above it), so `size >= 1`.
        let last = size.wrapping_sub(1);
        if last >= self.shared.hit.cache_hit_max_bytes {
            return None;
        }
        let npages = (last >> PAGE_SHIFT) + 1;
        // A bad alignment (0, not a power of two) goes to the locked path, which reports it.
        // (A page or less always fits: stated first, it folds away for a constant page alignment.)
        let aligned = align.is_power_of_two() && (align <= PAGE_SIZE || align <= npages << PAGE_SHIFT);
        (npages & (npages - 1) == 0 && aligned).then_some(npages.trailing_zeros() as u8)
    }

    #[inline(never)]
    fn alloc_slow(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        // Relaxed: the worker only needs to see it eventually; a load first keeps the line shared.
        if flags.contains(Flags::ZERO) && !self.shared.zero_requested.load(Ordering::Relaxed) {
            self.shared.zero_requested.store(true, Ordering::Relaxed);
            // The first one: dirty memory freed until now did not wake the zeroing worker.
            self.shared.wake_workers_after_free(self.shared.heap.lock());
        }
        if let Some(p) = self.alloc_cached(size, align, flags) {
            return Ok(p);
        }
        // Before the heap grows, this thread's own cache gives back what it holds.
        self.shared.alloc_locked(size, align, flags, &mut || cache::drain_current(&self.shared))
    }

    /// The block the caches would serve for `size` and `align`, as `(order, pages)`: the
    /// smallest block of a cached order that holds the request, aligned to its size at most. A
    /// request of fewer pages than the block leaves the rest as slack (cache/mod.rs, "Slack").
    #[inline]
    fn cache_shape(&self, size: usize, align: usize) -> Option<(u8, u32)> {
        let last = size.wrapping_sub(1);
        if last >= self.shared.hit.cache_max_bytes {
            return None;
        }
        let npages = ((last >> PAGE_SHIFT) + 1) as u32;
        let order = npages.next_power_of_two().trailing_zeros() as u8;
        let aligned = align.is_power_of_two() && (align <= PAGE_SIZE || align <= PAGE_SIZE << order);
        aligned.then_some((order, npages))
    }

    /// The fast path (`cache/`): a block of a cached order, without `LOCK` (whose bookkeeping
    /// needs the lock), from this thread's cache. `None`: take the locked path (which also
    /// reports bad requests); so does a request that the block this thread freed last there
    /// may hold (`cache/hot.rs`, the locked hot block).
    #[inline]
    fn alloc_cached(&self, size: usize, align: usize, flags: Flags) -> Option<NonNull<u8>> {
        if flags.contains(Flags::LOCK) {
            return None;
        }
        let (order, npages) = self.cache_shape(size, align)?;
        let cached = |tc: &cache::Entries<'_>| if tc.to_locked_hot(npages) { None } else { tc.alloc(&self.shared, order, npages, flags) };
        let addr = cache::current(&self.shared)?.inside(cached)??;
        // SAFETY: a block address is never null.
        Some(unsafe { NonNull::new_unchecked(addr as *mut u8) })
    }

    /// Free the live block that starts at `ptr` (always inlined, as `alloc`).
    #[inline(always)]
    pub fn free(&self, ptr: *mut u8) -> Result<(), Error> {
        self.free_checked(ptr as usize, None)
    }

    /// Free the live block at `ptr`, checking that it holds `size` bytes (page-rounded).
    #[inline(always)]
    pub fn free_sized(&self, ptr: *mut u8, size: usize) -> Result<(), Error> {
        self.free_checked(ptr as usize, Some(size))
    }

    #[inline(always)]
    fn free_checked(&self, addr: usize, size: Option<usize>) -> Result<(), Error> {
        // The hit path: a live block of a cached order goes to the cache this thread used last.
        if let Some(tc) = cache::last(&self.shared) {
            if let Some(e) = tc.enter() {
                let hit = e.free_hit(&self.shared, addr, size);
                drop(e);
                if hit {
                    return Ok(());
                }
            }
        }
        self.free_slow(addr, size)
    }

    /// The cache with the checks the hit path skips (attach, drain first), else the validated,
    /// locked path: anything that does not look exactly like a live cached-order block.
    #[inline(never)]
    fn free_slow(&self, addr: usize, size: Option<usize>) -> Result<(), Error> {
        if self.shared.hit.cache_orders > 0 {
            if let Some(tc) = cache::current(&self.shared) {
                match tc.inside(|tc| tc.free(&self.shared, addr, size)) {
                    Some(true) => return Ok(()),
                    Some(false) => {
                        // The cache did not take it: a block freed on the locked path, which the
                        // next request it can hold reuses there (`cache/hot.rs`).
                        let (arena, pages) = self.shared.free_locked_pages(addr, size)?;
                        tc.inside(|tc| tc.freed_locked(addr, arena, pages));
                        return Ok(());
                    }
                    None => {}
                }
            }
        }
        self.shared.free_locked(addr, size)
    }

    /// Free the live block at `ptr` whose pages the caller has already taken from the kernel's
    /// page tables (moved away by `mremap(MREMAP_DONTUNMAP)`, or `MADV_DONTNEED`): they read zero
    /// and are not resident, so they are listed `Reported` rather than `Dirty`. A locked block is
    /// freed as by `free` (its pages were resident).
    ///
    /// # Safety
    /// Every page of the block reads zero and is not resident (as the caller says): they are
    /// listed `Reported`, and a later `ZERO` request gets them without a memset, so a page that
    /// still held data would break the promise of `Flags::ZERO` that `alloc_zeroed` callers rely on.
    pub unsafe fn free_reported(&self, ptr: *mut u8) -> Result<(), Error> {
        // SAFETY: the caller's promise, passed on unchanged.
        unsafe { self.shared.free_reported(ptr as usize) }
    }

    /// Bytes usable in the live block at `ptr` (page-rounded), or `None` if `ptr` is not the start
    /// of a live block of this allocator.
    pub fn usable_size(&self, ptr: *const u8) -> Option<usize> {
        self.shared.usable_size(ptr as usize)
    }

    /// Whether `ptr` lies in one of this allocator's arenas (a range check, no lock).
    #[inline]
    pub fn owns(&self, ptr: *const u8) -> bool {
        let addr = ptr as usize;
        self.shared.view_of(addr).is_some()
    }

    /// Resize the live block at `ptr` in place to `new_size` bytes: shrinking gives the tail back,
    /// growing takes the free pages right after the block. `Ok(false)` when the pages after it are
    /// not free (the caller moves the block).
    pub fn resize_in_place(&self, ptr: *mut u8, new_size: usize) -> Result<bool, Error> {
        self.shared.resize_in_place(ptr as usize, new_size)
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        self.stats_of(&self.shared.heap.lock())
    }

    /// `stats`, if the allocator lock can be had within about 50 ms; `None` otherwise. For the
    /// exit paths of a program that may leave from inside the allocator (an `exit` in a signal
    /// handler that interrupted this thread in a call holding the lock): they must not wait for
    /// a lock their own thread holds.
    pub fn try_stats(&self) -> Option<Stats> {
        for _ in 0..50 {
            if let Some(h) = self.shared.heap.try_lock() {
                return Some(self.stats_of(&h));
            }
            crate::os::sleep_ns(1_000_000);
        }
        None
    }

    fn stats_of(&self, h: &Heap) -> Stats {
        let mut s = Stats::default();
        let mut counts = StateCounts::default();
        let mut free_pages = 0u64;
        for a in h.arenas[..h.narenas].iter().map(|a| a.as_ref().unwrap()) {
            for (c, row) in a.listed().blocks.iter().enumerate() {
                for (o, n) in row.iter().enumerate() {
                    s.free_blocks[c][o] += *n as u64;
                }
            }
            counts = counts.plus(a.listed().counts);
            free_pages += a.listed().pages;
            s.never_used_pages += a.never_used_pages() as u64;
            s.reserved_bytes += a.len as u64;
        }
        let c = &h.counters;
        s.arenas = h.narenas as u64;
        s.free_zeroed_pages = counts.zeroed as u64;
        s.free_reported_pages = counts.reported as u64;
        s.free_lazy_pages = counts.lazy as u64;
        s.free_dirty_pages = free_pages - (counts.zeroed + counts.reported + counts.lazy) as u64;
        s.isolated_pages = c.isolated_pages;
        s.live_blocks = c.live_blocks;
        s.alloc_calls = c.alloc_calls;
        s.free_calls = c.free_calls;
        s.zero_skipped_bytes = c.zero_skipped_bytes;
        s.zeroed_on_alloc_bytes = c.zeroed_on_alloc_bytes;
        s.reused_reported_bytes = c.reused_reported_bytes;
        s.locked_bytes = c.locked_bytes;
        s.reported_blocks_reused = c.reported_blocks_reused;
        s.zeroing_wasted_bytes = c.zeroed_wasted_bytes + h.reclaim.zeroed_then_reported_bytes;
        h.reclaim.fill(&mut s);
        s.cache_hits = c.cache_hits;
        s.cache_refills = c.cache_refills;
        s.cache_drains = c.cache_drains;
        s.cache_remote_drains = c.cache_remote_drains;
        cache::add_to_stats(h, self.shared.slack_held.load(Ordering::Relaxed), &mut s);
        // Free `Reported` pages below the arenas' `used_end` were either given back after use
        // or never touched; at most as many as were ever given back are the former.
        let below = s.free_reported_pages.saturating_sub(s.never_used_pages);
        let given_back = (h.reclaim.reported_bytes >> PAGE_SHIFT) + c.freed_reported_pages;
        s.never_used_pages += below.saturating_sub(given_back);
        s
    }

    /// The memfd behind each arena, for `Backing::Memfd` (another process maps it to share the
    /// memory): `(arena base address, fd)`.
    pub fn arena_fds(&self) -> Vec<(usize, i32)> {
        let h = self.shared.heap.lock();
        h.arenas[..h.narenas]
            .iter()
            .map(|a| a.as_ref().unwrap())
            .filter(|a| a.fd >= 0)
            .map(|a| (a.base, a.fd))
            .collect()
    }
}
