//! An arena: one large virtual reservation, aligned to the largest block, and its side metadata
//! (one state byte and one [`BlockMeta`] per 4 KiB page), itself reserved with `MAP_NORESERVE` so
//! that only the metadata of pages actually used is ever committed.
//!
//! The free lists over an arena are in `buddy.rs` (`Buddy`); this file owns the memory and its
//! metadata.

use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::config::Backing;
use crate::os::{self, PAGE_SHIFT, PAGE_SIZE};
use crate::page::{BlockMeta, PageState, StateCounts};


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
            let _ = unsafe { os::madvise(base, len, os::Advice::HugePage) };
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
        let arena = Arena {
            base,
            len,
            npages: npages as u32,
            max_order,
            fd,
            states: States { p: states as *const AtomicU8, npages: npages as u32 },
            meta: meta as *mut BlockMeta,
            states_len,
            meta_len,
        };
        // Fresh metadata is all zero: every page `Reported`, every tag `None` (`Buddy::new`
        // lists the top-level blocks).
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

/// The state bytes of an arena's pages. Stores are relaxed atomics: the bytes of a free page are
/// written under the allocator lock, those of a live block by its owner outside it. Every access
/// is bounds-checked against the arena's page count.
#[derive(Clone, Copy)]
pub struct States {
    p: *const AtomicU8,
    npages: u32,
}

// SAFETY: `States` is a pointer to an arena's array of `AtomicU8`s; every access through it is
// atomic except through `bytes`, used on pages whose bytes the caller owns (the lock, or a live block's owner).
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

    /// The state bytes from `pfn` on as plain bytes, for a fill or a count that the compiler
    /// vectorizes (byte access to atomics is the same memory). A raw pointer, not a slice: the
    /// bytes are shared with other threads, and a slice would outlive the caller's hold on them.
    ///
    /// # Safety
    /// The `n` bytes used through the pointer, `[pfn, pfn + n)`, are inside the state array, and
    /// the caller owns them while it uses the pointer (the lock for free pages, the owner for a
    /// live or cached block): no other thread accesses them meanwhile.
    unsafe fn bytes(self, pfn: u32) -> *mut u8 {
        // SAFETY: `pfn` is inside the state array (the caller's contract), so the offset stays in it.
        unsafe { self.p.add(pfn as usize) as *mut u8 }
    }

    #[inline(always)]
    pub fn fill(self, pfn: u32, n: u32, s: PageState) {
        // Small aligned blocks (the per-thread caches' hit path): one store, not a call to memset.
        // The bytes of an aligned block of 2, 4 or 8 pages are aligned to 2, 4 or 8 (the array
        // is page-aligned), so one wider relaxed store writes them all.
        self.check(pfn, n);
        let v = (s as u8 as u64) * 0x0101_0101_0101_0101;
        // SAFETY: `[pfn, pfn + n)` is inside the state array (checked).
        let p = unsafe { self.p.add(pfn as usize) };
        match n {
            1 => return self.set(pfn, s),
            // SAFETY: `pfn` is a multiple of `n` and the array is page-aligned, so `p` is aligned for the
            // wider atomic, and `pfn..pfn + n` (the caller's block) is inside the array.
            2 | 4 | 8 if pfn & (n - 1) == 0 => unsafe {
                match n {
                    2 => (*(p as *const core::sync::atomic::AtomicU16)).store(v as u16, Ordering::Relaxed),
                    4 => (*(p as *const core::sync::atomic::AtomicU32)).store(v as u32, Ordering::Relaxed),
                    _ => (*(p as *const core::sync::atomic::AtomicU64)).store(v, Ordering::Relaxed),
                }
                return;
            },
            _ => {}
        }
        self.fill_bytes(pfn, n, s)
    }

    #[inline(never)]
    fn fill_bytes(self, pfn: u32, n: u32, s: PageState) {
        self.check(pfn, n);
        // SAFETY: `pfn..pfn + n` is inside the array (checked) and a block whose bytes the caller
        // owns (the lock for free pages, the owner for a live or cached block): no other thread
        // accesses them during the plain stores (the locked path classifies a bad `free` by the
        // records, never by the state bytes of another thread's live block).
        unsafe { core::ptr::write_bytes(self.bytes(pfn), s as u8, n as usize) }
    }

    /// Count the free states of `[pfn, pfn + n)`: eight state bytes at a time, with a shortcut
    /// for eight `Dirty` pages (the common case: a block freed by a program).
    pub fn count(self, pfn: u32, n: u32) -> StateCounts {
        self.check(pfn, n);
        const ONES: u64 = 0x0101_0101_0101_0101;
        // The number of zero bytes of `v`, whose bytes are all below 0x80 (states are 0..=4):
        // adding 0x7f to a byte sets its top bit exactly when the byte is not zero, and carries
        // nothing into the next byte.
        let zero_bytes = |v: u64| 8 - ((v + 0x7f * ONES) & (0x80 * ONES)).count_ones();
        let (mut z, mut r, mut l) = (0u32, 0u32, 0u32);
        // SAFETY: as in `fill_bytes`: `[pfn, pfn + n)` is inside the array (checked) and a block
        // whose bytes the caller owns, so no other thread writes them while they are read.
        let base = unsafe { self.bytes(pfn) } as *const u8;
        let words = n / 8;
        for i in 0..words as usize {
            // SAFETY: bytes `8i..8i + 8` lie in `[0, n)` (above).
            let v = unsafe { base.add(8 * i).cast::<u64>().read_unaligned() };
            if v == PageState::Dirty as u64 * ONES {
                continue;
            }
            z += zero_bytes(v ^ (PageState::Zeroed as u64 * ONES));
            r += zero_bytes(v ^ (PageState::Reported as u64 * ONES));
            l += zero_bytes(v ^ (PageState::LazyFree as u64 * ONES));
        }
        for i in (words * 8)..n {
            // SAFETY: `i < n` (above).
            let b = unsafe { *base.add(i as usize) };
            z += (b == PageState::Zeroed as u8) as u32;
            r += (b == PageState::Reported as u8) as u32;
            l += (b == PageState::LazyFree as u8) as u32;
        }
        StateCounts { zeroed: z, reported: r, lazy: l }
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

/// Set the state bytes of an aligned block of `n` pages (a power of two) whose first state byte
/// is at `p` (the per-thread caches' hit path, which has `p` from `ArenaView::state_of`): one
/// byte store for one page, the block a hit serves most often; larger blocks out of line, as
/// relaxed stores of 2, 4 or 8 bytes. A branch and a store on the common path, where a switch
/// on the size was a jump table.
///
/// # Safety
/// `p` is the state byte of the first page of an aligned block of `n` pages of a live arena,
/// `n` a power of two: the state array is page-aligned and the block's page frame a multiple of
/// `n`, so `p` is aligned to `n` and `p..p + n` lies in the array.
#[inline(always)]
pub(crate) unsafe fn fill_block(p: *const AtomicU8, n: u32, s: PageState) {
    debug_assert!(n.is_power_of_two() && (p as usize) & (n as usize - 1) == 0);
    if n == 1 {
        // SAFETY: `p` is a state byte of a live arena (the caller's contract).
        unsafe { (*p).store(s as u8, Ordering::Relaxed) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { fill_block_larger(p, n, s) }
}

/// `fill_block` for 2 pages and more: one store for 2, 4 or 8 pages, `States::fill`'s memset
/// above.
///
/// # Safety
/// As `fill_block`.
#[inline(never)]
unsafe fn fill_block_larger(p: *const AtomicU8, n: u32, s: PageState) {
    let v = (s as u8 as u64) * 0x0101_0101_0101_0101;
    // SAFETY: `p` is aligned to `n` and `p..p + n` is in the state array (the caller's
    // contract), so each wider atomic is aligned and in bounds, the same memory as the
    // `AtomicU8`s.
    unsafe {
        match n {
            2 => (*(p as *const AtomicU16)).store(v as u16, Ordering::Relaxed),
            4 => (*(p as *const AtomicU32)).store(v as u32, Ordering::Relaxed),
            8 => (*(p as *const AtomicU64)).store(v, Ordering::Relaxed),
            _ => States { p, npages: n }.fill_bytes(0, n, s),
        }
    }
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
