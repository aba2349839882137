//! An arena: one large virtual reservation, aligned to the largest block, and its side metadata
//! (one state byte and one [`BlockMeta`] per 4 KiB page), itself reserved with `MAP_NORESERVE` so
//! that only the metadata of pages actually used is ever committed.
//!
//! The free lists over an arena are in `buddy/` (`Buddy`); this module owns the memory and its
//! metadata; `states` the page state bytes and how runs of them are stored and counted.

mod free_map;
mod states;

use core::sync::atomic::AtomicU8;

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
    /// Anonymous memory advised `MADV_HUGEPAGE`: the kernel may back each aligned 2 MiB unit
    /// with one huge page at its first touch (`buddy/units.rs` keeps the page states true).
    pub huge_units: bool,
    states: States,
    meta: *mut BlockMeta,
    /// Which pages lie in listed free blocks (kept by the buddy), in the metadata mapping after
    /// the records.
    free_map: FreeMap,
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
        .saturating_add(round_up(meta_bytes(npages), PAGE_SIZE))
}

/// Bytes of an arena's records and free-page map, for `npages` pages (the map after the records).
fn meta_bytes(npages: usize) -> usize {
    let map = FreeMap::bytes(npages.min(u32::MAX as usize) as u32);
    npages.saturating_mul(core::mem::size_of::<BlockMeta>()).saturating_add(map)
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
        // Page numbers, and the free-page map's words (`npages` rounded up to 64), fit a `u32`.
        if npages > u32::MAX as usize - 64 {
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
        // Best effort: THP may be missing from the kernel. (A memfd's pages are shared memory,
        // whose huge pages `shmem_enabled` governs, off by default: no units there.)
        // SAFETY: the reservation made just above; `MADV_HUGEPAGE` changes no contents.
        let huge_units = thp && unsafe { os::madvise(base, len, os::Advice::HugePage) }.is_ok() && fd < 0;
        let states_len = round_up(npages, PAGE_SIZE);
        let meta_len = round_up(meta_bytes(npages), PAGE_SIZE);
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
            huge_units,
            // SAFETY: `states` is the state array just mapped for this arena's `npages` pages (one
            // zeroed byte each), unmapped only when the arena is dropped.
            states: unsafe { States::from_raw(states as *const AtomicU8, npages as u32) },
            meta: meta as *mut BlockMeta,
            // SAFETY: the map's bytes follow the records in the metadata mapping just made
            // (`meta_bytes`), zero and 8-aligned, used by the map alone and unmapped with the arena.
            free_map: unsafe { FreeMap::from_raw((meta + npages * core::mem::size_of::<BlockMeta>()) as *mut u64, npages as u32) },
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

    /// The free-page map (the buddy keeps it true and searches it: `free_map/`).
    #[inline(always)]
    pub(crate) fn free_map(&mut self) -> &mut FreeMap {
        &mut self.free_map
    }

    /// The free-page map, to check it.
    pub(crate) fn free_map_ref(&self) -> &FreeMap {
        &self.free_map
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


impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the arena owns its three mappings and its memfd, and is dropped only with the
        // allocator's last reference (the `Arc<Shared>`), when no block, cache or worker uses them.
        unsafe {
            os::unmap(self.base, self.len);
            os::unmap(self.states.raw() as usize, self.states_len);
            os::unmap(self.meta as usize, self.meta_len);
            if self.fd >= 0 {
                os::close(self.fd);
            }
        }
    }
}

pub(crate) use free_map::FreeMap;
pub(crate) use states::{fill_block, States};
