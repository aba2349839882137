//! The owner's sweep of its heap (docs/design.md, "Small objects", "Empty spans"): before the
//! heap takes a new span, every span other threads handed back is relisted and every listed
//! span of every class with frees pushed by other threads is collected; a span that comes out
//! empty leaves its list as a local free that empties it would (the spare slot, else back to
//! the page layer).
//!
//! Why: the owner collects a span's `thread_free` only when that span is its class's current
//! one and has nothing else to give, so objects other threads freed into the spans of classes
//! the owner is not allocating from at that moment stayed counted as used, and their spans
//! stayed live. In mimalloc-bench's rptest (two threads, every other batch of objects freed by
//! the other thread) about nine objects in ten the slab counted as live were such frees.
//!
//! Then the spans the collection brought down to their trim marks are trimmed (trim.rs).
//!
//! Cost: a walk of the heap's listed spans, paid on the slow path only, and only once the heap
//! has taken about an eighth of the spans it holds since the last sweep (at least
//! `SWEEP_MIN_NEW` spans), so a sweep is amortised over the new spans, which each cost a page
//! block anyway.

use core::ptr;
use core::sync::atomic::Ordering::Relaxed;

use super::class::CLASSES;
use super::heap::ThreadHeap;
use super::span::Span;
use super::thread_free::HEAD;

/// New spans between two sweeps, at least.
const SWEEP_MIN_NEW: u32 = 4;

impl ThreadHeap {
    /// Whether the owner should sweep before it takes a new span: counts the new span.
    pub(crate) fn sweep_due(&self) -> bool {
        let n = self.since_sweep.get() + 1;
        let due = n >= SWEEP_MIN_NEW.max((self.spans.get() / 8) as u32);
        self.since_sweep.set(if due { 0 } else { n });
        due
    }

    /// The owner's sweep: spans handed back are relisted, every listed span with other threads'
    /// frees is collected, and the empty ones that are not their class's current span, and the
    /// spares, are taken off the heap and pushed on `out` (linked through `next`) for the
    /// caller to give back. Called by the owner only (its bound thread).
    pub(crate) fn sweep(&self, out: &mut *mut Span) {
        let mut give = |s: *mut Span| {
            // SAFETY: a span just taken off this heap, on no list: the caller's to give back.
            unsafe { (*s).next.set(*out) };
            *out = s;
        };
        self.take_returned();
        for c in 0..CLASSES {
            let head = self.head[c].get();
            let mut p = if Span::is_empty_span(head) { ptr::null_mut() } else { head };
            while !p.is_null() {
                // SAFETY: a listed span of this heap (owner's); `next` is read before the span
                // may leave the list.
                let s = unsafe { &*p };
                p = s.next.get();
                if ptr::eq(s, head) {
                    if s.thread_free.load(Relaxed) & HEAD != 0 {
                        s.collect();
                    }
                } else if let Some(e) = self.collect_or_drop(s) {
                    give(e);
                }
            }
            // The spare: back to the page layer too.
            if let Some(spare) = self.take_spare(c) {
                give(spare);
            }
        }
    }
}

impl super::Slab {
    /// The owner's sweep of `h` (its own heap), the empty spans it took off given back.
    pub(super) fn sweep(&self, h: &ThreadHeap) {
        let mut out: *mut Span = ptr::null_mut();
        h.sweep(&mut out);
        self.uncount(out);
        self.give_back(out);
        self.trim_due_spans(h);
        self.trim_tails(h, true);
    }
}
