//! The slab's two hot paths (docs/design.md, "Small objects (slab layer)", Hot paths): the pop
//! of `malloc` and the owner's free, each with no call (but the memset of a `calloc`), so that
//! the callers save no register for them; everything else is one call to `mod.rs`'s slow
//! paths (`malloc_slow`, `free_in`), made before anything has changed.

use core::ptr::{self, NonNull};
use core::sync::atomic::Ordering::{Relaxed, Release};

#[cfg(not(target_arch = "x86_64"))]
use super::class::object_index;
use super::class::{object_size, TABLE_MAX};
use super::heap::ThreadHeap;
use super::span::{Span, UNLISTED};
use super::{table, Keys, Slab};
use std::sync::Arc;

/// What the hot path of a free did (`Slab::free_owner`, `Slab::free_local`).
pub(crate) enum Freed {
    /// Freed (the owner's free).
    Done,
    /// Freed (the owner's free), and the span must move (`free_owner` only): it emptied a
    /// span other than its class's current one, freed into a parked span or brought an armed
    /// span to its trim mark. `Slab::after_local_free` with this thread's heap is the next step.
    Moved,
    /// Nothing changed: another thread's free of a checked object, for `free_remote_out`.
    Remote,
    /// Nothing changed: `free_in` answers.
    Not,
}

impl Keys {
    /// The hot path alone, for a request of `size` bytes (at most `TABLE_MAX`) of the natural
    /// alignment: pop an object off the current span of its class in the heap this thread used
    /// last; `zero` (`calloc`): memset it whole (an object on a free list reads anything).
    /// `None`: nothing to pop (or a larger request), `malloc_slow` answers. No call but the
    /// memset. The size test is the callers' own, which the compiler merges with this one.
    #[inline(always)]
    pub(crate) fn malloc_hot(&self, size: usize, zero: bool) -> Option<NonNull<u8>> {
        if size > TABLE_MAX {
            return None;
        }
        // SAFETY: `last` gives this thread's own heap (owner), live as long as the slab, or
        // `NO_HEAP`, whose heads are `EMPTY`; `size <= TABLE_MAX`, tested above.
        unsafe { pop_from(&*table::last(self), size, zero) }
    }
}

/// `Keys::malloc_hot` for a process with one slab: the heap this thread used last, whatever
/// its slab, with no compare of the slab's id (none: `NO_HEAP`, which pops nothing).
///
/// # Safety
/// Every slab this thread has used is the caller's (the preload's one allocator with small
/// objects): an object popped here is that slab's.
#[inline(always)]
pub(crate) unsafe fn malloc_hot_sole(size: usize, zero: bool) -> Option<NonNull<u8>> {
    if size > TABLE_MAX {
        return None;
    }
    // SAFETY: the heap word is this thread's own heap of a slab (live as long as the slab,
    // which the caller's contract makes its one slab), or `NO_HEAP` before the thread has one
    // and after it gives it up (table.rs); `size <= TABLE_MAX`, tested above.
    unsafe { pop_from(&*(table::slab_heap() as *const ThreadHeap), size, zero) }
}

/// Pop an object of the class of `size` off `h`'s current span of it; `zero`: memset it whole.
///
/// # Safety
/// `size <= TABLE_MAX`; `h` is this thread's own heap (its owner) or `NO_HEAP`.
#[inline(always)]
unsafe fn pop_from(h: &ThreadHeap, size: usize, zero: bool) -> Option<NonNull<u8>> {
    // SAFETY: `size <= TABLE_MAX` (the caller's contract), so the index is at most
    // `TABLE_MAX / 16`, the table's last (`class_of`, from the heap's copy of the table).
    let c = unsafe { *h.class_of.get_unchecked((size + 15) >> 4) } as usize;
    // SAFETY: `c < CLASSES` (`class_of`); a head is `EMPTY` (whose `free` and `local_free`
    // are 0, so `pop` writes nothing) or a listed span of this heap, the caller's thread's.
    let o = unsafe { &*h.head.get_unchecked(c).get() }.pop()?;
    if zero {
        // SAFETY: `c < CLASSES` (`class_of`); `o` is an object of class `c` just handed out
        // to this caller.
        unsafe { ptr::write_bytes(o as *mut u8, 0, object_size(c)) };
    }
    // SAFETY: an object address is never 0.
    Some(unsafe { NonNull::new_unchecked(o as *mut u8) })
}

impl Slab {
    /// The hot path of a free of `addr` in span `s` (found by `find`): the owner's free, with
    /// every check of `free_in` made first. `Not`: nothing was changed, `free_in` answers (bad
    /// input). A free that empties a span other than its class's current one, or frees into a
    /// parked span, is done here too and then the span moves (one cold call,
    /// `after_local_free`); otherwise no call, so no frame for the caller. `Remote`: another
    /// thread's free (or a thread's with no heap of this slab) of an object that passed the same
    /// checks, nothing changed: the caller's next step is `free_remote_out`, in tail position
    /// (a call whose result the caller still had to test would give it a frame, and the owner's
    /// path with it), without `free_in`'s second lookup and checks (about 150 instructions a
    /// remote free from the preload's `free` with them, 83 without).
    ///
    /// `slab` is the caller's handle to the slab, not the slab itself: only the rare move
    /// (`after_local_free`) needs the slab, and a slab reference passed in was loaded from the
    /// handle on every free (the compiler hoisted that load above the branches).
    ///
    /// # Safety
    /// As `free_owner`.
    #[inline(always)]
    pub(crate) unsafe fn free_local(slab: &Arc<Slab>, s: &Span, addr: usize) -> Freed {
        // SAFETY: the caller's contract, passed on.
        match unsafe { Slab::free_owner(s, addr) } {
            Freed::Moved => {
                // SAFETY: the owner's free just made by this thread: its heap word is its heap
                // of this slab (`free_owner` compared the id beside it with the span's owner).
                let h = unsafe { &*(table::slab_heap() as *const ThreadHeap) };
                Slab::after_local_free_arc(slab, h, s);
                Freed::Done
            }
            f => f,
        }
    }

    /// `free_local` without the move: `Moved` when the span must move, for a caller that has
    /// no handle of the slab at hand (the preload's `free`, `SpanMap::free_hot_sole`), which
    /// then calls `after_local_free` with this thread's heap itself.
    ///
    /// Each check is one compare of a word the free needs anyway: the object's index
    /// (`object_index`) against `fresh` (an object's start, handed out), the thread's heap id
    /// against the span's `owner`, the head of `local_free` (its link) against `addr`, and
    /// `used` (counted down) against 2, which also covers a span with none used, an emptied
    /// span other than the current one and one off its class list (`UNLISTED`), all rare. The
    /// thread's heap is not loaded: only the move needs it.
    ///
    /// # Safety
    /// `s` is the span the page map gives for `addr`'s page, read by this thread: if this
    /// thread's heap owns it, it holds `addr` (only its owner, or the holder of the slab lock
    /// for an abandoned heap, gives a span back or reuses its descriptor). For another thread
    /// it may be stale (a free racing with the give-back, a use after free): this function
    /// writes nothing then, and `free_remote_out` checks `addr` against the span.
    #[inline(always)]
    pub(crate) unsafe fn free_owner(s: &Span, addr: usize) -> Freed {
        // `addr` is in the span for the owner (the caller's contract); one below the first
        // object (in the span's colour) wraps to an offset that is no object's.
        if !below_fresh(s, index_in(s, addr)) {
            return Freed::Not;
        }
        if !owned_by(s, table::slab_id()) {
            // Another thread's free (or a thread with no heap of this slab): the caller's one
            // call, `free_remote_out`.
            return Freed::Remote;
        }
        // The owner: the id is that of a heap of this slab (ids are never reused), this
        // thread's.
        let used = s.used.load(Relaxed);
        let local = s.local_free.get();
        // `free_in`'s double-free checks: the object at the head of `local_free`, and (below)
        // a span that counts none used.
        if addr == local {
            return Freed::Not;
        }
        if (used as i32) >= 2 {
            // Listed, with an object still used after this free, or the current span (which
            // stays where it is emptied): the push, one fewer used (`UNLISTED`).
            // SAFETY: `addr` is an object of `s` (checked above), a live span of this thread's
            // heap, handed out and now freed: its first word becomes the link of `local_free`.
            unsafe { *(addr as *mut usize) = local };
            s.local_free.set(addr);
            // Release: the link is written before the count a claiming push reads (thread_free.rs;
            // a plain store on x86).
            s.used.store(used - 1, Release);
            return Freed::Done;
        }
        // Rare: the free empties a span other than the current one (1, listed), or the span is
        // off its class list (`UNLISTED`), or it counts none used (0, or 1 for the current
        // span: a double free, nothing changed), or an armed span's count is at its trim mark
        // (the bias `low` taken out of the word, trim.rs: 1 goes on to `after_local_free`,
        // which trims; 0, or 1 for the current span, to `free_in`, which counts without the
        // bias and trims).
        if used & !UNLISTED == 0 || (used == 1 && s.current.load(Relaxed)) {
            return Freed::Not;
        }
        // SAFETY: as above.
        unsafe { *(addr as *mut usize) = local };
        s.local_free.set(addr);
        // Not 0 (tested above): no wrap, `UNLISTED` kept; Release as above.
        s.used.store(used - 1, Release);
        // The emptied span leaves its list; a parked span comes back.
        Freed::Moved
    }
}

// The loads of the span's words on the owner's free, each the memory operand of the
// instruction that uses it: the compiler gives every atomic load an instruction of its own
// (`mov`, then the arithmetic or compare on the register), three more a free. On x86-64 a memory
// operand is an atomic load (aligned), as `Relaxed` here; elsewhere the same loads in Rust.

/// `object_index` of `addr`'s offset in `s` (`Span::offset`): an object's index for an
/// object's start, at least 2^64 / size otherwise.
#[inline(always)]
fn index_in(s: &Span, addr: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let x: u64;
        // SAFETY: aligned reads of `s`'s `first_neg` (8 bytes), `inv` (8) and `shift` (1),
        // atomics (`Span` is `repr(C)`; `offset_of!` gives their places), and arithmetic; no
        // write, no stack. `ror` by `cl` takes the count modulo 64, as `rotate_right`.
        unsafe {
            core::arch::asm!(
                "mov {x}, {a}",
                "add {x}, qword ptr [{s} + {first}]",
                "imul {x}, qword ptr [{s} + {inv}]",
                "movzx ecx, byte ptr [{s} + {shift}]",
                "ror {x}, cl",
                a = in(reg) addr,
                s = in(reg) s,
                x = out(reg) x,
                out("ecx") _,
                first = const core::mem::offset_of!(Span, first_neg),
                inv = const core::mem::offset_of!(Span, inv),
                shift = const core::mem::offset_of!(Span, shift),
                options(pure, readonly, nostack),
            )
        };
        x
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        object_index(s.offset(addr), s.inv.load(Relaxed), s.shift.load(Relaxed) as u32)
    }
}

/// On x86-64, `false` if `$value` compared with `$s`'s word `$field` (its memory operand) takes
/// the jump `$fail`, else `true`: the check's failure branches away, so that the owner's path
/// falls through every check.
#[cfg(target_arch = "x86_64")]
macro_rules! word_check {
    ($s:expr, $value:expr, $field:ident, $fail:literal) => {{
        // SAFETY: an aligned 8-byte read of a word of the span, an atomic; a compare and a
        // branch; no write, no stack.
        unsafe {
            core::arch::asm!(
                "cmp {v}, qword ptr [{s} + {at}]",
                concat!($fail, " {no}"),
                v = in(reg) $value,
                s = in(reg) $s,
                at = const core::mem::offset_of!(Span, $field),
                no = label { return false },
                options(readonly, nostack),
            )
        };
        true
    }};
}

/// Whether `index` is below `s`'s `fresh` (an object handed out).
#[inline(always)]
fn below_fresh(s: &Span, index: u64) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        word_check!(s, index, fresh, "jae")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        index < s.fresh.load(Relaxed) as u64
    }
}

/// Whether the heap of id `id` owns `s`.
#[inline(always)]
fn owned_by(s: &Span, id: u64) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        word_check!(s, id, owner, "jne")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        id == s.owner.load(Relaxed)
    }
}
