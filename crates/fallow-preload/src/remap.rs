//! `realloc` of a block fallow owns: in place when it can, otherwise by moving the pages rather
//! than the bytes, and across the threshold in either direction.
//!
//! Order of preference for a block that stays at or above the threshold:
//! 1. `Allocator::resize_in_place`: shrinking gives the tail back to the free lists; growing
//!    takes the free pages right after the block.
//! 2. Move the pages: take a new block, then `mremap(old, len, len, MAYMOVE | FIXED | DONTUNMAP,
//!    new)`: the kernel moves the page-table entries of the old block onto the start of the new
//!    one, no byte is copied, and with `MREMAP_DONTUNMAP` the old range stays mapped with no
//!    pages behind it, so the arena keeps no hole and the old pages read zero: they are freed as
//!    `Reported` (`Allocator::free_reported`), which is exactly their state.
//! 3. Copy the bytes (`memcpy`) when the move is refused (old kernel, a range over several
//!    mappings, the mapping-count budget spent) or the block is small.
//!
//! Every move splits the arena's mapping (the moved pages form a mapping of their own, which the
//! kernel does not merge with its neighbours), so moves are limited to blocks of at least
//! `MOVE_MIN` bytes and to `MOVE_BUDGET` per process, far below `vm.max_map_count` (65530).
//! `MOVES` and `COPIES` count what happened (printed with `FALLOW_STATS=1`).
//!
//! With small objects on (`FALLOW_SMALL=1`), `realloc_any`: a block of at most `SMALL_MAX`
//! bytes (a small object, or a small page block of an over-aligned request) stays where it is
//! when the new size fits it and is more than half of it (in its size class, as mimalloc's
//! rule), and otherwise moves by allocate-copy-free through `Allocator::malloc` / `free_any`; a
//! larger page block goes through `realloc_owned` as above, with `SMALL_MAX` + 1 as its threshold,
//! and what leaves it for a smaller size becomes a small object.

use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fallow::binding_support::fatal;
use fallow::{Allocator, Flags};

use crate::libc_heap::__libc_malloc;

/// Blocks smaller than this are copied: copying 1 MiB costs about as much as the system calls
/// and mapping split a move costs.
pub const MOVE_MIN: usize = 1 << 20;
pub const MOVE_BUDGET: u64 = 8192;

pub static MOVES: AtomicU64 = AtomicU64::new(0);
pub static COPIES: AtomicU64 = AtomicU64::new(0);
static MOVE_REFUSED: AtomicBool = AtomicBool::new(false);

/// `realloc(p, size)` for a pointer in fallow's reservation; `size > 0`. A `size` below
/// `threshold` (the preload's, `process::threshold`) leaves fallow's page blocks: for glibc, or
/// with `small` (small objects on) for a small object of `Allocator::malloc` first.
///
/// # Safety
/// realloc(3)'s contract: `p` is a block `a` handed out and nobody uses it during the call (a
/// pointer that is not a live block's start is reported and aborts; its bytes are copied only
/// once `a` has vouched for it); after the call only the block returned is the caller's.
pub unsafe fn realloc_owned(a: &Allocator, p: *mut u8, size: usize, threshold: usize, small: bool) -> *mut u8 {
    let stays = size >= threshold && size <= a.max_block();
    if stays {
        match a.resize_in_place(p, size) {
            Ok(true) => return p,
            Ok(false) => {}
            Err(e) => fatal("realloc", &e),
        }
    }
    let old = match a.usable_size(p) {
        Some(n) => n,
        None => fatal("realloc", &fallow::Error::InvalidPointer { addr: p as usize }),
    };
    if stays {
        if let Ok(q) = a.alloc(size, 16, Flags::NONE) {
            let q = q.as_ptr();
            // SAFETY: `p` is the caller's live block of `old` bytes (`usable_size` vouched for it)
            // and `q` a new block of `size > old` bytes (`resize_in_place` shrinks every block
            // that is not `mlock`ed, and the preload locks none), page-aligned both, and distinct.
            if old >= MOVE_MIN && unsafe { move_pages(p, q, old) } {
                // SAFETY: `move_pages` took every page of `p` away with `MREMAP_DONTUNMAP`: the range
                // is still mapped, with no pages behind it, so it reads zero and is not resident.
                if let Err(e) = unsafe { a.free_reported(p) } {
                    fatal("realloc", &e)
                }
                MOVES.fetch_add(1, Ordering::Relaxed);
            } else {
                // SAFETY: `p` is valid for `old` bytes (`usable_size` vouched for it, and the caller
                // lets nobody else use it) and `q` for `size`; distinct blocks.
                unsafe { ptr::copy_nonoverlapping(p, q, old.min(size)) };
                if let Err(e) = a.free(p) {
                    fatal("realloc", &e)
                }
                COPIES.fetch_add(1, Ordering::Relaxed);
            }
            return q;
        }
    }
    // Leaving the page blocks (below the threshold, above the largest block, or fallow is
    // exhausted): a small object with small objects on, else (or if that fails) glibc's.
    let small_q = if small && size <= Allocator::SMALL_MAX { a.malloc(size, 16, Flags::NONE).ok() } else { None };
    // SAFETY: the caller's contract; `usable_size` vouched for `old`.
    unsafe { copy_out(a, p, old, size, small_q) }
}

/// The end of a `realloc` that moves: the new block is `first` if there is one, else glibc's
/// (`NULL` and `ENOMEM` if glibc has none either, `p` left as it was); `p`'s bytes are copied
/// and `p` freed (`free_any`: an object or a page block).
///
/// # Safety
/// `p` is the caller's live object or block of `a`, `old` bytes usable, that nobody else uses;
/// `first`, if any, a new block of `a` of at least `size` bytes. Afterwards only the block
/// returned is the caller's.
unsafe fn copy_out(a: &Allocator, p: *mut u8, old: usize, size: usize, first: Option<NonNull<u8>>) -> *mut u8 {
    let q = match first {
        Some(q) => q.as_ptr(),
        // SAFETY: glibc's `malloc` takes any size; the new block becomes the caller's.
        None => unsafe { __libc_malloc(size) as *mut u8 },
    };
    if q.is_null() {
        fallow::binding_support::set_errno(libc::ENOMEM);
        return q;
    }
    // SAFETY: `p` is valid for `old` bytes and `q` for `size` (this function's contract, or
    // glibc's block just made); distinct, as `p` is live until the free below.
    unsafe { ptr::copy_nonoverlapping(p, q, old.min(size)) };
    if let Err(e) = a.free_any(p) {
        fatal("realloc", &e)
    }
    q
}

/// `realloc(p, size)` with small objects on, for a pointer in fallow's reservation; `size > 0`.
/// See the module's comment.
///
/// # Safety
/// As `realloc_owned`: `p` is an object or block `a` handed out (through `malloc`), nobody uses
/// it during the call; after the call only the block returned is the caller's.
pub unsafe fn realloc_any(a: &Allocator, p: *mut u8, size: usize) -> *mut u8 {
    let old = match a.usable_size(p) {
        Some(n) => n,
        None => fatal("realloc", &fallow::Error::InvalidPointer { addr: p as usize }),
    };
    if old > Allocator::SMALL_MAX {
        // A page block of more than `SMALL_MAX` (never a small object): stays a page block down
        // to `SMALL_MAX` + 1.
        // SAFETY: the caller's contract, passed on; `size > 0`.
        return unsafe { realloc_owned(a, p, size, Allocator::SMALL_MAX + 1, true) };
    }
    // In place while the new size fits and is more than half the object (at least 16 bytes, the
    // smallest class): the size class the request would get, or one close to it.
    if size <= old && size.max(16) * 2 > old {
        return p;
    }
    let first = a.malloc(size, 16, Flags::NONE).ok();
    // SAFETY: the caller's contract; `usable_size` vouched for `old`; `first` is `a`'s new block
    // of `size` bytes.
    let q = unsafe { copy_out(a, p, old, size, first) };
    if !q.is_null() {
        COPIES.fetch_add(1, Ordering::Relaxed);
    }
    q
}

/// Move the pages of `[from, from + len)` onto `[to, to + len)`, leaving `from` mapped and empty.
/// `false` (nothing changed) when the kernel refuses.
///
/// # Safety
/// Both ranges are page-aligned parts of fallow's private anonymous arena, `from` the caller's
/// live block and `to` a fresh block of at least `len` bytes, nobody else using either: the
/// contents of `to` are replaced and those of `from` read zero afterwards.
unsafe fn move_pages(from: *mut u8, to: *mut u8, len: usize) -> bool {
    if MOVE_REFUSED.load(Ordering::Relaxed) || MOVES.load(Ordering::Relaxed) >= MOVE_BUDGET {
        return false;
    }
    // SAFETY: both ranges are page-aligned parts of fallow's private anonymous arena that nobody
    // else uses (this function's contract): replacing `to`'s pages and emptying `from` is what the
    // caller asked for.
    match unsafe { fallow::binding_support::move_pages(from as usize, to as usize, len) } {
        Ok(()) => true,
        Err(e) => {
            if e == libc::EINVAL {
                // A kernel without MREMAP_DONTUNMAP for this mapping: do not ask again.
                MOVE_REFUSED.store(true, Ordering::Relaxed);
            }
            false
        }
    }
}
