//! Huge-page units: the aligned 2 MiB ranges of an arena on transparent huge pages
//! (`Arena::huge_units`). The kernel backs a whole unit with one huge page at the first touch of
//! any page of it, when nothing of the unit is mapped yet. A `Reported` page (free, reading zero,
//! not resident) in a unit that a live block shares would then be resident without fallow
//! knowing: its memory counted as given back, while it is not.
//!
//! Invariant, in such an arena: a unit holds a `Reported` page only if every page of it is free
//! and `Reported` (a never-used unit, or one the reporter gave back whole: reporting takes blocks
//! of `report_order` >= 9 only, validated with `thp`). The one exception is a block whose pages
//! `mremap` moved away (the preload's `realloc`): the kernel split the unit's mapping to move
//! them, so no huge page comes back under its other pages at a fault.
//!
//! Every take keeps it (`settle_units`, from `carve`, `take_run` and `take_following`): a take
//! that leaves part of a wholly reported unit, or takes one unit whole (a cached 2 MiB block may
//! be handed out with slack, free pages inside a live block), turns all the unit's pages
//! `Zeroed`, the taken part (in the counts it returns) and the free pieces left beside it (listed
//! again). They read zero
//! either way; once the kernel backs the unit they are resident, and where it falls back to
//! 4 KiB pages they stay unbacked but are counted resident: the safe side for a memory limit.
//! Their unit is then no longer never-used address space (`mark_used`).

use super::Buddy;
use crate::os::{HUGE_PAGE_SIZE, PAGE_SHIFT};
use crate::page::{PageState, StateCounts};

/// Pages of a unit.
const UNIT_PAGES: u32 = (HUGE_PAGE_SIZE >> PAGE_SHIFT) as u32;

impl Buddy {
    /// After a take of `[pfn, pfn + n)` whose pages' counts are `counts`: settle the units the
    /// run covers in part (see the top). Returns the run's counts after that.
    pub(super) fn settle_units(&mut self, pfn: u32, n: u32, mut counts: StateCounts) -> StateCounts {
        if !self.huge_units || n == 0 {
            return counts;
        }
        let end = pfn + n;
        let first = pfn & !(UNIT_PAGES - 1);
        let last = (end - 1) & !(UNIT_PAGES - 1);
        self.settle_unit(first, pfn, end, &mut counts);
        if last != first {
            self.settle_unit(last, pfn, end, &mut counts);
        }
        counts
    }

    /// `settle_units` for the unit at `u`, of which the run `[pfn, end)` was taken.
    fn settle_unit(&mut self, u: u32, pfn: u32, end: u32, counts: &mut StateCounts) {
        let unit_end = (u + UNIT_PAGES).min(self.npages);
        let (lo, hi) = (pfn.max(u), end.min(unit_end));
        // Wholly taken by a run of several units (a live block of them, never one with slack),
        // or (by the invariant) no reported page in the unit. A run of one unit is settled too:
        // a cached block of 2 MiB may be handed out with slack, whose pages stay free.
        let several = end - pfn > UNIT_PAGES;
        if (lo == u && hi == unit_end && several) || self.state(lo) != PageState::Reported {
            return;
        }
        let taken = self.zero_reported_runs(lo, hi - lo);
        counts.reported -= taken;
        counts.zeroed += taken;
        // The rest of the unit: the free pieces the take left (listed as they were split off).
        let mut p = u;
        while p < unit_end {
            if (lo..hi).contains(&p) {
                p = hi;
                continue;
            }
            let Some((b, order)) = self.free_block_containing(p) else {
                // Not free: only where the invariant's exception left reported pages.
                p += 1;
                continue;
            };
            let size = 1u32 << order;
            let m = self.meta(b).get();
            // Listed again at once (`free_by_runs`): its pages stay marked free in the map.
            self.unlist(b, &m);
            self.zero_reported_runs(b, size);
            self.free_by_runs(b, size, m.freed_at_ms);
            p = b + size;
        }
        self.mark_used(unit_end);
    }

    /// Record the `Reported` pages of `[pfn, pfn + n)` as `Zeroed` (both read zero); the others
    /// keep their states. Returns how many there were.
    fn zero_reported_runs(&self, pfn: u32, n: u32) -> u32 {
        debug_assert!(pfn as usize + n as usize <= self.npages as usize);
        self.states().replace(pfn, n, PageState::Reported, PageState::Zeroed)
    }
}
