//! The public allocator: `Allocator`, a handle to one allocator's shared state (`heap::Shared`),
//! with the per-thread caches' hit paths inlined into `alloc` and `free` and everything else
//! passed down: to the thread's cache (`cache`), then to the locked paths (`heap`). `control`
//! holds the settings of the workers, `fork` and the checks for tests; `fork.rs` the registry of
//! the allocators locked around every `fork` (`FallowAlloc`'s and the C library's). The top of
//! the core's layers: it may import every module below and none imports it but `global`.

mod control;
pub(crate) mod fork;
mod sole;
pub use sole::{FreeSole, SpanMove};
#[cfg(test)]
mod tests;

use core::ptr::NonNull;
use std::sync::Arc;

use crate::cache;
use crate::config::Config;
use crate::error::Error;
use crate::flags::Flags;
use crate::heap::{Heap, Shared, WorkerEntries};
use crate::os::PAGE_SHIFT;
use crate::page::StateCounts;
use crate::slab::{Found, Freed, Keys, Slab, Span, SMALL_HOT_MAX, SMALL_OBJECT_MAX};
use crate::stats::Stats;

/// What `Allocator::free_hot_step` did with a pointer.
pub enum FreeHot<'a> {
    /// Freed (the calling thread's own small object).
    Done,
    /// Another thread's small object, checked, not yet freed: `RemoteFree::finish` frees it.
    Remote(RemoteFree<'a>),
    /// Nothing done: `free_cold` (or `free_any`) answers.
    Cold,
}

/// A free of another thread's small object that the hot path checked (`FreeHot::Remote`).
/// Two words, so that a binding passes it on in registers.
#[repr(C)]
pub struct RemoteFree<'a> {
    // The address first: it arrives in a free's first argument register and stays there for
    // the call of `finish`'s caller, where the span's word is passed second.
    addr: usize,
    span: &'a Span,
}

impl RemoteFree<'_> {
    /// Push the object back to its span's owner (the remote-free protocol), one call. An
    /// error (the immediate double free, an address outside the span) is found before
    /// anything changes, as `free_any`'s.
    ///
    /// # Safety
    /// `a` is the allocator whose `free_hot_step` gave this, or whose `span_map` gave the map
    /// whose `free_hot_sole` did (another allocator's slab would collect the span under the
    /// wrong lock).
    #[inline(always)]
    pub unsafe fn finish(self, a: &Allocator) -> Result<(), Error> {
        a.slab.free_remote_out(self.span, self.addr)
    }
}

/// A page allocator, with small objects on its pages (`malloc`). Cloning gives another handle
/// to the same allocator.
pub struct Allocator {
    pub(crate) shared: Arc<Shared>,
    /// The slab layer (small objects in spans of pages: `malloc`, `free_any`).
    pub(crate) slab: Arc<Slab>,
    /// The slab's `keys`, which the two hot paths read here, one load closer than the slab's.
    keys: Keys,
}

impl Clone for Allocator {
    fn clone(&self) -> Allocator {
        self.shared.clone_handle();
        Allocator { shared: self.shared.clone(), slab: self.slab.clone(), keys: self.keys.clone() }
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
        // The shared state is set up in its `Arc`'s memory (`Shared::init`: 12 KiB, too large
        // to build on the stack and move).
        let mut shared = Arc::<Shared>::new_uninit();
        let slot = Arc::get_mut(&mut shared).expect("a new Arc has one handle");
        // SAFETY: `slot` is the `Arc`'s own memory, valid for writes of a `Shared` and aligned.
        unsafe { Shared::init(slot.as_mut_ptr(), config, cache::new_allocator_id(), cache_orders, entries) };
        // SAFETY: `Shared::init` wrote every field.
        let shared = unsafe { shared.assume_init() };
        shared.grow(0, 0)?;
        let slab = Arc::new(Slab::new(shared.clone())?);
        let keys = slab.keys.clone();
        let alloc = Allocator { shared, slab, keys };
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
    /// thread-cache hit; out of line it would also return its `Result` through memory. The
    /// path itself is the cache layer's (`cache::alloc_pages`).
    #[inline(always)]
    pub fn alloc(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        cache::alloc_pages(&self.shared, size, align, flags)
    }

    /// A block of `size` bytes (16-aligned) from the block the calling thread freed last into
    /// its cache (the hot block), if that block is still cached there, larger than the
    /// request's pages and at most eight times them: `None` otherwise, with nothing done. For a
    /// binding that serves requests below a threshold elsewhere (the preload: glibc), so that a
    /// loop of sizes on both sides of its threshold stays in the one block it frees and takes
    /// again, as a loop above the threshold does. A block with slack: the slack bound holds for
    /// it as for any other. `Flags::ZERO` as for `alloc`; `Flags::LOCK` is never served here.
    pub fn alloc_from_hot(&self, size: usize, flags: Flags) -> Option<NonNull<u8>> {
        cache::alloc_from_hot(&self.shared, size, flags)
    }

    /// Free the live block that starts at `ptr` (always inlined, as `alloc`). A block of
    /// `alloc` only: an object of `malloc` goes to `free_any`.
    #[inline(always)]
    pub fn free(&self, ptr: *mut u8) -> Result<(), Error> {
        self.not_small(ptr as usize)?;
        cache::free_pages(&self.shared, ptr as usize, None)
    }

    /// `InvalidPointer` for an address in a span of small objects (with small objects on): the
    /// page calls (`free`, `free_sized`, `resize_in_place`) would take the first object of a
    /// span of a class with no colour (its address is the span's) for the span's live page
    /// block and free or cut it under the live span.
    #[inline(always)]
    fn not_small(&self, addr: usize) -> Result<(), Error> {
        if self.keys.on && matches!(self.slab.find(addr), Found::Span(_)) {
            return Err(Error::InvalidPointer { addr });
        }
        Ok(())
    }

    /// Free the live block at `ptr`, checking that it holds `size` bytes (page-rounded).
    #[inline(always)]
    pub fn free_sized(&self, ptr: *mut u8, size: usize) -> Result<(), Error> {
        self.not_small(ptr as usize)?;
        cache::free_pages(&self.shared, ptr as usize, Some(size))
    }

    /// The largest request `malloc` serves as a small object (64 KiB) when small objects are
    /// on (`Config::small_objects`); larger ones are page blocks.
    pub const SMALL_MAX: usize = SMALL_OBJECT_MAX;

    /// Allocate `size` bytes aligned to `align` (a power of two), as C's `malloc` / `calloc`
    /// (`Flags::ZERO`) / `aligned_alloc` do: with small objects on (`Config::small_objects`), a
    /// request of at most `SMALL_MAX` bytes (and an alignment that fits in it) is an object of
    /// a size class in a span of pages (the slab layer: per-thread heaps, no lock on the hot
    /// path); anything else, and everything with small objects off, is a page block as `alloc`
    /// serves it. `size` 0 is served as 1. Free it with `free_any`. What `FallowAlloc`, the C
    /// library's and the preload's malloc-like functions call.
    ///
    /// Only the slab's hot path is inline (no call, so the caller saves no register for it);
    /// a page block is one call (`alloc` keeps the page layer's hit path inline).
    #[inline(always)]
    pub fn malloc(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        // The hot path's sizes (the class table's), with the very compare the hot path makes
        // (the compiler merges the two); the larger small objects and page blocks in one call.
        if size <= SMALL_HOT_MAX && self.keys.on {
            return self.keys.malloc(&self.slab, size, align, flags);
        }
        self.malloc_cold(size, align, flags)
    }

    /// The hot path of `malloc` alone, for bindings that keep everything else out of line
    /// (the preload library): with small objects on, a request of at most 16 KiB (the class
    /// table's) of the natural alignment (16) popped off the calling thread's current span of its class,
    /// zeroed whole for `zero`; `None` when that is not all it takes (then call `malloc`, which
    /// answers every case). Inline, with no call but a memset for `zero`.
    ///
    /// With small objects off it always answers `None`, without a test of the setting: only the
    /// slab's slow path, which `malloc` reaches with small objects on alone, gives a thread a
    /// heap, and with none the pop finds nothing.
    #[inline(always)]
    pub fn malloc_hot(&self, size: usize, zero: bool) -> Option<NonNull<u8>> {
        self.keys.malloc_hot(size, zero)
    }

    /// The hot path of `free_any` alone: `true` if `ptr` was an object of a span of the first
    /// arena that the calling thread owns, freed with `free_any`'s checks (the object's start,
    /// handed out, not the one freed last, a span with live objects) and nothing else to do;
    /// `false`: nothing was done, call `free_any` (or `free_cold`), which answers every case.
    /// Inline, with no call.
    #[inline(always)]
    pub fn free_hot(&self, ptr: *mut u8) -> bool {
        matches!(self.free_hot_step(ptr), FreeHot::Done)
    }

    /// `free_hot`, and for another thread's object (or one freed by a thread with no heap of
    /// this allocator) that passed the same checks, `FreeHot::Remote`: nothing was done yet,
    /// and `RemoteFree::finish` (one call) pushes it, without the second lookup and checks of
    /// `free_cold`. A binding keeps its hot path without a frame by making each outcome's next
    /// step its last (a return, or a call in tail position). Inline, with no call.
    ///
    /// For bindings (`binding_support::FreeHot`), hidden from the documentation as that module.
    #[doc(hidden)]
    #[inline(always)]
    pub fn free_hot_step(&self, ptr: *mut u8) -> FreeHot<'_> {
        let addr = ptr as usize;
        match self.keys.first.find(addr) {
            // SAFETY: `s` is what the page map holds for `addr`'s page, just read by this
            // thread (`SpanMap::find`).
            Some(s) => match unsafe { Slab::free_local(&self.slab, s, addr) } {
                // (`free_local` makes the move itself: no `Moved`.)
                Freed::Done | Freed::Moved => FreeHot::Done,
                Freed::Remote => FreeHot::Remote(RemoteFree { span: s, addr }),
                Freed::Not => FreeHot::Cold,
            },
            None => FreeHot::Cold,
        }
    }

    /// `malloc` past its hot path: every case, as `malloc`, without trying the hot path again
    /// (`malloc`'s own out-of-line part for sizes above the hot path's, and a binding's whose
    /// call of `malloc_hot` found nothing).
    #[inline(never)]
    pub fn malloc_cold(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        if size <= SMALL_OBJECT_MAX && self.keys.on {
            return self.slab.malloc_slow(size, align, flags);
        }
        self.alloc(size.max(1), align, flags)
    }

    /// `free_any` past its hot path, for a binding whose own call of `free_hot` returned
    /// `false`, with a pointer that may not be this allocator's: `Ok(false)` if it lies in none
    /// of its arenas (nothing done: the caller's other allocator owns it), else what `free_any`
    /// answers (`Ok(true)`: freed). One lookup of the pointer answers both, where `owns` and
    /// then `free_any` would make two.
    #[inline(never)]
    pub fn free_cold(&self, ptr: *mut u8) -> Result<bool, Error> {
        let addr = ptr as usize;
        match self.slab.find(addr) {
            Found::Span(s) => self.slab.free_in(s, addr).map(|()| true),
            Found::Pages => cache::free_pages(&self.shared, addr, None).map(|()| true),
            Found::Foreign => Ok(false),
        }
    }

    /// Free what `malloc` (or `alloc`) returned: a small object goes back to its span, a page
    /// block as by `free`. A pointer inside an object, one never handed out, and an object freed
    /// twice in a row (at least, as glibc's immediate double free) are `InteriorPointer`,
    /// `InvalidPointer` and `DoubleFree`, found before anything changes.
    ///
    /// Only the owner's plain free of an object is inline (no call, so the caller saves no
    /// register for it): every other case, page blocks included, is one call (`free` keeps the
    /// page layer's hit path inline, for callers that know small objects are off).
    #[inline(always)]
    pub fn free_any(&self, ptr: *mut u8) -> Result<(), Error> {
        // Another thread's object takes `free_any_cold` too (`free_hot_step`'s third outcome
        // here cost the owner's pair one instruction in `slab_ring`, 88.9 -> 89.9).
        if self.free_hot(ptr) {
            return Ok(());
        }
        self.free_any_cold(ptr)
    }

    /// `free_any` past its hot path (every case but the owner's plain free of an object), also
    /// for a binding whose own call of `free_hot_step` answered `FreeHot::Cold`: no second
    /// lookup in the first arena's page map. `free_cold`, with a pointer outside every arena
    /// an `InvalidPointer`, as the page layer calls it.
    #[doc(hidden)]
    #[inline(never)]
    pub fn free_any_cold(&self, ptr: *mut u8) -> Result<(), Error> {
        if self.free_cold(ptr)? {
            Ok(())
        } else {
            Err(Error::InvalidPointer { addr: ptr as usize })
        }
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

    /// A small object's class size, if `ptr` is the start of a small object handed out at some
    /// time (whether it is still live is not checked, as for `usable_size`); `None` for anything
    /// else, page blocks included. `FallowAlloc`'s `realloc` keeps such an object in place while
    /// the new size fits its class; the C library's `fallow_free_sized` and
    /// `fallow_resize_in_place` answer for small objects by it.
    pub fn small_usable_size(&self, ptr: *const u8) -> Option<usize> {
        let addr = ptr as usize;
        match self.slab.find(addr) {
            Found::Span(s) => self.slab.usable_size_in(s, addr),
            _ => None,
        }
    }

    /// Bytes usable at `ptr`: a small object's class size, a block's size (page-rounded); `None`
    /// if `ptr` is neither the start of a small object nor of a live block of this allocator.
    pub fn usable_size(&self, ptr: *const u8) -> Option<usize> {
        let addr = ptr as usize;
        match self.slab.find(addr) {
            Found::Span(s) => self.slab.usable_size_in(s, addr),
            _ => self.shared.usable_size(addr),
        }
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
        self.not_small(ptr as usize)?;
        self.shared.resize_in_place(ptr as usize, new_size)
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats_of(&self.shared.heap.lock());
        // After the allocator lock is released: `before_fork` takes the slab's lock first.
        self.slab.add_to_stats(&mut s);
        s
    }

    /// `stats`, if the allocator lock can be had within about 50 ms; `None` otherwise. For the
    /// exit paths of a program that may leave from inside the allocator (an `exit` in a signal
    /// handler that interrupted this thread in a call holding the lock): they must not wait for
    /// a lock their own thread holds.
    pub fn try_stats(&self) -> Option<Stats> {
        for _ in 0..50 {
            if let Some(h) = self.shared.heap.try_lock() {
                let mut s = self.stats_of(&h);
                drop(h);
                // As in `stats`; a slab lock held by this thread (an exit from inside the slab)
                // is not waited for either.
                if !self.slab.try_add_to_stats(&mut s) {
                    return None;
                }
                return Some(s);
            }
            crate::os::sleep_ns(1_000_000);
        }
        None
    }

    fn stats_of(&self, h: &Heap) -> Stats {
        let mut s = Stats::default();
        let mut counts = StateCounts::default();
        let mut free_pages = 0u64;
        for a in h.arenas.iter() {
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
        s.arenas = h.arenas.len() as u64;
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
        s.zero_unwritten_bytes = c.zero_unwritten_bytes;
        s.reused_reported_bytes = c.reused_reported_bytes;
        s.locked_bytes = c.locked_bytes;
        s.reported_blocks_reused = c.reported_blocks_reused;
        s.zeroing_wasted_bytes = c.zeroed_wasted_bytes + h.reclaim.zeroed_then_reported_bytes;
        h.reclaim.fill(&mut s);
        s.cache_hits = c.cache_hits;
        s.cache_refills = c.cache_refills;
        s.cache_drains = c.cache_drains;
        s.cache_remote_drains = c.cache_remote_drains;
        cache::add_to_stats(h, self.shared.slack_held.pages(), &mut s);
        // Free `Reported` pages below the arenas' `used_end` were either given back after use
        // or never touched; at most as many as were ever given back are the former.
        let below = s.free_reported_pages.saturating_sub(s.never_used_pages);
        let given_back = ((h.reclaim.reported_bytes + h.reclaim.zeroing_unwritten_bytes) >> PAGE_SHIFT) + c.freed_reported_pages;
        s.never_used_pages += below.saturating_sub(given_back);
        s
    }

    /// The memfd behind each arena, for `Backing::Memfd` (another process maps it to share the
    /// memory): `(arena base address, fd)`.
    pub fn arena_fds(&self) -> Vec<(usize, i32)> {
        let h = self.shared.heap.lock();
        h.arenas
            .iter()
            .filter(|a| a.fd >= 0)
            .map(|a| (a.base, a.fd))
            .collect()
    }
}
