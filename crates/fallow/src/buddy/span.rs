//! Runs of adjacent free blocks: a request taken at its real size where no aligned block of its
//! order is free in the classes it prefers.
//!
//! A buddy allocator serves n pages (2^(k-1) < n <= 2^k) from an aligned free block of order k
//! and gives the tail back (`carve`, as Linux's `alloc_pages_exact`). Free memory, though, is
//! what the program's frees left: runs of adjacent free blocks of any orders, which merge only
//! along the binary tree. After a few rounds of requests of 5-25 MiB, the resident free memory
//! holds runs of 20-30 MiB with no aligned 32 MiB block in them; every 17 MiB request then
//! faulted fresh memory in while enough resident memory lay free beside it, and the process held
//! 30-40% more than glibc, which serves exact sizes from its free chunks.
//!
//! `take_best_run` looks, before falling back to memory the kernel must fault in, for the
//! shortest run of adjacent free blocks that holds the request and a resident block (a listed
//! block of one of the classes asked for), as TCMalloc's page heap takes the best-fitting span.
//! A run's length counts its pages below `used_end` only (the never-used rest of the arena is no
//! fit, as glibc's top chunk is not), and the placement taking the fewest pages that are not
//! resident (reported, lazily freed or never used) wins first; between runs as long, the one
//! with fewer resident pages of the kind the request does not prefer (dirty ones for a `ZERO`
//! request, zeroed ones for a plain one).
//! A run of more than 2^(k-1) pages holds an aligned block of order k-2, so the resident blocks
//! of order k-2 and above are the seeds: each is extended both ways through the free blocks
//! beside it (found from their records: one read for the block after the run, two for the block
//! before it, whose last page's record names its first page: its tail mark, `block_ending_at`;
//! probing each order that could end there, a read per order and a cache miss each, was two
//! thirds of the search, and is left for the start of the run and the blocks without a mark),
//! and a seed inside a run already measured is skipped (the runs
//! measured are kept by start: a binary search). The request goes at the run's start or its end
//! (the rest of the run stays whole), or else covering the seed, whichever takes the fewest
//! pages that are not resident (at an end when the run is all resident: placed at its seed, a
//! request in the middle of a run left two holes where one would do). A search ends early only
//! at a run the request fills exactly. A seed larger than the request whose pages are in
//! several states (merged from resident and reported parts: the class of a block is `Dirty` as
//! soon as one page is) is first narrowed, by its half records, to its part of the request's
//! order with the most resident pages, so that covering the seed covers resident pages.
//!
//! The pages taken are unlinked block by block and the parts of those blocks outside the request
//! go back as the largest aligned pieces with their own counts (`take_range`, which growing in
//! place uses too), so every page keeps its state, the half records stay right, and the freed
//! pieces are ordinary free blocks that zeroing and reporting treat as any other. A live block
//! that does not start on its order's boundary frees as any run does (`free_range`), merging
//! with its neighbours.
//!
//! When no run holds the request, memory is faulted in: a request below 32 MiB (`BIG_ORDER`)
//! goes right after the arena's used part (`take_top`, as glibc's top chunk grows); an aligned
//! block of reported memory instead left a gap of never-used pages before each such block,
//! which later runs around it faulted in. Freed between live neighbours, such a block leaves
//! pieces below the workers' orders at its ends, which the workers take too
//! (`config::PIECE_ORDER`). Larger requests stay aligned to their order, so that freed they
//! merge back whole for the reporter's early rule for big blocks, and so does every request
//! with huge-page units.
//!
//! The seeds reach only the runs around blocks of order k-2 and above, and only as many as the
//! limits let them: after many frees of blocks of 16-256 KiB at their real size, most free
//! pages lay in runs of smaller pieces that no seed led to. When no seed gave a placement of
//! resident pages alone, the free-page map (`arena/free_map/`) gives the first runs long
//! enough in address order, each placed at its start or its end and ranked by the same key.
//!
//! Cost: at most `SEED_LIMIT` runs measured, each extended by at most `EXTEND_LIMIT` blocks a
//! side (one record read a step forward, two backward but at the run's start), and at most
//! `SEEDS_WALKED` seeds looked at (a quarter of each below `SEARCH_FULL_PAGES`); then at most
//! `MAPPED_LIMIT` runs of the map, whose sweep looks into the units (of 64 pages to 1 GiB)
//! whose inner runs are long enough.

use super::{suits, Buddy, Taken};
use crate::page::{Class, StateCounts, CLASSES, NIL};

/// Runs measured per take (each a record read or a few at every block it is extended by), and
/// seeds looked at (a seed inside a run already measured costs a binary search of the runs
/// measured and one record read), for requests of `SEARCH_FULL_PAGES` and more; a quarter of
/// each below, where the free-page map's runs do most of the finding and the program's own
/// work on the block (a memset of at most 256 KiB) is short beside a long search.
const SEED_LIMIT: u32 = 64;
const SEEDS_WALKED: u32 = 256;
const SEARCH_FULL_PAGES: u32 = 64;
/// Free blocks a run is extended by on each side of its seed.
const EXTEND_LIMIT: u32 = 40;
/// Runs of the free-page map measured per take, after the seeds' (each a state count of two
/// placements: a step per eight pages).
const MAPPED_LIMIT: usize = 16;

impl Buddy {
    /// Take `npages` pages starting at a multiple of `align` pages (a power of two) from the
    /// best-fitting run of adjacent free blocks that holds them and a listed block of one of
    /// `classes` of order at least `order - 2` (`order`: the one `npages` rounds up to), placed
    /// at one of its ends or to cover that block (its best part, `best_part`): fewest pages not
    /// resident, then the shortest run (its used part), then the fewest resident pages the
    /// request does not prefer, then the lowest place. `None` when no
    /// such run exists (see the top).
    pub fn take_best_run(&mut self, npages: u32, order: u8, align: u32, classes: &[Class], zero: bool) -> Option<Taken> {
        debug_assert!(align.is_power_of_two() && npages > 0);
        let lo = order.saturating_sub(2);
        // (non-resident pages taken, run length, resident pages of the other kind, start of the
        // request)
        let mut best: Option<(u32, u32, u32, u32)> = None;
        // The runs already measured, by start (a seed inside one of them gives the same run),
        // each with the best (non-resident pages, pages of the other kind) a placement in it took,
        // as one key (`u64::MAX`: none fits): a seed inside a run where a placement took neither
        // has nothing better to offer.
        let mut seen = [(0u32, 0u32, 0u64); SEED_LIMIT as usize];
        let (seed_limit, seeds_walked) =
            if npages >= SEARCH_FULL_PAGES { (SEED_LIMIT as usize, SEEDS_WALKED) } else { (SEED_LIMIT as usize / 4, SEEDS_WALKED / 4) };
        let (mut looked, mut walked) = (0usize, 0);
        'seeds: for &class in classes {
            let mut orders = self.nonempty[class as usize] & (!0u64 << lo);
            while orders != 0 {
                let o = orders.trailing_zeros() as u8;
                orders &= orders - 1;
                let mut seed = self.heads[class as usize][o as usize];
                while seed != NIL {
                    if looked == seed_limit || walked == seeds_walked {
                        break 'seeds;
                    }
                    walked += 1;
                    let next = self.meta(seed).next();
                    let i = seen[..looked].partition_point(|&(s, _, _)| s <= seed);
                    let known = i.checked_sub(1).map(|k| seen[k]).filter(|&(_, e, _)| seed < e);
                    // `k`: the run's entry in `seen`.
                    let (k, start, end) = match known {
                        Some((_, _, 0 | u64::MAX)) => {
                            seed = next;
                            continue;
                        }
                        Some((s, e, _)) => (i - 1, s, e),
                        None => {
                            let (s, e) = self.free_run_around(seed, o);
                            seen.copy_within(i..looked, i + 1);
                            seen[i] = (s, e, u64::MAX);
                            looked += 1;
                            (i, s, e)
                        }
                    };
                    let len = end.min(self.used_end).saturating_sub(start);
                    // Non-resident pages taken first (reported or never used: each costs a
                    // fault, the kernel's zeroing, and resident memory while resident free
                    // pages idle), then the shortest run, counting its pages below `used_end`
                    // only (the never-used rest of the arena is no fit, as glibc's top chunk
                    // is not), then the fewest resident pages of the kind the request does not
                    // prefer (dirty ones for `ZERO`, each a memset; zeroed ones otherwise, left
                    // for those who need them), then the lowest place. A run no better than the
                    // best even with every page resident and preferred is not counted.
                    if end - start < npages || best.is_some_and(|b| (0, len, 0) >= (b.0, b.1, b.2)) {
                        seed = next;
                        continue;
                    }
                    // A seed larger than the request that mixes states (a block merged from
                    // resident and reported parts) is narrowed to its best part of the
                    // request's order: covering the seed then means covering resident pages.
                    let (part, part_len) = self.best_part(seed, o, order, zero);
                    let mut placed: Option<(u32, u32, u32)> = None;
                    for at in placements(start, end, part, part_len, npages, align) {
                        let (absent, other) = self.measure(at, npages, zero);
                        if placed.is_none_or(|p| (absent, other) < (p.0, p.1)) {
                            placed = Some((absent, other, at));
                            if (absent, other) == (0, 0) {
                                break;
                            }
                        }
                    }
                    if let Some((absent, other, at)) = placed {
                        seen[k].2 = seen[k].2.min((absent as u64) << 32 | other as u64);
                        if best.is_none_or(|b| (absent, len, other, at) < b) {
                            best = Some((absent, len, other, at));
                            // A run the request fills exactly with pages it prefers: nothing
                            // fits better.
                            if absent == 0 && len == npages && other == 0 {
                                break 'seeds;
                            }
                        }
                    }
                    seed = next;
                }
            }
        }
        // The runs no seed reached (their blocks all below the seeds' orders, or past the
        // seeds' limits): the free-page map's, unless a seed gave a placement of resident
        // pages alone.
        if best.is_none_or(|b| b.0 != 0) {
            self.best_mapped_run(npages, align, zero, &mut best);
        }
        let (_, _, _, at) = best?;
        let counts = self.take_range(at, at + npages)?;
        Some(Taken { pfn: at, npages, counts })
    }

    /// The free-page map's part of `take_best_run`: the first `MAPPED_LIMIT` runs of at least
    /// `npages` free pages in address order (`FreeMap::for_each_run`), each with the request at
    /// its start or its end, ranked with `best` by the same key. A placement with no resident
    /// page is left to the fallbacks (`take_top` and the aligned takes). One with a few resident
    /// pages is taken before an aligned resident block: a bar of a quarter resident (a seed's
    /// share) held more, 557 -> 564 MiB with 3,200 blocks of 64-256 KiB replaced at random.
    fn best_mapped_run(&mut self, npages: u32, align: u32, zero: bool, best: &mut Option<(u32, u32, u32, u32)>) {
        let mut runs = [(0u32, 0u32); MAPPED_LIMIT];
        let mut found = 0;
        let used_end = self.used_end;
        self.free_map().for_each_run(used_end, npages, |start, end| {
            runs[found] = (start, end);
            found += 1;
            found < MAPPED_LIMIT
        });
        for &(start, end) in &runs[..found] {
            let len = end.min(used_end).saturating_sub(start);
            if best.is_some_and(|b| (0, len, 0) >= (b.0, b.1, b.2)) {
                continue;
            }
            for at in [start.next_multiple_of(align), (end - npages) & !(align - 1)] {
                if at < start || at + npages > end {
                    continue;
                }
                let (absent, other) = self.measure(at, npages, zero);
                if absent < npages && best.is_none_or(|b| (absent, len, other, at) < b) {
                    *best = Some((absent, len, other, at));
                }
            }
        }
    }

    /// The ranking of the placement of `npages` at `at`: its pages that are not resident
    /// (reported or lazily freed), then its resident pages of the kind the request does not
    /// prefer (dirty ones for `ZERO`, zeroed ones otherwise).
    fn measure(&self, at: u32, npages: u32, zero: bool) -> (u32, u32) {
        let c = self.count_states(at, npages);
        let absent = c.reported + c.lazy;
        (absent, if zero { npages - absent - c.zeroed } else { c.zeroed })
    }

    /// The request at the start of the never-used rest of the arena (`used_end`), unaligned
    /// but for `align`: the used part grows by the request, as glibc's top chunk. Only below
    /// `max_pages` (larger blocks keep their order's alignment, so that freed they merge back
    /// whole for the reporter's early rule for big blocks).
    pub fn take_top(&mut self, npages: u32, align: u32, max_pages: u32) -> Option<Taken> {
        // With huge-page units, a unit a live block shares must hold no `Reported` page
        // (units.rs), which the aligned takes of reported memory keep.
        if self.huge_units || npages >= max_pages {
            return None;
        }
        let at = self.used_end.next_multiple_of(align);
        let counts = self.take_range(at, at.checked_add(npages)?)?;
        Some(Taken { pfn: at, npages, counts })
    }

    /// `take_aligned` for a request of `live` pages (the rest of the block of `order` is slack)
    /// that wants resident memory, from a cache refill: of the first listed block of each of
    /// `classes` that fits, smallest order first (a class earlier in `classes` winning a tie, as
    /// `first_fit_in`), the first whose part a split would keep has at most an eighth of `live`
    /// in pages that are not resident. A block of a resident class is
    /// one with a resident page at least: merged from resident and reported parts, a large one is
    /// listed `Dirty` while most of it is reported, and a split of it would fault memory in while
    /// resident pages lay free elsewhere, in a run the locked path can take (`take_best_run`).
    /// When no other block could hold the request's resident pages (the arena lists fewer than
    /// `live` resident pages beside the first block found), that block is taken anyway: the
    /// locked path would find nothing better. `None`: a refill leaves the request to the locked
    /// path.
    pub fn take_resident(&mut self, live: u32, order: u8, classes: &[Class], zero: bool) -> Option<Taken> {
        let n = 1u32 << order;
        debug_assert!(live <= n && order <= self.max_order);
        self.merge_deferred_below(order);
        // The first fit of each class, by (order, place in `classes`).
        let mut fits = [(u8::MAX, 0usize, 0u32); CLASSES];
        for (i, &class) in classes.iter().enumerate() {
            if let Some(pfn) = self.first_fit(class, order) {
                fits[i] = (self.meta(pfn).word().order(), i, pfn);
            }
        }
        let fits = &mut fits[..classes.len()];
        fits.sort_unstable_by_key(|&(from, i, _)| (from, i));
        let mut first = None;
        for &(from, _, pfn) in fits.iter().filter(|f| f.0 != u8::MAX) {
            let (part, _) = self.best_part(pfn, from, order, zero);
            let c = self.count_states(part, live);
            if c.reported + c.lazy <= live / 8 {
                return Some(self.carve(pfn, order, n, zero));
            }
            first.get_or_insert((pfn, from));
        }
        let (pfn, from) = first?;
        let c = self.meta(pfn).counts();
        let resident = (1u64 << from) - (c.reported + c.lazy) as u64;
        if self.listed().resident_pages() - resident < live as u64 {
            return Some(self.carve(pfn, order, n, zero));
        }
        None
    }

    /// The part of the free block `(pfn, from)` a request of `order` should cover: the block
    /// itself if it is no larger or holds one state, else the aligned block of `order` inside it
    /// that a split keeps (`carve`: at each halving, the half that `suits` the request better).
    /// Reads the half records only; changes nothing.
    fn best_part(&self, mut pfn: u32, from: u8, order: u8, zero: bool) -> (u32, u32) {
        let mut counts = self.meta(pfn).counts();
        let mut cur = from;
        while cur > order && counts.uniform_state(1 << cur).is_none() {
            let (low, high) = self.halves(pfn, cur, counts);
            cur -= 1;
            let half = 1u32 << cur;
            if suits(high, half, zero) > suits(low, half, zero) {
                pfn += half;
                counts = high;
            } else {
                counts = low;
            }
        }
        (pfn, 1 << cur)
    }

    /// The run of adjacent free blocks around the listed block `(pfn, order)`, as `[start, end)`
    /// pages, extended by at most `EXTEND_LIMIT` blocks a side. A free block right after the
    /// run starts at its end, so one record read says whether there is one; the free block right
    /// before it, if any, is found from the record before its start (`block_ending_at`: two
    /// reads with a tail mark).
    fn free_run_around(&self, pfn: u32, order: u8) -> (u32, u32) {
        let mut start = pfn;
        for _ in 0..EXTEND_LIMIT {
            match self.block_ending_at(start) {
                Some((first, _)) => start = first,
                None => break,
            }
        }
        let mut end = pfn + (1u32 << order);
        for _ in 0..EXTEND_LIMIT {
            if end >= self.npages {
                break;
            }
            // An unwritten top-level block (tops.rs) is free, its record not yet written.
            if end >= self.unwritten {
                end += 1u32 << self.max_order;
                continue;
            }
            let m = self.meta(end);
            let k = m.word().order();
            if !m.is_free_of_order(k) || end & ((1u32 << k) - 1) != 0 {
                break;
            }
            end += 1u32 << k;
        }
        (start, end)
    }

    /// The tail mark of the block `(pfn, order)` being listed: its last page's record names its
    /// first page (`BlockMeta::set_tail_of`; an order-0 block is its own last page). Only below
    /// `used_end`, where the runs are measured: past it, a split of a never-used block would put
    /// a page of metadata in memory for each piece's mark (a piece of order 7 or more ends on
    /// another page of records than it starts). So never for a top-level block written by
    /// `write_top` (at `unwritten`, which is at or past `used_end`).
    #[inline]
    pub(super) fn mark_tail(&self, pfn: u32, order: u8) {
        if order > 0 && pfn + (1u32 << order) <= self.used_end {
            // SAFETY: the block being listed lies in this arena, its last page too.
            unsafe { self.meta_unchecked(pfn + (1u32 << order) - 1) }.set_tail_of(pfn);
        }
    }

    /// The listed free block that ends at page `end` (exclusive), if there is one. The record
    /// before `end` is an order-0 block's, or names the block it is the last page of (its tail
    /// mark), checked against that block's own record: two reads. A block without a mark (listed
    /// past `used_end`, which has since moved past it) is found as a block is without them: a
    /// read of the one place where a block of each order that could end at `end` would start.
    pub(super) fn block_ending_at(&self, end: u32) -> Option<(u32, u8)> {
        let last = end.checked_sub(1)?;
        let m = self.meta(last);
        if m.is_free_of_order(0) {
            return Some((last, 0));
        }
        let first = m.tail_of();
        let len = end.wrapping_sub(first);
        // A stale mark names anything: only a listed block of the right order and place counts.
        if first < last && len.is_power_of_two() && first & (len - 1) == 0 {
            let order = len.trailing_zeros() as u8;
            if order <= self.max_order && self.meta(first).is_free_of_order(order) {
                return Some((first, order));
            }
        }
        let top = (end.trailing_zeros() as u8).min(self.max_order);
        (1..=top).map(|k| (end - (1u32 << k), k)).find(|&(p, k)| self.meta(p).is_free_of_order(k))
    }

    /// Take the free pages `[start, end)` off the lists: every free block holding one of them is
    /// unlinked and its parts outside the range freed again as the largest aligned pieces, with
    /// their own counts. Returns the counts of the pages taken (huge-page units settled), or
    /// `None`, changing no block's state, when some page of the range is not free (the unwritten
    /// top-level blocks it reached may have been written: tops.rs).
    pub(super) fn take_range(&mut self, start: u32, end: u32) -> Option<StateCounts> {
        if end > self.npages {
            return None;
        }
        // Every page of [start, end) must lie in a free block; find those blocks first. A run of
        // free blocks that merging left is at most two descents of `max_order` blocks.
        let mut blocks: [(u32, u8); 64] = [(0, 0); 64];
        let mut nb = 0;
        let mut p = start;
        while p < end {
            if p >= self.unwritten {
                // The rest of the range lies in unwritten top-level blocks, all free: written
                // now, only once the pages before them are known free.
                self.write_tops_below(end);
            }
            let head = self.free_block_containing(p)?;
            if nb == blocks.len() {
                return None;
            }
            blocks[nb] = head;
            nb += 1;
            p = head.0 + (1u32 << head.1);
        }
        let mut taken = StateCounts::default();
        for &(b, order) in &blocks[..nb] {
            let m = self.meta(b).get();
            self.unlist(b, &m);
            let keep = (start.max(b), end.min(b + (1u32 << order)));
            let outside = self.free_outside(b, order, m.counts, keep, m.freed_at_ms);
            taken = taken.plus(m.counts.minus(outside));
        }
        if start < end {
            self.free_map().mark(start, end - start, true);
        }
        Some(self.settle_units(start, end - start, taken))
    }
}

/// The places a request of `n` pages aligned to `align` may go in the free run `[start, end)`
/// around the seed `[seed, seed + seed_len)`, best first: the run's start and its end (the rest
/// of the run stays in one piece), then covering the seed from its start or to its end.
fn placements(start: u32, end: u32, seed: u32, seed_len: u32, n: u32, align: u32) -> impl Iterator<Item = u32> {
    let fits = move |at: u32| end - start >= n && at >= start && at + n <= end && at.is_multiple_of(align);
    let seed_end = seed + seed_len;
    let cands = [start.next_multiple_of(align), end.saturating_sub(n) & !(align - 1), seed & !(align - 1), seed_end.saturating_sub(n) & !(align - 1)];
    cands.into_iter().filter(move |&at| fits(at))
}

#[cfg(test)]
mod tests {
    use super::placements;
    use crate::arena::Arena;
    use crate::buddy::Buddy;
    use crate::config::Backing;

    /// Blocks of `sizes` pages taken side by side from a fresh arena of 2^12-page blocks, live.
    fn taken_side_by_side(sizes: &[u32]) -> (Buddy, Vec<u32>) {
        let mut b = Buddy::new(Arena::reserve(64 << 20, 12, Backing::Anonymous, false).unwrap());
        let mut at = Vec::new();
        for &n in sizes {
            let t = b.take_top(n, 1, 1 << 12).unwrap();
            b.mark_live(t.pfn, n, 0);
            b.mark_used(t.pfn + n);
            at.push(t.pfn);
        }
        (b, at)
    }

    #[test]
    fn a_block_freed_below_used_end_is_found_from_its_end_by_its_tail_mark() {
        let (mut b, at) = taken_side_by_side(&[12, 4, 16, 16]);
        assert_eq!(at, [0, 12, 16, 32]);
        b.release_live(12, 4, 0);
        // Pages 12..16, order 2, listed below `used_end` (48): its last page names its first.
        assert_eq!(b.meta(15).tail_of(), 12);
        assert_eq!(b.block_ending_at(16), Some((12, 2)));
        assert_eq!(b.block_ending_at(12), None, "a live block ends at 12");
        // Past `used_end` no mark is written (the pieces of the split of the fresh arena): the
        // block 48..64 is found from its end by probing the orders that could end there.
        assert_ne!(b.meta(63).tail_of(), 48);
        assert_eq!(b.block_ending_at(64), Some((48, 4)));
        // A stale mark is not trusted: the block 12..16 taken again, its last page still names it.
        let t = b.take_top(0x40, 1, 1 << 12).unwrap();
        assert_eq!(t.pfn, 48);
        let _ = b.take_range(12, 16).unwrap();
        assert_eq!(b.meta(15).tail_of(), 12);
        assert_eq!(b.block_ending_at(16), None);
    }

    #[test]
    fn a_run_past_the_seeds_limits_is_found_by_the_free_page_map() {
        // [0, 8) freed first, then 40 holes of 4 pages between live blocks: the holes are the
        // seeds looked at first (the lowest order first, the most recently freed first), none
        // long enough for 8 pages, and more than a small request's seed limit.
        let mut sizes = vec![8];
        sizes.extend([4u32, 4].repeat(40));
        let (mut b, at) = taken_side_by_side(&sizes);
        b.release_live(0, 8, 0);
        for i in 0..40 {
            b.release_live(at[1 + 2 * i], 4, 0);
        }
        let used = b.used_end;
        let classes = super::super::resident_preference(false);
        let t = b.take_best_run(8, 3, 1, &classes, false).expect("the run of 8 free pages at 0");
        assert_eq!((t.pfn, t.npages), (0, 8));
        assert_eq!(b.used_end, used);
        b.check_lists().unwrap();
    }

    fn all(start: u32, end: u32, seed: u32, seed_len: u32, n: u32, align: u32) -> Vec<u32> {
        placements(start, end, seed, seed_len, n, align).collect()
    }

    #[test]
    fn a_request_goes_to_an_end_of_its_run_first_then_to_its_seed() {
        // Run [0, 100), seed in the middle: the start, the end, then from the seed and to its end.
        assert_eq!(all(0, 100, 48, 16, 20, 1), vec![0, 80, 48, 44]);
        // Aligned to 8: the end rounds down, the seed's places too.
        assert_eq!(all(3, 100, 50, 16, 20, 8), vec![8, 80, 48, 40]);
        // Too long for the run.
        assert_eq!(all(10, 30, 16, 8, 21, 1), Vec::<u32>::new());
        // Exactly the run: every place is its start.
        assert!(all(10, 30, 16, 8, 20, 1).iter().all(|&at| at == 10));
    }

    #[test]
    fn every_place_is_aligned_and_inside_its_run() {
        for start in 0..4u32 {
            for len in 1..24u32 {
                let end = start + len;
                for seed in start..end {
                    for seed_len in 1..=(end - seed) {
                        for n in 1..=len {
                            for align in [1u32, 2, 4, 8] {
                                let at = all(start, end, seed, seed_len, n, align);
                                assert!(at.iter().all(|&a| a >= start && a + n <= end && a % align == 0), "{start} {end} {seed} {seed_len} {n} {align}: {at:?}");
                                // Unaligned, a run that holds the request has a place for it.
                                assert!(align > 1 || len < n || !at.is_empty());
                            }
                        }
                    }
                }
            }
        }
    }
}
