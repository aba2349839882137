//! The exported `malloc` family. Every function answers for fallow's pointers, whatever the
//! caller asks about them (`free`, `cfree`, `realloc`, `reallocarray`, `malloc_usable_size`),
//! and hands everything else to glibc's `__libc_*` entry points.
//!
//! Routing: a request of at least the threshold and at most the largest fallow block goes to
//! fallow; if fallow cannot serve it (its reservation is exhausted) glibc is asked, and if glibc
//! cannot either the answer is `NULL` with `errno = ENOMEM`. A pointer is fallow's iff it lies in
//! fallow's reservation (`Allocator::owns`); inside it, a pointer that is not the start of a live
//! block is a caller bug: message on stderr, then `abort()`, as glibc does
//! (`fallow::binding_support::fatal`, `FallowAlloc`'s path too). A `malloc` or `calloc` below
//! the threshold, from a quarter of it (`process::hot_floor`), is served by the block this thread
//! freed last into its cache if that block may hold it (`Allocator::alloc_from_hot`), else by
//! glibc: a loop of sizes on both sides of the threshold then reuses one block, as glibc reuses
//! one chunk, instead of writing a glibc chunk and a fallow block in turn.
//!
//! The pass-through. Most requests of most programs are glibc's, so what runs before glibc is
//! reached is kept to the least that decides: `malloc` compares the size with that quarter of the
//! threshold (`leaves_pass_through`), `free` compares the pointer with the span of fallow's arenas
//! (`in_span`: two compares, none when the pointer is below the span, as a C library block of
//! the main heap is; after one jump, `free.rs`), `calloc` the product, `realloc` both; then a tail jump to glibc's
//! `__libc_*` function, with no frame of ours. Everything else (the settings on the first request,
//! the allocator's existence, `owns`, the largest block) is asked out of line, only by requests
//! that pass those tests. On x86-64 each compare reads its word from memory itself (`asm!`):
//! the compiler gives an atomic load an instruction of its own.
//!
//! Small objects (`FALLOW_SMALL=1`): the threshold stays 0 (`process.rs`), so `malloc`, `calloc`
//! and `realloc` always take their out-of-line half, which loads `process::SMALL` first and, once
//! the allocator is published there, calls `Allocator::malloc` (the slab layer up to 64 KiB, page
//! blocks above) with nothing else asked; before that (the first requests, or the creating thread's
//! own during the creation) they take the lazy path of large requests, which may send them to
//! glibc. `free` (`free.rs`) then jumps to its small-object path, which frees the owner's objects
//! through the library's own copy of the page map; `Allocator::free_cold` answers for the rest
//! (page blocks, other arenas), glibc for pointers outside the span of the arenas, and a bad or
//! twice-freed pointer aborts through `fatal`. `realloc` of a small object stays in place when
//! the new size is in its class (`remap::realloc_any`). With small objects off nothing here
//! changes but `free`'s one jump: the threshold compare decides as before, and `SMALL` is never
//! set.

use core::ffi::{c_int, c_void};
use core::ptr;

use fallow::binding_support::fatal;
use fallow::{Allocator, Error, Flags};

use crate::libc_heap::*;
use crate::free::{free, in_span};
use crate::process::{self, for_request, owner};
use crate::remap;

const MIN_ALIGN: usize = 16;

#[inline]
fn enomem() -> *mut c_void {
    fallow::binding_support::set_errno(libc::ENOMEM);
    ptr::null_mut()
}

/// A request fallow may serve: fallow if it can, else `None` (the caller asks glibc).
/// `Allocator::malloc`: with small objects off a page block as `Allocator::alloc` gives it (the
/// request is at least the threshold), with them on a small object up to 64 KiB.
#[inline]
fn from_fallow(a: &Allocator, size: usize, align: usize, flags: Flags) -> Option<*mut c_void> {
    a.malloc(size, align, flags).ok().map(|p| p.as_ptr() as *mut c_void)
}

/// A request below the threshold that this thread's hot block may serve (`process::for_hot_block`,
/// `Allocator::alloc_from_hot`), else `None` (the caller asks glibc): a loop of sizes on both
/// sides of the threshold stays in one block.
#[inline]
fn from_hot_block(size: usize, flags: Flags) -> Option<*mut c_void> {
    let p = process::for_hot_block(size)?.alloc_from_hot(size, flags)?;
    Some(p.as_ptr() as *mut c_void)
}

/// Whether a request of `size` bytes may be fallow's: `size >= OUT_OF_LINE_FROM` (below the
/// threshold only the hot block may serve it: `process::hot_floor`), 0 until the settings are
/// parsed (so the first request takes the path that parses them, `for_request`). One compare
/// that reads the word itself.
#[inline(always)]
pub(crate) fn leaves_pass_through(size: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: one aligned 8-byte read of `OUT_OF_LINE_FROM`, an `AtomicUsize` (on x86-64 a plain
    // `mov` or memory operand is an atomic load, here as `Relaxed`: the value is one word,
    // written once), a compare and a branch; no write, no stack.
    unsafe {
        core::arch::asm!(
            "cmp {size}, qword ptr [rip + {threshold}]",
            "jae {yes}",
            size = in(reg) size,
            threshold = sym process::OUT_OF_LINE_FROM,
            yes = label { return true },
            options(readonly, nostack),
        );
        false
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        size >= process::known_out_of_line_from()
    }
}

/// `malloc(3)`: large requests from fallow, the rest (and what fallow cannot serve) from glibc.
///
/// # Safety
///
/// Any `size` is sound; the block returned is the caller's, to be released only through `free`,
/// `realloc` and friends (malloc(3)'s contract).
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if leaves_pass_through(size) {
        return malloc_large(size);
    }
    // SAFETY: glibc's `malloc` takes any size; the caller owns the block returned.
    unsafe { __libc_malloc(size) }
}

/// `malloc` of a request that may be fallow's (at least the threshold, or the settings not yet
/// parsed). Inline in `malloc`: nothing here sets up a frame, so the pass-through's compare
/// and jump stay as they were, and with small objects on `malloc` saves a jump.
///
/// With small objects on, the slab's hot path inline (`Allocator::malloc_hot_sole`: the
/// thread's heap, with no load of `SMALL` and no compare of its slab; no call, so no frame)
/// and everything else one tail call, with the allocator once published.
#[inline(always)]
fn malloc_large(size: usize) -> *mut c_void {
    // SAFETY: `SMALL` is the only allocator with small objects the preload makes requests of.
    if let Some(p) = unsafe { Allocator::malloc_hot_sole(size, false) } {
        return p.as_ptr() as *mut c_void;
    }
    malloc_past_pop(size)
}

/// `malloc_large` past the pop: cold, so that the pop is the fall-through path of `malloc`.
#[cold]
#[inline(never)]
fn malloc_past_pop(size: usize) -> *mut c_void {
    if let Some(a) = process::small() {
        return malloc_small(size, a);
    }
    malloc_lazy(size)
}

/// `malloc` with small objects on and the allocator published, past the hot path. The size
/// first, where the caller has it (the first argument's register): no move before the jump.
#[inline(never)]
pub(crate) fn malloc_small(size: usize, a: &'static Allocator) -> *mut c_void {
    if process::within_largest_block(size, MIN_ALIGN) {
        if let Ok(p) = a.malloc_cold(size, MIN_ALIGN, Flags::NONE) {
            return p.as_ptr() as *mut c_void;
        }
    }
    // SAFETY: glibc's `malloc` takes any size; the caller owns the block returned.
    unsafe { __libc_malloc(size) }
}

/// `malloc` of a request that may be fallow's, with no allocator published for small objects:
/// the lazy path (settings, creation).
#[inline(never)]
pub(crate) fn malloc_lazy(size: usize) -> *mut c_void {
    if let Some(a) = for_request(size, MIN_ALIGN) {
        if let Some(p) = from_fallow(a, size, MIN_ALIGN, Flags::NONE) {
            return p;
        }
    } else if let Some(p) = from_hot_block(size, Flags::NONE) {
        return p;
    }
    // SAFETY: glibc's `malloc` takes any size; the caller owns the block returned.
    unsafe { __libc_malloc(size) }
}

/// `calloc(3)`: as `malloc`, zeroed; `n * size` overflowing is `ENOMEM`.
///
/// # Safety
///
/// Any `n` and `size` are sound; the block returned is the caller's, as for `malloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    // A product that overflows and wraps below the threshold goes to glibc's `calloc`, which
    // sees the overflow itself (`ENOMEM`), as `calloc_large` does.
    if leaves_pass_through(n.wrapping_mul(size)) {
        return calloc_large(n, size);
    }
    // SAFETY: glibc's `calloc` takes any `n` and `size` (it checks the product itself).
    unsafe { __libc_calloc(n, size) }
}

/// `calloc` of a request that may be fallow's: out of line, so that glibc's requests' path
/// sets up no frame (the memset's call would give `calloc` one).
///
/// With small objects on, the hot path inline (a reused object, memset) and everything else
/// one tail call, as `malloc_large`.
#[inline(never)]
fn calloc_large(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else { return enomem() };
    // SAFETY: `SMALL` is the only allocator with small objects the preload makes requests of.
    if let Some(p) = unsafe { Allocator::malloc_hot_sole(total, true) } {
        return p.as_ptr() as *mut c_void;
    }
    if let Some(a) = process::small() {
        return calloc_small(a, n, size, total);
    }
    calloc_lazy(n, size, total)
}

/// `calloc` of `total` bytes (`n` times `size`) with small objects on and the allocator
/// published, past the hot path.
#[inline(never)]
fn calloc_small(a: &'static Allocator, n: usize, size: usize, total: usize) -> *mut c_void {
    if process::within_largest_block(total, MIN_ALIGN) {
        // A span made for a zeroed request reads zero where it never handed an object out.
        if let Ok(p) = a.malloc_cold(total, MIN_ALIGN, Flags::ZERO) {
            return p.as_ptr() as *mut c_void;
        }
    }
    // SAFETY: glibc's `calloc` takes any `n` and `size`.
    unsafe { __libc_calloc(n, size) }
}

/// `calloc` of `total` bytes (`n` times `size`) that may be fallow's, with no allocator
/// published for small objects: the lazy path.
#[inline(never)]
fn calloc_lazy(n: usize, size: usize, total: usize) -> *mut c_void {
    if let Some(a) = for_request(total, MIN_ALIGN) {
        // No memset for pages that are zeroed or reported: the core knows each page's state.
        if let Some(p) = from_fallow(a, total, MIN_ALIGN, Flags::ZERO) {
            return p;
        }
    } else if let Some(p) = from_hot_block(total, Flags::ZERO) {
        return p;
    }
    // SAFETY: glibc's `calloc` takes any `n` and `size` (it checks the product itself).
    unsafe { __libc_calloc(n, size) }
}

/// `malloc_usable_size(3)`: fallow's block size, or glibc's answer.
///
/// # Safety
///
/// `p` is null or a live block from this family of functions (malloc_usable_size(3)'s contract).
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    match if in_span(p) { owner(p as *const u8) } else { None } {
        Some(a) => match a.usable_size(p as *const u8) {
            Some(n) => n,
            None => fatal("malloc_usable_size", &Error::InvalidPointer { addr: p as usize }),
        },
        // SAFETY: `p` is not null and not fallow's, so by the caller's contract a live glibc block.
        None => unsafe { libc_usable_size(p) },
    }
}

/// `realloc(3)`: fallow blocks through `remap::realloc_owned`; a glibc block moves to fallow when
/// it grows past the threshold, and otherwise stays with glibc.
///
/// # Safety
///
/// `p` is null or a live block from this family of functions that nobody else uses during the
/// call; once the call succeeds (or `size` is 0) only the block returned is the caller's
/// (realloc(3)'s contract).
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // Neither fallow's block nor a size that may be fallow's: glibc's `realloc`, which does what
    // `realloc_slow` does with these (null: `malloc`; size 0: free and return null).
    if in_span(p) || leaves_pass_through(size) {
        // SAFETY: the caller's contract, passed on.
        return unsafe { realloc_slow(p, size) };
    }
    // SAFETY: `p` is null or, outside every arena, a live glibc block (the caller's contract);
    // glibc's `realloc` takes any size.
    unsafe { __libc_realloc(p, size) }
}

/// `realloc` of a block in the span of the arenas or to a size of at least the threshold: out of
/// line, so that glibc's requests' path sets up no frame.
///
/// # Safety
///
/// As `realloc`.
#[inline(never)]
unsafe fn realloc_slow(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: `malloc` has no precondition on `size`; the caller owns what it returns.
        return unsafe { malloc(size) };
    }
    if size == 0 {
        // glibc: realloc(p, 0) frees p and returns NULL.
        // SAFETY: `p` is a live block (the caller's contract), given up by this call.
        unsafe { free(p) };
        return ptr::null_mut();
    }
    if let Some(a) = owner(p as *const u8) {
        if process::small_on() {
            // SAFETY: `p` lies in `a`'s reservation and is, by the caller's contract, an object or
            // block `a` handed out, unused by anyone else during the call; `size > 0`.
            return unsafe { remap::realloc_any(a, p as *mut u8, size) } as *mut c_void;
        }
        // SAFETY: `p` lies in `a`'s reservation and is, by the caller's contract, a block `a`
        // handed out, unused by anyone else during the call; `size > 0`.
        return unsafe { remap::realloc_owned(a, p as *mut u8, size, process::threshold(), false) } as *mut c_void;
    }
    // A glibc block: stays with glibc unless it grows past the threshold (with small objects
    // on, unless it grows: `for_request` then answers for every size).
    if let Some(a) = for_request(size, MIN_ALIGN) {
        // SAFETY: `p` is not null and not fallow's, so a live glibc block (the caller's contract).
        let old = unsafe { libc_usable_size(p) };
        if old < size {
            if let Some(q) = from_fallow(a, size, MIN_ALIGN, Flags::NONE) {
                // SAFETY: `p` is a live glibc block (realloc(3)'s contract; not fallow's, by
                // address) usable for `old` bytes; `q` is a new fallow block of `size > old`
                // bytes, distinct from `p`.
                unsafe { ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old) };
                // SAFETY: `p` is a live glibc block, its bytes now in `q`; the caller gives it up.
                unsafe { __libc_free(p) };
                return q;
            }
        }
    }
    // SAFETY: `p` is a live glibc block (not null, not fallow's; the caller's contract).
    unsafe { __libc_realloc(p, size) }
}

/// `reallocarray(3)`: `realloc(p, n * size)`, `ENOMEM` when the product overflows.
///
/// # Safety
///
/// As `realloc`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: the caller's contract is `realloc`'s.
        Some(total) => unsafe { realloc(p, total) },
        None => enomem(),
    }
}

/// Aligned allocation shared by the `memalign` family; `align` is a power of two.
///
/// # Safety
///
/// `align` is a power of two (what `__libc_memalign` documents); the block returned is owned
/// by the caller, to be released through `free`/`realloc` as malloc(3) says.
unsafe fn aligned(align: usize, size: usize) -> *mut c_void {
    if let Some(a) = process::small_for(size, align) {
        // An alignment above the largest block is refused (`BadAlignment`): glibc's then.
        if let Ok(p) = a.malloc(size, align, Flags::NONE) {
            return p.as_ptr() as *mut c_void;
        }
    } else if let Some(a) = for_request(size, align) {
        if let Some(p) = from_fallow(a, size, align, Flags::NONE) {
            return p;
        }
    }
    // SAFETY: `align` is a power of two (this function's contract), as glibc's `memalign` wants.
    unsafe { __libc_memalign(align, size) }
}

/// `posix_memalign(3)`: `EINVAL` for an alignment that is not a power of two at least
/// `sizeof(void *)`; `errno` is left as it was.
///
/// # Safety
///
/// `out` points to a writable `void *` (posix_memalign(3)'s contract); the block stored there is
/// the caller's, as for `malloc`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align < core::mem::size_of::<usize>() {
        return libc::EINVAL;
    }
    let saved = fallow::binding_support::errno();
    // SAFETY: `align` is a power of two (checked above).
    let p = unsafe { aligned(align, size) };
    if p.is_null() && size != 0 {
        let e = fallow::binding_support::errno();
        fallow::binding_support::set_errno(saved);
        return if e == 0 { libc::ENOMEM } else { e };
    }
    // SAFETY: posix_memalign(3)'s contract: `out` points to a writable `void *`.
    unsafe { *out = p };
    0
}

/// glibc's `memalign` rounds an alignment that is not a power of two up to the next one.
fn round_align(align: usize) -> Option<usize> {
    if align <= MIN_ALIGN {
        return Some(MIN_ALIGN);
    }
    align.checked_next_power_of_two()
}

/// `memalign(3)`: an alignment that is not a power of two is rounded up to one, as glibc does.
///
/// # Safety
///
/// Any `align` and `size` are sound; the block returned is the caller's, as for `malloc`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    match round_align(align) {
        // SAFETY: `round_align` returns a power of two.
        Some(al) => unsafe { aligned(al, size) },
        None => {
            fallow::binding_support::set_errno(libc::EINVAL);
            ptr::null_mut()
        }
    }
}

/// `aligned_alloc(3)`: `memalign` (glibc accepts any alignment here too).
///
/// # Safety
///
/// As `memalign`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: `memalign` has no precondition on its arguments; the caller owns what it returns.
    unsafe { memalign(align, size) }
}

/// `valloc(3)`: page-aligned.
///
/// # Safety
///
/// Any `size` is sound; the block returned is the caller's, as for `malloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: the page size is a power of two.
    unsafe { aligned(fallow::binding_support::PAGE_SIZE, size) }
}

/// `pvalloc(3)`: page-aligned, the size rounded up to whole pages (at least one).
///
/// # Safety
///
/// Any `size` is sound; the block returned is the caller's, as for `malloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let page = fallow::binding_support::PAGE_SIZE;
    match size.checked_add(page - 1) {
        // SAFETY: the page size is a power of two.
        Some(s) => unsafe { aligned(page, (s & !(page - 1)).max(page)) },
        None => enomem(),
    }
}

/// Statistics of the process-wide allocator, for programs that look it up with `dlsym` (and for
/// the tests): copies the counters into `out[..n]` in the order of `fallow_stats` in fallow.h
/// (bytes in use, live blocks, zero-skipped bytes, memset bytes, free dirty/zeroed/reported
/// pages, realloc page moves, realloc copies), then the small objects' (live objects, their
/// bytes, spans, the spans' bytes: spans are live page blocks too, counted in the first two),
/// then 1 once `free` goes straight to the owner's path of small objects (`free.rs`: switched
/// at the first free of one), 0 while it tells fallow's pointers from glibc's first.
/// Returns how many were written.
///
/// # Safety
///
/// `out` is aligned for `u64` and writable for `n` values (it may be null when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn fallow_preload_stats(out: *mut u64, n: usize) -> usize {
    let Some(a) = process::existing() else { return 0 };
    let s = a.stats();
    let v = [
        s.bytes_in_use,
        s.live_blocks,
        s.zero_skipped_bytes,
        s.zeroed_on_alloc_bytes,
        s.free_dirty_pages,
        s.free_zeroed_pages,
        s.free_reported_pages,
        remap::MOVES.load(core::sync::atomic::Ordering::Relaxed),
        remap::COPIES.load(core::sync::atomic::Ordering::Relaxed),
        s.small_live_objects,
        s.small_live_bytes,
        s.small_spans,
        s.small_span_bytes,
        crate::free::sole_in_force() as u64,
    ];
    let k = n.min(v.len());
    if k == 0 {
        // Nothing to copy: `out` may be null here.
        return 0;
    }
    // SAFETY: `out` is writable for `n >= k` aligned `u64`s (the contract above); `v` is a local
    // array of at least `k` values, so the two do not overlap.
    unsafe { ptr::copy_nonoverlapping(v.as_ptr(), out, k) };
    k
}
