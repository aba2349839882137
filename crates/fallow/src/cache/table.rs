//! Finding a thread's cache of an allocator: a small thread-local table of `(allocator id,
//! cache)` slots with a destructor that retires them, and the allocator's own list of its
//! caches (`Heap::caches`), walked under its lock.

use super::*;
use core::mem::MaybeUninit;

use crate::heap::{CACHE_LINE, LINE};
use crate::os::tls;

/// The allocator's list of its threads' caches (`Heap::caches`; intrusive: registering allocates
/// nothing). The heap keeps its head as an untyped pointer (it sits below this layer); every
/// node is a `ThreadCache`, and only the functions here touch it. Its links (`prev`, `next`) are
/// `Cell`s of the caches, changed only under the allocator lock.
impl CacheList {
    pub(super) fn first(&self) -> *mut ThreadCache {
        self.head.cast()
    }

    pub(super) fn push(&mut self, c: *mut ThreadCache) {
        // SAFETY: `c` is a live cache this thread just allocated, and `head`, if not null, a
        // registered cache, live until it is unlinked; `&mut self` means the allocator lock is held.
        unsafe {
            (*c).prev.set(ptr::null_mut());
            (*c).next.set(self.first());
            if !self.head.is_null() {
                (*self.first()).prev.set(c);
            }
        }
        self.head = c.cast();
    }

    pub(super) fn unlink(&mut self, c: *mut ThreadCache) {
        // SAFETY: `c` and its neighbours are registered caches, live until they are unlinked (a cache is
        // unlinked before it is freed, `retire`); `&mut self` means the allocator lock is held.
        unsafe {
            let (p, n) = ((*c).prev.get(), (*c).next.get());
            if p.is_null() {
                self.head = n.cast();
            } else {
                (*p).next.set(n);
            }
            if !n.is_null() {
                (*n).prev.set(p);
            }
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &ThreadCache> {
        let mut p = self.first();
        core::iter::from_fn(move || {
            if p.is_null() {
                return None;
            }
            // SAFETY: every cache on the list is live (unlinked under the lock before it is freed), and
            // `&self` is borrowed from the locked `Heap`, so none is unlinked while iterating.
            let c = unsafe { &*p };
            p = c.next.get();
            Some(c)
        })
    }
}

// ---- The thread-local table. ----

const FRESH: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
const DEAD: u8 = 3;

struct Slots {
    ids: [Cell<u64>; SLOTS],
    caches: [Cell<*mut ThreadCache>; SLOTS],
    used: [Cell<u64>; SLOTS],
    clock: Cell<u64>,
}

// Array-repeat initialisers of the thread-local table (each use is a fresh value).
#[allow(clippy::declare_interior_mutable_const)]
const NO_ID: Cell<u64> = Cell::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO_CACHE: Cell<*mut ThreadCache> = Cell::new(ptr::null_mut());

thread_local! {
    /// FRESH until the table's destructor is registered, BUSY while this thread is registering
    /// it or allocating a cache (a re-entrant call takes the locked path), READY, DEAD after the
    /// destructor ran.
    static STATE: Cell<u8> = const { Cell::new(FRESH) };
    static TABLE: Slots = const { Slots { ids: [NO_ID; SLOTS], caches: [NO_CACHE; SLOTS], used: [NO_ID; SLOTS], clock: Cell::new(0) } };
}

/// The cache this thread used last, if it is `id`'s: two words of `os::tls` (checked first, with
/// no destructor and no registration on access, and read without a call).
#[inline(always)]
pub(super) fn last_of(id: u64) -> Option<*const ThreadCache> {
    let (last, c) = tls::cache();
    (last == id).then_some(c as *const ThreadCache)
}

/// The calling thread's cache of `a` if it is the one this thread used last (the hit paths: no
/// call, no registration).
#[inline(always)]
pub(crate) fn last(a: &Arc<Shared>) -> Option<&ThreadCache> {
    // SAFETY: `os::tls::cache` holds a live cache of this thread whenever its id is an allocator's (ids
    // start at 1; it is reset to 0 before its cache is retired).
    last_of(a.hit.cache_id).map(|c| unsafe { &*c })
}

/// The calling thread's cache of `a`, made at first use; `None` when caches are off for `a`, while
/// the thread is being set up or torn down, or on a re-entrant call.
#[inline]
pub(crate) fn current(a: &Arc<Shared>) -> Option<&ThreadCache> {
    if let Some(c) = last_of(a.hit.cache_id) {
        // SAFETY: as in `last`.
        return Some(unsafe { &*c });
    }
    // SAFETY: `attach` returns a cache from this thread's table, live until this thread retires
    // it (slot reuse or the table's destructor), which does not happen while `a` is borrowed.
    attach(a).map(|p| unsafe { &*p })
}

#[cold]
pub(super) fn attach(a: &Arc<Shared>) -> Option<*const ThreadCache> {
    if a.hit.cache_orders == 0 {
        return None;
    }
    match STATE.with(|s| s.get()) {
        FRESH => {
            STATE.with(|s| s.set(BUSY));
            // First access registers the table's destructor (which may allocate).
            let ok = TABLE.try_with(|_| ()).is_ok();
            STATE.with(|s| s.set(if ok { READY } else { DEAD }));
            if !ok {
                return None;
            }
        }
        READY => {}
        _ => return None,
    }
    TABLE.try_with(|t| t.find_or_make(a)).ok().flatten()
}

impl Slots {
    pub(super) fn find_or_make(&self, a: &Arc<Shared>) -> Option<*const ThreadCache> {
        let id = a.hit.cache_id;
        let now = self.clock.get() + 1;
        self.clock.set(now);
        for i in 0..SLOTS {
            if self.ids[i].get() == id {
                self.used[i].set(now);
                return Some(select(id, self.caches[i].get()));
            }
        }
        // An empty slot, else one whose allocator is gone, else the one used longest ago.
        let pick = (0..SLOTS)
            .find(|&i| self.caches[i].get().is_null())
            // SAFETY: this runs only when no slot is null, so every slot holds a live cache of this
            // thread (freed only by `retire`, after its slot is cleared); `owner` is never written.
            .or_else(|| (0..SLOTS).find(|&i| unsafe { (*self.caches[i].get()).owner.strong_count() } == 0))
            .unwrap_or_else(|| (0..SLOTS).min_by_key(|&i| self.used[i].get()).unwrap());
        let old = self.caches[pick].replace(ptr::null_mut());
        self.ids[pick].set(0);
        if !old.is_null() {
            if tls::cache().1 == old as usize {
                tls::set_cache(0, 0);
            }
            retire(old);
        }
        // Allocate while BUSY (a re-entrant malloc takes the locked path) and without the lock.
        STATE.with(|s| s.set(BUSY));
        // The page is set up in place (`ThreadCache::init`): a `CachePage` made by value was
        // built on the stack and copied.
        let page = Box::into_raw(Box::<CachePage>::new_uninit()).cast::<CachePage>();
        // SAFETY: `page` is a fresh allocation of a `CachePage`, aligned for it; `gap` may stay
        // uninitialised (`MaybeUninit`), `init` writes every field of `cache`.
        unsafe { ThreadCache::init(&raw mut (*page).cache, a) };
        // SAFETY: `page` is the live allocation just made.
        let c = unsafe { &raw mut (*page).cache };
        STATE.with(|s| s.set(READY));
        {
            let mut h = a.heap.lock();
            // SAFETY: `c` is the live cache just made, not yet shared with any other thread.
            // Under the lock, so that no drain request falls between the generation it took in
            // `init` and its registration, which the request would miss (`ask_to_drain`).
            unsafe { (*c).seen_generation.set(a.hit.drain_generation.load(Relaxed)) };
            h.caches.push(c);
            a.caches_registered.fetch_add(1, Relaxed);
        }
        self.caches[pick].set(c);
        self.ids[pick].set(id);
        self.used[pick].set(now);
        Some(select(id, c))
    }
}

pub(super) fn select(id: u64, c: *mut ThreadCache) -> *const ThreadCache {
    tls::set_cache(id, c as usize);
    c
}

impl Drop for Slots {
    fn drop(&mut self) {
        // This thread is leaving: if the program's first thread has left, it may be the last.
        crate::worker::exit_watch::thread_leaves();
        STATE.with(|s| s.set(DEAD));
        tls::set_cache(0, 0);
        for i in 0..SLOTS {
            let c = self.caches[i].replace(ptr::null_mut());
            if !c.is_null() {
                retire(c);
            }
        }
    }
}

/// Drain a cache back into its allocator if that still exists, unlink it, and free it.
pub(super) fn retire(c: *mut ThreadCache) {
    // SAFETY: `c` was just taken out of this thread's table (slot cleared, `os::tls::cache` reset), so it is
    // a live cache that this thread alone still reaches through the table.
    let tc = unsafe { &*c };
    debug_assert!(tc.id != 0);
    if let Some(shared) = tc.owner.upgrade() {
        let now = shared.now_ms();
        let mut h = shared.heap.lock();
        // SAFETY: the owner (this thread, not inside the cache), holding the lock, under which
        // alone another thread (the reporter) touches the entries.
        let e = unsafe { Entries::kept_out(tc) };
        e.fold(&mut h);
        e.drain_all_locked(&mut h, now);
        h.caches.unlink(c);
        shared.caches_registered.fetch_sub(1, Relaxed);
        // Wake a worker for what the drain freed, only while the allocator has handles.
        shared.wake_workers_if_alive(h);
    }
    // SAFETY: `c` is the `cache` of a `CachePage` that came from `Box::into_raw` in `find_or_make`;
    // it is out of the table and, if its allocator lives, unlinked from the registry under the
    // lock above, so nothing reaches it now (if the allocator is gone, so is its registry).
    drop(unsafe { Box::from_raw(c.byte_sub(core::mem::offset_of!(CachePage, cache)).cast::<CachePage>()) });
}

/// A thread's cache on a page of its own, its first (hot) line at `CACHE_LINE` and its stacks on
/// the lines after it (heap/view.rs, "Page offsets of the hit path's lines").
#[repr(C, align(4096))]
struct CachePage {
    gap: MaybeUninit<[u8; CACHE_LINE * LINE]>,
    cache: ThreadCache,
}

const _: () = assert!(core::mem::size_of::<CachePage>() == 1 << PAGE_SHIFT);

/// `Allocator::drain_thread_cache`, and before the heap grows: `true` if the cache held pages.
/// Called without the allocator lock.
pub(crate) fn drain_current(a: &Arc<Shared>) -> bool {
    if a.hit.cache_orders == 0 || STATE.with(|s| s.get()) != READY {
        return false;
    }
    let mut held = false;
    let _ = TABLE.try_with(|t| {
        for i in 0..SLOTS {
            if t.ids[i].get() == a.hit.cache_id {
                // SAFETY: a slot whose id is set holds a live cache of this thread (id and cache are set and
                // cleared together).
                let tc = unsafe { &*t.caches[i].get() };
                // This thread is its owner; a frozen cache is being drained by the reporter.
                if let Some(e) = tc.enter() {
                    held |= e.pages.get() > 0;
                    e.drain_all(a);
                }
            }
        }
    });
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::HIT_LINE;
    use crate::{Allocator, Config};

    /// The hit path's lines sit where heap/view.rs says ("Page offsets of the hit path's
    /// lines"): the types fix the offsets, the allocations must keep their page alignment.
    #[test]
    fn the_hit_path_lines_sit_at_their_page_offsets() {
        let page = (1usize << PAGE_SHIFT) - 1;
        let a = Allocator::new(Config { cache_max_order: 2, ..Config::default() }).unwrap();
        let b = a.alloc(1 << PAGE_SHIFT, 1 << PAGE_SHIFT, Flags::NONE).unwrap();
        a.free(b.as_ptr()).unwrap();
        let shared = &a.shared;
        let tc = last(shared).expect("the thread's cache, made by the free");
        assert_eq!(tc as *const ThreadCache as usize & page, CACHE_LINE * LINE);
        assert_eq!(&tc.stacks[0] as *const Stack as usize & page, CACHE_LINE * LINE + core::mem::offset_of!(ThreadCache, stacks));
        assert_eq!(&shared.hit as *const _ as usize & page, HIT_LINE * LINE);
        assert_eq!(shared.view(0) as *const ArenaView as usize & page, (HIT_LINE + 1) * LINE);
    }
}
