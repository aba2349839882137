//! The slab's remote-free protocol (`slab/span.rs`, `slab/heap.rs`; mirrored).

use super::*;

use loom::sync::atomic::AtomicUsize;

// ---- A span's `thread_free` against its owner (slab/span.rs, slab/heap.rs; mirrored) ----
//
// A span's `thread_free` word holds the head of other threads' frees, their count in its high
// bits and, in bit 0, `PARKED` (the owner found the span full and took it off its class list),
// in bit 1 `UNTOUCHED` (set with it; the claim that uses it has its own model, slab_claim.rs).
// Mirrored: `Span::collect` (`fetch_and(PARKED, Acquire)` and the walk of the links),
// `Span::try_park` (`0 -> PARKED | UNTOUCHED` compare-and-swap), `Span::unpark` (the owner's
// free into a parked span: `fetch_and(!(PARKED | UNTOUCHED))`), `Span::push_remote` (link
// written, then a compare-and-swap that clears `PARKED` and counts the push; the push that
// cleared it hands the span back), `push_returned` / `take_returned` (the heap's stack of
// handed-back spans, one span here; `UNTOUCHED` cleared by `fetch_and`), `ThreadHeap::alloc`'s
// park step and `after_local_free`. The owner frees one of the three objects itself, so no
// push brings the count to the span's objects: no claim.
// The model: the owner's current span is full (objects 1, 2 and 3 handed out); the owner looks
// for an object (collects, finds none, parks), then frees object 2 itself; meanwhile two other
// threads free objects 1 and 3 (so that two pushes race for the parked bit). Afterwards the owner takes the handed-back spans and collects: the
// span is back on the owner's list exactly once, never lost parked, and both objects are on its
// lists. The objects' first words (the links) are loom `UnsafeCell`s: the owner reads a link
// only after an acquire that orders the pusher's write before it.

const PARKED: usize = 1;
const UNTOUCHED: usize = 2;
const ONE_PUSH: usize = 1 << 48;
const HEAD: usize = (ONE_PUSH - 1) & !7;
/// Object `i` is the word `i << 3` (bits 0-2 stay free for the flags).
const fn obj(i: usize) -> usize {
    i << 3
}
/// Object number of the word `o`.
const fn index(o: usize) -> usize {
    o >> 3
}

/// Where the span is in its heap (`Span::place`).
const LISTED: u8 = 1;
const FULL: u8 = 2;

struct Remote {
    thread_free: AtomicUsize,
    /// `ThreadHeap::returned` for one span: 0 or 1 (the span).
    returned: AtomicUsize,
    /// The objects' first words (index: object number).
    links: [UnsafeCell<usize>; 4],
    /// The owner's (`Span::place`, `free`, `local_free`), an `UnsafeCell` touched by the owner
    /// thread, then by the main thread after joining it.
    owner: UnsafeCell<(u8, usize, usize)>,
    /// Broken on purpose: the owner parks with a plain store instead of `0 -> PARKED`.
    broken: bool,
}

impl Remote {
    /// `Span::collect`: move the other threads' frees to `free`.
    fn collect(&self) {
        if self.thread_free.load(Relaxed) & HEAD == 0 {
            return;
        }
        let mut head = self.thread_free.fetch_and(PARKED, Acquire) & HEAD;
        // SAFETY: the owner's fields, touched by the owner only.
        self.owner.with_mut(|o| unsafe {
            while head != 0 {
                let next = self.links[index(head)].with(|l| *l);
                self.links[index(head)].with_mut(|l| *l = (*o).1);
                (*o).1 = head;
                head = next;
            }
        });
    }

    /// `ThreadHeap::alloc` on a full current span: collect, else park (`try_park`); a push that
    /// came first makes the park fail, and the owner collects it instead.
    fn look_for_an_object(&self) {
        self.collect();
        // SAFETY: as in `collect`.
        if self.owner.with(|o| unsafe { (*o).1 }) != 0 {
            return;
        }
        let parked = if self.broken {
            self.thread_free.store(PARKED, SeqCst);
            true
        } else {
            self.thread_free.compare_exchange(0, PARKED | UNTOUCHED, SeqCst, Relaxed).is_ok()
        };
        if parked {
            // SAFETY: as in `collect`.
            self.owner.with_mut(|o| unsafe { (*o).0 = FULL });
        } else {
            self.collect();
        }
    }

    /// The owner frees object `i` (`Allocator::free_any` local path, then `after_local_free`).
    fn free_local(&self, i: usize) {
        // SAFETY: as in `collect`; the object is the owner's (live, now freed by it).
        self.owner.with_mut(|o| unsafe {
            self.links[i].with_mut(|l| *l = (*o).2);
            (*o).2 = obj(i);
            if (*o).0 == FULL && self.thread_free.fetch_and(!(PARKED | UNTOUCHED), Acquire) & PARKED != 0 {
                // This free cleared `PARKED`: the owner moves the span back itself.
                (*o).0 = LISTED;
            }
        });
    }

    /// Another thread frees object `i` (`Span::push_remote`, then `push_returned`).
    fn free_remote(&self, i: usize) {
        let mut old = self.thread_free.load(Relaxed);
        loop {
            // SAFETY: the object being freed is this thread's until its push succeeds.
            self.links[i].with_mut(|l| unsafe { *l = old & HEAD });
            let new = ((old & !HEAD & !PARKED).wrapping_add(ONE_PUSH)) | obj(i);
            match self.thread_free.compare_exchange(old, new, SeqCst, Relaxed) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        if old & PARKED != 0 {
            let was = self.returned.swap(1, SeqCst);
            assert_eq!(was, 0, "a span was handed back twice");
        }
    }

    /// The owner later: `take_returned` (moves a handed-back span back), then collects.
    fn settle(&self) {
        if self.returned.swap(0, Acquire) == 1 {
            let w = self.thread_free.fetch_and(!UNTOUCHED, Acquire);
            assert_eq!(w & 4, 0, "a span with a live object was claimed");
            // SAFETY: as in `collect`.
            self.owner.with_mut(|o| unsafe {
                assert_eq!((*o).0, FULL, "a handed-back span was not parked");
                (*o).0 = LISTED;
            });
        }
        // SAFETY: as in `collect`.
        if self.owner.with(|o| unsafe { (*o).0 }) == LISTED {
            self.collect();
        }
    }
}

fn slab_remote_model(broken: bool) {
    model(move || {
        let r = Arc::new(Remote {
            thread_free: AtomicUsize::new(0),
            returned: AtomicUsize::new(0),
            links: [UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0)],
            owner: UnsafeCell::new((LISTED, 0, 0)),
            broken,
        });
        let (r1, r3) = (r.clone(), r.clone());
        let remote1 = thread::spawn(move || r1.free_remote(1));
        let remote3 = thread::spawn(move || r3.free_remote(3));
        r.look_for_an_object();
        r.free_local(2);
        remote1.join().unwrap();
        remote3.join().unwrap();
        r.settle();
        // SAFETY: every thread is done; the owner's fields are read once more.
        let (place, free, local) = r.owner.with(|o| unsafe { *o });
        assert_eq!(place, LISTED, "the span was lost parked: no thread will hand it back");
        assert_eq!(r.thread_free.load(Relaxed), 0, "a free was left on a parked span's list");
        let mut seen = 0;
        for head in [free, local] {
            let mut o = head;
            while o != 0 {
                seen |= 1 << index(o);
                // SAFETY: every thread is done; the links are read once more.
                o = r.links[index(o)].with(|l| unsafe { *l });
            }
        }
        assert_eq!(seen, 0b1110, "an object freed into the span is on none of its lists");
    });
}

#[test]
fn a_remote_free_into_a_span_its_owner_parks_is_never_lost() {
    slab_remote_model(false);
}

// Parking by a plain store: a push that came just before is overwritten, and the span stays
// parked with no push left to hand it back.
broken_on_purpose!(
    broken_slab_park_by_store,
    parking_by_a_store_loses_a_remote_free,
    "lost parked",
    slab_remote_model(true)
);
