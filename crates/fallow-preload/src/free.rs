//! `free(3)` and `cfree`: fallow's pointers (by address) to fallow, which validates them; the
//! rest to glibc. `free` is one jump through `FREE_PATH.imp` to the path in force:
//!
//! - `free_pass` until the allocator with small objects is published, and for good with small
//!   objects off: the pass-through's test of the pointer against the span of the arenas
//!   (`in_span`: glibc's blocks cost two compares), fallow's pointers out of line.
//! - `free_sole` once it is (`switch_to_sole`, by the first free of a pointer in the span of
//!   the arenas that finds `SMALL` set): the owner's free of a small object of the first
//!   arena inline (`SpanMap::free_hot_sole` through this library's copy of the page map,
//!   `FREE_PATH.map`), with no test of the span, no load of `SMALL` and no allocator; every
//!   other case is one tail call: with `SMALL` loaded for a remote free, a span that moves, a
//!   page block or another arena's pointer; to glibc, after the span compare, for null and
//!   glibc's blocks.
//!
//! The map is plain data: written once, by the one thread that wins `state`, before the Release
//! store of `free_sole` in the jump's word, and never again; `free`'s jump reads that word (on
//! x86-64 a load has acquire semantics), so every thread that runs `free_sole` reads the map
//! after it was written, and nobody writes it while anyone reads it. The jump's word, the map
//! and `state` share one cache line of their own: a line shared with a counter some thread
//! writes (`remap.rs`'s) would be taken from every freeing thread at each write.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use fallow::binding_support::{fatal, FreeHot, FreeSole, RemoteFree, SpanMap, SpanMove};
use fallow::Allocator;

use crate::libc_heap::__libc_free;
use crate::process::{self, owner};

/// What `free` reads: the path it takes and, for `free_sole`, `SMALL`'s first arena and page
/// map of spans. One cache line, nothing else in it.
#[repr(C, align(64))]
pub(crate) struct FreePath {
    /// `free_pass`, then `free_sole` for good once the allocator with small objects is
    /// published (`switch_to_sole`). First: the naked `free` jumps through the struct's address.
    imp: AtomicPtr<()>,
    map: UnsafeCell<SpanMap>,
    /// `PASS`, `SWITCHING` (one thread writes `map`), `SOLE` (`imp` is `free_sole`).
    state: AtomicU8,
}

const PASS: u8 = 0;
const SWITCHING: u8 = 1;
const SOLE: u8 = 2;
// SAFETY: `imp` and `state` are atomics; `map` is written once, by the thread that moved
// `state` from `PASS` (`switch_to_sole`), before the Release store of `imp` that makes
// `free_sole` reachable, and read only by `free_sole` (see the module's comment): no write
// races with a read, and no two writes race.
unsafe impl Sync for FreePath {}
pub(crate) static FREE_PATH: FreePath = FreePath {
    imp: AtomicPtr::new(free_pass as *mut ()),
    map: UnsafeCell::new(SpanMap::EMPTY),
    state: AtomicU8::new(PASS),
};
const _: () = assert!(core::mem::offset_of!(FreePath, imp) == 0);

/// The body of a naked function that frees its first argument as `free` does: one jump
/// through `FREE_PATH.imp` (offset 0), an atomic load (on x86-64 with acquire semantics); the
/// pointer stays in its register for the path, whose contract is `free`'s, and a second
/// argument (a sized `operator delete`'s size) is left unread.
#[cfg(target_arch = "x86_64")]
macro_rules! free_jump {
    () => {
        core::arch::naked_asm!("jmp qword ptr [rip + {f}]", f = sym $crate::free::FREE_PATH)
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use free_jump;

/// `free(3)`: the path in force (`FREE_PATH.imp`), one jump with no frame.
///
/// # Safety
///
/// `p` is null or a live block from this family of functions, not used afterwards (free(3)'s
/// contract). A pointer inside fallow's reservation that is not a live block aborts.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn free(_p: *mut c_void) {
    free_jump!()
}

/// `free(3)`: the path in force (`FREE_PATH.imp`).
///
/// # Safety
///
/// As on x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: `imp` holds `free_pass` or `free_sole`, both of this type.
    let f: unsafe extern "C" fn(*mut c_void) = unsafe { core::mem::transmute(FREE_PATH.imp.load(Ordering::Acquire)) };
    // SAFETY: the caller's contract, passed on.
    unsafe { f(p) }
}

/// Whether `p` lies in the span of the arenas of this process (`SPAN_START..SPAN_END`, empty
/// until the allocator exists): outside it, it is not fallow's (null included). A pointer below
/// the span takes one compare, one above it two.
#[inline(always)]
pub(crate) fn in_span(p: *const c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: two aligned 8-byte reads of the core's span words, `AtomicUsize`s (on x86-64 a
    // memory operand is an atomic load, here as `Relaxed`, which is all the span needs: see
    // `SPAN_START`), compares and branches; no write, no stack.
    unsafe {
        core::arch::asm!(
            "cmp {p}, qword ptr [rip + {start}]",
            "jb 2f",
            "cmp {p}, qword ptr [rip + {end}]",
            "jb {yes}",
            "2:",
            p = in(reg) p,
            start = sym fallow::binding_support::SPAN_START,
            end = sym fallow::binding_support::SPAN_END,
            yes = label { return true },
            options(readonly, nostack),
        );
        false
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use core::sync::atomic::Ordering::Relaxed;
        let a = p as usize;
        a >= fallow::binding_support::SPAN_START.load(Relaxed) && a < fallow::binding_support::SPAN_END.load(Relaxed)
    }
}

/// The old `cfree`: `free`.
///
/// # Safety
///
/// As `free`.
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: the caller's contract is `free`'s.
    unsafe { free(p) }
}

/// Whether `free` goes straight to `free_sole` (for `fallow_preload_stats`).
pub(crate) fn sole_in_force() -> bool {
    FREE_PATH.state.load(Ordering::Relaxed) == SOLE
}

/// Make `free` take `free_sole`, `a` being `SMALL` (set, so for good): the first call does it,
/// the others (and every call once it is done) return at the load of `state`. A `fork` while a
/// thread is between its compare-exchange and its last store leaves the child on `free_pass`:
/// slower, as before the switch, and as correct.
#[cold]
fn switch_to_sole(a: &Allocator) {
    if FREE_PATH.state.load(Ordering::Relaxed) != PASS {
        return;
    }
    let Some(m) = a.span_map() else { return };
    if FREE_PATH.state.compare_exchange(PASS, SWITCHING, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        return;
    }
    // SAFETY: `free_sole` is not reachable yet, so nobody reads the map, and only this thread
    // (the one that moved `state` from `PASS`) writes it.
    unsafe { *FREE_PATH.map.get() = m };
    // Release: the map, and `SMALL` (loaded by this thread with `Acquire`), before any thread
    // runs `free_sole`.
    FREE_PATH.imp.store(free_sole as *mut (), Ordering::Release);
    FREE_PATH.state.store(SOLE, Ordering::Relaxed);
}

/// `free` of the pass-through: a pointer outside the span of the arenas is glibc's.
///
/// # Safety
///
/// As `free`.
unsafe extern "C" fn free_pass(p: *mut c_void) {
    if in_span(p) {
        // SAFETY: the caller's contract, passed on.
        return unsafe { free_in_span(p) };
    }
    // SAFETY: `p` is outside every arena, so not fallow's: by the caller's contract it is null or
    // a live glibc block, released once (glibc's `free` takes null).
    unsafe { __libc_free(p) }
}

/// `free` with small objects on and the allocator published in `SMALL` and its map in
/// `FREE_PATH.map`: the owner's free inline (no call, so no frame), everything else one tail call.
///
/// # Safety
///
/// As `free`.
unsafe extern "C" fn free_sole(p: *mut c_void) {
    // SAFETY: written before `imp` led here, never again (the module's comment).
    let m = unsafe { &*FREE_PATH.map.get() };
    // SAFETY: the map of `SMALL`, which lives for good and is the one allocator with small
    // objects this library makes requests of; `free_moved`, `free_remote` and `free_sole_cold`
    // pass `SMALL` on.
    match unsafe { m.free_hot_sole(p as *mut u8) } {
        FreeSole::Done => {}
        FreeSole::Moved(mv) => free_moved(mv),
        FreeSole::Remote(r) => free_remote(r),
        // SAFETY: the caller's contract, passed on.
        FreeSole::Cold => unsafe { free_sole_cold(p) },
    }
}

/// `SMALL`, from a path that only runs once it is set.
#[inline(always)]
fn published() -> &'static Allocator {
    // SAFETY: `SMALL` is stored before `imp` leads to `free_sole` (and before
    // `free_in_span` found it non-null), and never cleared.
    unsafe { process::small().unwrap_unchecked() }
}

/// The owner's free that must move its span (`FreeSole::Moved`).
#[inline(never)]
fn free_moved(mv: SpanMove<'static>) {
    // SAFETY: `SMALL`'s map gave `mv` to this thread's free just now.
    unsafe { mv.finish(published()) }
}

/// `free_sole` past its hot path: a pointer in the span of the arenas to `free_small`, others
/// (null, glibc's) to glibc.
///
/// # Safety
///
/// As `free`.
#[inline(never)]
unsafe fn free_sole_cold(p: *mut c_void) {
    if in_span(p) {
        // SAFETY: the caller's contract, passed on.
        return unsafe { free_small(p, published()) };
    }
    // SAFETY: as in `free_pass`.
    unsafe { __libc_free(p) }
}

/// `free` of a pointer in the span of the arenas: fallow's if an arena holds it, else glibc's.
/// Out of line, so that `free_pass` sets up no frame for glibc's pointers.
///
/// # Safety
///
/// As `free`.
#[inline(never)]
unsafe fn free_in_span(p: *mut c_void) {
    if let Some(a) = process::small() {
        switch_to_sole(a);
        // The hot path inline (no call, so no frame here), everything else one tail call: a
        // remote free `free_remote`, the rest `free_small`.
        return match a.free_hot_step(p as *mut u8) {
            FreeHot::Done => {}
            FreeHot::Remote(r) => free_remote(r),
            // SAFETY: the caller's contract, passed on.
            FreeHot::Cold => unsafe { free_small(p, a) },
        };
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { free_lazy(p) }
}

/// `free` of another thread's small object, checked by a hot path (`FreeHot::Remote`,
/// `FreeSole::Remote`). The allocator is read again from `SMALL` here rather than passed:
/// passed, the compiler loaded its slab's address for this call in the owner's path too (one
/// instruction on every free).
#[inline(never)]
fn free_remote(r: RemoteFree<'static>) {
    // SAFETY: `SMALL` is the allocator whose `free_hot_step` or map gave `r` (the one
    // small-object allocator of the process).
    if let Err(e) = unsafe { r.finish(published()) } {
        fatal("free", &e);
    }
}

/// `free` with small objects on and the allocator published, past the hot path (the pointer
/// first, as for `malloc_small`).
///
/// # Safety
///
/// As `free`.
#[inline(never)]
unsafe fn free_small(p: *mut c_void, a: &'static Allocator) {
    match a.free_cold(p as *mut u8) {
        Ok(true) => {}
        // SAFETY: `p` is in no arena, so by the caller's contract a live glibc block, released
        // once.
        Ok(false) => unsafe { __libc_free(p) },
        Err(e) => fatal("free", &e),
    }
}

/// `free` of a pointer in the span of the arenas with no allocator published for small
/// objects.
///
/// # Safety
///
/// As `free`.
#[inline(never)]
unsafe fn free_lazy(p: *mut c_void) {
    match owner(p as *const u8) {
        Some(a) => {
            // Small objects on (the allocator published, `SMALL` not yet set): `free_any`, which
            // answers for objects and page blocks alike.
            let r = if process::small_on() { a.free_any(p as *mut u8) } else { a.free(p as *mut u8) };
            if let Err(e) = r {
                fatal("free", &e)
            }
        }
        // SAFETY: `p` is in no arena, so by the caller's contract a live glibc block, released once.
        None => unsafe { __libc_free(p) },
    }
}
