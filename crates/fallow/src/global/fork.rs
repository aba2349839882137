//! The `fork` handlers of `FallowAlloc`: around a `fork`, every allocator a `FallowAlloc` has
//! created is locked (`Allocator::before_fork`: the slab's lock, then the allocator's), so that
//! no other thread is inside one when the address space is copied; the parent releases them, the
//! child resets them (`after_fork_child`: the parent's other threads' small-object heaps given
//! up, the workers to be restarted). Without them, a child forked while another thread of a
//! threaded program held one of those locks (a span taken, a cache refilled, a large block, the
//! statistics) would wait for it forever at its first request that needs it.
//!
//! - The handlers are registered once per process, with `pthread_atfork`, when the program (or
//!   the shared object holding this crate) is loaded (`.init_array`), before any thread of the
//!   program exists, as the preload library registers its own: registered at the creation of
//!   the first allocator, a `fork` by another thread between the registration and the flag
//!   saying it was done could leave a child with the handlers missing, or registered twice. They
//!   do nothing while no allocator is registered (a program that does not use `FallowAlloc`).
//! - An allocator is registered by the thread that creates it, before it is published
//!   (`LazyAllocator::get_or_create`'s `publish`), so before any other thread can use it. The
//!   table holds a handle of each (a clone, kept for the life of the process: `FallowAlloc`
//!   never drops its allocator either), so it stays valid whatever becomes of the
//!   `FallowAlloc` value. `SLOTS` allocators at most: a further one is not locked around a
//!   `fork` (a program has one global allocator; more are tests).
//! - `GUARD` is held by `prepare` until `parent` or `child`, and by a registration: the set of
//!   allocators cannot change between the handler that locks them and the ones that release or
//!   reset them. `len` is only written under it.
//! - Nothing here allocates: the table is static, a handle's clone counts a reference.
//!
//! The handlers lock these allocators themselves: calling `before_fork` on one of them before a
//! `fork` as well would take its lock twice (a deadlock).

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::allocator::Allocator;
use crate::lock::RawLock;

/// Allocators the handlers lock at most.
const SLOTS: usize = 16;

struct Registry {
    /// The first `len` slots hold a handle each; written under `GUARD` only.
    len: AtomicUsize,
    slots: [UnsafeCell<MaybeUninit<Allocator>>; SLOTS],
}

// SAFETY: a slot is written once, under `GUARD`, before `len` counts it (`Release`), and only
// read after (`Acquire` of `len`); `Allocator` is `Sync` (its own state is shared under its own
// locks and atomics).
unsafe impl Sync for Registry {}

static REGISTRY: Registry =
    Registry { len: AtomicUsize::new(0), slots: [const { UnsafeCell::new(MaybeUninit::uninit()) }; SLOTS] };
static GUARD: RawLock = RawLock::new();

/// Lock `a` around every later `fork` of this process; `false` when the table is full (then it
/// is not). Called by the thread that creates `a`, before it is published.
pub(crate) fn register(a: &Allocator) -> bool {
    GUARD.lock();
    let n = REGISTRY.len.load(Ordering::Relaxed);
    let room = n < SLOTS;
    if room {
        // SAFETY: slot `n` is not counted by `len` yet, so nobody reads it, and only this
        // thread writes it: registrations hold `GUARD`.
        unsafe { (*REGISTRY.slots[n].get()).write(a.clone()) };
        REGISTRY.len.store(n + 1, Ordering::Release);
    }
    // SAFETY: taken just above by this thread.
    unsafe { GUARD.unlock() };
    room
}

/// The registered allocators, in the order they were registered.
fn registered() -> impl DoubleEndedIterator<Item = &'static Allocator> {
    let n = REGISTRY.len.load(Ordering::Acquire);
    // SAFETY: the first `n` slots were written before `len` counted them (the `Acquire` above
    // pairs with `register`'s `Release`) and are never written again.
    REGISTRY.slots[..n].iter().map(|s| unsafe { (*s.get()).assume_init_ref() })
}

extern "C" fn prepare() {
    GUARD.lock();
    for a in registered() {
        a.before_fork();
    }
}

extern "C" fn parent() {
    for a in registered().rev() {
        // SAFETY: `prepare` called `before_fork` on each registered allocator in this thread,
        // and the set has not changed since (`GUARD` is held from `prepare` to here).
        unsafe { a.after_fork_parent() };
    }
    // SAFETY: `prepare` took the guard in this thread, and this is its parent-side end.
    unsafe { GUARD.unlock() };
}

extern "C" fn child() {
    for a in registered() {
        // SAFETY: the child of a `fork` whose `prepare` called `before_fork` on each registered
        // allocator (the set fixed by `GUARD` since); it has one thread, this one, and has
        // started none yet (the `fork` handlers run first).
        unsafe { a.after_fork_child() };
    }
    // SAFETY: the child has one thread, this one, which took the guard in `prepare`.
    unsafe { GUARD.reset_after_fork() };
}

extern "C" fn register_handlers() {
    // SAFETY: the handlers are `extern "C"` functions that live as long as the code holding
    // them; they reach only the static table, empty until a `FallowAlloc` creates an allocator.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Run by the dynamic loader when the program or shared object is loaded.
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = register_handlers;
