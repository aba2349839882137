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
    /// The record words of a block of this order that a hit hands out and that a hit takes back
    /// (`HitWord::alloc_word`, `HitWord::freed_word`), and its page count.
    pub(super) alloc_word: HitWord,
    pub(super) freed_word: HitWord,
    pub(super) npages: u64,
}

const _: () = assert!(core::mem::size_of::<Stack>() == 64);

impl Default for Stack {
    fn default() -> Stack {
        Stack {
            first: ptr::null_mut(),
            base: 0,
            cap: 0,
            ndirty: Owned::default(),
            nzero: Owned::default(),
            dirty_max: Owned::default(),
            alloc_word: HitWord::alloc_word(0),
            freed_word: HitWord::freed_word(0),
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

// ---- Dependencies. ----
//
// In a loop that frees a block and asks for one of the same size again, the free hit loads the
// block's record word that the allocation hit has just stored, and the next allocation hit loads
// what the free stored. Whatever is computed from such a load waits for the store before it to
// be forwarded; when that is an address (the stack of the block's order: its size, its entries)
// every access through it waits too, and the waits chain from one pair to the next. So the hit
// paths compute nothing they store or index by from a loaded record word: the words they store
// are per-order constants (`Stack::alloc_word`, `freed_word`), and the free hit picks its stack by
// a branch on the order (`stack_by_branch`), which the processor predicts, instead of by an index.
// `bench scale` at 4 KiB, one thread, on an Intel Xeon VM: 11.3 ns a pair before, 6.9 with the
// branch, 5.9 with the constant words and the first arena's view as a constant (hit.rs)
// (docs/measurements.md, "Dependencies on the hit path"). A one-page block, the commonest, skips
// the branch: hit.rs tells it by one compare of its word and pushes it on order 0's stack.

/// `x`, which the compiler can no longer see through: an empty `asm!` that takes and gives back
/// the register. It keeps the arms of `stack_by_branch`, which differ only in a constant, from
/// being folded back into an index computed from the order.
#[inline(always)]
fn opaque(x: usize) -> usize {
    #[allow(unused_mut)]
    let mut x = x;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    // SAFETY: the template is a comment: it reads and writes no memory, no stack and no flags,
    // and leaves the register that holds `x` unchanged.
    unsafe {
        core::arch::asm!("/* {0} */", inout(reg) x, options(pure, nomem, nostack, preserves_flags))
    };
    x
}

/// `stack_by_branch` has one arm per stacked order.
const _: () = assert!(crate::config::CACHE_STACKED_ORDER_MAX == 9 && (CACHE_STACKED_ORDER_MAX as usize) < MAX_ORDERS);

impl Entries<'_> {
    /// The stack of the blocks of `n` pages (a power of two, of a stacked order of this cache:
    /// the caller checked it), chosen by a branch per order rather than by indexing
    /// ("Dependencies" above); `None` for a larger order.
    #[inline(always)]
    pub(super) fn stack_by_branch(&self, n: u32) -> Option<&Stack> {
        debug_assert!(n.is_power_of_two() && (n.trailing_zeros() as usize) < self.stacked);
        macro_rules! arm {
            ($k:literal) => {
                opaque($k)
            };
        }
        let k = match n.trailing_zeros() {
            0 => arm!(0),
            1 => arm!(1),
            2 => arm!(2),
            3 => arm!(3),
            4 => arm!(4),
            5 => arm!(5),
            6 => arm!(6),
            7 => arm!(7),
            8 => arm!(8),
            9 => arm!(9),
            _ => return None,
        };
        // SAFETY: `k <= 9 < MAX_ORDERS` (`opaque` returns its argument), so `stacks + k` is an
        // element of `self.stacks`, which lives as long as `self`.
        Some(unsafe { &*self.stacks.as_ptr().add(k) })
    }

    #[inline(always)]
    pub(super) fn entry(&self, i: u32) -> *mut Entry {
        debug_assert!((i as usize) < self.nentries());
        // SAFETY: `i < nentries()` (callers index inside one stack's `base..base + cap`), the length
        // of the `entries` allocation made in `init`.
        unsafe { self.entries.add(i as usize) }
    }

    #[inline(always)]
    pub(super) fn mixed_at(&self, i: u32) -> *mut Mixed {
        debug_assert!((i as usize) < self.nentries());
        // SAFETY: as in `entry`: `mixed` has the same `nentries()` length as `entries`.
        unsafe { self.mixed.add(i as usize) }
    }

    /// Whether index `i` is below its stack's size: the only entries ever read, as the others
    /// may never have been written (`ThreadCache::init` leaves them so). For debug checks.
    fn is_live(&self, i: u32) -> bool {
        self.stacks[..self.orders].iter().any(|s| {
            let (nd, nz) = (s.ndirty.get() as u32, s.nzero.get() as u32);
            (s.base..s.base + nd).contains(&i) || (s.base + s.cap - nz..s.base + s.cap).contains(&i)
        })
    }

    /// The entry at index `i`, with its counts (`i` below its stack's size: `is_live`).
    #[inline(always)]
    pub(super) fn read(&self, i: u32) -> (Entry, Mixed) {
        debug_assert!(self.is_live(i), "entry {i} read outside its stack's live part");
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
        self.push_known(o, addr, arena, counts, 0)
    }

    /// `push`, knowing the block's first `dirty_below` pages `Dirty` (`Mixed::dirty_below`).
    pub(super) fn push_known(&self, o: usize, addr: usize, arena: usize, counts: StateCounts, dirty_below: u32) {
        let (e, m) = (Entry::new(addr, arena, counts != StateCounts::default()), Mixed::of(counts, dirty_below));
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
        let (e, m) = self.read(s.base + nd - 1);
        s.ndirty.set(nd as u64 - 1);
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
        let (e, m) = self.read(s.base + s.cap - nz);
        s.set_nzero(nz - 1);
        self.gauge_mixed(m, o, false);
        Some((e, m))
    }

    /// Whether the top of order `o`'s zero-reading stack is a `Zeroed`-class block (what a `ZERO`
    /// request takes first).
    #[inline]
    pub(super) fn zeroed_on_top(&self, o: usize) -> bool {
        let s = &self.stacks[o];
        let nz = s.nzero.get() as u32;
        nz > 0 && self.read(s.base + s.cap - nz).1.counts().class(1 << o) == Class::Zeroed
    }

    /// The dirty stack's top entry of order `o`, if any (not popped).
    #[inline]
    pub(super) fn dirty_top(&self, o: usize) -> Option<Entry> {
        let s = &self.stacks[o];
        let nd = s.ndirty.get() as u32;
        (nd > 0).then(|| self.read(s.base + nd - 1).0)
    }

    /// The next block for a request, in the locked path's order of preference (`preference`):
    /// a plain request takes a dirty block, else the top of the zero-reading stack; a `ZERO`
    /// request takes the top of the zero-reading stack if it is `Zeroed`-class, else a dirty block
    /// (a memset costs ~20x less than faulting a reported page back in), else the top of the
    /// zero-reading stack. `refill` leaves each batch's best zero-reading block on top.
    #[inline]
    pub(super) fn pop(&self, o: usize, zero: bool) -> Option<(Entry, Mixed)> {
        if zero && self.zeroed_on_top(o) {
            return self.pop_zero(o);
        }
        match self.pop_dirty(o) {
            Some(x) => Some(x),
            None => self.pop_zero(o),
        }
    }
}
