//! The `fork` registry: the allocators that `FallowAlloc` and the C library create are locked
//! around every `fork` of the process (`Allocator::before_fork`: the slab's lock, then the
//! allocator's), so that no other thread is inside one when the address space is copied; the
//! parent releases them, the child resets them (`after_fork_child`: the parent's other threads'
//! small-object heaps given up, the workers restarted when there is work for them). Without
//! this, a child forked while another thread of a threaded program held one of those locks (a
//! span taken, a cache refilled, a large block, the statistics, a worker's batch) would wait for
//! it forever at its first request that needs it.
//!
//! - The handlers are registered once per process, with `pthread_atfork`, when the program (or
//!   the shared object holding this crate) is loaded (`.init_array`), before any thread of the
//!   program exists, as the preload library registers its own: registered at the creation of
//!   the first allocator, a `fork` by another thread between the registration and the flag
//!   saying it was done could leave a child with the handlers missing, or registered twice.
//!   They do nothing while no allocator is registered.
//! - An allocator is registered by the thread that creates it, before any other thread can
//!   reach it (`register`: `FallowAlloc` before it publishes it, the C library before it returns
//!   the handle), and removed by the thread that destroys it (`release`), after the drop of its
//!   last handle has joined its workers and before its memory goes: a `fork` meanwhile still
//!   locks it, so no worker of it can hold its lock in a child.
//! - The registry is a list of chunks of slots: the first chunk static, a further one mapped
//!   (`mmap`, never `malloc`) by a registration that finds every slot taken, and kept for the
//!   life of the process; a removal empties its slot for the next registration. So there is no
//!   limit but memory (a page per `CHUNK` allocators alive at once), and creating and destroying
//!   allocators in a loop reuses the same slots.
//! - `GUARD` is held by `prepare` until `parent` or `child`, and by a registration or a removal:
//!   the set of allocators cannot change between the handler that locks them and the ones that
//!   release or reset them. Every slot and link is read and written under it only. Nothing done
//!   under it allocates or takes another lock but the handlers' allocator locks (taken after
//!   it): a preloaded `malloc` whose own `fork` handler ran first may hold its lock while ours
//!   waits for `GUARD`.
//!
//! The handlers lock these allocators themselves: calling `before_fork` on one of them before a
//! `fork` as well would take its lock twice (a deadlock).

use core::cell::UnsafeCell;
use core::mem::{size_of, ManuallyDrop};
use core::ptr;
use std::sync::Arc;

use super::Allocator;
use crate::error::Error;
use crate::lock::RawLock;
use crate::os::{self, PAGE_SIZE};

/// A registered allocator: its shared state and its slab, held as an `Allocator` that does not
/// count as a handle (`Shared::handles`; `Allocator`'s drop, which releases one, never runs on
/// it). The registry must not keep the workers alive: the drop of the last real handle joins
/// them while the allocator is still registered. The two `Arc`s keep its memory mapped until
/// `release` takes the entry out.
struct Entry(ManuallyDrop<Allocator>);

impl Entry {
    fn of(a: &Allocator) -> Entry {
        Entry(ManuallyDrop::new(Allocator { shared: a.shared.clone(), slab: a.slab.clone(), keys: a.keys.clone() }))
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: each `Arc` that `of` cloned is dropped once, here (the slab's `keys` beside
        // them are plain data); the `Allocator` around them is never used or dropped again
        // (`ManuallyDrop`), so no handle is released that `of` did not take.
        unsafe {
            ptr::drop_in_place(&mut self.0.shared);
            ptr::drop_in_place(&mut self.0.slab);
        }
    }
}

/// Slots of a chunk: as many as fill a page with the link.
const CHUNK: usize = (PAGE_SIZE - size_of::<usize>()) / size_of::<Option<Entry>>();

/// A page of slots and the link to the next chunk (null: the last).
#[repr(C)]
struct Chunk {
    next: UnsafeCell<*mut Chunk>,
    slots: [UnsafeCell<Option<Entry>>; CHUNK],
}

const _: () = assert!(size_of::<Chunk>() <= PAGE_SIZE && CHUNK >= 16);

impl Chunk {
    const fn new() -> Chunk {
        Chunk { next: UnsafeCell::new(ptr::null_mut()), slots: [const { UnsafeCell::new(None) }; CHUNK] }
    }
}

/// The first chunk, static: a program with a few allocators maps nothing.
struct Registry(Chunk);

// SAFETY: every slot and link is read and written only by a thread holding `GUARD` (or, in a
// `fork` child, by its one thread, whose parent took it); an `Entry` is an `Allocator`'s two
// `Arc`s, and `Allocator` is `Send` and `Sync` (its state is shared under its own locks).
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry(Chunk::new());
static GUARD: RawLock = RawLock::new();

/// The chunks, first to last.
///
/// # Safety
/// The caller holds `GUARD` while it uses what the iterator gives (links and slots change under
/// it only).
unsafe fn chunks() -> impl Iterator<Item = &'static Chunk> {
    let mut c: *const Chunk = &REGISTRY.0;
    core::iter::from_fn(move || {
        // SAFETY: `c` is null or a chunk, the static one or one `grow` mapped, never unmapped.
        let chunk = unsafe { c.as_ref()? };
        // SAFETY: the caller holds `GUARD`, under which alone a link is written.
        c = unsafe { *chunk.next.get() };
        Some(chunk)
    })
}

/// Call `f` on every registered allocator, in the order of the slots.
///
/// # Safety
/// The caller holds `GUARD`; `f` does not register or remove an allocator.
unsafe fn for_each(mut f: impl FnMut(&Allocator)) {
    // SAFETY: the caller holds `GUARD`.
    for chunk in unsafe { chunks() } {
        for slot in &chunk.slots {
            // SAFETY: slots are written under `GUARD` only, which the caller holds, and `f`
            // writes none.
            if let Some(e) = unsafe { &*slot.get() } {
                f(&e.0);
            }
        }
    }
}

/// A chunk mapped, empty, and linked after `last`; `Err(errno)` when the kernel refuses the page.
///
/// # Safety
/// The caller holds `GUARD`, and `last` is the last chunk.
unsafe fn grow(last: &Chunk) -> Result<&'static Chunk, i32> {
    let page = os::scratch(PAGE_SIZE)? as *mut Chunk;
    // SAFETY: `page` is a fresh private mapping of a page, large enough for a `Chunk` and
    // aligned to one; nobody else knows of it yet.
    unsafe { page.write(Chunk::new()) };
    // SAFETY: the caller holds `GUARD`, under which alone a link is written; `last` is the last
    // chunk, so nothing follows it.
    unsafe { *last.next.get() = page };
    // SAFETY: initialised above, and never unmapped.
    Ok(unsafe { &*page })
}

/// Lock `a` around every later `fork` of this process, until `release`. Called by the thread
/// that creates `a`, before any other thread can reach it. `Err` (`Error::Os`, ENOMEM) only when
/// every slot is taken and the kernel refuses a page for more; `a` is then not registered.
pub fn register(a: &Allocator) -> Result<(), Error> {
    GUARD.lock();
    let mut last = &REGISTRY.0;
    // SAFETY: `GUARD` is held until the end of this function.
    let free = unsafe { chunks() }.find_map(|chunk| {
        last = chunk;
        // SAFETY: slots are read under `GUARD` only.
        chunk.slots.iter().find(|s| unsafe { (*s.get()).is_none() })
    });
    let slot = match free {
        Some(slot) => Ok(slot),
        // SAFETY: `GUARD` is held, and `last` is the last chunk (the search went through them
        // all when it found no empty slot).
        None => unsafe { grow(last) }.map(|chunk| &chunk.slots[0]),
    };
    let r = match slot {
        Ok(slot) => {
            // SAFETY: an empty slot, written under `GUARD`; the `Arc` clones allocate nothing.
            unsafe { *slot.get() = Some(Entry::of(a)) };
            Ok(())
        }
        Err(errno) => Err(Error::Os { op: "mapping a page for the fork registry", errno }),
    };
    // SAFETY: taken at the top by this thread.
    unsafe { GUARD.unlock() };
    r
}

/// Destroy `a`, the last handle of an allocator `register`ed: drop it first (its workers are
/// stopped and joined, the allocator still locked around any `fork` meanwhile), then take its
/// entry out of the registry, then drop the entry (which unmaps the allocator's memory unless
/// a thread is still draining a cache into it). Nothing but the removal happens under `GUARD`.
pub fn release(a: Allocator) {
    let key = Arc::as_ptr(&a.shared);
    drop(a);
    GUARD.lock();
    let mut taken = None;
    // SAFETY: `GUARD` is held until the unlock below.
    for chunk in unsafe { chunks() } {
        for slot in &chunk.slots {
            // SAFETY: slots are read and written under `GUARD` only.
            let s = unsafe { &mut *slot.get() };
            if s.as_ref().is_some_and(|e| Arc::as_ptr(&e.0.shared) == key) {
                taken = s.take();
            }
        }
    }
    // SAFETY: taken above by this thread.
    unsafe { GUARD.unlock() };
    drop(taken);
}

extern "C" fn prepare() {
    GUARD.lock();
    // SAFETY: `GUARD` is held (until `parent` or `child`); `before_fork` registers nothing.
    unsafe { for_each(|a| a.before_fork()) };
}

extern "C" fn parent() {
    let release = |a: &Allocator| {
        // SAFETY: `prepare` called `before_fork` on each registered allocator in this thread,
        // and the set has not changed since (`GUARD` is held from `prepare` to here).
        unsafe { a.after_fork_parent() }
    };
    // SAFETY: `GUARD` is held since `prepare`; `release` registers nothing.
    unsafe { for_each(release) };
    // SAFETY: `prepare` took the guard in this thread, and this is its parent-side end.
    unsafe { GUARD.unlock() };
}

extern "C" fn child() {
    let reset = |a: &Allocator| {
        // SAFETY: the child of a `fork` whose `prepare` called `before_fork` on each registered
        // allocator (the set fixed by `GUARD` since); it has one thread, this one, and has
        // started none yet (the `fork` handlers run first).
        unsafe { a.after_fork_child() }
    };
    // SAFETY: the child's one thread, this one, holds `GUARD` since `prepare`; `reset`
    // registers nothing (a worker it restarts is started later, by a free).
    unsafe { for_each(reset) };
    // SAFETY: the child has one thread, this one, which took the guard in `prepare`.
    unsafe { GUARD.reset_after_fork() };
    // SAFETY: the child's one thread, before it starts any.
    unsafe { crate::worker::exit_watch::after_fork_child() };
}

extern "C" fn register_handlers() {
    // SAFETY: the handlers are `extern "C"` functions that live as long as the code holding
    // them; they reach only the registry, empty until an allocator is registered, and the
    // watch of the first thread.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    // The first thread's watch, in the same load-time call (worker/exit_watch.rs).
    crate::worker::exit_watch::at_load();
}

/// Run by the dynamic loader when the program or shared object is loaded.
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = register_handlers;

/// Run when the shared object is unloaded (`dlclose`) or the process exits: the first thread's
/// key goes with the code of its destructor (glibc drops the `fork` handlers itself).
extern "C" fn at_unload() {
    crate::worker::exit_watch::at_unload();
}

#[used]
#[link_section = ".fini_array"]
static AT_UNLOAD: extern "C" fn() = at_unload;

#[cfg(test)]
mod tests;
