//! `fallow_alloc` and `fallow_free`, the C library's two most called functions. With small
//! objects on, each makes the slab's hot path inline (`Allocator::malloc_hot` for a request
//! without flags, `Allocator::free_hot_step`: a pop off the thread's current span, the owner's
//! free of an object) and everything else one call in tail position, so that neither sets up a
//! frame, as the preload's `malloc` and `free`; with small objects off, one call to the page
//! layer's path.

use core::ffi::{c_int, c_uint, c_void};
use core::ptr::{self, NonNull};

use core_fallow::binding_support::{FreeHot, RemoteFree, PAGE_SIZE};
use core_fallow::{Allocator, Error, Flags};

use crate::{fail, fail_with, ALL_FLAGS, SMALL_NATURAL_ALIGN};

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `out` is null or points to a writable
/// `void *`.
#[no_mangle]
pub unsafe extern "C" fn fallow_alloc(
    a: *mut Allocator,
    size: usize,
    align: usize,
    flags: c_uint,
    out: *mut *mut c_void,
) -> c_int {
    let a = handle!(a, "fallow_alloc");
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_alloc: out is NULL"));
    }
    let small = a.config().small_objects;
    // The hot path: a request of the objects' alignment (0, or a power of two up to it; a
    // larger one takes an aligned class or a page block on the cold path, which refuses any
    // that is not a power of two), with no flag (a `ZERO` request's memset, a call, would give
    // this function a frame).
    if small && flags == 0 && align <= SMALL_NATURAL_ALIGN && align & align.wrapping_sub(1) == 0 && size != 0 {
        if let Some(p) = a.malloc_hot(size, false) {
            // SAFETY: `out` is not null (checked above) and writable (the contract).
            unsafe { *out = p.as_ptr() as *mut c_void };
            return 0;
        }
    }
    if flags & !ALL_FLAGS != 0 {
        return fail(libc::EINVAL, format_args!("fallow_alloc: unknown flag bits {:#x}", flags & !ALL_FLAGS));
    }
    if small {
        // SAFETY: the caller's contract, passed on; `out` is not null, `flags` known.
        unsafe { alloc_small(a, size, align, flags, out) }
    } else {
        // SAFETY: as above.
        unsafe { alloc_pages(a, size, align, flags, out) }
    }
}

/// `fallow_alloc` with small objects off: a page block (`Allocator::alloc`, which keeps the
/// page layer's hit path inline).
///
/// # Safety
///
/// `out` is not null and points to a writable `void *`; `flags` are known ones.
#[inline(never)]
unsafe fn alloc_pages(a: &Allocator, size: usize, align: usize, flags: c_uint, out: *mut *mut c_void) -> c_int {
    let align = if align == 0 { PAGE_SIZE } else { align };
    // SAFETY: the caller's contract, passed on.
    unsafe { answer(a.alloc(size, align, Flags(flags)), out) }
}

/// `fallow_alloc` with small objects on, past its hot path: `Allocator::malloc`, up to 64 KiB
/// (`FALLOW_SMALL_MAX`) an object of the slab layer (`POPULATE` and `LOCK` make it a page block), above a page
/// block. Zero bytes stay an error, as with small objects off (`malloc` would serve them as
/// one byte).
///
/// # Safety
///
/// As `alloc_pages`.
#[inline(never)]
unsafe fn alloc_small(a: &Allocator, size: usize, align: usize, flags: c_uint, out: *mut *mut c_void) -> c_int {
    let r = if size == 0 { Err(Error::ZeroSize) } else { a.malloc(size, if align == 0 { SMALL_NATURAL_ALIGN } else { align }, Flags(flags)) };
    // SAFETY: the caller's contract, passed on.
    unsafe { answer(r, out) }
}

/// The block of `r` (or null) into `*out`; 0, or the error's code with its message.
///
/// # Safety
///
/// As `alloc_pages`.
#[inline(always)]
unsafe fn answer(r: Result<NonNull<u8>, Error>, out: *mut *mut c_void) -> c_int {
    match r {
        Ok(p) => {
            // SAFETY: `out` is not null and writable (the caller's contract).
            unsafe { *out = p.as_ptr() as *mut c_void };
            0
        }
        Err(e) => {
            // SAFETY: as above.
            unsafe { *out = ptr::null_mut() };
            fail_with(e)
        }
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`. `p` may be anything (it is validated);
/// the block it frees is not touched afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_free(a: *mut Allocator, p: *mut c_void) -> c_int {
    let a = handle!(a, "fallow_free");
    if !a.config().small_objects {
        return free_pages(a, p as *mut u8);
    }
    match a.free_hot_step(p as *mut u8) {
        FreeHot::Done => 0,
        // SAFETY: `a`'s own `free_hot_step` gave `r`.
        FreeHot::Remote(r) => unsafe { free_remote(a, r) },
        FreeHot::Cold => free_small(a, p as *mut u8),
    }
}

/// `fallow_free` with small objects off: a page block (`free`, which keeps the page layer's hit
/// path inline).
#[inline(never)]
fn free_pages(a: &Allocator, p: *mut u8) -> c_int {
    status(a.free(p))
}

/// Another thread's object, checked by `fallow_free`'s hot path.
///
/// # Safety
///
/// `r` is what `a.free_hot_step` gave (`RemoteFree::finish`'s contract).
#[inline(never)]
unsafe fn free_remote(a: &Allocator, r: RemoteFree<'_>) -> c_int {
    // SAFETY: the caller's contract.
    status(unsafe { r.finish(a) })
}

/// `fallow_free` with small objects on, past its hot path (`FreeHot::Cold`): either kind,
/// without the hot path's lookup again (`free_any_cold`).
#[inline(never)]
fn free_small(a: &Allocator, p: *mut u8) -> c_int {
    status(a.free_any_cold(p))
}

/// 0, or the error's code with its message.
#[inline(always)]
fn status(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail_with(e),
    }
}
