//! glibc's calls on the heap as a whole, over both heaps of the process: fallow's and glibc's
//! own (which holds what fallow passes through, and what glibc handed out before the preload
//! took over).
//!
//! - `malloc_trim(pad)`: glibc's trim of its heaps, then fallow's (`Allocator::trim`): the
//!   calling thread's and idle threads' cached blocks, the calling thread's empty spans, and
//!   every free block with resident pages, given back now but `pad` bytes. 1 if either gave
//!   memory back, as glibc's says whether it did;
//! - `mallinfo2()` and `mallinfo()`: glibc's figures plus fallow's (below); `mallinfo` truncates
//!   to `int`, as glibc's does;
//! - `malloc_stats()`: glibc's report on stderr, then fallow's statistics.
//!
//! `mallopt` and `malloc_info` stay glibc's: they see glibc's heap only.
//!
//! glibc's own functions are looked up in libc.so.6 at their first call (`GlibcFn`: none has a
//! `__libc_` name but `mallinfo`).

use core::ffi::c_int;

use fallow::Stats;

use crate::libc_heap::GlibcFn;
use crate::process;

/// glibc's `struct mallinfo2` (`<malloc.h>`, 2.33 and later) and `struct mallinfo` (the same
/// figures as `int`), from one list of fields, with the conversions between them.
macro_rules! mallinfo_structs {
    ($($(#[doc = $doc:literal])* $f:ident,)*) => {
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        pub struct Mallinfo2 {
            $($(#[doc = $doc])* pub $f: usize,)*
        }

        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        pub struct Mallinfo {
            $($(#[doc = $doc])* pub $f: c_int,)*
        }

        impl Mallinfo2 {
            /// `mallinfo`'s `int` fields, truncated as glibc truncates them.
            fn as_ints(&self) -> Mallinfo {
                Mallinfo { $($f: self.$f as c_int,)* }
            }

            /// `mallinfo`'s fields, widened.
            fn widened(m: &Mallinfo) -> Mallinfo2 {
                Mallinfo2 { $($f: m.$f as u32 as usize,)* }
            }
        }
    };
}

mallinfo_structs! {
    /// Non-mmapped space allocated from the system.
    arena,
    /// Free chunks.
    ordblks,
    /// Free fastbin blocks.
    smblks,
    /// Mmapped regions.
    hblks,
    /// Space in mmapped regions.
    hblkhd,
    /// Always 0.
    usmblks,
    /// Space in free fastbin blocks.
    fsmblks,
    /// Space in use.
    uordblks,
    /// Free space.
    fordblks,
    /// Top-most, releasable space.
    keepcost,
}

impl Mallinfo2 {
    /// glibc's figures with fallow's added: its pages in use or free and resident as `arena`
    /// (memory held from the system), its free blocks as `ordblks`, what the program holds as
    /// `uordblks` (live page blocks, and of the spans of small objects their live objects'
    /// bytes), and its free resident pages with the free bytes in spans as `fordblks`. So, as
    /// for glibc's heap, `arena = uordblks + fordblks`.
    fn plus(mut self, s: &Stats) -> Mallinfo2 {
        let free_blocks: u64 = s.free_blocks.iter().flatten().sum();
        // Saturating: the page layer's figures and the slab's are read under two locks, one
        // after the other, so a span made in between may be in one and not the other.
        let live = s.bytes_in_use.saturating_sub(s.small_span_bytes) + s.small_live_bytes;
        let free = s.resident_free_bytes() + s.small_free_bytes;
        self.arena += (live + free) as usize;
        self.ordblks += free_blocks as usize;
        self.uordblks += live as usize;
        self.fordblks += free as usize;
        self
    }
}

static GLIBC_TRIM: GlibcFn = GlibcFn::new(c"malloc_trim");
static GLIBC_MALLINFO2: GlibcFn = GlibcFn::new(c"mallinfo2");
static GLIBC_STATS: GlibcFn = GlibcFn::new(c"malloc_stats");

extern "C" {
    fn __libc_mallinfo() -> Mallinfo;
}

/// glibc's `mallinfo2`, or (before 2.33) its `mallinfo` widened.
fn glibc_mallinfo2() -> Mallinfo2 {
    if let Some(f) = GLIBC_MALLINFO2.get() {
        // SAFETY: the address `GlibcFn` found for glibc's `mallinfo2`, whose type this is.
        let f: extern "C" fn() -> Mallinfo2 = unsafe { core::mem::transmute::<usize, extern "C" fn() -> Mallinfo2>(f) };
        return f();
    }
    // SAFETY: glibc's own `mallinfo`, exported under this name; it takes no argument.
    Mallinfo2::widened(&unsafe { __libc_mallinfo() })
}

/// Give free memory back to the system, but `pad` bytes of each heap.
///
/// # Safety
/// None beyond glibc's `malloc_trim`'s (callable from any thread, not from a signal handler).
#[no_mangle]
pub unsafe extern "C" fn malloc_trim(pad: usize) -> c_int {
    let mut given = 0;
    if let Some(f) = GLIBC_TRIM.get() {
        // SAFETY: the address `GlibcFn` found for glibc's `malloc_trim`, whose type this is.
        let f: extern "C" fn(usize) -> c_int = unsafe { core::mem::transmute::<usize, extern "C" fn(usize) -> c_int>(f) };
        given = f(pad);
    }
    if let Some(a) = process::existing() {
        if a.trim(pad) > 0 {
            given = 1;
        }
    }
    given
}

/// # Safety
/// None: it only reads statistics.
#[no_mangle]
pub unsafe extern "C" fn mallinfo2() -> Mallinfo2 {
    let m = glibc_mallinfo2();
    match process::existing() {
        Some(a) => m.plus(&a.stats()),
        None => m,
    }
}

/// # Safety
/// None: it only reads statistics.
#[no_mangle]
pub unsafe extern "C" fn mallinfo() -> Mallinfo {
    // SAFETY: `mallinfo2` has no precondition.
    unsafe { mallinfo2() }.as_ints()
}

/// # Safety
/// None beyond glibc's `malloc_stats`'s (it writes to stderr).
#[no_mangle]
pub unsafe extern "C" fn malloc_stats() {
    if let Some(f) = GLIBC_STATS.get() {
        // SAFETY: the address `GlibcFn` found for glibc's `malloc_stats`, whose type this is.
        let f: extern "C" fn() = unsafe { core::mem::transmute::<usize, extern "C" fn()>(f) };
        f();
    }
    if let Some(a) = process::existing() {
        process::write_stats(&a.stats(), "statistics");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallows_part_keeps_arena_the_sum_of_in_use_and_free() {
        let s = Stats {
            bytes_in_use: 10 << 20,
            small_span_bytes: 2 << 20,
            small_live_bytes: 1 << 20,
            small_free_bytes: 1 << 20,
            free_dirty_pages: 100,
            free_zeroed_pages: 28,
            ..Stats::default()
        };
        let m = Mallinfo2 { arena: 1000, uordblks: 600, fordblks: 400, ..Mallinfo2::default() }.plus(&s);
        assert_eq!(m.uordblks, 600 + (9 << 20));
        assert_eq!(m.fordblks, 400 + (1 << 20) + 128 * 4096);
        assert_eq!(m.arena, m.uordblks + m.fordblks);
        assert_eq!(Mallinfo2 { arena: 1 << 32 | 5, ..m }.as_ints().arena, 5);
    }
}
