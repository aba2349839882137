//! The hot paths of a binding that makes requests of one allocator with small objects (the
//! preload library's `SMALL`): `malloc_hot_sole` pops off the calling thread's heap with no
//! test of whose it is, and `SpanMap::free_hot_sole` frees through the binding's own copy of
//! the first arena's page map (`Allocator::span_map`), with neither the allocator nor its slab
//! loaded. What either cannot finish is one call the binding makes with the allocator:
//! `SpanMove::finish`, `RemoteFree::finish`, or `free_cold`.

use core::ptr::NonNull;

use super::{Allocator, RemoteFree};
use crate::slab::{Freed, Slab, Span, SpanMap, ThreadHeap};

/// What `SpanMap::free_hot_sole` did with a pointer.
pub enum FreeSole<'a> {
    /// Freed (the calling thread's own small object).
    Done,
    /// Freed (the calling thread's own small object), and its span must move on its heap's
    /// lists: `SpanMove::finish`, before this thread makes another request.
    Moved(SpanMove<'a>),
    /// Another thread's small object, checked, not yet freed: `RemoteFree::finish` frees it.
    Remote(RemoteFree<'a>),
    /// Nothing done: `Allocator::free_cold` answers.
    Cold,
}

/// The span of a free that must move (`FreeSole::Moved`). One word, for registers.
pub struct SpanMove<'a> {
    span: &'a Span,
}

impl SpanMove<'_> {
    /// Move the span as the owner's free that emptied it (or freed into it parked) does: an
    /// empty span leaves its class list (and may go back to the page layer), a parked one
    /// comes back, an armed one is trimmed.
    ///
    /// # Safety
    /// `a` is the allocator whose `span_map` gave the map that gave this, and the calling
    /// thread is the one whose free gave it, its slab heap word unchanged since: no request of
    /// any allocator with small objects (of this copy of the crate) made in between, which
    /// could make another slab's heap the one it used last.
    #[inline(always)]
    pub unsafe fn finish(self, a: &Allocator) {
        debug_assert_eq!(crate::slab::slab_id(), self.span.owner.load(core::sync::atomic::Ordering::Relaxed));
        // SAFETY: the free was this thread's own (`Freed::Moved`: the span's owner is the id
        // of this thread's heap word, unchanged since, the caller's contract), so the heap word
        // is this thread's heap of `a`'s slab.
        let h = unsafe { &*(crate::slab::slab_heap() as *const ThreadHeap) };
        Slab::after_local_free_arc(&a.slab, h, self.span);
    }
}

impl Allocator {
    /// `malloc_hot` of the one allocator with small objects on of a process: the calling
    /// thread's heap it used last, with no test of which allocator's it is (the compare of its
    /// slab's id, and the load of the allocator, are what this saves a binding's `malloc`).
    ///
    /// # Safety
    /// Every allocator with small objects on that any thread of the process has made requests
    /// of, through this copy of the crate, is the one the caller means (the preload library's
    /// `SMALL`): the object returned is that allocator's.
    #[inline(always)]
    pub unsafe fn malloc_hot_sole(size: usize, zero: bool) -> Option<NonNull<u8>> {
        // SAFETY: the caller's contract, passed on.
        unsafe { crate::slab::malloc_hot_sole(size, zero) }
    }

    /// A copy of the first arena's range and page map of spans, for `SpanMap::free_hot_sole`;
    /// `None` with small objects off. The copy is valid as long as this allocator lives (the
    /// map is unmapped with its slab).
    pub fn span_map(&self) -> Option<SpanMap> {
        self.keys.on.then_some(self.keys.first)
    }
}

impl SpanMap {
    /// The hot path of a free through a binding's copy of the page map: the owner's free of a
    /// small object of the first arena, with `free_any`'s checks, inline and with no call. Any
    /// other pointer (another arena's, a page block's, glibc's, a bad one) is `Cold`, with
    /// nothing done.
    ///
    /// # Safety
    /// `self` is `span_map` of an allocator that still lives, the one allocator with small
    /// objects on that the calling thread makes requests of (as `malloc_hot_sole`'s contract),
    /// and the one the caller passes to `finish` or `free_cold` after.
    #[inline(always)]
    pub unsafe fn free_hot_sole(&self, ptr: *mut u8) -> FreeSole<'_> {
        let addr = ptr as usize;
        let Some(s) = self.find(addr) else {
            return FreeSole::Cold;
        };
        // SAFETY: `s` is what the page map holds for `addr`'s page, just read by this thread.
        match unsafe { Slab::free_owner(s, addr) } {
            Freed::Done => FreeSole::Done,
            Freed::Moved => FreeSole::Moved(SpanMove { span: s }),
            Freed::Remote => FreeSole::Remote(RemoteFree { span: s, addr }),
            Freed::Not => FreeSole::Cold,
        }
    }
}
