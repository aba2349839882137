//! Finding a thread's heap of a slab without `malloc`: a thread-local table of `(slab id, heap,
//! slab)` slots with a destructor that gives the heaps up at thread exit, and the heap used last
//! in two thread-local words for the hot paths (the pattern of cache/table.rs). Heaps come from
//! the slab (a page each from the OS, or an abandoned heap adopted whole), never from `malloc`;
//! registering the table's destructor may call `malloc`, and a call that comes back here
//! meanwhile (the thread's state `BUSY`), or after the destructor ran (`DEAD`), gets no heap: the
//! slab serves it from its locked heap.
//!
//! The heap used last (`last`) is what every hot path asks first: two thread-local words (module
//! `last` below, `os::tls`'s scheme), read without a call (static TLS with the initial-exec
//! model on x86-64 Linux): the heap's id
//! (`ThreadHeap::id`: its slab's id in the high bits) and its address. `malloc` tells its slab's
//! heap by the id's high bits; the owner's free tells its own span by the whole id, one compare
//! with the span's `owner` (ids are never reused in a process, so a word left by a slab that is
//! gone matches nothing, where the address of its heap's page may be a new heap's).

use core::cell::{Cell, RefCell};
use core::ptr;
use std::sync::{Arc, Weak};

use super::heap::ThreadHeap;
use super::{Keys, Slab};

/// The slab heap this thread used last and its id, `os::tls`'s scheme: on x86-64 Linux a block
/// of static TLS of its own (`fallow_last_slab`), whose heap word starts as `NO_HEAP`, so that
/// the pop of a binding with one slab (`malloc_hot_sole`) needs no test of it: a thread that
/// never had a heap, or gave its heap up, pops from `NO_HEAP`'s `EMPTY` heads and finds nothing.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod last {
    // The heap word's initial value is a relocation the loader applies to the block's image
    // before it copies it into any thread (`os::tls`).
    core::arch::global_asm!(
        ".pushsection .tdata,\"awT\",@progbits",
        ".p2align 4",
        ".globl fallow_last_slab",
        ".hidden fallow_last_slab",
        ".type fallow_last_slab,@object",
        ".size fallow_last_slab,16",
        "fallow_last_slab:",
        ".quad 0",
        ".quad {no_heap}",
        ".popsection",
        no_heap = sym super::super::heap::NO_HEAP,
    );

    crate::os::tls::tls_pair!("fallow_last_slab", last_pair, set_last, "0");
    // The words alone, one load each: the owner's free compares the id and needs the heap
    // only when a span moves; the pop needs the heap alone.
    crate::os::tls::tls_word!("fallow_last_slab", slab_id_word, "0");
    crate::os::tls::tls_word!("fallow_last_slab", slab_heap, "8");

    #[inline(always)]
    pub(crate) fn slab_id() -> u64 {
        slab_id_word() as u64
    }
}

/// Elsewhere: a `thread_local!`, 0 for no heap, read as `NO_HEAP`.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod last {
    use core::cell::Cell;

    thread_local! {
        static LAST: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
    }

    #[inline(always)]
    pub(crate) fn last_pair() -> (u64, usize) {
        LAST.with(|l| l.get())
    }

    #[inline]
    pub(crate) fn set_last(id: u64, p: usize) {
        LAST.with(|l| l.set((id, p)))
    }

    #[inline(always)]
    pub(crate) fn slab_heap() -> usize {
        match last_pair().1 {
            0 => super::ThreadHeap::none() as usize,
            h => h,
        }
    }

    #[inline(always)]
    pub(crate) fn slab_id() -> u64 {
        last_pair().0
    }
}

pub(crate) use last::{slab_heap, slab_id};
use last::{last_pair, set_last};

/// This thread uses no heap of any slab now (its heap word back to `NO_HEAP`).
fn clear_last() {
    set_last(0, ThreadHeap::none() as usize);
}

const FRESH: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
const DEAD: u8 = 3;

/// Slabs one thread keeps heaps of at once; a further one takes the slot used longest ago (its
/// heap is given up as at thread exit).
const SLOTS: usize = 8;

struct Slot {
    id: u64,
    heap: *mut ThreadHeap,
    slab: Weak<Slab>,
    used: u64,
}

struct Slots {
    slots: RefCell<[Option<Slot>; SLOTS]>,
    clock: Cell<u64>,
}

thread_local! {
    static STATE: Cell<u8> = const { Cell::new(FRESH) };
    static TABLE: Slots = const { Slots { slots: RefCell::new([const { None }; SLOTS]), clock: Cell::new(0) } };
}

/// Bits of a heap id below its slab's id: a slab makes at most `2^HEAP_BITS - 1` heaps (an
/// exiting thread's heap is adopted by the next new one, so this bounds the threads alive at
/// once, not those started); a thread that finds none gets the locked heap.
pub(crate) const HEAP_BITS: u32 = 20;

/// The calling thread's heap of the slab of `keys` if it is the one this thread used last,
/// else `ThreadHeap::none()` (`NO_HEAP`: no span, nothing to pop).
#[inline(always)]
pub(crate) fn last(keys: &Keys) -> *mut ThreadHeap {
    // The heap this thread used last and its id (0: none), in `os::tls`.
    let (id, heap) = last_pair();
    if id >> HEAP_BITS == keys.id {
        heap as *mut ThreadHeap
    } else {
        ThreadHeap::none()
    }
}

/// The calling thread's heap of `slab`, made or adopted at first use; null while the thread is
/// setting its table up or after its destructor ran.
pub(crate) fn current(slab: &Arc<Slab>) -> *mut ThreadHeap {
    let h = last(&slab.keys);
    if !ptr::eq(h, ThreadHeap::none()) {
        return h;
    }
    attach(slab)
}

#[cold]
fn attach(slab: &Arc<Slab>) -> *mut ThreadHeap {
    match STATE.with(|s| s.get()) {
        FRESH => {
            STATE.with(|s| s.set(BUSY));
            // The first access registers the table's destructor (which may call `malloc`).
            let ok = TABLE.try_with(|_| ()).is_ok();
            STATE.with(|s| s.set(if ok { READY } else { DEAD }));
            if !ok {
                return ptr::null_mut();
            }
        }
        READY => {}
        _ => return ptr::null_mut(),
    }
    let found = TABLE.try_with(|t| {
        let now = t.clock.get() + 1;
        t.clock.set(now);
        let mut slots = t.slots.borrow_mut();
        if let Some(s) = slots.iter_mut().flatten().find(|s| s.id == slab.keys.id) {
            s.used = now;
            return (s.heap, None);
        }
        let pick = slots.iter().position(Option::is_none).unwrap_or_else(|| {
            (0..SLOTS).min_by_key(|&i| slots[i].as_ref().map_or(0, |s| s.used)).unwrap()
        });
        let old = slots[pick].take();
        let heap = slab.heap_for_thread();
        if !heap.is_null() {
            slots[pick] = Some(Slot { id: slab.keys.id, heap, slab: Arc::downgrade(slab), used: now });
        }
        (heap, old)
    });
    let Ok((heap, old)) = found else { return ptr::null_mut() };
    if let Some(old) = old {
        if last_pair().1 == old.heap as usize {
            clear_last();
        }
        give_up(old);
    }
    if !heap.is_null() {
        // SAFETY: a heap of `slab` (live as long as it), now this thread's.
        set_last(unsafe { (*heap).id.get() }, heap as usize);
    }
    heap
}

/// Give a slot's heap up to its slab, if the slab still exists (else its memory went with it).
fn give_up(s: Slot) {
    if let Some(slab) = s.slab.upgrade() {
        slab.abandon(s.heap);
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // This thread is leaving: if the program's first thread has left, it may be the last.
        crate::worker::exit_watch::thread_leaves();
        STATE.with(|s| s.set(DEAD));
        clear_last();
        let slots = core::mem::replace(&mut *self.slots.borrow_mut(), [const { None }; SLOTS]);
        for s in slots.into_iter().flatten() {
            give_up(s);
        }
    }
}

/// The calling thread's heap of `slab` in its table, whatever it used last (the `fork` child's
/// forking thread: its heap stays its own).
pub(crate) fn own_heap(slab: &Slab) -> *mut ThreadHeap {
    if STATE.with(|s| s.get()) != READY {
        return ptr::null_mut();
    }
    TABLE
        .try_with(|t| t.slots.try_borrow().ok().and_then(|s| s.iter().flatten().find(|s| s.id == slab.keys.id).map(|s| s.heap)))
        .ok()
        .flatten()
        .unwrap_or(ptr::null_mut())
}
