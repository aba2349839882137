//! The slab's two hot paths (docs/design.md, "Small objects (slab layer)", Hot paths): the pop
//! of `malloc` and the owner's free, each with no call (but the memset of a `calloc`), so that
//! the callers save no register for them; everything else is one call to `mod.rs`'s slow
//! paths (`malloc_slow`, `free_in`), made before anything has changed.

use core::ptr::{self, NonNull};
use core::sync::atomic::Ordering::Relaxed;

use super::class::{at_object, class_of, object_size, SMALL_MAX};
use super::span::{Span, LISTED};
use super::{table, Slab};

/// What the hot path of a free did (`Slab::free_local`).
pub(crate) enum Freed {
    /// Freed (the owner's free).
    Done,
    /// Nothing changed: another thread's free of a checked object, for `free_remote_out`.
    Remote,
    /// Nothing changed: `free_in` answers.
    Not,
}

impl Slab {
    /// The hot path alone, for a request of `size` bytes (at most `SMALL_MAX`) of the natural
    /// alignment: pop an object off the current span of its class in the heap this thread used
    /// last; `zero` (`calloc`): memset it whole (an object on a free list reads anything).
    /// `None`: nothing to pop (or a larger request), `malloc_slow` answers. No call but the
    /// memset. The size test is the callers' own, which the compiler merges with this one.
    #[inline(always)]
    pub(crate) fn malloc_hot(&self, size: usize, zero: bool) -> Option<NonNull<u8>> {
        if size > SMALL_MAX {
            return None;
        }
        // SAFETY: `last` gives this thread's own heap (owner), live as long as the slab, or
        // `NO_HEAP`, whose heads are `EMPTY`.
        let h = unsafe { &*table::last(self) };
        // SAFETY: `size <= SMALL_MAX`, tested above.
        let c = unsafe { class_of(size) };
        // SAFETY: `c < CLASSES` (`class_of`); a head is `EMPTY` (whose `free` and `local_free`
        // are 0, so `pop` writes nothing) or a listed span of this heap.
        let o = unsafe { &*h.head.get_unchecked(c).get() }.pop()?;
        if zero {
            // SAFETY: `c < CLASSES` (`class_of`); `o` is an object of class `c` just handed out
            // to this caller.
            unsafe { ptr::write_bytes(o as *mut u8, 0, object_size(c)) };
        }
        // SAFETY: an object address is never 0.
        Some(unsafe { NonNull::new_unchecked(o as *mut u8) })
    }

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
    #[inline(always)]
    pub(crate) fn free_local(&self, s: &Span, addr: usize) -> Freed {
        let start = s.start.load(Relaxed);
        let off = addr.wrapping_sub(start);
        if off >= s.fresh.load(Relaxed).wrapping_sub(start) || !at_object(off, s.recip.load(Relaxed)) {
            return Freed::Not;
        }
        let h = table::last(self);
        if !ptr::eq(s.heap.load(Relaxed), h) {
            // Another thread's free (or a thread with no heap of this slab): the caller's one
            // call, `free_remote_out`.
            return Freed::Remote;
        }
        let used = s.used();
        let local = s.local_free.get();
        // `free_in`'s double-free checks: `local_free`'s head, a span that counts none used.
        if addr == local || used == 0 {
            return Freed::Not;
        }
        // SAFETY: `addr` is an object of `s` (checked above), a live span of this thread's
        // heap, handed out and now freed: its first word becomes the link of `local_free`.
        unsafe { *(addr as *mut usize) = local };
        s.local_free.set(addr);
        s.set_used(used - 1);
        // An emptied span stays only as its class's current one; a parked span comes back.
        if s.place.get() != LISTED
            // SAFETY: this thread's own heap (`last`, tested against the span's owner), live as
            // long as the slab; a span's class is below `CLASSES`.
            || (used == 1 && !ptr::eq(unsafe { (*h).head.get_unchecked(s.class.get() as usize) }.get(), s))
        {
            // SAFETY: as above.
            self.after_local_free(unsafe { &*h }, s);
        }
        Freed::Done
    }
}
