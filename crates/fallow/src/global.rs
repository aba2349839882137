//! `FallowAlloc`: a `GlobalAlloc` for Rust programs that serves large requests from one
//! process-wide fallow allocator and everything else from the system allocator (`std::alloc::System`),
//! the Rust counterpart of the LD_PRELOAD library:
//!
//! ```ignore
//! #[global_allocator]
//! static A: fallow::FallowAlloc = fallow::FallowAlloc::new();
//! ```
//!
//! Invariants.
//! - Ownership is decided by address: a pointer is fallow's iff `Allocator::owns` says so (a
//!   lock-free range check), so `dealloc`/`realloc` never need to know who served the request,
//!   and a request served by the system during start-up is freed by the system later. With
//!   small objects on, `alloc` and `dealloc` first try the slab's hot paths inline, as the
//!   preload's `malloc` and `free` do (the first arena's page map tells an object of it; any
//!   other pointer takes one call, `Allocator::free_cold`, which also tells the system's).
//! - The allocator is created lazily by the first large request, through a [`LazyAllocator`]
//!   (defined here, and the preload library's process-wide allocator too): a [`StartGate`]
//!   (`start.rs`), `UNINIT -> creating (by thread tid) -> READY | FAILED` in one 32-bit atomic,
//!   and the slot it guards. Creating it allocates from the Rust heap (its `Arc`), which comes
//!   back here: the creating thread's own requests meanwhile go to the system (no recursion);
//!   any other thread waits for the creation and is then served by fallow, so that large
//!   requests racing at start-up all get fallow memory. (`std::thread::current()` allocates, so
//!   the creator is known by its kernel thread id, kept in the gate's word.)
//! - Requests above the largest fallow block, or with an alignment above it, go to the system.
//! - A bad pointer given to `dealloc` or `realloc` aborts through `message::fatal`, the
//!   preload's path too.
//! - `fork`: the allocator is registered, before it is published, with the process's `fork`
//!   handlers (`allocator/fork.rs`: registered with `pthread_atfork` at load time), which lock it
//!   around every `fork` and reset it in the child, so that a threaded program can `fork` and
//!   allocate in the child. When it cannot be registered (no page for the registry), the
//!   creation fails and the system serves every request, as when the allocator cannot be made.
//!
//! `FallowAlloc` reads no environment variable: its threshold and configuration are the
//! program's (`with_config`).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::{Cell, UnsafeCell};
use core::mem::MaybeUninit;
use core::ptr;
use std::alloc::System;

use crate::config::Config;
use crate::allocator::{fork, Allocator, FreeHot, RemoteFree};
use crate::error::Error;
use crate::flags::Flags;
use crate::message::fatal;
use crate::os::PAGE_SIZE;
use crate::slab::SMALL_ALIGN;
use crate::start::{Entry, StartGate};

/// A process-wide allocator created on first use: a [`StartGate`] and the slot it guards, the one
/// start-up of `FallowAlloc` and of the preload library's `malloc`. Nothing here allocates but
/// the creation itself.
pub struct LazyAllocator {
    gate: StartGate,
    slot: UnsafeCell<MaybeUninit<Allocator>>,
}

// SAFETY: the `UnsafeCell` is written once, by the one thread that got `Entry::Create` from the
// `StartGate`, before the gate says ready, and only read after it does (`get`); `Allocator`
// itself is shared between threads under its own lock.
unsafe impl Sync for LazyAllocator {}

impl LazyAllocator {
    pub const fn new() -> LazyAllocator {
        LazyAllocator { gate: StartGate::new(), slot: UnsafeCell::new(MaybeUninit::uninit()) }
    }

    /// The allocator, if it has been created (no waiting: for ownership checks, where no
    /// allocator means no pointer of ours).
    #[inline]
    pub fn get(&self) -> Option<&Allocator> {
        if self.gate.is_ready() {
            // SAFETY: the gate is ready only after `get_or_create` wrote the slot, which is never
            // written again.
            Some(unsafe { (*self.slot.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// The allocator, creating it on first use or waiting while another thread creates it;
    /// `None` when creating it failed, when this thread is creating it (a request from inside
    /// the creation), or when the creation has stalled (`StartGate::enter`): the caller then uses
    /// the system allocator.
    ///
    /// Only the creating thread runs the two functions: `make` gives the allocator (`None`: the
    /// creation failed, for good); `publish` gets it before any other thread can, with `ready`,
    /// which it calls to make the allocator visible and wake the waiters (the preload calls it
    /// under its fork guard); if `publish` returns without calling it, it is called then.
    #[cold]
    pub fn get_or_create(
        &self,
        make: impl FnOnce() -> Option<Allocator>,
        publish: impl FnOnce(&Allocator, &dyn Fn()),
    ) -> Option<&Allocator> {
        match self.gate.enter() {
            Entry::Ready => return self.get(),
            Entry::Failed | Entry::Reentrant | Entry::Stalled => return None,
            Entry::Create => {}
        }
        let Some(a) = make() else {
            self.gate.finish(false);
            return None;
        };
        // SAFETY: only the one thread that got `Entry::Create` writes the slot, before the gate
        // says ready; nobody reads it until then.
        unsafe { (*self.slot.get()).write(a) };
        // SAFETY: written just above, and never written again.
        let a = unsafe { (*self.slot.get()).assume_init_ref() };
        let published = Cell::new(false);
        let ready = || {
            if !published.replace(true) {
                self.gate.finish(true);
            }
        };
        publish(a, &ready);
        ready();
        Some(a)
    }
}

impl Default for LazyAllocator {
    fn default() -> Self {
        LazyAllocator::new()
    }
}

/// A global allocator: requests of at least `threshold` bytes from fallow, smaller ones from
/// `System`; with `Config::small_objects` (given by `with_config`), every request is fallow's
/// (`Allocator::malloc`: up to `Allocator::SMALL_MAX` bytes a small object, a page block above).
pub struct FallowAlloc {
    lazy: LazyAllocator,
    threshold: usize,
    config: Option<Config>,
}

impl FallowAlloc {
    /// Default threshold: requests of at least this many bytes go to fallow (see docs/design.md,
    /// "C API and preload", for the measurement behind it). The preload library's default too.
    pub const DEFAULT_THRESHOLD: usize = crate::env::DEFAULT_THRESHOLD;

    /// The default threshold and the default configuration.
    pub const fn new() -> FallowAlloc {
        FallowAlloc::with_threshold(FallowAlloc::DEFAULT_THRESHOLD)
    }

    /// Requests of at least `threshold` bytes go to fallow (at least one page).
    pub const fn with_threshold(threshold: usize) -> FallowAlloc {
        FallowAlloc {
            lazy: LazyAllocator::new(),
            threshold: if threshold < PAGE_SIZE { PAGE_SIZE } else { threshold },
            config: None,
        }
    }

    /// A threshold and a configuration of the process-wide allocator. With
    /// `config.small_objects` the threshold is not used: every request is fallow's.
    pub const fn with_config(threshold: usize, config: Config) -> FallowAlloc {
        FallowAlloc {
            lazy: LazyAllocator::new(),
            threshold: if threshold < PAGE_SIZE { PAGE_SIZE } else { threshold },
            config: Some(config),
        }
    }

    /// The fallow allocator behind this adapter, once a large request has created it.
    pub fn allocator(&self) -> Option<&Allocator> {
        self.lazy.get()
    }

    /// The allocator, creating it on first use (`LazyAllocator::get_or_create`); `None` sends
    /// the request to the system allocator.
    #[inline]
    fn get(&self) -> Option<&Allocator> {
        match self.lazy.get() {
            Some(a) => Some(a),
            None => {
                let make = || {
                    let a = Allocator::new(self.config.clone().unwrap_or_default()).ok()?;
                    // Locked around `fork` from before any other thread can use it.
                    fork::register(&a).ok()?;
                    Some(a)
                };
                self.lazy.get_or_create(make, |_, _| {})
            }
        }
    }

    /// The smallest request fallow serves as a page block: the threshold, or above the largest
    /// small object with small objects on.
    fn page_floor(&self) -> usize {
        if self.small() {
            Allocator::SMALL_MAX + 1
        } else {
            self.threshold
        }
    }

    /// Small objects on (`Config::small_objects` in the configuration given).
    #[inline(always)]
    fn small(&self) -> bool {
        matches!(&self.config, Some(c) if c.small_objects)
    }

    /// With small objects on, the slab's hot path alone (`Allocator::malloc_hot`: a request of
    /// at most 16 KiB and the objects' alignment, popped off this thread's current span of its
    /// class, no call but a `ZERO` request's memset); `None`: `alloc_flags` answers.
    #[inline(always)]
    fn alloc_hot(&self, layout: &Layout, flags: Flags) -> Option<*mut u8> {
        if !self.small() || layout.align() > SMALL_ALIGN {
            return None;
        }
        let p = self.lazy.get()?.malloc_hot(layout.size(), flags.contains(Flags::ZERO))?;
        Some(p.as_ptr())
    }

    /// `dealloc` with small objects on: the owner's free of an object inline (`free_hot_step`,
    /// whose lookup also tells a pointer outside the first arena), everything else one call.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`.
    #[inline(always)]
    unsafe fn dealloc_small(&self, p: *mut u8, layout: Layout) {
        let Some(a) = self.lazy.get() else {
            // No allocator: nothing of fallow's to free.
            // SAFETY: `p` came from `System` with `layout` (the caller's contract).
            return unsafe { System.dealloc(p, layout) };
        };
        // Every outcome but the owner's free is one call in tail position, so that the owner's
        // path sets up no frame.
        match a.free_hot_step(p) {
            FreeHot::Done => {}
            // SAFETY: `a`'s own `free_hot_step` gave `r`.
            FreeHot::Remote(r) => unsafe { dealloc_remote(a, r) },
            // SAFETY: the caller's contract, passed on.
            FreeHot::Cold => unsafe { dealloc_cold(a, p, layout) },
        }
    }

    /// `dealloc` with small objects off: a pointer in an arena is a page block (`free` keeps
    /// the page layer's hit path inline), any other `System`'s.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`.
    #[inline(never)]
    unsafe fn dealloc_pages(&self, p: *mut u8, layout: Layout) {
        match self.owner(p) {
            Some(a) => free_block(a, p),
            // SAFETY: `p` is not fallow's, so it came from `System` with `layout` (the caller's contract).
            None => unsafe { System.dealloc(p, layout) },
        }
    }

    #[inline]
    fn wants(&self, layout: &Layout) -> Option<&Allocator> {
        if layout.size() < self.threshold {
            return None;
        }
        let a = self.get()?;
        if layout.size() > a.max_block() || layout.align() > a.max_block() {
            return None;
        }
        Some(a)
    }

    #[inline]
    fn owner(&self, p: *const u8) -> Option<&Allocator> {
        let a = self.allocator()?;
        if a.owns(p) {
            Some(a)
        } else {
            None
        }
    }

    /// Every request but the slab's hot path's: the system's below the threshold with small
    /// objects off (the pass-through, inline, no frame), anything else `alloc_fallow`.
    #[inline(always)]
    fn alloc_flags(&self, layout: Layout, flags: Flags) -> *mut u8 {
        if !self.small() && layout.size() < self.threshold {
            return system_alloc(layout, flags);
        }
        self.alloc_fallow(layout, flags)
    }

    /// A request for fallow (or the system's when fallow cannot serve it).
    #[inline(never)]
    fn alloc_fallow(&self, layout: Layout, flags: Flags) -> *mut u8 {
        if self.small() {
            if let Some(a) = self.get() {
                if let Ok(p) = a.malloc(layout.size(), layout.align(), flags) {
                    return p.as_ptr();
                }
            }
        } else if let Some(a) = self.wants(&layout) {
            if let Ok(p) = a.alloc(layout.size(), layout.align(), flags) {
                return p.as_ptr();
            }
            // Exhaustion of fallow's reservation: the system may still have room.
        }
        system_alloc(layout, flags)
    }
}

/// The system's block for `layout` (zeroed for `ZERO`).
#[inline(always)]
fn system_alloc(layout: Layout, flags: Flags) -> *mut u8 {
    // SAFETY: `layout` comes from `GlobalAlloc::alloc`/`alloc_zeroed`, whose caller guarantees a
    // non-zero size, the one precondition of `System`'s.
    unsafe {
        if flags.contains(Flags::ZERO) {
            System.alloc_zeroed(layout)
        } else {
            System.alloc(layout)
        }
    }
}

impl Default for FallowAlloc {
    fn default() -> Self {
        FallowAlloc::new()
    }
}

// SAFETY: every block returned fits its layout (fallow's `alloc` honours size and alignment, or
// fails and `System` serves it); `dealloc` and `realloc` route a pointer by address (`owner`: in a
// fallow arena or not), so a block always goes back to the allocator that made it (a bad pointer
// aborts in `fatal`).
unsafe impl GlobalAlloc for FallowAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.alloc_hot(&layout, Flags::NONE) {
            Some(p) => p,
            None => self.alloc_flags(layout, Flags::NONE),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.alloc_hot(&layout, Flags::ZERO) {
            Some(p) => p,
            None => self.alloc_flags(layout, Flags::ZERO),
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if self.small() {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.dealloc_small(p, layout) };
        }
        // SAFETY: as above.
        unsafe { self.dealloc_pages(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        // SAFETY: `layout.align()` is a valid alignment and the caller guarantees `new_size`, rounded
        // up to it, does not overflow `isize` (`GlobalAlloc::realloc`'s contract).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if let Some(a) = self.owner(p) {
            if let Some(usable) = a.small_usable_size(p) {
                // A small object stays where it is while the new size fits its class and uses
                // more than half of it.
                if new_size <= usable && new_size > usable / 2 {
                    return p;
                }
            } else if new_size >= self.page_floor() && new_size <= a.max_block() {
                // Stays large: try in place first (grows into free pages after it, shrink gives
                // the tail back).
                match a.resize_in_place(p, new_size) {
                    Ok(true) => return p,
                    Ok(false) => {}
                    Err(e) => fatal("realloc", &e),
                }
            }
        } else if old < self.threshold && new_size < self.threshold {
            // SAFETY: `p` is not fallow's and was small, so `System` allocated it with `layout`; the
            // caller's contract for `new_size` is `System.realloc`'s own.
            return unsafe { System.realloc(p, layout, new_size) };
        }
        // SAFETY: `new_layout` has a non-zero size: `GlobalAlloc::realloc`'s caller guarantees
        // `new_size > 0`.
        let q = unsafe { self.alloc(new_layout) };
        if q.is_null() {
            return q;
        }
        // SAFETY: `p` is valid for `old` bytes (the caller's contract: a live block of `layout`) and
        // `q`, a new block, for `new_size`; they are distinct blocks.
        unsafe { ptr::copy_nonoverlapping(p, q, old.min(new_size)) };
        // SAFETY: `p` is a live block of this allocator with `layout` (the caller's contract), its
        // contents now copied; the caller will not use it again (`realloc` succeeded).
        unsafe { self.dealloc(p, layout) };
        q
    }
}

/// A failed free aborts with its message (`message::fatal`).
#[inline(always)]
fn or_fatal(r: Result<(), Error>) {
    if let Err(e) = r {
        fatal("dealloc", &e);
    }
}

/// A page block freed (`free` keeps the page layer's hit path inline), out of line: the
/// system's blocks, which pass `dealloc_pages` too, do not set up that path's frame.
#[inline(never)]
fn free_block(a: &Allocator, p: *mut u8) {
    or_fatal(a.free(p))
}

/// Another thread's object, checked by `dealloc`'s hot path: pushed back to its span's owner.
///
/// # Safety
/// `r` is what `a.free_hot_step` gave (`RemoteFree::finish`'s contract).
#[inline(never)]
unsafe fn dealloc_remote(a: &Allocator, r: RemoteFree<'_>) {
    // SAFETY: the caller's contract.
    or_fatal(unsafe { r.finish(a) })
}

/// `dealloc` with small objects on past its hot path: a page block, an object of an arena
/// after the first, bad input, or `System`'s block (outside every arena: `free_cold` says
/// `false`).
///
/// # Safety
/// As `GlobalAlloc::dealloc`, with `a` the allocator of the `FallowAlloc` whose `dealloc` it
/// is: a pointer outside `a`'s arenas is then `System`'s.
#[inline(never)]
unsafe fn dealloc_cold(a: &Allocator, p: *mut u8, layout: Layout) {
    match a.free_cold(p) {
        Ok(true) => {}
        // SAFETY: `p` lies in none of fallow's arenas, so `System` allocated it with `layout`
        // (the caller's contract).
        Ok(false) => unsafe { System.dealloc(p, layout) },
        Err(e) => fatal("dealloc", &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Option<Allocator> {
        Allocator::new(Config { arena_size: 64 << 20, max_order: 10, ..Config::default() }).ok()
    }

    #[test]
    fn lazy_allocator_publishes_once_when_the_creator_says_ready() {
        let lazy = LazyAllocator::new();
        let mut calls = 0;
        let a = lazy.get_or_create(small, |a, ready| {
            calls += 1;
            // Written, not yet visible, then visible: `ready` publishes, and twice is once.
            assert!(lazy.get().is_none());
            ready();
            assert!(core::ptr::eq(lazy.get().unwrap(), a));
            ready();
        });
        assert_eq!(calls, 1);
        let a = a.expect("created");
        let again = lazy.get_or_create(|| panic!("created twice"), |_, _| panic!("published twice"));
        assert!(core::ptr::eq(again.unwrap(), a));

        // A `publish` that does not call `ready`: published when it returns.
        let lazy = LazyAllocator::new();
        assert!(lazy.get_or_create(small, |_, _| {}).is_some() && lazy.get().is_some());

        // A failed creation is final: later requests go to the system without trying again.
        let lazy = LazyAllocator::new();
        assert!(lazy.get_or_create(|| None, |_, _| panic!("nothing to publish")).is_none());
        assert!(lazy.get_or_create(|| panic!("tried again"), |_, _| {}).is_none());
        assert!(lazy.get().is_none());
    }

    #[test]
    fn routes_by_size_and_frees_by_address() {
        static A: FallowAlloc = FallowAlloc::with_threshold(64 << 10);
        // SAFETY: every pointer passed back is one `A` returned with that same layout, and the reads and
        // writes stay inside the blocks.
        unsafe {
            let small = A.alloc(Layout::from_size_align(100, 8).unwrap());
            let big = A.alloc_zeroed(Layout::from_size_align(1 << 20, 4096).unwrap());
            let a = A.allocator().expect("created by the large request");
            assert!(!a.owns(small));
            assert!(a.owns(big));
            assert_eq!(*big.add((1 << 20) - 1), 0);
            *big = 7;
            // Grow across the threshold from small and shrink back below it.
            let grown = A.realloc(small, Layout::from_size_align(100, 8).unwrap(), 200 << 10);
            assert!(a.owns(grown));
            let shrunk = A.realloc(grown, Layout::from_size_align(200 << 10, 8).unwrap(), 50);
            assert!(!a.owns(shrunk));
            let big2 = A.realloc(big, Layout::from_size_align(1 << 20, 4096).unwrap(), 3 << 20);
            assert_eq!(*big2, 7);
            A.dealloc(shrunk, Layout::from_size_align(50, 8).unwrap());
            A.dealloc(big2, Layout::from_size_align(3 << 20, 4096).unwrap());
            assert_eq!(a.stats().live_blocks, 0);
            a.check_invariants().unwrap();
        }
    }

    #[test]
    fn small_objects_on_serve_small_requests_and_realloc_within_a_class() {
        let config = Config { arena_size: 64 << 20, max_order: 10, small_objects: true, ..Config::default() };
        static A: std::sync::OnceLock<FallowAlloc> = std::sync::OnceLock::new();
        let fa = A.get_or_init(|| FallowAlloc::with_config(1 << 20, config));
        let l = |size| Layout::from_size_align(size, 8).unwrap();
        // SAFETY: every pointer passed back is one `fa` returned with that same layout, and the
        // reads and writes stay inside the objects.
        unsafe {
            let p = fa.alloc(l(100));
            let a = fa.allocator().expect("created by the first small request");
            assert!(a.owns(p) && a.usable_size(p) == Some(112));
            p.write_bytes(9, 100);
            // Within its class: in place.
            assert_eq!(fa.realloc(p, l(100), 110), p);
            // To another class: moved, contents kept.
            let q = fa.realloc(p, l(110), 3000);
            assert_ne!(q, p);
            assert!((0..100).all(|i| *q.add(i) == 9));
            let z = fa.alloc_zeroed(l(3000));
            assert!((0..3000).all(|i| *z.add(i) == 0));
            // Above the small limit, below the threshold: fallow's page block (every size is
            // fallow's with small objects on), resized in place.
            let s = fa.alloc(l(Allocator::SMALL_MAX + 4096));
            assert!(a.owns(s) && a.small_usable_size(s).is_none());
            s.write_bytes(3, Allocator::SMALL_MAX + 4096);
            let t = fa.realloc(s, l(Allocator::SMALL_MAX + 4096), Allocator::SMALL_MAX + 2048);
            assert_eq!(t, s, "a page block shrunk within its pages moved");
            // Down to a small object: moved, contents kept.
            let u = fa.realloc(t, l(Allocator::SMALL_MAX + 2048), 1000);
            assert!(a.small_usable_size(u).is_some() && (0..1000).all(|i| *u.add(i) == 3));
            fa.dealloc(u, l(1000));
            fa.dealloc(q, l(3000));
            fa.dealloc(z, l(3000));
            a.drain_thread_cache();
            assert_eq!((a.stats().small_live_objects, a.stats().small_spans), (0, 0));
            a.check_invariants().unwrap();
        }
    }

    #[test]
    fn small_objects_on_dealloc_takes_each_path() {
        let config = Config { arena_size: 64 << 20, max_order: 10, small_objects: true, ..Config::default() };
        static A: std::sync::OnceLock<FallowAlloc> = std::sync::OnceLock::new();
        let fa = A.get_or_init(|| FallowAlloc::with_config(1 << 20, config));
        let l = |size| Layout::from_size_align(size, 16).unwrap();
        // SAFETY: every pointer passed back is one `fa` (or `System`, before `fa` has an
        // allocator) returned with that same layout, freed once; the writes stay inside the
        // blocks.
        unsafe {
            // Before the allocator exists: the system's block goes back to the system.
            let early = System.alloc(l(64));
            fa.dealloc(early, l(64));
            assert!(fa.allocator().is_none());
            // The owner's free (the inline path), and its `alloc_zeroed` of a freed object.
            let p = fa.alloc(l(64));
            let a = fa.allocator().expect("created by the first small request");
            p.write_bytes(7, 64);
            fa.dealloc(p, l(64));
            let z = fa.alloc_zeroed(l(64));
            assert!((0..64).all(|i| *z.add(i) == 0));
            fa.dealloc(z, l(64));
            // Another thread's objects (`FreeHot::Remote`), and this thread's freed by another.
            let mine: Vec<usize> = (0..100).map(|_| fa.alloc(l(48)) as usize).collect();
            let theirs: Vec<usize> = std::thread::spawn(move || (0..100).map(|_| fa.alloc(l(48)) as usize).collect()).join().unwrap();
            for &q in &theirs {
                fa.dealloc(q as *mut u8, l(48));
            }
            std::thread::spawn(move || {
                for &q in &mine {
                    fa.dealloc(q as *mut u8, l(48));
                }
            })
            .join()
            .unwrap();
            // Enough objects for several spans, freed in order: the frees that empty a span other
            // than the current one move it (`Freed::Moved`, the hot path's one call).
            let many: Vec<*mut u8> = (0..5000).map(|_| fa.alloc(l(48))).collect();
            assert!(a.stats().small_spans >= 3);
            for &q in &many {
                fa.dealloc(q, l(48));
            }
            // A page block (the cold path's page layer) and a system's block (outside every
            // arena, as one from before the allocator existed: the cold path gives it to
            // `System`).
            let big = fa.alloc(l(2 << 20));
            assert!(a.owns(big));
            big.write_bytes(1, 2 << 20);
            fa.dealloc(big, l(2 << 20));
            let sys = System.alloc(l(Allocator::SMALL_MAX + 4096));
            assert!(!a.owns(sys));
            fa.dealloc(sys, l(Allocator::SMALL_MAX + 4096));
            a.drain_thread_cache();
            let s = a.stats();
            assert_eq!((s.small_live_objects, s.bytes_in_use), (0, 0), "{s}");
            a.check_invariants().unwrap();
        }
    }
}
