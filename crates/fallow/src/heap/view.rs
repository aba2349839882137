//! What code outside the lock reads of an allocator: the published arena views (`owns`, the
//! per-thread caches' hit paths) and the `HitPath` words, each on cache lines of their own, at
//! fixed offsets in their page ("Page offsets of the hit path's lines" below).

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::arena::{Arena, States};
use crate::os::{PAGE_SHIFT, PAGE_SIZE};
use crate::page::BlockMeta;

use super::{Shared, MAX_ARENAS};

/// Page offsets of the hit path's lines. On x86, a load whose address matches in its low 12
/// bits a store to another page still in flight waits for that store ("4K aliasing"). A cache
/// hit stores its cache's counters (`pages`, the hit counts, `busy`) and then loads `HitPath`
/// and a view: when these sat at the same offset in their pages, every pair took ~6% longer
/// (`bench scale` at 4 KiB: whichever of two allocator instances had its `Shared` at the
/// page offset of the thread's cache was the slower one, by chance of the C heap). So the
/// lines sit at fixed offsets, apart from each other and from the first and last lines of a
/// page (where programs most often write their blocks):
/// - `Shared::hit` at line `HIT_LINE`, the views of arenas 0, 1, ... on the lines after it
///   (arenas 0 to 30 clear of the cache's lines);
/// - a thread's cache's hot line at `CACHE_LINE`, its order stacks on the lines after it
///   (cache/table.rs, `CachePage`).
pub(crate) const LINE: usize = 64;
pub(crate) const HIT_LINE: usize = 8;
pub(crate) const CACHE_LINE: usize = 40;

/// The bytes of `Shared` before `hit` (nothing is kept there).
pub(crate) type HitGap = core::mem::MaybeUninit<[u8; HIT_LINE * LINE]>;

const _: () = {
    assert!(core::mem::align_of::<Shared>() == PAGE_SIZE);
    assert!(core::mem::offset_of!(Shared, hit) == HIT_LINE * LINE);
    assert!(core::mem::offset_of!(Shared, views) == (HIT_LINE + 1) * LINE);
    assert!(core::mem::size_of::<ArenaView>() == LINE && core::mem::size_of::<HitPath>() == LINE);
};

/// What code outside the lock may read of an arena (the per-thread caches' hit path). Aligned
/// to a cache line of its own, so that nothing written under the lock shares it.
#[repr(C, align(64))]
pub(crate) struct ArenaView {
    base: AtomicUsize,
    len: AtomicUsize,
    /// `len` in pages (`first_page_of`).
    pages: AtomicUsize,
    states: AtomicUsize,
    meta: AtomicUsize,
    /// `meta - (base >> META_ADDR_SHIFT)` and `states - (base >> PAGE_SHIFT)` (wrapping): the
    /// record and the state byte of a page at `addr` are one shift and one add away, without
    /// the page frame number (`meta_of`, `state_of`).
    meta_bias: AtomicUsize,
    states_bias: AtomicUsize,
    /// The arena is on huge-page units (`Arena::huge_units`, buddy/units.rs).
    huge_units: AtomicBool,
}

/// A page's record is `(addr - base) >> PAGE_SHIFT` records into the array, i.e.
/// `(addr - base) >> META_ADDR_SHIFT` bytes (both page-aligned, records of 32 bytes).
const META_ADDR_SHIFT: u32 = PAGE_SHIFT - core::mem::size_of::<BlockMeta>().trailing_zeros();
const _: () = assert!(core::mem::size_of::<BlockMeta>().is_power_of_two());

impl ArenaView {
    /// Whether the arena is on huge-page units (read on the slack path only).
    pub(crate) fn huge_units(&self) -> bool {
        self.huge_units.load(Ordering::Relaxed)
    }
    /// The arena's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
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
    /// How many of those orders (`0..n`) are stacked (cache/mod.rs), and the largest block their
    /// hit paths serve (the largest stacked order's; larger ones are served off the hit path).
    pub(crate) cache_stacked_orders: u32,
    pub(crate) cache_hit_max_bytes: usize,
    /// Bumped by `request_cache_drain`; a cache that sees a new value drains itself.
    pub(crate) drain_generation: AtomicU64,
}

impl ArenaView {
    pub(super) fn empty() -> ArenaView {
        ArenaView {
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            pages: AtomicUsize::new(0),
            states: AtomicUsize::new(0),
            meta: AtomicUsize::new(0),
            meta_bias: AtomicUsize::new(0),
            states_bias: AtomicUsize::new(0),
            huge_units: AtomicBool::new(false),
        }
    }

    /// Publish `arena` in this (empty) view; `install` then publishes the view.
    fn set(&self, arena: &Arena) {
        self.base.store(arena.base, Ordering::Relaxed);
        self.len.store(arena.len, Ordering::Relaxed);
        self.pages.store(arena.len >> PAGE_SHIFT, Ordering::Relaxed);
        self.states.store(arena.states().raw() as usize, Ordering::Relaxed);
        self.meta.store(arena.meta_raw() as usize, Ordering::Relaxed);
        let (meta, states) = (arena.meta_raw() as usize, arena.states().raw() as usize);
        self.meta_bias.store(meta.wrapping_sub(arena.base >> META_ADDR_SHIFT), Ordering::Relaxed);
        self.states_bias.store(states.wrapping_sub(arena.base >> PAGE_SHIFT), Ordering::Relaxed);
        self.huge_units.store(arena.huge_units, Ordering::Relaxed);
    }
}

impl HitPath {
    pub(super) fn new(cache_id: u64, cache_orders: u32, cache_stacked_orders: u32) -> HitPath {
        let max = |orders: u32| if orders == 0 { 0 } else { PAGE_SIZE << (orders - 1) };
        HitPath {
            published: AtomicUsize::new(0),
            cache_id,
            cache_orders,
            cache_max_bytes: max(cache_orders),
            cache_stacked_orders,
            cache_hit_max_bytes: max(cache_stacked_orders),
            drain_generation: AtomicU64::new(0),
        }
    }
}

/// The span of every arena that any allocator of this process has published: `[SPAN_START,
/// SPAN_END)`, empty (`usize::MAX`, 0) until the first. Widened before an arena's view is
/// published, so before any of its blocks is handed out (a thread that frees a block sees the
/// widening, which happened before the allocation that gave it the block), and never narrowed
/// (an allocator that goes away leaves it as it was). A filter for the process-wide bindings:
/// an address outside it is no allocator's, without a load of any allocator's state (the
/// preload's `free` of a C library block: two compares); one inside it is still asked of
/// `Allocator::owns`. Both words are only ever widened, so any mix of old and new values a
/// reader sees spans at least every arena published before the block it holds.
pub static SPAN_START: AtomicUsize = AtomicUsize::new(usize::MAX);
pub static SPAN_END: AtomicUsize = AtomicUsize::new(0);

impl Shared {
    /// Publish arena `i` (about to be installed, `arenas.len() == i` under the lock): the process-wide
    /// span, its view, then the count that readers load with `Acquire`.
    pub(super) fn publish(&self, i: usize, arena: &Arena) {
        SPAN_START.fetch_min(arena.base, Ordering::Relaxed);
        SPAN_END.fetch_max(arena.base + arena.len, Ordering::Relaxed);
        self.views[i].set(arena);
        self.hit.published.store(i + 1, Ordering::Release);
    }

    pub(crate) fn states_of(&self, arena: usize) -> States {
        self.views[arena].states()
    }

    /// The published view of arena `i` (no lock).
    #[inline(always)]
    pub(crate) fn view(&self, i: usize) -> &ArenaView {
        &self.views[i]
    }

    /// The arena holding `addr` and its view, without the lock.
    ///
    /// The first arena, which holds most blocks, is checked inline and the others out of line
    /// (the free hit path has its own test of the first arena, `first_page_of`). It needs no
    /// load of `published`: `Allocator::new` installs it before any handle exists, so every
    /// thread that holds one sees its view.
    #[inline(always)]
    pub(crate) fn view_of(&self, addr: usize) -> Option<(usize, &ArenaView)> {
        if let Some(v) = self.first_view_of(addr) {
            return Some((0, v));
        }
        // With one arena (the common case: its default size is the machine's RAM) no call: a
        // pointer that is not ours (every `free` of the C library's blocks through the preload)
        // is told apart in a few instructions. Relaxed: only whether to look further; the call
        // reads the count again with Acquire before it reads the views.
        if self.hit.published.load(Ordering::Relaxed) <= 1 {
            return None;
        }
        self.view_of_others(addr)
    }

    /// The first arena's view if it holds `addr` (see `view_of`).
    #[inline(always)]
    fn first_view_of(&self, addr: usize) -> Option<&ArenaView> {
        let v = &self.views[0];
        (addr.wrapping_sub(v.base()) < v.len.load(Ordering::Relaxed)).then_some(v)
    }

    /// The first arena's view if `addr` is the address of one of its pages: one compare, the
    /// page offset rotated into the top bits (a free hit's test of a pointer).
    #[inline(always)]
    pub(crate) fn first_page_of(&self, addr: usize) -> Option<&ArenaView> {
        let v = &self.views[0];
        (addr.wrapping_sub(v.base()).rotate_right(PAGE_SHIFT) < v.pages.load(Ordering::Relaxed)).then_some(v)
    }

    /// `view_of` for the arenas after the first.
    #[inline(never)]
    fn view_of_others(&self, addr: usize) -> Option<(usize, &ArenaView)> {
        let n = self.hit.published.load(Ordering::Acquire).min(MAX_ARENAS);
        for (i, v) in self.views[..n].iter().enumerate().skip(1) {
            if addr.wrapping_sub(v.base()) < v.len.load(Ordering::Relaxed) {
                return Some((i, v));
            }
        }
        None
    }
}
