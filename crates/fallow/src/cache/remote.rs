//! What other threads do to a cache, under the allocator lock: the reporting worker, the zeroing
//! worker (large blocks) and a trim on demand drain the cache of an idle thread (a `membarrier`
//! handshake keeps the owner out); `stats`, `check_invariants` and `free_runs` freeze every
//! cache the same way and read it.

use super::*;

// ---- Draining an idle thread's cache (the reporting worker). ----

/// Pages held by all caches of this allocator (under the lock; racy reads of other threads'
/// gauges, good enough to decide whether to ask them).
pub(crate) fn pages_held(h: &Heap) -> u64 {
    h.caches.iter().map(|c| c.pages.get()).sum()
}

/// Pages of the large blocks (4 and 8 MiB) held by all caches, as `pages_held`.
pub(crate) fn large_pages_held(h: &Heap) -> u64 {
    h.caches.iter().map(|c| c.large_pages()).fold(0, u64::wrapping_add)
}

/// A drain request (`Allocator::request_cache_drain`, the reporter's `caches_step`): a new
/// generation, and every registered cache's `drain_asked` set, so that its next free hit leaves
/// for the out-of-line free, which obeys (`make_room` -> `obey_drain_request`), as does a refill.
/// Under the lock (`h`), as every write of the flag and every read of the generation that
/// decides on it; returns the new generation. The flag sits on the line every hit touches: the
/// free hit reads it there rather than `Shared::hit.drain_generation` (~5% of a 4 KiB pair).
pub(crate) fn ask_to_drain(s: &Shared, h: &Heap) -> u64 {
    let g = s.hit.drain_generation.fetch_add(1, Relaxed) + 1;
    for c in h.caches.iter() {
        c.drain_asked.store(1, Relaxed);
    }
    g
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
///
/// `scope`: the reporter drains whole caches that have not obeyed drain request `generation`
/// (`Shared::hit.drain_generation`); the zeroing worker only the large blocks of caches whose
/// threads have freed no large block since its request (`Shared::large_generation`, noted at
/// each large free: `ThreadCache::seen_large`), so that a thread in a hot loop is never asked
/// for anything (a trim drains as the reporter does). `None`: another drain (a worker's or a
/// trim's) is under way (try again later); else the pages
/// given back.
pub(crate) fn drain_unanswered(s: &Shared, scope: Scope, generation: u64, freed_at_ms: u32) -> Option<u64> {
    let unanswered = |c: &ThreadCache| match scope {
        Scope::All => c.pages.get() > 0 && c.seen_generation.get() < generation,
        Scope::Large => c.limit.get() > c.high && c.seen_large.get() < generation,
    };
    let mut frozen = 0;
    {
        let mut h = s.heap.lock();
        if h.caches.remote_drain {
            return None;
        }
        for c in h.caches.iter() {
            // Generations only grow: a cache that obeyed a later request has answered this one.
            if unanswered(c) {
                c.frozen.store(1, Relaxed);
                frozen += 1;
            }
        }
        if frozen == 0 {
            return Some(0);
        }
        h.caches.remote_drain = true;
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
            continue; // registered after the freeze, or thawed by `lock_owners_out`
        }
        if fenced && c.busy.load(Ordering::Acquire) == 0 {
            // SAFETY: the lock is held, and the owner is kept out: frozen, then seen not busy
            // after `membarrier` (above).
            let e = unsafe { Entries::kept_out(c) };
            e.fold(&mut h);
            let before = e.pages.get();
            match scope {
                Scope::All => {
                    e.drain_all_locked(&mut h, freed_at_ms);
                    c.seen_generation.set(generation);
                    // Answered, unless a later request came meanwhile (its flag stays).
                    if generation == s.hit.drain_generation.load(Relaxed) {
                        c.drain_asked.store(0, Relaxed);
                    }
                }
                Scope::Large => {
                    e.drain_large_locked(&mut h, freed_at_ms);
                    c.seen_large.set(generation);
                }
            }
            pages += before - e.pages.get();
            h.counters.cache_remote_drains += 1;
        }
        c.frozen.store(0, Ordering::Release);
    }
    h.caches.remote_drain = false;
    Some(pages)
}

/// What a worker's `drain_unanswered` takes from idle threads' caches.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Scope {
    /// Everything (the reporter: memory that would otherwise never be reported).
    All,
    /// The large blocks (the zeroing worker: blocks it would otherwise never zero).
    Large,
}

/// In a `fork` child (one thread, the lock held): a worker's drain the fork cut in two left
/// caches frozen and the registry marked busy; nobody would thaw them.
pub(crate) fn thaw_after_fork(h: &mut Heap) {
    h.caches.remote_drain = false;
    for c in h.caches.iter() {
        c.frozen.store(0, Ordering::Release);
    }
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

impl FrozenHeap<'_> {
    /// Every registered cache, its entries readable: the owners are kept out while the lock is
    /// held from the freeze to the thaw.
    pub(crate) fn caches(&self) -> impl Iterator<Item = Entries<'_>> {
        // SAFETY: `FrozenHeap` holds the lock and has every owner kept out (frozen, and seen not
        // busy after `membarrier`, or the caller's own cache: `lock_owners_out`) until it drops.
        self.h.caches.iter().map(|c| unsafe { Entries::kept_out(c) })
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
/// `slack`: the slack pages in live blocks (`Shared::slack_held`).
pub(crate) fn add_to_stats(h: &Heap, slack: u64, s: &mut Stats) {
    let mut in_use = h.counters.in_use_pages;
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
        let ev = &c.events;
        s.zero_skipped_bytes += ev.zero_skipped_bytes.get();
        s.zeroed_on_alloc_bytes += ev.zeroed_on_alloc_bytes.get();
        s.reused_reported_bytes += ev.reused_reported_bytes.get();
    }
    // Another thread's counters are read one after another while it runs: a hit caught between
    // two of its stores may make a sum briefly negative (a free counted before its allocation),
    // and the slack, counted at once, may be ahead of the in-use pages, folded later. Clamp, as
    // the gauges do.
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
    for c in h.caches() {
        net = net.wrapping_add(c.pages.get().wrapping_sub(c.accounted.get()));
        let (mut mine, mut large) = (0u64, 0u64);
        let mut gauge = [0u64; 4];
        let mut blocks = [[0u64; MAX_ORDERS]; CLASSES];
        c.for_each_entry(|o, e, m| {
            let n = 1u32 << o;
            mine += n as u64;
            if c.large(o) {
                large += n as u64;
            }
            let Some(ar) = h.arenas.get(e.arena()) else {
                err = Some(format!("cached block {:#x}: no arena {}", e.addr(), e.arena()));
                return;
            };
            let pfn = ar.pfn(e.addr());
            let real = ar.count_states(pfn, n);
            if pfn & (n - 1) != 0 || ar.meta(pfn).tag() != Tag::Cached {
                err = Some(format!("cached block {:#x} of order {o}: misaligned or tag {:?}", e.addr(), ar.meta(pfn).tag()));
            } else if real != m.counts() || e.mixed() != (real != StateCounts::default()) {
                err = Some(format!("cached block {:#x}: entry says {:?} (mixed {}), pages say {real:?}", e.addr(), m.counts(), e.mixed()));
            } else if (0..m.dirty_below as u32).any(|i| ar.state(pfn + i) != PageState::Dirty) {
                err = Some(format!("cached block {:#x}: its first {} pages are not all dirty", e.addr(), m.dirty_below));
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
        if mine != c.pages.get() || mine - large > c.high || c.limit.get() != c.high + large {
            let (p, l) = (c.pages.get(), c.limit.get());
            return Err(format!("cache holds {mine} pages ({large} in large blocks), says {p}, limit {l}, high mark {}", c.high));
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

/// Give `f` the runs `(address, bytes, state)` of every cached block (for `Allocator::free_runs`;
/// other threads' entries are read, which `FrozenHeap` keeps them out of).
pub(crate) fn free_runs(h: &FrozenHeap<'_>, f: &mut impl FnMut(usize, usize, PageState)) {
    for c in h.caches() {
        c.for_each_entry(|o, e, _| {
            if let Some(ar) = h.arenas.get(e.arena()) {
                ar.for_each_run(ar.pfn(e.addr()), 1 << o, |p, n, s| {
                    f(ar.addr(p), (n as usize) << PAGE_SHIFT, s);
                });
            }
        });
    }
}

