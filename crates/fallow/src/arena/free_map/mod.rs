//! The free-page map: one bit per page saying whether it lies in a listed free block, and
//! summaries of the bits in four levels (units of 512 pages to 1 GiB, each eight units of the
//! level below), so that the runs of adjacent free pages long enough for a request are found
//! without walking the free lists.
//!
//! The buddy's lists find a free block of an order at once, but not a run of adjacent free
//! blocks of a length: after many frees of blocks at their real size, free memory is pieces of
//! every order side by side, and a search that starts from listed blocks (`buddy/span.rs`)
//! reaches only the runs around the blocks it looks at. Go's page allocator keeps the same
//! shape (`runtime/mpagealloc.go`: a bitmap of pages and, per chunk, the free pages at its start,
//! the longest free run inside it and the free pages at its end, in a radix tree of summaries);
//! fallow keeps four levels of it over each arena and sweeps them in address order, descending
//! only into the units whose inner runs could hold the request.
//!
//! Invariants (checked by `FreeMap::check`, from `Buddy::check_lists`):
//! - Bit `p` is clear exactly when page `p` lies in a listed free block, the unwritten top-level
//!   blocks included (a fresh mapping reads zero: every page free, as a fresh arena's are).
//!   The buddy marks the pages an operation frees or takes (`Buddy::free_block`,
//!   `free_run_deferred`, `unlink_read`, the kept pages of `split_listed` and of a take), not a
//!   split's or a merge's halves, which stay free.
//! - A unit whose stale bit is clear has a summary that says what its children (words, or the
//!   units of the level below) say. A change of bits sets the stale bits of the units above it
//!   at every level; a sweep refreshes the stale ones below its limit first, so the cost of
//!   the summaries falls on the searches, not on every list operation.
//! - Summaries are stored complemented (`free_mask ^ summary`), so that a fresh mapping's zeros
//!   read as wholly free units.
//!
//! Nothing here takes a lock: the map is the buddy's, under the allocator lock.

/// Free pages at the start of a unit, in its longest free run that touches neither of its
/// edges (`inner`), and at its end. A wholly free unit: `start == end == size`, `inner == 0`.
/// The edges' runs are apart because a sweep joins them to its neighbours' without looking
/// inside: only a unit whose `inner` run could hold a request is descended into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Summary {
    start: u32,
    inner: u32,
    end: u32,
}

impl Summary {
    /// A unit with no free page.
    const NONE: Summary = Summary { start: 0, inner: 0, end: 0 };

    const fn full(size: u32) -> Summary {
        Summary { start: size, inner: 0, end: size }
    }

    /// The summary of one word of bits (a set bit: a page not free).
    fn of_word(w: u64) -> Summary {
        let f = !w;
        if f == !0 {
            return Summary::full(64);
        }
        let mut fold = Fold::new();
        let (mut x, mut off) = (f, 0u32);
        while x != 0 {
            let gap = x.trailing_zeros();
            x >>= gap;
            off += gap;
            let run = x.trailing_ones();
            fold.push(Summary::NONE, gap);
            fold.push(Summary::full(run), run);
            off += run;
            x = if run == 64 { 0 } else { x >> run };
        }
        fold.push(Summary::NONE, 64 - off);
        fold.finish()
    }

    fn at_most(self, size: u32) -> Summary {
        Summary { start: self.start.min(size), inner: self.inner.min(size), end: self.end.min(size) }
    }
}

/// The summary of consecutive units, folded left to right. A unit with no page used adds to
/// the run under way; a `size` of zero adds nothing.
struct Fold {
    start: u32,
    inner: u32,
    cur: u32,
    in_start: bool,
}

impl Fold {
    fn new() -> Fold {
        Fold { start: 0, inner: 0, cur: 0, in_start: true }
    }

    fn push(&mut self, s: Summary, size: u32) {
        if size == 0 {
            return;
        }
        if s.start == size {
            self.cur += size;
            return;
        }
        self.cur += s.start;
        if self.in_start {
            self.start = self.cur;
            self.in_start = false;
        } else {
            self.inner = self.inner.max(self.cur);
        }
        self.inner = self.inner.max(s.inner);
        self.cur = s.end;
    }

    fn finish(self) -> Summary {
        let start = if self.in_start { self.cur } else { self.start };
        Summary { start, inner: self.inner, end: self.cur }
    }
}

/// The run of free pages under way in a sweep (its first page), and what the sweep reports to.
struct Sweep<F> {
    open: Option<u32>,
    /// The map's pages: the last word's bits past them read free.
    npages: u32,
    /// The caller's limit: a run that reaches it ends at most `2 * n` pages past its start
    /// (`end_bound`).
    limit: u32,
    n: u32,
    f: F,
    stopped: bool,
}

impl<F: FnMut(u32, u32) -> bool> Sweep<F> {
    /// The run under way ends at `end`: reported if it holds `n` pages.
    fn close(&mut self, end: u32) {
        if self.stopped {
            return;
        }
        if let Some(start) = self.open.take() {
            let end = end.min(self.end_bound(start));
            if start < self.limit && end - start >= self.n && !(self.f)(start, end) {
                self.stopped = true;
            }
        }
    }

    /// Where a run from `start` is cut: the map's end, and for a run past the limit `2 * n`
    /// pages past its start (room for any place of the request; the never-used rest of the
    /// arena beyond is no part of a fit).
    fn end_bound(&self, start: u32) -> u32 {
        let past = (start as u64 + 2 * self.n as u64).max(self.limit as u64);
        past.min(self.npages as u64) as u32
    }

    /// A unit of `size` pages at `base` whose inner runs are all below `n` (or none): its start
    /// run ends the run under way, its end run opens the next.
    fn pass(&mut self, base: u32, s: Summary, size: u32) {
        if s.start == size {
            self.open.get_or_insert(base);
            return;
        }
        if s.start > 0 {
            self.open.get_or_insert(base);
        }
        self.close(base + s.start);
        if s.end > 0 {
            self.open = Some(base + size - s.end);
        }
    }

    /// One word of bits at `base`, run by run. A run inside a word touches neither of its
    /// edges, so it is at most 62 pages long: for longer requests, and for words wholly free or
    /// used, the word's edges are all that counts.
    fn word(&mut self, base: u32, w: u64) {
        let f = !w;
        if self.n > 62 || f == 0 || f == !0 {
            return self.pass(base, Summary { start: f.trailing_ones(), inner: 0, end: f.leading_ones() }, 64);
        }
        let (mut x, mut off) = (f, 0u32);
        while x != 0 && !self.stopped {
            let gap = x.trailing_zeros();
            if gap > 0 {
                self.close(base + off);
            }
            x >>= gap;
            off += gap;
            let run = x.trailing_ones();
            self.open.get_or_insert(base + off);
            off += run;
            if off == 64 {
                return;
            }
            x >>= run;
        }
        self.close(base + off);
    }
}

/// The map over an arena's pages, in memory the arena reserved for it (`FreeMap::bytes`).
pub(crate) struct FreeMap {
    /// The bits, a word per 64 pages.
    bits: *mut u64,
    /// The summaries, level 1 (512 pages a unit) to `LEVELS` (256 Ki pages, 1 GiB).
    levels: [Level; LEVELS],
    npages: u32,
    /// The pages the words cover: `npages` rounded up to 64.
    span: u32,
}

/// One level of summaries: a stale bit and a complemented summary per unit.
#[derive(Clone, Copy)]
struct Level {
    stale: *mut u64,
    sums: *mut u64,
    units: usize,
}

// SAFETY: the pointers are to the arena's own mapping, which outlives the map; the map moves
// with its arena and is used under the allocator lock only.
unsafe impl Send for FreeMap {}

/// Levels of summaries above the words; each unit is `FANOUT` units of the level below.
const LEVELS: usize = 4;
const FANOUT: usize = 8;

/// Pages of a unit of `level` (0: a word).
const fn unit_pages(level: usize) -> u32 {
    64 << (3 * level)
}

/// Units of `level` over `npages` pages.
fn units(npages: u32, level: usize) -> usize {
    npages.div_ceil(unit_pages(level)) as usize
}

/// A summary as stored: three fields of 20 bits, complemented with a wholly free unit's
/// (`free_mask`), so that zero reads as free.
fn encode(s: Summary, level: usize) -> u64 {
    encode_plain(s) ^ free_mask(level)
}

/// What a summary is complemented with: a wholly free unit of `level`'s fields.
fn free_mask(level: usize) -> u64 {
    encode_plain(Summary::full(unit_pages(level)))
}

fn encode_plain(s: Summary) -> u64 {
    s.start as u64 | (s.inner as u64) << 20 | (s.end as u64) << 40
}
fn decode(v: u64, level: usize) -> Summary {
    let v = v ^ free_mask(level);
    Summary { start: (v & 0xfffff) as u32, inner: (v >> 20 & 0xfffff) as u32, end: (v >> 40 & 0xfffff) as u32 }
}

impl FreeMap {
    /// Bytes of memory a map over `npages` pages takes (a multiple of 8).
    pub(crate) fn bytes(npages: u32) -> usize {
        let per_level: usize = (1..=LEVELS).map(|l| units(npages, l).div_ceil(64) + units(npages, l)).sum();
        8 * (units(npages, 0) + per_level)
    }

    /// The map over `npages` pages in the `bytes(npages)` bytes at `base`.
    ///
    /// # Safety
    /// `base` is 8-aligned, and the `bytes(npages)` bytes there are zero (a fresh mapping) or a
    /// map over the same pages, readable and writable for as long as the map is used, by it alone.
    pub(crate) unsafe fn from_raw(base: *mut u64, npages: u32) -> FreeMap {
        let null = Level { stale: core::ptr::null_mut(), sums: core::ptr::null_mut(), units: 0 };
        let mut levels = [null; LEVELS];
        // SAFETY: each part lies inside the `bytes(npages)` bytes at `base` (the caller's
        // promise), laid out in the order `bytes` counts them: the bits, then each level's stale
        // bits and summaries.
        unsafe {
            let mut at = base.add(units(npages, 0));
            for (i, l) in levels.iter_mut().enumerate() {
                let n = units(npages, i + 1);
                *l = Level { stale: at, sums: at.add(n.div_ceil(64)), units: n };
                at = at.add(n.div_ceil(64) + n);
            }
        }
        FreeMap { bits: base, levels, npages, span: npages.next_multiple_of(64) }
    }

    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        debug_assert!(i < units(self.npages, 0));
        // SAFETY: `i` is below the map's word count (its callers' page numbers are below
        // `npages`), inside the bits' part of the mapping.
        unsafe { *self.bits.add(i) }
    }

    /// Pages unit `i` of `level` covers: a whole unit but the last, which ends with the last
    /// word (whose bits past `npages` read free and are never reported: `Sweep::close`).
    fn size(&self, level: usize, i: usize) -> u32 {
        unit_pages(level).min(self.span - i as u32 * unit_pages(level))
    }

    /// Unit `i` of `level`'s summary as stored (a fresh, partial last unit reads as wholly
    /// free: its size).
    fn summary(&self, level: usize, i: usize) -> Summary {
        if level == 0 {
            return Summary::of_word(self.word(i));
        }
        let l = &self.levels[level - 1];
        debug_assert!(i < l.units);
        // SAFETY: `i` is a unit of the level (below `units`), inside its summaries.
        decode(unsafe { *l.sums.add(i) }, level).at_most(self.size(level, i))
    }

    /// Unit `i` of `level`'s summary from its children's (as stored, or the bits).
    fn fold_children(&self, level: usize, i: usize) -> Summary {
        let mut fold = Fold::new();
        let below = units(self.npages, level - 1);
        for c in i * FANOUT..((i + 1) * FANOUT).min(below) {
            fold.push(self.summary(level - 1, c), self.size(level - 1, c));
        }
        fold.finish()
    }

    /// Mark the pages `[pfn, pfn + n)` free (`used == false`: they were just listed) or not.
    pub(crate) fn mark(&mut self, pfn: u32, n: u32, used: bool) {
        debug_assert!(n > 0 && pfn as u64 + n as u64 <= self.npages as u64);
        let (first, last) = (pfn as usize, (pfn + n - 1) as usize);
        // `last < npages`: its word is the map's.
        fill_bits(self.bits, first, last, used);
        for (k, l) in self.levels.iter().enumerate() {
            let shift = unit_pages(k + 1).trailing_zeros();
            fill_bits(l.stale, first >> shift, last >> shift, true);
        }
    }

    /// Bring the summaries of the top-level units that start below page `limit` up to date,
    /// and every unit under them, lowest level first (a unit is folded from fresh children only).
    fn refresh(&mut self, limit: u32) {
        let tops = units(limit, LEVELS);
        for level in 1..=LEVELS {
            let l = self.levels[level - 1];
            let upto = l.units.min(tops << (3 * (LEVELS - level)));
            for wi in 0..upto.div_ceil(64) {
                // SAFETY: `wi` is a word of the level's stale bits (below `units / 64`, rounded up).
                let mut stale = unsafe { *l.stale.add(wi) };
                while stale != 0 {
                    let i = wi * 64 + stale.trailing_zeros() as usize;
                    stale &= stale - 1;
                    if i >= upto {
                        break;
                    }
                    take_bit(l.stale, i);
                    let s = self.fold_children(level, i);
                    // SAFETY: `i` is a unit of the level.
                    unsafe { *l.sums.add(i) = encode(s, level) };
                }
            }
        }
    }

    /// Report, in address order, every run of at least `n` free pages that starts below `limit`,
    /// as `f(start, end)`, until `f` returns `false`. Only the units whose inner runs could hold
    /// `n` pages are looked into (a unit's start and end runs join its neighbours' from the
    /// summary). The pages from `limit` on are the arena's never-used rest (the caller's
    /// `used_end`): free, but where a worker isolated a block that reaches past `limit`. So a run
    /// that reaches `limit` is reported last, its end found from the bits, at most `2 * n`
    /// pages past its start (enough for any place of the request in it; `None` past that).
    pub(crate) fn for_each_run(&mut self, limit: u32, n: u32, f: impl FnMut(u32, u32) -> bool) {
        let limit = limit.min(self.npages);
        if limit == 0 {
            return;
        }
        self.refresh(limit);
        let mut sw = Sweep { open: None, npages: self.npages, limit, n, f, stopped: false };
        for i in 0..units(limit, LEVELS) {
            self.visit(&mut sw, LEVELS, i, limit);
            if sw.stopped {
                return;
            }
        }
        if let Some(start) = sw.open.filter(|&s| s < limit) {
            // Its pages up to `limit` are free (the sweep went at least that far).
            let bound = sw.end_bound(start);
            let end = (limit..bound).find(|&p| !self.is_free(p)).unwrap_or(bound);
            sw.close(end);
        }
    }

    /// The sweep over unit `i` of `level`, whose first page is below `limit`.
    fn visit<F: FnMut(u32, u32) -> bool>(&self, sw: &mut Sweep<F>, level: usize, i: usize, limit: u32) {
        let (base, size) = (i as u32 * unit_pages(level), self.size(level, i));
        if level == 0 {
            return sw.word(base, self.word(i));
        }
        let s = self.summary(level, i);
        if s.inner < sw.n || s.start == size {
            return sw.pass(base, s, size);
        }
        let below = units(self.npages, level - 1);
        for c in i * FANOUT..((i + 1) * FANOUT).min(below) {
            if c as u32 * unit_pages(level - 1) >= limit || sw.stopped {
                return;
            }
            self.visit(sw, level - 1, c, limit);
        }
    }

    /// Whether page `p` is marked free.
    pub(crate) fn is_free(&self, p: u32) -> bool {
        self.word(p as usize / 64) >> (p % 64) & 1 == 0
    }

    /// Check the invariants at the top: `listed` calls its argument with every listed free block
    /// (first page, pages), which together hold `pages` pages. Every page of them marked free,
    /// and as many marked free in all, is the first invariant (the blocks do not overlap). Reads
    /// the map only and allocates nothing: it runs under the allocator lock, whose `malloc` may
    /// be this allocator's.
    pub(crate) fn check(&self, listed: impl FnOnce(&mut dyn FnMut(u32, u32)), pages: u64) -> Result<(), String> {
        let mut used = None;
        listed(&mut |p, n| {
            if used.is_none() {
                used = (p..p + n).find(|&q| !self.is_free(q));
            }
        });
        if let Some(q) = used {
            return Err(format!("free-page map: page {q} of a listed block marked used"));
        }
        let words = units(self.npages, 0);
        let mut free: u64 = (0..words).map(|i| self.word(i).count_zeros() as u64).sum();
        // The last word's bits past the map's pages read free.
        free -= (self.span - self.npages) as u64;
        if free != pages {
            return Err(format!("free-page map: {free} pages marked free, the lists hold {pages}"));
        }
        // A unit not stale has a summary its children's say; its children are not stale either
        // (a change marks every level, a refresh goes lowest first).
        for level in 1..=LEVELS {
            let l = &self.levels[level - 1];
            for i in 0..l.units {
                if bit(l.stale, i) {
                    continue;
                }
                let (stored, real) = (self.summary(level, i), self.fold_children(level, i));
                if stored != real {
                    return Err(format!("free-page map: unit {i} of level {level} summarized {stored:?}, its children say {real:?}"));
                }
                if level > 1 {
                    let below = &self.levels[level - 2];
                    if let Some(c) = (i * FANOUT..((i + 1) * FANOUT).min(below.units)).find(|&c| bit(below.stale, c)) {
                        return Err(format!("free-page map: unit {i} of level {level} fresh above stale unit {c}"));
                    }
                }
            }
        }
        Ok(())
    }
}

fn bit(words: *const u64, i: usize) -> bool {
    // SAFETY: `i` is a unit of the level whose stale bits `words` are.
    unsafe { *words.add(i / 64) >> (i % 64) & 1 == 1 }
}

/// Clear bit `i` of `words`; whether it was set.
fn take_bit(words: *mut u64, i: usize) -> bool {
    // SAFETY: as in `bit`.
    let w = unsafe { &mut *words.add(i / 64) };
    let was = *w >> (i % 64) & 1 == 1;
    *w &= !(1u64 << (i % 64));
    was
}

/// Set (`set`) or clear bits `first..=last` of `words`.
fn fill_bits(words: *mut u64, first: usize, last: usize, set: bool) {
    for i in first / 64..=last / 64 {
        let lo = if i == first / 64 { first % 64 } else { 0 };
        let hi = if i == last / 64 { last % 64 } else { 63 };
        let mask = (!0u64 >> (63 - hi)) & (!0u64 << lo);
        // SAFETY: `i` is a word of `words` (the map's bits, or a level's stale bits), whose
        // bits `first..=last` stand for pages or units of the map (the callers' ranges).
        let w = unsafe { &mut *words.add(i) };
        *w = if set { *w | mask } else { *w & !mask };
    }
}

#[cfg(test)]
mod tests;
