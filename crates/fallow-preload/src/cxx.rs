//! C++'s `operator new` and `operator delete` (the plain and array forms, and the sized
//! deletes), so that a C++ program's objects reach this library's `malloc` and `free` in one
//! call. The C++ runtime's own (libstdc++'s) are each a call of `malloc` or `free` through the
//! PLT, `operator new[]` a call of `operator new`: about 20 instructions and four calls per
//! `new[]` / `delete[]` pair before `malloc` or `free` starts (mimalloc and TCMalloc replace them
//! too). The other forms (aligned, `nothrow`) stay the runtime's: they end in this library's
//! `malloc`, `aligned_alloc` or `free` anyway.
//!
//! `operator new` must not return null: when `malloc` fails, the runtime's `operator new` is
//! called in its place (it asks `malloc` again, calls the new-handler, throws `std::bad_alloc`).
//! It is reached by a jump from a routine in assembly (`fallow_cxx_new_failed`), which
//! `operator new` calls in tail position, so that no frame of this library lies between the
//! program and the exception (Rust code may not be unwound through).

use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};

use fallow::Allocator;

use crate::entry::{malloc_lazy, malloc_small, leaves_pass_through};
use crate::free::free_jump;
use crate::libc_heap::__libc_malloc;
use crate::process;

/// `operator new(size_t)`: `malloc`'s routing, each side one tail call, so that neither sets
/// up a frame here. A request that may be fallow's takes `new_large` (inline), whose hot path
/// returns the object with no frame, as `malloc`'s does (through `malloc`, whose result must
/// be tested here, it took a frame and a call); the rest takes `new_libc`.
///
/// # Safety
///
/// As `malloc`; the block is released with `operator delete` (or `free`).
#[no_mangle]
pub unsafe extern "C" fn _Znwm(size: usize) -> *mut c_void {
    if leaves_pass_through(size) {
        return new_large(size);
    }
    new_libc(size)
}

/// `operator new` from glibc's `malloc`.
#[inline(never)]
fn new_libc(size: usize) -> *mut c_void {
    // SAFETY: glibc's `malloc` takes any size.
    let p = unsafe { __libc_malloc(size) };
    if !p.is_null() {
        return p;
    }
    // SAFETY: the runtime's `operator new` takes any size; in tail position (see the module).
    unsafe { fallow_cxx_new_failed(size) }
}

/// `operator new` of a request that may be fallow's: with small objects on and the allocator
/// published, the slab's hot path (no call, so no frame), everything else one tail call. Inline
/// in `operator new`, as `malloc`'s out-of-line half is in `malloc`.
#[inline(always)]
fn new_large(size: usize) -> *mut c_void {
    // SAFETY: `SMALL` is the only allocator with small objects the preload makes requests of.
    if let Some(p) = unsafe { Allocator::malloc_hot_sole(size, false) } {
        return p.as_ptr() as *mut c_void;
    }
    new_past_pop(size)
}

/// `new_large` past the pop: cold, so that the pop is the fall-through path.
#[cold]
#[inline(never)]
fn new_past_pop(size: usize) -> *mut c_void {
    let Some(a) = process::small() else { return new_lazy(size) };
    new_small(size, a)
}

/// `operator new` past the hot path: `malloc`'s out-of-line half, then the runtime's
/// `operator new` if that failed.
#[inline(never)]
fn new_small(size: usize, a: &'static Allocator) -> *mut c_void {
    new_or_runtime(malloc_small(size, a), size)
}

/// `operator new` with no allocator published for small objects: `malloc`'s lazy path.
#[inline(never)]
fn new_lazy(size: usize) -> *mut c_void {
    new_or_runtime(malloc_lazy(size), size)
}

/// `p`, or the runtime's `operator new` of `size` bytes if `p` is null (in tail position).
#[inline(always)]
fn new_or_runtime(p: *mut c_void, size: usize) -> *mut c_void {
    if !p.is_null() {
        return p;
    }
    // SAFETY: as in `new_libc`: the runtime's `operator new` takes any size.
    unsafe { fallow_cxx_new_failed(size) }
}

/// `operator new[](size_t)`: as `operator new` (the runtime's calls it).
///
/// # Safety
///
/// As `_Znwm`.
#[no_mangle]
pub unsafe extern "C" fn _Znam(size: usize) -> *mut c_void {
    // SAFETY: as `_Znwm`.
    unsafe { _Znwm(size) }
}

/// `operator delete(void*)`.
///
/// # Safety
///
/// As `free`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn _ZdlPv(_p: *mut c_void) {
    free_jump!()
}

/// `operator delete[](void*)`.
///
/// # Safety
///
/// As `free`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn _ZdaPv(_p: *mut c_void) {
    free_jump!()
}

/// `operator delete(void*, size_t)` (the size is not needed).
///
/// # Safety
///
/// As `free`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn _ZdlPvm(_p: *mut c_void, _size: usize) {
    free_jump!()
}

/// `operator delete[](void*, size_t)`.
///
/// # Safety
///
/// As `free`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn _ZdaPvm(_p: *mut c_void, _size: usize) {
    free_jump!()
}

/// The runtime's `operator new(size_t)`, found on the first failure (0: not yet).
static NEXT_NEW: AtomicUsize = AtomicUsize::new(0);

/// The address of the C++ runtime's `operator new`: libstdc++'s if it is loaded (its `operator
/// new` calls `malloc`, this library's), else the next definition after this library's.
extern "C" fn cxx_next_new() -> usize {
    let mut f = NEXT_NEW.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlopen and dlsym get NUL-terminated literals; RTLD_NOLOAD only looks up a
        // library already mapped; a null handle is checked before dlsym.
        unsafe {
            let h = libc::dlopen(c"libstdc++.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if !h.is_null() {
                f = libc::dlsym(h, c"_Znwm".as_ptr()) as usize;
            }
            if f == 0 {
                f = libc::dlsym(libc::RTLD_NEXT, c"_Znwm".as_ptr()) as usize;
            }
        }
        if f == 0 {
            // No C++ runtime to throw `std::bad_alloc`: out of memory, and nothing else to do.
            fallow::binding_support::fatal("operator new", &fallow::Error::OutOfMemory { size: 0, tried: 0, errno: libc::ENOMEM });
        }
        NEXT_NEW.store(f, Ordering::Release);
    }
    f
}

extern "C" {
    /// Jumps to the runtime's `operator new` with the same size (see the module).
    fn fallow_cxx_new_failed(size: usize) -> *mut c_void;
}

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.fallow_cxx_new_failed,\"ax\",@progbits",
    ".p2align 4",
    ".hidden fallow_cxx_new_failed",
    ".type fallow_cxx_new_failed,@function",
    "fallow_cxx_new_failed:",
    // Entered by a jump from `operator new` (its caller's return address on top): one push
    // keeps the size and aligns the stack for the call.
    "push rdi",
    "call {next}",
    "pop rdi",
    "jmp rax",
    ".size fallow_cxx_new_failed, .-fallow_cxx_new_failed",
    ".popsection",
    next = sym cxx_next_new,
);
