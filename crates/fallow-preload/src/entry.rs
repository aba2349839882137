//! The exported `malloc` family. Every function answers for fallow's pointers, whatever the
//! caller asks about them (`free`, `cfree`, `realloc`, `reallocarray`, `malloc_usable_size`),
//! and hands everything else to glibc's `__libc_*` entry points.
//!
//! Routing: a request of at least the threshold and at most the largest fallow block goes to
//! fallow; if fallow cannot serve it (its reservation is exhausted) glibc is asked, and if glibc
//! cannot either the answer is `NULL` with `errno = ENOMEM`. A pointer is fallow's iff it lies in
//! fallow's reservation (`Allocator::owns`); inside it, a pointer that is not the start of a live
//! block is a caller bug: message on stderr, then `abort()`, as glibc does.

use core::ffi::{c_int, c_void};
use core::fmt::Write;
use core::ptr;

use fallow::binding_support::StackBuf;
use fallow::{Allocator, Error, Flags};

use crate::libc_heap::*;
use crate::process::{self, for_request, owner};
use crate::remap;

const MIN_ALIGN: usize = 16;

/// A bad pointer: say what and where, without allocating, and abort.
#[cold]
pub fn die(op: &str, e: &Error) -> ! {
    let mut b = StackBuf::<320>::new();
    let _ = match *e {
        Error::DoubleFree { addr } => writeln!(b, "fallow: {op}(): double free {addr:#x}"),
        Error::InvalidPointer { addr } => writeln!(b, "fallow: {op}(): invalid pointer {addr:#x} (not a live block)"),
        Error::InteriorPointer { addr, block } => {
            writeln!(b, "fallow: {op}(): invalid pointer {addr:#x} (inside the live block at {block:#x})")
        }
        _ => writeln!(b, "fallow: {op}(): {e}"),
    };
    fallow::binding_support::write_stderr(b.as_bytes());
    // SAFETY: plain libc call with no memory-safety preconditions (it does not return).
    unsafe { libc::abort() }
}

#[inline]
fn enomem() -> *mut c_void {
    fallow::binding_support::set_errno(libc::ENOMEM);
    ptr::null_mut()
}

/// Large request: fallow if it can, else glibc (`fallback`).
#[inline]
fn from_fallow(a: &Allocator, size: usize, align: usize, flags: Flags) -> Option<*mut c_void> {
    a.alloc(size, align, flags).ok().map(|p| p.as_ptr() as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if let Some(a) = for_request(size, MIN_ALIGN) {
        if let Some(p) = from_fallow(a, size, MIN_ALIGN, Flags::NONE) {
            return p;
        }
    }
    __libc_malloc(size)
}

#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else { return enomem() };
    if let Some(a) = for_request(total, MIN_ALIGN) {
        // No memset for pages that are zeroed or reported: the core knows each page's state.
        if let Some(p) = from_fallow(a, total, MIN_ALIGN, Flags::ZERO) {
            return p;
        }
    }
    __libc_calloc(n, size)
}

#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    match owner(p as *const u8) {
        Some(a) => {
            if let Err(e) = a.free(p as *mut u8) {
                die("free", &e)
            }
        }
        None => __libc_free(p),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    free(p)
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    match owner(p as *const u8) {
        Some(a) => match a.usable_size(p as *const u8) {
            Some(n) => n,
            None => die("malloc_usable_size", &Error::InvalidPointer { addr: p as usize }),
        },
        None => libc_usable_size(p),
    }
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if size == 0 {
        // glibc: realloc(p, 0) frees p and returns NULL.
        free(p);
        return ptr::null_mut();
    }
    if let Some(a) = owner(p as *const u8) {
        return remap::realloc_owned(a, p as *mut u8, size) as *mut c_void;
    }
    // A glibc block: stays with glibc unless it grows past the threshold.
    if let Some(a) = for_request(size, MIN_ALIGN) {
        let old = libc_usable_size(p);
        if old < size {
            if let Some(q) = from_fallow(a, size, MIN_ALIGN, Flags::NONE) {
                // SAFETY: `p` is a live glibc block (realloc(3)'s contract; not fallow's, by
                // address) usable for `old` bytes; `q` is a new fallow block of `size > old`
                // bytes, distinct from `p`; `p` is freed right after and not used again.
                ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old);
                __libc_free(p);
                return q;
            }
        }
    }
    __libc_realloc(p, size)
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => realloc(p, total),
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
    if let Some(a) = for_request(size, align) {
        if let Some(p) = from_fallow(a, size, align, Flags::NONE) {
            return p;
        }
    }
    __libc_memalign(align, size)
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align < core::mem::size_of::<usize>() {
        return libc::EINVAL;
    }
    let saved = fallow::binding_support::errno();
    let p = aligned(align, size);
    if p.is_null() && size != 0 {
        let e = fallow::binding_support::errno();
        fallow::binding_support::set_errno(saved);
        return if e == 0 { libc::ENOMEM } else { e };
    }
    // SAFETY: posix_memalign(3)'s contract: `out` points to a writable `void *`.
    *out = p;
    0
}

/// glibc's `memalign` rounds an alignment that is not a power of two up to the next one.
fn round_align(align: usize) -> Option<usize> {
    if align <= MIN_ALIGN {
        return Some(MIN_ALIGN);
    }
    align.checked_next_power_of_two()
}

#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    match round_align(align) {
        Some(al) => aligned(al, size),
        None => {
            fallow::binding_support::set_errno(libc::EINVAL);
            ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    memalign(align, size)
}

#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(fallow::binding_support::PAGE_SIZE, size)
}

#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let page = fallow::binding_support::PAGE_SIZE;
    match size.checked_add(page - 1) {
        Some(s) => aligned(page, (s & !(page - 1)).max(page)),
        None => enomem(),
    }
}

/// Statistics of the process-wide allocator, for programs that look it up with `dlsym` (and for
/// the tests): copies the counters into `out[..n]` in the order of `fallow_stats` in fallow.h
/// (bytes in use, live blocks, zero-skipped bytes, memset bytes, free dirty/zeroed/reported
/// pages, realloc page moves, realloc copies). Returns how many were written.
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
    ];
    let k = n.min(v.len());
    if k == 0 {
        // Nothing to copy: `out` may be null here.
        return 0;
    }
    // SAFETY: `out` is writable for `n >= k` aligned `u64`s (the contract above); `v` is a local
    // array of at least `k` values, so the two do not overlap.
    ptr::copy_nonoverlapping(v.as_ptr(), out, k);
    k
}
