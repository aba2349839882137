//! Per-page side metadata: the state of every 4 KiB page, and the record kept for the first page
//! of every block. None of it lives inside the pages it describes.

use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicU32, AtomicU64};

/// What is known of one page. Stored as one byte per page; the byte value of a never-touched
/// metadata page is 0, which is `Reported`: memory never touched is not resident and reads zero.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Free, not resident (given back with `MADV_DONTNEED` or a hole punch, or never touched):
    /// reads as zero, costs a page fault on first touch.
    Reported = 0,
    /// Free, resident, contents unknown.
    Dirty = 1,
    /// Free, resident, all zero.
    Zeroed = 2,
    /// Free, given back with `MADV_FREE`: the kernel may or may not have taken it, so the contents
    /// are unknown (the old data or zeros). Treated as `Dirty` by `ZERO` requests and as
    /// `Reported` by reporting and placement.
    LazyFree = 3,
    /// Part of a live allocation.
    Allocated = 4,
}

impl PageState {
    pub const ALL_FREE: [PageState; 4] =
        [PageState::Dirty, PageState::Zeroed, PageState::Reported, PageState::LazyFree];

    #[inline]
    pub fn from_byte(b: u8) -> PageState {
        match b {
            0 => PageState::Reported,
            1 => PageState::Dirty,
            2 => PageState::Zeroed,
            3 => PageState::LazyFree,
            _ => PageState::Allocated,
        }
    }

    /// Whether a free page in this state is known to read as zero.
    #[inline]
    pub fn reads_zero(self) -> bool {
        matches!(self, PageState::Zeroed | PageState::Reported)
    }

    /// Whether a free page in this state has been given back to the kernel.
    #[inline]
    pub fn is_reported(self) -> bool {
        matches!(self, PageState::Reported | PageState::LazyFree)
    }

    pub fn name(self) -> &'static str {
        match self {
            PageState::Reported => "reported",
            PageState::Dirty => "dirty",
            PageState::Zeroed => "zeroed",
            PageState::LazyFree => "lazy-free",
            PageState::Allocated => "allocated",
        }
    }
}

/// The free states of a live block's pages by granule (bit i: the block's pages `[i << shift,
/// (i + 1) << shift)`, at most 64 granules): the states its pages had when it was taken, or
/// those they will have when it is freed, as its owner knows them (a span of small objects knows
/// which of its pages it never wrote and which a trim gave back: slab/trim.rs). A granule in
/// neither mask is `Dirty`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GranuleStates {
    /// log2 of a granule's pages.
    pub(crate) shift: u32,
    /// Granules whose every page is `Reported`: reads zero, not resident.
    pub(crate) reported: u64,
    /// Granules whose every page reads zero, not all `Reported` (resident zeros, or a mix).
    pub(crate) zeroed: u64,
    /// Of `reported`, the granules given back after use (a trim's `MADV_DONTNEED`), counted
    /// with the memory the reporter gave back; the others were `Reported` when taken and were
    /// never touched since.
    pub(crate) given_back: u64,
}

impl GranuleStates {
    /// Granules of `npages` pages of `2^shift` each (at most 64), as bits `0..n`.
    #[inline]
    pub(crate) fn all(npages: u32, shift: u32) -> u64 {
        let n = (npages >> shift).min(64);
        if n == 64 { u64::MAX } else { (1u64 << n) - 1 }
    }

    /// Only the granules in `keep`; the others `Dirty`.
    #[inline]
    pub(crate) fn only(self, keep: u64) -> GranuleStates {
        GranuleStates { shift: self.shift, reported: self.reported & keep, zeroed: self.zeroed & keep, given_back: self.given_back & keep }
    }
}

/// How many pages of a free block are in each free state. `dirty` is derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub zeroed: u32,
    pub reported: u32,
    pub lazy: u32,
}

impl StateCounts {
    #[inline]
    pub fn uniform(state: PageState, pages: u32) -> StateCounts {
        let mut c = StateCounts::default();
        c.add(state, pages);
        c
    }

    #[inline]
    pub fn add(&mut self, state: PageState, pages: u32) {
        match state {
            PageState::Zeroed => self.zeroed += pages,
            PageState::Reported => self.reported += pages,
            PageState::LazyFree => self.lazy += pages,
            _ => {}
        }
    }

    #[inline]
    pub fn plus(self, o: StateCounts) -> StateCounts {
        StateCounts {
            zeroed: self.zeroed + o.zeroed,
            reported: self.reported + o.reported,
            lazy: self.lazy + o.lazy,
        }
    }

    #[inline]
    pub fn minus(self, o: StateCounts) -> StateCounts {
        StateCounts {
            zeroed: self.zeroed - o.zeroed,
            reported: self.reported - o.reported,
            lazy: self.lazy - o.lazy,
        }
    }

    #[inline]
    pub fn dirty(self, pages: u32) -> u32 {
        pages - self.zeroed - self.reported - self.lazy
    }

    /// Pages that a `ZERO` request must memset: dirty and lazily freed ones.
    #[inline]
    pub fn needs_zeroing(self, pages: u32) -> u32 {
        self.dirty(pages) + self.lazy
    }

    /// The counts of any `n` of the `total` pages of a uniform block (see `uniform_state`) with
    /// these counts.
    #[inline]
    pub fn scaled(self, total: u32, n: u32) -> StateCounts {
        debug_assert!(self.uniform_state(total).is_some());
        StateCounts { zeroed: self.zeroed / total * n, reported: self.reported / total * n, lazy: self.lazy / total * n }
    }

    /// The single state of every page, when the block is uniform.
    #[inline]
    pub fn uniform_state(self, pages: u32) -> Option<PageState> {
        if self.zeroed == pages {
            Some(PageState::Zeroed)
        } else if self.reported == pages {
            Some(PageState::Reported)
        } else if self.lazy == pages {
            Some(PageState::LazyFree)
        } else if self.dirty(pages) == pages {
            Some(PageState::Dirty)
        } else {
            None
        }
    }

    #[inline]
    pub fn class(self, pages: u32) -> Class {
        if self.reported + self.lazy == pages {
            Class::Reported
        } else if self.needs_zeroing(pages) == 0 {
            Class::Zeroed
        } else {
            Class::Dirty
        }
    }
}

/// Which free list a free block sits on, derived from its page states. Placement prefers a class
/// by the request's flags (see `buddy::preference`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// At least one page resident and needing zeroing (dirty or lazily freed) while some are not
    /// reported: the cheapest memory for a request that does not need zeros.
    Dirty = 0,
    /// Every page reads zero and at least one is resident.
    Zeroed = 1,
    /// Every page has been given back to the kernel.
    Reported = 2,
}

pub const CLASSES: usize = 3;

impl Class {
    pub const ALL: [Class; CLASSES] = [Class::Dirty, Class::Zeroed, Class::Reported];
    pub fn name(self) -> &'static str {
        match self {
            Class::Dirty => "dirty",
            Class::Zeroed => "zeroed",
            Class::Reported => "reported",
        }
    }
}

/// What the first page of a block records.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Not the first page of a block (or nothing there yet).
    None = 0,
    /// First page of a free block on a free list.
    Free = 1,
    /// First page of a live allocation.
    Alloc = 2,
    /// First page of a free block taken off the lists by a background worker (being reported or
    /// zeroed): neither allocatable nor mergeable until it is returned.
    Isolated = 3,
    /// First page of a free block held in a per-thread cache (`cache/`): on no list, never
    /// merged, its pages keep their free states; written by the owning thread without the lock.
    Cached = 4,
}

/// Flags of [`BlockMeta::flags`].
pub const META_FREED_START: u8 = 1; // an allocation that started here was freed (double-free check)
pub const META_LOCKED: u8 = 2; // the live block was `mlock`ed
/// A live block served by a per-thread cache for a request of fewer pages than its aligned block
/// (`2^order`, the order byte): its pages past `npages` are its slack, on no list, their state
/// bytes keeping their free states until the block is freed (cache/mod.rs, "Slack").
pub const META_SLACK: u8 = 4;
/// With `META_SLACK`: some of the slack's pages are not `Dirty` (their counts are read when the
/// block comes back into a cache). Without it the slack is all `Dirty`, and nothing is read.
pub const META_SLACK_MIXED: u8 = 8;

pub const NIL: u32 = u32::MAX;

/// Side record of one page; only meaningful on the first page of a block.
///
/// Every field is an atomic, accessed with `Relaxed` loads and stores (plain moves on x86), so
/// that a record may be read by a thread that does not hold the allocator lock while another
/// writes it: the caches' hit path reads and writes `word` (a `HitWord`) without the lock, and a
/// bad `free` may make it read the word of any page. The lock (or, for a cached or live block,
/// its owner) is what orders the writes; no field is ever read-modified-written by two threads at
/// once (docs/design.md, "Access rules"). Read a whole record with `get`.
#[repr(C, align(8))]
#[derive(Debug)]
pub struct BlockMeta {
    next: AtomicU32,
    prev: AtomicU32,
    /// Tag, order, flags, class and page count, as one word (see `HitWord`).
    word: AtomicU64,
    counts: [AtomicU32; 3],
    freed_at_ms: AtomicU32,
}

const _: () = {
    assert!(core::mem::size_of::<BlockMeta>() == 32);
    assert!(core::mem::offset_of!(BlockMeta, word) == 8);
};

/// A copy of a block record, read field by field (`BlockMeta::get`).
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// Free blocks: the next and previous block on the same list (`NIL` at the ends).
    pub next: u32,
    pub prev: u32,
    pub tag: Tag,
    pub order: u8,
    pub flags: u8,
    pub class: u8,
    /// Live blocks: pages in the allocation.
    pub npages: u32,
    /// Free and isolated blocks: pages per free state.
    pub counts: StateCounts,
    /// Free blocks: when the youngest part of the block was freed, in ms since the allocator began.
    pub freed_at_ms: u32,
}

impl Tag {
    #[inline(always)]
    fn from_bits(b: u8) -> Tag {
        match b {
            1 => Tag::Free,
            2 => Tag::Alloc,
            3 => Tag::Isolated,
            4 => Tag::Cached,
            _ => Tag::None,
        }
    }
}

impl BlockMeta {
    #[inline(always)]
    pub fn get(&self) -> Record {
        let w = self.word();
        Record {
            next: self.next(),
            prev: self.prev(),
            tag: Tag::from_bits(w.tag()),
            order: w.order(),
            flags: w.flags(),
            class: w.class(),
            npages: w.npages(),
            counts: self.counts(),
            freed_at_ms: self.freed_at_ms(),
        }
    }
    #[inline(always)]
    pub fn next(&self) -> u32 {
        self.next.load(Relaxed)
    }
    #[inline(always)]
    pub fn set_next(&self, v: u32) {
        self.next.store(v, Relaxed)
    }
    #[inline(always)]
    pub fn prev(&self) -> u32 {
        self.prev.load(Relaxed)
    }
    #[inline(always)]
    pub fn set_prev(&self, v: u32) {
        self.prev.store(v, Relaxed)
    }
    /// On the last page of a free block of order 1 or more: the block's first page (the
    /// record's `prev`, which no list uses on a page that starts no listed block), so that the
    /// block ending just before a page is found in two reads (`Buddy::block_ending_at`). Stale
    /// on any other page: a reader checks the block it names.
    #[inline(always)]
    pub fn set_tail_of(&self, first: u32) {
        self.prev.store(first, Relaxed)
    }
    #[inline(always)]
    pub fn tail_of(&self) -> u32 {
        self.prev.load(Relaxed)
    }
    #[inline(always)]
    pub(crate) fn word(&self) -> HitWord {
        HitWord(self.word.load(Relaxed))
    }
    #[inline(always)]
    pub(crate) fn set_word(&self, w: HitWord) {
        self.word.store(w.0, Relaxed)
    }
    #[inline(always)]
    pub fn tag(&self) -> Tag {
        Tag::from_bits(self.word().tag())
    }
    #[inline(always)]
    pub fn flags(&self) -> u8 {
        self.word().flags()
    }
    /// Whether this is the first page of a free listed block of `order` (one load, one compare).
    #[inline(always)]
    pub fn is_free_of_order(&self, order: u8) -> bool {
        (self.word.load(Relaxed) & 0xffff) as u16 == Tag::Free as u16 | (order as u16) << 8
    }
    /// Replace the bits of `word` under `mask` with `bits` (a load and a store, no
    /// read-modify-write: only the one thread that may write this record now, the lock holder or
    /// the owner of a cached or live block, calls the setters).
    #[inline(always)]
    fn replace(&self, mask: u64, bits: u64) {
        let w = self.word.load(Relaxed);
        self.word.store((w & !mask) | bits, Relaxed)
    }
    /// Change the tag, keeping the rest.
    #[inline(always)]
    pub fn set_tag(&self, tag: Tag) {
        self.replace(0xff, tag as u64)
    }
    #[inline(always)]
    pub fn set_flags(&self, flags: u8) {
        self.replace(0xff_0000, (flags as u64) << 16)
    }
    #[inline(always)]
    pub fn set_npages(&self, npages: u32) {
        self.replace(0xffff_ffff << 32, (npages as u64) << 32)
    }
    /// Tag `Isolated` with this order (the rest kept).
    #[inline(always)]
    pub fn set_isolated(&self, order: u8) {
        self.replace(0xffff, Tag::Isolated as u64 | (order as u64) << 8)
    }
    /// Tag `Free` with this order and class (flags and page count kept).
    #[inline(always)]
    pub fn set_free(&self, order: u8, class: u8) {
        self.replace(0xff00_ffff, Tag::Free as u64 | (order as u64) << 8 | (class as u64) << 24)
    }
    #[inline(always)]
    pub fn counts(&self) -> StateCounts {
        StateCounts { zeroed: self.counts[0].load(Relaxed), reported: self.counts[1].load(Relaxed), lazy: self.counts[2].load(Relaxed) }
    }
    #[inline(always)]
    pub fn set_counts(&self, c: StateCounts) {
        self.counts[0].store(c.zeroed, Relaxed);
        self.counts[1].store(c.reported, Relaxed);
        self.counts[2].store(c.lazy, Relaxed);
    }
    #[inline(always)]
    pub fn freed_at_ms(&self) -> u32 {
        self.freed_at_ms.load(Relaxed)
    }
    #[inline(always)]
    pub fn set_freed_at_ms(&self, t: u32) {
        self.freed_at_ms.store(t, Relaxed)
    }
}

/// Bytes 8..16 of a block record (tag, order, flags, class, npages), which the per-thread caches'
/// hit path loads and stores as one word without the lock: a load right after a store of the
/// same width is forwarded from the store buffer, where byte-wide stores followed by a wider load
/// would stall.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct HitWord(u64);

impl HitWord {
    #[inline(always)]
    pub(crate) fn tag(self) -> u8 {
        self.0 as u8
    }
    #[inline(always)]
    pub(crate) fn order(self) -> u8 {
        (self.0 >> 8) as u8
    }
    #[inline(always)]
    pub(crate) fn flags(self) -> u8 {
        (self.0 >> 16) as u8
    }
    #[inline(always)]
    pub(crate) fn class(self) -> u8 {
        (self.0 >> 24) as u8
    }
    #[inline(always)]
    pub(crate) fn npages(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// The first page of a live block that is not `mlock`ed and has no slack (tag `Alloc`,
    /// neither `META_LOCKED` nor `META_SLACK`): one mask and one compare.
    #[inline(always)]
    pub(crate) fn live_unlocked_exact(self) -> bool {
        (self.0 as u32) & (0xff | ((META_LOCKED | META_SLACK) as u32) << 16) == Tag::Alloc as u32
    }
    /// The first page of a live block with slack that is not `mlock`ed (tag `Alloc`,
    /// `META_SLACK`, no `META_LOCKED`), whatever its page count: a block served from a larger
    /// cached block (cache/hot.rs) may have a power of two of pages and slack.
    #[inline(always)]
    pub(crate) fn live_unlocked_slack(self) -> bool {
        (self.0 as u32) & (0xff | ((META_LOCKED | META_SLACK) as u32) << 16) == Tag::Alloc as u32 | (META_SLACK as u32) << 16
    }
    /// The first page of a live block of one page that is not `mlock`ed (and has no slack: one
    /// page never has): one mask and one compare for the commonest `free`.
    #[inline(always)]
    pub(crate) fn live_unlocked_page(self) -> bool {
        const MASK: u64 = 0xffff_ffff_0000_00ff | ((META_LOCKED | META_SLACK) as u64) << 16;
        self.0 & MASK == Tag::Alloc as u64 | 1 << 32
    }
    /// The word of an exact block of `order` that a cache hands out: `Tag::Alloc`,
    /// that order, no flags, class `Dirty` (0), `2^order` pages. A block on a dirty stack of
    /// `order` becomes exactly this when it goes live, whatever its cached word held: its order
    /// is the stack's, every page is `Dirty`, and a cached block carries neither `META_LOCKED`
    /// (the locked path clears it when the block is freed) nor `META_SLACK` (cleared when it
    /// came back whole). So the caches store this constant rather than a change of the word
    /// they loaded, and on the hit path the store does not wait for the load (cache/stack.rs,
    /// "Dependencies").
    pub(crate) const fn alloc_word(order: u8) -> HitWord {
        HitWord(Tag::Alloc as u64 | (order as u64) << 8 | 1u64 << (32 + order as u32))
    }
    /// The word of a live block of `order` freed whole into a cache (exact, or with slack):
    /// `Tag::Cached`, that order, `META_FREED_START` alone, class `Dirty` (the class of a cached
    /// block is read nowhere: mixed entries keep their counts), `2^order` pages.
    pub(crate) const fn freed_word(order: u8) -> HitWord {
        HitWord(Tag::Cached as u64 | (order as u64) << 8 | (META_FREED_START as u64) << 16 | 1u64 << (32 + order as u32))
    }
    /// A cached block handed out for a request of `npages` pages, fewer than its `2^order`: tag
    /// `Alloc`, order `order`, `META_SLACK` added (and `META_SLACK_MIXED` when `slack_mixed`: some
    /// slack page is not `Dirty`) and `META_FREED_START` cleared (class kept).
    #[inline(always)]
    pub(crate) fn handed_out_with_slack(self, order: u8, npages: u32, slack_mixed: bool) -> HitWord {
        let mixed = if slack_mixed { META_SLACK_MIXED } else { 0 };
        let flags = (self.flags() & !(META_FREED_START | META_SLACK_MIXED)) | META_SLACK | mixed;
        HitWord((self.0 & 0xff00_0000) | Tag::Alloc as u64 | (order as u64) << 8 | (flags as u64) << 16 | (npages as u64) << 32)
    }
    /// The same word with a new tag, flags and page count (order and class kept).
    #[inline(always)]
    pub(crate) fn with(self, tag: Tag, flags: u8, npages: u32) -> HitWord {
        HitWord((self.0 & 0xff00_ff00) | tag as u64 | (flags as u64) << 16 | (npages as u64) << 32)
    }

    /// # Safety
    /// `m` points into a live arena's record array.
    #[inline(always)]
    pub(crate) unsafe fn load(m: *const BlockMeta) -> HitWord {
        // SAFETY: `m` is a valid record (the caller's promise); the word is an atomic.
        unsafe { (*m).word() }
    }

    /// # Safety
    /// As `load`.
    #[inline(always)]
    pub(crate) unsafe fn store(self, m: *const BlockMeta) {
        // SAFETY: as in `load`.
        unsafe { (*m).set_word(self) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_unlocked_is_the_tag_and_the_flags() {
        for flags in 0..=255u8 {
            for tag in [Tag::Cached, Tag::Alloc, Tag::Free] {
                // order 3, class 2, a stale page count
                let w = HitWord(tag as u64 | 3 << 8 | (flags as u64) << 16 | 2 << 24 | 77 << 32);
                let locked = flags & META_LOCKED != 0;
                let slack = flags & META_SLACK != 0;
                assert_eq!(w.live_unlocked_exact(), tag == Tag::Alloc && !locked && !slack);
                assert_eq!(w.live_unlocked_slack(), tag == Tag::Alloc && !locked && slack);
                for n in [0u32, 1, 2, 3, 0x1_0001] {
                    let v = w.with(tag, flags, n);
                    let page = tag == Tag::Alloc && !locked && flags & META_SLACK == 0 && n == 1;
                    assert_eq!(v.live_unlocked_page(), page, "{v:?}");
                }
            }
        }
    }

    #[test]
    fn hit_path_words_are_the_words_of_a_dirty_block_of_their_order() {
        for order in 0..=11u8 {
            let (live, freed) = (HitWord::alloc_word(order), HitWord::freed_word(order));
            let n = 1u32 << order;
            assert_eq!((live.tag(), live.order(), live.flags(), live.class(), live.npages()), (Tag::Alloc as u8, order, 0, Class::Dirty as u8, n));
            assert!(live.live_unlocked_exact());
            assert_eq!((freed.tag(), freed.order(), freed.flags(), freed.class(), freed.npages()), (Tag::Cached as u8, order, META_FREED_START, Class::Dirty as u8, n));
            // Each is the other changed as the out-of-line paths change a word.
            assert_eq!(freed.with(Tag::Alloc, freed.flags() & !(META_FREED_START | META_SLACK), n), live);
            assert_eq!(live.with(Tag::Cached, META_FREED_START, n), freed);
        }
    }
}
