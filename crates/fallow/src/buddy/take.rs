//! Takes by splitting: a block of a request's order split down from the smallest listed block
//! that fits it (`take_aligned`, `carve`, as Linux's `expand` and `alloc_pages_exact`), a listed
//! block split down to a piece (`split_listed`: the zeroing worker's), and a run of top-level
//! blocks for a request larger than any block (`take_run`). Each marks in the free-page map only
//! the pages it keeps: the halves it lists again stay marked free, as the block they came from
//! was (the module header of `buddy`).

use super::{for_each_piece, suits, Buddy, Taken};
use crate::page::{Class, Record, StateCounts};

impl Buddy {
    /// Take a block of exactly `npages` pages aligned to `2^order` (`npages <= 2^order`) from
    /// the classes `prefs` (`first_fit_in`: the smallest order that fits among the resident
    /// ones, then reported memory). The unused rest of the block goes back on the lists at once.
    /// `zero`: the request needs zeros (a mixed block keeps the halves with zeroed pages).
    pub fn take_aligned(&mut self, npages: u32, order: u8, prefs: &[Class], zero: bool) -> Option<Taken> {
        debug_assert!(npages <= 1 << order && order <= self.max_order);
        self.merge_deferred_below(order);
        let pfn = self.first_fit_in(prefs, order)?;
        Some(self.carve(pfn, order, npages, zero))
    }

    /// The block `take` would split for `class`: the most recently freed one of the smallest
    /// listed order at or above `order`.
    pub(super) fn first_fit(&self, class: Class, order: u8) -> Option<u32> {
        let mask = self.nonempty[class as usize] & (!0u64 << order);
        (mask != 0).then(|| self.heads[class as usize][mask.trailing_zeros() as usize])
    }

    /// The block to split for a request of `order` from the classes `prefs`: among its resident
    /// classes, the smallest listed order at or above `order` (a best fit by order: a split
    /// of a larger block leaves its rest where whole blocks served larger requests), a class
    /// earlier in `prefs` winning a tie; only when none fits, `Reported` (if in `prefs`).
    /// Taken in class order, a `ZERO` request split a large zeroed block while a dirty one of
    /// its size lay free: under random 64 KiB-4 MiB `calloc`s in two threads, 10-15% more peak
    /// resident memory than with the worker off.
    pub(crate) fn first_fit_in(&self, prefs: &[Class], order: u8) -> Option<u32> {
        let mut best: Option<(u32, Class)> = None;
        for &c in prefs.iter().filter(|&&c| c != Class::Reported) {
            let mask = self.nonempty[c as usize] & (!0u64 << order);
            if mask != 0 && best.is_none_or(|(o, _)| mask.trailing_zeros() < o) {
                best = Some((mask.trailing_zeros(), c));
            }
        }
        match best {
            Some((o, c)) => Some(self.heads[c as usize][o as usize]),
            None if prefs.contains(&Class::Reported) => self.first_fit(Class::Reported, order),
            None => None,
        }
    }

    /// Take the listed block at `pfn`, split it down to `order` keeping at each step the half
    /// whose pages suit the request better (a mixed block holds dirty, zeroed and reported parts),
    /// keep the first `npages` pages of that, and free the rest: the other halves, then the tail
    /// beyond `npages` (as `alloc_pages_exact` does).
    pub(super) fn carve(&mut self, pfn: u32, order: u8, npages: u32, zero: bool) -> Taken {
        let m = self.meta(pfn).get();
        let t = m.freed_at_ms;
        let (pfn, mut counts) = self.split_from_list(pfn, &m, order, |low, high, half| suits(high, half, zero) > suits(low, half, zero));
        let size = 1u32 << order;
        if npages < size {
            if let Some(s) = counts.uniform_state(size) {
                // One state: the tail's pieces in one pass (no descent, no half records).
                let max_order = self.max_order;
                for_each_piece(pfn + npages, size - npages, max_order, |p, o| self.relist(p, o, StateCounts::uniform(s, 1 << o), t));
                counts = StateCounts::uniform(s, npages);
            } else {
                let tail = self.free_outside(pfn, order, counts, (pfn, pfn + npages), t);
                counts = counts.minus(tail);
            }
        }
        self.arena.free_map().mark(pfn, npages, true);
        let counts = self.settle_units(pfn, npages, counts);
        Taken { pfn, npages, counts }
    }

    /// Split the listed block at `pfn`, whose record is `m`, down to order `to`, keeping at each
    /// step the upper half when `keep_high(low, high, half_pages)` says so and listing the other
    /// half (freed when the block was). Returns the kept block, unlisted and marked taken in the
    /// free-page map, and its counts.
    pub fn split_listed(&mut self, pfn: u32, m: &Record, to: u8, keep_high: impl Fn(StateCounts, StateCounts, u32) -> bool) -> (u32, StateCounts) {
        let (pfn, counts) = self.split_from_list(pfn, m, to, keep_high);
        self.arena.free_map().mark(pfn, 1 << to, true);
        (pfn, counts)
    }

    /// `split_listed` (of a block on its list, which it unlists), the kept block left marked free
    /// in the free-page map (the caller marks what it takes of it). No bit changes here: the
    /// halves stay marked free, as the block was.
    fn split_from_list(&mut self, mut pfn: u32, m: &Record, to: u8, keep_high: impl Fn(StateCounts, StateCounts, u32) -> bool) -> (u32, StateCounts) {
        self.unlist(pfn, m);
        let (mut cur, mut counts) = (m.order, m.counts);
        while cur > to {
            let (low, high) = self.halves(pfn, cur, counts);
            cur -= 1;
            let half = 1u32 << cur;
            if keep_high(low, high, half) {
                self.list(pfn, cur, low, m.freed_at_ms);
                pfn += half;
                counts = high;
            } else {
                self.list(pfn + half, cur, high, m.freed_at_ms);
                counts = low;
            }
        }
        (pfn, counts)
    }

    /// Take `npages` pages (more than the largest block) as the first run of adjacent free
    /// top-level blocks long enough.
    pub fn take_run(&mut self, npages: u32) -> Option<Taken> {
        self.merge_deferred_below(self.max_order + 1);
        let top = 1u32 << self.max_order;
        let need = npages.div_ceil(top);
        let mut run_start = 0u32;
        let mut run_len = 0u32;
        let mut p = 0u32;
        while p < self.npages {
            // An unwritten top-level block is free (tops.rs).
            if p >= self.unwritten || self.meta(p).is_free_of_order(self.max_order) {
                if run_len == 0 {
                    run_start = p;
                }
                run_len += 1;
                if run_len == need {
                    break;
                }
            } else {
                run_len = 0;
            }
            p += top;
        }
        if run_len < need {
            return None;
        }
        self.write_tops_below(run_start + need * top);
        let mut counts = StateCounts::default();
        let mut t = 0;
        for i in 0..need {
            let b = run_start + i * top;
            let m = self.meta(b).get();
            counts = counts.plus(m.counts);
            t = t.max(m.freed_at_ms);
            self.unlist(b, &m);
        }
        if npages < need * top {
            // The tail lies in the last top-level block.
            let last = run_start + (need - 1) * top;
            let lc = self.meta(last).counts();
            let start = run_start + npages;
            let tail = self.free_outside(last, self.max_order, lc, (last, start), t);
            counts = counts.minus(tail);
        }
        self.arena.free_map().mark(run_start, npages, true);
        let counts = self.settle_units(run_start, npages, counts);
        Some(Taken { pfn: run_start, npages, counts })
    }
}
