//! Small objects (up to 64 KiB) on fallow's pages: the slab layer, above the per-thread page
//! caches (docs/design.md, "Small objects (slab layer)").
//!
//! This module owns the slab of one allocator (`Slab`): here its entry points (`malloc`, `free`,
//! `usable_size`) and slow paths, the making and giving back of spans and the statistics;
//! `threads` the heaps of threads (adopted or made, given up at thread exit and in a `fork`'s
//! child); `hot` the two hot paths (pop, the owner's free); `check` the checks of
//! `check_invariants`; `class` the size classes; `span` a span's descriptor and its free lists;
//! `thread_free` the remote-free protocol on a span's `thread_free` word; `remote` other
//! threads' frees (the push, abandoned heaps); `heap` a thread's heap and the owner's slow
//! paths; `sweep` the owner's sweep before new spans; `trim` and `tail` the give-back of live spans' free and never-used pages; `map` the side metadata (page map,
//! descriptors); `table` the thread-local table that finds a thread's heap.
//! It sits on `cache` and `heap` (its spans are page blocks taken on the locked path,
//! `cache::alloc_span_uncached`, and given back on it, `Shared::free_with_states`: never
//! through a per-thread page cache, docs/design.md "Spans and the page caches") and nothing
//! above them.
//!
//! Design, from mimalloc's free-list sharding (Leijen, Zorn, de Moura, 2019): a span is a live page
//! block of 64, 128 or 256 KiB, aligned to its size, cut into objects of one class. Each thread has a
//! heap per allocator; a span belongs to one heap. The owner pushes its frees on the span's
//! `local_free` and pops them first (the last freed first), then its `free` list (plain memory: no
//! atomic read-modify-write, no lock); another thread's free is a compare-and-swap push on the
//! span's `thread_free`, which the owner takes whole with one swap when both lists run out
//! (snmalloc's message passing in its simplest form). Finding a pointer's span reads the page map
//! (side metadata, map.rs), never a header in front of the object. Objects never handed out are not
//! on any list (`fresh` up to `end`): a span asked for with `Flags::ZERO` (a `calloc` needing a
//! span) knows they read zero, so `calloc` from them needs no memset; an object handed out before
//! is memset.
//!
//! Span states: listed (on its class list; the head is the current span), full (parked off the
//! list; the first push after parking hands it back), spare (empty, one kept per class, 4 a
//! heap at most), claimed (emptied by other threads while its owner left it untouched: its
//! pages back in the page layer, its descriptor on the owner's list until the owner next looks,
//! thread_free.rs), or back in the page layer. An empty span that is not its class's current one
//! goes to the spare slot or back to the page layer at once (at the owner's next sweep if other
//! threads emptied it), where the zeroing and reporting workers treat it as any free block.
//!
//! Thread exit: the table's destructor gives each heap up (`abandon`): under the slab lock, its
//! empty spans go back, its spans with live objects stay, and the heap waits in the slab's pool
//! for the next new thread, which adopts it whole. Frees into an abandoned heap's spans collect
//! that span under the lock (heap.rs). A thread that has no heap (setting up its table, past its
//! destructor) is served by the slab's locked heap, a heap that is always abandoned: its
//! allocations run under the lock and its frees collect as an abandoned heap's.
//!
//! Bad input: a free of a pointer inside an object (its offset not a multiple of the class
//! size), of an object never handed out (at or above `fresh`), and the immediate double free
//! (the object at the head of the list it would go on: `local_free` for the owner,
//! `thread_free` for another thread, as glibc's fastbin check), and the owner's free into a span
//! that counts no object as used, are errors found before anything changes; a pointer in no span goes to the page layer, which validates it.

pub(crate) mod class;
mod check;
mod heap;
mod hot;
pub(crate) use hot::{malloc_hot_sole, Freed};
pub(crate) use table::{slab_heap, slab_id};
pub(crate) use span::Span;
mod map;
mod remote;
mod span;
mod sweep;
mod table;
mod tail;
mod thread_free;
mod threads;
mod trim;

use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering::{Relaxed, SeqCst}};
use std::sync::Arc;

use crate::cache;
use crate::error::Error;
use crate::flags::Flags;
use crate::heap::Shared;
use crate::lock::Locked;
use crate::os;
use crate::page::GranuleStates;
use crate::stats::Stats;

use class::{aligned_class, class_of, class_size, granule_shift, object_index, span_bytes, CLASSES, MIN_ALIGN, SMALL_MAX, TABLE_MAX};
use heap::Got;
pub(crate) use heap::ThreadHeap;
use map::{Descriptors, PageMaps};
pub(crate) use map::Found;
pub use map::SpanMap;
use span::{FULL, LISTED, NO_OWNER, SPARE};
use threads::{heaps, new_heap};

pub(crate) use class::SMALL_MAX as SMALL_OBJECT_MAX;
pub(crate) use class::TABLE_MAX as SMALL_HOT_MAX;
pub(crate) use class::MIN_ALIGN as SMALL_ALIGN;
pub use class::objects_per_span;

/// The smallest object request that first asks the hot block (`malloc_slow`).
const HOT_FROM: usize = cache::hot_from(SMALL_MAX);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Bit k set for each alignment k the hot path serves: the powers of two up to `MIN_ALIGN`.
const NATURAL_ALIGNS: u32 = (1 << 1) | (1 << 2) | (1 << 4) | (1 << 8) | (1 << 16);
const _: () = assert!(MIN_ALIGN == 16);

/// What the slab lock guards: the free descriptors, the list of all heaps and the pool of
/// abandoned ones, and the abandoned heaps themselves (their owner is the lock holder).
pub(crate) struct Central {
    descriptors: Descriptors,
    /// Every heap of this slab (through `next_heap`), and the abandoned ones waiting for a
    /// thread (through `next_pooled`).
    heaps: *mut ThreadHeap,
    pool: *mut ThreadHeap,
    /// This slab's id, and the heaps it made (the low bits of the next heap's id).
    slab_id: u64,
    made: u64,
}

// SAFETY: reached only under the slab lock; the pointers are to the slab's own heaps and chunks.
unsafe impl Send for Central {}

/// What the hot paths read of a slab, fixed when it is made: copied into every `Allocator`
/// handle too, so that the hot paths read them from the handle the caller holds rather than
/// through its pointer to the slab (one load fewer on each). A `Keys` lives only in its slab
/// or in a handle that keeps the slab (it is not `Copy`): what its methods return lives as long
/// as the borrow of it.
#[derive(Clone)]
pub(crate) struct Keys {
    /// Identity for the thread-local table (never reused in a process; the high bits of its
    /// heaps' ids).
    pub(crate) id: u64,
    /// The first arena's range (installed before the slab, never replaced) and its page map
    /// (reserved with the slab, so `find` needs no test of it).
    pub(crate) first: SpanMap,
    /// Small objects on (`Config::small_objects`).
    pub(crate) on: bool,
}

/// The slab of one allocator.
pub(crate) struct Slab {
    pub(crate) shared: Arc<Shared>,
    pub(crate) keys: Keys,
    maps: PageMaps,
    central: Locked<Central>,
    /// The heap of threads that have none (always abandoned, so used under the lock).
    locked_heap: *mut ThreadHeap,
    /// Spans made and not given back, and their bytes.
    spans: AtomicU64,
    span_bytes: AtomicU64,
    /// Spans other threads claimed (every object freed by them while the owner left the span
    /// parked) and gave back.
    claims: AtomicU64,
}

// SAFETY: `locked_heap` is used only under the slab lock (it is abandoned); the rest is atomics,
// the lock, and an `Arc`.
unsafe impl Sync for Slab {}
// SAFETY: as above.
unsafe impl Send for Slab {}

impl Slab {
    pub(crate) fn new(shared: Arc<Shared>) -> Result<Slab, Error> {
        let on = shared.config.small_objects;
        let id = NEXT_ID.fetch_add(1, Relaxed);
        // Heap ids (the slab's id above `HEAP_BITS` bits) stay below 2^63, never `NO_OWNER`.
        if id >= 1 << (63 - table::HEAP_BITS) {
            return Err(Error::Os { op: "slab id", errno: libc::ENOMEM });
        }
        let mut central = Central { descriptors: Descriptors::new(), heaps: ptr::null_mut(), pool: ptr::null_mut(), slab_id: id, made: 0 };
        let v = shared.view(0);
        let maps = PageMaps::new();
        let first = SpanMap { base: v.base(), len: v.len(), map: maps.reserve(0, v.len())? };
        let locked_heap = new_heap(&mut central)?;
        // SAFETY: the heap just made, seen by no other thread yet.
        unsafe { (*locked_heap).abandoned.store(true, Relaxed) };
        Ok(Slab {
            shared,
            keys: Keys { id, first, on },
            maps,
            central: Locked::new(central),
            locked_heap,
            spans: AtomicU64::new(0),
            span_bytes: AtomicU64::new(0),
            claims: AtomicU64::new(0),
        })
    }

    // ---- Allocation ----

    /// Every request but the hot path's: aligned, flagged, a page block, or nothing to pop.
    #[inline(never)]
    pub(crate) fn malloc_slow(self: &Arc<Self>, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        if !align.is_power_of_two() {
            return Err(Error::BadAlignment { align, max: self.shared.max_block() });
        }
        let plain = flags.0 & !Flags::ZERO.0 == 0 && size <= SMALL_MAX;
        // A medium request the page block this thread freed last may hold (`cache/hot.rs`): a
        // loop of sizes on both sides of `SMALL_MAX` then reuses that one block, as it does
        // above it, instead of a span's object and a page block in turn.
        if plain && size >= HOT_FROM && align <= MIN_ALIGN {
            if let Some(p) = cache::alloc_from_hot(&self.shared, size, flags) {
                return Ok(p);
            }
        }
        // SAFETY: `class_of` only for `size <= SMALL_MAX` (`plain`).
        let c = if !plain { None } else if align <= MIN_ALIGN { Some(unsafe { class_of(size) }) } else { aligned_class(size, align) };
        let Some(c) = c else {
            // Not a small object: a page block (`POPULATE` and `LOCK` are page-block requests).
            return cache::alloc_pages(&self.shared, size.max(1), align.max(MIN_ALIGN), flags);
        };
        let zero = flags.contains(Flags::ZERO);
        let h = table::current(self);
        let (o, reads_zero) = if h.is_null() { self.alloc_locked(c, zero)? } else { self.alloc_owned(h, c, zero)? };
        if zero && !reads_zero {
            // SAFETY: `o` is an object of `class_size(c)` bytes just handed out to this caller.
            unsafe { ptr::write_bytes(o as *mut u8, 0, class_size(c)) };
        }
        // SAFETY: an object address is never 0.
        Ok(unsafe { NonNull::new_unchecked(o as *mut u8) })
    }

    /// The owner's slow path: its heap, with a new span when none has room.
    fn alloc_owned(&self, h: *mut ThreadHeap, c: usize, zero: bool) -> Result<(usize, bool), Error> {
        // SAFETY: `h` is this thread's own heap (`table::current`), live as long as the slab.
        let h = unsafe { &*h };
        loop {
            match h.alloc(c, zero, self.trims()) {
                Got::Object(o, z) => return Ok((o, z)),
                // No list or lock is held here: the page layer may call `malloc` (a cache's
                // first use), which may come back to this heap; the loop looks again after.
                Got::NeedSpan if h.sweep_due() => self.sweep(h),
                Got::NeedSpan => {
                    let s = self.new_span(c, zero, h)?;
                    h.install(s);
                    self.count_span(s, true);
                }
            }
        }
    }

    /// A thread without a heap: the locked heap, under the slab lock (the pages of a new span
    /// are taken with the lock released).
    #[cold]
    fn alloc_locked(&self, c: usize, zero: bool) -> Result<(usize, bool), Error> {
        loop {
            {
                let mut g = self.central.lock();
                // SAFETY: the locked heap, always abandoned: the lock holder is its owner.
                let h = unsafe { &*self.locked_heap };
                let got = h.alloc(c, zero, false);
                Self::release_dropped_locked(&mut g, h);
                if let Got::Object(o, z) = got {
                    return Ok((o, z));
                }
            }
            let s = self.new_span(c, zero, self.locked_heap)?;
            let _g = self.central.lock();
            // SAFETY: as above.
            unsafe { &*self.locked_heap }.install(s);
            self.count_span(s, true);
        }
    }

    /// A new span of class `c` for heap `h`, in the page map: its pages from the page layer's
    /// locked path (`Flags::ZERO` for a request that wants zeros), a descriptor under the lock.
    fn new_span(&self, c_class: usize, zero: bool, h: *const ThreadHeap) -> Result<&Span, Error> {
        let bytes = span_bytes(c_class);
        let flags = if zero { Flags::ZERO } else { Flags::NONE };
        let shift = granule_shift(bytes);
        let (start, taken) = cache::alloc_span_uncached(&self.shared, bytes, shift, flags)?;
        let start = start.as_ptr() as usize;
        // Taken with `ZERO`, or every page read zero anyway: never-used objects need no memset.
        let zero = zero || taken.reported | taken.zeroed == GranuleStates::all((bytes >> os::PAGE_SHIFT) as u32, shift);
        let entries = match self.map_entries(start, bytes) {
            Ok(e) => e,
            Err(e) => {
                self.free_untouched(start, taken);
                return Err(e);
            }
        };
        // The descriptor is set up and published under the lock that takes it: a thread that
        // pushed into its previous span and is late to `collect_abandoned` (which reads its
        // `Cell`s under the lock) sees it either free or set up, and not on a list (`LEAVING`
        // until `install` lists it), so it never unlinks a span no list holds yet.
        let mut c = self.central.lock();
        // SAFETY: `h` is a heap of this slab (the caller's, or the locked heap under the lock).
        Self::release_dropped_locked(&mut c, unsafe { &*h });
        let s = match c.descriptors.take() {
            Ok(s) => s,
            Err(e) => {
                drop(c);
                self.free_untouched(start, taken);
                return Err(e);
            }
        };
        // SAFETY: a free descriptor just taken under the lock: this thread's alone until it is
        // published in the map below; descriptors live as long as the slab.
        let s = unsafe { &*s };
        // SAFETY: `h` is a heap of this slab (the caller's), live as long as the slab.
        s.init(c_class, start, zero, taken, h as *mut ThreadHeap, unsafe { (*h).id.get() });
        for e in entries {
            span::publish(e, s);
        }
        drop(c);
        Ok(s)
    }

    /// A span's pages taken and not used (a failure after the take): back in the states they
    /// were taken in.
    fn free_untouched(&self, start: usize, taken: GranuleStates) {
        // SAFETY: the block just taken at `start`, never written: its pages are as `taken`
        // found them (`Shared::alloc_span_locked`).
        let _ = unsafe { self.shared.free_with_states(start, taken) };
    }

    /// Count a span in (`true`: installed in a heap) or out (taken off its heap) of the slab's
    /// totals, at the same step as the heap's own count (under the lock for an abandoned heap),
    /// so that `check` sees the two agree.
    fn count_span(&self, s: &Span, add: bool) {
        let bytes = span_bytes(s.class.get() as usize) as u64;
        if add {
            self.spans.fetch_add(1, Relaxed);
            self.span_bytes.fetch_add(bytes, Relaxed);
        } else {
            self.uncount_bytes(bytes);
        }
    }

    /// A span of `bytes` out of the slab's totals.
    fn uncount_bytes(&self, bytes: u64) {
        self.spans.fetch_sub(1, Relaxed);
        self.span_bytes.fetch_sub(bytes, Relaxed);
    }

    /// Give the descriptors heap `h` dropped (spans other threads claimed, `ThreadHeap::dropped`)
    /// back to the pool. The caller holds the slab lock and owns `h` (its bound thread, or the
    /// lock holder for an abandoned heap).
    fn release_dropped_locked(c: &mut Central, h: &ThreadHeap) {
        let mut p = h.dropped.replace(ptr::null_mut());
        while !p.is_null() {
            // SAFETY: a descriptor the owner dropped: on no list, its span's pages the page
            // layer's, touched by no other thread since the claiming push.
            let s = unsafe { &*p };
            p = s.next.get();
            s.owner.store(NO_OWNER, Relaxed);
            s.heap.store(ptr::null_mut(), Relaxed);
            c.descriptors.give(s);
        }
    }

    /// `count_span(.., false)` for every span of a list taken off a heap (linked by `next`).
    fn uncount(&self, mut list: *mut Span) {
        while !list.is_null() {
            // SAFETY: a span of the caller's list, on its way back.
            let s = unsafe { &*list };
            self.count_span(s, false);
            list = s.next.get();
        }
    }

    /// Give back spans taken off their heaps (linked through `next`, already uncounted): out
    /// of the page map, their pages to the page layer (with no lock held), their descriptors to
    /// the pool.
    fn give_back(&self, mut list: *mut Span) {
        while !list.is_null() {
            // SAFETY: a span on no list and in no heap any more, the caller's.
            let s = unsafe { &*list };
            list = s.next.get();
            let start = s.start.load(Relaxed);
            let bytes = span_bytes(s.class.get() as usize);
            if let Ok(entries) = self.map_entries(start, bytes) {
                for e in entries {
                    e.store(0, Relaxed);
                }
            }
            s.owner.store(NO_OWNER, Relaxed);
            s.heap.store(ptr::null_mut(), Relaxed);
            let states = s.free_states();
            s.given.store(0, Relaxed);
            // SAFETY: `free_states`: the pages it says `Reported` are the span's, given back
            // by a trim with `MADV_DONTNEED` (private anonymous memory, where it zeroes:
            // `Slab::trims`) and not written since (no object on them was handed out:
            // trim.rs, "Rules"), or never written since the page layer handed them out
            // `Reported`; those it says `Zeroed` were never written since it handed them
            // out reading zero.
            let r = unsafe { self.shared.free_with_states(start, states) };
            debug_assert!(r.is_ok(), "a span's pages are a live page block: {r:?}");
            self.central.lock().descriptors.give(s);
        }
    }

    // ---- Free ----

    /// Free the object at `addr` in span `s` (found by `find`): every case, the checks first.
    #[inline(never)]
    pub(crate) fn free_in(&self, s: &Span, addr: usize) -> Result<(), Error> {
        let off = s.offset(addr);
        // At an object's start, below `fresh` (handed out at some time): `object_index`.
        if object_index(off, s.inv.load(Relaxed), s.shift.load(Relaxed) as u32) >= s.fresh.load(Relaxed) as u64 {
            return Err(self.bad_free(s, addr));
        }
        // `NO_HEAP` (no heap of this slab used last) owns no span.
        let h = table::last(&self.keys);
        // SAFETY: `last` gives a heap of this slab or `NO_HEAP`, both live as long as the slab.
        if s.owner.load(Relaxed) != unsafe { (*h).id.get() } {
            return self.free_remote(s, addr);
        }
        // The owner: push on `local_free`; the object at its head is one this thread freed
        // last into the span (glibc's immediate double free, as its fastbins check it). A span
        // that counts no object as used has every object on `free` or `local_free` (other
        // threads' frees count until collected): any free into it is a double free.
        let used = s.used();
        if addr == s.local_free.get() || used == 0 {
            return Err(Error::DoubleFree { addr });
        }
        // SAFETY: `addr` is an object of `s`, a live span of this thread's heap, handed out and
        // now freed: its first word becomes the link of `local_free`.
        unsafe { *(addr as *mut usize) = s.local_free.get() };
        s.local_free.set(addr);
        // Not 0 (tested above): no wrap.
        let used = used - 1;
        s.set_used(used);
        // SAFETY: this thread's own heap (`last`), live as long as the slab.
        let heap = unsafe { &*h };
        // Nothing more for a listed span that still has live objects or is its class's current
        // one (an empty current span stays: the next request of its class pops from it).
        if s.place() != LISTED
            // SAFETY: a span's class is below `CLASSES`.
            || (used == 0 && !ptr::eq(unsafe { heap.head.get_unchecked(s.class.get() as usize) }.get(), s))
            || s.trim_due()
        {
            self.after_local_free(heap, s);
        }
        Ok(())
    }

    /// `after_local_free` from the hot path, which has the slab's handle (`free_local`).
    #[cold]
    #[inline(never)]
    pub(crate) fn after_local_free_arc(slab: &Arc<Slab>, h: &ThreadHeap, s: &Span) {
        slab.after_local_free(h, s)
    }

    /// A local free that emptied a span other than its class's current one, freed into a
    /// parked span or brought an armed span to its low mark: the heap moves it
    /// (`ThreadHeap::after_local_free`), an empty span it lets go goes back to the page layer,
    /// a span at its mark is trimmed (trim.rs).
    #[cold]
    #[inline(never)]
    pub(crate) fn after_local_free(&self, h: &ThreadHeap, s: &Span) {
        if let Some(e) = h.after_local_free(s) {
            e.next.set(ptr::null_mut());
            self.count_span(e, false);
            self.give_back(e as *const Span as *mut Span);
        } else if !s.is_claimed() && s.trim_due() && self.trim_waited(s) {
            // (A span claimed after this free waits on `returned` for `take_returned`.)
            self.trim(h, s);
        }
    }

    /// Another thread's free (or the free of a thread without a heap, or into an abandoned
    /// What is wrong with freeing `addr` in `s` (it failed the checks of `free_in`).
    #[cold]
    fn bad_free(&self, s: &Span, addr: usize) -> Error {
        let size = s.size.load(Relaxed) as usize;
        let off = s.offset(addr);
        if size == 0 || off >= s.offset(s.fresh_at()) {
            return Error::InvalidPointer { addr };
        }
        Error::InteriorPointer { addr, block: s.first() + off / size * size }
    }

    /// Bytes usable in the object at `addr`: `Some` for an object of a span (its class size,
    /// or `None` if `addr` is not at an object's start), `None` for any other address.
    pub(crate) fn usable_size_in(&self, s: &Span, addr: usize) -> Option<usize> {
        let size = s.size.load(Relaxed) as usize;
        let off = s.offset(addr);
        (size != 0 && off < s.offset(s.fresh_at()) && off.is_multiple_of(size)).then_some(size)
    }

    // ---- Statistics ----

    /// Add the small-object figures to `s`.
    /// Takes the slab lock: never call it holding the allocator's (`before_fork` takes the two
    /// in the other order).
    pub(crate) fn add_to_stats(&self, s: &mut Stats) {
        self.add_to_stats_locked(&self.central.lock(), s);
    }

    /// `add_to_stats` if the slab lock is free within about 50 ms (`Allocator::try_stats`).
    pub(crate) fn try_add_to_stats(&self, s: &mut Stats) -> bool {
        for _ in 0..50 {
            if let Some(c) = self.central.try_lock() {
                self.add_to_stats_locked(&c, s);
                return true;
            }
            os::sleep_ns(1_000_000);
        }
        false
    }

    fn add_to_stats_locked(&self, c: &Central, s: &mut Stats) {
        let mut spares = 0u64;
        for h in heaps(c) {
            spares = spares.wrapping_add(h.spares.get());
        }
        // The spans' own counts (no counter on the hot paths): every descriptor in use.
        let (objects, bytes) = c.descriptors.used_objects();
        let spans = self.spans.load(Relaxed);
        let span_bytes = self.span_bytes.load(Relaxed);
        s.small_live_objects = objects;
        s.small_live_bytes = bytes;
        s.small_spans = spans;
        s.small_spare_spans = spares;
        s.small_span_bytes = span_bytes;
        s.small_free_bytes = span_bytes.saturating_sub(bytes);
        s.small_claimed_spans = self.claims.load(Relaxed);
        trim::add_to_stats(c, s);
    }
}

impl Keys {
    /// An object of `size` bytes (at most `SMALL_MAX`) aligned to `align` from `slab`, whose
    /// keys these are. The hot path: a plain request of the natural alignment, the current span
    /// of its class in the heap this thread used last has a free object: pop it.
    #[inline(always)]
    pub(crate) fn malloc(&self, slab: &Arc<Slab>, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        // The natural alignments (1, 2, 4, 8, 16: bits of `NATURAL_ALIGNS`) only: any other
        // (0, not a power of two) goes to the slow path, which refuses it.
        if flags.0 & !Flags::ZERO.0 == 0 && align <= MIN_ALIGN && (NATURAL_ALIGNS >> align) & 1 != 0 && size <= TABLE_MAX {
            if let Some(p) = self.malloc_hot(size, flags.0 != 0) {
                return Ok(p);
            }
        }
        slab.malloc_slow(size, align, flags)
    }
}
