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
//! A cache belongs to one (thread, allocator) pair. For each cached order it keeps, in one array
//! of `cap` entries, two stacks: blocks that need no zeroing (every page `Zeroed` or `Reported`)
//! grow down from the top, the others ("dirty") grow up from the bottom. An entry records the
//! block's address, arena and per-state page counts. A block's pages keep their free states while
//! it is cached, so a `ZERO` request served from the cache memsets exactly the pages whose byte
//! says `Dirty` or `LazyFree`, as the locked path does.
//!
//! States of a block with respect to the caches (`Tag` on its first page):
//!
//! ```text
//!   Free (listed) --refill, under lock--> Cached --hit alloc, owner, no lock--> Alloc (live)
//!   Alloc --hit free, freeing thread, no lock--> Cached (pages Dirty, FREED_START set)
//!   Cached --drain (full: half; thread exit, drain request: all), under lock--> Free (merged)
//! ```
//!
//! Invariants (checked by `check`, called from `Allocator::check_invariants`):
//! 1. A cached block of order k is aligned to 2^k pages, has `Tag::Cached` on its first page, is
//!    on no free list and sits in exactly one cache entry; its pages are in free states and the
//!    entry's counts equal what their state bytes say; zero-stack entries need no zeroing.
//! 2. `Counters::cached_pages` (folded) minus each registered cache's unfolded net hits (pages
//!    allocated from it minus pages freed into it since its last fold) equals the pages in all
//!    entries; listed + in use + cached + isolated pages = reserved pages (modulo 2^64).
//! 3. A cache holds at most `cap(k)` blocks of order k, so at most
//!    `cache_orders * cache_high_pages` pages (plus rounding for high orders; see docs/design.md).
//!
//! Threads and locks. Only the owning thread reads or writes a cache's entries and stack sizes,
//! and only it changes the tags and page states of the blocks in them. Refill and drain move a
//! batch of blocks under ONE hold of the allocator lock, and fold the thread's counters into the
//! allocator's at the same time. Per-thread counters are atomics written by their one owner with a
//! plain load and store (no `lock` prefix); `stats` reads them under the allocator lock, and the
//! owner resets them only under that lock, so a fold is never counted twice nor missed.
//!
//! Validation. A hit `free` first checks, with single atomic loads of the block's record, that the
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
//! Re-entrancy (the preload library). The cache and its table are allocated from the Rust global
//! allocator at a thread's first use, with the allocator lock NOT held. A re-entrant call (the
//! global allocator being fallow itself) finds the thread's state `BUSY` and takes the locked path.
//! After the table's destructor has run, every call takes the locked path.

use core::cell::Cell;
use core::ptr;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use crate::buddy::preference;
use crate::buddy::Taken;
use crate::heap::{Allocator, Heap, Placed, Shared};
use crate::os::PAGE_SHIFT;
use crate::page::{BlockMeta, Class, PageState, StateCounts, Tag, CLASSES, META_FREED_START, META_LOCKED};
use crate::stats::Stats;

/// Largest order a cache may serve (2 MiB blocks).
pub const CACHE_ORDER_LIMIT: u8 = 9;
const MAX_ORDERS: usize = CACHE_ORDER_LIMIT as usize + 1;
/// Allocators one thread keeps caches for at once; a further one takes the slot used longest ago.
const SLOTS: usize = 8;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn new_allocator_id() -> u64 {
    NEXT_ID.fetch_add(1, Relaxed)
}

/// A counter with a single writer, the owning thread: a plain load and store, no `lock` prefix.
#[derive(Default)]
struct Owned(AtomicU64);

impl Owned {
    #[inline]
    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    #[inline]
    fn set(&self, v: u64) {
        self.0.store(v, Relaxed)
    }
    #[inline]
    fn add(&self, v: u64) {
        self.set(self.get().wrapping_add(v))
    }
    #[inline]
    fn sub(&self, v: u64) {
        self.set(self.get().wrapping_sub(v))
    }
}

/// One cached block.
#[derive(Clone, Copy, Default)]
struct Entry {
    addr: usize,
    arena: u16,
    zeroed: u16,
    reported: u16,
    lazy: u16,
}

impl Entry {
    fn counts(&self) -> StateCounts {
        StateCounts { zeroed: self.zeroed as u32, reported: self.reported as u32, lazy: self.lazy as u32 }
    }
}

/// Events of the fast path since the last fold into the allocator's counters.
#[derive(Default)]
struct Events {
    alloc_hits: Owned,
    alloc_pages: Owned,
    free_hits: Owned,
    free_pages: Owned,
    zero_skipped_bytes: Owned,
    zeroed_on_alloc_bytes: Owned,
    reused_reported_bytes: Owned,
}

pub(crate) struct ThreadCache {
    owner: Weak<Shared>,
    id: u64,
    /// Per order: first index in `entries`, capacity and batch, in blocks.
    base: [u32; MAX_ORDERS],
    cap: [u32; MAX_ORDERS],
    batch: [u32; MAX_ORDERS],
    orders: usize,
    entries: *mut Entry,
    nentries: usize,
    /// Per order: dirty stack size (grows up from `base`), zero stack size (grows down from
    /// `base + cap - 1`).
    ndirty: [Owned; MAX_ORDERS],
    nzero: [Owned; MAX_ORDERS],
    /// Gauges of what the cache holds beyond "all pages dirty" (the common case, a block freed
    /// into the cache, touches none of them): pages zeroed, reported and lazily freed, and blocks
    /// of class `Zeroed` and `Reported` per order. Dirty pages and dirty-class blocks are derived
    /// from the stack sizes.
    extra_pages: [Owned; 3],
    class_blocks: [[Owned; MAX_ORDERS]; 2],
    events: Events,
    /// The drain generation this cache last obeyed (owner only).
    seen_generation: Cell<u64>,
    // The registry's links, read and written under the allocator lock only.
    next: Cell<*mut ThreadCache>,
    prev: Cell<*mut ThreadCache>,
}

/// The allocator's list of its threads' caches (intrusive: registering allocates nothing).
pub(crate) struct Registry {
    head: *mut ThreadCache,
}

unsafe impl Send for Registry {}

impl Registry {
    pub(crate) const fn new() -> Registry {
        Registry { head: ptr::null_mut() }
    }

    fn push(&mut self, c: *mut ThreadCache) {
        unsafe {
            (*c).prev.set(ptr::null_mut());
            (*c).next.set(self.head);
            if !self.head.is_null() {
                (*self.head).prev.set(c);
            }
        }
        self.head = c;
    }

    fn unlink(&mut self, c: *mut ThreadCache) {
        unsafe {
            let (p, n) = ((*c).prev.get(), (*c).next.get());
            if p.is_null() {
                self.head = n;
            } else {
                (*p).next.set(n);
            }
            if !n.is_null() {
                (*n).prev.set(p);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &ThreadCache> {
        let mut p = self.head;
        core::iter::from_fn(move || {
            if p.is_null() {
                return None;
            }
            let c = unsafe { &*p };
            p = c.next.get();
            Some(c)
        })
    }
}

// ---- Atomic access to the fields of a block record that the fast path reads or writes. ----

#[inline]
unsafe fn tag_of(m: *mut BlockMeta) -> u8 {
    (*(ptr::addr_of_mut!((*m).tag) as *const AtomicU8)).load(Relaxed)
}
#[inline]
unsafe fn set_tag(m: *mut BlockMeta, t: Tag) {
    (*(ptr::addr_of_mut!((*m).tag) as *const AtomicU8)).store(t as u8, Relaxed)
}
#[inline]
unsafe fn flags_of(m: *mut BlockMeta) -> u8 {
    (*(ptr::addr_of_mut!((*m).flags) as *const AtomicU8)).load(Relaxed)
}
#[inline]
unsafe fn set_flags(m: *mut BlockMeta, f: u8) {
    (*(ptr::addr_of_mut!((*m).flags) as *const AtomicU8)).store(f, Relaxed)
}
#[inline]
unsafe fn npages_of(m: *mut BlockMeta) -> u32 {
    (*(ptr::addr_of_mut!((*m).npages) as *const AtomicU32)).load(Relaxed)
}
#[inline]
unsafe fn set_npages(m: *mut BlockMeta, n: u32) {
    (*(ptr::addr_of_mut!((*m).npages) as *const AtomicU32)).store(n, Relaxed)
}

impl ThreadCache {
    fn new(a: &Allocator) -> ThreadCache {
        let cfg = a.config();
        let orders = a.shared.cache_orders as usize;
        let mut base = [0u32; MAX_ORDERS];
        let mut cap = [0u32; MAX_ORDERS];
        let mut batch = [0u32; MAX_ORDERS];
        let mut total = 0u32;
        for o in 0..orders {
            cap[o] = (cfg.cache_high_pages >> o).max(2);
            batch[o] = (cfg.cache_batch_pages >> o).clamp(1, cap[o] / 2);
            base[o] = total;
            total += cap[o];
        }
        let entries = Box::into_raw(vec![Entry::default(); total as usize].into_boxed_slice()) as *mut Entry;
        ThreadCache {
            owner: Arc::downgrade(&a.shared),
            id: a.shared.cache_id,
            base,
            cap,
            batch,
            orders,
            entries,
            nentries: total as usize,
            ndirty: Default::default(),
            nzero: Default::default(),
            extra_pages: Default::default(),
            class_blocks: Default::default(),
            events: Events::default(),
            seen_generation: Cell::new(a.shared.drain_generation.load(Relaxed)),
            next: Cell::new(ptr::null_mut()),
            prev: Cell::new(ptr::null_mut()),
        }
    }

    #[inline]
    fn slot(&self, i: u32) -> *mut Entry {
        debug_assert!((i as usize) < self.nentries);
        unsafe { self.entries.add(i as usize) }
    }

    #[inline(always)]
    fn gauge(&self, e: &Entry, order: usize, sign: bool) {
        if e.zeroed | e.reported | e.lazy != 0 {
            self.gauge_mixed(e, order, sign);
        }
    }

    #[inline(never)]
    fn gauge_mixed(&self, e: &Entry, order: usize, sign: bool) {
        let vals = [e.zeroed as u64, e.reported as u64, e.lazy as u64];
        let class = e.counts().class(1 << order);
        let cb = match class {
            Class::Dirty => None,
            Class::Zeroed => Some(&self.class_blocks[0][order]),
            Class::Reported => Some(&self.class_blocks[1][order]),
        };
        if sign {
            if let Some(g) = cb {
                g.add(1);
            }
            for (g, v) in self.extra_pages.iter().zip(vals) {
                g.add(v);
            }
        } else {
            if let Some(g) = cb {
                g.sub(1);
            }
            for (g, v) in self.extra_pages.iter().zip(vals) {
                g.sub(v);
            }
        }
    }

    /// Blocks by class and order, and pages by state (dirty, zeroed, reported, lazy).
    #[allow(clippy::needless_range_loop)]
    fn gauges(&self) -> ([[u64; MAX_ORDERS]; CLASSES], [u64; 4]) {
        let mut blocks = [[0u64; MAX_ORDERS]; CLASSES];
        let mut total = 0u64;
        for o in 0..self.orders {
            let n = self.ndirty[o].get() + self.nzero[o].get();
            total += n << o;
            let (z, r) = (self.class_blocks[0][o].get(), self.class_blocks[1][o].get());
            blocks[Class::Zeroed as usize][o] = z;
            blocks[Class::Reported as usize][o] = r;
            // Saturating: `stats` on one thread may read another's gauges mid-update.
            blocks[Class::Dirty as usize][o] = n.saturating_sub(z.wrapping_add(r));
        }
        let x: Vec<u64> = self.extra_pages.iter().map(|g| g.get()).collect();
        (blocks, [total.saturating_sub(x[0].wrapping_add(x[1]).wrapping_add(x[2])), x[0], x[1], x[2]])
    }

    #[inline(always)]
    fn push(&self, o: usize, e: Entry) {
        let (nd, nz) = (self.ndirty[o].get() as u32, self.nzero[o].get() as u32);
        debug_assert!(nd + nz < self.cap[o]);
        if e.counts().needs_zeroing(1 << o) == 0 {
            unsafe { *self.slot(self.base[o] + self.cap[o] - 1 - nz) = e };
            self.nzero[o].set(nz as u64 + 1);
        } else {
            unsafe { *self.slot(self.base[o] + nd) = e };
            self.ndirty[o].set(nd as u64 + 1);
        }
        self.gauge(&e, o, true);
    }

    #[inline(always)]
    fn pop_dirty(&self, o: usize) -> Option<Entry> {
        let nd = self.ndirty[o].get() as u32;
        if nd == 0 {
            return None;
        }
        self.ndirty[o].set(nd as u64 - 1);
        let e = unsafe { *self.slot(self.base[o] + nd - 1) };
        self.gauge(&e, o, false);
        Some(e)
    }

    #[inline(always)]
    fn pop_zero(&self, o: usize) -> Option<Entry> {
        let nz = self.nzero[o].get() as u32;
        if nz == 0 {
            return None;
        }
        self.nzero[o].set(nz as u64 - 1);
        let e = unsafe { *self.slot(self.base[o] + self.cap[o] - nz) };
        self.gauge(&e, o, false);
        Some(e)
    }

    #[inline]
    fn pop(&self, o: usize, zero: bool) -> Option<Entry> {
        if zero {
            self.pop_zero(o)
        } else {
            self.pop_dirty(o).or_else(|| self.pop_zero(o))
        }
    }

    /// Serve a block of `order` (`2^order` pages) from the cache, refilling it when empty. The
    /// caller runs `Allocator::prepare` on the result. `None`: the free lists are empty too.
    #[inline]
    pub(crate) fn alloc(&self, a: &Allocator, order: u8, zero: bool) -> Option<Placed> {
        self.obey_drain_request(a);
        let o = order as usize;
        let n = 1u32 << order;
        loop {
            let e = match self.pop(o, zero) {
                Some(e) => e,
                None => {
                    self.refill(a, order, zero);
                    match self.pop(o, zero) {
                        Some(e) => e,
                        // A ZERO request with no zero-reading block left: memset a dirty one.
                        None if zero => self.pop_dirty(o)?,
                        None => return None,
                    }
                }
            };
            let pfn = ((e.addr - a.arena_base(e.arena as usize)) >> PAGE_SHIFT) as u32;
            let m = unsafe { a.meta_of(e.arena as usize).add(pfn as usize) };
            if unsafe { tag_of(m) } != Tag::Cached as u8 {
                // Taken by a racing double free elsewhere: forget the entry (see the top).
                continue;
            }
            unsafe {
                set_npages(m, n);
                set_flags(m, flags_of(m) & !META_FREED_START);
                set_tag(m, Tag::Alloc);
            }
            let counts = e.counts();
            let ev = &self.events;
            ev.alloc_hits.add(1);
            ev.alloc_pages.add(n as u64);
            if e.reported + e.lazy != 0 {
                ev.reused_reported_bytes.add(((e.reported + e.lazy) as u64) << PAGE_SHIFT);
            }
            if zero {
                let memset = counts.needs_zeroing(n) as u64;
                ev.zeroed_on_alloc_bytes.add(memset << PAGE_SHIFT);
                ev.zero_skipped_bytes.add((n as u64 - memset) << PAGE_SHIFT);
            }
            return Some(Placed { arena: e.arena as usize, taken: Taken { pfn, npages: n, counts }, addr: e.addr });
        }
    }

    /// Take the live block at `addr` into the cache if it is exactly a live, unlocked block of a
    /// cached order (and of `size`, if given). `false`: the caller takes the validated path.
    #[inline]
    pub(crate) fn free(&self, a: &Allocator, addr: usize, size: Option<usize>) -> bool {
        if addr & ((1 << PAGE_SHIFT) - 1) != 0 {
            return false;
        }
        let Some((ai, base)) = a.arena_of(addr) else { return false };
        let pfn = ((addr - base) >> PAGE_SHIFT) as u32;
        let m = unsafe { a.meta_of(ai).add(pfn as usize) };
        let n = unsafe {
            if tag_of(m) != Tag::Alloc as u8 || flags_of(m) & META_LOCKED != 0 {
                return false;
            }
            npages_of(m)
        };
        if !n.is_power_of_two() || n.trailing_zeros() as usize >= self.orders || pfn & (n - 1) != 0 {
            return false;
        }
        if let Some(size) = size {
            if size.div_ceil(1 << PAGE_SHIFT) != n as usize {
                return false;
            }
        }
        self.obey_drain_request(a);
        let o = n.trailing_zeros() as usize;
        if (self.ndirty[o].get() + self.nzero[o].get()) as u32 == self.cap[o] {
            self.drain(a, o, self.cap[o] / 2);
        }
        a.states_of(ai).fill(pfn, n, PageState::Dirty);
        unsafe {
            set_flags(m, META_FREED_START);
            set_tag(m, Tag::Cached);
        }
        self.push(o, Entry { addr, arena: ai as u16, zeroed: 0, reported: 0, lazy: 0 });
        self.events.free_hits.add(1);
        self.events.free_pages.add(n as u64);
        true
    }

    #[inline]
    fn obey_drain_request(&self, a: &Allocator) {
        let g = a.shared.drain_generation.load(Relaxed);
        if g != self.seen_generation.get() {
            self.seen_generation.set(g);
            self.drain_all(a);
        }
    }

    /// Move up to a batch of blocks of `order` from the free lists into the cache, under one hold
    /// of the lock.
    #[cold]
    fn refill(&self, a: &Allocator, order: u8, zero: bool) {
        let o = order as usize;
        let room = self.cap[o] - (self.ndirty[o].get() + self.nzero[o].get()) as u32;
        let want = self.batch[o].min(room);
        if want == 0 {
            return;
        }
        let n = 1u32 << order;
        let mut h = a.shared.heap.lock();
        self.fold(&mut h);
        h.counters.cache_refills += 1;
        let narenas = h.narenas;
        let mut got = 0;
        for ai in 0..narenas {
            let ar = h.arenas[ai].as_mut().unwrap();
            if order > ar.max_order {
                continue;
            }
            while got < want {
                let Some(t) = ar.take(n, order, preference(zero)) else { break };
                ar.meta_mut(t.pfn).tag = Tag::Cached;
                let addr = ar.addr(t.pfn);
                let c = t.counts;
                self.push(
                    o,
                    Entry { addr, arena: ai as u16, zeroed: c.zeroed as u16, reported: c.reported as u16, lazy: c.lazy as u16 },
                );
                got += 1;
            }
            if got == want {
                break;
            }
        }
        h.counters.cached_pages = h.counters.cached_pages.wrapping_add((got * n) as u64);
    }

    /// Give back the `k` oldest blocks of order `o` (dirty ones first) under one hold of the lock.
    #[cold]
    fn drain(&self, a: &Allocator, o: usize, k: u32) {
        let now = a.now_ms();
        let mut h = a.shared.heap.lock();
        self.fold(&mut h);
        self.drain_locked(&mut h, o, k, now);
        a.wake_workers_after_free(h);
    }

    /// Give back everything (thread exit, drain request, `drain_thread_cache`).
    fn drain_all(&self, a: &Allocator) {
        let now = a.now_ms();
        let mut h = a.shared.heap.lock();
        self.fold(&mut h);
        for o in 0..self.orders {
            self.drain_locked(&mut h, o, self.cap[o], now);
        }
        a.wake_workers_after_free(h);
    }

    fn drain_locked(&self, h: &mut Heap, o: usize, k: u32, now: u32) {
        let (nd, nz) = (self.ndirty[o].get() as u32, self.nzero[o].get() as u32);
        if nd + nz == 0 || k == 0 {
            return;
        }
        h.counters.cache_drains += 1;
        let (b, cap) = (self.base[o], self.cap[o]);
        // Oldest dirty blocks: the bottom of the dirty stack.
        let kd = k.min(nd);
        for i in 0..kd {
            let e = unsafe { *self.slot(b + i) };
            self.give_back(h, o, &e, now);
        }
        for i in kd..nd {
            unsafe { *self.slot(b + i - kd) = *self.slot(b + i) };
        }
        self.ndirty[o].set((nd - kd) as u64);
        // Then the oldest zero-reading ones: the top of the array.
        let kz = (k - kd).min(nz);
        for i in 0..kz {
            let e = unsafe { *self.slot(b + cap - 1 - i) };
            self.give_back(h, o, &e, now);
        }
        for i in kz..nz {
            unsafe { *self.slot(b + cap - 1 - (i - kz)) = *self.slot(b + cap - 1 - i) };
        }
        self.nzero[o].set((nz - kz) as u64);
    }

    fn give_back(&self, h: &mut Heap, o: usize, e: &Entry, now: u32) {
        self.gauge(e, o, false);
        let n = 1u32 << o;
        h.counters.cached_pages = h.counters.cached_pages.wrapping_sub(n as u64);
        let ar = h.arenas[e.arena as usize].as_mut().unwrap();
        let pfn = ar.pfn(e.addr);
        if ar.meta(pfn).tag != Tag::Cached {
            return; // see "Validation" at the top
        }
        ar.meta_mut(pfn).tag = Tag::None;
        // The entry's counts are its pages' states: they do not change while the block is cached.
        ar.free_block(pfn, o as u8, e.counts(), now);
    }

    /// Move the fast path's events into the allocator's counters (under the lock).
    fn fold(&self, h: &mut Heap) {
        let ev = &self.events;
        let c = &mut h.counters;
        let (ah, ap, fh, fp) = (ev.alloc_hits.get(), ev.alloc_pages.get(), ev.free_hits.get(), ev.free_pages.get());
        c.alloc_calls += ah;
        c.free_calls += fh;
        c.cache_hits += ah + fh;
        c.live_blocks = c.live_blocks.wrapping_add(ah).wrapping_sub(fh);
        c.in_use_pages = c.in_use_pages.wrapping_add(ap).wrapping_sub(fp);
        c.cached_pages = c.cached_pages.wrapping_sub(ap).wrapping_add(fp);
        c.zero_skipped_bytes += ev.zero_skipped_bytes.get();
        c.zeroed_on_alloc_bytes += ev.zeroed_on_alloc_bytes.get();
        c.reused_reported_bytes += ev.reused_reported_bytes.get();
        for x in [
            &ev.alloc_hits,
            &ev.alloc_pages,
            &ev.free_hits,
            &ev.free_pages,
            &ev.zero_skipped_bytes,
            &ev.zeroed_on_alloc_bytes,
            &ev.reused_reported_bytes,
        ] {
            x.set(0);
        }
    }

    fn for_each_entry(&self, mut f: impl FnMut(usize, &Entry)) {
        for o in 0..self.orders {
            let (b, cap) = (self.base[o], self.cap[o]);
            for i in 0..self.ndirty[o].get() as u32 {
                f(o, unsafe { &*self.slot(b + i) });
            }
            for i in 0..self.nzero[o].get() as u32 {
                f(o, unsafe { &*self.slot(b + cap - 1 - i) });
            }
        }
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        unsafe { drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.entries, self.nentries))) };
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
    /// The cache used last: checked first, with no destructor and no registration on access.
    static LAST_ID: Cell<u64> = const { Cell::new(0) };
    static LAST: Cell<*const ThreadCache> = const { Cell::new(ptr::null()) };
    static TABLE: Slots = const { Slots { ids: [NO_ID; SLOTS], caches: [NO_CACHE; SLOTS], used: [NO_ID; SLOTS], clock: Cell::new(0) } };
}

/// The calling thread's cache of `a`, made at first use; `None` when caches are off for `a`, while
/// the thread is being set up or torn down, or on a re-entrant call.
#[inline]
pub(crate) fn current(a: &Allocator) -> Option<&ThreadCache> {
    let id = a.shared.cache_id;
    if LAST_ID.with(|c| c.get()) == id {
        return Some(unsafe { &*LAST.with(|c| c.get()) });
    }
    attach(a).map(|p| unsafe { &*p })
}

#[cold]
fn attach(a: &Allocator) -> Option<*const ThreadCache> {
    if a.shared.cache_orders == 0 {
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
    fn find_or_make(&self, a: &Allocator) -> Option<*const ThreadCache> {
        let id = a.shared.cache_id;
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
            .or_else(|| (0..SLOTS).find(|&i| unsafe { (*self.caches[i].get()).owner.strong_count() } == 0))
            .unwrap_or_else(|| (0..SLOTS).min_by_key(|&i| self.used[i].get()).unwrap());
        let old = self.caches[pick].replace(ptr::null_mut());
        self.ids[pick].set(0);
        if !old.is_null() {
            if ptr::eq(LAST.with(|c| c.get()), old) {
                LAST_ID.with(|c| c.set(0));
            }
            retire(old);
        }
        // Allocate while BUSY (a re-entrant malloc takes the locked path) and without the lock.
        STATE.with(|s| s.set(BUSY));
        let c = Box::into_raw(Box::new(ThreadCache::new(a)));
        STATE.with(|s| s.set(READY));
        a.shared.heap.lock().caches.push(c);
        self.caches[pick].set(c);
        self.ids[pick].set(id);
        self.used[pick].set(now);
        Some(select(id, c))
    }
}

fn select(id: u64, c: *mut ThreadCache) -> *const ThreadCache {
    LAST.with(|l| l.set(c));
    LAST_ID.with(|l| l.set(id));
    c
}

impl Drop for Slots {
    fn drop(&mut self) {
        STATE.with(|s| s.set(DEAD));
        LAST_ID.with(|c| c.set(0));
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
    let tc = unsafe { &*c };
    debug_assert!(tc.id != 0);
    if let Some(shared) = tc.owner.upgrade() {
        let now = shared.now_ms();
        let mut h = shared.heap.lock();
        tc.fold(&mut h);
        for o in 0..tc.orders {
            tc.drain_locked(&mut h, o, tc.cap[o], now);
        }
        h.caches.unlink(c);
        // Wake a worker for what the drain freed, through a handle only while the allocator has
        // some (a handle made here would otherwise stop its workers when dropped).
        match Allocator::revive(&shared) {
            Some(a) => a.wake_workers_after_free(h),
            None => drop(h),
        }
    }
    drop(unsafe { Box::from_raw(c) });
}

/// `Allocator::drain_thread_cache`.
pub(crate) fn drain_current(a: &Allocator) {
    if a.shared.cache_orders == 0 || STATE.with(|s| s.get()) != READY {
        return;
    }
    let _ = TABLE.try_with(|t| {
        for i in 0..SLOTS {
            if t.ids[i].get() == a.shared.cache_id {
                unsafe { (*t.caches[i].get()).drain_all(a) };
            }
        }
    });
}

// ---- What the allocator's statistics and checks see of the caches (all under the lock). ----

/// Add every registered cache's contents (as free memory) and unfolded events to `s`.
#[allow(clippy::needless_range_loop)]
pub(crate) fn add_to_stats(h: &Heap, s: &mut Stats) {
    let mut in_use = h.counters.in_use_pages;
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
        let ev = &c.events;
        s.alloc_calls += ev.alloc_hits.get();
        s.free_calls += ev.free_hits.get();
        s.cache_hits += ev.alloc_hits.get() + ev.free_hits.get();
        s.live_blocks = s.live_blocks.wrapping_add(ev.alloc_hits.get()).wrapping_sub(ev.free_hits.get());
        in_use = in_use.wrapping_add(ev.alloc_pages.get()).wrapping_sub(ev.free_pages.get());
        s.zero_skipped_bytes += ev.zero_skipped_bytes.get();
        s.zeroed_on_alloc_bytes += ev.zeroed_on_alloc_bytes.get();
        s.reused_reported_bytes += ev.reused_reported_bytes.get();
    }
    s.bytes_in_use = in_use << PAGE_SHIFT;
}

/// Invariants 1 and 2 at the top. Reads other threads' entries: call while they are quiet.
pub(crate) fn check(h: &Heap) -> Result<(), String> {
    let mut pages = 0u64;
    let mut net = 0u64;
    let mut err = None;
    for c in h.caches.iter() {
        net = net.wrapping_add(c.events.alloc_pages.get()).wrapping_sub(c.events.free_pages.get());
        let mut gauge = [0u64; 4];
        let mut blocks = [[0u64; MAX_ORDERS]; CLASSES];
        c.for_each_entry(|o, e| {
            let n = 1u32 << o;
            pages += n as u64;
            let Some(ar) = h.arenas.get(e.arena as usize).and_then(|a| a.as_ref()) else {
                err = Some(format!("cached block {:#x}: no arena {}", e.addr, e.arena));
                return;
            };
            let pfn = ar.pfn(e.addr);
            let real = ar.count_states(pfn, n);
            if pfn & (n - 1) != 0 || ar.meta(pfn).tag != Tag::Cached {
                err = Some(format!("cached block {:#x} of order {o}: misaligned or tag {:?}", e.addr, ar.meta(pfn).tag));
            } else if real != e.counts() || (0..n).any(|i| ar.state(pfn + i) == PageState::Allocated) {
                err = Some(format!("cached block {:#x}: entry says {:?}, pages say {real:?}", e.addr, e.counts()));
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
        let (b, g) = c.gauges();
        if g != gauge || b != blocks {
            return Err(format!("cache gauges {g:?} {b:?} disagree with its entries {gauge:?} {blocks:?}"));
        }
    }
    if h.counters.cached_pages.wrapping_sub(net) != pages {
        return Err(format!(
            "cached pages: counter {} - unfolded net hits {} != {pages} in entries",
            h.counters.cached_pages as i64, net as i64
        ));
    }
    Ok(())
}

/// Add the runs of every cached block to `out` (for `Allocator::free_runs`).
pub(crate) fn free_runs(h: &Heap, out: &mut Vec<(usize, usize, PageState)>) {
    for c in h.caches.iter() {
        c.for_each_entry(|o, e| {
            if let Some(ar) = h.arenas.get(e.arena as usize).and_then(|a| a.as_ref()) {
                ar.for_each_run(ar.pfn(e.addr), 1 << o, |p, n, s| {
                    out.push((ar.addr(p), (n as usize) << PAGE_SHIFT, s));
                });
            }
        });
    }
}
