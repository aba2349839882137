//! The allocator: arenas behind one lock, the allocation flags, free with validation, growth,
//! statistics.
//!
//! Locking. One lock (`Shared::heap`) guards every free list, the records (`BlockMeta`) of free,
//! isolated and unlisted blocks and every state byte of a free page; a cached block's record
//! word belongs to the cache's owner (docs/design.md, "Access rules", says who may touch what). It is held for bookkeeping only: the memset of a `ZERO` request, the
//! `madvise` of `POPULATE`, the `mlock` of `LOCK`, the `mmap` of a new arena all run after it is
//! released, on pages that the caller already owns. State bytes of pages in a live block belong
//! to the block's owner and are written outside the lock (they are atomics, read under the lock
//! only to classify a bad `free`).
//!
//! Arena table. Arenas are installed once into a fixed table of `MAX_ARENAS` slots and never
//! move or go away before the allocator does, so their address ranges are published in atomics
//! and `owns` is a lock-free range check (the preload library's ownership test).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::arena::{Arena, States};
use crate::buddy::{preference, Taken};
use crate::cache::{self, Registry};
use crate::config::{Config, Tunables};
use crate::error::Error;
use crate::lock::Locked;
use crate::os::{self, PAGE_SHIFT, PAGE_SIZE};
use crate::page::{BlockMeta, Class, PageState, StateCounts, Tag, META_FREED_START, META_LOCKED, META_SLACK};
use crate::stats::{ReclaimCounters, Stats};
use crate::worker::{self, Worker};

pub const MAX_ARENAS: usize = 64;

/// How many times (100 us apart) an allocation that finds nothing free waits for blocks isolated
/// by a background worker before it reserves a new arena.
const ISOLATION_WAITS: u32 = 20;

/// Allocation flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub u32);

impl Flags {
    pub const NONE: Flags = Flags(0);
    /// The contents must read zero.
    pub const ZERO: Flags = Flags(1);
    /// Every page resident on return (`MADV_POPULATE_WRITE`, or a touch per page).
    pub const POPULATE: Flags = Flags(2);
    /// `mlock` the block (implies resident).
    pub const LOCK: Flags = Flags(4);

    #[inline]
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}

/// Counters kept under the lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub alloc_calls: u64,
    pub free_calls: u64,
    pub zero_skipped_bytes: u64,
    pub zeroed_on_alloc_bytes: u64,
    pub reused_reported_bytes: u64,
    pub locked_bytes: u64,
    /// Wrapping (read as signed): a block served by a per-thread cache and freed on the locked
    /// path is subtracted here before the cache's hit is folded in. `stats()` adds the unfolded
    /// hits of every cache, which makes the sum exact.
    pub in_use_pages: u64,
    /// Of `in_use_pages`, the slack of live blocks served by a cache for fewer pages than their
    /// block (cache.rs, "Slack"). Wrapping, as `in_use_pages`.
    pub slack_pages: u64,
    pub live_blocks: u64,
    pub isolated_pages: u64,
    /// Blocks handed out that held reported (or lazily freed) pages.
    pub reported_blocks_reused: u64,
    /// Background-zeroed pages handed to a request that did not ask for zeros (bytes).
    pub zeroed_wasted_bytes: u64,
    /// Pages handed to per-thread caches and not yet drained back, as of the last fold of each
    /// cache's counters (`cache.rs`); wrapping, like `in_use_pages` and `live_blocks`, because a
    /// cache's unfolded hits may move pages either way.
    pub cached_pages: u64,
    pub cache_hits: u64,
    pub cache_refills: u64,
    pub cache_drains: u64,
    /// Caches of idle threads drained by the reporting worker (`cache::drain_unanswered`).
    pub cache_remote_drains: u64,
}

/// Everything the lock guards.
pub(crate) struct Heap {
    pub arenas: [Option<Arena>; MAX_ARENAS],
    pub narenas: usize,
    pub counters: Counters,
    /// Settings of the background workers (changed by `Allocator::set_tunables`).
    pub tunables: Tunables,
    /// What the workers did (report.rs, zero.rs).
    pub reclaim: ReclaimCounters,
    /// Blocks isolated by a worker right now (`Tag::Isolated`, on no list): slots
    /// `0..MAX_REPORT_BATCH` belong to the reporter, `ZERO_SLOT` to the zeroing worker. Kept here
    /// so that a `fork` child, which has no workers, can put them back.
    pub inflight: [Inflight; INFLIGHT],
    /// The per-thread caches of this allocator (`cache.rs`).
    pub caches: Registry,
    /// Largest `ZERO` request, in pages, that prefers a hot dirty block to a zeroed one
    /// (`os::hot_zero_max_bytes`: a sixteenth of the last-level cache).
    pub hot_zero_max_pages: u32,
}

/// One isolated block.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Inflight {
    pub used: bool,
    pub arena: u16,
    pub order: u8,
    pub pfn: u32,
    pub counts: StateCounts,
    pub freed_at_ms: u32,
}

pub(crate) const ZERO_SLOT: usize = crate::config::MAX_REPORT_BATCH as usize;
pub(crate) const INFLIGHT: usize = ZERO_SLOT + 1;

/// What code outside the lock may read of an arena (the per-thread caches' hit path). Aligned
/// to a cache line of its own, so that nothing written under the lock shares it.
#[repr(C, align(64))]
pub(crate) struct ArenaView {
    base: AtomicUsize,
    len: AtomicUsize,
    states: AtomicUsize,
    meta: AtomicUsize,
    /// `meta - (base >> META_ADDR_SHIFT)` and `states - (base >> PAGE_SHIFT)` (wrapping): the
    /// record and the state byte of a page at `addr` are one shift and one add away, without
    /// the page frame number (`meta_of`, `state_of`).
    meta_bias: AtomicUsize,
    states_bias: AtomicUsize,
}

/// A page's record is `(addr - base) >> PAGE_SHIFT` records into the array, i.e.
/// `(addr - base) >> META_ADDR_SHIFT` bytes (both page-aligned, records of 32 bytes).
const META_ADDR_SHIFT: u32 = PAGE_SHIFT - core::mem::size_of::<BlockMeta>().trailing_zeros();
const _: () = assert!(core::mem::size_of::<BlockMeta>().is_power_of_two());

impl ArenaView {
    #[inline(always)]
    pub(crate) fn base(&self) -> usize {
        self.base.load(Ordering::Relaxed)
    }
    #[inline(always)]
    pub(crate) fn states(&self) -> States {
        // SAFETY: views are read only for published arenas (found by `view_of`, or an index below
        // `published`), whose state array `grow` stored here; arenas live as long as the allocator,
        // which the caller holds a handle to while it uses the `States`.
        unsafe { States::from_raw(self.states.load(Ordering::Relaxed) as *const AtomicU8, (self.len.load(Ordering::Relaxed) >> PAGE_SHIFT) as u32) }
    }
    #[inline(always)]
    pub(crate) fn meta(&self) -> *mut BlockMeta {
        self.meta.load(Ordering::Relaxed) as *mut BlockMeta
    }
    /// The page frame of `addr` (in this arena) and its block record.
    #[inline(always)]
    pub(crate) fn record(&self, addr: usize) -> (u32, *mut BlockMeta) {
        let pfn = ((addr - self.base()) >> PAGE_SHIFT) as u32;
        // SAFETY: `addr` lies in this arena (the caller found it with `view_of`), so `pfn` is below its page
        // count and the record lies inside the metadata array published with the view.
        (pfn, unsafe { self.meta().add(pfn as usize) })
    }
    /// The record of the page at `addr` (page-aligned, in this arena): `record` in one shift and
    /// one add.
    #[inline(always)]
    pub(crate) fn meta_of(&self, addr: usize) -> *mut BlockMeta {
        debug_assert!(addr & (PAGE_SIZE - 1) == 0 && addr.wrapping_sub(self.base()) < self.len.load(Ordering::Relaxed));
        self.meta_bias.load(Ordering::Relaxed).wrapping_add(addr >> META_ADDR_SHIFT) as *mut BlockMeta
    }
    /// The state byte of the page at `addr` (page-aligned, in this arena).
    #[inline(always)]
    pub(crate) fn state_of(&self, addr: usize) -> *const AtomicU8 {
        debug_assert!(addr.wrapping_sub(self.base()) < self.len.load(Ordering::Relaxed));
        self.states_bias.load(Ordering::Relaxed).wrapping_add(addr >> PAGE_SHIFT) as *const AtomicU8
    }
}

/// The fields of `Shared` that every hit of the per-thread caches reads, on a cache line that
/// nothing writes but `request_cache_drain` and the installation of an arena.
#[repr(C, align(64))]
pub(crate) struct HitPath {
    /// Arenas published in `views`.
    published: AtomicUsize,
    /// Identity of this allocator for the per-thread caches (never reused in a process).
    pub(crate) cache_id: u64,
    /// How many orders the per-thread caches serve (0: caches off).
    pub(crate) cache_orders: u32,
    /// Largest block they serve, in bytes (0: caches off).
    pub(crate) cache_max_bytes: usize,
    /// Bumped by `request_cache_drain`; a cache that sees a new value drains itself.
    pub(crate) drain_generation: AtomicU64,
}

pub(crate) struct Shared {
    pub heap: Locked<Heap>,
    views: [ArenaView; MAX_ARENAS],
    pub(crate) hit: HitPath,
    pub config: Config,
    epoch_ns: u64,
    /// The free page reporting worker (report.rs) and the zeroing worker (zero.rs).
    pub(crate) reporter: Worker,
    pub(crate) zeroer: Worker,
    /// `Allocator` handles alive (workers hold the `Arc` but no handle): the last handle to go
    /// stops and joins the workers.
    handles: AtomicUsize,
    /// pidfd of this process for `process_madvise` (-1: not opened; -2: not usable).
    pub(crate) pidfd: AtomicI32,
    /// Set by the first `ZERO` request (never cleared): until then the zeroing worker zeroes
    /// nothing but the populated reserve. An atomic because the per-thread caches serve `ZERO`
    /// requests without the lock and fold their counters only at refill and drain.
    pub(crate) zero_requested: AtomicBool,
}

impl Shared {
    /// Milliseconds since the allocator began (the clock of `BlockMeta::freed_at_ms`).
    pub(crate) fn now_ms(&self) -> u32 {
        ((os::now_ns() - self.epoch_ns) / 1_000_000) as u32
    }

    /// A worker's wait for an idle CPU before its next step (`IdleGate::wait`), its naps counted
    /// in `busy_cpu_naps` (the lock is taken only when it napped).
    pub(crate) fn wait_for_idle_cpu(&self, w: &Worker, gate: &mut worker::IdleGate, max_wait_ns: u64) {
        let naps = gate.wait(w, max_wait_ns);
        if naps > 0 {
            self.heap.lock().reclaim.busy_cpu_naps += naps;
        }
    }
}

/// A page allocator. Cloning gives another handle to the same allocator.
pub struct Allocator {
    pub(crate) shared: Arc<Shared>,
}

impl Allocator {
    /// Another handle to `shared`, unless its last handle is already gone (then its workers are
    /// stopped or stopping, and nothing may start them again).
    pub(crate) fn revive(shared: &Arc<Shared>) -> Option<Allocator> {
        let mut n = shared.handles.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return None;
            }
            match shared.handles.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(Allocator { shared: shared.clone() }),
                Err(m) => n = m,
            }
        }
    }
}

impl Clone for Allocator {
    fn clone(&self) -> Allocator {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Allocator { shared: self.shared.clone() }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.stop_workers();
        }
    }
}

/// A live block as `alloc` placed it: where, how long, and the states its pages had.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placed {
    pub arena: usize,
    pub taken: Taken,
    pub addr: usize,
}

impl Heap {
    fn take(&mut self, npages: u32, order: u8, zero: bool, now_ms: u32) -> Option<Placed> {
        // A ZERO request that fits in the CPU cache prefers a block freed within `zero_delay`
        // (hot, never touched by the worker) to a zeroed one (docs/design.md, "Reuse-aware
        // zeroing": up to 2 MiB here the hot block with a memset was mostly 1.1-1.8x faster).
        let hot_since = (zero && npages <= self.hot_zero_max_pages).then(|| now_ms.saturating_sub(self.tunables.zero_delay_ms));
        for ai in 0..self.narenas {
            let a = self.arenas[ai].as_mut().unwrap();
            let got = if order <= a.max_order {
                a.take_preferring_hot(npages, order, preference(zero), hot_since)
            } else {
                a.take_run(npages)
            };
            if let Some(t) = got {
                a.mark_live(t.pfn, t.npages, 0);
                let addr = a.addr(t.pfn);
                self.account_taken(&t, zero);
                return Some(Placed { arena: ai, taken: t, addr });
            }
        }
        None
    }

    fn account_taken(&mut self, t: &Taken, zero: bool) {
        let c = &mut self.counters;
        c.alloc_calls += 1;
        c.in_use_pages = c.in_use_pages.wrapping_add(t.npages as u64);
        c.live_blocks = c.live_blocks.wrapping_add(1);
        c.reused_reported_bytes += ((t.counts.reported + t.counts.lazy) as u64) << PAGE_SHIFT;
        if zero {
            let memset = t.counts.needs_zeroing(t.npages) as u64;
            c.zeroed_on_alloc_bytes += memset << PAGE_SHIFT;
            c.zero_skipped_bytes += (t.npages as u64 - memset) << PAGE_SHIFT;
        } else {
            c.zeroed_wasted_bytes += (t.counts.zeroed as u64) << PAGE_SHIFT;
        }
        if t.counts.reported + t.counts.lazy > 0 {
            c.reported_blocks_reused += 1;
        }
    }

    pub(crate) fn arena_index(&self, addr: usize) -> Option<usize> {
        (0..self.narenas).find(|&i| self.arenas[i].as_ref().unwrap().contains(addr))
    }

    /// Find the live block that starts at `addr`, or say precisely why there is none.
    fn live_block(&self, addr: usize) -> Result<(usize, u32, u32), Error> {
        let ai = self.arena_index(addr).ok_or(Error::InvalidPointer { addr })?;
        let a = self.arenas[ai].as_ref().unwrap();
        let pfn = a.pfn(addr);
        let m = a.meta(pfn).get();
        let aligned = addr & (PAGE_SIZE - 1) == 0;
        match m.tag {
            Tag::Alloc if aligned => return Ok((ai, pfn, m.npages)),
            Tag::Alloc => return Err(Error::InteriorPointer { addr, block: a.addr(pfn) }),
            Tag::None => {}
            // The first page of a free, cached or isolated block.
            _ if aligned && m.flags & META_FREED_START != 0 => return Err(Error::DoubleFree { addr }),
            _ => return Err(Error::InvalidPointer { addr }),
        }
        // Not the first page of any block: the nearest first page below says whose page it is.
        // Records only, never the state bytes, which a live block's owner writes without the
        // lock. The walk ends at the nearest block, at most one block's length away.
        let mut q = pfn;
        while q > 0 {
            q -= 1;
            let mq = a.meta(q);
            let w = mq.word();
            match mq.tag() {
                Tag::None => continue,
                Tag::Alloc if q + w.npages() > pfn => return Err(Error::InteriorPointer { addr, block: a.addr(q) }),
                // The slack of a live block: its records may be stale, flags included.
                Tag::Alloc if w.flags() & META_SLACK != 0 && q + (1u32 << w.order()) > pfn => return Err(Error::InvalidPointer { addr }),
                _ => break,
            }
        }
        // A block that started here was freed, and merged into the free block below.
        if aligned && m.flags & META_FREED_START != 0 {
            return Err(Error::DoubleFree { addr });
        }
        Err(Error::InvalidPointer { addr })
    }
}

impl Allocator {
    /// An allocator with its first arena. Under `RLIMIT_AS` the arena is sized to fit the
    /// address space left (`arena::reserve_fitting`), and when not even one largest block fits,
    /// the largest block is made smaller (down to 2 MiB, order 9) rather than failing:
    /// `config().max_order` and `max_block()` then say what was used.
    pub fn new(mut config: Config) -> Result<Allocator, Error> {
        config.validate()?;
        config.max_order = crate::arena::fitting_max_order(config.max_order, config.max_order.min(9), config.thp);
        const EMPTY: Option<Arena> = None;
        let cache_orders = cache::orders_served(&config);
        let shared = Shared {
            heap: Locked::new(Heap {
                arenas: [EMPTY; MAX_ARENAS],
                narenas: 0,
                counters: Counters::default(),
                tunables: config.tunables.clamped(&config),
                reclaim: ReclaimCounters::default(),
                inflight: [Inflight::default(); INFLIGHT],
                caches: Registry::new(),
                hot_zero_max_pages: (os::hot_zero_max_bytes() >> PAGE_SHIFT) as u32,
            }),
            views: core::array::from_fn(|_| ArenaView {
                base: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                states: AtomicUsize::new(0),
                meta: AtomicUsize::new(0),
                meta_bias: AtomicUsize::new(0),
                states_bias: AtomicUsize::new(0),
            }),
            hit: HitPath {
                published: AtomicUsize::new(0),
                cache_id: cache::new_allocator_id(),
                cache_orders,
                cache_max_bytes: if cache_orders == 0 { 0 } else { PAGE_SIZE << (cache_orders - 1) },
                drain_generation: AtomicU64::new(0),
            },
            epoch_ns: os::now_ns(),
            reporter: Worker::new(b"fallow-report"),
            zeroer: Worker::new(b"fallow-zero"),
            handles: AtomicUsize::new(1),
            pidfd: AtomicI32::new(-1),
            zero_requested: AtomicBool::new(false),
            config,
        };
        let alloc = Allocator { shared: Arc::new(shared) };
        alloc.grow(0, 0)?;
        alloc.start_workers();
        Ok(alloc)
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The largest block, in bytes.
    pub fn max_block(&self) -> usize {
        PAGE_SIZE << self.shared.config.max_order
    }

    /// Milliseconds since the allocator began (the clock of `BlockMeta::freed_at_ms`).
    pub(crate) fn now_ms(&self) -> u32 {
        self.shared.now_ms()
    }

    /// Pages and order for a request, or the reason it can never be served.
    fn shape(&self, size: usize, align: usize) -> Result<(u32, u8), Error> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let max = self.max_block();
        if !align.is_power_of_two() || align > max {
            return Err(Error::BadAlignment { align, max });
        }
        let npages = size.checked_add(PAGE_SIZE - 1).ok_or(Error::TooLarge { size })? >> PAGE_SHIFT;
        if npages >= u32::MAX as usize / 2 {
            return Err(Error::TooLarge { size });
        }
        let npages = npages as u32;
        let size_order = npages.next_power_of_two().trailing_zeros() as u8;
        let align_order = (align.max(PAGE_SIZE) >> PAGE_SHIFT).trailing_zeros() as u8;
        Ok((npages, size_order.max(align_order)))
    }

    /// Allocate `size` bytes aligned to `align` (a power of two up to the largest block).
    ///
    /// Always inlined: the hit path is a few dozen instructions and no call, as a malloc's
    /// thread-cache hit; out of line it would also return its `Result` through memory.
    #[inline(always)]
    pub fn alloc(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        // The hit path (cache.rs): a plain request for an exact power-of-two block of a cached
        // order, served by the cache this thread used last. Everything else goes to `alloc_slow`.
        if flags.0 == 0 {
            if let (Some(order), Some(tc)) = (self.cached_order(size, align), cache::last(self)) {
                // `enter` and `leave` written out rather than `inside`: a closure is a function
                // of its own that the compiler may leave out of line.
                let hit = if tc.enter() {
                    let r = tc.alloc_hit(self, order);
                    tc.leave();
                    r
                } else {
                    None
                };
                if let Some((addr, state)) = hit {
                    // SAFETY: `state` is the first state byte of the block just handed out, an
                    // aligned block of `2^order` pages (`alloc_hit`).
                    unsafe { crate::arena::fill_block(state, 1 << order, PageState::Allocated) };
                    // SAFETY: a block address is never null.
                    return Ok(unsafe { NonNull::new_unchecked(addr as *mut u8) });
                }
            }
        }
        self.alloc_slow(size, align, flags)
    }

    /// The order of the block the caches would serve for `size` and `align`: an exact power of
    /// two of pages, of a cached order, aligned to its size at most.
    #[inline(always)]
    fn cached_order(&self, size: usize, align: usize) -> Option<u8> {
        // `size - 1` below the largest cached block (0 wraps to above it), so `size >= 1`.
        let last = size.wrapping_sub(1);
        if last >= self.shared.hit.cache_max_bytes {
            return None;
        }
        let npages = (last >> PAGE_SHIFT) + 1;
        // A bad alignment (0, not a power of two) goes to the locked path, which reports it.
        // (A page or less always fits: stated first, it folds away for a constant page alignment.)
        let aligned = align.is_power_of_two() && (align <= PAGE_SIZE || align <= npages << PAGE_SHIFT);
        (npages & (npages - 1) == 0 && aligned).then_some(npages.trailing_zeros() as u8)
    }

    #[inline(never)]
    fn alloc_slow(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        // Relaxed: the worker only needs to see it eventually; a load first keeps the line shared.
        if flags.contains(Flags::ZERO) && !self.shared.zero_requested.load(Ordering::Relaxed) {
            self.shared.zero_requested.store(true, Ordering::Relaxed);
        }
        if let Some(p) = self.alloc_cached(size, align, flags) {
            return Ok(p);
        }
        self.alloc_locked(size, align, flags)
    }

    /// The block the caches would serve for `size` and `align`, as `(order, pages)`: the
    /// smallest block of a cached order that holds the request, aligned to its size at most. A
    /// request of fewer pages than the block leaves the rest as slack (cache.rs, "Slack").
    #[inline]
    fn cache_shape(&self, size: usize, align: usize) -> Option<(u8, u32)> {
        let last = size.wrapping_sub(1);
        if last >= self.shared.hit.cache_max_bytes {
            return None;
        }
        let npages = ((last >> PAGE_SHIFT) + 1) as u32;
        let order = npages.next_power_of_two().trailing_zeros() as u8;
        let aligned = align.is_power_of_two() && (align <= PAGE_SIZE || align <= PAGE_SIZE << order);
        aligned.then_some((order, npages))
    }

    /// The fast path (`cache.rs`): a block of a cached order, without `LOCK` (whose bookkeeping
    /// needs the lock), from this thread's cache. `None`: take the locked path (which also
    /// reports bad requests).
    #[inline]
    fn alloc_cached(&self, size: usize, align: usize, flags: Flags) -> Option<NonNull<u8>> {
        if flags.contains(Flags::LOCK) {
            return None;
        }
        let (order, npages) = self.cache_shape(size, align)?;
        let addr = cache::current(self)?.inside(|tc| tc.alloc(self, order, npages, flags))??;
        // SAFETY: a block address is never null.
        Some(unsafe { NonNull::new_unchecked(addr as *mut u8) })
    }

    #[inline(never)]
    fn alloc_locked(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        let (npages, order) = self.shape(size, align)?;
        let zero = flags.contains(Flags::ZERO);
        // The clock only for a ZERO request, the one that may prefer a hot block (`Heap::take`).
        let now = if zero { self.now_ms() } else { 0 };
        let mut waits = 0u32;
        let placed = loop {
            let mut h = self.shared.heap.lock();
            if let Some(p) = h.take(npages, order, zero, now) {
                break p;
            }
            // The arena count as this thread found the heap full: `grow` installs nothing if
            // another thread has grown the heap since (then the take is retried first).
            let (isolated, seen) = (h.counters.isolated_pages, h.narenas);
            drop(h);
            // Nothing free fits, but a background worker holds blocks for a moment (a chunk being
            // zeroed, a batch being reported): wait for them a little (at most ~2 ms) rather than
            // reserve a new arena and fault it in. Only when no other memory is free.
            if isolated > 0 && waits < ISOLATION_WAITS {
                waits += 1;
                os::sleep_ns(100_000);
                continue;
            }
            self.grow(npages as usize, seen)?;
        };
        self.prepare(&placed, flags)?;
        // SAFETY: a block address is never null.
        Ok(unsafe { NonNull::new_unchecked(placed.addr as *mut u8) })
    }

    /// After the lock: zero what must be zeroed, mark the pages allocated, populate, lock.
    pub(crate) fn prepare(&self, p: &Placed, flags: Flags) -> Result<(), Error> {
        let t = &p.taken;
        let states = self.states_of(p.arena);
        let zero = flags.contains(Flags::ZERO);
        let len = (t.npages as usize) << PAGE_SHIFT;
        if zero && t.counts.needs_zeroing(t.npages) > 0 {
            states.for_each_run(t.pfn, t.npages, |start, n, s| {
                if !s.reads_zero() {
                    let addr = p.addr + (((start - t.pfn) as usize) << PAGE_SHIFT);
                    // SAFETY: the run lies inside the block just taken, which the caller owns and nobody else
                    // touches until it is handed out.
                    unsafe { core::ptr::write_bytes(addr as *mut u8, 0, (n as usize) << PAGE_SHIFT) };
                }
            });
        }
        states.fill(t.pfn, t.npages, PageState::Allocated);
        let not_resident = t.counts.reported + t.counts.lazy > 0;
        if flags.contains(Flags::POPULATE) && !flags.contains(Flags::LOCK) && not_resident {
            // SAFETY: the block just taken, mapped read-write, which the caller owns and nobody else
            // touches until it is handed out.
            unsafe { os::populate_write(p.addr, len) };
        }
        if flags.contains(Flags::LOCK) {
            if let Err(errno) = os::mlock(p.addr, len) {
                let _ = self.free(p.addr as *mut u8);
                return Err(Error::Lock { size: len, errno });
            }
            let mut h = self.shared.heap.lock();
            let a = h.arenas[p.arena].as_mut().unwrap();
            let m = a.meta(t.pfn);
            m.set_flags(m.flags() | META_LOCKED);
            h.counters.locked_bytes += len as u64;
        }
        Ok(())
    }

    /// Free the live block that starts at `ptr` (always inlined, as `alloc`).
    #[inline(always)]
    pub fn free(&self, ptr: *mut u8) -> Result<(), Error> {
        self.free_checked(ptr as usize, None)
    }

    /// Free the live block at `ptr`, checking that it holds `size` bytes (page-rounded).
    #[inline(always)]
    pub fn free_sized(&self, ptr: *mut u8, size: usize) -> Result<(), Error> {
        self.free_checked(ptr as usize, Some(size))
    }

    #[inline(always)]
    fn free_checked(&self, addr: usize, size: Option<usize>) -> Result<(), Error> {
        // The hit path: a live block of a cached order goes to the cache this thread used last.
        if let Some(tc) = cache::last(self) {
            if tc.enter() {
                let hit = tc.free_hit(self, addr, size);
                tc.leave();
                if hit {
                    return Ok(());
                }
            }
        }
        self.free_slow(addr, size)
    }

    /// The cache with the checks the hit path skips (attach, drain first), else the validated,
    /// locked path: anything that does not look exactly like a live cached-order block.
    #[inline(never)]
    fn free_slow(&self, addr: usize, size: Option<usize>) -> Result<(), Error> {
        if self.shared.hit.cache_orders > 0 {
            if let Some(tc) = cache::current(self) {
                if tc.inside(|tc| tc.free(self, addr, size)) == Some(true) {
                    return Ok(());
                }
            }
        }
        self.free_locked(addr, size)
    }

    #[inline(never)]
    fn free_locked(&self, addr: usize, size: Option<usize>) -> Result<(), Error> {
        let mut h = self.shared.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let actual = (npages as usize) << PAGE_SHIFT;
        if let Some(size) = size {
            if size.div_ceil(PAGE_SIZE) != npages as usize {
                return Err(Error::SizeMismatch { addr, given: size, actual });
            }
        }
        let now = self.now_ms();
        let a = h.arenas[ai].as_mut().unwrap();
        let locked = a.meta(pfn).flags() & META_LOCKED != 0;
        if locked {
            // munlock outside the lock; the block stays live (and ours) meanwhile.
            a.meta(pfn).set_flags(a.meta(pfn).flags() & !META_LOCKED);
            h.counters.locked_bytes -= actual as u64;
            drop(h);
            os::munlock(addr, actual);
            h = self.shared.heap.lock();
            // A concurrent second free of the same block (a caller bug) may have won the race.
            let again = h.live_block(addr)?;
            if again != (ai, pfn, npages) {
                return Err(Error::DoubleFree { addr });
            }
        }
        let a = h.arenas[ai].as_mut().unwrap();
        let slack = a.release_live(pfn, npages, PageState::Dirty, now);
        self.account_free(h, npages, slack);
        Ok(())
    }

    /// Free the live block at `ptr` whose pages the caller has already taken from the kernel's
    /// page tables (moved away by `mremap(MREMAP_DONTUNMAP)`, or `MADV_DONTNEED`): they read zero
    /// and are not resident, so they are listed `Reported` rather than `Dirty`. A locked block is
    /// freed as by `free` (its pages were resident).
    ///
    /// # Safety
    /// Every page of the block reads zero and is not resident (as the caller says): they are
    /// listed `Reported`, and a later `ZERO` request gets them without a memset, so a page that
    /// still held data would break the promise of `Flags::ZERO` that `alloc_zeroed` callers rely on.
    pub unsafe fn free_reported(&self, ptr: *mut u8) -> Result<(), Error> {
        let addr = ptr as usize;
        let now = self.now_ms();
        let mut h = self.shared.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let a = h.arenas[ai].as_mut().unwrap();
        if a.meta(pfn).flags() & META_LOCKED != 0 {
            drop(h);
            return self.free(ptr);
        }
        let slack = a.release_live(pfn, npages, PageState::Reported, now);
        self.account_free(h, npages, slack);
        Ok(())
    }

    /// After a live block went back on the lists: count it, release the lock, wake a worker if
    /// the free made work for it.
    fn account_free(&self, mut h: crate::lock::Guard<'_, Heap>, npages: u32, slack: u32) {
        let c = &mut h.counters;
        c.free_calls += 1;
        c.in_use_pages = c.in_use_pages.wrapping_sub((npages + slack) as u64);
        c.slack_pages = c.slack_pages.wrapping_sub(slack as u64);
        c.live_blocks = c.live_blocks.wrapping_sub(1);
        self.wake_workers_after_free(h);
    }

    /// Bytes usable in the live block at `ptr` (page-rounded), or `None` if `ptr` is not the start
    /// of a live block of this allocator.
    pub fn usable_size(&self, ptr: *const u8) -> Option<usize> {
        let h = self.shared.heap.lock();
        h.live_block(ptr as usize).ok().map(|(_, _, n)| (n as usize) << PAGE_SHIFT)
    }

    /// Whether `ptr` lies in one of this allocator's arenas (a range check, no lock).
    #[inline]
    pub fn owns(&self, ptr: *const u8) -> bool {
        let addr = ptr as usize;
        self.view_of(addr).is_some()
    }

    /// Resize the live block at `ptr` in place to `new_size` bytes: shrinking gives the tail back,
    /// growing takes the free pages right after the block. `Ok(false)` when the pages after it are
    /// not free (the caller moves the block).
    pub fn resize_in_place(&self, ptr: *mut u8, new_size: usize) -> Result<bool, Error> {
        let addr = ptr as usize;
        if new_size == 0 {
            return Err(Error::ZeroSize);
        }
        let new_pages = new_size.div_ceil(PAGE_SIZE);
        let now = self.now_ms();
        let mut h = self.shared.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let a = h.arenas[ai].as_mut().unwrap();
        if a.meta(pfn).flags() & META_LOCKED != 0 && new_pages != npages as usize {
            return Ok(false);
        }
        if new_pages as u64 > a.npages as u64 {
            return Ok(false);
        }
        let new_pages = new_pages as u32;
        if new_pages != npages {
            // A block with slack becomes an exact block first (its slack back on the lists).
            let slack = a.drop_slack(pfn, now);
            h.counters.in_use_pages = h.counters.in_use_pages.wrapping_sub(slack as u64);
            h.counters.slack_pages = h.counters.slack_pages.wrapping_sub(slack as u64);
        }
        let a = h.arenas[ai].as_mut().unwrap();
        if new_pages <= npages {
            if new_pages < npages {
                let tail = npages - new_pages;
                a.meta(pfn).set_npages(new_pages);
                a.set_states(pfn + new_pages, tail, PageState::Dirty);
                a.free_range(pfn + new_pages, tail, PageState::Dirty, now);
                h.counters.in_use_pages = h.counters.in_use_pages.wrapping_sub(tail as u64);
                self.wake_workers_after_free(h);
            }
            return Ok(true);
        }
        match a.take_following(pfn, npages, new_pages) {
            None => Ok(false),
            Some(counts) => {
                a.set_states(pfn + npages, new_pages - npages, PageState::Allocated);
                a.meta(pfn).set_npages(new_pages);
                h.counters.in_use_pages = h.counters.in_use_pages.wrapping_add((new_pages - npages) as u64);
                h.counters.reused_reported_bytes += ((counts.reported + counts.lazy) as u64) << PAGE_SHIFT;
                Ok(true)
            }
        }
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let h = self.shared.heap.lock();
        let mut s = Stats::default();
        let mut counts = StateCounts::default();
        let mut free_pages = 0u64;
        for a in h.arenas[..h.narenas].iter().map(|a| a.as_ref().unwrap()) {
            for (c, row) in a.listed.blocks.iter().enumerate() {
                for (o, n) in row.iter().enumerate() {
                    s.free_blocks[c][o] += *n as u64;
                }
            }
            counts = counts.plus(a.listed.counts);
            free_pages += a.listed.pages;
            s.reserved_bytes += a.len as u64;
        }
        let c = &h.counters;
        s.arenas = h.narenas as u64;
        s.free_zeroed_pages = counts.zeroed as u64;
        s.free_reported_pages = counts.reported as u64;
        s.free_lazy_pages = counts.lazy as u64;
        s.free_dirty_pages = free_pages - (counts.zeroed + counts.reported + counts.lazy) as u64;
        s.isolated_pages = c.isolated_pages;
        s.live_blocks = c.live_blocks;
        s.alloc_calls = c.alloc_calls;
        s.free_calls = c.free_calls;
        s.zero_skipped_bytes = c.zero_skipped_bytes;
        s.zeroed_on_alloc_bytes = c.zeroed_on_alloc_bytes;
        s.reused_reported_bytes = c.reused_reported_bytes;
        s.locked_bytes = c.locked_bytes;
        s.reported_blocks_reused = c.reported_blocks_reused;
        s.zeroing_wasted_bytes = c.zeroed_wasted_bytes + h.reclaim.zeroed_then_reported_bytes;
        h.reclaim.fill(&mut s);
        s.cache_hits = c.cache_hits;
        s.cache_refills = c.cache_refills;
        s.cache_drains = c.cache_drains;
        s.cache_remote_drains = c.cache_remote_drains;
        cache::add_to_stats(&h, &mut s);
        s
    }

    /// The memfd behind each arena, for `Backing::Memfd` (another process maps it to share the
    /// memory): `(arena base address, fd)`.
    pub fn arena_fds(&self) -> Vec<(usize, i32)> {
        let h = self.shared.heap.lock();
        h.arenas[..h.narenas]
            .iter()
            .map(|a| a.as_ref().unwrap())
            .filter(|a| a.fd >= 0)
            .map(|a| (a.base, a.fd))
            .collect()
    }

    /// Reserve one more arena, large enough for `npages` pages, for a caller that found the heap
    /// full when it held `seen` arenas.
    ///
    /// The reservation runs outside the lock, so threads that find the heap full together all
    /// get here: each re-checks under the lock, and only the first installs its arena. The others
    /// unmap theirs (after releasing the lock) and return `Ok` without installing, so that their
    /// caller retries its take in the arena just installed and grows again only if that cannot
    /// serve it (at most `MAX_ARENAS` installs, so this ends). A failed reservation is not an error
    /// either when another thread grew the heap meanwhile (under `RLIMIT_AS` the racers'
    /// reservations compete for the same room). Go's `mheap.grow` and jemalloc's `ecache_grow`
    /// serialize growth by holding a lock across it; here the lock is held for bookkeeping only.
    fn grow(&self, npages: usize, seen: usize) -> Result<(), Error> {
        let cfg = &self.shared.config;
        let want = if cfg.arena_size == 0 { os::physical_memory() } else { cfg.arena_size };
        let need = npages << PAGE_SHIFT;
        let reserved = crate::arena::reserve_fitting(want, need, cfg.max_order, cfg.backing, cfg.thp);
        let mut h = self.shared.heap.lock();
        if h.narenas != seen {
            drop(h);
            drop(reserved);
            return Ok(());
        }
        let arena = reserved.map_err(|(tried, errno)| Error::OutOfMemory { size: need, tried, errno })?;
        if h.narenas == MAX_ARENAS {
            drop(h); // before the arena, whose drop unmaps it
            return Err(Error::OutOfMemory { size: need, tried: 0, errno: libc::ENOMEM });
        }
        let i = h.narenas;
        let v = &self.shared.views[i];
        v.base.store(arena.base, Ordering::Relaxed);
        v.len.store(arena.len, Ordering::Relaxed);
        v.states.store(arena.states().raw() as usize, Ordering::Relaxed);
        v.meta.store(arena.meta_raw() as usize, Ordering::Relaxed);
        let (meta, states) = (arena.meta_raw() as usize, arena.states().raw() as usize);
        v.meta_bias.store(meta.wrapping_sub(arena.base >> META_ADDR_SHIFT), Ordering::Relaxed);
        v.states_bias.store(states.wrapping_sub(arena.base >> PAGE_SHIFT), Ordering::Relaxed);
        h.arenas[i] = Some(arena);
        h.narenas += 1;
        self.shared.hit.published.store(h.narenas, Ordering::Release);
        Ok(())
    }

    pub(crate) fn states_of(&self, arena: usize) -> States {
        self.shared.views[arena].states()
    }

    /// The published view of arena `i` (no lock).
    #[inline(always)]
    pub(crate) fn view(&self, i: usize) -> &ArenaView {
        &self.shared.views[i]
    }

    /// The arena holding `addr` and its view, without the lock.
    ///
    /// The first arena, which holds most blocks, is checked inline (the free hit path) and the
    /// others out of line. It needs no load of `published`: `Allocator::new` installs it before
    /// any handle exists, so every thread that holds one sees its view.
    #[inline(always)]
    pub(crate) fn view_of(&self, addr: usize) -> Option<(usize, &ArenaView)> {
        if let Some(v) = self.first_view_of(addr) {
            return Some((0, v));
        }
        self.view_of_others(addr)
    }

    /// The first arena's view if it holds `addr` (see `view_of`).
    #[inline(always)]
    pub(crate) fn first_view_of(&self, addr: usize) -> Option<&ArenaView> {
        let v = &self.shared.views[0];
        (addr.wrapping_sub(v.base()) < v.len.load(Ordering::Relaxed)).then_some(v)
    }

    /// `view_of` for the arenas after the first.
    #[inline(never)]
    fn view_of_others(&self, addr: usize) -> Option<(usize, &ArenaView)> {
        let n = self.shared.hit.published.load(Ordering::Acquire).min(MAX_ARENAS);
        for (i, v) in self.shared.views[..n].iter().enumerate().skip(1) {
            if addr.wrapping_sub(v.base()) < v.len.load(Ordering::Relaxed) {
                return Some((i, v));
            }
        }
        None
    }

    /// Ask every thread's cache of this allocator to drain back to the free lists (for the
    /// reporting worker, when memory has been idle past its delay). Each thread does so at its
    /// next allocation or free on this allocator; a cache never holds more than the bound stated
    /// in docs/design.md ("Per-thread caches").
    pub fn request_cache_drain(&self) {
        self.shared.hit.drain_generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Drain the calling thread's cache of this allocator back to the free lists now.
    pub fn drain_thread_cache(&self) {
        cache::drain_current(self);
    }

    /// Lock the allocator before `fork` (pair with `after_fork_parent` / `after_fork_child`, as
    /// `pthread_atfork` handlers). Calling it twice in a row without either deadlocks.
    pub fn before_fork(&self) {
        self.shared.heap.raw().lock();
    }

    /// In the parent after `fork`: release the lock `before_fork` took.
    ///
    /// # Safety
    /// The calling thread called `before_fork` on this allocator and has not released the lock
    /// since (by `after_fork_parent`): otherwise this releases a lock another thread holds, and
    /// two threads then change the free lists at once.
    pub unsafe fn after_fork_parent(&self) {
        // SAFETY: the caller's contract: `before_fork` took the lock in this thread, and this is
        // its parent-side release.
        unsafe { self.shared.heap.raw().unlock() }
    }

    /// In the child: the lock is free again, the workers do not exist here. Blocks they had
    /// isolated go back on the lists in the states they had before (a conservative choice: a
    /// reported or zeroed page recorded as dirty costs a memset at worst). The workers restart
    /// when a free next makes work for them, or at `start_workers`.
    ///
    /// # Safety
    /// Only in the child of a `fork`, before it starts any thread, and only when the parent's
    /// forking thread called `before_fork` on this allocator just before the `fork` (so that no
    /// other thread was changing it when the address space was copied).
    pub unsafe fn after_fork_child(&self) {
        // SAFETY: the caller's contract: the child has one thread, this one, whose parent took the
        // lock in `before_fork`.
        unsafe { self.shared.heap.raw().reset_after_fork() }
        let s = &*self.shared;
        s.reporter.forget_after_fork();
        s.zeroer.forget_after_fork();
        let fd = s.pidfd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the swap took the allocator's pidfd out of `pidfd`, so nobody else uses or closes it.
            unsafe { os::close(fd) };
        }
        let mut h = s.heap.lock();
        for slot in 0..INFLIGHT {
            if h.inflight[slot].used {
                h.unisolate(slot, |st| st);
            }
        }
    }

    /// Check every invariant of the free lists and counters (for tests; walks everything). Other
    /// threads are kept out of their per-thread caches meanwhile (`membarrier`); an error says so
    /// when that cannot be done.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let Some(h) = cache::lock_owners_out(self) else {
            return Err("cannot keep other threads out of their caches (busy for 1 s, or no membarrier)".into());
        };
        let mut listed_pages = 0u64;
        let mut total = 0u64;
        for (ai, a) in h.arenas[..h.narenas].iter().map(|a| a.as_ref().unwrap()).enumerate() {
            total += a.npages as u64;
            listed_pages += a.check_lists().map_err(|e| format!("arena {ai}: {e}"))?;
        }
        let c = &h.counters;
        let inflight: u64 = h.inflight.iter().filter(|r| r.used).map(|r| 1u64 << r.order).sum();
        if inflight != c.isolated_pages {
            return Err(format!("{inflight} pages in flight but isolated_pages = {}", c.isolated_pages));
        }
        for r in h.inflight.iter().filter(|r| r.used) {
            if h.arena(r.arena as usize).meta(r.pfn).tag() != Tag::Isolated {
                return Err(format!("in-flight block {} is not tagged isolated", r.pfn));
            }
        }
        // Wrapping: a cache's unfolded hits move pages between `in_use` and `cached` (cache.rs).
        let sum = listed_pages.wrapping_add(c.in_use_pages).wrapping_add(c.cached_pages).wrapping_add(c.isolated_pages);
        if sum != total {
            return Err(format!(
                "pages do not add up: {listed_pages} listed + {} in use + {} cached + {} isolated != {total}",
                c.in_use_pages as i64, c.cached_pages as i64, c.isolated_pages
            ));
        }
        cache::check(&h)
    }

    /// Every free page's recorded state, as runs `(address, bytes, state)` (for tests). Other
    /// threads are kept out of their per-thread caches meanwhile, as by `check_invariants`.
    ///
    /// # Panics
    /// When that cannot be done (a thread stayed inside its cache for a second, or no `membarrier`).
    #[doc(hidden)]
    pub fn free_runs(&self) -> Vec<(usize, usize, PageState)> {
        let h = cache::lock_owners_out(self).expect("free_runs: cannot keep other threads out of their caches");
        let mut out = Vec::new();
        for a in h.arenas[..h.narenas].iter().map(|a| a.as_ref().unwrap()) {
            a.for_each_listed(|pfn, order| {
                a.for_each_run(pfn, 1 << order, |p, n, s| {
                    out.push((a.addr(p), (n as usize) << PAGE_SHIFT, s));
                });
            });
        }
        cache::free_runs(&h, &mut out);
        out
    }
}


// ---- Background workers: isolation, tunables, start/stop (see report.rs, zero.rs, worker.rs) ----

/// Whether a worker whose word reads `word` is asleep with nothing to do (or absent in a `fork`
/// child and due for a restart), so that a free that creates work must wake it.
#[inline]
fn asleep(w: &Worker, word: u32) -> bool {
    word == worker::IDLE || (word == worker::ABSENT && w.restart_wanted.load(Ordering::Relaxed))
}

impl Heap {
    pub(crate) fn arena(&self, ai: usize) -> &Arena {
        self.arenas[ai].as_ref().unwrap()
    }

    /// Whether some listed block of order >= `order` has pages not yet reported.
    pub(crate) fn has_unreported(&self, order: u8) -> bool {
        let mask = !0u64 << order;
        (0..self.narenas).any(|i| {
            let a = self.arena(i);
            (a.nonempty[Class::Dirty as usize] | a.nonempty[Class::Zeroed as usize]) & mask != 0
        })
    }

    /// Whether some listed block of order >= `order` has pages that need zeroing.
    pub(crate) fn has_dirty(&self, order: u8) -> bool {
        let mask = !0u64 << order;
        (0..self.narenas).any(|i| self.arena(i).nonempty[Class::Dirty as usize] & mask != 0)
    }

    /// Free pages that are resident (dirty, zeroed; lazily freed ones are not counted), and of
    /// them the zeroed ones.
    pub(crate) fn resident_free_pages(&self) -> (u64, u64) {
        let (mut resident, mut zeroed) = (0u64, 0u64);
        for i in 0..self.narenas {
            let l = &self.arena(i).listed;
            resident += l.pages - (l.counts.reported + l.counts.lazy) as u64;
            zeroed += l.counts.zeroed as u64;
        }
        (resident, zeroed)
    }

    /// Take the listed free block at `pfn` of arena `ai` off its list and record it in `slot`.
    pub(crate) fn isolate(&mut self, slot: usize, ai: usize, pfn: u32) -> Inflight {
        let a = self.arenas[ai].as_mut().unwrap();
        let m = a.meta(pfn).get();
        debug_assert_eq!(m.tag, Tag::Free);
        a.unlink(pfn);
        a.meta(pfn).set_tag(Tag::Isolated);
        let rec = Inflight {
            used: true,
            arena: ai as u16,
            order: m.order,
            pfn,
            counts: m.counts,
            freed_at_ms: m.freed_at_ms,
        };
        self.finish_isolate(slot, rec)
    }

    /// Take a piece of order `order` out of the listed free block at `pfn` (of a larger or equal
    /// order), choosing at each split the half that still has pages needing zeroing, and listing
    /// the other halves again. Records the piece in `slot`.
    pub(crate) fn isolate_dirty_piece(&mut self, slot: usize, ai: usize, pfn: u32, order: u8) -> Inflight {
        let a = self.arenas[ai].as_mut().unwrap();
        let m = a.meta(pfn).get();
        a.unlink(pfn);
        let (p, counts) =
            a.split_down(pfn, m.order, m.counts, order, m.freed_at_ms, |low, _, half| low.needs_zeroing(half) == 0);
        a.meta(p).set_isolated(order);
        let rec = Inflight { used: true, arena: ai as u16, order, pfn: p, counts, freed_at_ms: m.freed_at_ms };
        self.finish_isolate(slot, rec)
    }

    fn finish_isolate(&mut self, slot: usize, rec: Inflight) -> Inflight {
        debug_assert!(!self.inflight[slot].used);
        self.inflight[slot] = rec;
        self.counters.isolated_pages += 1u64 << rec.order;
        rec
    }

    /// Return the block in `slot` to the free lists, each page's state rewritten by `new_state`
    /// (applied to maximal runs of equal state), merging with free buddies as usual. Returns the
    /// counts the pages had while isolated.
    pub(crate) fn unisolate(&mut self, slot: usize, new_state: impl Fn(PageState) -> PageState) -> StateCounts {
        let rec = self.inflight[slot];
        debug_assert!(rec.used);
        self.inflight[slot].used = false;
        let a = self.arenas[rec.arena as usize].as_mut().unwrap();
        let n = 1u32 << rec.order;
        let counts = match rec.counts.uniform_state(n) {
            // The common case (a whole dirty block reported, a dirty chunk zeroed): one state
            // before, one after, one fill of the state bytes and no scan under the lock.
            Some(s) => {
                let t = new_state(s);
                if t != s {
                    a.set_states(rec.pfn, n, t);
                }
                StateCounts::uniform(t, n)
            }
            None => Self::rewrite_mixed(a, rec.pfn, rec.order, &new_state),
        };
        a.meta(rec.pfn).set_tag(Tag::None);
        a.free_block(rec.pfn, rec.order, counts, rec.freed_at_ms);
        self.counters.isolated_pages -= n as u64;
        rec.counts
    }

    /// `unisolate` of a block whose pages are in several states: rewrite them run by run, count
    /// them, and rebuild the half records if the result is still mixed.
    fn rewrite_mixed(a: &mut Arena, pfn: u32, order: u8, new_state: &impl Fn(PageState) -> PageState) -> StateCounts {
        let n = 1u32 << order;
        let mut runs: [(u32, u32, PageState); 32] = [(0, 0, PageState::Dirty); 32];
        let mut nruns = 0;
        let mut rewrote_all = true;
        a.for_each_run(pfn, n, |start, len, s| {
            let t = new_state(s);
            if t != s {
                if nruns < runs.len() {
                    runs[nruns] = (start, len, t);
                    nruns += 1;
                } else {
                    rewrote_all = false;
                }
            }
        });
        for &(start, len, t) in &runs[..nruns] {
            a.set_states(start, len, t);
        }
        if !rewrote_all {
            // Many runs: one page at a time.
            for p in pfn..pfn + n {
                let s = a.state(p);
                a.states().set(p, new_state(s));
            }
        }
        let mut counts = a.count_states(pfn, n);
        if counts.uniform_state(n).is_none() {
            // Mixed after the worker's changes: the half records must describe the new states.
            counts = a.rebuild_records(pfn, order);
        }
        counts
    }
}

impl Allocator {
    /// The current settings of the background workers (orders and chunk clamped to the largest
    /// block).
    pub fn tunables(&self) -> Tunables {
        self.shared.heap.lock().tunables
    }

    /// Change the settings of the background workers at run time (validated: a bad value is an
    /// error naming the setting and its accepted range, and changes nothing). Starts a worker
    /// that is switched on; one switched off finishes its batch and sleeps.
    pub fn set_tunables(&self, t: Tunables) -> Result<(), Error> {
        t.validate(&self.shared.config)?;
        self.shared.heap.lock().tunables = t.clamped(&self.shared.config);
        self.shared.reporter.kick();
        self.shared.zeroer.kick();
        self.start_workers();
        Ok(())
    }

    /// Start the workers that are switched on and not running (also after `fork`, in the child).
    pub fn start_workers(&self) {
        let t = self.tunables();
        if t.report {
            self.start(&self.shared.reporter);
        }
        if t.zeroing {
            self.start(&self.shared.zeroer);
        }
    }

    fn start(&self, w: &Worker) {
        if w.running() || !w.claim_start() {
            return;
        }
        let entry: worker::Entry = if core::ptr::eq(w, &self.shared.reporter) {
            crate::report::thread_main
        } else {
            crate::zero::thread_main
        };
        let arg = Arc::into_raw(self.shared.clone()) as *mut libc::c_void;
        if w.start(entry, arg).is_err() {
            // No thread: nothing runs in the background, the allocator works as without workers.
            // SAFETY: `arg` came from `Arc::into_raw` just above and no thread was created to own it.
            drop(unsafe { Arc::from_raw(arg as *const Shared) });
            w.release_claim();
        } else {
            w.restart_wanted.store(false, Ordering::Relaxed);
        }
    }

    /// After a free (any path that puts memory on the lists): release the lock, and wake a
    /// worker only if it sleeps idle and the free made work for it. Costs two relaxed loads when
    /// the workers are busy; a `FUTEX_WAKE` (outside the lock) only on the idle-to-busy edge.
    pub(crate) fn wake_workers_after_free(&self, h: crate::lock::Guard<'_, Heap>) {
        let s = &*self.shared;
        let report_word = s.reporter.word.load(Ordering::Relaxed);
        let zero_word = s.zeroer.word.load(Ordering::Relaxed);
        if report_word == worker::RUNNING && zero_word == worker::RUNNING {
            return;
        }
        let t = &h.tunables;
        let wake_report = asleep(&s.reporter, report_word) && t.report && h.has_unreported(t.report_order);
        let wake_zero = asleep(&s.zeroer, zero_word) && t.zeroing && h.has_dirty(t.zero_order);
        drop(h);
        if wake_report {
            self.wake(&s.reporter);
        }
        if wake_zero {
            self.wake(&s.zeroer);
        }
    }

    fn wake(&self, w: &Worker) {
        if w.word.load(Ordering::Relaxed) == worker::ABSENT {
            self.start(w);
        } else {
            w.wake_idle();
        }
    }

    fn stop_workers(&self) {
        self.shared.reporter.stop_and_join();
        self.shared.zeroer.stop_and_join();
        let fd = self.shared.pidfd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the swap took the allocator's pidfd out of `pidfd`, and the workers that used it
            // are joined.
            unsafe { os::close(fd) };
        }
    }

    /// Whether the background workers are running in this process: `(reporter, zeroer)`.
    pub fn workers_running(&self) -> (bool, bool) {
        (self.shared.reporter.running(), self.shared.zeroer.running())
    }
}
