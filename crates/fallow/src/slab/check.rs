//! The slab's checks (`Allocator::check_invariants`): every span of the calling thread's heap
//! and of the abandoned heaps (whose owner is the lock holder) against its lists, `used` and the
//! page map, and the heaps' span counts against the slab's. Nothing is allocated while the slab
//! lock is held (the slab may be the program's allocator): a finding is formatted after.

use super::*;
use super::span::UNLISTED;
use super::thread_free::{CLAIMED, HEAD, UNTOUCHED};

/// What `check` found wrong: what, and two numbers (formatted once the lock is released).
pub(super) struct Bad(&'static str, usize, usize);

impl Slab {
    /// Check the slab: when no other thread's heap is in use, every heap's span count adds up
    /// to the slab's; the calling thread's heap
    /// and every abandoned heap (whose owner is the lock holder) in full: each span is in the
    /// page map, aligned, and its lists hold distinct objects of its own below `fresh`, `used`
    /// counting the rest. Other threads' heaps are
    /// theirs to change, so only their atomic counters are read.
    pub(crate) fn check(&self) -> Result<(), String> {
        // Nothing is allocated while the lock is held (the slab may be the program's
        // allocator): a finding is formatted after the lock is released.
        let found = {
            let mine = table::own_heap(self);
            let c = self.central.lock();
            let mut spans = 0u64;
            let mut all_checked = true;
            let mut found = Ok(());
            for h in heaps(&c) {
                spans += h.spans.get();
                if ptr::eq(h, mine) || h.abandoned.load(SeqCst) {
                    // Claimed spans still on a heap's full list count in its spans, no longer
                    // in the slab's (their pages are the page layer's).
                    found = found.and_then(|()| self.check_heap(h)).map(|claimed| spans -= claimed);
                } else {
                    all_checked = false;
                }
            }
            // With another thread's heap in use, its count may be a step behind or ahead.
            let total = self.spans.load(Relaxed);
            if found.is_ok() && all_checked && spans != total {
                found = Err(Bad("the heaps' spans and the slab's count differ", spans as usize, total as usize));
            }
            found
        };
        found.map_err(|Bad(what, a, b)| format!("slab: {what} ({a:#x}, {b:#x})"))
    }

    /// Check heap `h` (the caller owns it): the spans other threads claimed that it has not
    /// dropped yet.
    fn check_heap(&self, h: &ThreadHeap) -> Result<u64, Bad> {
        let mut n = 0u64;
        let mut claimed = 0u64;
        let mut spares = 0u64;
        // `current`: the span is the head of its class list.
        let mut visit = |s: &Span, place: u8, current: bool| -> Result<(), Bad> {
            n += 1;
            if s.place() != place || !ptr::eq(s.heap.load(Relaxed), h) || s.owner.load(Relaxed) != h.id.get() {
                return Err(Bad("a span's place, heap or owner is wrong (span, place)", s.start.load(Relaxed), s.place() as usize));
            }
            if s.current.load(Relaxed) != current {
                return Err(Bad("a span's current flag is wrong (span, flag)", s.start.load(Relaxed), current as usize));
            }
            self.check_span(s)
        };
        for c in 0..CLASSES {
            let mut p = h.head[c].get();
            let mut last: *mut Span = ptr::null_mut();
            while !Span::is_empty_span(p) && !p.is_null() {
                // SAFETY: a listed span of a heap the caller owns (its own, or abandoned under
                // the lock held).
                let s = unsafe { &*p };
                // The head is taken (the hot path pops from it); the spans behind it are left
                // untouched, or claimed by another thread and not yet dropped (thread_free.rs).
                let word = s.thread_free.load(SeqCst);
                if last.is_null() == (word & (UNTOUCHED | CLAIMED) != 0) {
                    return Err(Bad("a listed span is untouched at the head, or taken behind it (span, word)", s.start.load(Relaxed), word));
                }
                if word & CLAIMED != 0 {
                    claimed += 1;
                } else {
                    visit(s, LISTED, last.is_null())?;
                }
                last = p;
                p = s.next.get();
            }
            if !ptr::eq(h.tail[c].get(), last) {
                return Err(Bad("a class list's tail is not its last span (class, tail)", c, h.tail[c].get() as usize));
            }
            let sp = h.spare[c].get();
            if !sp.is_null() {
                spares += 1;
                // SAFETY: as above, the spare.
                let s = unsafe { &*sp };
                visit(s, SPARE, false)?;
                if s.used() != 0 {
                    return Err(Bad("a spare span holds live objects (span, used)", s.start.load(Relaxed), s.used() as usize));
                }
            }
        }
        let mut p = h.full.get();
        while !p.is_null() {
            // SAFETY: as above, a parked span.
            let s = unsafe { &*p };
            if s.is_claimed() {
                // Its pages are the page layer's (out of the map), its descriptor the owner's
                // until it takes its spans back.
                claimed += 1;
                if s.place() != FULL || !ptr::eq(s.heap.load(Relaxed), h) {
                    return Err(Bad("a claimed span is off the full list (span, place)", s.start.load(Relaxed), s.place() as usize));
                }
            } else {
                visit(s, FULL, false)?;
            }
            p = s.next.get();
        }
        if n + claimed != h.spans.get() || spares != h.spares.get() {
            return Err(Bad("a heap's span count is wrong (spans found, counted)", (n + claimed) as usize, h.spans.get() as usize));
        }
        Ok(claimed)
    }

    /// Check one span: alignment, the page map, and its lists: distinct objects of its own
    /// below `fresh`, which with `used` account for every object handed out.
    fn check_span(&self, s: &Span) -> Result<(), Bad> {
        let start = s.start.load(Relaxed);
        let c = s.class.get() as usize;
        let (size, bytes) = (class_size(c), span_bytes(c));
        if !start.is_multiple_of(bytes) || s.size.load(Relaxed) as usize != size {
            return Err(Bad("a span is misaligned or of the wrong size (span, size)", start, size));
        }
        for g in 0..bytes >> class::GRANULE_SHIFT {
            if !matches!(self.find(start + (g << class::GRANULE_SHIFT)), Found::Span(m) if ptr::eq(m, s)) {
                return Err(Bad("a span is not in the page map (span, granule)", start, g));
            }
        }
        let fresh = s.fresh_at();
        let handed = s.fresh.load(Relaxed) as u32;
        let first = s.first();
        if first != start + class::colour(c) || s.mask.load(Relaxed) != bytes - 1 || fresh > s.end.get() || (s.used.load(Relaxed) & UNLISTED != 0) != (s.place() != LISTED) {
            return Err(Bad("a span's first object, mask, fresh or listed bit is wrong (span, used word)", start, s.used.load(Relaxed) as usize));
        }
        // One bit per object (at most 4,096 in a span), on the stack.
        let mut seen = [0u64; 64];
        let mut count = |head: usize| -> Result<u32, Bad> {
            let mut o = head & HEAD;
            let mut k = 0;
            while o != 0 {
                let i = (o.wrapping_sub(first)) / size;
                if o < first || o >= fresh || !(o - first).is_multiple_of(size) || seen[i / 64] & (1 << (i % 64)) != 0 || s.on_given(i) {
                    return Err(Bad("a free list holds a bad object, or one twice (span, object)", start, o));
                }
                seen[i / 64] |= 1 << (i % 64);
                k += 1;
                // SAFETY: a free object of this span (just checked), its first word the link.
                o = unsafe { *(o as *const usize) };
            }
            Ok(k)
        };
        let free = count(s.free.get())? + count(s.local_free.get())?;
        // Other threads' frees are still counted in `used`; walking them is safe for a span
        // whose owner is the caller (pushes only prepend).
        let remote = count(s.thread_free.load(SeqCst))?;
        // Objects on pages a trim gave back are free and on no list (trim.rs).
        if free + s.used() + s.gone() != handed || remote > s.used() {
            return Err(Bad("free + used + given-back objects are not those handed out (span, free)", start, free as usize));
        }
        if s.low.load(Relaxed) > s.mark.get() as u32 || s.mark.get() as u32 > s.low_mark() {
            return Err(Bad("a span's trim bias is above its low mark (span, bias)", start, s.low.load(Relaxed) as usize));
        }
        Ok(())
    }

}
