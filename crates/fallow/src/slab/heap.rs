//! A thread heap (`ThreadHeap`): one thread's spans of one allocator, per class a list whose
//! head is the span the hot path pops from, a list of full (parked) spans, one spare empty span
//! per class (`SPARES_MAX` over all), and the `returned` stack through which other threads hand
//! parked spans back.
//! Here the owner's slow paths: finding an object when the current span has none, a local free
//! that emptied a span or freed into a parked one, and giving the heap up (thread exit).
//!
//! A heap lives on a page of its own from the OS and is never unmapped before its slab: when
//! its thread exits it is abandoned (`abandoned`, under the slab lock) with the spans that still
//! hold live objects, and the next thread to need a heap adopts it whole. While it is abandoned
//! the slab lock holder is its owner: a free into one of its spans pushes on `thread_free` as
//! any other thread's, then sees `abandoned` and collects that span under the lock, giving it
//! back to the page layer once empty. So no span outlives its objects, whoever frees them.

use core::cell::Cell;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering::Relaxed};

use super::class::{CLASSES, CLASS_TABLE, SIZE_SLOTS};
use super::span::{Span, EMPTY, FULL, LEAVING, LISTED, SPARE};
use super::thread_free::{take_returned, TakenBack};
use crate::cache::Owned;

/// Spare spans a heap keeps at most, over all classes: a spare is memory no other class can use,
/// and a heap that touched every class and went idle would otherwise keep 60 of them (16 MiB)
/// beside its 60 current spans.
const SPARES_MAX: u64 = 4;

#[repr(C, align(64))]
pub(crate) struct ThreadHeap {
    /// Per class, the head of the list of spans with room (the current span), `EMPTY` if none.
    pub(crate) head: [Cell<*mut Span>; CLASSES],
    /// Per class, the last span of that list (null if the list is empty): spans coming back
    /// from the full list join there, so that each has gathered more frees by the time the
    /// allocations reach it.
    pub(crate) tail: [Cell<*mut Span>; CLASSES],
    /// Per class, one empty span kept (null if none).
    pub(crate) spare: [Cell<*mut Span>; CLASSES],
    /// Full spans, parked (`Span::place == FULL`), linked through `next` / `prev`.
    pub(crate) full: Cell<*mut Span>,
    /// Spans other threads handed back (thread_free.rs, the remote-free protocol).
    pub(crate) returned: AtomicPtr<Span>,
    /// Descriptors of spans other threads claimed (thread_free.rs), dropped by the owner from its
    /// lists and waiting to go back to the pool under the slab lock
    /// (`Slab::release_dropped_locked`),
    /// linked through `next`.
    pub(crate) dropped: Cell<*mut Span>,
    /// The owner's slow paths (`alloc`), counted: a push claims a span only if its owner ran
    /// none since the first push of the span's list (thread_free.rs). Owner-written (a load and a
    /// store), read by the pushers.
    pub(crate) slow_paths: AtomicU32,
    /// Bound to no thread: the slab lock holder is the owner (set and cleared under the lock).
    pub(crate) abandoned: AtomicBool,
    /// Spans held, of which spares (the statistics).
    pub(crate) spans: Owned,
    pub(crate) spares: Owned,
    /// Pages of its spans given back by trims now, trims made and pages they gave back in all
    /// (trim.rs; the statistics).
    pub(crate) trimmed: Owned,
    pub(crate) trims: Owned,
    pub(crate) trimmed_total: Owned,
    /// New spans taken since the owner's last sweep (sweep.rs).
    pub(crate) since_sweep: Cell<u32>,
    /// The heap's id (set when it is made, never changed, never another heap's in the process:
    /// the slab's id in the high bits, `HEAP_BITS` of a count below): the word the owner's
    /// thread keeps in `os::tls` beside the heap's address, and every span's `owner`.
    pub(crate) id: Cell<u64>,
    /// The slab's list of all its heaps and its pool of abandoned ones (under the slab lock).
    pub(crate) next_heap: Cell<*mut ThreadHeap>,
    pub(crate) next_pooled: Cell<*mut ThreadHeap>,
    /// Per class, a span of it handed out an object on pages its never-used tail gave back:
    /// the class's tails are kept from then on (tail.rs).
    pub(crate) tails_kept: [Cell<bool>; CLASSES],
    /// `class::CLASS_TABLE` (written when the heap is set up, then only read).
    pub(crate) class_of: [u8; SIZE_SLOTS],
}

// SAFETY: the `Cell`s are the owner's (its bound thread, or the slab lock holder while it is
// abandoned; the two pass it on under the lock), the links `next_heap` / `next_pooled` the slab
// lock holder's, `id` written once before the heap is registered; what other threads touch is
// atomic (`returned`, `abandoned`, the counters).
unsafe impl Sync for ThreadHeap {}

const _: () = assert!(core::mem::size_of::<ThreadHeap>() <= crate::os::PAGE_SIZE);

/// The heap `table::last` gives a thread that has none of the slab (or not the one it used
/// last): it owns no span and its heads are `EMPTY`, so the hot paths need no null test (an
/// allocation finds nothing to pop, a free finds the span's heap is not this one). Never
/// written: the hot paths write only spans they popped from, and the slow paths ask
/// `table::current`, which never gives it.
pub(crate) static NO_HEAP: ThreadHeap = ThreadHeap {
    head: [const { Cell::new(&EMPTY as *const Span as *mut Span) }; CLASSES],
    tail: [const { Cell::new(ptr::null_mut()) }; CLASSES],
    spare: [const { Cell::new(ptr::null_mut()) }; CLASSES],
    full: Cell::new(ptr::null_mut()),
    returned: AtomicPtr::new(ptr::null_mut()),
    dropped: Cell::new(ptr::null_mut()),
    slow_paths: AtomicU32::new(0),
    abandoned: AtomicBool::new(false),
    spans: Owned::new(),
    spares: Owned::new(),
    trimmed: Owned::new(),
    trims: Owned::new(),
    trimmed_total: Owned::new(),
    since_sweep: Cell::new(0),
    id: Cell::new(0),
    next_heap: Cell::new(ptr::null_mut()),
    next_pooled: Cell::new(ptr::null_mut()),
    tails_kept: [const { Cell::new(false) }; CLASSES],
    class_of: CLASS_TABLE,
};

impl ThreadHeap {
    pub(crate) fn none() -> *mut ThreadHeap {
        &NO_HEAP as *const ThreadHeap as *mut ThreadHeap
    }
}

/// What the owner's slow path found for a request.
pub(crate) enum Got {
    /// An object, and whether it reads zero (a never-used object of a zeroed span).
    Object(usize, bool),
    /// No span of the class has room: the caller takes a new one from the page layer (without
    /// any lock held) and installs it (`install`).
    NeedSpan,
}

impl ThreadHeap {
    /// Set up a heap with id `id` on `page`, a fresh zeroed page (zero is null and 0 for every
    /// field; the heads start at `EMPTY`).
    ///
    /// # Safety
    /// `page` is a fresh mapping of at least a page that nothing else uses.
    pub(crate) unsafe fn init(page: usize, id: u64) -> *mut ThreadHeap {
        let h = page as *mut ThreadHeap;
        // SAFETY: the caller's page, zeroed: a valid `ThreadHeap` of null pointers and zeros,
        // which this thread alone sees until it is registered.
        let r = unsafe { &*h };
        for c in &r.head {
            c.set(Span::empty());
        }
        r.id.set(id);
        // SAFETY: as above; no reference to the field is live.
        unsafe { ptr::addr_of_mut!((*h).class_of).write(CLASS_TABLE) };
        h
    }

    // ---- Lists (owner) ----

    fn push_head(&self, s: &Span) {
        let c = s.class.get() as usize;
        let old = self.head[c].get();
        let me = s as *const Span as *mut Span;
        s.prev.set(ptr::null_mut());
        // Allocated from again: a wait for its trim starts over (trim.rs, "Wait").
        s.due_since.set(0);
        if Span::is_empty_span(old) {
            s.next.set(ptr::null_mut());
            self.tail[c].set(me);
        } else {
            s.next.set(old);
            // SAFETY: `old` is a listed span of this heap (owner's).
            unsafe { (*old).prev.set(me) };
        }
        if !Span::is_empty_span(old) {
            // SAFETY: as above.
            unsafe {
                (*old).set_current(false);
                // Behind the head now: left untouched (thread_free.rs).
                (*old).release();
            }
        }
        self.head[c].set(me);
        s.set_place(LISTED);
        s.set_current(true);
    }

    /// Put a span back on its class list at the tail (it has room, but the spans ahead of it
    /// are used first: by the time the allocations reach it, it has gathered more frees; put
    /// right behind the head, a span relisted by one free went full again after one
    /// allocation, a park and an unpark per object in a program that frees at random, as
    /// mimalloc's comment on `mi_page_queue_enqueue_from_full` says of alloc-test).
    fn push_tail(&self, s: &Span) {
        let c = s.class.get() as usize;
        let last = self.tail[c].get();
        if last.is_null() {
            return self.push_head(s);
        }
        let me = s as *const Span as *mut Span;
        s.prev.set(last);
        s.next.set(ptr::null_mut());
        // SAFETY: `last` is a listed span of this heap (owner's).
        unsafe { (*last).next.set(me) };
        self.tail[c].set(me);
        s.set_place(LISTED);
        // Behind the head: left untouched (thread_free.rs).
        s.release();
    }

    fn unlink(&self, s: &Span) {
        let (p, n) = (s.prev.get(), s.next.get());
        // SAFETY: `p` and `n` are spans of this heap's same list (owner's), or null.
        unsafe {
            if !n.is_null() {
                (*n).prev.set(p);
            } else if s.place() == LISTED {
                self.tail[s.class.get() as usize].set(p);
            }
            if !p.is_null() {
                (*p).next.set(n);
            } else if s.place() == FULL {
                self.full.set(n);
            } else {
                // The head: the next span becomes its class's current one.
                s.set_current(false);
                self.head[s.class.get() as usize].set(if n.is_null() { Span::empty() } else { n });
                if !n.is_null() {
                    self.make_current(s.class.get() as usize);
                }
            }
        }
        s.next.set(ptr::null_mut());
        s.prev.set(ptr::null_mut());
    }

    /// The head of class `c`'s list becomes its current span: taken first (thread_free.rs); one
    /// another thread claimed is dropped, and the next one tried.
    fn make_current(&self, c: usize) {
        loop {
            let h = self.head[c].get();
            if Span::is_empty_span(h) {
                return;
            }
            // SAFETY: the head of a class list of this heap (owner's).
            let s = unsafe { &*h };
            if !s.take() {
                s.set_current(true);
                return;
            }
            let n = s.next.get();
            self.head[c].set(if n.is_null() { Span::empty() } else { n });
            if n.is_null() {
                self.tail[c].set(ptr::null_mut());
            } else {
                // SAFETY: the next span of the same list (owner's).
                unsafe { (*n).prev.set(ptr::null_mut()) };
            }
            s.next.set(ptr::null_mut());
            self.drop_claimed(s);
        }
    }

    /// Take a span of a class list (thread_free.rs: the owner's look before it does anything with
    /// one behind the head; the head it holds already): `false` if another thread claimed it, which
    /// is then dropped from the list.
    pub(crate) fn take_listed(&self, s: &Span) -> bool {
        if s.current.load(Relaxed) || !s.take() {
            return true;
        }
        self.unlink(s);
        self.drop_claimed(s);
        false
    }

    /// Leave a span of a class list again after `take_listed` (the head stays taken).
    pub(crate) fn leave_listed(&self, s: &Span) {
        if !s.current.load(Relaxed) && s.place() == LISTED {
            s.release();
        }
    }

    fn park(&self, s: &Span) {
        self.unlink(s);
        s.set_place(FULL);
        let old = self.full.get();
        s.prev.set(ptr::null_mut());
        s.next.set(old);
        if !old.is_null() {
            // SAFETY: `old` is on this heap's full list (owner's).
            unsafe { (*old).prev.set(s as *const Span as *mut Span) };
        }
        self.full.set(s as *const Span as *mut Span);
    }

    /// Move the spans other threads handed back from the full list to their class lists, and
    /// drop those another thread claimed meanwhile (their pages are the page layer's): whether
    /// any came back.
    pub(crate) fn take_returned(&self) -> bool {
        let mut s = take_returned(&self.returned);
        let mut any = false;
        while !s.is_null() {
            // SAFETY: a span on this heap's `returned` stack is this heap's, parked and handed
            // back (only the push that cleared `PARKED` puts it there, once per park).
            let r = unsafe { &*s };
            s = r.returned_next.load(Relaxed);
            debug_assert!(r.place() == FULL);
            self.unlink(r);
            if r.take() {
                self.drop_claimed(r);
            } else {
                self.push_tail(r);
                any = true;
            }
        }
        any
    }

    /// A span another thread claimed, off its list: off the heap's counts, its descriptor onto
    /// `dropped` (the claiming thread no longer touches it).
    fn drop_claimed(&self, s: &Span) {
        self.spans.sub(1);
        self.forget_given(s);
        s.set_place(LEAVING);
        s.next.set(self.dropped.get());
        self.dropped.set(s as *const Span as *mut Span);
    }

    // ---- Allocation (owner) ----

    /// An object of class `c` when the current span's `local_free` and `free` are empty: other
    /// threads' frees into it, its never-used objects, the next span with room (parking the
    /// full ones), spans handed back, the spare; else `NeedSpan`. `zero`: the request wants zeros
    /// (a never-used object of a zeroed span is then handed out as reading zero). Before the
    /// never-used objects, those on pages a trim gave back (trim.rs); `trim`: a span found full
    /// is armed for its next trim.
    pub(crate) fn alloc(&self, c: usize, zero: bool, trim: bool) -> Got {
        self.slow_paths.store(self.slow_paths.load(Relaxed).wrapping_add(1), Relaxed);
        loop {
            let sp = self.head[c].get();
            if Span::is_empty_span(sp) {
                if self.take_returned() {
                    continue;
                }
                let spare = self.spare[c].replace(ptr::null_mut());
                if spare.is_null() {
                    return Got::NeedSpan;
                }
                self.spares.sub(1);
                // SAFETY: the spare is an empty span of this heap, on no list.
                self.push_head(unsafe { &*spare });
                continue;
            }
            // SAFETY: a head other than `EMPTY` is a listed span of this heap.
            let s = unsafe { &*sp };
            // Its lists ran out: its never-used objects may be next (tail.rs).
            s.quiet.set(false);
            let got = match s.pop() {
                Some(o) => Some((o, false)),
                None => {
                    s.collect();
                    s.pop().map(|o| (o, false)).or_else(|| self.refill(s, zero)).or_else(|| self.take_fresh(s, c, zero))
                }
            };
            if let Some((o, reads_zero)) = got {
                s.skipped.set(false);
                return Got::Object(o, reads_zero);
            }
            // Full. Found full for the first time since it last gave an object, with another
            // span listed: to the tail, still listed, so that the owner's frees into it meanwhile
            // take the hot path (a parked span's first one costs an unpark) and it needs no park.
            // Found full again: park it (or, if a push came first, collect that at the next
            // turn). A span is so looked at, full, at most twice before it is parked.
            if trim {
                s.arm();
            }
            if !s.skipped.get() && !s.next.get().is_null() {
                s.skipped.set(true);
                self.unlink(s);
                self.push_tail(s);
                continue;
            }
            s.skipped.set(false);
            if s.try_park() {
                self.park(s);
            }
        }
    }

    /// A new span `s` (set up by the caller for this heap, in the page map) becomes the current
    /// span of its class.
    pub(crate) fn install(&self, s: &Span) {
        self.spans.add(1);
        self.push_head(s);
    }

    // ---- Frees (owner) ----

    /// After a local free into `s` that emptied it or found it parked: a parked span comes back
    /// to its class list (if this free cleared `PARKED`; else a push did and the span comes
    /// back through `returned`); an empty span that is not its class's current one goes to the
    /// spare slot, or is returned (`Some`: the caller gives it back to the page layer).
    #[cold]
    pub(crate) fn after_local_free<'s>(&self, s: &'s Span) -> Option<&'s Span> {
        if s.place() == FULL {
            match s.unpark() {
                TakenBack::Unparked => {}
                TakenBack::HandedBack => return None,
                // A push claimed the span after this free's store of `used` (this free's object
                // was the last one live): the span is on `returned` (the claim follows a push
                // that handed it back), where `take_returned` drops it. Nothing more here: not
                // even a trim, whose `take_listed` would drop it a second time.
                TakenBack::Claimed => return None,
            }
            self.unlink(s);
            self.push_tail(s);
        }
        if s.used() == 0 && !ptr::eq(self.head[s.class.get() as usize].get(), s) {
            return self.retire_empty(s);
        }
        None
    }

    /// An empty listed span leaves its list: into the spare slot if free (and the heap keeps
    /// fewer than `SPARES_MAX` spares), else to the caller.
    fn retire_empty<'s>(&self, s: &'s Span) -> Option<&'s Span> {
        // Every object is on the owner's lists (`used` counts other threads' frees too): a span
        // claimed by a push had none live, so this free was of an object freed before.
        if s.take() {
            let addr = s.local_free.get();
            crate::message::fatal("free", &crate::error::Error::DoubleFree { addr })
        }
        self.unlink(s);
        let c = s.class.get() as usize;
        if self.spare[c].get().is_null() && self.spares.get() < SPARES_MAX {
            s.set_place(SPARE);
            self.spare[c].set(s as *const Span as *mut Span);
            self.spares.add(1);
            return None;
        }
        self.spans.sub(1);
        self.forget_given(s);
        s.set_place(LEAVING);
        Some(s)
    }

    // ---- Collection by the lock holder (abandoned heaps) and at exit ----

    /// Collect `s` (listed) and take it off the heap if it is empty: `Some(s)` to give back.
    pub(crate) fn collect_or_drop(&self, s: &Span) -> Option<*mut Span> {
        if !self.take_listed(s) {
            return None;
        }
        s.collect();
        if s.used() > 0 {
            self.leave_listed(s);
            return None;
        }
        self.unlink(s);
        self.spans.sub(1);
        self.forget_given(s);
        s.set_place(LEAVING);
        Some(s as *const Span as *mut Span)
    }

    /// Give the heap up (its thread exits, or the lock holder collects it): parked spans the
    /// owner can take back come back, handed-back ones too; every listed span is collected, and
    /// the empty ones and the spares are pushed on `out` (linked through `next`) for the caller
    /// to give back. Spans with live objects stay. Called by the owner: the lock holder with
    /// `abandoned` set (so that a push after it collects for itself), or the bound thread.
    pub(crate) fn collect_all(&self, out: &mut *mut Span) {
        let mut give = |s: *mut Span| {
            // SAFETY: a span just taken off this heap, on no list: the caller's to give back.
            unsafe { (*s).next.set(*out) };
            *out = s;
        };
        let mut f = self.full.get();
        while !f.is_null() {
            // SAFETY: a span on this heap's full list.
            let s = unsafe { &*f };
            f = s.next.get();
            // Handed back or claimed: `take_returned` below (or, for a push that has not put it
            // on `returned` yet, that push's `collect_abandoned`).
            if s.unpark() == TakenBack::Unparked {
                self.unlink(s);
                self.push_tail(s);
            }
        }
        self.take_returned();
        for c in 0..CLASSES {
            let mut p = self.head[c].get();
            while !Span::is_empty_span(p) && !p.is_null() {
                // SAFETY: a listed span of this heap.
                let s = unsafe { &*p };
                p = s.next.get();
                if let Some(e) = self.collect_or_drop(s) {
                    give(e);
                }
                // The head gone, its next spans were made current in turn, dropping those other
                // threads claimed (`make_current`): go on from the new head.
                // SAFETY: a span of this heap (dropped ones wait on `dropped`, not recycled).
                if !p.is_null() && unsafe { (*p).place() } != LISTED {
                    p = self.head[c].get();
                }
            }
            if let Some(spare) = self.take_spare(c) {
                give(spare);
            }
        }
    }

    /// Take class `c`'s spare span off the heap (`LEAVING`, on no list), for the caller to give
    /// back: a spare is memory no other class can use.
    pub(crate) fn take_spare(&self, c: usize) -> Option<*mut Span> {
        let spare = self.spare[c].replace(ptr::null_mut());
        if spare.is_null() {
            return None;
        }
        self.spares.sub(1);
        self.spans.sub(1);
        // SAFETY: the spare, this heap's, on no list.
        let spare_span = unsafe { &*spare };
        self.forget_given(spare_span);
        spare_span.set_place(LEAVING);
        Some(spare)
    }
}
