//! Per-thread page caches (seed 002, Linux's per-CPU page lists): the fast path of `alloc` and
//! `free` for blocks up to 4 MiB (8 MiB with `cache_max_order` 11), which takes no lock and does no atomic read-modify-write.
//!
//! This module owns the caches: here their layout (orders served, per-thread counters) and the
//! `enter`/`leave` guard; `entry` a cached block's one-word entry; `stack` each order's two
//! stacks and every access to the entries; `hit` the hit paths of `alloc` and `free` (and the
//! slack path); `hot` the hot block (the block freed last serves the next request it can hold,
//! with slack); `pages` the page path as one call (`alloc_pages`, `free_pages`: what
//! `Allocator::alloc` / `free` are, and how the slab layer takes and gives back its spans); `batch` the refill and drain under the allocator lock and the folding of the
//! counters; `table` the thread-local table that finds a thread's cache of an allocator, and the
//! allocator's list of its caches; `remote` what other threads do to a cache: a worker's drain
//! of an idle one, and what `stats`, `check_invariants` and `free_runs` see of them.
//! It sits on `heap` (the locked allocator) and nothing above it.
//!
//! Design
//! ------
//! A cache belongs to one (thread, allocator) pair. It serves the orders `k <= cache_max_order`
//! up to 9 (2 MiB) whose blocks fit in half of `cache_high_pages` (`2^k <= cache_high_pages / 2`),
//! the stacked orders, which hold at most `cache_high_pages` pages together (the high mark); and
//! when all of those are served, orders 10 and 11 (4 and 8 MiB) too: an order that does not fit
//! in half the high mark is large, holds one block beyond it, and is served off the hit paths
//! (with the defaults a thread holds at most 4 MiB + 4 MiB + 8 MiB). Large blocks are what a
//! thread frees and asks for again in a hot loop: served under the lock, two threads moved the
//! lock's and the free lists' lines between their cores at every call (1.5-3% under glibc's
//! per-thread arenas at 2-8 MiB). For each order it keeps, in one array of
//! `cap(k) = min(cache_high_pages >> k, 256)` entries (one for a large order), two stacks: blocks that need no
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
//! 2. A cache's `pages` is the pages in its entries, those of its stacked orders at most its high
//!    mark; `limit` is the high mark plus the pages of its large blocks.
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
//! The hit path. An allocation hit pops an entry, checks the block record's `HitWord` (one 8-byte
//! load: tag, flags, page count) and stores its order's live word (one 8-byte store), writes the
//! pages' state bytes (one store for up to 8 pages) and bumps two owner-only counters. A free hit
//! finds the arena by a range check, loads the `HitWord`, picks its order's stack by a branch and
//! does the same in reverse. Nothing stored or indexed by is computed from a loaded word (stack.rs,
//! "Dependencies"). Nothing is read that another thread
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
//! Whether any slack page is not dirty is known at the hand-out (the entry is mixed and the
//! slack's counts say so) and kept in the record (`META_SLACK_MIXED`, the counts themselves in
//! the record's `counts`): the free takes them from there (it counts the slack's states for a
//! block above a huge-page unit, whose slack's unit a hand-out may settle afterwards).
//! The locked path gives the slack back by runs (`Buddy::drop_slack`). Slack pages are counted in
//! `slack_pages`, not in the bytes in use (docs/design.md, "Slack"). Slack is less than half the
//! block (under 4 MiB of an 8 MiB one), and only its pages an earlier use wrote are resident.
//! The hot block (hot.rs): the block this thread freed last also serves a request of the two
//! orders below its own, with slack under seven eighths of it; such a block may have a power of two
//! of pages, so a block with slack is told by `META_SLACK`, never by its page count.
//! The slack bound: the process holds at most one live block with slack per thread with a
//! cache, between one and two per online CPU, and the high mark of slack pages per block it
//! allows (`Shared::slack_held`, counted wherever a block with slack is handed out or freed;
//! `Shared::caches_registered`); a request that would pass it takes the locked path, which
//! serves it at its real size. A
//! loop on one block per thread keeps its slack; a program with many live blocks of sizes that
//! are not powers of two (64 KiB-4 MiB at random) holds them at their real size instead of a
//! quarter more on average.
//!
//! Re-entrancy (the preload library). The cache and its table are allocated from the Rust global
//! allocator at a thread's first use, with the allocator lock NOT held. A re-entrant call (the
//! global allocator being fallow itself) finds the thread's state `BUSY` and takes the locked path.
//! After the table's destructor has run, every call takes the locked path.


mod batch;
mod entry;
mod hit;
mod hot;
mod pages;
mod stack;
mod remote;
mod table;

use core::cell::Cell;
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{compiler_fence, AtomicU32, AtomicU64, AtomicU8, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use core::marker::PhantomData;
use core::ops::Deref;

use crate::buddy::{preference, resident_preference};
use crate::buddy::Taken;
use crate::config::Config;
use crate::flags::Flags;
use crate::heap::{ArenaView, CacheList, Heap, Placed, Shared};
use crate::os::PAGE_SHIFT;
use crate::page::{BlockMeta, Class, HitWord, PageState, StateCounts, Tag, CLASSES};
use crate::stats::Stats;

pub(crate) use remote::{add_to_stats, ask_to_drain, check, drain_unanswered, free_runs, large_pages_held, lock_owners_out, pages_held, thaw_after_fork, Scope};
pub use hot::hot_from;
pub(crate) use pages::{alloc_from_hot, alloc_pages, alloc_span_uncached, free_pages};
pub(crate) use table::{current, drain_current, last};
use entry::{Entry, Mixed};
use stack::Stack;

use crate::config::{CACHE_ORDER_LIMIT, CACHE_STACKED_ORDER_MAX};
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
/// (and `max_order`); up to `CACHE_STACKED_ORDER_MAX`, only orders whose block fits in half the high
/// mark, so that a cache drained down to half its high mark always has room for the block being
/// freed.
/// Also returns how many of them (`0..m`) are stacked: those that fit in half the high mark;
/// the others are large.
pub(crate) fn orders_served(cfg: &Config) -> (u32, u32) {
    if !cfg.cache || cfg.cache_high_pages < 2 {
        return (0, 0);
    }
    let fit = (cfg.cache_high_pages / 2).ilog2() as u8;
    let top = if fit >= CACHE_STACKED_ORDER_MAX { CACHE_ORDER_LIMIT } else { fit };
    let orders = cfg.cache_max_order.min(cfg.max_order).min(top) as u32 + 1;
    let stacked = (0..orders).filter(|&o| 1u32 << o <= cfg.cache_high_pages / 2).count();
    (orders, stacked as u32)
}

/// A counter with a single writer, the owning thread: a plain load and store, no `lock` prefix.
/// (The slab layer's per-heap counters are `Owned` too.)
#[derive(Default)]
pub(crate) struct Owned(AtomicU64);

impl Owned {
    pub(crate) const fn new() -> Owned {
        Owned(AtomicU64::new(0))
    }
    #[inline(always)]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    #[inline(always)]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed)
    }
    #[inline(always)]
    pub(crate) fn add(&self, v: u64) {
        self.set(self.get().wrapping_add(v))
    }
    #[inline(always)]
    pub(crate) fn sub(&self, v: u64) {
        self.set(self.get().wrapping_sub(v))
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
    /// Pages in the entries, and what a free hit compares them with: the high mark plus the
    /// pages of the large blocks held (so that `pages + n > limit` says the stacked orders'
    /// pages would pass the high mark; changed with the large blocks, off the hit path).
    pages: Owned,
    limit: Owned,
    /// Hits since the last fold.
    alloc_hits: Owned,
    free_hits: Owned,
    /// The hot block: the entry word of the last block of at least `HOT_MIN_PAGES` freed into
    /// this cache (0: none yet), a hint the out-of-line allocation checks before using it
    /// (hot.rs). Written by the owner's frees only.
    hot: Owned,
    /// A drain request came that this cache has not obeyed: set by the requester, cleared by
    /// whoever obeys it (the owner, or the worker that drains the cache), all under the lock;
    /// the free hit reads it (`ask_to_drain`).
    drain_asked: AtomicU32,
    /// Pages of the largest stacked block: the hit paths serve these only; larger ones take the
    /// out-of-line paths.
    hit_max_pages: u32,
    mixed: *mut Mixed,
    orders: usize,
    stacks: [Stack; MAX_ORDERS],
    // Rarely touched.
    /// The drain generation this cache last obeyed (the owner's, or the worker's while frozen).
    seen_generation: Owned,
    /// Pages of the largest cached block (`1 << (orders - 1)`).
    max_pages: u32,
    /// The high mark (`cache_high_pages`) over the stacked orders `0..stacked`; each order
    /// `stacked..orders` (large) holds one block beyond it.
    high: u64,
    stacked: usize,
    /// `Shared::large_generation` as of this thread's last large free (or the zeroing worker's
    /// drain of its large blocks): a cache that has seen a request answered it.
    seen_large: Owned,
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
    /// The block this thread last freed on the locked path (at least `HOT_MIN_PAGES`): its entry
    /// word (0: none), the most pages it held at that place, and the pages of its last free there,
    /// 0 once a request has gone to the locked path for it (`hot.rs`: the locked hot block).
    locked_hot: Owned,
    locked_hot_pages: Owned,
    locked_hot_last: Owned,
    owner: Weak<Shared>,
    id: u64,
    // The registry's links, read and written under the allocator lock only.
    next: Cell<*mut ThreadCache>,
    prev: Cell<*mut ThreadCache>,
}

const _: () = assert!(core::mem::offset_of!(ThreadCache, hit_max_pages) < 64 && core::mem::offset_of!(ThreadCache, hot) < 64);

impl ThreadCache {
    /// Set up a cache of `a` at `dst`, in place. Built by value, the cache (most of a page) was
    /// made on the stack and copied on its way to the page, which touched 20 KiB of the stack of
    /// every thread that took a page block: that much more resident memory per thread, kept by
    /// glibc's cache of thread stacks.
    ///
    /// # Safety
    /// `dst` is valid for writes of a `ThreadCache` and aligned for it; whatever it held is
    /// overwritten without being dropped.
    unsafe fn init(dst: *mut ThreadCache, a: &Arc<Shared>) {
        let cfg = &a.config;
        let orders = a.hit.cache_orders as usize;
        let stacked = a.hit.cache_stacked_orders as usize;
        // The stacks and batch sizes on the stack (1.4 KiB), the rest written in place.
        let mut stacks: [Stack; MAX_ORDERS] = Default::default();
        let mut batch = [0u32; MAX_ORDERS];
        let mut total = 0u32;
        for o in 0..orders {
            // A stacked order's capacity under the high mark; one block for a large order.
            let cap = if o < stacked { (cfg.cache_high_pages >> o).min(STACK_MAX) } else { 1 };
            stacks[o].base = total;
            stacks[o].cap = cap;
            stacks[o].set_nzero(0);
            stacks[o].alloc_word = HitWord::alloc_word(o as u8);
            stacks[o].freed_word = HitWord::freed_word(o as u8);
            stacks[o].npages = 1 << o;
            batch[o] = (cfg.cache_batch_pages >> o).clamp(1, cap);
            total += cap;
        }
        // The entries and their counts are left unwritten: only those below a stack's size are
        // ever read (each written by its push), so a thread's cache makes resident only the
        // entries it uses. Written whole (14 KiB with the defaults), they were resident in
        // every thread with a cache.
        let entries = Box::into_raw(Box::<[Entry]>::new_uninit_slice(total as usize)).cast::<Entry>();
        for s in &mut stacks[..orders] {
            // SAFETY: `base < total`, the length of the array.
            s.first = unsafe { entries.add(s.base as usize) };
        }
        let mixed = Box::into_raw(Box::<[Mixed]>::new_uninit_slice(total as usize)).cast::<Mixed>();
        // SAFETY: `dst` is valid for writes of a `ThreadCache` (the caller's contract);
        // `write_every_field!` writes each field once through its raw place (no reference to the
        // uninitialised whole) and fails to compile unless it names every field.
        unsafe {
            write_every_field!(dst, ThreadCache {
                entries: entries,
                mixed: mixed,
                pages: Owned::default(),
                limit: Owned(AtomicU64::new(cfg.cache_high_pages as u64)),
                high: cfg.cache_high_pages as u64,
                stacked: stacked,
                seen_large: Owned(AtomicU64::new(a.large_generation.load(Relaxed))),
                alloc_hits: Owned::default(),
                free_hits: Owned::default(),
                busy: AtomicU32::new(0),
                frozen: AtomicU32::new(0),
                // Set again under the lock when the cache is registered (table.rs), so that no
                // request falls in between (`ask_to_drain`).
                seen_generation: Owned(AtomicU64::new(a.hit.drain_generation.load(Relaxed))),
                drain_asked: AtomicU32::new(0),
                hot: Owned::default(),
                orders: orders,
                max_pages: 1 << (orders - 1),
                hit_max_pages: (a.hit.cache_hit_max_bytes >> PAGE_SHIFT) as u32,
                stacks: stacks,
                accounted: Owned::default(),
                batch: batch,
                extra_pages: Default::default(),
                class_blocks: Default::default(),
                events: Events::default(),
                locked_hot: Owned::default(),
                locked_hot_pages: Owned::default(),
                locked_hot_last: Owned::default(),
                owner: Arc::downgrade(a),
                id: a.hit.cache_id,
                next: Cell::new(ptr::null_mut()),
                prev: Cell::new(ptr::null_mut()),
            });
        }
    }

    /// The owner starts using the cache without the lock: `false` if the reporting worker has
    /// frozen it (then the owner takes the locked path). The light side of an asymmetric fence:
    /// a compiler fence here, `membarrier` on the worker's side (see the top).
    /// Called by the owner only (a thread reaches its own caches through its table, `last` and
    /// `current`); `None` if frozen. The `Inside` it returns leaves the cache when dropped.
    #[inline(always)]
    pub(crate) fn enter(&self) -> Option<Inside<'_>> {
        self.busy.store(1, Relaxed);
        compiler_fence(Ordering::SeqCst);
        if self.frozen.load(Ordering::Acquire) != 0 {
            self.busy.store(0, Ordering::Release);
            return None;
        }
        // SAFETY: the caller is the owner (above), and it has set `busy` and then seen `frozen`
        // clear: no other thread touches the entries until `leave` (the reporter drains only a
        // cache it froze and then saw not busy, "Draining an idle thread's cache").
        Some(Inside(unsafe { Entries::kept_out(self) }))
    }

    /// Run `f` on the cache between `enter` and `leave`; `None` if it is frozen.
    #[inline(always)]
    pub(crate) fn inside<R>(&self, f: impl FnOnce(&Entries<'_>) -> R) -> Option<R> {
        let e = self.enter()?;
        Some(f(&e))
    }

    /// The owner is done with the cache (every write of its call is ordered before).
    #[inline(always)]
    fn leave(&self) {
        compiler_fence(Ordering::SeqCst);
        self.busy.store(0, Ordering::Release);
    }

    /// Entries in the arrays: the end of the last order's stack.
    fn nentries(&self) -> usize {
        let s = &self.stacks[self.orders - 1];
        (s.base + s.cap) as usize
    }

    /// Whether order `o` is large: one block beyond the high mark, served off the hit paths.
    #[inline(always)]
    fn large(&self, o: usize) -> bool {
        o >= self.stacked
    }

    /// Pages in the large orders' entries (`limit` is the high mark plus them).
    fn large_pages(&self) -> u64 {
        self.limit.get().wrapping_sub(self.high)
    }

    /// Pages in the stacked orders' entries.
    fn stacked_pages(&self) -> u64 {
        self.pages.get() - self.large_pages()
    }

    /// A block of order `o` (`n` pages) comes into the entries, or leaves them.
    #[inline(always)]
    fn add_pages(&self, o: usize, n: u64) {
        self.pages.add(n);
        if self.large(o) {
            self.limit.add(n);
        }
    }
    #[inline(always)]
    fn sub_pages(&self, o: usize, n: u64) {
        self.pages.sub(n);
        if self.large(o) {
            self.limit.sub(n);
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
}

/// A thread's cache as seen by a thread that may touch its entries and stack sizes: the owner
/// between `enter` and `leave` (`Inside`), or a thread that holds the allocator lock while the
/// owner is kept out (`Entries::kept_out`). Every read or write of the entries is a method of
/// this type (here, `hit.rs`, `batch.rs`), so code that has only a `&ThreadCache` (the registry's
/// walk, the statistics, which read the owner's atomic counters) cannot reach them. Not `Send`:
/// the right it stands for holds in one thread.
pub(crate) struct Entries<'c> {
    c: &'c ThreadCache,
    _one_thread: PhantomData<*const ()>,
}

impl Deref for Entries<'_> {
    type Target = ThreadCache;
    #[inline(always)]
    fn deref(&self) -> &ThreadCache {
        self.c
    }
}

impl<'c> Entries<'c> {
    /// # Safety
    /// No other thread touches `c`'s entries or stack sizes while the result lives: the caller
    /// is the owner inside the cache (`enter`), or holds the allocator lock while the owner is
    /// kept out (frozen, and seen not `busy` after `membarrier`), or is the owner and holds the
    /// allocator lock (any other thread touches the entries only under it, the owner then not
    /// inside).
    #[inline(always)]
    pub(super) unsafe fn kept_out(c: &'c ThreadCache) -> Entries<'c> {
        Entries { c, _one_thread: PhantomData }
    }
}

/// The owner inside its cache (`ThreadCache::enter`): leaves it when dropped.
pub(crate) struct Inside<'c>(Entries<'c>);

impl<'c> Deref for Inside<'c> {
    type Target = Entries<'c>;
    #[inline(always)]
    fn deref(&self) -> &Entries<'c> {
        &self.0
    }
}

impl Drop for Inside<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.c.leave();
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        // SAFETY: `entries` and `mixed` were made in `init` by `Box::into_raw` of boxed slices of
        // `nentries()` uninitialised elements each (freed as such: nothing to drop in them), and
        // are freed only here, once.
        unsafe {
            let n = self.nentries();
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.entries.cast::<MaybeUninit<Entry>>(), n)));
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.mixed.cast::<MaybeUninit<Mixed>>(), n)));
        }
    }
}
