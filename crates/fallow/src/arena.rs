//! An arena: one large virtual reservation, aligned to the largest block, and its side metadata
//! (one state byte and one [`BlockMeta`] per 4 KiB page), itself reserved with `MAP_NORESERVE` so
//! that only the metadata of pages actually used is ever committed.
//!
//! The free lists over an arena are in `buddy.rs`; this file owns the memory and its metadata.

use core::sync::atomic::{AtomicU8, Ordering};

use crate::config::Backing;
use crate::os::{self, PAGE_SHIFT, PAGE_SIZE};
use crate::page::{BlockMeta, PageState, StateCounts, CLASSES, NIL};

/// Orders go from 0 (4 KiB) to at most this (4 TiB); pfns are `u32`, so an arena holds at most
/// 2^32 pages (16 TiB).
pub const MAX_ORDER_LIMIT: u8 = 30;
pub const ORDERS: usize = MAX_ORDER_LIMIT as usize + 1;

pub struct Arena {
    pub base: usize,
    pub len: usize,
    pub npages: u32,
    pub max_order: u8,
    /// The memfd behind a shared arena, or -1.
    pub fd: i32,
    states: States,
    meta: *mut BlockMeta,
    states_len: usize,
    meta_len: usize,
    // Free lists (buddy.rs): per class and order, doubly linked through `BlockMeta`.
    pub(crate) heads: [[u32; ORDERS]; CLASSES],
    pub(crate) tails: [[u32; ORDERS]; CLASSES],
    pub(crate) nonempty: [u64; CLASSES],
    /// What the lists hold, kept as blocks are listed and unlisted.
    pub(crate) listed: Listed,
}

/// Counters of the free blocks on an arena's lists.
#[derive(Clone, Copy, Debug)]
pub struct Listed {
    pub blocks: [[u32; ORDERS]; CLASSES],
    pub counts: StateCounts,
    pub pages: u64,
}

impl Listed {
    #[inline]
    pub fn add_block(&mut self, class: usize, order: u8, c: StateCounts, pages: u32) {
        self.blocks[class][order as usize] += 1;
        self.counts = self.counts.plus(c);
        self.pages += pages as u64;
    }
    #[inline]
    pub fn remove_block(&mut self, class: usize, order: u8, c: StateCounts, pages: u32) {
        self.blocks[class][order as usize] -= 1;
        self.counts = self.counts.minus(c);
        self.pages -= pages as u64;
    }
}

// SAFETY: the raw pointers are to the arena's own mappings (records, state bytes), which it
// unmaps in `drop`; moving the owner to another thread changes nothing about them.
unsafe impl Send for Arena {}

/// `x` rounded up to a multiple of `to`; saturates (a size no arena can have) instead of
/// overflowing.
fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

/// The alignment of an arena: its largest block (and at least a huge page with THP).
fn arena_align(max_order: u8, thp: bool) -> usize {
    (PAGE_SIZE << max_order).max(if thp { os::HUGE_PAGE_SIZE } else { PAGE_SIZE })
}

/// Address space that reserving an arena of `len` bytes (a multiple of the largest block) takes
/// at its peak: the arena, the slack trimmed after aligning it, and its side metadata.
pub fn footprint(len: usize, max_order: u8, thp: bool) -> usize {
    let npages = len >> PAGE_SHIFT;
    len.saturating_add(arena_align(max_order, thp) - PAGE_SIZE)
        .saturating_add(round_up(npages, PAGE_SIZE))
        .saturating_add(round_up(npages.saturating_mul(core::mem::size_of::<BlockMeta>()), PAGE_SIZE))
}

/// The address space an arena may take now: three quarters of what `RLIMIT_AS` still leaves this
/// process; the last quarter stays for the program's own mappings (thread stacks, glibc's heaps
/// and its directly mapped blocks, libraries). `None`: no limit. Only the address-space limit
/// matters here: a cgroup memory limit does not refuse `MAP_NORESERVE` reservations (it counts
/// pages when they are touched), so it does not size arenas.
pub fn address_space_budget() -> Option<usize> {
    os::address_space_room().map(|room| room - room / 4)
}

/// The largest block order, at most `max_order` and at least `floor`, whose one-block arena
/// fits in the address-space budget (the configured order when there is no limit). Under a tight
/// `RLIMIT_AS` (below about 2.7 GiB of room for the default 1 GiB blocks, which need 1 GiB of
/// alignment slack on top of the arena) an allocator is thus created with smaller blocks rather
/// than not at all.
pub fn fitting_max_order(max_order: u8, floor: u8, thp: bool) -> u8 {
    let Some(budget) = address_space_budget() else { return max_order };
    let mut order = max_order;
    while order > floor && footprint(PAGE_SIZE << order, order, thp) > budget {
        order -= 1;
    }
    order
}

/// Reserve an arena for `want` bytes that holds at least `need`, sized to fit: first shrunk
/// (halving, in whole largest blocks, never below what `need` takes) until its footprint fits the
/// address-space budget, then halved again each time the kernel refuses with `ENOMEM` (the
/// budget is an estimate: other threads map meanwhile, and `vm.overcommit_memory=2` counts even
/// `MAP_NORESERVE` reservations). `Err((bytes last tried, errno))`.
pub fn reserve_fitting(
    want: usize,
    need: usize,
    max_order: u8,
    backing: Backing,
    thp: bool,
) -> Result<Arena, (usize, i32)> {
    let block = PAGE_SIZE << max_order;
    let min = round_up(need.max(1), block);
    let mut len = round_up(want.max(min), block);
    let halve = |len: usize| round_up(len / 2, block).max(min);
    // An arena is sized to half the room (the block size may use three quarters of it): the
    // program keeps at least half for its own mappings, and later arenas are added on demand.
    if let Some(budget) = os::address_space_room().map(|room| room / 2) {
        while len > min && footprint(len, max_order, thp) > budget {
            len = halve(len);
        }
    }
    loop {
        match Arena::reserve(len, max_order, backing, thp) {
            Ok(a) => return Ok(a),
            Err(libc::ENOMEM) if len > min => len = halve(len),
            Err(e) => return Err((len, e)),
        }
    }
}

impl Arena {
    /// Reserve an arena of at least `len` bytes (rounded up to the largest block).
    pub fn reserve(len: usize, max_order: u8, backing: Backing, thp: bool) -> os::OsResult<Arena> {
        let block = PAGE_SIZE << max_order;
        let len = round_up(len.max(block), block);
        let npages = len >> PAGE_SHIFT;
        if npages > u32::MAX as usize - 1 {
            return Err(libc::ENOMEM);
        }
        let align = arena_align(max_order, thp);
        let fd = match backing {
            Backing::Anonymous => -1,
            Backing::Memfd => os::memfd(len)?,
        };
        let base = match os::reserve_aligned(len, align, if fd >= 0 { Some(fd) } else { None }) {
            Ok(b) => b,
            Err(e) => {
                if fd >= 0 {
                    // SAFETY: the memfd made just above, given to nobody.
                    unsafe { os::close(fd) };
                }
                return Err(e);
            }
        };
        if thp {
            // Best effort: THP may be disabled system-wide.
            // SAFETY: the reservation made just above; `MADV_HUGEPAGE` changes no contents.
            let _ = unsafe { os::madvise(base, len, libc::MADV_HUGEPAGE) };
        }
        let states_len = round_up(npages, PAGE_SIZE);
        let meta_len = round_up(npages * core::mem::size_of::<BlockMeta>(), PAGE_SIZE);
        let states = match os::reserve_aligned(states_len, PAGE_SIZE, None) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the reservation and memfd made just above, given to nobody.
                unsafe { os::unmap(base, len) };
                if fd >= 0 {
                    // SAFETY: as above.
                    unsafe { os::close(fd) };
                }
                return Err(e);
            }
        };
        let meta = match os::reserve_aligned(meta_len, PAGE_SIZE, None) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the reservations and memfd made just above, given to nobody.
                unsafe {
                    os::unmap(base, len);
                    os::unmap(states, states_len);
                }
                if fd >= 0 {
                    // SAFETY: as above.
                    unsafe { os::close(fd) };
                }
                return Err(e);
            }
        };
        let mut arena = Arena {
            base,
            len,
            npages: npages as u32,
            max_order,
            fd,
            states: States { p: states as *const AtomicU8, npages: npages as u32 },
            meta: meta as *mut BlockMeta,
            states_len,
            meta_len,
            heads: [[NIL; ORDERS]; CLASSES],
            tails: [[NIL; ORDERS]; CLASSES],
            nonempty: [0; CLASSES],
            listed: Listed { blocks: [[0; ORDERS]; CLASSES], counts: StateCounts::default(), pages: 0 },
        };
        // Fresh metadata is all zero: every page `Reported`, every tag `None`. Put the top-level
        // blocks on the reported lists.
        // (From the top down, so that the lowest block is at the head of its list.)
        let top = 1u32 << max_order;
        let mut pfn = arena.npages;
        while pfn > 0 {
            pfn -= top;
            arena.push_free(pfn, max_order, StateCounts::uniform(PageState::Reported, top), 0);
        }
        Ok(arena)
    }

    #[inline]
    pub fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.base) < self.len
    }

    #[inline]
    pub fn addr(&self, pfn: u32) -> usize {
        self.base + ((pfn as usize) << PAGE_SHIFT)
    }

    #[inline]
    pub fn pfn(&self, addr: usize) -> u32 {
        ((addr - self.base) >> PAGE_SHIFT) as u32
    }

    /// The record of page `pfn` of this arena. Its fields are atomics: reading or writing them
    /// through this shared reference races with nothing undefined (who may write which field
    /// when: docs/design.md, "Access rules").
    #[inline]
    pub fn meta(&self, pfn: u32) -> &BlockMeta {
        assert!(pfn < self.npages, "page {pfn} outside an arena of {} pages", self.npages);
        // SAFETY: `pfn < npages`, so the record lies inside the metadata mapping, which lives as
        // long as the arena; `BlockMeta` is all atomics, so a shared reference to it may coexist
        // with other threads' accesses.
        unsafe { &*self.meta.add(pfn as usize) }
    }

    /// `meta` without the bounds check, for the buddy allocator's inner loops (split, merge, list
    /// links), where every page number comes from a listed block or its buddy.
    ///
    /// # Safety
    /// `pfn < self.npages`.
    #[inline(always)]
    pub(crate) unsafe fn meta_unchecked(&self, pfn: u32) -> &BlockMeta {
        debug_assert!(pfn < self.npages);
        // SAFETY: `pfn < npages` (the caller's promise); otherwise as in `meta`.
        unsafe { &*self.meta.add(pfn as usize) }
    }

    #[inline]
    pub fn state(&self, pfn: u32) -> PageState {
        debug_assert!(pfn < self.npages);
        self.states.get(pfn)
    }

    /// The `BlockMeta` array (for the per-thread caches, which read and write the records of
    /// blocks they own without the lock).
    #[inline]
    pub fn meta_raw(&self) -> *mut BlockMeta {
        self.meta
    }

    #[inline]
    pub fn states(&self) -> States {
        self.states
    }

    /// Set the state of every page of `[pfn, pfn + n)`.
    pub fn set_states(&self, pfn: u32, n: u32, s: PageState) {
        debug_assert!(pfn as usize + n as usize <= self.npages as usize);
        self.states.fill(pfn, n, s)
    }

    pub fn count_states(&self, pfn: u32, n: u32) -> StateCounts {
        self.states.count(pfn, n)
    }

    pub fn for_each_run(&self, pfn: u32, n: u32, f: impl FnMut(u32, u32, PageState)) {
        self.states.for_each_run(pfn, n, f)
    }
}

/// The state bytes of an arena's pages. Every access is a relaxed `AtomicU8` load or store of one
/// byte, never a plain access nor a wider atomic: a racing double `free` (a program's fault, but
/// `free` is safe) can leave a thread writing the bytes of a block that meanwhile went elsewhere,
/// so any access may race with any other, and only same-size atomic accesses may race without
/// undefined behaviour (docs/design.md, "Access rules"). Every access is bounds-checked against the
/// arena's page count.
#[derive(Clone, Copy)]
pub struct States {
    p: *const AtomicU8,
    npages: u32,
}

// SAFETY: `States` is a pointer to an arena's array of `AtomicU8`s, and every access through it
// is an atomic byte load or store.
unsafe impl Send for States {}
// SAFETY: as `Send`: shared access is to atomics.
unsafe impl Sync for States {}

impl States {
    /// # Safety
    /// `p` is the state array of an arena of `npages` pages (`States::raw`) that outlives every
    /// use of the result.
    pub unsafe fn from_raw(p: *const AtomicU8, npages: u32) -> States {
        States { p, npages }
    }

    pub fn raw(self) -> *const AtomicU8 {
        self.p
    }

    /// Panics unless `[pfn, pfn + n)` is inside the arena.
    #[inline(always)]
    fn check(self, pfn: u32, n: u32) {
        assert!(pfn as u64 + n as u64 <= self.npages as u64, "pages {pfn}+{n} outside an arena of {} pages", self.npages);
    }

    #[inline]
    pub fn get(self, pfn: u32) -> PageState {
        self.check(pfn, 1);
        // SAFETY: `pfn < npages` (checked), so the byte is inside the state array; the load is atomic.
        PageState::from_byte(unsafe { (*self.p.add(pfn as usize)).load(Ordering::Relaxed) })
    }

    #[inline]
    pub fn set(self, pfn: u32, s: PageState) {
        self.check(pfn, 1);
        // SAFETY: as in `get`: `pfn` is inside the state array; the store is atomic.
        unsafe { (*self.p.add(pfn as usize)).store(s as u8, Ordering::Relaxed) }
    }

    /// Set the state of every page of `[pfn, pfn + n)`: one relaxed byte store per page.
    #[inline(always)]
    pub fn fill(self, pfn: u32, n: u32, s: PageState) {
        self.check(pfn, n);
        if n == 1 {
            return self.set(pfn, s);
        }
        // SAFETY: `[pfn, pfn + n)` is inside the state array (checked).
        unsafe { store_bytes(self.p.add(pfn as usize), n, s as u8) }
    }

    /// Count the free states of `[pfn, pfn + n)`, one relaxed byte load per page. Each state adds
    /// its lane of a 64-bit sum (16 bits per free state, `Allocated` adds nothing): a load, an
    /// add from a table and no branch per page; the lanes are folded into the counts before
    /// they can overflow.
    pub fn count(self, pfn: u32, n: u32) -> StateCounts {
        self.check(pfn, n);
        // Lane `16 * state` for the four free states (`Reported` 0 .. `LazyFree` 3).
        const LANE: [u64; 8] = [1, 1 << 16, 1 << 32, 1 << 48, 0, 0, 0, 0];
        const CHUNK: usize = u16::MAX as usize;
        // SAFETY: `[pfn, pfn + n)` is inside the state array (checked).
        let base = unsafe { self.p.add(pfn as usize) };
        let lane = |sum: u64, s: PageState| ((sum >> (16 * s as u32)) & 0xffff) as u32;
        let mut c = StateCounts::default();
        let mut done = 0usize;
        while done < n as usize {
            let end = (n as usize).min(done + CHUNK);
            let mut sum = 0u64;
            for i in done..end {
                // SAFETY: `i < n`, so the byte is inside `[pfn, pfn + n)`; the load is atomic.
                let b = unsafe { (*base.add(i)).load(Ordering::Relaxed) };
                sum += LANE[(b & 7) as usize];
            }
            c.zeroed += lane(sum, PageState::Zeroed);
            c.reported += lane(sum, PageState::Reported);
            c.lazy += lane(sum, PageState::LazyFree);
            done = end;
        }
        c
    }

    /// Visit the maximal runs of equal state in `[pfn, pfn + n)`: `f(start, len, state)`.
    pub fn for_each_run(self, pfn: u32, n: u32, mut f: impl FnMut(u32, u32, PageState)) {
        let end = pfn + n;
        let mut start = pfn;
        while start < end {
            let s = self.get(start);
            let mut p = start + 1;
            while p < end && self.get(p) == s {
                p += 1;
            }
            f(start, p - start, s);
            start = p;
        }
    }
}

/// Store `v` into the `n` state bytes from `p`, one relaxed `AtomicU8` store each (the compiler
/// neither merges atomic stores into wider ones nor turns them into a memset, which would be
/// plain or wider accesses that may race with another thread's byte; see `States`).
///
/// # Safety
/// `p..p + n` lies in a live arena's state array.
#[inline(never)]
unsafe fn store_bytes(p: *const AtomicU8, n: u32, v: u8) {
    for i in 0..n as usize {
        // SAFETY: `i < n`, so the byte is in the array (the caller's contract); the store is atomic.
        unsafe { (*p.add(i)).store(v, Ordering::Relaxed) };
    }
}

/// Set the state bytes of an aligned block of `n` pages (a power of two) whose first state byte
/// is at `p` (the per-thread caches' hit path, which has `p` from `ArenaView::state_of`): one
/// byte store for one page, the block a hit serves most often; larger blocks out of line, one
/// relaxed byte store per page as everywhere (`States`). A branch and a store on the common path,
/// where a switch on the size was a jump table.
///
/// # Safety
/// `p` is the state byte of the first page of a block of `n` pages of a live arena, so
/// `p..p + n` lies in the state array.
#[inline(always)]
pub(crate) unsafe fn fill_block(p: *const AtomicU8, n: u32, s: PageState) {
    debug_assert!(n.is_power_of_two() && (p as usize) & (n as usize - 1) == 0);
    if n == 1 {
        // SAFETY: `p` is a state byte of a live arena (the caller's contract).
        unsafe { (*p).store(s as u8, Ordering::Relaxed) };
        return;
    }
    // SAFETY: `p..p + n` is in the state array (the caller's contract).
    unsafe { store_bytes(p, n, s as u8) }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the arena owns its three mappings and its memfd, and is dropped only with the
        // allocator's last reference (the `Arc<Shared>`), when no block, cache or worker uses them.
        unsafe {
            os::unmap(self.base, self.len);
            os::unmap(self.states.p as usize, self.states_len);
            os::unmap(self.meta as usize, self.meta_len);
            if self.fd >= 0 {
                os::close(self.fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_agrees_with_a_byte_by_byte_count() {
        let bytes: Vec<AtomicU8> = (0..300u32).map(|_| AtomicU8::new(0)).collect();
        // SAFETY: `bytes` holds 300 state bytes and outlives `states`.
        let states = unsafe { States::from_raw(bytes.as_ptr(), 300) };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            for b in &bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly dirty in some rounds, uniform states in others, any free state.
                let v = if round % 3 == 0 && !x.is_multiple_of(8) { PageState::Dirty as u8 } else { (x % 4) as u8 };
                b.store(v, Ordering::Relaxed);
            }
            let (start, n) = ((x >> 8) as u32 % 150, (x >> 24) as u32 % 150);
            let mut want = StateCounts::default();
            for p in start..start + n {
                match PageState::from_byte(bytes[p as usize].load(Ordering::Relaxed)) {
                    PageState::Zeroed => want.zeroed += 1,
                    PageState::Reported => want.reported += 1,
                    PageState::LazyFree => want.lazy += 1,
                    _ => {}
                }
            }
            assert_eq!(states.count(start, n), want, "round {round}: {start}+{n}");
        }
    }
}
