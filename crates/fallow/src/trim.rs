//! Giving free memory back on demand: `Allocator::trim`, the C API's `fallow_trim` and the
//! preload's `malloc_trim`. The reporting worker gives back what has stayed free for its delay
//! (report.rs); a trim is the program saying that its free memory will not be wanted soon (after
//! a phase, before a long idle time, under a supervisor's memory check), as glibc's
//! `malloc_trim` releases every free page of its heaps at once.
//!
//! A trim runs in the calling thread, in batches as the reporter does: under the lock it
//! isolates up to `TRIM_BATCH` free blocks that hold resident pages (its own in-flight slots,
//! from `TRIM_SLOT`), then reports them without the lock (`report::send`: one `process_madvise`
//! a batch, with the reporting mode in force) and returns them `Reported` (or `LazyFree` for
//! `MADV_FREE`) under it again. So the lock is held for a scan of a batch, never across a system
//! call, and an allocation that finds other memory free never waits for the trim.
//!
//! What it takes, and in what order:
//! - every listed block of the `Dirty` class, then of the `Zeroed` class, each largest order
//!   first (the fewest system calls for the most memory), down to single pages, whatever its age
//!   and `resident_free_min` (the program asked); in arenas of huge-page units, only blocks of
//!   `report_order` and up (a report of less than a unit would split a huge page);
//! - leaving at least `keep_pages` of resident free memory (`malloc_trim`'s `pad`), so a
//!   program can keep some free memory for its next requests: a block that would take it below
//!   that stays, smaller ones still go (the zeroed blocks are the last to go, so what is kept is
//!   what serves `calloc` best);
//! - never the zeroed pages of `populated_reserve` (the zeroing worker would fault them back in
//!   at once): a zeroed block of it stays, and of a dirty block holding some only its largest
//!   part without them goes (`isolate_unzeroed_part`; the other halves are listed again and
//!   looked at in their turn, at the orders below);
//! - with `MADV_DONTNEED` where the reporting mode is `MADV_FREE`: lazily freed pages stay
//!   resident until the kernel runs short, and a trim is asked to lower the resident set now;
//! - at most the resident free pages there were when it started: a trim racing frees in other
//!   threads ends instead of chasing them.
//!
//! Trims are one at a time (`Heap::trimming`, under the lock): a second waits for the first to
//! end. A `fork` during a trim leaves the child the flag and the isolated blocks, which
//! `Allocator::after_fork_child` puts back (it returns every used in-flight slot).
//!
//! What the lists do not show is the caller's to bring back first (`Allocator::trim`): the
//! per-thread caches and the calling thread's empty spans of small objects.

use crate::config::{ReportMode, Tunables};
use crate::heap::{Shared, TRIM_BATCH, TRIM_SLOT};
use crate::os::{self, PAGE_SHIFT};
use crate::page::Class;
use crate::report::{self, Target};

/// Blocks looked at on one list per batch without taking one (too large to go with what is
/// kept): bounds the time under the lock.
const SKIP_LIMIT: u32 = 256;
/// The wait of a trim for another one to end, per look.
const WAIT_NS: u64 = 200_000;

/// Give back the free resident memory on the lists, but `keep_pages` of it (see the top).
/// Returns the bytes given back that were resident.
pub(crate) fn trim(s: &Shared, keep_pages: u64) -> u64 {
    let mut budget = loop {
        let mut h = s.heap.lock();
        if !h.trimming {
            h.trimming = true;
            break h.resident_free_pages().0;
        }
        drop(h);
        os::sleep_ns(WAIT_NS);
    };
    let mut given = 0u64;
    loop {
        let (n, mode, targets) = isolate_batch(s, keep_pages, budget);
        if n == 0 {
            break;
        }
        let bytes = report::send(s, mode, TRIM_SLOT, &targets[..n], &[false; TRIM_BATCH][..n], |_, _| {});
        given += bytes;
        // Nothing given back (every block refused, or nothing resident in them after all):
        // a next batch would find the same blocks.
        if bytes == 0 {
            break;
        }
        budget = budget.saturating_sub(bytes >> PAGE_SHIFT);
    }
    let mut h = s.heap.lock();
    h.trimming = false;
    h.reclaim.trims += 1;
    h.reclaim.trimmed_bytes += given;
    given
}

/// Under the lock: isolate up to `TRIM_BATCH` blocks with resident pages into the trim's slots,
/// leaving `keep_pages` resident free pages (and `populated_reserve` zeroed ones) and taking at
/// most `budget` pages. Returns how many, the way to report them and their targets.
fn isolate_batch(s: &Shared, keep_pages: u64, budget: u64) -> (usize, ReportMode, [Target; TRIM_BATCH]) {
    let mut targets = [Target::default(); TRIM_BATCH];
    let mut h = s.heap.lock();
    let t = h.tunables;
    let mode = match t.effective_mode(s.config.backing) {
        // A trim lowers the resident set now: lazily freed pages stay resident until the kernel
        // runs short.
        ReportMode::Free => ReportMode::DontNeed,
        m => m,
    };
    // The unmerged block (buddy/deferred.rs) merges first: it goes back whole with its pieces.
    for a in &mut h.arenas {
        let _ = a.merge_deferred_idle(u32::MAX);
    }
    let (mut left, mut zeroed) = h.resident_free_pages();
    let keep_zeroed = (t.populated_reserve >> PAGE_SHIFT) as u64;
    let mut taken = 0u64;
    let mut n = 0usize;
    // Dirty blocks first, then zeroed ones: what is kept is what serves `calloc` best.
    for class in [Class::Dirty, Class::Zeroed] {
        for ai in 0..h.arenas.len() {
            let (max_order, huge_units) = (h.arena(ai).max_order, h.arena(ai).huge_units);
            let lowest = if huge_units { t.report_lowest(true) } else { 0 };
            for order in Tunables::scan_orders(lowest, max_order, max_order, true) {
                let mut walk = h.arena(ai).oldest_first(class, order);
                let mut skipped = 0;
                while let Some((p, m)) = walk.next(h.arena(ai)) {
                    if taken >= budget {
                        return (n, mode, targets);
                    }
                    let res = (1u64 << order) - (m.counts.reported + m.counts.lazy) as u64;
                    let z = m.counts.zeroed as u64;
                    let reserve = z > 0 && zeroed < keep_zeroed + z;
                    // More than may go with `keep_pages` kept, or a zeroed block of the reserve: a
                    // smaller block may still go.
                    if left < keep_pages + res || (reserve && (class == Class::Zeroed || order == 0)) {
                        skipped += 1;
                        if skipped == SKIP_LIMIT {
                            break;
                        }
                        continue;
                    }
                    let rec = if reserve {
                        // A dirty block with zeroed pages of the reserve: its largest part
                        // without them goes (split down, the other halves listed again and
                        // looked at in their turn, at the orders below).
                        h.isolate_unzeroed_part(TRIM_SLOT + n, ai, p)
                    } else {
                        h.isolate(TRIM_SLOT + n, ai, p)
                    };
                    targets[n] = Target::of(h.arena(ai), rec.pfn, rec.order);
                    let res = (1u64 << rec.order) - (rec.counts.reported + rec.counts.lazy) as u64;
                    left -= res;
                    zeroed -= rec.counts.zeroed as u64;
                    taken += res;
                    n += 1;
                    if n == TRIM_BATCH {
                        return (n, mode, targets);
                    }
                }
            }
        }
    }
    (n, mode, targets)
}
