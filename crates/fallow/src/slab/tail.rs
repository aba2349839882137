//! Never-used tails of live spans (docs/design.md, "Small objects (slab layer)", "Never-used
//! tails"): the owner gives back to the kernel the pages of a span that no object was ever
//! handed out on, once no slow path took an object from the span while its heap took several
//! new spans.
//!
//! Why: the page layer hands a span out of its dirty blocks first (no page fault, no zeroing),
//! so a span whose class keeps few objects holds the pages the blocks' earlier users wrote,
//! though it never writes them itself: resident memory that serves nothing. In mimalloc-bench's
//! rptest without its cross-thread frees, such pages were 2.1-2.6 MiB of the 8.9-9.4 MiB the
//! live spans kept resident at the peak, once the spans of its first round had gone back to
//! the page layer and the second round's spans came from them.
//!
//! - **When.** At the owner's sweep (sweep.rs: before it takes a new span, once it has taken
//!   an eighth of the spans it holds since the last, at least 4), for each listed span that no
//!   slow path took an object from since the last sweep (`Span::quiet`: set by the sweep,
//!   cleared by `ThreadHeap::alloc`; never-used objects are handed out only there): a span its
//!   class is filling, or whose lists run out, keeps its next pages (they would fault in
//!   again). At `drain_thread_cache`, every listed span's tail at once.
//! - **Kept.** A class whose span hands out objects on pages its tail gave back
//!   (`Span::tail_from`, `ThreadHeap::take_fresh`) grows into its tails: the heap keeps that
//!   class's tails from then on (`ThreadHeap::tails_kept`; a drain still gives them back). In
//!   mimalloc-bench's xmalloc-test, whose 32 KiB batches (seven to a 256 KiB span) are taken
//!   from a span's lists for a while and then from its never-used objects, the sweeps gave
//!   back 160 MiB of tails in 5 s that the program faulted in again (48,000 page faults against
//!   9,400), 4-5% of its frees a second; with the class kept after its first such span, 4.4 MiB.
//! - **What.** The whole pages at and above the first never-handed-out object (`fresh_at`),
//!   less those taken `Reported` (they read zero and are not resident already): no object was
//!   ever handed out there, so no live object and no list link lies on them (`take_fresh` links
//!   a page's worth of objects at a time, and those are below `fresh`).
//! - **After.** The pages given back are recorded as taken `Reported` (`taken_reported`, and
//!   out of `taken_zeroed`), as if the page layer had handed them out so: when objects are
//!   handed out there later, the kernel faults the pages in zeroed; when the span goes back,
//!   `free_states` lists those still above `fresh` `Reported`. A trim of this kind counts in
//!   `small_trims` and `small_trimmed_pages_total`, not in `small_trimmed_pages` (the pages of
//!   freed objects a trim gave back, which the refill takes again).
//! - **Claims.** The owner takes a span behind its class's head first (`take_listed`, as a trim
//!   does), and leaves it alone if other threads' frees wait on it: a push that may claim it
//!   left its object on `thread_free` and read the span's page states before its
//!   compare-and-swap, which only a change of the word (a collect) would make fail, and a take
//!   and release do not change it. With none waiting, no claim is under way, none starts while
//!   the span is taken, and the release publishes the new states to a later one
//!   (thread_free.rs). The span's head (its class's current span) is never claimed.
//! - Only where spans are trimmed at all (`Slab::trims`: `MADV_DONTNEED` frees the pages and
//!   they read zero after).

use core::sync::atomic::Ordering::Relaxed;

use super::heap::ThreadHeap;
use super::span::{Span, NO_TAIL};
use super::thread_free::HEAD;
use super::trim::{advise_runs, page_bits};
use super::Slab;
use crate::os::{PAGE_SHIFT, PAGE_SIZE};

impl Span {
    /// The pages of the span (bits of `given`) that no object was ever handed out on and that
    /// may be resident: the whole pages at and above the first never-handed-out object, less
    /// those taken `Reported`. Every span has at most 64 pages (class.rs, `SPAN_MAX`).
    fn tail_pages(&self) -> u64 {
        let pages = (self.mask.load(Relaxed) + 1) / PAGE_SIZE;
        let written = if self.fresh.load(Relaxed) == 0 { 0 } else { self.fresh_at() - self.start.load(Relaxed) };
        let first = written.div_ceil(PAGE_SIZE);
        if first >= pages {
            return 0;
        }
        // Past the last object, a trim of a span whose every object was handed out may have
        // given pages back already (`given`).
        page_bits(first, pages - 1) & !self.taken_reported.load(Relaxed) & !self.given()
    }

    /// No slow path took an object from the span since the owner's last sweep looked at it
    /// (noted now).
    fn quiet_since_sweep(&self) -> bool {
        self.quiet.replace(true)
    }
}

impl Slab {
    /// The owner gives back the never-used tails of its heap `h`'s listed spans: at a sweep
    /// (`swept`), those no slow path took an object from since the last, of classes that do
    /// not keep their tails; at `drain_thread_cache`, all of them.
    pub(crate) fn trim_tails(&self, h: &ThreadHeap, swept: bool) {
        self.each_listed(h, |c, s| {
            let due = !swept || (s.quiet_since_sweep() && !h.tails_kept[c].get());
            if due && s.tail_pages() != 0 {
                trim_tail(h, s, swept);
            }
        });
    }
}

/// The owner gives back the never-used tail of span `s` of its heap `h`; `swept`: at a sweep,
/// which notes where the tail began (a drain's give-back says nothing of the class).
fn trim_tail(h: &ThreadHeap, s: &Span, swept: bool) {
    // A span behind its class's head is taken first (thread_free.rs): one another thread
    // claimed is dropped instead.
    if !h.take_listed(s) {
        return;
    }
    // Other threads' frees wait on it: a push may be claiming it (the module's comment).
    if s.thread_free.load(Relaxed) & HEAD != 0 {
        h.leave_listed(s);
        return;
    }
    // SAFETY: pages of `s`, a live span of this owner's heap, at and above its first
    // never-handed-out object (`tail_pages`): no object was ever handed out on them, so no live
    // object and no list link lies there, and nothing is written there before the owner's next
    // `take_fresh`.
    let done = unsafe { advise_runs(s.start.load(Relaxed), s.tail_pages()) };
    s.taken_reported.store(s.taken_reported.load(Relaxed) | done, Relaxed);
    s.taken_zeroed.store(s.taken_zeroed.load(Relaxed) & !done, Relaxed);
    if swept && done != 0 && s.tail_from.get() == NO_TAIL {
        s.tail_from.set(done.trailing_zeros() as u8);
    }
    h.leave_listed(s);
    if done != 0 {
        h.trims.add(1);
        h.trimmed_total.add(done.count_ones() as u64);
    }
}

impl ThreadHeap {
    /// The owner's slow path hands out never-used objects of span `s` of class `c`
    /// (`Span::take_fresh`): if they lie on pages the span's tail gave back, the class's spans
    /// grow into their tails, and its tails are kept from then on.
    pub(crate) fn take_fresh(&self, s: &Span, c: usize, zero: bool) -> Option<(usize, bool)> {
        let got = s.take_fresh(zero);
        let from = s.tail_from.get();
        if from != NO_TAIL && s.fresh_at() > s.start.load(Relaxed) + ((from as usize) << PAGE_SHIFT) {
            self.tails_kept[c].set(true);
        }
        got
    }
}
