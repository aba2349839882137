//! Trimming live spans (docs/design.md, "Small objects (slab layer)", "Trimming live spans"):
//! the owner of a span gives back to the kernel the pages of the span that hold no live object
//! once the span's count of live objects has come down to its low mark, and links the objects
//! on those pages again when the span's lists run out.
//!
//! This file owns the marks and the arming of a span, the trim, the refill, the trims of a
//! whole heap (`Allocator::drain_thread_cache`, the sweep's) and the heaps' trim counters.
//!
//! - **Marks.** A span is armed when the owner's slow path finds it full (every object in use:
//!   the high mark); armed, the bias `Span::low` (the low mark: a quarter of the span's objects,
//!   at most 1.4 a page) is taken out of `used`, so that the owner's free leaves its hot path
//!   (the compare of `used` against 2, which it makes anyway) when the count comes down to the
//!   mark: the hot paths gain no instruction. A trim arms the span again at half its mark (a span
//!   freed on down is trimmed as its count halves, down to 0); nothing arms it at its full mark
//!   again but being found full, and a span found full after a trim that gave pages back is
//!   armed at half the mark it had (`Span::backoff`): a program that frees most of its objects
//!   and takes as many again would otherwise pay a trim and a page fault per page given back at
//!   each cycle. A sweep trims the spans its collection of other threads' frees brought down.
//! - **Wait.** A span's first trim after it was armed waits until the owner has seen it at its
//!   mark for a two-hundredth of the report delay (10 ms by default; `Span::due_since`, noted
//!   on the rare side of the free that finds it due, asked again by its later frees and the
//!   sweep): a span emptied or refilled meanwhile is not trimmed, so a program that frees a batch
//!   and takes as many again pays nothing. The span's class taking it as its current span again
//!   starts the wait over; the trims of its cascade do not wait.
//! - **Trim.** The owner collects every free object of the span (`free`, `local_free`, and the
//!   other threads' frees with `collect`), marks them in a bitmap on its stack, finds the pages no
//!   live object touches (an object across a page boundary counts for every page it touches),
//!   gives each run of them back with one `madvise(MADV_DONTNEED)`, records them in
//!   `Span::given` (side metadata: nothing is written into a page given back) and links as the
//!   new `free` only the free objects that touch no page given back.
//! - **Rules.** An object touching a given-back page is free and on no list (so no link is on
//!   such a page) and is never handed out until the refill. Pages at and above `fresh` (objects
//!   never handed out, `take_fresh`'s) are left alone unless every object has been handed out.
//!   Only on the private anonymous backing without `thp` (there `MADV_DONTNEED` frees the page and
//!   it reads zero after; on a memfd it frees nothing, and on a huge page it splits the unit) and
//!   with `Config::small_trim` on.
//! - **Refill.** When a span's lists and its other threads' frees are empty, before its
//!   never-used objects, the objects touching given-back pages are linked again (in address
//!   order); for a request that wants zeros one that lies wholly on given-back pages is handed
//!   out unlinked, reading zero (no memset).
//! - **Back to the page layer.** A span that empties leaves as before, its given-back pages
//!   listed `Reported` (they read zero and are not resident: `Shared::free_with_states`), the
//!   pages no object was ever handed out on (whole granules at and above `fresh`) with the
//!   states they had when the span was taken (`Reported` or `Zeroed`: nothing wrote them), the
//!   others `Dirty`: the zeroing worker does not fault them back in, `calloc` takes them without
//!   a memset, placement does not count them resident, and the resident counts stay true.

use core::sync::atomic::Ordering::Relaxed;

use super::class::{granule_shift, CLASSES};
use super::heap::ThreadHeap;
use super::span::{Span, LISTED, UNLISTED};
use super::{heaps, Central, Slab};
use crate::config::Backing;
use crate::os::{self, Advice, PAGE_SIZE};
use crate::page::GranuleStates;
use crate::stats::Stats;

/// A span is first trimmed when its live objects come down to 1 / `LOW_DIV` of its objects or
/// to `PER_PAGE_8THS` / 8 per page of the span, whichever is fewer: with k live objects spread at
/// random over pages of p objects, a page is empty with a chance of about (1 - k/n)^p, which is
/// 1/4 at about 1.4 live objects a page (ln 4), whatever the class; above it a trim would give
/// back little (a span of 64-byte objects at a quarter live has no empty page).
const LOW_DIV: usize = 4;
const PER_PAGE_8THS: usize = 11;

/// `Span::due_since`: the span was trimmed since it was armed; its next trim does not wait.
pub(crate) const AT_ONCE: u32 = u32::MAX;

/// A span waits at its mark 1 / `WAIT_DIV` of the report delay (10 ms by default) before its
/// first trim: a program that frees a batch of objects and takes as many again (mimalloc-bench's
/// rptest, each thread's loop) brings spans down to their marks and empties or refills them
/// within a few milliseconds, and a trim then costs a `madvise` and a page fault per page for
/// nothing; one that frees most of its objects and keeps the rest (`fallow bench burst`) keeps
/// its spans at their marks for as long as its frees last. Measured: rptest's operations per
/// CPU-second 4.7 M trimming at once, 9.8 M waiting 10 ms, 8.7 M waiting 50 ms (fewer trims
/// still, but more pages held across its loops); burst's resident memory after its frees 576
/// MiB at once, 584 waiting 10 ms (1,122 with no trim).
const WAIT_DIV: u32 = 200;

/// `Span::backoff`: a trim gave pages back since the span was last armed.
const GAVE: u8 = 1 << 4;
/// The most halvings of a span's first mark.
const LEVELS: u8 = 15;

const PAGE_SHIFT: u32 = PAGE_SIZE.trailing_zeros();

/// Bits `lo..=hi` (pages of a span: at most 64, a 256 KiB span).
pub(super) fn page_bits(lo: usize, hi: usize) -> u64 {
    (u64::MAX >> (63 - hi)) & (u64::MAX << lo)
}

/// One bit per object of a span (at most 4,096), on the owner's stack.
struct Marks([u64; 64]);

impl Marks {
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}

impl Span {
    /// The bytes before the first object (class.rs, `colour`).
    fn colour(&self) -> usize {
        self.first() - self.start.load(Relaxed)
    }

    /// Objects in the span.
    fn objects(&self) -> usize {
        (self.end.get() - self.first()) / self.size.load(Relaxed) as usize
    }

    /// The count at or below which a span armed when found full is trimmed first (0: never);
    /// each trim then halves it for the next, down to 0.
    pub(crate) fn low_mark(&self) -> u32 {
        let pages = (self.mask.load(Relaxed) + 1) >> PAGE_SHIFT;
        (self.objects() / LOW_DIV).min(pages * PER_PAGE_8THS / 8) as u32
    }

    /// The pages object `i` touches (bits of `given`).
    fn touches(&self, i: usize) -> u64 {
        let size = self.size.load(Relaxed) as usize;
        let off = self.colour() + i * size;
        page_bits(off >> PAGE_SHIFT, (off + size - 1) >> PAGE_SHIFT)
    }

    /// Object `i` touches a page given back (it is free and on no list).
    pub(crate) fn on_given(&self, i: usize) -> bool {
        let given = self.given();
        given != 0 && self.touches(i) & given != 0
    }

    /// Objects handed out once that touch a page given back (free, on no list).
    pub(crate) fn gone(&self) -> u32 {
        if self.given() == 0 {
            return 0;
        }
        (0..self.fresh.load(Relaxed)).filter(|&i| self.on_given(i)).count() as u32
    }

    /// The owner arms the span for a trim (its slow path found it full: the high mark) at its
    /// low mark (again, if a trim left it armed at a lower one), halved once more each time the
    /// span is found full after a trim that gave pages back: a span its program frees and fills
    /// again and again pays a page fault per page given back each time; halving its mark makes
    /// it wait for a lower count, which a program that keeps a steady share never reaches.
    pub(crate) fn arm(&self) {
        // Filled again: a trim waits again.
        self.due_since.set(0);
        let b = self.backoff.get();
        let level = if b & GAVE != 0 { ((b & !GAVE) + 1).min(LEVELS) } else { b & !GAVE };
        self.backoff.set(level);
        let m = self.low_mark() >> level;
        if self.low.load(Relaxed) == 0 || self.mark.get() as u32 != m {
            self.disarm();
            self.arm_at(m);
        }
    }

    /// Arm at mark `m` (the span disarmed): `m` taken out of `used` as the bias `low`, if the
    /// count (with `current`'s 1) is at least `m`; else the span stays disarmed. A word left
    /// below 2 sends the next free to the rare side, which trims (`Slab::after_local_free`).
    fn arm_at(&self, m: u32) {
        let w = self.used.load(Relaxed);
        if m == 0 || (w & !UNLISTED) < m {
            self.mark.set(0);
            return;
        }
        self.mark.set(m as u16);
        self.low.store(m, Relaxed);
        // At least `m` below bit 31: no borrow from `UNLISTED`.
        self.used.store(w - m, Relaxed);
    }

    /// The owner disarms the span: the bias goes back into `used`.
    pub(crate) fn disarm(&self) {
        let low = self.low.load(Relaxed);
        if low != 0 {
            self.low.store(0, Relaxed);
            self.used.store(self.used.load(Relaxed) + low, Relaxed);
        }
    }

    /// The span is armed and its count has come down to its mark (the owner's slow free asks).
    pub(crate) fn trim_due(&self) -> bool {
        self.low.load(Relaxed) != 0 && self.used() <= self.mark.get() as u32
    }

    /// The span, due for a trim, has waited for it: `wait_ms` since the owner first saw it at
    /// its mark (noted now if not yet), or it was trimmed since it was armed (the cascade).
    fn waited(&self, now_ms: u32, wait_ms: u32) -> bool {
        // Noted one past the clock, so that 0 (not noted) is never a time.
        let now = now_ms.wrapping_add(1);
        match self.due_since.get() {
            AT_ONCE => true,
            0 => {
                self.due_since.set(now);
                wait_ms == 0
            }
            since => now.wrapping_sub(since) >= wait_ms,
        }
    }

    /// The owner gathers every free object of the span (other threads' too, `collect`) and
    /// marks those on `free` and `local_free`.
    fn mark_free(&self) -> Marks {
        self.collect();
        let (first, size) = (self.first(), self.size.load(Relaxed) as usize);
        let handed = self.fresh.load(Relaxed);
        let mut m = Marks([0; 64]);
        let mut n = 0;
        for head in [self.free.get(), self.local_free.get()] {
            let mut o = head;
            while o != 0 {
                // More than were handed out: a list made a cycle by a double free the push's
                // or the owner's head check missed (`collect` says the same).
                n += 1;
                if n > handed {
                    crate::message::fatal("free", &crate::error::Error::DoubleFree { addr: o });
                }
                let i = (o - first) / size;
                m.0[i / 64] |= 1 << (i % 64);
                // SAFETY: a free object of this span on one of the owner's lists: its first word
                // is the list's link, written by the owner or collected from `thread_free`.
                o = unsafe { *(o as *const usize) };
            }
        }
        m
    }

    /// The pages that no live object touches and that are not given back yet: below the first
    /// never-handed-out object, or the whole span once every object was handed out.
    fn free_pages(&self, m: &Marks) -> u64 {
        let handed = self.fresh.load(Relaxed);
        let given = self.given();
        let mut busy = 0u64;
        for i in 0..handed {
            let t = self.touches(i);
            // Free (on a list), or on a page given back (free, on no list).
            if !m.has(i) && t & given == 0 {
                busy |= t;
            }
        }
        let bytes = self.mask.load(Relaxed) + 1;
        let limit = if handed == self.objects() { bytes } else { self.colour() + handed * self.size.load(Relaxed) as usize };
        let whole = limit >> PAGE_SHIFT;
        if whole == 0 {
            return 0;
        }
        page_bits(0, whole - 1) & !busy & !given
    }

    /// Link the objects `pick` chooses (by index, among those handed out once) in address
    /// order in front of `head`; the new head.
    ///
    /// # Safety
    /// Every object `pick` chooses is free, on no list, and the owner's (the caller's heap's).
    unsafe fn link_objects(&self, mut head: usize, pick: impl Fn(usize) -> bool) -> usize {
        let (first, size) = (self.first(), self.size.load(Relaxed) as usize);
        for i in (0..self.fresh.load(Relaxed)).rev().filter(|&i| pick(i)) {
            let o = first + i * size;
            // SAFETY: the caller's contract: a free object on no list, the owner's; its first
            // word becomes the link (on a page given back, this write faults it in again).
            unsafe { *(o as *mut usize) = head };
            head = o;
        }
        head
    }

    /// The free objects that touch no given-back page become `free`, in address order;
    /// `local_free` is emptied (its objects are among them).
    fn relink(&self, m: &Marks) {
        let given = self.given();
        // SAFETY: the objects marked are free (`mark_free`: on `free` or `local_free`, both
        // replaced here), on kept pages, the owner's.
        let head = unsafe { self.link_objects(0, |i| m.has(i) && self.touches(i) & given == 0) };
        self.free.set(head);
        self.local_free.set(0);
    }

    /// The owner's refill, when the span's lists are empty: the objects touching given-back pages
    /// linked as `free` again and one handed out (`Some((addr, true))`: it lies wholly on
    /// given-back pages and reads zero, for a request that wants zeros). Returns the pages that
    /// were given back with it; `None`: none were.
    fn take_given(&self, zero: bool) -> Option<(Option<(usize, bool)>, u32)> {
        let given = self.given();
        if given == 0 {
            return None;
        }
        let (first, size) = (self.first(), self.size.load(Relaxed) as usize);
        // For a request that wants zeros: the last object lying wholly on given-back pages.
        let whole = if zero { (0..self.fresh.load(Relaxed)).rev().find(|&i| self.touches(i) & !given == 0) } else { None };
        // SAFETY: an object touching a given-back page is free, on no list, the owner's (trim.rs,
        // "Rules"); `whole` is handed out instead.
        let head = unsafe { self.link_objects(self.free.get(), |i| self.touches(i) & given != 0 && Some(i) != whole) };
        self.set_given(0);
        self.free.set(head);
        if let Some(i) = whole {
            self.set_used(self.used() + 1);
            return Some((Some((first + i * size, true)), given.count_ones()));
        }
        Some((self.pop().map(|o| (o, false)), given.count_ones()))
    }
}

impl Span {
    /// The states the span's pages go back to the page layer with (`Slab::give_back`, a claim):
    /// pages a trim gave back `Reported`; the granules no object was ever handed out on (at and
    /// above `fresh`; all of them if none was) the states they had when the span was taken;
    /// the rest `Dirty`. Read by the owner, or by the claiming thread before its claim (the
    /// span untouched, its push waiting on `thread_free`: nothing here changes, tail.rs).
    pub(crate) fn free_states(&self) -> GranuleStates {
        let shift = granule_shift(self.mask.load(Relaxed) + 1);
        let taken = GranuleStates { shift, reported: self.taken_reported.load(Relaxed), zeroed: self.taken_zeroed.load(Relaxed), given_back: 0 };
        let written = if self.fresh.load(Relaxed) == 0 { 0 } else { self.fresh_at() - self.start.load(Relaxed) };
        let first_untouched = written.div_ceil(PAGE_SIZE << shift);
        let mut g = taken.only(if first_untouched >= 64 { 0 } else { u64::MAX << first_untouched });
        // Bits of pages: only spans of at most 64 pages are trimmed (granules of one page).
        let given = self.given();
        debug_assert!(given == 0 || shift == 0);
        g.reported |= given;
        g.zeroed &= !given;
        g.given_back = given;
        g
    }
}

/// Give back the pages `bits` of the span at `start` with `MADV_DONTNEED`, one call per run:
/// the pages the kernel took.
///
/// # Safety
/// The pages are the caller's (a live span of its own heap) and hold no live object and no
/// link of any list.
pub(super) unsafe fn advise_runs(start: usize, mut bits: u64) -> u64 {
    let mut done = 0;
    while bits != 0 {
        let lo = bits.trailing_zeros() as usize;
        let run = (bits >> lo).trailing_ones() as usize;
        let run_bits = page_bits(lo, lo + run - 1);
        // SAFETY: the caller's contract: pages of the caller's span whose contents nothing
        // relies on; private anonymous memory, which reads zero after.
        if unsafe { os::madvise(start + (lo << PAGE_SHIFT), run << PAGE_SHIFT, Advice::DontNeed) }.is_ok() {
            done |= run_bits;
        }
        bits &= !run_bits;
    }
    done
}

impl ThreadHeap {
    /// The refill of span `s` (the owner's slow path, its lists empty): as `Span::take_given`,
    /// the heap's count of given-back pages brought down.
    pub(crate) fn refill(&self, s: &Span, zero: bool) -> Option<(usize, bool)> {
        let (got, pages) = s.take_given(zero)?;
        // The pages given back are wanted again: the last trim was a cost, not a saving. The
        // cascade ends (no trim at half the mark as the span fills and empties again); only
        // being found full arms it again, at half the mark it had (`arm`, `GAVE`).
        s.disarm();
        s.due_since.set(0);
        self.trimmed.sub(pages as u64);
        got
    }

    /// A span leaves the heap (back to the page layer): its given-back pages are no longer
    /// the heap's to count. (`given` stays: `Slab::give_back` lists those pages `Reported`.)
    pub(crate) fn forget_given(&self, s: &Span) {
        self.trimmed.sub(s.given().count_ones() as u64);
    }
}

impl Slab {
    /// Whether spans are trimmed: `Config::small_trim`, on the private anonymous backing (where
    /// `MADV_DONTNEED` frees a page and it reads zero after, as the reporter's start-up check
    /// found) without huge pages.
    pub(crate) fn trims(&self) -> bool {
        let c = &self.shared.config;
        c.small_trim && c.backing == Backing::Anonymous && !c.thp && crate::os::dontneed_zeroes()
    }

    /// How long a span waits at its mark before its first trim: a two-hundredth of the report delay
    /// the allocator was made with.
    fn trim_wait_ms(&self) -> u32 {
        self.shared.config.tunables.report_delay_ms / WAIT_DIV
    }

    /// Span `s`, due for a trim, has waited for it (`Span::waited`; the owner asks).
    pub(crate) fn trim_waited(&self, s: &Span) -> bool {
        s.waited(self.shared.now_ms(), self.trim_wait_ms())
    }

    /// The owner trims span `s` of its heap `h`: disarmed first, and armed again at half its
    /// mark (a span freed on down is trimmed again as its count halves, until the mark is 0).
    pub(crate) fn trim(&self, h: &ThreadHeap, s: &Span) {
        // A span behind its class's head is taken first (thread_free.rs): one another thread
        // claimed is dropped instead.
        if !h.take_listed(s) {
            return;
        }
        self.trim_taken(h, s);
        h.leave_listed(s);
    }

    fn trim_taken(&self, h: &ThreadHeap, s: &Span) {
        let next = if s.low.load(Relaxed) != 0 { s.mark.get() as u32 / 2 } else { 0 };
        s.disarm();
        if !self.trims() {
            return;
        }
        let m = s.mark_free();
        let give = s.free_pages(&m);
        // SAFETY: pages of `s`, a live span of this owner's heap, that no live object touches
        // (`free_pages`); the free objects on them are dropped from the lists below (`relink`),
        // before anything reads a link again.
        let done = unsafe { advise_runs(s.start.load(Relaxed), give) };
        s.set_given(s.given() | done);
        if done != 0 {
            s.backoff.set(s.backoff.get() | GAVE);
        }
        s.relink(&m);
        s.arm_at(next);
        // The span stayed low for its wait: the cascade's next trims need none.
        s.due_since.set(AT_ONCE);
        let pages = done.count_ones() as u64;
        h.trims.add(1);
        h.trimmed.add(pages);
        h.trimmed_total.add(pages);
    }

    /// Trim every listed span with live objects of heap `h` (the calling thread's own), whatever
    /// its marks (`Allocator::drain_thread_cache`, after the empty spans went back).
    pub(crate) fn trim_all(&self, h: &ThreadHeap) {
        self.trim_listed(h, |s| s.used() > 0);
    }

    /// Trim the listed spans of heap `h` (the caller's own) at or below their marks: after a
    /// sweep, which collected other threads' frees (a count brought down by them leaves no
    /// owner's free to notice the mark).
    pub(crate) fn trim_due_spans(&self, h: &ThreadHeap) {
        let (now, wait) = (self.shared.now_ms(), self.trim_wait_ms());
        self.trim_listed(h, |s| s.trim_due() && s.waited(now, wait));
    }

    fn trim_listed(&self, h: &ThreadHeap, want: impl Fn(&Span) -> bool) {
        self.each_listed(h, |_, s| {
            if want(s) {
                self.trim(h, s);
            }
        });
    }

    /// `f` with the class and each listed span of heap `h` (the caller's own), where spans are
    /// trimmed at all; `f` may take the span off its list (the walk has read its `next`).
    pub(super) fn each_listed(&self, h: &ThreadHeap, mut f: impl FnMut(usize, &Span)) {
        if !self.trims() {
            return;
        }
        for c in 0..CLASSES {
            let mut p = h.head[c].get();
            while !Span::is_empty_span(p) && !p.is_null() {
                // SAFETY: a listed span of this heap (the owner's); `next` is read before `f`
                // may take it off its list (a claimed one is dropped by `take_listed`).
                let s = unsafe { &*p };
                p = s.next.get();
                if s.place() == LISTED {
                    f(c, s);
                }
            }
        }
    }
}

/// The heaps' trim counters into `s` (under the slab lock: every heap is listed).
pub(super) fn add_to_stats(c: &Central, s: &mut Stats) {
    let (mut now, mut trims, mut total) = (0u64, 0u64, 0u64);
    for h in heaps(c) {
        now = now.wrapping_add(h.trimmed.get());
        trims = trims.wrapping_add(h.trims.get());
        total = total.wrapping_add(h.trimmed_total.get());
    }
    s.small_trimmed_pages = now;
    s.small_trims = trims;
    s.small_trimmed_pages_total = total;
}
