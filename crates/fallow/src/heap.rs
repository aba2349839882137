//! The allocator: arenas behind one lock, the allocation flags, free with validation, growth,
//! statistics.
//!
//! Locking. One lock (`Shared::heap`) guards every free list, every `BlockMeta` and every state
//! byte of a free page. It is held for bookkeeping only: the memset of a `ZERO` request, the
//! `madvise` of `POPULATE`, the `mlock` of `LOCK`, the `mmap` of a new arena all run after it is
//! released, on pages that the caller already owns. State bytes of pages in a live block belong
//! to the block's owner and are written outside the lock (they are atomics, read under the lock
//! only to classify a bad `free`).
//!
//! Arena table. Arenas are installed once into a fixed table of `MAX_ARENAS` slots and never
//! move or go away before the allocator does, so their address ranges are published in atomics
//! and `owns` is a lock-free range check (the preload library's ownership test).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::arena::{Arena, States};
use crate::buddy::{preference, Taken};
use crate::config::Config;
use crate::error::Error;
use crate::lock::Locked;
use crate::os::{self, PAGE_SHIFT, PAGE_SIZE};
use crate::page::{PageState, StateCounts, Tag, META_FREED_START, META_LOCKED};
use crate::stats::Stats;

pub const MAX_ARENAS: usize = 64;

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
    pub in_use_pages: u64,
    pub live_blocks: u64,
    pub isolated_pages: u64,
}

/// Everything the lock guards.
pub(crate) struct Heap {
    pub arenas: [Option<Arena>; MAX_ARENAS],
    pub narenas: usize,
    pub counters: Counters,
}

/// What code outside the lock may read of an arena.
struct ArenaView {
    base: AtomicUsize,
    len: AtomicUsize,
    states: AtomicUsize,
}

pub(crate) struct Shared {
    pub heap: Locked<Heap>,
    views: [ArenaView; MAX_ARENAS],
    published: AtomicUsize,
    pub config: Config,
    epoch_ns: u64,
}

/// A page allocator. Cloning gives another handle to the same allocator.
#[derive(Clone)]
pub struct Allocator {
    pub(crate) shared: Arc<Shared>,
}

/// A live block as `alloc` placed it: where, how long, and the states its pages had.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placed {
    pub arena: usize,
    pub taken: Taken,
    pub addr: usize,
}

impl Heap {
    fn take(&mut self, npages: u32, order: u8, zero: bool) -> Option<Placed> {
        for ai in 0..self.narenas {
            let a = self.arenas[ai].as_mut().unwrap();
            let got = if order <= a.max_order {
                a.take(npages, order, preference(zero))
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
        c.in_use_pages += t.npages as u64;
        c.live_blocks += 1;
        c.reused_reported_bytes += ((t.counts.reported + t.counts.lazy) as u64) << PAGE_SHIFT;
        if zero {
            let memset = t.counts.needs_zeroing(t.npages) as u64;
            c.zeroed_on_alloc_bytes += memset << PAGE_SHIFT;
            c.zero_skipped_bytes += (t.npages as u64 - memset) << PAGE_SHIFT;
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
        let m = a.meta(pfn);
        if addr & (PAGE_SIZE - 1) == 0 && m.tag == Tag::Alloc {
            return Ok((ai, pfn, m.npages));
        }
        if a.state(pfn) == PageState::Allocated {
            // The nearest live head below owns every allocated page up to it.
            let mut q = pfn as i64;
            while q >= 0 {
                let mq = a.meta(q as u32);
                if mq.tag == Tag::Alloc {
                    if q as u32 + mq.npages > pfn {
                        return Err(Error::InteriorPointer { addr, block: a.addr(q as u32) });
                    }
                    break;
                }
                q -= 1;
            }
            return Err(Error::InvalidPointer { addr });
        }
        if addr & (PAGE_SIZE - 1) == 0 && m.flags & META_FREED_START != 0 {
            return Err(Error::DoubleFree { addr });
        }
        Err(Error::InvalidPointer { addr })
    }
}

impl Allocator {
    pub fn new(config: Config) -> Result<Allocator, Error> {
        config.validate()?;
        const EMPTY: Option<Arena> = None;
        let shared = Shared {
            heap: Locked::new(Heap { arenas: [EMPTY; MAX_ARENAS], narenas: 0, counters: Counters::default() }),
            views: core::array::from_fn(|_| ArenaView {
                base: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                states: AtomicUsize::new(0),
            }),
            published: AtomicUsize::new(0),
            config,
            epoch_ns: os::now_ns(),
        };
        let alloc = Allocator { shared: Arc::new(shared) };
        alloc.grow(0)?;
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
        ((os::now_ns() - self.shared.epoch_ns) / 1_000_000) as u32
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
    pub fn alloc(&self, size: usize, align: usize, flags: Flags) -> Result<NonNull<u8>, Error> {
        let (npages, order) = self.shape(size, align)?;
        let zero = flags.contains(Flags::ZERO);
        let placed = loop {
            if let Some(p) = self.shared.heap.lock().take(npages, order, zero) {
                break p;
            }
            self.grow(npages as usize)?;
        };
        self.prepare(&placed, flags)?;
        Ok(unsafe { NonNull::new_unchecked(placed.addr as *mut u8) })
    }

    /// After the lock: zero what must be zeroed, mark the pages allocated, populate, lock.
    fn prepare(&self, p: &Placed, flags: Flags) -> Result<(), Error> {
        let t = &p.taken;
        let states = self.states_of(p.arena);
        let zero = flags.contains(Flags::ZERO);
        let len = (t.npages as usize) << PAGE_SHIFT;
        if zero && t.counts.needs_zeroing(t.npages) > 0 {
            states.for_each_run(t.pfn, t.npages, |start, n, s| {
                if !s.reads_zero() {
                    let addr = p.addr + (((start - t.pfn) as usize) << PAGE_SHIFT);
                    unsafe { core::ptr::write_bytes(addr as *mut u8, 0, (n as usize) << PAGE_SHIFT) };
                }
            });
        }
        states.fill(t.pfn, t.npages, PageState::Allocated);
        let not_resident = t.counts.reported + t.counts.lazy > 0;
        if flags.contains(Flags::POPULATE) && !flags.contains(Flags::LOCK) && not_resident {
            os::populate_write(p.addr, len);
        }
        if flags.contains(Flags::LOCK) {
            if let Err(errno) = os::mlock(p.addr, len) {
                let _ = self.free(p.addr as *mut u8);
                return Err(Error::Lock { size: len, errno });
            }
            let mut h = self.shared.heap.lock();
            let a = h.arenas[p.arena].as_mut().unwrap();
            a.meta_mut(t.pfn).flags |= META_LOCKED;
            h.counters.locked_bytes += len as u64;
        }
        Ok(())
    }

    /// Free the live block that starts at `ptr`.
    pub fn free(&self, ptr: *mut u8) -> Result<(), Error> {
        self.free_checked(ptr as usize, None)
    }

    /// Free the live block at `ptr`, checking that it holds `size` bytes (page-rounded).
    pub fn free_sized(&self, ptr: *mut u8, size: usize) -> Result<(), Error> {
        self.free_checked(ptr as usize, Some(size))
    }

    fn free_checked(&self, addr: usize, size: Option<usize>) -> Result<(), Error> {
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
        let locked = a.meta(pfn).flags & META_LOCKED != 0;
        if locked {
            // munlock outside the lock; the block stays live (and ours) meanwhile.
            a.meta_mut(pfn).flags &= !META_LOCKED;
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
        a.release_live(pfn, npages, now);
        let c = &mut h.counters;
        c.free_calls += 1;
        c.in_use_pages -= npages as u64;
        c.live_blocks -= 1;
        Ok(())
    }

    /// Free the live block at `ptr` whose pages the caller has already taken from the kernel's
    /// page tables (moved away by `mremap(MREMAP_DONTUNMAP)`, or `MADV_DONTNEED`): they read zero
    /// and are not resident, so they are listed `Reported` rather than `Dirty`. A locked block is
    /// freed as by `free` (its pages were resident).
    pub fn free_reported(&self, ptr: *mut u8) -> Result<(), Error> {
        let addr = ptr as usize;
        let now = self.now_ms();
        let mut h = self.shared.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let a = h.arenas[ai].as_mut().unwrap();
        if a.meta(pfn).flags & META_LOCKED != 0 {
            drop(h);
            return self.free(ptr);
        }
        let m = a.meta_mut(pfn);
        m.tag = Tag::None;
        m.flags = META_FREED_START;
        a.set_states(pfn, npages, PageState::Reported);
        a.free_range(pfn, npages, StateCounts::uniform(PageState::Reported, npages), now);
        let c = &mut h.counters;
        c.free_calls += 1;
        c.in_use_pages -= npages as u64;
        c.live_blocks -= 1;
        Ok(())
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
        let n = self.shared.published.load(Ordering::Acquire);
        self.shared.views[..n]
            .iter()
            .any(|v| addr.wrapping_sub(v.base.load(Ordering::Relaxed)) < v.len.load(Ordering::Relaxed))
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
        if a.meta(pfn).flags & META_LOCKED != 0 && new_pages != npages as usize {
            return Ok(false);
        }
        if new_pages as u64 > a.npages as u64 {
            return Ok(false);
        }
        let new_pages = new_pages as u32;
        if new_pages <= npages {
            if new_pages < npages {
                let tail = npages - new_pages;
                a.meta_mut(pfn).npages = new_pages;
                a.set_states(pfn + new_pages, tail, PageState::Dirty);
                a.free_range(pfn + new_pages, tail, StateCounts::default(), now);
                h.counters.in_use_pages -= tail as u64;
            }
            return Ok(true);
        }
        match a.take_following(pfn, npages, new_pages) {
            None => Ok(false),
            Some(counts) => {
                a.set_states(pfn + npages, new_pages - npages, PageState::Allocated);
                a.meta_mut(pfn).npages = new_pages;
                h.counters.in_use_pages += (new_pages - npages) as u64;
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
        s.bytes_in_use = c.in_use_pages << PAGE_SHIFT;
        s.live_blocks = c.live_blocks;
        s.alloc_calls = c.alloc_calls;
        s.free_calls = c.free_calls;
        s.zero_skipped_bytes = c.zero_skipped_bytes;
        s.zeroed_on_alloc_bytes = c.zeroed_on_alloc_bytes;
        s.reused_reported_bytes = c.reused_reported_bytes;
        s.locked_bytes = c.locked_bytes;
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

    /// Reserve one more arena, large enough for `npages` pages.
    fn grow(&self, npages: usize) -> Result<(), Error> {
        let cfg = &self.shared.config;
        let want = if cfg.arena_size == 0 { os::physical_memory() } else { cfg.arena_size };
        let need = npages << PAGE_SHIFT;
        let arena = Arena::reserve(want.max(need), cfg.max_order, cfg.backing, cfg.thp)
            .map_err(|errno| Error::OutOfMemory { size: need, errno })?;
        let mut h = self.shared.heap.lock();
        if h.narenas == MAX_ARENAS {
            return Err(Error::OutOfMemory { size: need, errno: libc::ENOMEM });
        }
        let i = h.narenas;
        let v = &self.shared.views[i];
        v.base.store(arena.base, Ordering::Relaxed);
        v.len.store(arena.len, Ordering::Relaxed);
        v.states.store(arena.states().raw() as usize, Ordering::Relaxed);
        h.arenas[i] = Some(arena);
        h.narenas += 1;
        self.shared.published.store(h.narenas, Ordering::Release);
        Ok(())
    }

    fn states_of(&self, arena: usize) -> States {
        States::from_raw(self.shared.views[arena].states.load(Ordering::Relaxed) as *const AtomicU8)
    }

    /// Lock the allocator before `fork` (pair with `after_fork_parent` / `after_fork_child`).
    pub fn before_fork(&self) {
        self.shared.heap.raw().lock();
    }

    pub fn after_fork_parent(&self) {
        unsafe { self.shared.heap.raw().unlock() }
    }

    pub fn after_fork_child(&self) {
        unsafe { self.shared.heap.raw().reset_after_fork() }
    }

    /// Check every invariant of the free lists and counters (for tests; walks everything).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let h = self.shared.heap.lock();
        let mut listed_pages = 0u64;
        let mut total = 0u64;
        for (ai, a) in h.arenas[..h.narenas].iter().map(|a| a.as_ref().unwrap()).enumerate() {
            total += a.npages as u64;
            listed_pages += a.check_lists().map_err(|e| format!("arena {ai}: {e}"))?;
        }
        let c = &h.counters;
        if listed_pages + c.in_use_pages + c.isolated_pages != total {
            return Err(format!(
                "pages do not add up: {listed_pages} listed + {} in use + {} isolated != {total}",
                c.in_use_pages, c.isolated_pages
            ));
        }
        Ok(())
    }

    /// Every free page's recorded state, as runs `(address, bytes, state)` (for tests).
    #[doc(hidden)]
    pub fn free_runs(&self) -> Vec<(usize, usize, PageState)> {
        let h = self.shared.heap.lock();
        let mut out = Vec::new();
        for a in h.arenas[..h.narenas].iter().map(|a| a.as_ref().unwrap()) {
            a.for_each_listed(|pfn, order| {
                a.for_each_run(pfn, 1 << order, |p, n, s| {
                    out.push((a.addr(p), (n as usize) << PAGE_SHIFT, s));
                });
            });
        }
        out
    }
}

