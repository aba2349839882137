//! A claim of a span its owner left untouched by the push that frees its last used object,
//! against the owner taking the span back (`Span::push_remote`, `Span::claims`, `Span::take`,
//! slab/span.rs; `ThreadHeap::take_returned`, `make_current`, slab/heap.rs; the owner's free,
//! slab/hot.rs; `Slab::free_remote`, slab/remote.rs; mirrored). Two models: a parked span handed
//! back (the first), and a span listed behind its class's current one that the owner frees an
//! object into and then makes current (the second). The claim's heuristic (the owner's
//! `slow_paths` unchanged since the list's first push) is left out: the protocol's safety does
//! not rest on it.

use super::*;

use loom::sync::atomic::{fence, AtomicUsize};

// A span of two objects, both live, that its owner found full and parked: `thread_free` is
// `PARKED | UNTOUCHED` with a count of 0 (`Span::try_park`). Two other threads free one object
// each: a push clears `PARKED` (the first hands the span back on `returned`) and adds one to the
// count; if that brought the count to the span's objects used with `UNTOUCHED` set, the pushing
// thread sets `CLAIMED` by a compare-and-swap from the word its push left (which fails if the
// owner took the span, or another push came, since) and gives the span's pages back, which the
// page layer may hand to anyone (modelled as writes to both objects' words). Meanwhile the owner takes its handed-back
// spans (`take_returned`): it clears `UNTOUCHED` by one read-modify-write and, unless it found
// `CLAIMED`, relists the span and collects the frees (reading the objects' links). Afterwards:
// the span was claimed or taken back, never both (a span taken back and given away would have
// its objects handed out by its owner inside pages someone else uses: loom also reports that as a
// race on the objects' words); never neither once both objects are free (a parked span no one
// takes back is the sleeping owner's stranded memory this protocol is for); and if taken back,
// both objects are on its list.

const PARKED: usize = 1;
const UNTOUCHED: usize = 2;
const CLAIMED: usize = 4;
const FLAGS: usize = PARKED | UNTOUCHED | CLAIMED;
/// The count of objects on the list, in the high bits (`PUSH_COUNT`).
const COUNT_SHIFT: u32 = 48;
const ONE_PUSH: usize = 1 << COUNT_SHIFT;
const HEAD: usize = (ONE_PUSH - 1) & !FLAGS;
/// The span's objects (`Span::objects`).
const OBJECTS: usize = 2;
/// Object `i` is the word `i << 3` (the flags' bits stay free).
const fn obj(i: usize) -> usize {
    i << 3
}

/// `Span::push_remote`: object `i` (its word in `words`) pushed on `thread_free`: the word
/// before and after.
fn push(thread_free: &AtomicUsize, words: &[UnsafeCell<usize>], i: usize) -> (usize, usize) {
    let mut old = thread_free.load(Relaxed);
    loop {
        assert_eq!(old & CLAIMED, 0, "a push into a claimed span: an object was freed twice");
        // SAFETY: the object being freed is this thread's until its push succeeds.
        words[i].with_mut(|w| unsafe { *w = old & HEAD });
        let new = ((old & !HEAD & !PARKED).wrapping_add(ONE_PUSH)) | obj(i);
        match thread_free.compare_exchange(old, new, SeqCst, Relaxed) {
            Ok(_) => return (old, new),
            Err(now) => old = now,
        }
    }
}

/// `give_back_claimed`: the page layer hands the claimed span's pages to someone who writes
/// them (the objects' words).
fn give_away(words: &[UnsafeCell<usize>]) {
    for w in words {
        // SAFETY: a claimed span's objects are all free and its owner never touches them
        // again: the claiming thread's to give away (loom checks it).
        w.with_mut(|w| unsafe { *w = usize::MAX });
    }
}

struct Claim {
    thread_free: AtomicUsize,
    /// `ThreadHeap::returned` for one span: 0 or 1.
    returned: AtomicUsize,
    /// The objects' first words (index: object number): a link, or what the page layer's next
    /// user wrote.
    words: [UnsafeCell<usize>; 3],
    /// Claims made, and whether the owner took the span back (relisted it).
    claims: AtomicUsize,
    taken_back: AtomicUsize,
    /// The owner's `free` after its collection.
    free: UnsafeCell<usize>,
    /// Broken on purpose: the owner clears `UNTOUCHED` with a load and a store.
    broken: bool,
}

impl Claim {
    /// Another thread frees object `i`: `Span::push_remote`, then `push_returned` for the push
    /// that handed the span back, then (`after_untouched_push`) `claim_due`, `claim` (a
    /// compare-and-swap from the word the push left) and `give_back_claimed`.
    fn free_remote(&self, i: usize) {
        let (old, new) = push(&self.thread_free, &self.words, i);
        if old & PARKED != 0 {
            let was = self.returned.swap(1, SeqCst);
            assert_eq!(was, 0, "a span was handed back twice");
        }
        let claimed = new & UNTOUCHED != 0
            && new >> COUNT_SHIFT == OBJECTS
            && self.thread_free.compare_exchange(new, new | CLAIMED, SeqCst, Relaxed).is_ok();
        if claimed {
            self.claims.fetch_add(1, Relaxed);
            give_away(&self.words[1..]);
        }
    }

    /// The owner: `take_returned` (`take`, then relist and collect, or drop).
    fn take_returned(&self) {
        if self.returned.swap(0, Acquire) == 0 {
            return;
        }
        let w = if self.broken {
            let w = self.thread_free.load(Acquire);
            self.thread_free.store(w & !UNTOUCHED, Relaxed);
            w
        } else {
            self.thread_free.fetch_and(!UNTOUCHED, Acquire)
        };
        if w & CLAIMED != 0 {
            return;
        }
        self.taken_back.fetch_add(1, Relaxed);
        // `Span::collect` once relisted: take the list and walk its links.
        let mut head = self.thread_free.fetch_and(PARKED, Acquire) & HEAD;
        // SAFETY: the owner's `free`, touched by the owner thread only.
        self.free.with_mut(|f| unsafe {
            while head != 0 {
                let next = self.words[head >> 3].with(|w| *w);
                self.words[head >> 3].with_mut(|w| *w = *f);
                *f = head;
                head = next;
            }
        });
    }
}

fn slab_claim_model(broken: bool) {
    model(move || {
        let c = Arc::new(Claim {
            thread_free: AtomicUsize::new(PARKED | UNTOUCHED),
            returned: AtomicUsize::new(0),
            words: [UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0)],
            claims: AtomicUsize::new(0),
            taken_back: AtomicUsize::new(0),
            free: UnsafeCell::new(0),
            broken,
        });
        let (c1, c2) = (c.clone(), c.clone());
        let remote1 = thread::spawn(move || c1.free_remote(1));
        let remote2 = thread::spawn(move || c2.free_remote(2));
        c.take_returned();
        remote1.join().unwrap();
        remote2.join().unwrap();
        // The owner's next slow path takes what was handed back since.
        c.take_returned();
        let (claims, taken) = (c.claims.load(Relaxed), c.taken_back.load(Relaxed));
        assert!(claims + taken == 1, "a span claimed and taken back ({claims}, {taken}), or neither");
        if taken == 1 {
            // The owner collects whatever came after it took the span back.
            let mut head = c.thread_free.swap(0, Acquire) & HEAD;
            let mut seen = 0;
            while head != 0 {
                seen |= 1 << (head >> 3);
                // SAFETY: every thread is done.
                head = c.words[head >> 3].with(|w| unsafe { *w });
            }
            // SAFETY: as above.
            let mut o = c.free.with(|f| unsafe { *f });
            while o != 0 {
                seen |= 1 << (o >> 3);
                // SAFETY: as above.
                o = c.words[o >> 3].with(|w| unsafe { *w });
            }
            assert_eq!(seen, 0b110, "an object freed into a span taken back is on none of its lists");
        }
    });
}

#[test]
fn a_span_is_claimed_or_taken_back_never_both() {
    slab_claim_model(false);
}

// The owner clears `UNTOUCHED` with a load and a store: a claim between the two is overwritten
// (its object lost with it), and the span is both given away and taken back: loom finds the
// owner's collection reading the objects' words as the page layer's next user writes them.
broken_on_purpose!(
    broken_slab_take_back_by_store,
    taking_back_by_a_store_lets_a_claim_through,
    "Causality violation",
    slab_claim_model(true)
);

// ---- A listed span the owner frees into, then makes current ----
//
// A span of three objects, all used (`used` 3), listed behind its class's current span and so
// left untouched (`Span::release`: `thread_free` is `UNTOUCHED`). The owner frees object 1 (its
// hot path: the link written into the object, then a release store of `used`, 2) and then makes
// the span current (`make_current`: `take`, a `fetch_and` clearing `UNTOUCHED`; unless it found
// `CLAIMED`, it collects). Two other threads free objects 2 and 3: a push after which the count
// equals `used` read with acquire (`Span::claim_due`) claims the span by a compare-and-swap from
// the word it left (`Span::claim`), then gives the pages away (writes every object's word). Afterwards: claimed or taken, never both; the claim,
// if any, came after the owner's free (its link write happens before the page's next user's).

/// `Span::used`, the owner's count.
struct Listed {
    thread_free: AtomicUsize,
    used: AtomicUsize,
    words: [UnsafeCell<usize>; 4],
    claims: AtomicUsize,
    taken: AtomicUsize,
    /// Broken on purpose: the owner's free stores `used` with `Relaxed`.
    broken: bool,
}

impl Listed {
    fn free_remote(&self, i: usize) {
        let (_, new) = push(&self.thread_free, &self.words, i);
        // `claim_due` (the fence, then `used` with acquire) and `claim`.
        let claimed = new & UNTOUCHED != 0
            && {
                fence(Acquire);
                new >> COUNT_SHIFT == self.used.load(Acquire)
            }
            && self.thread_free.compare_exchange(new, new | CLAIMED, SeqCst, Relaxed).is_ok();
        if claimed {
            self.claims.fetch_add(1, Relaxed);
            give_away(&self.words[1..]);
        }
    }

    /// The owner: frees object 1 (hot path), then makes the span current (`take`, collect).
    fn owner(&self) {
        // SAFETY: object 1 is live, the owner's: its free writes the link (`local_free`'s,
        // empty here).
        self.words[1].with_mut(|w| unsafe { *w = 0 });
        let used = self.used.load(Relaxed);
        self.used.store(used - 1, if self.broken { Relaxed } else { Release });
        if self.thread_free.fetch_and(!UNTOUCHED, Acquire) & CLAIMED != 0 {
            return;
        }
        self.taken.fetch_add(1, Relaxed);
        let mut head = self.thread_free.fetch_and(PARKED, Acquire) & HEAD;
        while head != 0 {
            // SAFETY: a pushed object, its link written before the push's release.
            head = self.words[head >> 3].with(|w| unsafe { *w });
        }
    }
}

fn slab_claim_listed_model(broken: bool) {
    model(move || {
        let l = Arc::new(Listed {
            thread_free: AtomicUsize::new(UNTOUCHED),
            used: AtomicUsize::new(3),
            words: [UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0)],
            claims: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            broken,
        });
        let (l2, l3) = (l.clone(), l.clone());
        let remote2 = thread::spawn(move || l2.free_remote(2));
        let remote3 = thread::spawn(move || l3.free_remote(3));
        l.owner();
        remote2.join().unwrap();
        remote3.join().unwrap();
        let (claims, taken) = (l.claims.load(Relaxed), l.taken.load(Relaxed));
        assert!(claims + taken == 1, "a span claimed and taken back ({claims}, {taken}), or neither");
    });
}

#[test]
fn a_listed_span_is_claimed_only_after_the_owners_free_into_it() {
    slab_claim_listed_model(false);
}

// The owner's free stores `used` with `Relaxed`: a push that reads the count it stored claims
// the span, and the page's next user writes object 1 with nothing ordering the owner's write of
// its link before: loom reports the race.
broken_on_purpose!(
    broken_slab_free_store_relaxed,
    a_relaxed_free_lets_a_claim_race_its_link,
    "Causality violation",
    slab_claim_listed_model(true)
);
