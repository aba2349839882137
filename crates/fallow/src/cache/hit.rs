//! The hit paths of a thread's cache: `alloc_hit` and `free_hit` (no lock, no call, no atomic
//! read-modify-write), their out-of-line forms that may refill or drain first, and the slack
//! path (a request of fewer pages than its cached block).

use super::*;
use core::num::NonZeroUsize;
use crate::page::META_SLACK_MIXED;


impl Entries<'_> {

    /// The hit path of a plain allocation (no flags): the block on top of the dirty stack of
    /// `order`, when there is one, all of its pages `Dirty` and still `Cached`. No call, no lock,
    /// no read-modify-write; `None` (nothing changed): take `alloc`. Returns the block and its
    /// first state byte: the caller marks its pages `Allocated` (`arena::fill_block`) after
    /// `leave`, since the block is then live and off the cache, its state bytes its owner's as
    /// those of any live block, and the worker's drain touches only blocks in the entries.
    #[inline(always)]
    pub(crate) fn alloc_hit(&self, a: &Arc<Shared>, order: u8) -> Option<(NonZeroUsize, *const AtomicU8)> {
        let o = order as usize;
        debug_assert!(o < self.stacked);
        // SAFETY: `order` is a stacked order (`cached_order` checked it against
        // `cache_hit_max_bytes`), below `self.stacked <= self.orders`, the stacks in use.
        let s = unsafe { self.stacks.get_unchecked(o) };
        let nd = s.ndirty.get();
        if nd == 0 {
            return None;
        }
        debug_assert!(nd <= s.cap as u64);
        // SAFETY: `nd - 1` is below the dirty stack's size, so `first + nd - 1` is one of this
        // order's entries.
        let e = unsafe { *s.first.add(nd as usize - 1) };
        // A block of the first arena, all of its pages `Dirty`: the arena's view is then a
        // constant, not a load indexed by the entry (stack.rs, "Dependencies"). The others take
        // `alloc`.
        if !e.plain_in_first() {
            return None;
        }
        let v = a.view(0);
        let m = v.meta_of(e.plain_addr().get());
        // SAFETY: an entry's block lies in the arena of its entry (invariant 1), the first one,
        // so `m` is a record of that live arena.
        let w = unsafe { HitWord::load(m) };
        if w.tag() != Tag::Cached as u8 {
            return None;
        }
        s.ndirty.set(nd - 1);
        // `hand_out` with this order's word, which the block's is once live
        // (`HitWord::alloc_word`).
        // SAFETY: `m` is the record of the block just popped, in a live arena.
        unsafe { s.alloc_word.store(m) };
        self.pages.sub(s.npages);
        self.alloc_hits.add(1);
        Some((e.plain_addr(), v.state_of(e.plain_addr().get())))
    }

    /// A block of order `o` popped from the cache becomes live: its record gets `live` (the
    /// word of a live block, exact or with slack), and the counters say so.
    #[inline(always)]
    pub(super) fn hand_out(&self, m: *mut BlockMeta, live: HitWord, o: usize) {
        // SAFETY: `m` is the record of the block just popped, in a live arena.
        unsafe { live.store(m) };
        self.sub_pages(o, 1 << o);
        self.alloc_hits.add(1);
    }

    /// Serve a request of `live` pages (`2^(order-1) < live <= 2^order`) with a block of `order`
    /// from the cache, refilling it when empty, and prepare it for `flags` (no `LOCK`). A request
    /// of fewer pages than the block gets the whole block, its pages past `live` as slack (see
    /// "Slack" at the top). `None`: the free lists are empty too.
    #[inline(never)]
    pub(crate) fn alloc(&self, a: &Arc<Shared>, order: u8, live: u32, flags: Flags) -> Option<usize> {
        let o = order as usize;
        let n = 1u32 << order;
        debug_assert!(live <= n && (live > n / 2 || n == 1));
        let zero = flags.contains(Flags::ZERO);
        if let Some(addr) = self.alloc_hot(a, order, live, flags) {
            return Some(addr);
        }
        if slack_over(a, n - live) {
            return None;
        }
        loop {
            let (e, mixed) = match self.pop(o, zero) {
                Some(x) => x,
                None => self.alloc_slow(a, order, live, zero)?,
            };
            let v = a.view(e.arena());
            let (pfn, m) = v.record(e.addr());
            // SAFETY: `m` comes from `record` of an entry's address in its own arena (invariant 1), so
            // it is a record of that live arena's metadata array.
            let w = unsafe { HitWord::load(m) };
            if w.tag() != Tag::Cached as u8 {
                // Taken by a racing double free elsewhere: forget the entry (see the top).
                self.sub_pages(o, n as u64);
                continue;
            }
            if live < n {
                let addr = self.hand_out_with_slack(a, e, mixed, m, w, order, live, flags);
                if n > UNIT_PAGES {
                    settle_slack_unit(a, e, live);
                }
                return Some(addr);
            }
            self.hand_out(m, self.stacks[o].alloc_word, o);
            if flags.0 == 0 && !e.mixed() {
                v.states().fill(pfn, n, PageState::Allocated);
                return Some(e.addr());
            }
            return Some(self.alloc_prepare(a, e, mixed.counts(), pfn, n, flags));
        }
    }

    /// `alloc`'s hand-out of the cached block `e` (record `m`, word `w`) of `order` for a request
    /// of `live` pages, fewer than the block's: the block becomes live with the rest as slack,
    /// whose pages keep their free states.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub(super) fn hand_out_with_slack(&self, a: &Arc<Shared>, e: Entry, mixed: Mixed, m: *mut BlockMeta, w: HitWord, order: u8, live: u32, flags: Flags) -> usize {
        let n = 1u32 << order;
        let v = a.view(e.arena());
        let (pfn, _) = v.record(e.addr());
        // The slack's counts (this thread owns the block's state bytes now): none but `Dirty`
        // pages in a block that is not mixed; the record says whether there are others, so that
        // the free reads them only then. The entry's first `dirty_below` pages are `Dirty`: the
        // live pages past them are counted instead of the slack when they are fewer.
        let known = mixed.dirty_below as u32;
        let slack = if !e.mixed() {
            StateCounts::default()
        } else if live <= known {
            mixed.counts()
        } else if live - known < n - live {
            mixed.counts().minus(v.states().count(pfn + known, live - known))
        } else {
            v.states().count(pfn + live, n - live)
        };
        if slack != StateCounts::default() {
            // Kept in the record's counts, which no path reads while the block is live: the
            // free of a block of a unit or less takes them from there (`take_freed_slack`).
            // SAFETY: `m` is the block's record, in a live arena (the caller's `record`).
            unsafe { &*m }.set_counts(slack);
        }
        self.hand_out(m, w.handed_out_with_slack(order, live, slack != StateCounts::default()), order as usize);
        a.slack_held.add(n - live);
        // The live part's counts: the block's, less the slack's.
        let counts = if e.mixed() { mixed.counts().minus(slack) } else { StateCounts::default() };
        if flags.0 == 0 && counts == StateCounts::default() {
            v.states().fill(pfn, live, PageState::Allocated);
            return e.addr();
        }
        self.alloc_prepare(a, e, counts, pfn, live, flags)
    }

    /// The hit's tail for a mixed block or a request with flags: count, then `prepare`.
    #[inline(never)]
    pub(super) fn alloc_prepare(&self, a: &Arc<Shared>, e: Entry, counts: StateCounts, pfn: u32, n: u32, flags: Flags) -> usize {
        let ev = &self.events;
        if counts.reported + counts.lazy != 0 {
            ev.reused_reported_bytes.add(((counts.reported + counts.lazy) as u64) << PAGE_SHIFT);
        }
        if flags.contains(Flags::ZERO) {
            let memset = counts.needs_zeroing(n) as u64;
            ev.zeroed_on_alloc_bytes.add(memset << PAGE_SHIFT);
            ev.zero_skipped_bytes.add((n as u64 - memset) << PAGE_SHIFT);
        }
        let p = Placed { arena: e.arena(), taken: Taken { pfn, npages: n, counts }, addr: e.addr(), clear_written_only: false };
        // Without LOCK, `prepare` cannot fail.
        let _ = a.prepare(&p, flags);
        e.addr()
    }

    /// Empty stacks: refill (obeying a drain request first), pop again.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slow(&self, a: &Arc<Shared>, order: u8, live: u32, zero: bool) -> Option<(Entry, Mixed)> {
        self.refill(a, order, live, zero);
        self.pop(order as usize, zero)
    }

    /// The hit path of `free`: as `free`, but `false` (nothing changed) also when the cache must
    /// first drain (over its high mark, a full stack, a drain request). No call, no lock.
    #[inline(always)]
    pub(crate) fn free_hit(&self, a: &Arc<Shared>, addr: usize, size: Option<usize>) -> bool {
        self.take_freed::<false>(a, addr, size)
    }

    /// Take the live block at `addr` into the cache if it is exactly a live, unlocked block of a
    /// cached order (and of `size`, if given), draining first if needed. `false`: the caller
    /// takes the validated path.
    #[inline(never)]
    pub(crate) fn free(&self, a: &Arc<Shared>, addr: usize, size: Option<usize>) -> bool {
        self.take_freed::<true>(a, addr, size)
    }

    /// Whether a free of `n` pages into the stack `s` of an order, `large` or stacked, must
    /// first drain: a stacked order's pages over the high mark (`limit` leaves the large blocks
    /// out), a full stack, or a drain request this cache has not obeyed. (`large` from the
    /// caller: the hit path knows its order is stacked without reading `stacked`'s line.)
    #[inline(always)]
    pub(super) fn needs_room(&self, a: &Arc<Shared>, s: &Stack, large: bool, n: u32) -> bool {
        self.needs_room_at::<true>(a, s, large, n, s.ndirty.get(), self.pages.get())
    }

    /// `needs_room` with the dirty stack's size `nd` and the pages held `pages` already loaded
    /// (the free hit stores from them after: an atomic is loaded again at each `get`). The
    /// free hit (`GENERATION` false) learns of a drain request from its cache's `drain_asked`,
    /// on the line it already holds; the out-of-line paths compare the generations, as
    /// `obey_drain_request` does under the lock.
    #[inline(always)]
    fn needs_room_at<const GENERATION: bool>(&self, a: &Arc<Shared>, s: &Stack, large: bool, n: u32, nd: u64, pages: u64) -> bool {
        (!large && pages + n as u64 > self.limit.get())
            || nd == s.dirty_max.get()
            || if GENERATION { a.hit.drain_generation.load(Relaxed) != self.seen_generation.get() } else { self.drain_asked.load(Relaxed) != 0 }
    }

    /// `free` of a live block with slack (`w`, its record `m`, at `addr` in arena `ai`): the whole
    /// aligned block comes back into the cache, its live pages `Dirty`, its slack pages in the
    /// states they kept (a mixed entry when some are not `Dirty`). `false`: not a block this
    /// cache takes (the caller takes the validated path).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub(super) fn take_freed_slack(&self, a: &Arc<Shared>, ai: usize, v: &ArenaView, addr: usize, m: *mut BlockMeta, w: HitWord, size: Option<usize>) -> bool {
        let o = w.order() as usize;
        let live = w.npages();
        let page = (addr >> PAGE_SHIFT) as u32;
        if o >= self.orders || page & ((1u32 << o) - 1) != 0 || live >= 1 << o || live == 0 {
            return false;
        }
        if size.is_some_and(|size| size.div_ceil(1 << PAGE_SHIFT) != live as usize) {
            return false;
        }
        let n = 1u32 << o;
        if self.needs_room(a, &self.stacks[o], self.large(o), n) {
            self.make_room(a, o);
        }
        let (pfn, _) = v.record(addr);
        let states = v.states();
        // The slack's pages kept their free states while the block was live; this thread owns
        // the block, so the counts are read without the lock (only when some are not `Dirty`,
        // `META_SLACK_MIXED`): from the record, where the hand-out left them, for a block of a
        // unit or less; a larger one's hand-out may have settled its slack's unit after that
        // (`settle_slack_unit`), so its pages are counted. The live pages become `Dirty`.
        let slack = if w.flags() & META_SLACK_MIXED == 0 {
            StateCounts::default()
        } else if n <= UNIT_PAGES {
            // SAFETY: `m` is the block's record (the caller found it in arena `ai`).
            unsafe { &*m }.counts()
        } else {
            states.count(pfn + live, n - live)
        };
        // SAFETY: `m` is the block's record (the caller found it in arena `ai`).
        unsafe { self.stacks[o].freed_word.store(m) };
        self.push_known(o, addr, ai, slack, live);
        self.note_hot(addr, ai, n);
        self.add_pages(o, n as u64);
        a.slack_held.sub(n - live);
        self.free_hits.add(1);
        states.fill(pfn, live, PageState::Dirty);
        if self.large(o) {
            self.large_freed(a);
        }
        true
    }

    /// After a large block came into the cache: this thread is active (it answers the zeroing
    /// worker's request for idle threads' large blocks), and the worker learns of the block.
    #[inline(never)]
    fn large_freed(&self, a: &Arc<Shared>) {
        self.seen_large.set(a.large_generation.load(Relaxed));
        a.note_large_cached();
    }

    /// `free_hit` (`MAY_DRAIN` false) and `free` (true): the same checks; only `free` may call
    /// out to drain.
    #[inline(always)]
    pub(super) fn take_freed<const MAY_DRAIN: bool>(&self, a: &Arc<Shared>, addr: usize, size: Option<usize>) -> bool {
        // The hit path looks in the first arena only, which holds most blocks (its default size
        // is the physical memory); `free` looks in all.
        let found = if MAY_DRAIN {
            if addr & ((1 << PAGE_SHIFT) - 1) != 0 {
                return false;
            }
            a.view_of(addr)
        } else {
            a.first_page_of(addr).map(|v| (0, v))
        };
        let Some((ai, v)) = found else { return false };
        let m = v.meta_of(addr);
        // SAFETY: `addr` is a page of arena `ai` (`view_of`, or `first_page_of` for arena 0), so
        // `m` is one of its records.
        let w = unsafe { HitWord::load(m) };
        // On the hit path, a live block of one page (the commonest) is told by one compare of
        // its word: then nothing else needs checking (one page is aligned and of order 0,
        // stacked in every cache: `orders_served`), and its stack is order 0's, at a constant
        // offset.
        if !MAY_DRAIN && w.live_unlocked_page() {
            if size.is_some_and(|size| size.div_ceil(1 << PAGE_SHIFT) != 1) {
                return false;
            }
            debug_assert!(self.stacked >= 1);
            return self.push_freed::<false>(a, &self.stacks[0], v, addr, ai, m, 1, false);
        }
        if !w.live_unlocked_exact() {
            // A block with slack, whatever its page count (a power of two too, when served from
            // a larger hot block): the out-of-line path takes it.
            return MAY_DRAIN && w.live_unlocked_slack() && self.take_freed_slack(a, ai, v, addr, m, w, size);
        }
        let n = w.npages();
        // A block of 64 KiB or more becomes the hot block (hot.rs), a hint checked before use,
        // so set before the checks below: if the block does not come into the cache after all,
        // it is passed over. (Here, not with the push: there the hit path, the one-page free's
        // too, needed one more register, saved and restored at every call.)
        self.note_hot(addr, ai, n);
        // A power of two of pages (`n & (n - 1)`) starting on a multiple of its size (the page
        // frame's low bits: the arena is aligned to its largest block, which is at least as
        // large as any live block of it), no larger than the largest cached block (0 wraps to
        // above it); on the hit path, the largest stacked one (a large block takes `free`).
        let page = (addr >> PAGE_SHIFT) as u32;
        let low = n.wrapping_sub(1);
        let max = if MAY_DRAIN { self.max_pages } else { self.hit_max_pages };
        if (n | page) & low != 0 || low >= max {
            return false;
        }
        if size.is_some_and(|size| size.div_ceil(1 << PAGE_SHIFT) != n as usize) {
            return false;
        }
        let o = n.trailing_zeros() as usize;
        if MAY_DRAIN {
            // SAFETY: `n <= max_pages` (above), so `o < self.orders`.
            let s = unsafe { self.stacks.get_unchecked(o) };
            return self.push_freed::<true>(a, s, v, addr, ai, m, n, self.large(o));
        }
        // On the hit path the order is stacked (`hit_max_pages` above), and its stack is found
        // by a branch, not from the loaded word (stack.rs, "Dependencies").
        match self.stack_by_branch(n) {
            Some(s) => self.push_freed::<false>(a, s, v, addr, ai, m, n, false),
            None => false,
        }
    }

    /// The end of `take_freed`: the live block at `addr` (arena `ai`, view `v`, record `m`), of
    /// `n` pages (a power of two) starting on a multiple of `n`, of the order of stack `s`
    /// (`large` if that order is), comes into the cache, after making room if it must and
    /// `MAY_DRAIN` (`false`: nothing changed, the caller takes the validated path).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn push_freed<const MAY_DRAIN: bool>(&self, a: &Arc<Shared>, s: &Stack, v: &ArenaView, addr: usize, ai: usize, m: *mut BlockMeta, n: u32, large: bool) -> bool {
        let (mut nd, mut pages) = (s.ndirty.get(), self.pages.get());
        if self.needs_room_at::<MAY_DRAIN>(a, s, large, n, nd, pages) {
            if !MAY_DRAIN {
                return false;
            }
            self.make_room(a, n.trailing_zeros() as usize);
            (nd, pages) = (s.ndirty.get(), self.pages.get());
        }
        // Push onto the dirty stack: below `dirty_max` (checked above, or made so by
        // `make_room`), so `first + nd` is one of this order's entries.
        debug_assert!(s.len() < s.cap);
        // SAFETY: the index is in this order's entries (above); only the owner writes them.
        unsafe { *s.first.add(nd as usize) = Entry::new(addr, ai, false) };
        s.ndirty.set(nd + 1);
        // The word of a freed block of this order (`HitWord::freed_word`: the block's word with
        // tag `Cached`, `META_FREED_START` alone, and the order and class of a dirty block of
        // `n` pages), a constant, as in `alloc_hit`.
        // SAFETY: `m` is the block's record (the caller's).
        unsafe { s.freed_word.store(m) };
        self.pages.set(pages + n as u64);
        if large {
            self.limit.add(n as u64);
        }
        self.free_hits.add(1);
        // The pages last, still before `leave` (the worker may drain the block once the owner
        // is out): for blocks of several pages it is a call, and little is live across it.
        // SAFETY: the block at `addr` is a block of `n` pages (a power of two) starting on a
        // multiple of `n` (the caller checked it) in arena `ai`.
        unsafe { crate::arena::fill_block(v.state_of(addr), n, PageState::Dirty) };
        if large {
            self.large_freed(a);
        }
        true
    }
}

/// Pages of a huge-page unit.
pub(super) const UNIT_PAGES: u32 = (crate::os::HUGE_PAGE_SIZE >> PAGE_SHIFT) as u32;

/// A block of several huge-page units handed out with slack: the unit where the live
/// part ends is partly live, so its slack pages may not stay `Reported` (the kernel backs the
/// whole unit at the first touch: buddy/units.rs). They become `Zeroed` (both read zero), as
/// `settle_units` makes them on the locked path. The slack's states are this thread's while
/// the block lives, counted nowhere but in its free (`take_freed_slack` reads them then), so no
/// counter changes.
/// (After `hand_out_with_slack`, which read the slack's counts; `live` pages of the block `e`.)
#[inline(never)]
pub(super) fn settle_slack_unit(a: &Arc<Shared>, e: Entry, live: u32) {
    let v = a.view(e.arena());
    if !v.huge_units() {
        return;
    }
    let end = v.record(e.addr()).0 + live;
    v.states().replace(end, end.next_multiple_of(UNIT_PAGES) - end, PageState::Reported, PageState::Zeroed);
}

/// Whether handing out a block with `slack` pages of slack would pass the process's bound: one
/// live block with slack per thread with a cache (at least one per online CPU, at most two),
/// and the high mark of slack pages per such block, in all (see "The slack bound" at the top
/// of `cache`).
#[inline]
pub(super) fn slack_over(a: &Shared, slack: u32) -> bool {
    if slack == 0 {
        return false;
    }
    let min = a.slack_blocks_min;
    let blocks = a.caches_registered.load(Relaxed).clamp(min, 2 * min);
    a.slack_held.blocks() >= blocks || a.slack_held.pages() + slack as u64 > blocks * a.config.cache_high_pages as u64
}
