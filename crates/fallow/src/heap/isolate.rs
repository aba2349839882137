//! The background workers' interface to the locked allocator: take a listed block out
//! (`isolate`, `isolate_dirty_piece`: tagged `Isolated`, on no list, recorded in an in-flight
//! slot), and put it back with its pages in new states (`unisolate`), merging as a free does;
//! and the few questions a worker asks before it looks for work. Called with the lock held.

use crate::buddy::Buddy;
use crate::page::{Class, PageState, StateCounts, Tag};

use super::Heap;

/// One isolated block.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Inflight {
    pub used: bool,
    pub arena: u16,
    pub order: u8,
    pub pfn: u32,
    pub counts: StateCounts,
    pub freed_at_ms: u32,
}

/// The in-flight slot of the zeroing worker (the reporter's are `0..MAX_REPORT_BATCH`).
pub(crate) const ZERO_SLOT: usize = crate::config::MAX_REPORT_BATCH as usize;
/// The first in-flight slot of a trim on demand (trim.rs), which holds `TRIM_BATCH` of them
/// while `Heap::trimming` says it runs.
pub(crate) const TRIM_SLOT: usize = ZERO_SLOT + 1;
/// Blocks a trim reports per batch (one `process_madvise`).
pub(crate) const TRIM_BATCH: usize = 64;
/// In-flight slots in all.
pub(crate) const INFLIGHT: usize = TRIM_SLOT + TRIM_BATCH;

impl Heap {
    /// Whether some listed block of order >= `order` has pages not yet reported.
    pub(crate) fn has_unreported(&self, order: u8) -> bool {
        self.arenas.iter().any(|a| a.has_free(&[Class::Dirty, Class::Zeroed], order))
    }

    /// Whether some listed block the reporter takes (`Tunables::report_lowest` and up) has
    /// pages not yet reported.
    pub(crate) fn has_unreported_for(&self, t: &crate::config::Tunables) -> bool {
        self.arenas.iter().any(|a| a.has_free(&[Class::Dirty, Class::Zeroed], t.report_lowest(a.huge_units)))
    }

    /// Whether some listed block of order >= `order` has pages that need zeroing.
    pub(crate) fn has_dirty(&self, order: u8) -> bool {
        self.arenas.iter().any(|a| a.has_free(&[Class::Dirty], order))
    }

    /// Whether the zeroing worker's chunk, returned now, would merge into a free block of order
    /// `order` or more that is mostly resident: the chunk is at least that large, or every buddy
    /// on the way up is free, and at least half the pages of the block they make are neither
    /// reported nor lazily freed (counted as they were when the chunk was isolated). Then an
    /// allocation of that order that would otherwise fault in memory waits for it.
    pub(crate) fn zeroing_holds_part_of(&self, order: u8) -> bool {
        let rec = &self.inflight[ZERO_SLOT];
        if !rec.used {
            return false;
        }
        let a = self.arena(rec.arena as usize);
        if order > a.max_order {
            return false;
        }
        let not_resident = |c: StateCounts| (c.reported + c.lazy) as u64;
        let mut pages = 1u64 << rec.order;
        let mut away = not_resident(rec.counts);
        let mut pfn = rec.pfn;
        for o in rec.order..order {
            let buddy = pfn ^ (1u32 << o);
            if buddy >= a.npages || !a.meta(buddy).is_free_of_order(o) {
                return false;
            }
            pages += 1u64 << o;
            away += not_resident(a.meta(buddy).counts());
            pfn = pfn.min(buddy);
        }
        2 * away <= pages
    }

    /// Whether some listed block of order >= `order` has pages not yet reported, once each
    /// arena's deferred pair below `order` is merged (as `take` would merge it first).
    pub(crate) fn has_unreported_merged(&mut self, order: u8) -> bool {
        for a in &mut self.arenas {
            a.merge_deferred_below(order);
        }
        self.has_unreported(order)
    }

    /// Free pages that are resident (dirty, zeroed; lazily freed ones are not counted), and of
    /// them the zeroed ones.
    pub(crate) fn resident_free_pages(&self) -> (u64, u64) {
        let (mut resident, mut zeroed) = (0u64, 0u64);
        for a in &self.arenas {
            let l = a.listed();
            resident += l.resident_pages();
            zeroed += l.counts.zeroed as u64;
        }
        (resident, zeroed)
    }

    /// Pages of fallow's that may be resident: every page of every arena but the listed free
    /// pages that were reported (or lazily freed). Live blocks count whole (touched or not),
    /// cached and isolated pages count as resident: an estimate from above, in O(arenas).
    pub(crate) fn owned_resident_pages(&self) -> u64 {
        self.arenas
            .iter()
            .map(|a| {
                let l = a.listed();
                a.npages as u64 - (l.counts.reported + l.counts.lazy) as u64
            })
            .sum()
    }

    /// Take the listed free block at `pfn` of arena `ai` off its list and record it in `slot`.
    pub(crate) fn isolate(&mut self, slot: usize, ai: usize, pfn: u32) -> Inflight {
        let a = &mut self.arenas[ai];
        let m = a.meta(pfn).get();
        debug_assert_eq!(m.tag, Tag::Free);
        a.unlink(pfn);
        a.meta(pfn).set_tag(Tag::Isolated);
        let rec = Inflight {
            used: true,
            arena: ai as u16,
            order: m.order,
            pfn,
            counts: m.counts,
            freed_at_ms: m.freed_at_ms,
        };
        self.finish_isolate(slot, rec)
    }

    /// Take a piece of order `order` out of the listed free block at `pfn` (of a larger or equal
    /// order), choosing at each split the half that still has pages needing zeroing, and listing
    /// the other halves again. Records the piece in `slot`.
    pub(crate) fn isolate_dirty_piece(&mut self, slot: usize, ai: usize, pfn: u32, order: u8) -> Inflight {
        let a = &mut self.arenas[ai];
        let m = a.meta(pfn).get();
        let (p, counts) = a.split_listed(pfn, &m, order, |low, _, half| keeps_high(low, half));
        a.meta(p).set_isolated(order);
        let rec = Inflight { used: true, arena: ai as u16, order, pfn: p, counts, freed_at_ms: m.freed_at_ms };
        self.finish_isolate(slot, rec)
    }

    /// `isolate_dirty_piece` of the largest piece with no zeroed page: the split keeps at each
    /// step the half that needs zeroing (as `isolate_dirty_piece` does), down to the first part
    /// without a zeroed page (a single dirty page at worst), read from the half records first.
    /// The zeroed pages of the listed block `pfn` stay listed.
    pub(crate) fn isolate_unzeroed_part(&mut self, slot: usize, ai: usize, pfn: u32) -> Inflight {
        let a = &self.arenas[ai];
        let m = a.meta(pfn).get();
        let (mut p, mut order, mut c) = (pfn, m.order, m.counts);
        debug_assert!(c.needs_zeroing(1 << order) > 0);
        while c.zeroed > 0 && order > 0 {
            let (low, high) = a.halves(p, order, c);
            order -= 1;
            if keeps_high(low, 1 << order) {
                p += 1 << order;
                c = high;
            } else {
                c = low;
            }
        }
        self.isolate_dirty_piece(slot, ai, pfn, order)
    }

    fn finish_isolate(&mut self, slot: usize, rec: Inflight) -> Inflight {
        debug_assert!(!self.inflight[slot].used);
        self.inflight[slot] = rec;
        self.counters.isolated_pages += 1u64 << rec.order;
        rec
    }

    /// Return the block in `slot` to the free lists, each page's state rewritten by `new_state`
    /// (applied to maximal runs of equal state), merging with free buddies as usual. Returns the
    /// counts the pages had while isolated.
    pub(crate) fn unisolate(&mut self, slot: usize, new_state: impl Fn(PageState) -> PageState) -> StateCounts {
        self.unisolate_runs(slot, &[], new_state)
    }

    /// `unisolate`, but the pages of `reported` (runs `(pfn, pages)` inside the block, of pages
    /// now known to read zero and not to be resident) become `Reported` first, whatever
    /// `new_state` makes of the rest.
    pub(crate) fn unisolate_runs(
        &mut self,
        slot: usize,
        reported: &[(u32, u32)],
        new_state: impl Fn(PageState) -> PageState,
    ) -> StateCounts {
        let rec = self.inflight[slot];
        debug_assert!(rec.used);
        self.inflight[slot].used = false;
        let a = &mut self.arenas[rec.arena as usize];
        let n = 1u32 << rec.order;
        for &(pfn, len) in reported {
            debug_assert!(pfn >= rec.pfn && pfn + len <= rec.pfn + n);
            a.set_states(pfn, len, PageState::Reported);
        }
        let uniform = if reported.is_empty() { rec.counts.uniform_state(n) } else { None };
        let counts = match uniform {
            // The common case (a whole dirty block reported, a dirty chunk zeroed): one state
            // before, one after, one fill of the state bytes and no scan under the lock.
            Some(s) => {
                let t = new_state(s);
                if t != s {
                    a.set_states(rec.pfn, n, t);
                }
                StateCounts::uniform(t, n)
            }
            None => Self::rewrite_mixed(a, rec.pfn, rec.order, &new_state),
        };
        a.meta(rec.pfn).set_tag(Tag::None);
        a.free_block(rec.pfn, rec.order, counts, rec.freed_at_ms);
        self.counters.isolated_pages -= n as u64;
        rec.counts
    }

    /// `unisolate` of a block whose pages are in several states: rewrite them run by run, count
    /// them, and rebuild the half records if the result is still mixed.
    fn rewrite_mixed(a: &mut Buddy, pfn: u32, order: u8, new_state: &impl Fn(PageState) -> PageState) -> StateCounts {
        let n = 1u32 << order;
        let mut runs: [(u32, u32, PageState); 32] = [(0, 0, PageState::Dirty); 32];
        let mut nruns = 0;
        let mut rewrote_all = true;
        a.for_each_run(pfn, n, |start, len, s| {
            let t = new_state(s);
            if t != s {
                if nruns < runs.len() {
                    runs[nruns] = (start, len, t);
                    nruns += 1;
                } else {
                    rewrote_all = false;
                }
            }
        });
        for &(start, len, t) in &runs[..nruns] {
            a.set_states(start, len, t);
        }
        if !rewrote_all {
            // Many runs: one page at a time.
            for p in pfn..pfn + n {
                let s = a.state(p);
                a.states().set(p, new_state(s));
            }
        }
        let mut counts = a.count_states(pfn, n);
        if counts.uniform_state(n).is_none() {
            // Mixed after the worker's changes: the half records must describe the new states.
            counts = a.rebuild_records(pfn, order);
        }
        counts
    }
}

/// The split of a dirty piece (`isolate_dirty_piece`, `isolate_unzeroed_part`) keeps the upper
/// half of `2 * half` pages when the lower one, whose counts are `low`, needs no zeroing.
fn keeps_high(low: StateCounts, half: u32) -> bool {
    low.needs_zeroing(half) == 0
}
