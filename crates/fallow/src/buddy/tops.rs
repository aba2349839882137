//! Top-level blocks never touched, listed without writing their records.
//!
//! A fresh arena is free: its top-level blocks (1 GiB each by default) are `Reported`, on the
//! reported list of `max_order`. Listing each wrote its record, and the records of blocks 1 GiB
//! apart lie 8 MiB apart in the metadata: a page of metadata resident per block, 96 KiB for an
//! arena the size of this machine's 24 GiB of RAM (an arena is as large as the RAM by default),
//! in every process that makes one block. So only the lowest is written at the start; the others,
//! from `unwritten` up, are counted in `listed` (the statistics and the checks see every free
//! page) and stand at the tail of that list, unwritten. One is written and put at the list's
//! tail when the list would otherwise become empty (`unlist`, so a take of the reported list
//! always finds its head), and those a range reaches when `take_range` takes it (the top path
//! at `used_end`, growth in place, a run), once the pages before them are known free. A run
//! found from its records (`free_run_around`) goes on through them as through any free block.
//! Nothing else reaches them: merges stay inside a top-level block and the workers take no
//! `Reported` block.

use super::Buddy;
use crate::page::{Class, PageState, StateCounts, NIL};

impl Buddy {
    /// List the top-level blocks of a fresh arena (`Buddy::new`): the lowest written, the rest
    /// counted only.
    pub(super) fn unwritten_tops(&mut self) {
        let top = 1u32 << self.max_order;
        debug_assert!(self.npages >= top && self.npages.is_multiple_of(top), "an arena is whole top-level blocks");
        let all = StateCounts::uniform(PageState::Reported, top);
        // A fresh map reads every page free: nothing to mark.
        self.list(0, self.max_order, all, 0);
        self.unwritten = top;
        for _ in 1..self.npages / top {
            self.listed.add_block(Class::Reported as usize, self.max_order, all, top);
        }
    }

    /// Write the next unwritten top-level block's record and put it at the tail of the reported
    /// list of `max_order`, if `(class, order)` is that list and one is left; whether it did.
    /// It is counted in `listed` already.
    pub(super) fn write_top(&mut self, class: usize, order: u8) -> bool {
        if class != Class::Reported as usize || order != self.max_order || self.unwritten >= self.npages {
            return false;
        }
        let top = 1u32 << self.max_order;
        let pfn = self.unwritten;
        self.unwritten += top;
        let tail = self.tails[class][order as usize];
        let m = self.meta(pfn);
        m.set_free(order, class as u8);
        m.set_counts(StateCounts::uniform(PageState::Reported, top));
        m.set_freed_at_ms(0);
        m.set_prev(tail);
        m.set_next(NIL);
        if tail == NIL {
            self.heads[class][order as usize] = pfn;
        } else {
            self.meta(tail).set_next(pfn);
        }
        self.tails[class][order as usize] = pfn;
        self.nonempty[class] |= 1u64 << order;
        true
    }

    /// Write every unwritten top-level block that starts below `end` (before a range is taken).
    pub(super) fn write_tops_below(&mut self, end: u32) {
        while self.unwritten < end && self.write_top(Class::Reported as usize, self.max_order) {}
    }

    /// The unwritten top-level blocks, for the checks: how many.
    pub(super) fn unwritten_count(&self) -> u32 {
        (self.npages - self.unwritten) >> self.max_order
    }

    /// Visit every listed free block as `(pfn, order)`, the unwritten top-level blocks too.
    pub fn for_each_listed(&self, mut f: impl FnMut(u32, u8)) {
        for class in 0..self.heads.len() {
            for order in 0..=self.max_order {
                let mut p = self.heads[class][order as usize];
                while p != NIL {
                    f(p, order);
                    p = self.meta(p).next();
                }
            }
        }
        let mut p = self.unwritten;
        while p < self.npages {
            f(p, self.max_order);
            p += 1u32 << self.max_order;
        }
    }
}
