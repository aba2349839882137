//! The hot block: the block this thread freed last (of at least 64 KiB) serves its next request
//! that the block can hold, whatever the request's order, as glibc's top chunk does.
//!
//! Why. A loop `p = malloc(n); memset(p, 7, n); free(p)` with `n` on both sides of a power of
//! two (say 0.5-1.375 MiB) took, without it, a block of order 8 for the requests up to 1 MiB and
//! one of order 9 for the others, alternating at random: neither stayed in the CPU's caches, and
//! the program's own memset ran 35% slower than with glibc, which reuses one chunk (0.76x of its
//! calls per second at 1 MiB; at one fixed size, where one block is reused, 0.97x). Now the block
//! freed last serves the smaller requests too, with slack, and the loop stays in one region.
//!
//! What. A free of a block of at least `HOT_MIN_PAGES` on its way into the cache (the free hit
//! of a block of several pages, the out-of-line free, the free of a block with slack) stores its
//! entry word in `ThreadCache::hot`, on the line the free hit writes anyway (the one-page free
//! hit, the commonest, is told apart before and has no such test; 139 instructions a 4 KiB pair
//! as before, 252 a 64 KiB one instead of 248). It is a hint, never trusted: the out-of-line
//! allocation (`Entries::alloc`, for any request that is not an exact power of two of pages of a
//! stacked order, or not plain) looks at the block's record and serves the request from it only
//! if the block is still cached here, on top of the dirty stack of the order its record says
//! (so a block handed out since, drained, or taken back by the reporter's drain of an idle cache
//! is passed over: the owner's `hot` word needs no care from them), of an order larger than the
//! request's (or of its own, for a request of fewer pages than the block: the same block the
//! cache's top would give it, and what `Allocator::alloc_from_hot`, which takes no other block,
//! needs), and the request takes more than an eighth of it. The block is then handed out as
//! any block with slack (`hand_out_with_slack`): its record says `META_SLACK`, the slack keeps
//! its free states, and its free brings the whole block back (and makes it the hot block again).
//! A `ZERO` request keeps its preference for a `Zeroed` block of its own order (no memset at all).
//!
//! The locked hot block. A block the cache does not take (larger than its orders, or exact and
//! not a power of two) is freed on the locked path, where it stays whole as the unmerged block
//! or the best-fitting run for the next request. So that a loop of sizes on both sides of the
//! caches' largest order (4-11 MiB) does not alternate between a cached block and that run, the
//! thread notes the block larger than its caches' largest that it freed there (`locked_hot`:
//! where, the most pages it held there, and the pages of that free), and its next out-of-line
//! request, if of more than a quarter of those pages and no more than the place held, goes to
//! the locked path too. A run the caches could hold is not noted: a loop of 3-8.25 MiB, whose
//! few requests above 8 MiB sent the next one to the locked path, then stayed there for good
//! (each run freed there sent the next request there: 175 cache hits in 4,928 calls, 0.95-0.97x
//! of glibc with `calloc`; now 0.98x). A hint only: the locked path
//! places the request where it fits best (which the block's free left), and a small request,
//! not the loop's, keeps its cache.
//!
//! Large cached blocks before a request above the caches (`give_back_large_for`). The hot block
//! cannot serve a request larger than the caches' largest block, and the locked path cannot see
//! it: a loop of 3-8.25 MiB kept its cached 8 MiB block for most requests and took a run
//! elsewhere for the others. Such a request first gives this cache's large blocks back to the
//! lists, where the locked path's best run takes the block with the free memory beside it.
//!
//! The bound. A block serves requests of more than an eighth of it (its own order and the two
//! below), so its slack is under seven eighths of it, under seven times the request's pages (a
//! block served the usual way has slack under half of it, under the request). A quarter was
//! not enough: a loop whose sizes cross two powers of two (0.75-2.06 MiB) took two or three
//! blocks in turn and ran at 0.84-0.96x of glibc. Only the block freed last is served this way,
//! and the slack bound (`hit::slack_over`: one live block with slack per thread with a cache,
//! between one and two per CPU, and the high mark of slack per such block) holds for it too.

use super::*;
use super::hit::{settle_slack_unit, UNIT_PAGES};

/// Smallest block that becomes the hot block: 64 KiB (order 4), so that the hit paths of the
/// small blocks are untouched.
const HOT_MIN_PAGES: u32 = 16;

/// The smallest request below `limit` (a binding's threshold, or the largest small object) that
/// asks the hot block first (`Allocator::alloc_from_hot`): a quarter of `limit`, and no less
/// than the smallest hot block; `limit` itself when that leaves nothing below it. A block
/// served at `limit` or above holds `limit` at least, and the hot block serves requests of
/// more than an eighth of it, so a loop of sizes on both sides of `limit` (128-352 KiB around
/// 256 KiB) stays in the one block it frees and takes again, where two allocators (glibc and
/// fallow's page blocks, or a span's objects and page blocks) would write two regions in turn.
/// Requests from there to `limit` pay a look at that block (a few dozen instructions, against
/// a memset of 64 KiB or more).
pub const fn hot_from(limit: usize) -> usize {
    let q = limit / 4;
    let min = (HOT_MIN_PAGES as usize) << PAGE_SHIFT;
    let q = if q > min { q } else { min };
    if q < limit { q } else { limit }
}

impl Entries<'_> {
    /// A block of `n` pages at `addr` (arena `ai`) is being freed into this cache: if of at least
    /// `HOT_MIN_PAGES`, it becomes the hot block (a hint, checked before use).
    #[inline(always)]
    pub(super) fn note_hot(&self, addr: usize, ai: usize, n: u32) {
        if n >= HOT_MIN_PAGES {
            self.hot.set(Entry::new(addr, ai, false).word() as u64);
        }
    }

    /// Serve a request of `live` pages (of `order`, `2^(order-1) < live <= 2^order`) from the
    /// hot block, with slack, when it is still cached here and may serve it (see the top); the
    /// block's pages past `live` are slack. `None`: nothing changed, the caller takes a block of
    /// `order` as usual.
    #[inline]
    pub(super) fn alloc_hot(&self, a: &Arc<Shared>, order: u8, live: u32, flags: Flags) -> Option<usize> {
        // Too small for any hot block: no need to look at one (a refill of small blocks).
        if live <= HOT_MIN_PAGES / 8 {
            return None;
        }
        let e = Entry::from_word(self.hot.get() as usize)?;
        let v = a.view(e.arena());
        let (_, m) = v.record(e.addr());
        // SAFETY: `hot` holds the address and arena of a page a free of this thread found in
        // that arena of this allocator (`take_freed`, `take_freed_slack`), and arenas stay while
        // the allocator lives, so `m` is a record of a live arena; the load is atomic, whoever
        // holds the page now (the checks below tell whether it is still this cache's).
        let w = unsafe { HitWord::load(m) };
        let k = w.order() as usize;
        // Cached, of an order this cache serves with slack for the request (a larger one, or
        // the request's own with fewer pages: `alloc_from_hot`'s requests, which take no other
        // block), and the request more than an eighth of it.
        let larger = k > order as usize || (k == order as usize && (live as u64) < 1u64 << k);
        if w.tag() != Tag::Cached as u8 || !larger || k >= self.orders || live as u64 <= (1u64 << k) / 8 {
            return None;
        }
        if super::hit::slack_over(a, (1u32 << k) - live) {
            return None;
        }
        // Still this cache's, on top of its order's dirty stack (a cached block sits in exactly
        // one entry, invariant 1, so then the word above is this thread's to read and write).
        if self.dirty_top(k).map(|t| t.addr()) != Some(e.addr()) {
            return None;
        }
        if flags.contains(Flags::ZERO) && self.zeroed_on_top(order as usize) {
            return None;
        }
        let (e, mixed) = self.pop_dirty(k)?;
        let addr = self.hand_out_with_slack(a, e, mixed, m, w, k as u8, live, flags);
        if 1u32 << k > UNIT_PAGES {
            settle_slack_unit(a, e, live);
        }
        Some(addr)
    }

    /// The block at `addr` (in `arena`) of `pages` was just freed on the locked path by this
    /// thread (the cache did not take it: too large, exact, or not this cache's): note it as the
    /// locked hot block. Freed again where it was, it keeps the most pages it held there: the
    /// run a loop reuses is as long as its longest request.
    pub(crate) fn freed_locked(&self, addr: usize, arena: usize, pages: u32) {
        // Only a block larger than the caches' largest: a run they could hold (served on the
        // locked path at its real size) would keep every next request of such a loop there.
        if pages < HOT_MIN_PAGES || pages as u64 <= 1u64 << self.orders.saturating_sub(1) {
            return;
        }
        let e = Entry::new(addr, arena, false).word() as u64;
        let most = if self.locked_hot.get() == e { self.locked_hot_pages.get().max(pages as u64) } else { pages as u64 };
        self.locked_hot.set(e);
        self.locked_hot_pages.set(most);
        self.locked_hot_last.set(pages as u64);
    }

    /// Whether a request of `live` pages goes to the locked path because the block this thread
    /// freed there just before may hold it: the locked path then takes the best-fitting run,
    /// which that block's free left, rather than the cache a block elsewhere, and a loop of sizes
    /// on both sides of the caches' largest order stays in one region, as glibc's stays in its
    /// top chunk. Only the next request after such a free, and only one of more than a quarter
    /// of the pages freed (a small request is not the loop's, and goes to its cache), and at most the
    /// most pages the place held.
    #[inline]
    pub(crate) fn to_locked_hot(&self, live: u32) -> bool {
        let last = self.locked_hot_last.get();
        if last == 0 {
            return false;
        }
        self.locked_hot_last.set(0);
        live as u64 * 4 > last && live as u64 <= self.locked_hot_pages.get()
    }

    /// A request of `live` pages larger than the caches' largest block is about to take the
    /// locked path: if this cache holds large blocks (its one block an order, orders from
    /// `stacked` up) of more than a quarter of the request's pages in all, they go back to the
    /// lists first, under one hold of the lock. Why: a loop whose sizes cross the caches'
    /// largest order (say 3-8.25 MiB with 8 MiB cached) kept its cached 8 MiB block for the
    /// requests up to 8 MiB while those above it took a run elsewhere, so it wrote 16-20 MiB of
    /// memory in turn where glibc writes one chunk of 8.25 MiB: its memset ran at 11-34 GB/s
    /// instead of 46 (0.52-0.71x of glibc's calls a second on a 32 MiB L3). Listed, the block
    /// merges with the free blocks beside it, and the best-fitting run the locked path takes
    /// starts where the loop already writes; the next requests of the loop come back to that
    /// run (the locked hot block, and a refill's smallest aligned block).
    pub(crate) fn give_back_large_for(&self, a: &Arc<Shared>, live: u64) {
        let held = self.large_pages();
        if held == 0 || held * 4 <= live {
            return;
        }
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        self.obey_drain_request(a, &mut h, now);
        self.drain_large_locked(&mut h, now);
        a.wake_workers_after_free(h);
    }
}
