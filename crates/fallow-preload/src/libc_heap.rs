//! glibc's own allocator, reached by its `__libc_*` names so that nothing here comes back through
//! the interposed `malloc`; and the Rust global allocator of this library, built on them (the core
//! allocates its `Arc`, its threads' caches (a page each, page-aligned: `memalign`) and their
//! entry arrays from the Rust heap, and any Rust allocation made inside a preloaded `malloc` must
//! not recurse).

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_free(p: *mut c_void);
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// glibc's `malloc` guarantees this alignment.
const MALLOC_ALIGN: usize = 16;

pub struct LibcHeap;

// SAFETY: every method forwards to glibc's allocator, which returns blocks of at least the size
// asked, aligned to 16 (`malloc`) or to the alignment asked (`memalign`), that stay valid until
// freed, and never unwinds; blocks are freed and resized only by the same allocator.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN {
            // SAFETY: glibc's `malloc` takes any size, and its blocks are 16-aligned, enough for `l`.
            unsafe { __libc_malloc(l.size()) as *mut u8 }
        } else {
            // SAFETY: a `Layout`'s alignment is a power of two, as glibc's `memalign` wants.
            unsafe { __libc_memalign(l.align(), l.size()) as *mut u8 }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN {
            // SAFETY: glibc's `calloc` takes any size, and its blocks are 16-aligned, enough for `l`.
            unsafe { __libc_calloc(1, l.size()) as *mut u8 }
        } else {
            // SAFETY: `l` is the caller's layout, with the non-zero size `GlobalAlloc::alloc_zeroed`
            // promises, which is `alloc`'s precondition too.
            let p = unsafe { self.alloc(l) };
            if !p.is_null() {
                // SAFETY: `p` is a fresh block of at least `l.size()` bytes, not yet shared.
                unsafe { core::ptr::write_bytes(p, 0, l.size()) };
            }
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: `p` is a live block of this allocator (`GlobalAlloc::dealloc`'s contract), so one
        // of glibc's `malloc`, `calloc`, `memalign` or `realloc`, which `free` releases.
        unsafe { __libc_free(p as *mut c_void) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN {
            // SAFETY: `p` is a live glibc block (`GlobalAlloc::realloc`'s contract); glibc's
            // `realloc` keeps the 16-byte alignment that is enough for `l.align()`.
            return unsafe { __libc_realloc(p as *mut c_void, new_size) as *mut u8 };
        }
        // SAFETY: `l.align()` is a valid alignment and the caller guarantees `new_size`, rounded up
        // to it, does not overflow `isize` (`GlobalAlloc::realloc`'s contract).
        let nl = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        // SAFETY: `nl` has the non-zero size the caller of `realloc` guarantees.
        let q = unsafe { self.alloc(nl) };
        if !q.is_null() {
            // SAFETY: `p` is valid for `l.size()` bytes (the caller's contract) and `q`, a new
            // block, for `new_size`; they are distinct blocks.
            unsafe { core::ptr::copy_nonoverlapping(p, q, l.size().min(new_size)) };
            // SAFETY: `p` is a live glibc block (the caller's contract), its bytes now in `q`; the
            // caller does not use it after a successful `realloc`.
            unsafe { __libc_free(p as *mut c_void) };
        }
        q
    }
}

/// A function of glibc's whose name this library interposes, looked up once in libc.so.6 itself
/// (not with `RTLD_NEXT`, which in a program linking jemalloc would find jemalloc's) at its
/// first use, never from inside `malloc`.
pub struct GlibcFn {
    name: &'static core::ffi::CStr,
    /// 0: not looked up yet; 1: not found; else its address.
    addr: core::sync::atomic::AtomicUsize,
}

impl GlibcFn {
    pub const fn new(name: &'static core::ffi::CStr) -> GlibcFn {
        GlibcFn { name, addr: core::sync::atomic::AtomicUsize::new(0) }
    }

    /// Its address, or `None` if this glibc has no such function. Two threads may both look
    /// it up the first time: the same answer.
    pub fn get(&self) -> Option<usize> {
        use core::sync::atomic::Ordering;
        let mut f = self.addr.load(Ordering::Acquire);
        if f == 0 {
            // SAFETY: dlopen and dlsym get NUL-terminated C strings; RTLD_NOLOAD only looks up the
            // libc.so.6 already mapped in this process, and a null handle is checked before dlsym.
            unsafe {
                let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
                if !h.is_null() {
                    f = libc::dlsym(h, self.name.as_ptr()) as usize;
                }
            }
            f = f.max(1);
            self.addr.store(f, Ordering::Release);
        }
        (f != 1).then_some(f)
    }
}

/// glibc's `malloc_usable_size` (ours interposes the name).
///
/// # Safety
/// `p` is null or a live pointer of glibc's heap (glibc's own contract).
pub unsafe fn libc_usable_size(p: *mut c_void) -> usize {
    static FN: GlibcFn = GlibcFn::new(c"malloc_usable_size");
    // Cannot be missing with glibc; an answer of 0 makes callers copy nothing they do not own.
    let Some(f) = FN.get() else { return 0 };
    // SAFETY: the address dlsym returned for glibc's `malloc_usable_size`, whose C type is
    // `size_t (*)(void *)`: this function pointer type.
    let f: unsafe extern "C" fn(*mut c_void) -> usize = unsafe { core::mem::transmute(f) };
    // SAFETY: the caller promises `p` is null or a live pointer of glibc's heap (this function's `# Safety`),
    // which is `malloc_usable_size`'s contract.
    unsafe { f(p) }
}
