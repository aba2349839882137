//! A cache's stacks: for each order, one array holding two stacks (blocks that need no zeroing
//! grow down from the top, the others up from the bottom), and every read and write of the
//! entries, which only an `Entries` reaches (mod.rs, "Threads and locks").

use super::*;

/// The two stacks of one order, on a cache line of their own (a hit touches one order's).
#[repr(align(64))]
pub(super) struct Stack {
    /// The entry at `base` (the hit paths index the dirty stack from it).
    pub(super) first: *mut Entry,
    /// First index in the entry arrays, and capacity in blocks.
    pub(super) base: u32,
    pub(super) cap: u32,
    /// Dirty stack size (grows up from `base`), zero stack size (grows down from
    /// `base + cap - 1`).
    pub(super) ndirty: Owned,
    pub(super) nzero: Owned,
    /// `cap - nzero`: the dirty stack is full when its size reaches it (one compare on the free
    /// hit path). Set with `nzero`, by `set_nzero`.
    pub(super) dirty_max: Owned,
    /// What an allocation hit puts in bytes 8..16 of the record of a block of this order (its
    /// page count and `Tag::Alloc`, `HitWord::handed_out`), and its page count.
    pub(super) alloc_bits: u64,
    pub(super) npages: u64,
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
    pub(super) fn len(&self) -> u32 {
        (self.ndirty.get() + self.nzero.get()) as u32
    }

    #[inline(always)]
    pub(super) fn set_nzero(&self, nz: u32) {
        self.nzero.set(nz as u64);
        self.dirty_max.set((self.cap - nz) as u64);
    }
}

impl Entries<'_> {
    #[inline(always)]
    pub(super) fn entry(&self, i: u32) -> *mut Entry {
        debug_assert!((i as usize) < self.nentries());
        // SAFETY: `i < nentries()` (callers index inside one stack's `base..base + cap`), the length
        // of the `entries` allocation made in `new`.
        unsafe { self.entries.add(i as usize) }
    }

    #[inline(always)]
    pub(super) fn mixed_at(&self, i: u32) -> *mut Mixed {
        debug_assert!((i as usize) < self.nentries());
        // SAFETY: as in `entry`: `mixed` has the same `nentries()` length as `entries`.
        unsafe { self.mixed.add(i as usize) }
    }

    /// The entry at index `i`, with its counts.
    #[inline(always)]
    pub(super) fn read(&self, i: u32) -> (Entry, Mixed) {
        // SAFETY: `entry(i)` is in bounds; the read is a plain one, by the owner, or by another thread
        // while the owner is kept out: a drain under the lock after the `membarrier` handshake
        // ("Draining an idle thread's cache"), or `check` / `free_runs` through a `FrozenHeap`.
        let e = unsafe { *self.entry(i) };
        // SAFETY: as the read of the entry just above.
        let m = if e.mixed() { unsafe { *self.mixed_at(i) } } else { Mixed::default() };
        (e, m)
    }

    #[inline(always)]
    pub(super) fn write(&self, i: u32, e: Entry, m: Mixed) {
        // SAFETY: `i` is in bounds (see `entry`); only the owner writes entries, between `enter` and
        // `leave`, or under the lock while the owner is kept out (frozen, `busy` 0 after `membarrier`).
        unsafe { *self.entry(i) = e };
        if e.mixed() {
            // SAFETY: as the entry's store above.
            unsafe { *self.mixed_at(i) = m };
        }
    }

    /// Push any block (refill), with the per-state counts of its pages.
    pub(super) fn push(&self, o: usize, addr: usize, arena: usize, counts: StateCounts) {
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
    pub(super) fn pop_dirty(&self, o: usize) -> Option<(Entry, Mixed)> {
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
    pub(super) fn pop_zero(&self, o: usize) -> Option<(Entry, Mixed)> {
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
    pub(super) fn pop(&self, o: usize, zero: bool) -> Option<(Entry, Mixed)> {
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
}
