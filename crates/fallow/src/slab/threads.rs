//! The slab's heaps and the threads that use them: a heap for a thread (an abandoned one
//! adopted whole, else a new one), a heap given up at thread exit (`abandon`), a thread giving
//! back its empty spans (`trim_current`), the slab's lock around `fork` and the heaps of the
//! parent's other threads given up in the child; the list of every heap and its pages.
//! docs/design.md, "Thread exit, abandoned heaps, fork".

use core::ptr;
use core::sync::atomic::{fence, Ordering::SeqCst};

use super::{table, Central, Slab, Span, ThreadHeap};
use crate::error::Error;
use crate::os::{self, PAGE_SIZE};

impl Slab {
    /// A heap for a thread: an abandoned one adopted whole, else a new one.
    pub(super) fn heap_for_thread(&self) -> *mut ThreadHeap {
        let mut c = self.central.lock();
        if !c.pool.is_null() {
            let h = c.pool;
            // SAFETY: a pooled heap of this slab, under the lock.
            unsafe {
                c.pool = (*h).next_pooled.get();
                (*h).next_pooled.set(ptr::null_mut());
                (*h).abandoned.store(false, SeqCst);
            }
            return h;
        }
        new_heap(&mut c).unwrap_or(ptr::null_mut())
    }

    /// Give up heap `h` (its thread exits, or its table slot is reused): its empty spans go
    /// back, it waits in the pool with its other spans for a thread to adopt it.
    pub(crate) fn abandon(&self, h: *mut ThreadHeap) {
        let mut out: *mut Span = ptr::null_mut();
        {
            let mut c = self.central.lock();
            // SAFETY: the heap of the calling thread, which gives it up: under the lock it
            // becomes the lock holder's.
            let heap = unsafe { &*h };
            heap.abandoned.store(true, SeqCst);
            // Store-buffering with `free_remote` (push, then load `abandoned`): `collect_all`'s
            // first looks at `thread_free` and `returned` are Relaxed loads, which a SeqCst store
            // does not order; the fence does (either they see the push, or the pusher's SeqCst
            // load sees the flag). Model-checked: tests/loom/slab_abandon.rs.
            fence(SeqCst);
            heap.collect_all(&mut out);
            Self::release_dropped_locked(&mut c, heap);
            self.uncount(out);
            heap.next_pooled.set(c.pool);
            c.pool = h;
        }
        self.give_back(out);
    }

    /// The calling thread gives back its heap's empty spans, current and spare ones too
    /// (`Allocator::drain_thread_cache`); spans with live objects stay, trimmed (trim.rs).
    /// Returns the pages those trims gave back (the empty spans' go to the page layer).
    pub(crate) fn trim_current(&self) -> u64 {
        let h = table::own_heap(self);
        if h.is_null() {
            return 0;
        }
        // SAFETY: this thread's own heap (owner).
        let before = unsafe { &*h }.trimmed_total.get();
        let mut out: *mut Span = ptr::null_mut();
        // SAFETY: this thread's own heap (owner).
        unsafe { &*h }.collect_all(&mut out);
        // SAFETY: as above.
        Self::release_dropped_locked(&mut self.central.lock(), unsafe { &*h });
        self.uncount(out);
        self.give_back(out);
        // SAFETY: as above.
        let h = unsafe { &*h };
        self.trim_all(h);
        self.trim_tails(h, false);
        h.trimmed_total.get().wrapping_sub(before)
    }

    // ---- Fork ----

    /// Lock the slab before `fork` (before the allocator lock: the slab gives spans back
    /// without its lock, so the order is slab, then allocator).
    pub(crate) fn before_fork(&self) {
        self.central.raw().lock();
    }

    /// # Safety
    /// The calling thread took the lock with `before_fork` and still holds it.
    pub(crate) unsafe fn after_fork_parent(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.central.raw().unlock() }
    }

    /// In the child: reset the lock, and give up every heap bound to a thread of the parent
    /// other than the forking one (those threads do not exist here): they become abandoned, in
    /// the pool, so that frees into their spans collect them.
    ///
    /// # Safety
    /// Only in the child of a `fork` whose forking thread called `before_fork`, before the
    /// child starts any thread.
    pub(crate) unsafe fn after_fork_child(&self) {
        // SAFETY: the caller's contract: the lock was held across the fork by the forking
        // thread, the only one in the child.
        unsafe { self.central.raw().reset_after_fork() };
        let mine = table::own_heap(self);
        let mut c = self.central.lock();
        let mut p = c.heaps;
        while !p.is_null() {
            // SAFETY: a heap of this slab, under the lock.
            let h = unsafe { &*p };
            p = h.next_heap.get();
            if !ptr::eq(h, mine) && !h.abandoned.load(SeqCst) {
                h.abandoned.store(true, SeqCst);
                h.next_pooled.set(c.pool);
                c.pool = h as *const ThreadHeap as *mut ThreadHeap;
            }
        }
    }
}

/// A new heap on a page of its own, registered, with the next id of the slab.
pub(super) fn new_heap(c: &mut Central) -> Result<*mut ThreadHeap, Error> {
    if c.made + 1 >= 1 << table::HEAP_BITS {
        return Err(Error::Os { op: "slab heap id", errno: libc::ENOMEM });
    }
    let page = os::scratch(PAGE_SIZE).map_err(|errno| Error::Os { op: "mmap (slab heap)", errno })?;
    c.made += 1;
    // SAFETY: a fresh page just mapped, used by nothing else.
    let h = unsafe { ThreadHeap::init(page, c.slab_id << table::HEAP_BITS | c.made) };
    // SAFETY: the heap just made; the list is the lock holder's (`&mut Central`).
    unsafe { (*h).next_heap.set(c.heaps) };
    c.heaps = h;
    Ok(h)
}

/// Every heap of the slab (under its lock).
pub(super) fn heaps(c: &Central) -> impl Iterator<Item = &ThreadHeap> {
    let mut p = c.heaps;
    core::iter::from_fn(move || {
        if p.is_null() {
            return None;
        }
        // SAFETY: a registered heap, live as long as the slab; the list is read under the lock.
        let h = unsafe { &*p };
        p = h.next_heap.get();
        Some(h)
    })
}

impl Central {
    pub(super) fn unmap_heaps(&mut self) {
        let mut p = self.heaps;
        while !p.is_null() {
            // SAFETY: a registered heap; nothing uses it once the slab is dropped.
            let next = unsafe { (*p).next_heap.get() };
            // SAFETY: as above: the heap's page, mapped by `new_heap`.
            unsafe { os::unmap(p as usize, PAGE_SIZE) };
            p = next;
        }
        self.heaps = ptr::null_mut();
    }
}

