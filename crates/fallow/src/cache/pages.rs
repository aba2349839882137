//! The page path as one call: a block taken from, or given back to, the calling thread's cache,
//! else the locked allocator. `Allocator::alloc` / `free` are these functions (inlined: the hit
//! paths stay a few dozen instructions and no call), and the slab layer above takes its spans
//! through them, so that a span is served exactly as a page block of its size would be.

use core::num::NonZeroUsize;
use core::ptr::NonNull;

use super::*;
use crate::error::Error;
use crate::os::PAGE_SIZE;
use crate::page::GranuleStates;

/// A block of `size` bytes aligned to `align`, as `Allocator::alloc` serves it: the hit path
/// (a plain request for an exact power-of-two block of a cached order, from the cache this
/// thread used last), else `alloc_pages_slow`.
///
/// Always inlined: the hit path is a few dozen instructions and no call, as a malloc's
/// thread-cache hit; out of line it would also return its `Result` through memory.
#[inline(always)]
pub(crate) fn alloc_pages(s: &Arc<Shared>, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
    if flags.0 == 0 {
        if let (Some(order), Some(tc)) = (cached_order(s, size, align), last(s)) {
            // `enter` written out rather than `inside`: a closure is a function of its own
            // that the compiler may leave out of line. Dropping `e` leaves the cache.
            let hit: Option<(NonZeroUsize, *const AtomicU8)> = match tc.enter() {
                Some(e) => e.alloc_hit(s, order),
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
    alloc_pages_slow(s, size, align, flags)
}

/// The order of the block the caches' hit path would serve for `size` and `align`: an exact
/// power of two of pages, of a stacked order, aligned to its size at most.
#[inline(always)]
fn cached_order(s: &Shared, size: usize, align: usize) -> Option<u8> {
    // `size - 1` below the largest stacked block (0 wraps to above it), so `size >= 1`.
    let last = size.wrapping_sub(1);
    if last >= s.hit.cache_hit_max_bytes {
        return None;
    }
    let npages = (last >> PAGE_SHIFT) + 1;
    // A bad alignment (0, not a power of two) goes to the locked path, which reports it.
    // (A page or less always fits: stated first, it folds away for a constant page alignment.)
    let aligned = align.is_power_of_two() && (align <= PAGE_SIZE || align <= npages << PAGE_SHIFT);
    (npages & (npages - 1) == 0 && aligned).then_some(npages.trailing_zeros() as u8)
}

/// Everything but the hit path: the cache's out-of-line paths, then the locked path.
#[inline(never)]
pub(crate) fn alloc_pages_slow(s: &Arc<Shared>, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
    note_zero_request(s, flags);
    if let Some(p) = alloc_cached(s, size, align, flags) {
        return Ok(p);
    }
    // Larger than the caches' largest block: this thread's large cached blocks go back first,
    // where the locked path's run may take them (`cache/hot.rs`).
    if size > s.hit.cache_max_bytes && s.hit.cache_orders > 0 {
        if let Some(tc) = last(s) {
            tc.inside(|tc| tc.give_back_large_for(s, (size >> PAGE_SHIFT) as u64));
        }
    }
    // Before memory is faulted in or the heap grows, this thread's own cache gives back what it
    // holds.
    s.alloc_locked(size, align, flags, &mut OwnCache(s))
}

/// A block from the locked path alone, never from a per-thread cache (which then keeps no
/// batch of its order either): the slab's spans, which the slab keeps spares of itself and
/// gives back on the locked path (docs/design.md, "Spans and the page caches"). As on the
/// locked path of `alloc_pages_slow`, this thread's own cache gives back what it holds before
/// memory is faulted in. `size` is a power of two, the block aligned to it; with the states its
/// pages had, by granules of `2^shift` pages (`Shared::alloc_span_locked`).
pub(crate) fn alloc_span_uncached(s: &Arc<Shared>, size: usize, shift: u32, flags: Flags) -> Result<(NonNull<u8>, GranuleStates), Error> {
    note_zero_request(s, flags);
    s.alloc_span_locked(size, shift, flags, &mut OwnCache(s))
}

/// A block from the calling thread's hot block alone (`cache/hot.rs`), with slack, if that
/// block is still cached there and may serve `size` bytes (16-aligned, as every block is);
/// `None`: nothing was done or asked (no refill, no lock). For a binding that sends requests
/// below its threshold elsewhere, so that a loop of sizes on both sides of the threshold stays
/// in the one block it frees and takes again.
#[inline(never)]
pub(crate) fn alloc_from_hot(s: &Arc<Shared>, size: usize, flags: Flags) -> Option<NonNull<u8>> {
    if flags.contains(Flags::LOCK) || s.hit.cache_orders == 0 {
        return None;
    }
    let (order, npages) = cache_shape(s, size, PAGE_SIZE)?;
    let addr = last(s)?.inside(|tc| tc.alloc_hot(s, order, npages, flags))??;
    note_zero_request(s, flags);
    // SAFETY: a block address is never null.
    Some(unsafe { NonNull::new_unchecked(addr as *mut u8) })
}

/// The first `ZERO` request: until then the zeroing worker zeroes nothing but the populated
/// reserve, and dirty memory freed did not wake it.
#[inline(always)]
fn note_zero_request(s: &Arc<Shared>, flags: Flags) {
    // Relaxed: the worker only needs to see it eventually; a load first keeps the line shared.
    if flags.contains(Flags::ZERO) && !s.zero_requested.load(Relaxed) {
        s.zero_requested.store(true, Relaxed);
        s.wake_workers_after_free(s.heap.lock());
    }
}

/// The calling thread's cache, as the locked path may ask it back (`heap::Reclaim`).
struct OwnCache<'a>(&'a Arc<Shared>);

impl crate::heap::Reclaim for OwnCache<'_> {
    /// The cache this thread used last, if it is of this allocator (else 0: nothing is asked
    /// back before memory is faulted in).
    fn held_pages(&mut self) -> u64 {
        last(self.0).map_or(0, |c| c.pages.get())
    }
    fn give_back(&mut self) -> bool {
        drain_current(self.0)
    }
}

/// The block the caches would serve for `size` and `align`, as `(order, pages)`: the
/// smallest block of a cached order that holds the request, aligned to its size at most. A
/// request of fewer pages than the block leaves the rest as slack (cache/mod.rs, "Slack").
#[inline]
fn cache_shape(s: &Shared, size: usize, align: usize) -> Option<(u8, u32)> {
    let last = size.wrapping_sub(1);
    if last >= s.hit.cache_max_bytes {
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
fn alloc_cached(s: &Arc<Shared>, size: usize, align: usize, flags: Flags) -> Option<NonNull<u8>> {
    if flags.contains(Flags::LOCK) {
        return None;
    }
    let (order, npages) = cache_shape(s, size, align)?;
    let cached = |tc: &Entries<'_>| if tc.to_locked_hot(npages) { None } else { tc.alloc(s, order, npages, flags) };
    let addr = current(s)?.inside(cached)??;
    // SAFETY: a block address is never null.
    Some(unsafe { NonNull::new_unchecked(addr as *mut u8) })
}

/// Free the live block at `addr` (checking that it holds `size` bytes, page-rounded, when
/// given), as `Allocator::free` does: the hit path into the cache this thread used last, else
/// `free_pages_slow`. Always inlined, as `alloc_pages`.
#[inline(always)]
pub(crate) fn free_pages(s: &Arc<Shared>, addr: usize, size: Option<usize>) -> Result<(), Error> {
    if let Some(tc) = last(s) {
        if let Some(e) = tc.enter() {
            let hit = e.free_hit(s, addr, size);
            drop(e);
            if hit {
                return Ok(());
            }
        }
    }
    free_pages_slow(s, addr, size)
}

/// The cache with the checks the hit path skips (attach, drain first), else the validated,
/// locked path: anything that does not look exactly like a live cached-order block.
#[inline(never)]
pub(crate) fn free_pages_slow(s: &Arc<Shared>, addr: usize, size: Option<usize>) -> Result<(), Error> {
    if s.hit.cache_orders > 0 {
        if let Some(tc) = current(s) {
            match tc.inside(|tc| tc.free(s, addr, size)) {
                Some(true) => return Ok(()),
                Some(false) => {
                    // The cache did not take it: a block freed on the locked path, which the
                    // next request it can hold reuses there (`cache/hot.rs`).
                    let (arena, pages) = s.free_locked_pages(addr, size)?;
                    tc.inside(|tc| tc.freed_locked(addr, arena, pages));
                    return Ok(());
                }
                None => {}
            }
        }
    }
    s.free_locked(addr, size)
}
