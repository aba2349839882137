//! The buddy allocator over one arena: free lists per class and order, split and merge as Linux
//! does (`mm/page_alloc.c`: `expand`, `__free_one_page`), all in side metadata.
//!
//! Invariants (checked by `Buddy::check_lists`, from `Allocator::check_invariants`):
//! - A free block of order k starts at a pfn that is a multiple of 2^k, its first page has
//!   `Tag::Free` and `order == k` (no other record says `Free`), and it is on exactly one list: `heads[class][k]`, where `class`
//!   is derived from its `counts`, and `counts` equals what its pages' state bytes say.
//! - Two free buddies of the same order never both sit on lists: freeing merges them. The one
//!   exception is the arena's unmerged block and its buddy (`deferred.rs`: the last dirty run
//!   freed, listed whole for the next take of its order).
//! - An isolated block (`Tag::Isolated`) is on no list and is never merged until it is returned.
//! - Half records: for every free or isolated block, and every aligned sub-block S of it whose pages
//!   are not all in one state, `meta(S.start + |S|/2).counts` holds the counts of S's upper half.
//!   So a mixed block splits, and any aligned part of it is counted, in O(order) steps without
//!   reading state bytes. Merging writes the record (the upper buddy's counts); a worker that
//!   changes the states inside an isolated block rebuilds them (`rebuild_records`).
//! - `nonempty[class]` has bit k set exactly when `heads[class][k] != NIL`.
//! - Tail marks (not checked: a missing one costs reads, a stale one is never trusted): a block
//!   of order k >= 1 listed while it ends at or below `used_end` names its first page in the
//!   `prev` field of its last page's record (`mark_tail`, `block_ending_at`).
//! - Every page at or past `used_end` is free and `Reported` (never touched): whatever hands a
//!   block out, caches it or populates it first moves `used_end` past it (`mark_used`). (A
//!   worker may hold such pages isolated, in a block that starts below it.)
//! - The free-page map (`arena/free_map/`) marks free exactly the pages of the listed blocks
//!   (the unwritten top-level ones included). Only the net change of an operation is marked:
//!   `free_block` marks the freed block's pages free (a buddy it merges with is free already),
//!   and `free_run_deferred` the freed run's; `unlink_read` a block's pages taken, and a take
//!   that splits a block or frees the parts around what it keeps (`split_listed`, `carve`,
//!   `take_range`, `take_run`) the pages it keeps only; `unlist`, `list` and `relist` leave the
//!   map alone.
//! - The top-level blocks from `unwritten` up are free, `Reported` and counted in `listed`, but
//!   their records are not written yet (`tops.rs`): they are the tail of the `Reported` list of
//!   `max_order`, which is never empty while one is left, and `unwritten >= used_end`.
//!
//! Nothing here takes a lock: the caller holds the allocator lock.

use core::ops::{Deref, DerefMut};

use crate::arena::Arena;
use crate::config::ORDERS;
use crate::page::{Class, PageState, Record, StateCounts, Tag, CLASSES, META_FREED_START, META_SLACK, META_SLACK_MIXED, NIL};

mod check;
mod deferred;
mod span;
mod take;
mod tops;
mod units;

/// One arena with its free lists: the buddy allocator over it. It derefs to the arena (addresses,
/// records, state bytes); what it adds is the lists, which only this file changes: their heads
/// and tails per class and order, which lists are not empty, and what they hold. A list is doubly
/// linked through its blocks' records (`next`, `prev`), most recently freed at the head. Other
/// layers read the lists through `oldest_first`, `newest`, `has_free` and `for_each_listed`.
pub(crate) struct Buddy {
    arena: Arena,
    heads: [[u32; ORDERS]; CLASSES],
    tails: [[u32; ORDERS]; CLASSES],
    nonempty: [u64; CLASSES],
    /// What the lists hold, kept as blocks are listed and unlisted.
    listed: Listed,
    /// One past the highest page ever handed out or populated (`mark_used`): the pages from here
    /// to the end of the arena have never been touched, so they are address space only, not
    /// memory given back to the kernel (they are `Reported` and free, as a fresh arena's are).
    used_end: u32,
    /// The block listed without merging with its buddy, `(pfn, order)` (`deferred.rs`).
    unmerged: Option<(u32, u8)>,
    /// The first top-level block whose record is not written yet (`npages`: none; `tops.rs`).
    unwritten: u32,
}

/// Counters of the free blocks on an arena's lists.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Listed {
    pub blocks: [[u32; ORDERS]; CLASSES],
    pub counts: StateCounts,
    pub pages: u64,
}

impl Listed {
    #[inline]
    pub fn add_block(&mut self, class: usize, order: u8, c: StateCounts, pages: u32) {
        self.blocks[class][order as usize] += 1;
        self.counts = self.counts.plus(c);
        self.pages += pages as u64;
    }
    /// Listed pages that are resident: all but the reported and lazily freed ones.
    #[inline]
    pub fn resident_pages(&self) -> u64 {
        self.pages - (self.counts.reported + self.counts.lazy) as u64
    }
    #[inline]
    pub fn remove_block(&mut self, class: usize, order: u8, c: StateCounts, pages: u32) {
        self.blocks[class][order as usize] -= 1;
        self.counts = self.counts.minus(c);
        self.pages -= pages as u64;
    }
}

/// How well `n` free pages with counts `c` suit a request, as a key to compare (greater is
/// better): resident pages first (a fault and the kernel's zeroing cost about twenty times a
/// memset of a resident page), then, of those, zeroed ones for a `ZERO` request and dirty ones
/// otherwise (the order of `preference`). The one rule for every split that keeps a part.
#[inline]
pub(crate) fn suits(c: StateCounts, n: u32, zero: bool) -> (u32, u32) {
    (n - c.reported - c.lazy, if zero { c.zeroed } else { c.dirty(n) })
}

impl Deref for Buddy {
    type Target = Arena;
    #[inline(always)]
    fn deref(&self) -> &Arena {
        &self.arena
    }
}

impl DerefMut for Buddy {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Arena {
        &mut self.arena
    }
}

/// A walk over one free list from its oldest block (the tail) towards its newest, which does not
/// borrow the lists between steps: the caller may take the block it was just given off the list
/// (the walk has already read that block's neighbour).
#[derive(Clone, Copy)]
pub(crate) struct OldestFirst {
    next: u32,
}

impl OldestFirst {
    /// The next block of the walk and its record, or `None` past the list's head.
    pub(crate) fn next(&mut self, b: &Buddy) -> Option<(u32, Record)> {
        if self.next == NIL {
            return None;
        }
        let p = self.next;
        let m = b.meta(p).get();
        self.next = m.prev;
        Some((p, m))
    }
}

/// The class order in which a request looks for memory. Reported memory comes last for every
/// request: faulting a page back in costs ~550 ms/GiB here (the kernel zeroes it too), a memset of
/// a resident dirty page ~24 ms/GiB, and taking reported memory while dirty memory idles raises
/// the resident size for nothing.
pub fn preference(zero: bool) -> [Class; 3] {
    if zero {
        [Class::Zeroed, Class::Dirty, Class::Reported]
    } else {
        // Leave zeroed memory to those who need it.
        [Class::Dirty, Class::Zeroed, Class::Reported]
    }
}

/// The classes of `preference(zero)` whose memory is resident (all but `Reported`), in its order.
pub fn resident_preference(zero: bool) -> [Class; 2] {
    let [first, second, _] = preference(zero);
    [first, second]
}

/// A block taken off the free lists.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    pub pfn: u32,
    pub npages: u32,
    pub counts: StateCounts,
}

impl Buddy {
    /// The free lists of a fresh arena, whose metadata is all zero (every page `Reported`,
    /// every tag `None`): its top-level blocks on the reported list of `max_order`, the lowest
    /// written and at the head, the others after it with their records unwritten (`tops.rs`).
    pub fn new(arena: Arena) -> Buddy {
        let mut b = Buddy {
            arena,
            heads: [[NIL; ORDERS]; CLASSES],
            tails: [[NIL; ORDERS]; CLASSES],
            nonempty: [0; CLASSES],
            listed: Listed { blocks: [[0; ORDERS]; CLASSES], counts: StateCounts::default(), pages: 0 },
            used_end: 0,
            unmerged: None,
            unwritten: 0,
        };
        b.unwritten_tops();
        b
    }

    /// What the lists hold: blocks per class and order, pages per state.
    #[inline]
    pub fn listed(&self) -> &Listed {
        &self.listed
    }

    /// Record that the pages below `end` may have been touched: a block ending there left the
    /// lists to be handed out, cached or populated by the zeroing worker.
    #[inline]
    pub fn mark_used(&mut self, end: u32) {
        self.used_end = self.used_end.max(end);
    }

    /// Free pages past the highest page ever touched: address space that was never used. A lower
    /// bound (a never-touched page below a used one is not counted), exact while the program
    /// only grows: takes split the lowest free block first.
    #[inline]
    pub fn never_used_pages(&self) -> u32 {
        self.npages - self.used_end
    }

    /// The free list of `class` and `order`, oldest block first.
    pub fn oldest_first(&self, class: Class, order: u8) -> OldestFirst {
        OldestFirst { next: self.tails[class as usize][order as usize] }
    }

    /// The most recently freed block on the list of `class` and `order`.
    pub fn newest(&self, class: Class, order: u8) -> Option<u32> {
        let p = self.heads[class as usize][order as usize];
        (p != NIL).then_some(p)
    }

    /// Whether a block of one of `classes`, of order `order` or above, is listed.
    pub fn has_free(&self, classes: &[Class], order: u8) -> bool {
        let mask = !0u64 << order;
        classes.iter().any(|&c| self.nonempty[c as usize] & mask != 0)
    }

    /// Put a free block on the list its counts select (at the head: most recently freed first).
    /// The free-page map marks its pages free already: a fresh arena's, or the parts of blocks
    /// just unlisted (`unlist`), or the caller marked them (`free_block`, `free_run_deferred`).
    fn list(&mut self, pfn: u32, order: u8, counts: StateCounts, freed_at_ms: u32) {
        let class = counts.class(1 << order) as usize;
        let head = self.heads[class][order as usize];
        {
            // SAFETY: a block being listed lies in this arena (callers pass blocks of it).
            let m = unsafe { self.meta_unchecked(pfn) };
            m.set_free(order, class as u8);
            m.set_counts(counts);
            m.set_freed_at_ms(freed_at_ms);
            m.set_prev(NIL);
            m.set_next(head);
        }
        self.mark_tail(pfn, order);
        if head != NIL {
            // SAFETY: `head` is a listed block of this arena.
            unsafe { self.meta_unchecked(head) }.set_prev(pfn);
        } else {
            self.tails[class][order as usize] = pfn;
        }
        self.heads[class][order as usize] = pfn;
        self.nonempty[class] |= 1u64 << order;
        self.listed.add_block(class, order, counts, 1 << order);
    }

    /// Take a free block off its list (its tag becomes `None`; the caller retags it).
    pub fn unlink(&mut self, pfn: u32) {
        let m = self.meta(pfn).get();
        self.unlink_read(pfn, &m);
    }

    /// `unlink`, given the block's record as the caller just read it.
    #[inline]
    fn unlink_read(&mut self, pfn: u32, m: &Record) {
        self.unlist(pfn, m);
        self.arena.free_map().mark(pfn, 1 << m.order, true);
    }

    /// `unlink_read` that leaves the block's pages marked free in the free-page map: for a
    /// block whose pages are listed again at once, as parts of a larger block or its halves
    /// (a merge, a split). Marking them taken and then free again would write the map's bits
    /// of the whole block twice: for a split of a top-level block of 1 GiB, 32 KiB of bits.
    fn unlist(&mut self, pfn: u32, m: &Record) {
        debug_assert_eq!(m.tag, Tag::Free);
        let (class, order) = (m.class as usize, m.order as usize);
        if m.prev != NIL {
            // SAFETY: a list neighbour is a listed block of this arena.
            unsafe { self.meta_unchecked(m.prev) }.set_next(m.next);
        } else {
            self.heads[class][order] = m.next;
        }
        if m.next != NIL {
            // SAFETY: as just above.
            unsafe { self.meta_unchecked(m.next) }.set_prev(m.prev);
        } else {
            self.tails[class][order] = m.prev;
        }
        if self.heads[class][order] == NIL && !self.write_top(class, order as u8) {
            self.nonempty[class] &= !(1u64 << order);
        }
        self.listed.remove_block(class, order as u8, m.counts, 1 << order);
        // SAFETY: `pfn` is the listed block being unlinked, in this arena.
        unsafe { self.meta_unchecked(pfn) }.set_tag(Tag::None);
    }

    /// Free one aligned block, merging with free buddies as far as they go, and list the result.
    pub fn free_block(&mut self, pfn: u32, order: u8, counts: StateCounts, t: u32) {
        self.arena.free_map().mark(pfn, 1 << order, false);
        self.relist(pfn, order, counts, t);
    }

    /// `free_block` of a block whose pages the free-page map marks free already (a part of a
    /// block just unlisted with `unlist`): a buddy it merges with is marked free too, so the
    /// map has nothing to change.
    fn relist(&mut self, mut pfn: u32, mut order: u8, mut counts: StateCounts, mut t: u32) {
        debug_assert_eq!(pfn & ((1 << order) - 1), 0);
        while order < self.max_order {
            let buddy = pfn ^ (1u32 << order);
            if buddy >= self.npages {
                break;
            }
            // SAFETY: `buddy < npages`, checked just above.
            let bm = unsafe { self.meta_unchecked(buddy) };
            if !bm.is_free_of_order(order) {
                break;
            }
            let b = bm.get();
            self.unlist(buddy, &b);
            if pfn > buddy {
                // This block is the upper half of the merged one: leave its half record.
                // SAFETY: `pfn` is the block being freed, in this arena.
                unsafe { self.meta_unchecked(pfn) }.set_counts(counts);
            }
            // SAFETY: both `pfn` and `buddy` are below `npages` (see above).
            unsafe { self.meta_unchecked(pfn.max(buddy)) }.set_tag(Tag::None);
            counts = counts.plus(b.counts);
            t = t.max(b.freed_at_ms);
            pfn = pfn.min(buddy);
            order += 1;
        }
        self.list(pfn, order, counts, t);
    }

    /// Free `[pfn, pfn + n)`, whose pages are all in state `state`, as the largest aligned blocks
    /// that tile it.
    pub fn free_range(&mut self, pfn: u32, n: u32, state: PageState, t: u32) {
        for_each_piece(pfn, n, self.max_order, |p, order| {
            self.free_block(p, order, StateCounts::uniform(state, 1 << order), t)
        });
    }

    /// Free `[pfn, pfn + n)`, whose pages may be in several free states, as runs of one state
    /// (O(n) state reads; the half records of the merged blocks are written as they merge).
    pub fn free_by_runs(&mut self, pfn: u32, n: u32, t: u32) {
        // `States` is a copy of the array's address: the closure may borrow the arena.
        self.states().for_each_run(pfn, n, |p, len, s| self.free_range(p, len, s, t));
    }

    /// Counts of the two halves of the free or isolated block `(pfn, order)` whose counts are `c`.
    #[inline]
    pub(crate) fn halves(&self, pfn: u32, order: u8, c: StateCounts) -> (StateCounts, StateCounts) {
        let half = 1u32 << (order - 1);
        match c.uniform_state(half * 2) {
            Some(s) => (StateCounts::uniform(s, half), StateCounts::uniform(s, half)),
            None => {
                // SAFETY: `pfn + half` lies inside the block `(pfn, order)`, in this arena.
                let high = unsafe { self.meta_unchecked(pfn + half) }.counts();
                (c.minus(high), high)
            }
        }
    }

    /// Free the parts of the unlisted block `(pfn, order)` with counts `c` that lie outside
    /// `keep = [start, end)`, as the largest aligned pieces, with their own counts. Returns the
    /// counts freed. The block's pages are marked free in the free-page map (it was unlisted
    /// with `unlist`): the caller marks `keep` taken.
    ///
    /// One descent from the block down the two edges of `keep`, O(order): a half wholly outside
    /// is freed as one block, a half wholly inside is left, a half across an edge is split again.
    /// Freeing as it goes is safe: a freed piece's buddy is the other half of a block that keeps
    /// some pages, so no merge leaves the block; and a piece's record (its first page) is at most
    /// the half record of its parent, already read, never one the descent reads later.
    fn free_outside(&mut self, pfn: u32, order: u8, c: StateCounts, keep: (u32, u32), t: u32) -> StateCounts {
        let end = pfn + (1u32 << order);
        if keep.0 <= pfn && end <= keep.1 {
            return StateCounts::default();
        }
        if keep.1 <= pfn || end <= keep.0 {
            self.relist(pfn, order, c, t);
            return c;
        }
        let (low, high) = self.halves(pfn, order, c);
        let half = 1u32 << (order - 1);
        let freed_high = self.free_outside(pfn + half, order - 1, high, keep, t);
        self.free_outside(pfn, order - 1, low, keep, t).plus(freed_high)
    }

    /// Recompute the half records and the counts of the isolated block `(pfn, order)` from its
    /// state bytes (after a worker changed them). O(pages) state reads; records are written for
    /// mixed parts only (none is read for a uniform one), not a record per page faulted in.
    pub fn rebuild_records(&mut self, pfn: u32, order: u8) -> StateCounts {
        if order == 0 {
            return StateCounts::uniform(self.state(pfn), 1);
        }
        let half = 1u32 << (order - 1);
        let low = self.rebuild_records(pfn, order - 1);
        let high = self.rebuild_records(pfn + half, order - 1);
        let counts = low.plus(high);
        if counts.uniform_state(half * 2).is_none() {
            self.meta(pfn + half).set_counts(high);
        }
        counts
    }

    /// Extend the live block `[pfn, pfn + old)` to `new` pages in place if the pages right after it
    /// are free, taking them off the lists. Returns the counts of the pages taken.
    pub fn take_following(&mut self, pfn: u32, old: u32, new: u32) -> Option<StateCounts> {
        self.take_range(pfn + old, pfn + new)
    }

    /// The free listed block containing page `p`, as `(head pfn, order)`.
    pub fn free_block_containing(&self, p: u32) -> Option<(u32, u8)> {
        for order in 0..=self.max_order {
            let head = p & !((1u32 << order) - 1);
            let m = self.meta(head).get();
            if m.tag == Tag::Free && m.order == order {
                return Some((head, order));
            }
            if m.tag != Tag::None && head == p && m.tag != Tag::Free {
                return None;
            }
        }
        None
    }

    /// Record a live block at `pfn`.
    pub fn mark_live(&mut self, pfn: u32, npages: u32, flags: u8) {
        let m = self.meta(pfn);
        let w = m.word();
        m.set_word(w.with(Tag::Alloc, (w.flags() & !(META_FREED_START | META_SLACK | META_SLACK_MIXED)) | flags, npages));
    }

    /// Give back a live block, its pages `Dirty` (as far as we know), and its slack if it has
    /// one. Returns the slack's pages.
    pub fn release_live(&mut self, pfn: u32, npages: u32, now_ms: u32) -> u32 {
        let slack = self.unmark_live(pfn, now_ms);
        self.set_states(pfn, npages, PageState::Dirty);
        if !self.free_run_deferred(pfn, npages, now_ms) {
            self.free_range(pfn, npages, PageState::Dirty, now_ms);
        }
        slack
    }

    /// `release_live` for a block whose pages the caller has set to their free states, which
    /// may differ (`free_by_runs`: a run of one state at a time; no deferred merge).
    pub fn release_live_as_set(&mut self, pfn: u32, npages: u32, now_ms: u32) -> u32 {
        let slack = self.unmark_live(pfn, now_ms);
        self.free_by_runs(pfn, npages, now_ms);
        slack
    }

    /// The live block at `pfn` is live no more: its slack given back (its pages returned), its
    /// record marked as a freed block's start.
    fn unmark_live(&mut self, pfn: u32, now_ms: u32) -> u32 {
        let slack = self.drop_slack(pfn, now_ms);
        let m = self.meta(pfn);
        let w = m.word();
        m.set_word(w.with(Tag::None, META_FREED_START, w.npages()));
        slack
    }

    /// Give back the slack of the live block at `pfn` (`META_SLACK`: the pages of its aligned
    /// block past its page count, which kept their free states), leaving an exact live block.
    /// Returns the slack's pages (0 for a block without).
    pub fn drop_slack(&mut self, pfn: u32, now_ms: u32) -> u32 {
        let m = self.meta(pfn);
        let w = m.word();
        if w.flags() & META_SLACK == 0 {
            return 0;
        }
        let (live, size) = (w.npages(), 1u32 << w.order());
        debug_assert!(live < size && pfn & (size - 1) == 0);
        m.set_flags(w.flags() & !(META_SLACK | META_SLACK_MIXED));
        self.free_by_runs(pfn + live, size - live, now_ms);
        size - live
    }
}

/// Tile `[start, start + n)` with the largest aligned blocks of order at most `max_order`:
/// `f(pfn, order)` for each, in address order.
pub fn for_each_piece(start: u32, n: u32, max_order: u8, mut f: impl FnMut(u32, u8)) {
    let end = start + n;
    let mut p = start;
    while p < end {
        let mut order = (p.trailing_zeros().min(31) as u8).min(max_order);
        while (1u32 << order) > end - p {
            order -= 1;
        }
        f(p, order);
        p += 1u32 << order;
    }
}
