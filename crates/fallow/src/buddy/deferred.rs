//! Deferred merge of the last dirty run freed: the hot reuse loop above the caches' orders.
//!
//! A program that frees a block of n pages (2^(k-1) < n <= 2^k, too large for the per-thread
//! caches) and asks for about as much again at once would, with every free merged as far as it
//! goes, pay for the whole way each time: the free lists the run as its aligned pieces, which
//! merge with the pieces the take left beside it and on up to the arena's top block, and the
//! next take splits that top block down again (about 36 list operations, 7,500 instructions a
//! pair for 4-8 MiB in a 1 GiB arena). glibc reuses the chunk in place, jemalloc delays
//! coalescing its dirty extents for the same reason ("cached extents are likely to be reused
//! soon").
//!
//! Here, when a dirty run that starts its aligned block `B` of order k is freed and the rest of
//! `B` is listed as the pieces the take left (in any states: a tail the program never reaches
//! stays `Zeroed` or `Reported`), those pieces are unlinked and `B` is listed whole, of order k,
//! with the half records a merge would have written, without merging it with its buddy: the
//! arena's one unmerged block (`Buddy::unmerged`). The next take of order k finds it at the head
//! of its list and splits nothing above it. About 12 list operations a pair.
//!
//! Invariant (relaxing "two free buddies of the same order never both sit on lists"): only the
//! unmerged block and its buddy may both be listed free of the same order. It merges as any
//! block does (`merge_deferred`) before another is left unmerged, and before a take of a larger
//! order or of a run of top-level blocks looks for one, so that no request ever misses memory
//! that merging would have given it, and when the reporter finds it free for `zero_delay`
//! (`merge_deferred_idle`: the program did not take it back at once). Taken, split, isolated by a worker or merged by a
//! neighbour's free meanwhile, it is simply no longer the listed block of its order at its place,
//! and the record is dropped.

use super::{for_each_piece, Buddy};
use crate::page::{PageState, StateCounts};

impl Buddy {
    /// `release_live`'s free of the run `[pfn, pfn + n)`, whose pages are now `Dirty`, when the
    /// rest of its aligned block is listed as the pieces the take left (see the top): lists the
    /// block whole, unmerged. `false`: nothing done, the caller frees the run as usual.
    pub(super) fn free_run_deferred(&mut self, pfn: u32, n: u32, t: u32) -> bool {
        let Some(size) = n.checked_next_power_of_two() else { return false };
        let k = size.trailing_zeros() as u8;
        if k > self.max_order || pfn & (size - 1) != 0 {
            return false;
        }
        // The rest of the block: each of its largest aligned pieces a listed block of exactly
        // that piece. (A free block holding a piece lies inside the block: aligned blocks nest,
        // and the run is live.)
        let (mut whole, mut rest) = (true, StateCounts::default());
        for_each_piece(pfn + n, size - n, k, |p, o| {
            let m = self.meta(p);
            whole &= m.is_free_of_order(o);
            rest = rest.plus(m.counts());
        });
        if !whole {
            return false;
        }
        // The run is dirty, so the block's counts are the rest's. A block not wholly dirty needs
        // its half records (the module header of `buddy`): the pieces keep theirs, the sub-blocks
        // across the run's end get theirs here.
        if rest != StateCounts::default() {
            let joined = self.join_records(pfn, k, pfn + n);
            debug_assert_eq!(joined, rest);
        }
        let mut t = t;
        for_each_piece(pfn + n, size - n, k, |p, _| {
            let m = self.meta(p).get();
            t = t.max(m.freed_at_ms);
            self.unlist(p, &m);
        });
        self.merge_deferred();
        // The pieces stay marked free in the free-page map: only the run's pages change.
        self.free_map().mark(pfn, n, false);
        self.list(pfn, k, rest, t);
        self.unmerged = Some((pfn, k));
        true
    }

    /// The counts of the aligned block `(q, j)` whose pages below `edge` are the dirty run and
    /// whose pages from `edge` on are the listed pieces of `free_run_deferred`, writing the half
    /// record of each sub-block that crosses `edge`, as merging the pieces would. One descent
    /// along `edge`, O(j), the tiling `for_each_piece` and `free_outside` make: a sub-block
    /// wholly past `edge` is one piece, whose record holds its counts and whose own half records
    /// are in place.
    fn join_records(&mut self, q: u32, j: u8, edge: u32) -> StateCounts {
        let size = 1u32 << j;
        if q + size <= edge {
            return StateCounts::uniform(PageState::Dirty, size);
        }
        if q >= edge {
            return self.meta(q).counts();
        }
        let half = size / 2;
        let high = self.join_records(q + half, j - 1, edge);
        let low = self.join_records(q, j - 1, edge);
        self.meta(q + half).set_counts(high);
        low.plus(high)
    }

    /// Merge the unmerged block, if it is still the listed block of its order at its place.
    pub(super) fn merge_deferred(&mut self) {
        let Some((pfn, k)) = self.unmerged.take() else { return };
        if !self.meta(pfn).is_free_of_order(k) {
            return;
        }
        let m = self.meta(pfn).get();
        self.unlist(pfn, &m);
        self.relist(pfn, k, m.counts, m.freed_at_ms);
    }

    /// The reporter's pass: merge the unmerged block if it has stayed free since `before_ms` or
    /// longer (the program did not take it back at once), so that a run freed last and then
    /// left alone merges into the blocks that go back to the kernel. (Below `report_order`, an
    /// unmerged pair would otherwise hold back its top-level block's part for good.)
    /// Otherwise, with an unmerged block younger than that, the ms until it will be old enough
    /// (the reporter looks again then rather than go idle).
    pub(crate) fn merge_deferred_idle(&mut self, before_ms: u32) -> Option<u32> {
        let (pfn, _) = self.unmerged?;
        let freed = self.meta(pfn).freed_at_ms();
        if freed <= before_ms {
            self.merge_deferred();
            return None;
        }
        Some(freed - before_ms)
    }

    /// Before a take of `order` looks for a block: merge the unmerged block if it is of a
    /// smaller order (its merge may make the larger block the take needs).
    #[inline]
    pub(crate) fn merge_deferred_below(&mut self, order: u8) {
        if self.unmerged.is_some_and(|(_, k)| k < order) {
            self.merge_deferred();
        }
    }

    /// Whether `pfn` of `order` is the unmerged block or its buddy (`check_lists`).
    pub(super) fn is_unmerged_pair(&self, pfn: u32, order: u8) -> bool {
        self.unmerged.is_some_and(|(u, k)| k == order && (pfn == u || pfn == u ^ (1u32 << k)))
    }
}
