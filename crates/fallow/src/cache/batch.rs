//! A cache's traffic with the free lists, under the allocator lock and in batches: refill an
//! empty stack, drain over the high mark or on request, give everything back at thread exit,
//! and fold the owner's counters into the allocator's at the same time.

use super::*;

impl Entries<'_> {

    /// Before a free hit: obey a drain request, or drain the cache down to half its high mark
    /// and the stack of order `o` down to half its capacity.
    #[cold]
    #[inline(never)]
    pub(super) fn make_room(&self, a: &Arc<Shared>, o: usize) {
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        if !self.obey_drain_request(a, &mut h, now) {
            self.drain_to_half(&mut h, o, now);
        }
        a.wake_workers_after_free(h);
    }

    /// Under the lock: the stack of order `o` down to half its capacity if it is full, then, for
    /// a stacked order, the stacked orders' pages down to half the high mark, order `o` first,
    /// then the largest (a large order's one block is bounded by its stack alone).
    pub(super) fn drain_to_half(&self, h: &mut Heap, o: usize, now: u32) {
        let s = &self.stacks[o];
        if s.len() == s.cap {
            self.drain_locked(h, o, s.cap.div_ceil(2), now);
        }
        if self.large(o) {
            return;
        }
        let half = self.high / 2;
        let order = core::iter::once(o).chain((0..self.stacked).rev().filter(|&k| k != o));
        for k in order {
            let over = self.stacked_pages().saturating_sub(half);
            if over == 0 {
                break;
            }
            self.drain_locked(h, k, over.div_ceil(1 << k) as u32, now);
        }
    }

    /// Under the lock: give back everything if a drain request came since this cache last
    /// obeyed one. `true` if one had.
    pub(super) fn obey_drain_request(&self, a: &Arc<Shared>, h: &mut Heap, now: u32) -> bool {
        let g = a.hit.drain_generation.load(Relaxed);
        if g == self.seen_generation.get() {
            // A request sets the flag with a new generation, both under the lock.
            debug_assert_eq!(self.drain_asked.load(Relaxed), 0);
            return false;
        }
        self.seen_generation.set(g);
        self.drain_asked.store(0, Relaxed);
        self.drain_all_locked(h, now);
        true
    }

    /// Move up to a batch of blocks of `order` from the free lists into the cache, under one hold
    /// of the lock (first obeying a drain request, and draining the cache to half its high mark
    /// if the batch has no room). `live`: the pages of the request that the first block will
    /// serve (the rest of it is slack, whose pages do not count in how resident it is).
    #[cold]
    pub(super) fn refill(&self, a: &Arc<Shared>, order: u8, live: u32, zero: bool) {
        let o = order as usize;
        let n = 1u32 << order;
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        let mut drained = self.obey_drain_request(a, &mut h, now);
        let large = self.large(o);
        if !large && self.stacked_pages() + n as u64 > self.high {
            self.drain_to_half(&mut h, o, now);
            drained = true;
        }
        // A large order: the cache's smaller large blocks go back first, where they merge with
        // the free blocks beside them, so that the refill's best aligned block may be the one
        // such a block was cut from. A loop of 3-8.25 MiB whose 3.5 MiB request took a 4 MiB
        // block from the start of its 8 MiB region (cached) sent its next 5 MiB request to the
        // 8 MiB block beside it, and then wrote both regions in turn. Only the smaller ones: a
        // larger block holds no piece of the refill's, and giving it back before every refill
        // of a smaller order made a loop of 4 and 8 MiB requests with other frees between them
        // (which move the hot block) take the lock twice a round instead of hitting.
        if large && self.drain_large_below(&mut h, o, now) {
            drained = true;
        }
        // Resident memory first: when no arena lists a block's worth of resident pages, the
        // blocks of the other orders this cache holds go back to the lists before the refill
        // would fault memory in, where they may merge into what it needs.
        let lists_resident = |h: &Heap| {
            h.arenas.iter().any(|a| order <= a.max_order && a.listed().resident_pages() >= n as u64)
        };
        if order >= GROUP_ORDER && self.pages.get() >= n as u64 && !lists_resident(&h) {
            self.drain_all_locked(&mut h, now);
            drained = true;
        }
        let s = &self.stacks[o];
        // A large order's room is its stack (one block); a stacked order's, the high mark's.
        let room = if large { s.cap } else { ((self.high - self.stacked_pages()) >> order) as u32 };
        let want = self.batch[o].min(s.cap - s.len()).min(room);
        let nz0 = s.nzero.get() as u32;
        h.counters.cache_refills += 1;
        let narenas = h.arenas.len();
        let (prefs, resident) = (preference(zero), resident_preference(zero));
        let mut got = 0;
        for ai in 0..narenas {
            let ar = &mut h.arenas[ai];
            if order > ar.max_order {
                continue;
            }
            // From a group up, while the arena lists at least a block's worth of resident pages,
            // resident memory only: a request that no aligned resident block holds goes to the
            // locked path, which takes it at its real size from a run of resident free blocks
            // before it faults memory in (`buddy/span.rs`). Refilled from reported memory, the
            // cache would fault in a whole aligned block while resident memory lay free beside
            // it, unaligned. A block freed on the locked path is listed whole, of its order, when
            // the rest of its aligned block is free (the deferred merge), for the next refill.
            // "Resident" means mostly resident (`take_resident`): a block listed `Dirty` may be
            // a large one merged from a few dirty pages and much reported memory.
            let resident_only = order >= GROUP_ORDER && ar.listed().resident_pages() >= n as u64;
            let classes = if resident_only { &resident[..] } else { &prefs[..] };
            while got < want {
                // Small orders: a whole aligned group of 64 pages at a time when the batch has
                // room for it, so that two threads' blocks do not share a line of state bytes
                // (64 pages) or of block records (2 pages), which every hit writes: two threads
                // doing hits in one line ran at 30-40 ns a pair instead of 15-20. While the
                // arena lists a group's worth of resident pages, only a mostly resident group
                // (`take_resident`), else the blocks of the order below: a group taken in class
                // order split blocks listed `Dirty` that held a few dirty pages and much
                // reported memory, faulting it in while the dirty blocks smaller than a group
                // that random frees leave idled (12,800 live blocks of 16-64 KiB replaced at
                // random held 1,039 MiB against glibc's 514; 894 with this).
                let per_group = 1u32 << GROUP_ORDER.saturating_sub(order);
                if order < GROUP_ORDER && GROUP_ORDER <= ar.max_order && want - got >= per_group {
                    let group = if ar.listed().resident_pages() >= 1 << GROUP_ORDER {
                        ar.take_resident(1 << GROUP_ORDER, GROUP_ORDER, &resident, zero)
                    } else {
                        ar.take_aligned(1 << GROUP_ORDER, GROUP_ORDER, &prefs, zero)
                    };
                    if let Some(t) = group {
                        ar.mark_used(t.pfn + (1 << GROUP_ORDER));
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
                let t = if resident_only {
                    ar.take_resident(if got == 0 { live } else { n }, order, classes, zero)
                } else {
                    ar.take_aligned(n, order, classes, zero)
                };
                let Some(t) = t else { break };
                ar.mark_used(t.pfn + n);
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
        self.add_pages(o, moved);
        self.accounted.add(moved);
        h.counters.cached_pages = h.counters.cached_pages.wrapping_add(moved);
        if drained {
            a.wake_workers_after_free(h);
        }
    }

    /// Give back everything (thread exit, drain request, `drain_thread_cache`).
    pub(super) fn drain_all(&self, a: &Arc<Shared>) {
        let now = a.now_ms();
        let mut h = a.heap.lock();
        self.fold(&mut h);
        self.drain_all_locked(&mut h, now);
        a.wake_workers_after_free(h);
    }

    pub(super) fn drain_all_locked(&self, h: &mut Heap, now: u32) {
        for o in 0..self.orders {
            self.drain_locked(h, o, self.stacks[o].cap, now);
        }
    }

    /// The large orders' blocks only (the zeroing worker's drain of an idle thread's cache, the
    /// give-back before a request above the caches).
    pub(super) fn drain_large_locked(&self, h: &mut Heap, now: u32) {
        self.drain_large_below(h, self.orders, now);
    }

    /// The blocks of the large orders below `below` (a refill of order `below` gives back the
    /// smaller large blocks). `true` if there were any.
    pub(super) fn drain_large_below(&self, h: &mut Heap, below: usize, now: u32) -> bool {
        let mut any = false;
        for o in self.stacked..below {
            any |= self.stacks[o].len() > 0;
            self.drain_locked(h, o, self.stacks[o].cap, now);
        }
        any
    }

    /// Give back the `k` oldest blocks of order `o` (dirty ones first).
    pub(super) fn drain_locked(&self, h: &mut Heap, o: usize, k: u32, now: u32) {
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

    pub(super) fn give_back(&self, h: &mut Heap, o: usize, (e, m): (Entry, Mixed), now: u32) {
        if e.mixed() {
            self.gauge_mixed(m, o, false);
        }
        let n = 1u64 << o;
        self.sub_pages(o, n);
        self.accounted.sub(n);
        h.counters.cached_pages = h.counters.cached_pages.wrapping_sub(n);
        let ar = &mut h.arenas[e.arena()];
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
    pub(super) fn fold(&self, h: &mut Heap) {
        let c = &mut h.counters;
        let (ah, fh) = (self.alloc_hits.get(), self.free_hits.get());
        let net = self.pages.get().wrapping_sub(self.accounted.get());
        c.alloc_calls += ah;
        c.free_calls += fh;
        c.cache_hits += ah + fh;
        c.live_blocks = c.live_blocks.wrapping_add(ah).wrapping_sub(fh);
        c.in_use_pages = c.in_use_pages.wrapping_sub(net);
        c.cached_pages = c.cached_pages.wrapping_add(net);
        self.accounted.set(self.pages.get());
        let ev = &self.events;
        c.zero_skipped_bytes += ev.zero_skipped_bytes.get();
        c.zeroed_on_alloc_bytes += ev.zeroed_on_alloc_bytes.get();
        c.reused_reported_bytes += ev.reused_reported_bytes.get();
        for x in [&self.alloc_hits, &self.free_hits, &ev.zero_skipped_bytes, &ev.zeroed_on_alloc_bytes, &ev.reused_reported_bytes] {
            x.set(0);
        }
    }

    pub(super) fn for_each_entry(&self, mut f: impl FnMut(usize, Entry, Mixed)) {
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
