//! Other threads' frees (docs/design.md, "Small objects", "Free lists: who touches which"): the
//! push of the remote-free protocol (thread_free.rs) as the freeing thread makes it, and the free
//! into an abandoned heap's span, which the freeing thread then collects under the slab lock.

use core::ptr;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};

use super::heap::ThreadHeap;
use super::span::{Span, LISTED};
use super::thread_free::{push_returned, UNTOUCHED};
use super::Slab;
use crate::error::Error;
use crate::page::GranuleStates;

impl Slab {
    /// `free_remote` for a free whose hot path found another thread's object (`free_local`'s
    /// `Freed::Remote`: checked, nothing changed), out of line.
    /// The hot path took `s` from the page map without checking that it holds `addr`: for
    /// another thread's free it may be stale (a use after free racing with the span's
    /// give-back), so the address is checked against it here, off the owner's path.
    #[inline(never)]
    pub(crate) fn free_remote_out(&self, s: &Span, addr: usize) -> Result<(), Error> {
        if addr.wrapping_sub(s.start.load(Relaxed)) > s.mask.load(Relaxed) {
            return Err(Error::InvalidPointer { addr });
        }
        self.free_remote(s, addr)
    }

    /// Another thread's free (or the free of a thread without a heap, or into an abandoned heap's
    /// span): the remote-free protocol (thread_free.rs). Inline in its two callers, `free_in` and
    /// `free_remote_out`.
    #[inline(always)]
    pub(super) fn free_remote(&self, s: &Span, addr: usize) -> Result<(), Error> {
        // Read before the push: while the object is live the span stays with this heap (a
        // span is given back only once empty, and a heap is never unmapped before the slab).
        let h = s.heap.load(Relaxed);
        if h.is_null() {
            return Err(Error::InvalidPointer { addr });
        }
        // SAFETY: heaps live as long as the slab; `returned`, `slow_paths` and `abandoned` are
        // atomics.
        let heap = unsafe { &*h };
        let pushed = s.push_remote(addr).map_err(|()| Error::DoubleFree { addr })?;
        if pushed.handed_back {
            push_returned(&heap.returned, s);
        }
        // SeqCst, after the push: the exiting owner stores `abandoned`, fences, and then
        // collects under the lock; either it saw the push or this load sees the flag
        // (tests/loom/slab_abandon.rs). The lock holder's collection takes the span back: no
        // claim then.
        if heap.abandoned.load(SeqCst) {
            self.collect_abandoned(h, s);
            return Ok(());
        }
        if pushed.word & UNTOUCHED != 0 {
            // In tail position: the push's own path keeps no frame for it.
            return self.after_untouched_push(s, heap, pushed.word);
        }
        Ok(())
    }

    /// A push into a span its owner left untouched left `word`: claim the span if every object it
    /// counts used is on `thread_free` (thread_free.rs), and give its pages back. Always `Ok` (the
    /// type of the caller's tail call).
    #[inline(never)]
    fn after_untouched_push(&self, s: &Span, heap: &ThreadHeap, word: usize) -> Result<(), Error> {
        if s.claim_due(word, &heap.slow_paths) {
            // Read before the claim: once it is made, the owner may give the descriptor to
            // another span.
            let (start, bytes) = (s.start.load(Relaxed), s.mask.load(Relaxed) + 1);
            if let Some(states) = s.claim(word) {
                self.give_back_claimed(start, bytes, states);
            }
        }
        Ok(())
    }

    /// This thread's push claimed the span at `start` of `bytes` (thread_free.rs): every object of
    /// it is free and its owner left it untouched. Out of the page map, off the slab's count, its
    /// pages to the page layer in the states the claim read (`Span::free_states`). The descriptor
    /// is left alone: its owner drops it when it next looks at the span.
    #[cold]
    #[inline(never)]
    fn give_back_claimed(&self, start: usize, bytes: usize, states: GranuleStates) {
        if let Ok(entries) = self.map_entries(start, bytes) {
            for e in entries {
                e.store(0, Relaxed);
            }
        }
        self.uncount_bytes(bytes as u64);
        self.claims.fetch_add(1, Relaxed);
        // SAFETY: `Span::free_states`, read by the claim after the owner's release of the
        // span, which follows its trims and its hand-outs: the pages it says `Reported` were
        // given back by the owner's trim with `MADV_DONTNEED` and not written since
        // (trim.rs, "Rules"), or never written since the page layer handed them out
        // `Reported`; those it says `Zeroed` were never written since they were handed out
        // reading zero.
        let r = unsafe { self.shared.free_with_states(start, states) };
        debug_assert!(r.is_ok(), "a claimed span's pages are a live page block: {r:?}");
    }

    /// A free pushed into span `s` of heap `h` that is abandoned: collect the span under the
    /// lock (the lock holder owns an abandoned heap), giving it back if it is empty.
    #[cold]
    fn collect_abandoned(&self, h: *mut ThreadHeap, s: &Span) {
        let mut out: *mut Span = ptr::null_mut();
        {
            let mut c = self.central.lock();
            // SAFETY: heaps live as long as the slab.
            let heap = unsafe { &*h };
            // Adopted meanwhile (its new thread collects), or the span changed hands: nothing.
            if !heap.abandoned.load(SeqCst) || !ptr::eq(s.heap.load(Relaxed), h) {
                return;
            }
            heap.take_returned();
            if s.place() == LISTED {
                if let Some(e) = heap.collect_or_drop(s) {
                    // SAFETY: a span just taken off the heap, the lock holder's.
                    unsafe { (*e).next.set(out) };
                    out = e;
                }
            }
            Self::release_dropped_locked(&mut c, heap);
            self.uncount(out);
        }
        self.give_back(out);
    }
}
