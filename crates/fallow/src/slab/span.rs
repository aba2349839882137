//! A span's descriptor (`Span`, in the slab's own metadata, never in the span's pages) and its
//! three free lists: `local_free` (the owner's frees, popped first), `free` (never-used objects and
//! collected frees, popped next) and `thread_free` (other threads' frees, pushed with a
//! compare-and-swap, taken by the owner with one swap), as mimalloc's free-list sharding. The links
//! of all three live in the free objects themselves (the first word of each): a live span's free
//! objects are the slab's, not free pages.
//!
//! Who touches what (docs/design.md, "Access rules"): the fields in `Cell`s are the owner's, the
//! thread its heap is bound to, or the slab lock holder for a heap bound to no thread; the
//! atomics are read by any thread that frees an object of the span (`start`, `first_neg`,
//! `mask`, `inv`, `shift`, `fresh`, `owner`, `heap`), by the statistics (`used`, `current`), or
//! by a thread that pushes to it (`thread_free`, `returned_next`, `epoch_seen`; `used`, `low`,
//! `given`, `fresh`, `taken_reported` and `taken_zeroed` when it claims the span).
//!
//! The remote-free protocol on `thread_free` (other threads' frees, parking, claims) is in
//! thread_free.rs.

use core::cell::Cell;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::{Relaxed, Release}};

use super::class::{class_size, colour, divider, span_bytes};
use super::heap::ThreadHeap;
use crate::page::GranuleStates;

/// Bit 31 of `used`: the span is not on its class list (`place` is not `LISTED`). Below it,
/// `used` holds the count of objects used plus 1 for its class's current span (`current`), less
/// the bias `low` of a span armed for a trim (trim.rs: its free at the mark then goes to the rare
/// side by the same compare). The
/// owner's free reads the word anyway (to count down), so one signed compare of it tells
/// whether the free has anything more to do than the push: at least 2 is a listed span that
/// keeps an object used after the free, or the current span with one used at least (an emptied
/// current span stays where it is); at most 1 is a listed span the free empties (1, not
/// current), a double free (0, or 1 for the current span), or a span off its list (negative).
pub(crate) const UNLISTED: u32 = 1 << 31;

/// `Span::tail_from` of a span whose never-used tail was not given back (a span has at most 64
/// pages).
pub(crate) const NO_TAIL: u8 = u8::MAX;

/// `owner` of a span on its way back or of a free descriptor: no heap has it (heap ids are
/// below 2^63, `Slab::new`).
pub(crate) const NO_OWNER: u64 = u64::MAX;

/// Where a span is in its heap (`Span::place`): which of the heap's lists holds it.
pub(crate) const FREE_DESCRIPTOR: u8 = 0;
/// On its class list (the list's head is the class's current span).
pub(crate) const LISTED: u8 = 1;
/// On the heap's list of full spans; if `thread_free` no longer has `PARKED`, a push has handed
/// it back (it is on the heap's `returned` stack, or about to be): only the owner's walk of that
/// stack moves it then.
pub(crate) const FULL: u8 = 2;
/// Kept empty in the heap's spare slot of its class.
pub(crate) const SPARE: u8 = 3;
/// Taken off its heap, on its way back to the page layer (a lock holder collecting an
/// abandoned heap's span finds it so and leaves it alone).
pub(crate) const LEAVING: u8 = 4;

/// Three cache lines, by who writes them: the owner's (its lists and counts, written on every
/// allocation and free of the span), the line every freeing thread reads (written when the span
/// is set up, and `fresh` a page's worth of objects at a time), and the pushers' (`thread_free`,
/// `returned_next`). A push then reads a line the owner does not write on its hot paths and
/// writes one the owner reads only when it collects: with `thread_free` beside the freeing
/// threads' fields and those beside the owner's counts (two lines, as first laid out), every
/// remote free took the line of the owner's counts from its cache and gave the owner a miss on
/// its next free into the span.
#[repr(C, align(64))]
pub(crate) struct Span {
    // The owner's line: what its allocations and frees touch.
    /// Head of the never-used objects handed out a page at a time and the collected frees,
    /// popped once `local_free` is empty (0: empty).
    pub(crate) free: Cell<usize>,
    /// Head of the owner's frees (0: empty), popped first: the last freed first.
    pub(crate) local_free: Cell<usize>,
    /// Objects handed out and not yet back on `free` or `local_free` (those on `thread_free`
    /// still count: the owner subtracts them when it collects them), plus 1 while `current`,
    /// less the trim bias `low` (trim.rs), and `UNLISTED` (bit 31). Written by the owner only (a
    /// load and a store, no read-modify-write); the statistics read it from any thread
    /// (`used()`, the count alone).
    pub(crate) used: AtomicU32,
    /// The span is its class's current one (the head of its class list; owner's, read by the
    /// statistics with `used`).
    pub(crate) current: AtomicBool,
    /// The class and `place` (owner's; `place` changes through `set_place`, which keeps
    /// `UNLISTED` in `used` in step).
    pub(crate) class: Cell<u8>,
    place: Cell<u8>,
    /// Objects from `fresh` up were never handed out; with `zeroed` they read zero.
    pub(crate) zeroed: Cell<bool>,
    /// The owner's slow path found the span full and moved it to the tail of its class list
    /// instead of parking it, and has taken no object from it since (heap.rs, `alloc`).
    pub(crate) skipped: Cell<bool>,
    /// Trim back-off (trim.rs; the owner's): in the low 4 bits how many times the span's first
    /// mark is halved, and `GAVE` (bit 4): a trim gave pages back since the span was last armed.
    pub(crate) backoff: Cell<u8>,
    /// The count at or below which the armed span is trimmed next (trim.rs; the owner's).
    pub(crate) mark: Cell<u16>,
    /// The bias taken out of `used` while the span is armed for a trim (trim.rs): 0 when not
    /// armed; else at most the class's low mark, so that the owner's free leaves its hot path
    /// (the compare of `used` against 2) when the count comes down to the mark. Owner-written,
    /// read by the statistics with `used`.
    pub(crate) low: AtomicU32,
    /// End of the last whole object.
    pub(crate) end: Cell<usize>,
    /// Links of the owner's list this span is on (class list or full list).
    pub(crate) next: Cell<*mut Span>,
    pub(crate) prev: Cell<*mut Span>,
    /// No slow path of the owner's took an object from the span since its last sweep looked at
    /// it (set by the sweep, cleared by the slow path; tail.rs, the owner's).
    pub(crate) quiet: Cell<bool>,
    /// The first page of the span's never-used tail given back (tail.rs; `NO_TAIL`: none since
    /// the span was set up; the owner's).
    pub(crate) tail_from: Cell<u8>,
    _owner_end: [u8; 6],
    // Read by any thread freeing into the span (its own line).
    /// Index of the first never-handed-out object: objects `fresh..` were never handed out, a
    /// free of one is of a pointer the slab never handed out (written by the owner only).
    pub(crate) fresh: AtomicUsize,
    /// The span's first address (its pages' start, aligned to its size).
    pub(crate) start: AtomicUsize,
    /// The first object's address (`first()`: `start` plus the class's colour, class.rs), negated:
    /// an address's offset from it is one addition where a subtraction would take a copy of the
    /// address. Object `i` starts at `first() + i * size`.
    pub(crate) first_neg: AtomicUsize,
    /// The span's bytes less one: an address is in the span when its offset from `start` is at
    /// most this (a remote free's check against a stale span, a trim's page count).
    pub(crate) mask: AtomicUsize,
    /// `size` is `2^shift` times an odd number whose inverse modulo 2^64 is `inv`
    /// (class.rs, `divider`, `object_index`).
    pub(crate) inv: AtomicU64,
    pub(crate) size: AtomicU32,
    pub(crate) shift: AtomicU8,
    /// The id of the heap that owns the span (`ThreadHeap::id`, the word the owner's thread
    /// keeps in `os::tls`), `NO_OWNER` while the descriptor is free: the owner's free tells
    /// its own span by one compare.
    pub(crate) owner: AtomicU64,
    /// The heap that owns the span (null while the descriptor is free).
    pub(crate) heap: AtomicPtr<ThreadHeap>,
    // Written by the pushers (its own line).
    /// Other threads' frees, and `PARKED` (above).
    pub(crate) thread_free: AtomicUsize,
    /// Link of the owner heap's `returned` stack.
    pub(crate) returned_next: AtomicPtr<Span>,
    /// The span's pages given back to the kernel by a trim (bit i: page i; trim.rs), the
    /// owner's: no live object and no list link is on them, every object touching one is free
    /// and on no list. On this line, which the owner's hot paths never touch.
    pub(crate) given: AtomicU64,
    /// The states the span's pages had when it was taken (`GranuleStates`: granules read zero
    /// and not resident, granules read zero), set before it is published; while it is live, the
    /// owner adds the never-used pages it gave back to `taken_reported` (tail.rs, with the span
    /// taken and no other thread's free waiting on it). The pages no object was handed out on
    /// go back with them (`free_states`).
    pub(crate) taken_reported: AtomicU64,
    pub(crate) taken_zeroed: AtomicU64,
    /// The owner heap's `slow_paths` as the first push since the span was last collected saw
    /// it (a claim needs it unchanged; the pushers').
    pub(crate) epoch_seen: AtomicU32,
    /// When the armed span was first seen at its mark (`Shared::now_ms` plus 1; 0: not
    /// since it was armed or became its class's current span; `trim::AT_ONCE`: trimmed since it
    /// was armed, so that the next trim of its cascade does not wait). The owner's; on this
    /// line, which its hot paths never touch.
    pub(crate) due_since: Cell<u32>,
}

// The three lines (above): each group starts a line of its own.
const _: () = assert!(core::mem::offset_of!(Span, fresh) == 64 && core::mem::offset_of!(Span, heap) < 128);
const _: () = assert!(core::mem::offset_of!(Span, thread_free) == 128 && core::mem::size_of::<Span>() == 192);
const _: () = assert!(core::mem::offset_of!(Span, end) == 32 && core::mem::offset_of!(Span, low) == 28);

// SAFETY: the `Cell` fields are touched only by the span's owner: the thread its heap is bound
// to, or the holder of the slab lock while the heap is bound to no thread (`ThreadHeap`'s
// `abandoned`); ownership passes between the two only under the slab lock. Every field another
// thread reads is an atomic.
unsafe impl Sync for Span {}
// SAFETY: as above; a descriptor is never moved, only referred to.
unsafe impl Send for Span {}

/// The span the hot paths see for a class with no span: never written (every writer checks
/// `is_empty_span` first), its `free` always 0.
pub(crate) static EMPTY: Span = Span::new();

impl Span {
    pub(crate) const fn new() -> Span {
        Span {
            free: Cell::new(0),
            local_free: Cell::new(0),
            used: AtomicU32::new(UNLISTED),
            current: AtomicBool::new(false),
            class: Cell::new(0),
            place: Cell::new(FREE_DESCRIPTOR),
            zeroed: Cell::new(false),
            skipped: Cell::new(false),
            backoff: Cell::new(0),
            mark: Cell::new(0),
            low: AtomicU32::new(0),
            end: Cell::new(0),
            next: Cell::new(ptr::null_mut()),
            prev: Cell::new(ptr::null_mut()),
            quiet: Cell::new(false),
            tail_from: Cell::new(NO_TAIL),
            _owner_end: [0; 6],
            fresh: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            first_neg: AtomicUsize::new(0),
            mask: AtomicUsize::new(0),
            inv: AtomicU64::new(0),
            size: AtomicU32::new(0),
            shift: AtomicU8::new(0),
            owner: AtomicU64::new(NO_OWNER),
            heap: AtomicPtr::new(ptr::null_mut()),
            thread_free: AtomicUsize::new(0),
            returned_next: AtomicPtr::new(ptr::null_mut()),
            given: AtomicU64::new(0),
            taken_reported: AtomicU64::new(0),
            taken_zeroed: AtomicU64::new(0),
            epoch_seen: AtomicU32::new(0),
            due_since: Cell::new(0),
        }
    }

    pub(crate) fn empty() -> *mut Span {
        &EMPTY as *const Span as *mut Span
    }

    pub(crate) fn is_empty_span(s: *const Span) -> bool {
        ptr::eq(s, &EMPTY)
    }

    /// Set up a free descriptor for a span of class `c` at `start` owned by `heap` (whose id
    /// is `owner`); `zeroed`: its pages read zero; `taken`: their states when the page layer
    /// handed them out. Called by the owner before the span is in the page map.
    pub(crate) fn init(&self, c: usize, start: usize, zeroed: bool, taken: GranuleStates, heap: *mut ThreadHeap, owner: u64) {
        let (size, colour) = (class_size(c), colour(c));
        let first = start + colour;
        let n = (span_bytes(c) - colour) / size;
        let (inv, shift) = divider(size);
        self.free.set(0);
        self.local_free.set(0);
        self.used.store(0, Relaxed);
        self.current.store(false, Relaxed);
        self.class.set(c as u8);
        // On no list until `ThreadHeap::install` lists it.
        self.set_place(LEAVING);
        self.zeroed.set(zeroed);
        self.skipped.set(false);
        self.backoff.set(0);
        self.mark.set(0);
        self.low.store(0, Relaxed);
        self.given.store(0, Relaxed);
        self.taken_reported.store(taken.reported, Relaxed);
        self.taken_zeroed.store(taken.zeroed, Relaxed);
        self.due_since.set(0);
        self.quiet.set(false);
        self.tail_from.set(NO_TAIL);
        self.end.set(first + n * size);
        self.next.set(ptr::null_mut());
        self.prev.set(ptr::null_mut());
        self.fresh.store(0, Relaxed);
        self.start.store(start, Relaxed);
        self.first_neg.store(first.wrapping_neg(), Relaxed);
        self.mask.store(span_bytes(c) - 1, Relaxed);
        self.inv.store(inv, Relaxed);
        self.size.store(size as u32, Relaxed);
        self.shift.store(shift as u8, Relaxed);
        self.owner.store(owner, Relaxed);
        self.heap.store(heap, Relaxed);
        self.thread_free.store(0, Relaxed);
        self.returned_next.store(ptr::null_mut(), Relaxed);
    }

    /// The span's pages given back by a trim (`given`, the owner's).
    #[inline(always)]
    pub(crate) fn given(&self) -> u64 {
        self.given.load(Relaxed)
    }

    /// The owner records the span's pages given back by a trim.
    pub(crate) fn set_given(&self, pages: u64) {
        self.given.store(pages, Relaxed)
    }

    /// Objects counted as used (the owner's count; any thread may read it).
    #[inline(always)]
    pub(crate) fn used(&self) -> u32 {
        // Another thread may see `current`, `low` and `used` of different moments: never below
        // 0 (the word is below 2^31 and `low` at most a span's objects: no wrap).
        ((self.used.load(Relaxed) & !UNLISTED) + self.low.load(Relaxed)).saturating_sub(self.current.load(Relaxed) as u32)
    }

    /// The owner's new count, `current`'s 1 and `UNLISTED` kept (a plain store: it is the only
    /// writer).
    #[inline(always)]
    pub(crate) fn set_used(&self, n: u32) {
        debug_assert!(n < UNLISTED - 1);
        self.store_count(n, self.current.load(Relaxed) as u32)
    }

    /// The word for `n` used and `cur` (`current`), less the bias `low`: a count that came
    /// down past the bias (other threads' frees collected, a span no longer current) lowers
    /// the bias with it, so that the word never goes below 0 (trim.rs: the span stays armed, its
    /// next free below the mark leaves the hot path all the same).
    #[inline(always)]
    fn store_count(&self, n: u32, cur: u32) {
        let low = self.low.load(Relaxed);
        let keep = low.min(n + cur);
        if keep != low {
            self.low.store(keep, Relaxed);
        }
        let w = self.used.load(Relaxed);
        // Release: an untouched span's claim reads `used` with acquire (the owner's free wrote
        // the object's link before it).
        self.used.store((n + cur - keep) | (w & UNLISTED), Release)
    }

    /// The owner makes the span its class's current one or not (`ThreadHeap`, as the head of
    /// the class list changes), its 1 in `used` with it.
    pub(crate) fn set_current(&self, current: bool) {
        if self.current.load(Relaxed) == current {
            return;
        }
        let n = self.used();
        self.current.store(current, Relaxed);
        self.store_count(n, current as u32);
    }

    /// Which of its heap's lists holds the span (owner's).
    #[inline(always)]
    pub(crate) fn place(&self) -> u8 {
        self.place.get()
    }

    /// The owner moves the span to `place`, and sets or clears `UNLISTED` with it.
    pub(crate) fn set_place(&self, place: u8) {
        self.place.set(place);
        let w = self.used.load(Relaxed) & !UNLISTED;
        self.used.store(if place == LISTED { w } else { w | UNLISTED }, Relaxed);
    }

    /// The first object's address.
    #[inline(always)]
    pub(crate) fn first(&self) -> usize {
        self.first_neg.load(Relaxed).wrapping_neg()
    }

    /// `addr`'s offset from the first object (wrapped below it).
    #[inline(always)]
    pub(crate) fn offset(&self, addr: usize) -> usize {
        addr.wrapping_add(self.first_neg.load(Relaxed))
    }

    /// The address of the first never-handed-out object (`fresh` is its index).
    pub(crate) fn fresh_at(&self) -> usize {
        self.first() + self.fresh.load(Relaxed) * self.size.load(Relaxed) as usize
    }

    /// The owner pops an object off its own frees (`local_free`), the one it freed last first
    /// (still in the cache: the next request of the class reuses it, as a LIFO thread cache
    /// does), or else off `free` (never-used objects and collected frees). The hot path: a
    /// class with few live objects never leaves it.
    #[inline(always)]
    pub(crate) fn pop(&self) -> Option<usize> {
        let o = self.local_free.get();
        if o != 0 {
            // SAFETY: `o` heads this live span's `local_free`: a free object whose first word
            // is the list's link, written by this owner; the owner alone reads it.
            self.local_free.set(unsafe { *(o as *const usize) });
        } else {
            let o = self.free.get();
            if o == 0 {
                return None;
            }
            // SAFETY: `o` heads `free`: a free object of this live span whose first word is the
            // list's link, written by this owner (or by a remote free ordered before the
            // owner's swap of `thread_free`); the owner alone reads it.
            self.free.set(unsafe { *(o as *const usize) });
            self.used.store(self.used.load(Relaxed) + 1, Relaxed);
            return Some(o);
        }
        // One more used, `UNLISTED` kept: the count (at most a span's objects) never carries
        // into bit 31.
        self.used.store(self.used.load(Relaxed) + 1, Relaxed);
        Some(o)
    }

    /// The owner hands out never-used objects: one for a request that wants zeros (from a
    /// zeroed span it reads zero: `Some((addr, true))`), else up to a page of them linked into
    /// `free` and the first one popped. `None`: none left.
    pub(crate) fn take_fresh(&self, zero: bool) -> Option<(usize, bool)> {
        let index = self.fresh.load(Relaxed);
        let fresh = self.fresh_at();
        let size = self.size.load(Relaxed) as usize;
        let end = self.end.get();
        if fresh >= end {
            return None;
        }
        if zero {
            self.fresh.store(index + 1, Relaxed);
            self.set_used(self.used() + 1);
            return Some((fresh, self.zeroed.get()));
        }
        let n = (4096 / size).clamp(1, (end - fresh) / size);
        let last = fresh + (n - 1) * size;
        let mut o = fresh + size;
        while o <= last {
            // SAFETY: `o - size` is a never-used object of this live span, below `end`: the
            // owner's memory, which the link makes part of `free` (the page map and the
            // descriptor hold the span's bookkeeping; these words are free objects).
            unsafe { *((o - size) as *mut usize) = o };
            o += size;
        }
        // SAFETY: as above, the last object of the batch.
        unsafe { *(last as *mut usize) = self.free.get() };
        self.fresh.store(index + n, Relaxed);
        self.free.set(fresh);
        self.pop().map(|o| (o, false))
    }
}

/// Publish a span's descriptor in the page map (the entries' `Release` stores pair with the
/// freeing threads' `Acquire` loads).
pub(crate) fn publish(entry: &AtomicUsize, s: &Span) {
    entry.store(s as *const Span as usize, Release);
}
