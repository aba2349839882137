//! The locked paths: allocation and free with validation, resize in place, usable size, and
//! growth by a new arena. Everything a per-thread cache does not serve comes here, and so do
//! the caches' refills and drains (cache/batch.rs) for the lists themselves.

use core::ptr::NonNull;
use std::sync::Arc;

use crate::buddy::Buddy;
use crate::error::Error;
use crate::flags::Flags;
use crate::lock::Guard;
use crate::os::{self, PAGE_SHIFT, PAGE_SIZE};
use crate::page::{GranuleStates, PageState, META_LOCKED};

use super::{Heap, Placed, Shared, MAX_ARENAS};

/// How many times (100 us apart, about 150 us with the timer slack) an allocation waits for
/// blocks isolated by a background worker before it reserves a new arena or takes memory that
/// is not resident. (Under `cfg(test)` many more, so that a test that plays the worker is not
/// outrun on a loaded machine.)
#[cfg(not(test))]
const ISOLATION_WAITS: u32 = 20;
#[cfg(test)]
const ISOLATION_WAITS: u32 = 20_000;

/// What the calling thread holds that the locked path may ask back before it faults memory in
/// or grows the heap (its page cache, `cache/`).
pub(crate) trait Reclaim {
    /// Pages held.
    fn held_pages(&mut self) -> u64;
    /// Give them back to the lists; `true` if there were any.
    fn give_back(&mut self) -> bool;
}

impl Shared {
    /// Pages and order for a request, or the reason it can never be served.
    pub(crate) fn shape(&self, size: usize, align: usize) -> Result<(u32, u8), Error> {
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

    /// Allocate on the locked path: take a block from the lists (waiting a little for blocks a
    /// worker isolated, then giving back what `reclaim` can, then growing the heap), then
    /// `prepare` it outside the lock. `reclaim` gives back without the lock, at most once: before
    /// a take would fault memory in when it holds at least the request's pages, else before the
    /// heap grows; then the take is tried again.
    #[inline(never)]
    pub(crate) fn alloc_locked(self: &Arc<Self>, size: usize, align: usize, flags: Flags, reclaim: &mut dyn Reclaim) -> Result<NonNull<u8>, Error> {
        let placed = self.place_locked(size, align, flags, reclaim)?;
        self.prepare(&placed, flags)?;
        // SAFETY: a block address is never null.
        Ok(unsafe { NonNull::new_unchecked(placed.addr as *mut u8) })
    }

    /// `alloc_locked` of a block of `size` bytes (a power of two, aligned to its size) for a span
    /// of small objects, with the states its pages had when taken, by granules of `2^shift`
    /// pages (`GranuleStates`; read after the take settled its huge-page units and before
    /// `prepare` marks the pages allocated): the pages the span never writes keep them when it
    /// goes back (`free_with_states`).
    pub(crate) fn alloc_span_locked(self: &Arc<Self>, size: usize, shift: u32, flags: Flags, reclaim: &mut dyn Reclaim) -> Result<(NonNull<u8>, GranuleStates), Error> {
        let placed = self.place_locked(size, size, flags, reclaim)?;
        let t = &placed.taken;
        let taken = self.states_of(placed.arena).granules(t.pfn, t.npages, shift);
        self.prepare(&placed, flags)?;
        // SAFETY: a block address is never null.
        Ok((unsafe { NonNull::new_unchecked(placed.addr as *mut u8) }, taken))
    }

    /// The take of `alloc_locked`, before `prepare`.
    fn place_locked(self: &Arc<Self>, size: usize, align: usize, flags: Flags, reclaim: &mut dyn Reclaim) -> Result<Placed, Error> {
        let (npages, order) = self.shape(size, align)?;
        let align_pages = (align.max(PAGE_SIZE) >> PAGE_SHIFT) as u32;
        let zero = flags.contains(Flags::ZERO);
        let mut waits = 0u32;
        let mut waiting = false;
        let mut reclaimable = true;
        // Resident memory first: while this thread's cache holds at least the request's pages,
        // a take that would fault memory in gives the cache back first, and is tried again.
        let mut fault_in = reclaim.held_pages() < npages as u64;
        let placed = loop {
            let mut h = self.heap.lock();
            if core::mem::take(&mut waiting) {
                // Saturating: a `fork` from a signal handler during the sleep resets the count
                // in the child, whose thread then comes back here.
                h.isolation_waiters = h.isolation_waiters.saturating_sub(1);
            }
            // A request of a zeroing chunk or more for which no listed block of its size has
            // resident pages would be served from memory never touched or given back (a fault
            // per page: ~550 ms/GiB here), while the zeroing worker may hold just the chunk that
            // splits a mostly resident block of that size. Wait for that chunk instead (it takes
            // 50-80 us).
            let may_wait = waits < ISOLATION_WAITS;
            let for_chunk = may_wait
                && npages as usize >= h.tunables.zero_chunk >> PAGE_SHIFT
                && h.zeroing_holds_part_of(order)
                && !h.has_unreported_merged(order);
            if !for_chunk {
                if let Some(p) = h.take(npages, order, align_pages, zero, fault_in) {
                    break p;
                }
                if !fault_in {
                    // The first take only: `reclaimable` is still set.
                    (fault_in, reclaimable) = (true, false);
                    drop(h);
                    reclaim.give_back();
                    continue;
                }
            }
            // The arena count as this thread found the heap full: `grow` installs nothing if
            // another thread has grown the heap since (then the take is retried first).
            let (isolated, seen) = (h.counters.isolated_pages, h.arenas.len());
            // Nothing free fits, but a background worker holds blocks for a moment (a chunk being
            // zeroed, a batch being reported): wait for them a little (about 3 ms at most) rather than
            // reserve a new arena and fault it in. Only when no other memory is free. Meanwhile
            // the zeroing worker takes no new chunk (`isolation_waiters`).
            if for_chunk || (may_wait && isolated > 0) {
                h.isolation_waiters += 1;
                waiting = true;
                drop(h);
                waits += 1;
                os::sleep_ns(100_000);
                continue;
            }
            drop(h);
            if core::mem::take(&mut reclaimable) && reclaim.give_back() {
                continue;
            }
            self.grow(npages as usize, seen)?;
        };
        Ok(placed)
    }

    /// After the lock: zero what must be zeroed, mark the pages allocated, populate, lock.
    pub(crate) fn prepare(self: &Arc<Self>, p: &Placed, flags: Flags) -> Result<(), Error> {
        let t = &p.taken;
        let states = self.states_of(p.arena);
        let zero = flags.contains(Flags::ZERO);
        let len = (t.npages as usize) << PAGE_SHIFT;
        if zero && t.counts.needs_zeroing(t.npages) > 0 {
            // Opened for this request: a descriptor kept across a `fork` would describe the parent.
            let pagemap = if p.clear_written_only { os::Pagemap::open() } else { None };
            let (mut stored, mut unwritten) = (0u64, 0u64);
            states.for_each_run(t.pfn, t.npages, |start, n, s| {
                if !s.reads_zero() {
                    let addr = p.addr + (((start - t.pfn) as usize) << PAGE_SHIFT);
                    let clear = |at: usize, pages: usize, c: os::Clearing| {
                        if c == os::Clearing::Store {
                            // SAFETY: pages of the run below, inside the block just taken, which the
                            // caller owns and nobody else touches until it is handed out.
                            unsafe { core::ptr::write_bytes(at as *mut u8, 0, pages << PAGE_SHIFT) };
                            stored += pages as u64;
                        } else {
                            unwritten += pages as u64;
                        }
                    };
                    // SAFETY: the run lies inside the block just taken, mapped, which the caller owns
                    // and nobody else touches until it is handed out (private anonymous memory
                    // when `pagemap` is open).
                    unsafe { os::for_each_clearing_run(pagemap.as_ref(), addr, n as usize, clear) };
                }
            });
            if p.clear_written_only {
                let mut h = self.heap.lock();
                h.counters.zeroed_on_alloc_bytes += stored << PAGE_SHIFT;
                h.counters.zero_unwritten_bytes += unwritten << PAGE_SHIFT;
            }
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
                let _ = self.free_locked(p.addr, None);
                return Err(Error::Lock { size: len, errno });
            }
            let mut h = self.heap.lock();
            let a = &mut h.arenas[p.arena];
            let m = a.meta(t.pfn);
            m.set_flags(m.flags() | META_LOCKED);
            h.counters.locked_bytes += len as u64;
        }
        Ok(())
    }

    /// Free the live block at `addr` (of `size` bytes, page-rounded, when given) on the locked,
    /// validating path: a bad address gets the error that says why.
    #[inline(never)]
    pub(crate) fn free_locked(self: &Arc<Self>, addr: usize, size: Option<usize>) -> Result<(), Error> {
        self.free_locked_pages(addr, size).map(|_| ())
    }

    /// `free_locked`, saying which arena the block was in and how many pages it held (its slack
    /// left out).
    pub(crate) fn free_locked_pages(self: &Arc<Self>, addr: usize, size: Option<usize>) -> Result<(usize, u32), Error> {
        let mut h = self.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let actual = (npages as usize) << PAGE_SHIFT;
        if let Some(size) = size {
            if size.div_ceil(PAGE_SIZE) != npages as usize {
                return Err(Error::SizeMismatch { addr, given: size, actual });
            }
        }
        let now = self.now_ms();
        let a = &mut h.arenas[ai];
        let locked = a.meta(pfn).flags() & META_LOCKED != 0;
        if locked {
            // munlock outside the lock; the block stays live (and ours) meanwhile.
            a.meta(pfn).set_flags(a.meta(pfn).flags() & !META_LOCKED);
            h.counters.locked_bytes -= actual as u64;
            drop(h);
            os::munlock(addr, actual);
            h = self.heap.lock();
            // A concurrent second free of the same block (a caller bug) may have won the race.
            let again = h.live_block(addr)?;
            if again != (ai, pfn, npages) {
                return Err(Error::DoubleFree { addr });
            }
        }
        let a = &mut h.arenas[ai];
        let slack = a.release_live(pfn, npages, now);
        self.account_free(h, npages, slack);
        Ok((ai, npages))
    }

    /// `Allocator::free_reported`: free the live block at `addr`, its pages listed `Reported`.
    ///
    /// # Safety
    /// As `Allocator::free_reported`: every page of the block reads zero and is not resident.
    pub(crate) unsafe fn free_reported(self: &Arc<Self>, addr: usize) -> Result<(), Error> {
        self.free_marked(addr, |a, pfn, npages| {
            a.set_states(pfn, npages, PageState::Reported);
            Some(npages as u64)
        })
    }

    /// Free the live block at `addr` with the free states `g` gives its pages (`Dirty` where it
    /// names neither `Reported` nor `Zeroed`): a span of small objects that knows which of its
    /// pages it never wrote (they keep the states they had when taken) and which a trim gave
    /// back (slab/trim.rs; those, `g.given_back`, count as memory given back after use). Taken
    /// on the locked path (the caches keep blocks of one state); with neither mask, as
    /// `free_locked`.
    ///
    /// # Safety
    /// Every page of a granule in `g.reported` lies in the block, reads zero and is not resident
    /// (`MADV_DONTNEED` on private anonymous memory or never touched, not written since); every
    /// page of one in `g.zeroed` lies in the block and reads zero.
    pub(crate) unsafe fn free_with_states(self: &Arc<Self>, addr: usize, g: GranuleStates) -> Result<(), Error> {
        if g.reported | g.zeroed == 0 {
            // All `Dirty`: as any block (listed unmerged, buddy/deferred.rs).
            return self.free_locked(addr, None);
        }
        self.free_marked(addr, |a, pfn, npages| {
            if (g.reported | g.zeroed) & !GranuleStates::all(npages, g.shift) != 0 || npages & ((1 << g.shift) - 1) != 0 {
                return None;
            }
            a.states().fill_granules(pfn, npages, g);
            Some(((g.given_back & g.reported).count_ones() as u64) << g.shift)
        })
    }

    /// Free the live block at `addr` with the free states `mark` gives its pages (it returns how
    /// many it listed `Reported`, or `None` to free the block as `free_locked` does, changing
    /// nothing); a locked block always goes through `free_locked` (its munlock).
    fn free_marked(self: &Arc<Self>, addr: usize, mark: impl FnOnce(&Buddy, u32, u32) -> Option<u64>) -> Result<(), Error> {
        let now = self.now_ms();
        let mut h = self.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let a = &mut h.arenas[ai];
        let reported = if a.meta(pfn).flags() & META_LOCKED != 0 { None } else { mark(a, pfn, npages) };
        let Some(reported) = reported else {
            drop(h);
            return self.free_locked(addr, None);
        };
        let slack = a.release_live_as_set(pfn, npages, now);
        h.counters.freed_reported_pages += reported;
        self.account_free(h, npages, slack);
        Ok(())
    }

    /// After a live block went back on the lists: count it, release the lock, wake a worker if
    /// the free made work for it.
    fn account_free(self: &Arc<Self>, mut h: Guard<'_, Heap>, npages: u32, slack: u32) {
        let c = &mut h.counters;
        c.free_calls += 1;
        c.in_use_pages = c.in_use_pages.wrapping_sub((npages + slack) as u64);
        c.live_blocks = c.live_blocks.wrapping_sub(1);
        if slack != 0 {
            self.slack_held.sub(slack);
        }
        self.wake_workers_after_free(h);
    }

    /// Bytes usable in the live block at `addr` (page-rounded), or `None` if `addr` is not the
    /// start of a live block of this allocator.
    pub(crate) fn usable_size(&self, addr: usize) -> Option<usize> {
        let h = self.heap.lock();
        h.live_block(addr).ok().map(|(_, _, n)| (n as usize) << PAGE_SHIFT)
    }

    /// `Allocator::resize_in_place` of the live block at `addr`.
    pub(crate) fn resize_in_place(self: &Arc<Self>, addr: usize, new_size: usize) -> Result<bool, Error> {
        if new_size == 0 {
            return Err(Error::ZeroSize);
        }
        let new_pages = new_size.div_ceil(PAGE_SIZE);
        let now = self.now_ms();
        let mut h = self.heap.lock();
        let (ai, pfn, npages) = h.live_block(addr)?;
        let a = &mut h.arenas[ai];
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
            if slack != 0 {
                self.slack_held.sub(slack);
            }
        }
        let a = &mut h.arenas[ai];
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
                a.mark_used(pfn + new_pages);
                h.counters.in_use_pages = h.counters.in_use_pages.wrapping_add((new_pages - npages) as u64);
                h.counters.reused_reported_bytes += ((counts.reported + counts.lazy) as u64) << PAGE_SHIFT;
                Ok(true)
            }
        }
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
    pub(crate) fn grow(&self, npages: usize, seen: usize) -> Result<(), Error> {
        let cfg = &self.config;
        let want = if cfg.arena_size == 0 { os::physical_memory() } else { cfg.arena_size };
        let need = npages << PAGE_SHIFT;
        let reserved = crate::arena::reserve_fitting(want, need, cfg.max_order, cfg.backing, cfg.thp);
        let mut h = self.heap.lock();
        if h.arenas.len() != seen {
            drop(h);
            drop(reserved);
            return Ok(());
        }
        let arena = reserved.map_err(|(tried, errno)| Error::OutOfMemory { size: need, tried, errno })?;
        if h.arenas.len() == MAX_ARENAS {
            drop(h); // before the arena, whose drop unmaps it
            return Err(Error::OutOfMemory { size: need, tried: 0, errno: libc::ENOMEM });
        }
        let i = h.arenas.len();
        self.publish(i, &arena);
        debug_assert!(h.arenas.capacity() > i, "the arenas' room is taken at creation");
        h.arenas.push(Buddy::new(arena));
        Ok(())
    }
}
