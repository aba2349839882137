//! Per-thread page caches (seed 002, Linux's per-CPU page lists): the fast path of `alloc` and
//! `free` for blocks of small orders, which takes no lock and does no atomic read-modify-write.
//!
//! This file owns the caches, the thread-local table that finds a thread's cache of an allocator,
//! the batched refill and drain under the allocator lock, the per-thread counters and their folding
//! into the allocator's, and the part of `check_invariants` / `stats` / `free_runs` that concerns
//! cached blocks.
//!
//! Design
//! ------
//! A cache belongs to one (thread, allocator) pair and holds at most `cache_high_pages` pages
//! (its high mark) over all orders. It serves the orders `k <= cache_max_order` whose blocks fit
//! in half the high mark (`2^k <= cache_high_pages / 2`). For each order it keeps, in one array
//! of `cap(k) = min(cache_high_pages >> k, 256)` entries, two stacks: blocks that need no
//! zeroing (every page `Zeroed` or `Reported`) grow down from the top, the others ("dirty") grow
//! up from the bottom. An entry is one word, the block's address with its arena and a `MIXED` bit
//! in the low bits; a mixed entry (some page not `Dirty`) has its per-state page counts in a side
//! array at the same index. A block's pages keep their free states while it is cached, so a
//! `ZERO` request served from the cache memsets exactly the pages whose byte says `Dirty` or
//! `LazyFree`, as the locked path does.
//!
//! States of a block with respect to the caches (`Tag` on its first page):
//!
//! ```text
//!   Free (listed) --refill, under lock--> Cached --hit alloc, owner, no lock--> Alloc (live)
//!   Alloc --hit free, freeing thread, no lock--> Cached (pages Dirty, FREED_START set)
//!   Cached --drain (over the high mark: down to half; thread exit, drain request: all),
//!          under lock--> Free (merged)
//! ```
//!
//! Invariants (checked by `check`, called from `Allocator::check_invariants`):
//! 1. A cached block of order k is aligned to 2^k pages, has `Tag::Cached` on its first page, is
//!    on no free list and sits in exactly one cache entry; its pages are in free states and the
//!    entry's counts (zero for an entry without `MIXED`) equal what their state bytes say;
//!    zero-stack entries need no zeroing.
//! 2. A cache's `pages` is the pages in its entries, and is at most its high mark.
//!    `Counters::cached_pages` (folded) plus each registered cache's unfolded net hits
//!    (`pages - accounted`) equals the pages in all entries; listed + in use + cached + isolated
//!    pages = reserved pages (modulo 2^64).
//! 3. A cache holds at most `cap(k)` blocks of order k.
//!
//! Threads and locks. Only the owning thread reads or writes a cache's entries and stack sizes,
//! and only it changes the tags and page states of the blocks in them. Refill and drain move a
//! batch of blocks under ONE hold of the allocator lock, and fold the thread's counters into the
//! allocator's at the same time. Per-thread counters are atomics written by their one owner with a
//! plain load and store (no `lock` prefix); `stats` reads them under the allocator lock, and the
//! owner changes `accounted` and resets the event counters only under that lock, so a fold is
//! never counted twice nor missed.
//!
//! The hit path. An allocation hit pops an entry, checks and rewrites the block record's `HitWord`
//! (one 8-byte load and store: tag, flags, page count), writes the pages' state bytes (one store
//! for up to 8 pages) and bumps two owner-only counters. A free hit finds the arena by a range
//! check, loads the `HitWord`, and does the same in reverse. Nothing is read that another thread
//! writes often: the arena views and the `HitPath` fields of `Shared` sit on cache lines of their
//! own, written only when an arena is installed or a drain is requested.
//!
//! Validation. A hit `free` first checks, with one atomic load of the block's `HitWord`, that the
//! address is the first page of a live block of a cached order that is not `mlock`ed and that the
//! size matches; anything else goes to the locked, validating path, which reports a block tagged
//! `Cached` with `FREED_START` as a double free. A double free that races with the first free on
//! another thread may escape detection (as with glibc's tcache); refill, hit and drain re-check
//! the tag and drop an entry whose block is no longer `Cached`, so such a race never puts a block
//! on the lists twice.
//!
//! Lifetime. Each thread has a small table of `(allocator id, cache)` slots in a `thread_local!`
//! with a destructor; ids are never reused, so a stale slot is never matched. A cache holds a
//! `Weak` reference to its allocator: at thread exit (or when its slot is reused) the cache
//! upgrades it, and if the allocator is still alive drains everything back under its lock,
//! folds its counters and unlinks itself from the allocator's registry; if the allocator is
//! gone, the entries are simply forgotten (their memory went with the arenas). The registry is an
//! intrusive list walked only under the allocator lock, and an allocator's drop never walks it.
//!
//! Slack. A request of a cached order that is not a power of two of pages (65..127 pages of
//! order 7) takes a whole cached block on the out-of-line path: its record gets `META_SLACK`, the
//! order and the request's page count; the pages past it keep their free states (neither listed
//! nor cached, and nobody touches them) until the block is freed. Freed into a cache, the block
//! comes back whole, its live pages `Dirty`, its slack as it was (a mixed entry if any slack page
//! is not dirty: half records may then be stale, so `give_back` lists mixed entries by runs).
//! The locked path gives the slack back by runs (`Arena::drop_slack`). Slack pages are counted in
//! `slack_pages`, not in the bytes in use (docs/design.md, "Slack").
//!
//! Re-entrancy (the preload library). The cache and its table are allocated from the Rust global
//! allocator at a thread's first use, with the allocator lock NOT held. A re-entrant call (the
//! global allocator being fallow itself) finds the thread's state `BUSY` and takes the locked path.
//! After the table's destructor has run, every call takes the locked path.

use core::cell::Cell;
use core::num::NonZeroUsize;
use core::ptr;
use core::sync::atomic::{compiler_fence, AtomicU32, AtomicU64, AtomicU8, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use crate::buddy::preference;
use crate::buddy::Taken;
use crate::config::Config;
use crate::flags::Flags;
use crate::heap::{ArenaView, CacheList, Heap, Placed, Shared, MAX_ARENAS};
use crate::os::PAGE_SHIFT;
use crate::page::{BlockMeta, Class, HitWord, PageState, StateCounts, Tag, CLASSES, META_FREED_START, META_SLACK};
use crate::stats::Stats;

pub(crate) use crate::config::CACHE_ORDER_LIMIT;
const MAX_ORDERS: usize = CACHE_ORDER_LIMIT as usize + 1;
/// Most blocks of one order a cache holds (the stack capacity of the small orders).
const STACK_MAX: u32 = 256;
/// Refills of orders below this take whole aligned groups of `2^GROUP_ORDER` pages (one line of
/// state bytes) when they can.
const GROUP_ORDER: u8 = 6;
/// Allocators one thread keeps caches for at once; a further one takes the slot used longest ago.
const SLOTS: usize = 8;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn new_allocator_id() -> u64 {
    NEXT_ID.fetch_add(1, Relaxed)
}

/// How many orders (`0..n`) the caches of an allocator with `cfg` serve: up to `cache_max_order`
/// (and `max_order`), and only orders whose block fits in half the high mark, so that a cache
/// drained down to half its high mark always has room for the block being freed.
pub(crate) fn orders_served(cfg: &Config) -> u32 {
    if !cfg.cache || cfg.cache_high_pages < 2 {
        return 0;
    }
    let fit = (cfg.cache_high_pages / 2).ilog2() as u8;
    cfg.cache_max_order.min(cfg.max_order).min(fit) as u32 + 1
}

/// A counter with a single writer, the owning thread: a plain load and store, no `lock` prefix.
#[derive(Default)]
struct Owned(AtomicU64);

impl Owned {
    #[inline(always)]
    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    #[inline(always)]
    fn set(&self, v: u64) {
        self.0.store(v, Relaxed)
    }
    #[inline(always)]
    fn add(&self, v: u64) {
        self.set(self.get().wrapping_add(v))
    }
    #[inline(always)]
    fn sub(&self, v: u64) {
        self.set(self.get().wrapping_sub(v))
    }
}

/// One cached block in one word: its page-aligned address, its arena in bits 6..=11, and `MIXED`
/// in bit 0 when its counts (some page not `Dirty`) are in the side array.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Entry(NonZeroUsize);

const MIXED: usize = 1;
/// The arena index sits in bits 6..=11, so that masking the entry gives its byte offset in the
/// table of (64-byte) arena views, with no shift.
const ARENA_SHIFT: u32 = 6;
const _: () = assert!(MAX_ARENAS << ARENA_SHIFT <= 1 << PAGE_SHIFT && MIXED < 1 << ARENA_SHIFT);
const _: () = assert!(core::mem::size_of::<ArenaView>() == 1 << ARENA_SHIFT);

impl Entry {
    #[inline(always)]
    fn new(addr: usize, arena: usize, mixed: bool) -> Entry {
        // SAFETY: `addr` is the page-aligned address of a block inside a mapped arena, never 0 (the
        // placeholder entries of `ThreadCache::new` use `1 << PAGE_SHIFT`), so the word is non-zero.
        Entry(unsafe { NonZeroUsize::new_unchecked(addr | arena << ARENA_SHIFT | mixed as usize) })
    }
    #[inline(always)]
    fn addr(self) -> usize {
        self.0.get() & !((1 << PAGE_SHIFT) - 1)
    }
    #[inline(always)]
    fn arena(self) -> usize {
        (self.0.get() >> ARENA_SHIFT) & (MAX_ARENAS - 1)
    }
    #[inline(always)]
    fn mixed(self) -> bool {
        self.0.get() & MIXED != 0
    }
}

/// Page counts of a mixed entry (its block has at most 512 pages).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Mixed {
    zeroed: u16,
    reported: u16,
    lazy: u16,
}

impl Mixed {
    fn of(c: StateCounts) -> Mixed {
        Mixed { zeroed: c.zeroed as u16, reported: c.reported as u16, lazy: c.lazy as u16 }
    }
    #[inline(always)]
    fn counts(self) -> StateCounts {
        StateCounts { zeroed: self.zeroed as u32, reported: self.reported as u32, lazy: self.lazy as u32 }
    }
}

/// The two stacks of one order, on a cache line of their own (a hit touches one order's).
#[repr(align(64))]
struct Stack {
    /// The entry at `base` (the hit paths index the dirty stack from it).
    first: *mut Entry,
    /// First index in the entry arrays, and capacity in blocks.
    base: u32,
    cap: u32,
    /// Dirty stack size (grows up from `base`), zero stack size (grows down from
    /// `base + cap - 1`).
    ndirty: Owned,
    nzero: Owned,
    /// `cap - nzero`: the dirty stack is full when its size reaches it (one compare on the free
    /// hit path). Set with `nzero`, by `set_nzero`.
    dirty_max: Owned,
    /// What an allocation hit puts in bytes 8..16 of the record of a block of this order (its
    /// page count and `Tag::Alloc`, `HitWord::handed_out`), and its page count.
    alloc_bits: u64,
    npages: u64,
}

impl Default for Stack {
    fn default() -> Stack {
        Stack {
            first: ptr::null_mut(),
            base: 0,
            cap: 0,
            ndirty: Owned::default(),
            nzero: Owned::default(),
            dirty_max: Owned::default(),
            alloc_bits: 0,
            npages: 0,
        }
    }
}

impl Stack {
    #[inline(always)]
    fn len(&self) -> u32 {
        (self.ndirty.get() + self.nzero.get()) as u32
    }

    #[inline(always)]
    fn set_nzero(&self, nz: u32) {
        self.nzero.set(nz as u64);
        self.dirty_max.set((self.cap - nz) as u64);
    }
}

/// Events of the rarer paths (mixed blocks, `ZERO` requests) since the last fold.
#[derive(Default)]
struct Events {
    zero_skipped_bytes: Owned,
    zeroed_on_alloc_bytes: Owned,
    reused_reported_bytes: Owned,
}

/// Aligned to a cache line: what the hit path writes shares no line with another thread's data.
#[repr(C, align(64))]
pub(crate) struct ThreadCache {
    // What every hit touches, first (one cache line; then the order's `Stack`, a line of its own).
    entries: *mut Entry,
    /// The owner is using the cache without the lock (see "Draining an idle thread's cache").
    busy: AtomicU32,
    /// The reporting worker is about to drain this cache, or is draining it: the owner keeps out.
    frozen: AtomicU32,
    /// Pages in the entries, and the high mark.
    pages: Owned,
    high: u64,
    /// Hits since the last fold.
    alloc_hits: Owned,
    free_hits: Owned,
    /// The drain generation this cache last obeyed (the owner's, or the worker's while frozen).
    seen_generation: Owned,
    /// Pages of the largest cached block (`1 << (orders - 1)`).
    max_pages: u32,
    mixed: *mut Mixed,
    orders: usize,
    stacks: [Stack; MAX_ORDERS],
    // Rarely touched.
    /// `pages` as of the last fold, refill or drain (changed under the lock only).
    accounted: Owned,
    /// Blocks per refill, per order.
    batch: [u32; MAX_ORDERS],
    /// Gauges of what the cache holds beyond "all pages dirty" (the common case, a block freed
    /// into the cache, touches none of them): pages zeroed, reported and lazily freed, and blocks
    /// of class `Zeroed` and `Reported` per order. Dirty pages and dirty-class blocks are derived.
    extra_pages: [Owned; 3],
    class_blocks: [[Owned; MAX_ORDERS]; 2],
    events: Events,
    /// Slack pages handed out with blocks (less those taken back) since the last fold.
    slack: Owned,
    owner: Weak<Shared>,
    id: u64,
    // The registry's links, read and written under the allocator lock only.
    next: Cell<*mut ThreadCache>,
    prev: Cell<*mut ThreadCache>,
}

const _: () = assert!(core::mem::offset_of!(ThreadCache, max_pages) < 64);

/// The allocator's list of its threads' caches (`Heap::caches`; intrusive: registering allocates
/// nothing). The heap keeps its head as an untyped pointer (it sits below this layer); every
/// node is a `ThreadCache`, and only the functions here touch it. Its links (`prev`, `next`) are
/// `Cell`s of the caches, changed only under the allocator lock.
impl CacheList {
    fn first(&self) -> *mut ThreadCache {
        self.head.cast()
    }

    fn push(&mut self, c: *mut ThreadCache) {
        // SAFETY: `c` is a live cache this thread just allocated, and `head`, if not null, a
        // registered cache, live until it is unlinked; `&mut self` means the allocator lock is held.
        unsafe {
            (*c).prev.set(ptr::null_mut());
            (*c).next.set(self.first());
            if !self.head.is_null() {
                (*self.first()).prev.set(c);
            }
        }
        self.head = c.cast();
    }

    fn unlink(&mut self, c: *mut ThreadCache) {
        // SAFETY: `c` and its neighbours are registered caches, live until they are unlinked (a cache is
        // unlinked before it is freed, `retire`); `&mut self` means the allocator lock is held.
        unsafe {
            let (p, n) = ((*c).prev.get(), (*c).next.get());
            if p.is_null() {
                self.head = n.cast();
            } else {
                (*p).next.set(n);
            }
            if !n.is_null() {
                (*n).prev.set(p);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &ThreadCache> {
        let mut p = self.first();
        core::iter::from_fn(move || {
            if p.is_null() {
                return None;
            }
            // SAFETY: every cache on the list is live (unlinked under the lock before it is freed), and
            // `&self` is borrowed from the locked `Heap`, so none is unlinked while iterating.
            let c = unsafe { &*p };
            p = c.next.get();
            Some(c)
        })
    }
}

impl ThreadCache {
    fn new(a: &Arc<Shared>) -> ThreadCache {
        let cfg = &a.config;
        let orders = a.hit.cache_orders as usize;
        let mut stacks: [Stack; MAX_ORDERS] = Default::default();
        let mut batch = [0u32; MAX_ORDERS];
        let mut total = 0u32;
        for o in 0..orders {
            let cap = (cfg.cache_high_pages >> o).min(STACK_MAX);
            stacks[o].base = total;
            stacks[o].cap = cap;
            stacks[o].set_nzero(0);
            stacks[o].alloc_bits = HitWord::alloc_bits(1 << o);
            stacks[o].npages = 1 << o;
            batch[o] = (cfg.cache_batch_pages >> o).clamp(1, cap);
            total += cap;
        }
        let entries = Box::into_raw(vec![Entry::new(1 << PAGE_SHIFT, 0, false); total as usize].into_boxed_slice());
        for s in &mut stacks[..orders] {
            // SAFETY: `base < total`, the length of the array.
            s.first = unsafe { (entries as *mut Entry).add(s.base as usize) };
        }
        let mixed = Box::into_raw(vec![Mixed::default(); total as usize].into_boxed_slice());
        ThreadCache {
            entries: entries as *mut Entry,
            mixed: mixed as *mut Mixed,
            pages: Owned::default(),
            high: cfg.cache_high_pages as u64,
            alloc_hits: Owned::default(),
            free_hits: Owned::default(),
            busy: AtomicU32::new(0),
            frozen: AtomicU32::new(0),
            seen_generation: Owned(AtomicU64::new(a.hit.drain_generation.load(Relaxed))),
            orders,
            max_pages: 1 << (orders - 1),
            stacks,
            accounted: Owned::default(),
            batch,
            extra_pages: Default::default(),
            class_blocks: Default::default(),
            events: Events::default(),
            slack: Owned::default(),
            owner: Arc::downgrade(a),
            id: a.hit.cache_id,
            next: Cell::new(ptr::null_mut()),
            prev: Cell::new(ptr::null_mut()),
        }
    }

    /// The owner starts using the cache without the lock: `false` if the reporting worker has
    /// frozen it (then the owner takes the locked path). The light side of an asymmetric fence:
    /// a compiler fence here, `membarrier` on the worker's side (see the top).
    #[inline(always)]
    pub(crate) fn enter(&self) -> bool {
        self.busy.store(1, Relaxed);
        compiler_fence(Ordering::SeqCst);
        if self.frozen.load(Ordering::Acquire) != 0 {
            self.busy.store(0, Ordering::Release);
            return false;
        }
        true
    }

    /// Run `f` on the cache between `enter` and `leave`; `None` if it is frozen.
    #[inline(always)]
    pub(crate) fn inside<R>(&self, f: impl FnOnce(&Self) -> R) -> Option<R> {
        if !self.enter() {
            return None;
        }
        let r = f(self);
        self.leave();
        Some(r)
    }

    /// The owner is done with the cache (every write of its call is ordered before).
    #[inline(always)]
    pub(crate) fn leave(&self) {
        compiler_fence(Ordering::SeqCst);
        self.busy.store(0, Ordering::Release);
    }

    /// Entries in the arrays: the end of the last order's stack.
    fn nentries(&self) -> usize {
        let s = &self.stacks[self.orders - 1];
        (s.base + s.cap) as usize
    }

    #[inline(always)]
    fn entry(&self, i: u32) -> *mut Entry {
        debug_assert!((i as usize) < self.nentries());
        // SAFETY: `i < nentries()` (callers index inside one stack's `base..base + cap`), the length
        // of the `entries` allocation made in `new`.
        unsafe { self.entries.add(i as usize) }
    }

    #[inline(always)]
    fn mixed_at(&self, i: u32) -> *mut Mixed {
        debug_assert!((i as usize) < self.nentries());
        // SAFETY: as in `entry`: `mixed` has the same `nentries()` length as `entries`.
        unsafe { self.mixed.add(i as usize) }
    }

    /// The entry at index `i`, with its counts.
    #[inline(always)]
    fn read(&self, i: u32) -> (Entry, Mixed) {
        // SAFETY: `entry(i)` is in bounds; the read is a plain one, by the owner, or by another thread
        // while the owner is kept out: a drain under the lock after the `membarrier` handshake
        // ("Draining an idle thread's cache"), or `check` / `free_runs` through a `FrozenHeap`.
        let e = unsafe { *self.entry(i) };
        // SAFETY: as the read of the entry just above.
        let m = if e.mixed() { unsafe { *self.mixed_at(i) } } else { Mixed::default() };
        (e, m)
    }

    #[inline(always)]
    fn write(&self, i: u32, e: Entry, m: Mixed) {
        // SAFETY: `i` is in bounds (see `entry`); only the owner writes entries, between `enter` and
        // `leave`, or under the lock while the owner is kept out (frozen, `busy` 0 after `membarrier`).
        unsafe { *self.entry(i) = e };
        if e.mixed() {
            // SAFETY: as the entry's store above.
            unsafe { *self.mixed_at(i) = m };
        }
    }

    #[inline(never)]
    fn gauge_mixed(&self, m: Mixed, order: usize, sign: bool) {
        let apply = |g: &Owned, v: u64| if sign { g.add(v) } else { g.sub(v) };
        match m.counts().class(1 << order) {
            Class::Dirty => {}
            Class::Zeroed => apply(&self.class_blocks[0][order], 1),
            Class::Reported => apply(&self.class_blocks[1][order], 1),
        }
        for (g, v) in self.extra_pages.iter().zip([m.zeroed, m.reported, m.lazy]) {
            apply(g, v as u64);
        }
    }

    /// Blocks by class and order, and pages by state (dirty, zeroed, reported, lazy).
    #[allow(clippy::needless_range_loop)]
    fn gauges(&self) -> ([[u64; MAX_ORDERS]; CLASSES], [u64; 4]) {
        let mut blocks = [[0u64; MAX_ORDERS]; CLASSES];
        for o in 0..self.orders {
            let n = self.stacks[o].len() as u64;
            let (z, r) = (self.class_blocks[0][o].get(), self.class_blocks[1][o].get());
            blocks[Class::Zeroed as usize][o] = z;
            blocks[Class::Reported as usize][o] = r;
            // Saturating: `stats` on one thread may read another's gauges mid-update.
            blocks[Class::Dirty as usize][o] = n.saturating_sub(z.wrapping_add(r));
        }
        let x = [self.extra_pages[0].get(), self.extra_pages[1].get(), self.extra_pages[2].get()];
        let total = self.pages.get();
        (blocks, [total.saturating_sub(x[0].wrapping_add(x[1]).wrapping_add(x[2])), x[0], x[1], x[2]])
    }

    /// Push any block (refill), with the per-state counts of its pages.
    fn push(&self, o: usize, addr: usize, arena: usize, counts: StateCounts) {
        let (e, m) = (Entry::new(addr, arena, counts != StateCounts::default()), Mixed::of(counts));
        let s = &self.stacks[o];
        let (nd, nz) = (s.ndirty.get() as u32, s.nzero.get() as u32);
        debug_assert!(nd + nz < s.cap);
        if e.mixed() && m.counts().needs_zeroing(1 << o) == 0 {
            self.write(s.base + s.cap - 1 - nz, e, m);
            s.set_nzero(nz + 1);
        } else {
            self.write(s.base + nd, e, m);
            s.ndirty.set(nd as u64 + 1);
        }
        if e.mixed() {
            self.gauge_mixed(m, o, true);
        }
    }

    #[inline(always)]
    fn pop_dirty(&self, o: usize) -> Option<(Entry, Mixed)> {
        let s = &self.stacks[o];
        let nd = s.ndirty.get() as u32;
        if nd == 0 {
            return None;
        }
        s.ndirty.set(nd as u64 - 1);
        let (e, m) = self.read(s.base + nd - 1);
        if e.mixed() {
            self.gauge_mixed(m, o, false);
        }
        Some((e, m))
    }

    #[inline(always)]
    fn pop_zero(&self, o: usize) -> Option<(Entry, Mixed)> {
        let s = &self.stacks[o];
        let nz = s.nzero.get() as u32;
        if nz == 0 {
            return None;
        }
        s.set_nzero(nz - 1);
        let (e, m) = self.read(s.base + s.cap - nz);
        self.gauge_mixed(m, o, false);
        Some((e, m))
    }

    /// The next block for a request, in the locked path's order of preference (`preference`):
    /// a plain request takes a dirty block, else the top of the zero-reading stack; a `ZERO`
    /// request takes the top of the zero-reading stack if it is `Zeroed`-class, else a dirty block
    /// (a memset costs ~20x less than faulting a reported page back in), else the top of the
    /// zero-reading stack. `refill` leaves each batch's best zero-reading block on top.
    #[inline]
    fn pop(&self, o: usize, zero: bool) -> Option<(Entry, Mixed)> {
        if zero {
            let s = &self.stacks[o];
            let nz = s.nzero.get() as u32;
            if nz > 0 {
                let (_, m) = self.read(s.base + s.cap - nz);
                if m.counts().class(1 << o) == Class::Zeroed {
                    return self.pop_zero(o);
                }
            }
        }
        match self.pop_dirty(o) {
            Some(x) => Some(x),
            None => self.pop_zero(o),
        }
    }

    /// The hit path of a plain allocation (no flags): the block on top of the dirty stack of
    /// `order`, when there is one, all of its pages `Dirty` and still `Cached`. No call, no lock,
    /// no read-modify-write; `None` (nothing changed): take `alloc`. Returns the block and its
    /// first state byte: the caller marks its pages `Allocated` (`arena::fill_block`) after
    /// `leave`, since the block is then live and off the cache, its state bytes its owner's as
    /// those of any live block, and the worker's drain touches only blocks in the entries.
    #[inline(always)]
    pub(crate) fn alloc_hit(&self, a: &Arc<Shared>, order: u8) -> Option<(usize, *const AtomicU8)> {
        let o = order as usize;
        debug_assert!(o < self.orders);
        // SAFETY: `order` is a cached order (`cached_order` checked it against
        // `cache_max_bytes`), below `self.orders`, the length of the stacks in use.
        let s = unsafe { self.stacks.get_unchecked(o) };
        let nd = s.ndirty.get();
        if nd == 0 {
            return None;
        }
        debug_assert!(nd <= s.cap as u64);
        // SAFETY: `nd - 1` is below the dirty stack's size, so `first + nd - 1` is one of this
        // order's entries.
        let e = unsafe { *s.first.add(nd as usize - 1) };
        if e.mixed() {
            return None;
        }
        let v = a.view(e.arena());
        let m = v.meta_of(e.addr());
        // SAFETY: an entry's block lies in the arena of its entry (invariant 1), so `m` is a
        // record of that live arena.
        let w = unsafe { HitWord::load(m) };
        if w.tag() != Tag::Cached as u8 {
            return None;
        }
        s.ndirty.set(nd - 1);
        // `hand_out` with this order's constants.
        // SAFETY: `m` is the record of the block just popped, in a live arena.
        unsafe { w.handed_out(s.alloc_bits).store(m) };
        self.pages.sub(s.npages);
        self.alloc_hits.add(1);
        Some((e.addr(), v.state_of(e.addr())))
    }

    /// A block of `n` pages popped from the cache becomes live: its record gets `live` (the
    /// word of a live block, exact or with slack), and the counters say so.
    #[inline(always)]
    fn hand_out(&self, m: *mut BlockMeta, live: HitWord, n: u32) {
        // SAFETY: `m` is the record of the block just popped, in a live arena.
        unsafe { live.store(m) };
        self.pages.sub(n as u64);
        self.alloc_hits.add(1);
    }

    /// Serve a request of `live` pages (`2^(order-1) < live <= 2^order`) with a block of `order`
    /// from the cache, refilling it when empty, and prepare it for `flags` (no `LOCK`). A request
    /// of fewer pages than the block gets the whole block, its pages past `live` as slack (see
    /// "Slack" at the top). `None`: the free lists are empty too.
    #[inline(never)]
    pub(crate) fn alloc(&self, a: &Arc<Shared>, order: u8, live: u32, flags: Flags) -> Option<usize> {
        let o = order as usize;
        let n = 1u32 << order;
        debug_assert!(live <= n && (live > n / 2 || n == 1));
        let zero = flags.contains(Flags::ZERO);
        loop {
            let (e, mixed) = match self.pop(o, zero) {
                Some(x) => x,
                None => self.alloc_slow(a, order, zero)?,
            };
            let v = a.view(e.arena());
            let (pfn, m) = v.record(e.addr());
            // SAFETY: `m` comes from `record` of an entry's address in its own arena (invariant 1), so
            // it is a record of that live arena's metadata array.
            let w = unsafe { HitWord::load(m) };
            if w.tag() != Tag::Cached as u8 {
                // Taken by a racing double free elsewhere: forget the entry (see the top).
                self.pages.sub(n as u64);
                continue;
            }
            if live < n {
                return Some(self.hand_out_with_slack(a, e, mixed, m, w, order, live, flags));
            }
            self.hand_out(m, w.with(Tag::Alloc, w.flags() & !META_FREED_START, n), n);
            if flags.0 == 0 && !e.mixed() {
                v.states().fill(pfn, n, PageState::Allocated);
                return Some(e.addr());
            }
            return Some(self.alloc_prepare(a, e, mixed.counts(), pfn, n, flags));
        }
    }

    /// `alloc`'s hand-out of the cached block `e` (record `m`, word `w`) of `order` for a request
    /// of `live` pages, fewer than the block's: the block becomes live with the rest as slack,
    /// whose pages keep their free states.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn hand_out_with_slack(&self, a: &Arc<Shared>, e: Entry, mixed: Mixed, m: *mut BlockMeta, w: HitWord, order: u8, live: u32, flags: Flags) -> usize {
        let n = 1u32 << order;
        self.hand_out(m, w.handed_out_with_slack(order, live), n);
        self.slack.add((n - live) as u64);
        let v = a.view(e.arena());
        let (pfn, _) = v.record(e.addr());
        // The live part's counts: the block's, less the slack's (this thread owns the block's
        // state bytes now).
        let counts = if e.mixed() { mixed.counts().minus(v.states().count(pfn + live, n - live)) } else { StateCounts::default() };
        if flags.0 == 0 && counts == StateCounts::default() {
            v.states().fill(pfn, live, PageState::Allocated);
            return e.addr();
        }
        self.alloc_prepare(a, e, counts, pfn, live, flags)
    }

    /// The hit's tail for a mixed block or a request with flags: count, then `prepare`.
    #[inline(never)]
    fn alloc_prepare(&self, a: &Arc<Shared>, e: Entry, counts: StateCounts, pfn: u32, n: u32, flags: Flags) -> usize {
        let ev = &self.events;
        if counts.reported + counts.lazy != 0 {
            ev.reused_reported_bytes.add(((counts.reported + counts.lazy) as u64) << PAGE_SHIFT);
        }
        if flags.contains(Flags::ZERO) {
            let memset = counts.needs_zeroing(n) as u64;
            ev.zeroed_on_alloc_bytes.add(memset << PAGE_SHIFT);
            ev.zero_skipped_bytes.add((n as u64 - memset) << PAGE_SHIFT);
        }
        let p = Placed { arena: e.arena(), taken: Taken { pfn, npages: n, counts }, addr: e.addr() };
        // Without LOCK, `prepare` cannot fail.
        let _ = a.prepare(&p, flags);
        e.addr()
    }

    /// Empty stacks: refill (obeying a drain request first), pop again.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, a: &Arc<Shared>, order: u8, zero: bool) -> Option<(Entry, Mixed)> {
        self.refill(a, order, zero);
        self.pop(order as usize, zero)
    }

    /// The hit path of `free`: as `free`, but `false` (nothing changed) also when the cache must
    /// first drain (over its high mark, a full stack, a drain request). No call, no lock.
    #[inline(always)]
    pub(crate) fn free_hit(&self, a: &Arc<Shared>, addr: usize, size: Option<usize>) -> bool {
        self.take_freed::<false>(a, addr, size)
    }

    /// Take the live block at `addr` into the cache if it is exactly a live, unlocked block of a
    /// cached order (and of `size`, if given), draining first if needed. `false`: the caller
    /// takes the validated path.
    #[inline(never)]
    pub(crate) fn free(&self, a: &Arc<Shared>, addr: usize, size: Option<usize>) -> bool {
        self.take_freed::<true>(a, addr, size)
    }

    /// Whether a free of `n` pages into stack `s` must first drain: over the high mark, a full
    /// stack, or a drain request this cache has not obeyed.
    #[inline(always)]
    fn needs_room(&self, a: &Arc<Shared>, s: &Stack, n: u32) -> bool {
        self.pages.get() + n as u64 > self.high
            || s.ndirty.get() == s.dirty_max.get()
            || a.hit.drain_generation.load(Relaxed) != self.seen_generation.get()
    }

    /// `free` of a live block with slack (`w`, its record `m`, at `addr` in arena `ai`): the whole
    /// aligned block comes back into the cache, its live pages `Dirty`, its slack pages in the
    /// states they kept (a mixed entry when some are not `Dirty`). `false`: not a block this
    /// cache takes (the caller takes the validated path).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn take_freed_slack(&self, a: &Arc<Shared>, ai: usize, v: &ArenaView, addr: usize, m: *mut BlockMeta, w: HitWord, size: Option<usize>) -> bool {
        let o = w.order() as usize;
        let live = w.npages();
        let page = (addr >> PAGE_SHIFT) as u32;
        if o >= self.orders || page & ((1u32 << o) - 1) != 0 || live >= 1 << o || live == 0 {
            return false;
        }
        if size.is_some_and(|size| size.div_ceil(1 << PAGE_SHIFT) != live as usize) {
            return false;
        }
        let n = 1u32 << o;
        if self.needs_room(a, &self.stacks[o], n) {
            self.make_room(a, o);
        }
        let (pfn, _) = v.record(addr);
        let states = v.states();
        // The slack's pages kept their free states while the block was live; this thread owns
        // the block, so the counts are read without the lock. The live pages become `Dirty`.
        let slack = states.count(pfn + live, n - live);
        // SAFETY: `m` is the block's record (the caller found it in arena `ai`).
        unsafe { w.with(Tag::Cached, META_FREED_START, n).store(m) };
        self.push(o, addr, ai, slack);
        self.pages.add(n as u64);
        self.slack.sub((n - live) as u64);
        self.free_hits.add(1);
        states.fill(pfn, live, PageState::Dirty);
        true
    }

    /// `free_hit` (`MAY_DRAIN` false) and `free` (true): the same checks; only `free` may call
    /// out to drain.
    #[inline(always)]
    fn take_freed<const MAY_DRAIN: bool>(&self, a: &Arc<Shared>, addr: usize, size: Option<usize>) -> bool {
        if addr & ((1 << PAGE_SHIFT) - 1) != 0 {
            return false;
        }
        // The hit path looks in the first arena only, which holds most blocks (its default size
        // is the physical memory); `free` looks in all.
        let found = if MAY_DRAIN { a.view_of(addr) } else { a.first_view_of(addr).map(|v| (0, v)) };
        let Some((ai, v)) = found else { return false };
        let m = v.meta_of(addr);
        // SAFETY: `addr` is a page of arena `ai` (`view_of`), so `m` is one of its records.
        let w = unsafe { HitWord::load(m) };
        // The page frame's low bits: the arena is aligned to its largest block, which is at
        // least as large as any live block of it.
        let page = (addr >> PAGE_SHIFT) as u32;
        if !w.live_unlocked() {
            return false;
        }
        // A power of two of pages (`n & (n - 1)`) starting on a multiple of its size, no larger
        // than the largest cached block (0 wraps to above it).
        let n = w.npages();
        let low = n.wrapping_sub(1);
        if (n | page) & low != 0 || low >= self.max_pages {
            // A block with slack is not a power of two of pages: the out-of-line path takes it.
            return MAY_DRAIN && w.flags() & META_SLACK != 0 && self.take_freed_slack(a, ai, v, addr, m, w, size);
        }
        if let Some(size) = size {
            if size.div_ceil(1 << PAGE_SHIFT) != n as usize {
                return false;
            }
        }
        let o = n.trailing_zeros() as usize;
        // SAFETY: `n <= max_pages` (above), so `o < self.orders`.
        let s = unsafe { self.stacks.get_unchecked(o) };
        if self.needs_room(a, s, n) {
            if !MAY_DRAIN {
                return false;
            }
            self.make_room(a, o);
        }
        // SAFETY: `m` is the block's record (above).
        unsafe { w.with(Tag::Cached, META_FREED_START, n).store(m) };
        // Push onto the dirty stack: below `dirty_max` (checked above, or made so by
        // `make_room`), so `first + nd` is one of this order's entries.
        let nd = s.ndirty.get();
        debug_assert!(s.len() < s.cap);
        // SAFETY: the index is in this order's entries (above); only the owner writes them.
        unsafe { *s.first.add(nd as usize) = Entry::new(addr, ai, false) };
        s.ndirty.set(nd + 1);
        self.pages.add(n as u64);
        self.free_hits.add(1);
        // The pages last, still before `leave` (the worker may drain the block once the owner
        // is out): for blocks of several pages it is a call, and little is live across it.
        // SAFETY: the block at `addr` is a block of `n` pages (a power of two) starting on a
        // multiple of `n` (checked above) in arena `ai`.
        unsafe { crate::arena::fill_block(v.state_of(addr), n, PageState::Dirty) };
        true
    }

    /// Before a free hit: obey a drain request, or drain the cache down to half its high mark
    /// and the stack of order `o` down to half its capacity.
    #[cold]
    #[inline(never)]
    fn make_room(&self, a: &Arc<Shared>, o: usize) {
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        if !self.obey_drain_request(a, &mut h, now) {
            self.drain_to_half(&mut h, o, now);
        }
        a.wake_workers_after_free(h);
    }

    /// Under the lock: the stack of order `o` down to half its capacity if it is full, then the
    /// pages down to half the high mark, order `o` first, then the largest orders.
    fn drain_to_half(&self, h: &mut Heap, o: usize, now: u32) {
        let s = &self.stacks[o];
        if s.len() == s.cap {
            self.drain_locked(h, o, s.cap.div_ceil(2), now);
        }
        let half = self.high / 2;
        let order = core::iter::once(o).chain((0..self.orders).rev().filter(|&k| k != o));
        for k in order {
            let over = self.pages.get().saturating_sub(half);
            if over == 0 {
                break;
            }
            self.drain_locked(h, k, over.div_ceil(1 << k) as u32, now);
        }
    }

    /// Under the lock: give back everything if a drain request came since this cache last
    /// obeyed one. `true` if one had.
    fn obey_drain_request(&self, a: &Arc<Shared>, h: &mut Heap, now: u32) -> bool {
        let g = a.hit.drain_generation.load(Relaxed);
        if g == self.seen_generation.get() {
            return false;
        }
        self.seen_generation.set(g);
        self.drain_all_locked(h, now);
        true
    }

    /// Move up to a batch of blocks of `order` from the free lists into the cache, under one hold
    /// of the lock (first obeying a drain request, and draining the cache to half its high mark
    /// if the batch has no room).
    #[cold]
    fn refill(&self, a: &Arc<Shared>, order: u8, zero: bool) {
        let o = order as usize;
        let n = 1u32 << order;
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        let mut drained = self.obey_drain_request(a, &mut h, now);
        if self.pages.get() + n as u64 > self.high {
            self.drain_to_half(&mut h, o, now);
            drained = true;
        }
        let s = &self.stacks[o];
        let room = ((self.high - self.pages.get()) >> order) as u32;
        let want = self.batch[o].min(s.cap - s.len()).min(room);
        let nz0 = s.nzero.get() as u32;
        h.counters.cache_refills += 1;
        let narenas = h.narenas;
        let mut got = 0;
        for ai in 0..narenas {
            let ar = h.arenas[ai].as_mut().unwrap();
            if order > ar.max_order {
                continue;
            }
            while got < want {
                // Small orders: a whole aligned group of 64 pages at a time when the batch has
                // room for it, so that two threads' blocks do not share a line of state bytes
                // (64 pages) or of block records (2 pages), which every hit writes: two threads
                // doing hits in one line ran at 30-40 ns a pair instead of 15-20.
                let per_group = 1u32 << GROUP_ORDER.saturating_sub(order);
                if order < GROUP_ORDER && GROUP_ORDER <= ar.max_order && want - got >= per_group {
                    if let Some(t) = ar.take(1 << GROUP_ORDER, GROUP_ORDER, preference(zero)) {
                        let uniform = t.counts.uniform_state(1 << GROUP_ORDER);
                        for i in 0..per_group {
                            let p = t.pfn + i * n;
                            let c = match uniform {
                                Some(PageState::Dirty) => StateCounts::default(),
                                Some(_) => t.counts.scaled(1 << GROUP_ORDER, n),
                                None => ar.count_states(p, n),
                            };
                            ar.meta(p).set_tag(Tag::Cached);
                            self.push(o, ar.addr(p), ai, c);
                        }
                        got += per_group;
                        continue;
                    }
                }
                let Some(t) = ar.take(n, order, preference(zero)) else { break };
                ar.meta(t.pfn).set_tag(Tag::Cached);
                self.push(o, ar.addr(t.pfn), ai, t.counts);
                got += 1;
            }
            if got == want {
                break;
            }
        }
        // `take` went in order of preference: put the best zero-reading block on top.
        let (b, top) = (s.base + s.cap, s.nzero.get() as u32);
        let (mut i, mut j) = (b - top, b - nz0);
        while i + 1 < j {
            j -= 1;
            let (x, y) = (self.read(i), self.read(j));
            self.write(i, y.0, y.1);
            self.write(j, x.0, x.1);
            i += 1;
        }
        let moved = (got * n) as u64;
        self.pages.add(moved);
        self.accounted.add(moved);
        h.counters.cached_pages = h.counters.cached_pages.wrapping_add(moved);
        if drained {
            a.wake_workers_after_free(h);
        }
    }

    /// Give back everything (thread exit, drain request, `drain_thread_cache`).
    fn drain_all(&self, a: &Arc<Shared>) {
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        self.drain_all_locked(&mut h, now);
        a.wake_workers_after_free(h);
    }

    fn drain_all_locked(&self, h: &mut Heap, now: u32) {
        for o in 0..self.orders {
            self.drain_locked(h, o, self.stacks[o].cap, now);
        }
    }

    /// Give back the `k` oldest blocks of order `o` (dirty ones first).
    fn drain_locked(&self, h: &mut Heap, o: usize, k: u32, now: u32) {
        let s = &self.stacks[o];
        let (nd, nz) = (s.ndirty.get() as u32, s.nzero.get() as u32);
        if nd + nz == 0 || k == 0 {
            return;
        }
        h.counters.cache_drains += 1;
        let (b, cap) = (s.base, s.cap);
        // Oldest dirty blocks: the bottom of the dirty stack.
        let kd = k.min(nd);
        for i in 0..kd {
            self.give_back(h, o, self.read(b + i), now);
        }
        for i in kd..nd {
            let (e, m) = self.read(b + i);
            self.write(b + i - kd, e, m);
        }
        s.ndirty.set((nd - kd) as u64);
        // Then the oldest zero-reading ones: the top of the array.
        let kz = (k - kd).min(nz);
        for i in 0..kz {
            self.give_back(h, o, self.read(b + cap - 1 - i), now);
        }
        for i in kz..nz {
            let (e, m) = self.read(b + cap - 1 - i);
            self.write(b + cap - 1 - (i - kz), e, m);
        }
        s.set_nzero(nz - kz);
    }

    fn give_back(&self, h: &mut Heap, o: usize, (e, m): (Entry, Mixed), now: u32) {
        if e.mixed() {
            self.gauge_mixed(m, o, false);
        }
        let n = 1u64 << o;
        self.pages.sub(n);
        self.accounted.sub(n);
        h.counters.cached_pages = h.counters.cached_pages.wrapping_sub(n);
        let ar = h.arenas[e.arena()].as_mut().unwrap();
        let pfn = ar.pfn(e.addr());
        if ar.meta(pfn).tag() != Tag::Cached {
            return; // see "Validation" at the top
        }
        ar.meta(pfn).set_tag(Tag::None);
        let n = 1u32 << o;
        if e.mixed() && m.counts().uniform_state(n).is_none() {
            // The pages' states are the entry's counts, but the half records inside the block
            // may be stale (a block with slack came back with its live part `Dirty`): list it
            // by runs of one state, which writes them anew.
            ar.free_by_runs(pfn, n, now);
        } else {
            // One state (all dirty, or a whole zeroed or reported block): no half records.
            ar.free_block(pfn, o as u8, m.counts(), now);
        }
    }

    /// Move the fast path's events into the allocator's counters (under the lock). The pages that
    /// hits moved since the last fold are `pages - accounted`: freed into the cache when positive.
    fn fold(&self, h: &mut Heap) {
        let c = &mut h.counters;
        let (ah, fh) = (self.alloc_hits.get(), self.free_hits.get());
        let net = self.pages.get().wrapping_sub(self.accounted.get());
        c.alloc_calls += ah;
        c.free_calls += fh;
        c.cache_hits += ah + fh;
        c.live_blocks = c.live_blocks.wrapping_add(ah).wrapping_sub(fh);
        c.in_use_pages = c.in_use_pages.wrapping_sub(net);
        c.cached_pages = c.cached_pages.wrapping_add(net);
        c.slack_pages = c.slack_pages.wrapping_add(self.slack.get());
        self.slack.set(0);
        self.accounted.set(self.pages.get());
        let ev = &self.events;
        c.zero_skipped_bytes += ev.zero_skipped_bytes.get();
        c.zeroed_on_alloc_bytes += ev.zeroed_on_alloc_bytes.get();
        c.reused_reported_bytes += ev.reused_reported_bytes.get();
        for x in [&self.alloc_hits, &self.free_hits, &ev.zero_skipped_bytes, &ev.zeroed_on_alloc_bytes, &ev.reused_reported_bytes] {
            x.set(0);
        }
    }

    fn for_each_entry(&self, mut f: impl FnMut(usize, Entry, Mixed)) {
        for o in 0..self.orders {
            let s = &self.stacks[o];
            for i in 0..s.ndirty.get() as u32 {
                let (e, m) = self.read(s.base + i);
                f(o, e, m);
            }
            for i in 0..s.nzero.get() as u32 {
                let (e, m) = self.read(s.base + s.cap - 1 - i);
                f(o, e, m);
            }
        }
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        // SAFETY: `entries` and `mixed` were made in `new` by `Box::into_raw` of boxed slices of
        // `nentries()` elements each, and are freed only here, once.
        unsafe {
            let n = self.nentries();
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.entries, n)));
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.mixed, n)));
        }
    }
}

// ---- The thread-local table. ----

const FRESH: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
const DEAD: u8 = 3;

struct Slots {
    ids: [Cell<u64>; SLOTS],
    caches: [Cell<*mut ThreadCache>; SLOTS],
    used: [Cell<u64>; SLOTS],
    clock: Cell<u64>,
}

// Array-repeat initialisers of the thread-local table (each use is a fresh value).
#[allow(clippy::declare_interior_mutable_const)]
const NO_ID: Cell<u64> = Cell::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO_CACHE: Cell<*mut ThreadCache> = Cell::new(ptr::null_mut());

thread_local! {
    /// FRESH until the table's destructor is registered, BUSY while this thread is registering
    /// it or allocating a cache (a re-entrant call takes the locked path), READY, DEAD after the
    /// destructor ran.
    static STATE: Cell<u8> = const { Cell::new(FRESH) };
    /// The cache used last and its allocator's id: checked first, with no destructor and no
    /// registration on access; one thread-local, so that the hit path finds both from one
    /// address.
    static LAST: Last = const { Last { id: Cell::new(0), cache: Cell::new(ptr::null()) } };
    static TABLE: Slots = const { Slots { ids: [NO_ID; SLOTS], caches: [NO_CACHE; SLOTS], used: [NO_ID; SLOTS], clock: Cell::new(0) } };
}

struct Last {
    id: Cell<u64>,
    cache: Cell<*const ThreadCache>,
}

/// The cache this thread used last, if it is `id`'s.
#[inline(always)]
fn last_of(id: u64) -> Option<*const ThreadCache> {
    LAST.with(|l| (l.id.get() == id).then(|| l.cache.get()))
}

/// The calling thread's cache of `a` if it is the one this thread used last (the hit paths: no
/// call, no registration).
#[inline(always)]
pub(crate) fn last(a: &Arc<Shared>) -> Option<&ThreadCache> {
    // SAFETY: `LAST` holds a live cache of this thread whenever its id is an allocator's (ids
    // start at 1; it is reset to 0 before its cache is retired).
    last_of(a.hit.cache_id).map(|c| unsafe { &*c })
}

/// The calling thread's cache of `a`, made at first use; `None` when caches are off for `a`, while
/// the thread is being set up or torn down, or on a re-entrant call.
#[inline]
pub(crate) fn current(a: &Arc<Shared>) -> Option<&ThreadCache> {
    if let Some(c) = last_of(a.hit.cache_id) {
        // SAFETY: as in `last`.
        return Some(unsafe { &*c });
    }
    // SAFETY: `attach` returns a cache from this thread's table, live until this thread retires
    // it (slot reuse or the table's destructor), which does not happen while `a` is borrowed.
    attach(a).map(|p| unsafe { &*p })
}

#[cold]
fn attach(a: &Arc<Shared>) -> Option<*const ThreadCache> {
    if a.hit.cache_orders == 0 {
        return None;
    }
    match STATE.with(|s| s.get()) {
        FRESH => {
            STATE.with(|s| s.set(BUSY));
            // First access registers the table's destructor (which may allocate).
            let ok = TABLE.try_with(|_| ()).is_ok();
            STATE.with(|s| s.set(if ok { READY } else { DEAD }));
            if !ok {
                return None;
            }
        }
        READY => {}
        _ => return None,
    }
    TABLE.try_with(|t| t.find_or_make(a)).ok().flatten()
}

impl Slots {
    fn find_or_make(&self, a: &Arc<Shared>) -> Option<*const ThreadCache> {
        let id = a.hit.cache_id;
        let now = self.clock.get() + 1;
        self.clock.set(now);
        for i in 0..SLOTS {
            if self.ids[i].get() == id {
                self.used[i].set(now);
                return Some(select(id, self.caches[i].get()));
            }
        }
        // An empty slot, else one whose allocator is gone, else the one used longest ago.
        let pick = (0..SLOTS)
            .find(|&i| self.caches[i].get().is_null())
            // SAFETY: this runs only when no slot is null, so every slot holds a live cache of this
            // thread (freed only by `retire`, after its slot is cleared); `owner` is never written.
            .or_else(|| (0..SLOTS).find(|&i| unsafe { (*self.caches[i].get()).owner.strong_count() } == 0))
            .unwrap_or_else(|| (0..SLOTS).min_by_key(|&i| self.used[i].get()).unwrap());
        let old = self.caches[pick].replace(ptr::null_mut());
        self.ids[pick].set(0);
        if !old.is_null() {
            if ptr::eq(LAST.with(|l| l.cache.get()), old) {
                LAST.with(|l| l.id.set(0));
            }
            retire(old);
        }
        // Allocate while BUSY (a re-entrant malloc takes the locked path) and without the lock.
        STATE.with(|s| s.set(BUSY));
        let c = Box::into_raw(Box::new(ThreadCache::new(a)));
        STATE.with(|s| s.set(READY));
        a.heap.lock().caches.push(c);
        self.caches[pick].set(c);
        self.ids[pick].set(id);
        self.used[pick].set(now);
        Some(select(id, c))
    }
}

fn select(id: u64, c: *mut ThreadCache) -> *const ThreadCache {
    LAST.with(|l| {
        l.cache.set(c);
        l.id.set(id);
    });
    c
}

impl Drop for Slots {
    fn drop(&mut self) {
        STATE.with(|s| s.set(DEAD));
        LAST.with(|l| l.id.set(0));
        for i in 0..SLOTS {
            let c = self.caches[i].replace(ptr::null_mut());
            if !c.is_null() {
                retire(c);
            }
        }
    }
}

/// Drain a cache back into its allocator if that still exists, unlink it, and free it.
fn retire(c: *mut ThreadCache) {
    // SAFETY: `c` was just taken out of this thread's table (slot cleared, `LAST` reset), so it is
    // a live cache that this thread alone still reaches through the table.
    let tc = unsafe { &*c };
    debug_assert!(tc.id != 0);
    if let Some(shared) = tc.owner.upgrade() {
        let now = shared.now_ms();
        let mut h = shared.heap.lock();
        tc.fold(&mut h);
        tc.drain_all_locked(&mut h, now);
        h.caches.unlink(c);
        // Wake a worker for what the drain freed, only while the allocator has handles.
        shared.wake_workers_if_alive(h);
    }
    // SAFETY: `c` came from `Box::into_raw` in `find_or_make`; it is out of the table and, if its
    // allocator lives, unlinked from the registry under the lock above, so nothing reaches it now
    // (if the allocator is gone, so is its registry).
    drop(unsafe { Box::from_raw(c) });
}

/// `Allocator::drain_thread_cache`.
pub(crate) fn drain_current(a: &Arc<Shared>) {
    if a.hit.cache_orders == 0 || STATE.with(|s| s.get()) != READY {
        return;
    }
    let _ = TABLE.try_with(|t| {
        for i in 0..SLOTS {
            if t.ids[i].get() == a.hit.cache_id {
                // SAFETY: a slot whose id is set holds a live cache of this thread (id and cache are set and
                // cleared together), and this is its owner.
                unsafe { (*t.caches[i].get()).drain_all(a) };
            }
        }
    });
}

// ---- Draining an idle thread's cache (the reporting worker). ----

/// Pages held by all caches of this allocator (under the lock; racy reads of other threads'
/// gauges, good enough to decide whether to ask them).
pub(crate) fn pages_held(h: &Heap) -> u64 {
    h.caches.iter().map(|c| c.pages.get()).sum()
}

/// Drain the caches that still hold pages but have not obeyed drain request `generation`: their
/// threads have not called this allocator since it was made, so their blocks may sit there for
/// ever, resident and never reported. Returns the pages given back.
///
/// Only the owner touches a cache without the lock, inside `enter` / `leave`. The worker freezes
/// the cache (under the lock), runs `membarrier` (a full barrier on every running thread), then,
/// under the lock again, drains the cache only if its owner is not `busy`. This is Dekker's
/// mutual exclusion with an asymmetric fence: the owner stores `busy` and then loads `frozen`
/// with only a compiler fence between; the worker stores `frozen` and then loads `busy` with
/// `membarrier` between, which orders the owner's store before its load wherever the owner was
/// running. So either the owner sees `frozen` and keeps out (it takes the locked path, which
/// waits for the lock the worker holds), or the worker sees `busy` and leaves that cache alone
/// until the next request; never both in it. The hit path pays two plain stores and a load.
/// Without `membarrier` (old kernels, seccomp), nothing is drained.
///
/// `freed_at_ms` is the free time the drained blocks get: the time of the request, since every
/// block in an unanswered cache was put there before its thread's last call, which came before
/// the request. So they are reported at the reporter's next pass, not a delay later.
pub(crate) fn drain_unanswered(s: &Shared, generation: u64, freed_at_ms: u32) -> u64 {
    let mut frozen = 0;
    {
        let h = s.heap.lock();
        for c in h.caches.iter() {
            if c.pages.get() > 0 && c.seen_generation.get() != generation {
                c.frozen.store(1, Relaxed);
                frozen += 1;
            }
        }
    }
    if frozen == 0 {
        return 0;
    }
    let fenced = crate::os::membarrier();
    let mut h = s.heap.lock();
    let mut pages = 0;
    // Walk the registry by its raw links: draining needs the heap mutably.
    let mut p = h.caches.first();
    while !p.is_null() {
        // SAFETY: registered caches are live while on the list, and the lock is held (`h`), so no
        // owner's `retire` can unlink and free one during the walk.
        let c = unsafe { &*p };
        p = c.next.get();
        if c.frozen.load(Relaxed) == 0 {
            continue; // registered after the freeze
        }
        if fenced && c.busy.load(Ordering::Acquire) == 0 {
            pages += c.pages.get();
            c.fold(&mut h);
            c.drain_all_locked(&mut h, freed_at_ms);
            c.seen_generation.set(generation);
            h.counters.cache_remote_drains += 1;
        }
        c.frozen.store(0, Ordering::Release);
    }
    pages
}

// ---- What the allocator's statistics and checks see of the caches (all under the lock). ----

/// The allocator lock, held while every cache's owner is kept out of its cache: what reading
/// the entries of other threads' caches needs (`check`, `free_runs`). The caches are frozen
/// as `drain_unanswered` freezes them, but with the lock held from the freeze to the thaw (in
/// `drop`), so that the reporter, which thaws only under the lock, cannot thaw one meanwhile.
pub(crate) struct FrozenHeap<'a> {
    h: crate::lock::Guard<'a, Heap>,
}

impl core::ops::Deref for FrozenHeap<'_> {
    type Target = Heap;
    fn deref(&self) -> &Heap {
        &self.h
    }
}

impl Drop for FrozenHeap<'_> {
    fn drop(&mut self) {
        for c in self.h.caches.iter() {
            c.frozen.store(0, Ordering::Release);
        }
    }
}

/// Lock `a` with every cache's owner kept out (see `FrozenHeap`). An owner found inside its cache
/// may be waiting for this very lock (a refill): the lock is let go and the freeze tried again,
/// every 100 us for about a second. `None`: some owner stayed inside that long, or `membarrier`
/// is not available here and a cache other than the caller's last one exists (without the
/// barrier, an owner's entry cannot be ruled out).
pub(crate) fn lock_owners_out(a: &Arc<Shared>) -> Option<FrozenHeap<'_>> {
    let own = last(a).map(|c| c as *const ThreadCache);
    for _ in 0..10_000 {
        let frozen = FrozenHeap { h: a.heap.lock() };
        let mut others = false;
        for c in frozen.caches.iter() {
            c.frozen.store(1, Relaxed);
            // The caller's own cache: this thread is not inside it (it is here).
            others |= Some(c as *const ThreadCache) != own;
        }
        if !others {
            return Some(frozen);
        }
        // Dekker with an asymmetric fence, as in `drain_unanswered`: the owner stores `busy` then
        // loads `frozen`; this thread stored `frozen`, and loads `busy` after the barrier.
        if !crate::os::membarrier() {
            return None;
        }
        if frozen.caches.iter().all(|c| c.busy.load(Ordering::Acquire) == 0) {
            return Some(frozen);
        }
        drop(frozen);
        crate::os::sleep_ns(100_000);
    }
    None
}

/// Add every registered cache's contents (as free memory) and unfolded events to `s`.
#[allow(clippy::needless_range_loop)]
pub(crate) fn add_to_stats(h: &Heap, s: &mut Stats) {
    let mut in_use = h.counters.in_use_pages;
    let mut slack = h.counters.slack_pages;
    let mut live = s.live_blocks;
    for c in h.caches.iter() {
        let (blocks, p) = c.gauges();
        for class in 0..CLASSES {
            for o in 0..c.orders {
                s.free_blocks[class][o] += blocks[class][o];
            }
        }
        s.free_dirty_pages += p[0];
        s.free_zeroed_pages += p[1];
        s.free_reported_pages += p[2];
        s.free_lazy_pages += p[3];
        s.cached_pages += p.iter().sum::<u64>();
        let (ah, fh) = (c.alloc_hits.get(), c.free_hits.get());
        s.alloc_calls += ah;
        s.free_calls += fh;
        s.cache_hits += ah + fh;
        live = live.wrapping_add(ah).wrapping_sub(fh);
        in_use = in_use.wrapping_sub(c.pages.get().wrapping_sub(c.accounted.get()));
        slack = slack.wrapping_add(c.slack.get());
        let ev = &c.events;
        s.zero_skipped_bytes += ev.zero_skipped_bytes.get();
        s.zeroed_on_alloc_bytes += ev.zeroed_on_alloc_bytes.get();
        s.reused_reported_bytes += ev.reused_reported_bytes.get();
    }
    // Another thread's counters are read one after another while it runs: a hit caught between
    // two of its stores may make a sum briefly negative (a free counted before its allocation,
    // slack before the block it belongs to). Clamp, as the gauges do.
    let nonneg = |v: u64| (v as i64).max(0) as u64;
    let (in_use, slack) = (nonneg(in_use), nonneg(slack));
    let slack = slack.min(in_use);
    s.live_blocks = nonneg(live);
    s.bytes_in_use = (in_use - slack) << PAGE_SHIFT;
    s.slack_bytes = slack << PAGE_SHIFT;
}

/// Invariants 1 and 2 at the top. Reads other threads' entries, which `FrozenHeap` keeps them out of.
pub(crate) fn check(h: &FrozenHeap<'_>) -> Result<(), String> {
    let mut pages = 0u64;
    let mut net = 0u64;
    let mut err = None;
    for c in h.caches.iter() {
        net = net.wrapping_add(c.pages.get().wrapping_sub(c.accounted.get()));
        let mut mine = 0u64;
        let mut gauge = [0u64; 4];
        let mut blocks = [[0u64; MAX_ORDERS]; CLASSES];
        c.for_each_entry(|o, e, m| {
            let n = 1u32 << o;
            mine += n as u64;
            let Some(ar) = h.arenas.get(e.arena()).and_then(|a| a.as_ref()) else {
                err = Some(format!("cached block {:#x}: no arena {}", e.addr(), e.arena()));
                return;
            };
            let pfn = ar.pfn(e.addr());
            let real = ar.count_states(pfn, n);
            if pfn & (n - 1) != 0 || ar.meta(pfn).tag() != Tag::Cached {
                err = Some(format!("cached block {:#x} of order {o}: misaligned or tag {:?}", e.addr(), ar.meta(pfn).tag()));
            } else if real != m.counts() || e.mixed() != (real != StateCounts::default()) {
                err = Some(format!("cached block {:#x}: entry says {:?} (mixed {}), pages say {real:?}", e.addr(), m.counts(), e.mixed()));
            } else if (0..n).any(|i| ar.state(pfn + i) == PageState::Allocated) {
                err = Some(format!("cached block {:#x} holds an allocated page", e.addr()));
            }
            blocks[real.class(n) as usize][o] += 1;
            gauge[0] += real.dirty(n) as u64;
            gauge[1] += real.zeroed as u64;
            gauge[2] += real.reported as u64;
            gauge[3] += real.lazy as u64;
        });
        if let Some(e) = err.take() {
            return Err(e);
        }
        for (o, s) in c.stacks[..c.orders].iter().enumerate() {
            if s.dirty_max.get() != s.cap as u64 - s.nzero.get() {
                return Err(format!("cache stack of order {o}: dirty_max {} != cap - nzero", s.dirty_max.get()));
            }
        }
        if mine != c.pages.get() || mine > c.high {
            return Err(format!("cache holds {mine} pages, says {}, high mark {}", c.pages.get(), c.high));
        }
        let (b, g) = c.gauges();
        if g != gauge || b != blocks {
            return Err(format!("cache gauges {g:?} {b:?} disagree with its entries {gauge:?} {blocks:?}"));
        }
        pages += mine;
    }
    if h.counters.cached_pages.wrapping_add(net) != pages {
        return Err(format!(
            "cached pages: counter {} + unfolded net hits {} != {pages} in entries",
            h.counters.cached_pages as i64, net as i64
        ));
    }
    Ok(())
}

/// Add the runs of every cached block to `out` (for `Allocator::free_runs`; other threads' entries
/// are read, which `FrozenHeap` keeps them out of).
pub(crate) fn free_runs(h: &FrozenHeap<'_>, out: &mut Vec<(usize, usize, PageState)>) {
    for c in h.caches.iter() {
        c.for_each_entry(|o, e, _| {
            if let Some(ar) = h.arenas.get(e.arena()).and_then(|a| a.as_ref()) {
                ar.for_each_run(ar.pfn(e.addr()), 1 << o, |p, n, s| {
                    out.push((ar.addr(p), (n as usize) << PAGE_SHIFT, s));
                });
            }
        });
    }
}
