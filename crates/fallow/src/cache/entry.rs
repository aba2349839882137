//! A cached block's entry: one word with its address, arena and `MIXED` bit, and the per-state
//! page counts of a mixed one (kept in a side array at the same index).

use core::num::NonZeroUsize;

use crate::heap::{ArenaView, MAX_ARENAS};
use crate::os::PAGE_SHIFT;
use crate::page::StateCounts;

/// One cached block in one word: its page-aligned address, its arena in bits 6..=11, and `MIXED`
/// in bit 0 when its counts (some page not `Dirty`) are in the side array.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Entry(NonZeroUsize);

const MIXED: usize = 1;
/// The arena index sits in bits 6..=11, so that masking the entry gives its byte offset in the
/// table of (64-byte) arena views, with no shift.
const ARENA_SHIFT: u32 = 6;
const _: () = assert!(MAX_ARENAS << ARENA_SHIFT <= 1 << PAGE_SHIFT && MIXED < 1 << ARENA_SHIFT);
const _: () = assert!(core::mem::size_of::<ArenaView>() == 1 << ARENA_SHIFT);

impl Entry {
    #[inline(always)]
    pub(super) fn new(addr: usize, arena: usize, mixed: bool) -> Entry {
        // SAFETY: `addr` is the page-aligned address of a block inside a mapped arena, never 0,
        // so the word is non-zero.
        Entry(unsafe { NonZeroUsize::new_unchecked(addr | arena << ARENA_SHIFT | mixed as usize) })
    }
    #[inline(always)]
    pub(super) fn addr(self) -> usize {
        self.0.get() & !((1 << PAGE_SHIFT) - 1)
    }
    #[inline(always)]
    pub(super) fn arena(self) -> usize {
        (self.0.get() >> ARENA_SHIFT) & (MAX_ARENAS - 1)
    }
    /// A block of the first arena that is not mixed (every page `Dirty`): one test.
    #[inline(always)]
    pub(super) fn plain_in_first(self) -> bool {
        self.0.get() & ((MAX_ARENAS - 1) << ARENA_SHIFT | MIXED) == 0
    }
    /// The address of a `plain_in_first` entry: the entry's word itself (its low bits are 0).
    #[inline(always)]
    pub(super) fn plain_addr(self) -> NonZeroUsize {
        debug_assert!(self.plain_in_first() && self.0.get() == self.addr());
        self.0
    }
    /// The entry as one word (never 0), as the cache's hot block keeps it (hot.rs).
    #[inline(always)]
    pub(super) fn word(self) -> usize {
        self.0.get()
    }
    /// The entry whose `word` is `w`; `None` for 0.
    #[inline(always)]
    pub(super) fn from_word(w: usize) -> Option<Entry> {
        NonZeroUsize::new(w).map(Entry)
    }
    #[inline(always)]
    pub(super) fn mixed(self) -> bool {
        self.0.get() & MIXED != 0
    }
}

/// Page counts of a mixed entry (its block has at most 2^CACHE_ORDER_LIMIT = 2048 pages), and
/// how many of its first pages are known to be `Dirty` (0: none known).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(super) struct Mixed {
    pub(super) zeroed: u16,
    pub(super) reported: u16,
    pub(super) lazy: u16,
    /// Pages `0..dirty_below` of the block are `Dirty`: the live pages of a block with slack
    /// that its free just marked so. The block's other states all lie past them, so a hand-out
    /// of at most that many live pages leaves every page that is not `Dirty` in its slack, and
    /// a larger one counts its live pages past them or its slack, the fewer
    /// (`hand_out_with_slack`).
    pub(super) dirty_below: u16,
}

impl Mixed {
    pub(super) fn of(c: StateCounts, dirty_below: u32) -> Mixed {
        Mixed { zeroed: c.zeroed as u16, reported: c.reported as u16, lazy: c.lazy as u16, dirty_below: dirty_below as u16 }
    }
    #[inline(always)]
    pub(super) fn counts(self) -> StateCounts {
        StateCounts { zeroed: self.zeroed as u32, reported: self.reported as u32, lazy: self.lazy as u32 }
    }
}
