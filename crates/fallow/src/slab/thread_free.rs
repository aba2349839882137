//! The word other threads push their frees on (`Span::thread_free`) and the remote-free
//! protocol around it: the owner's collect, park, take and release of a span, a push, and a
//! claim of a span every object of which other threads freed.
//!
//! The remote-free protocol (model-checked: tests/loom/slab_remote.rs, tests/loom/slab_claim.rs).
//! `thread_free` holds the head of the list, a count of the objects on it (the bits from
//! `COUNT_SHIFT` up), and three flags. `PARKED`: the owner found the span full and took it off its
//! class list. The owner parks only by `0 -> PARKED | UNTOUCHED` (a compare-and-swap: a push
//! that came first makes it fail, and the owner collects that instead); a push replaces the
//! word by its object, clearing `PARKED` in the same compare-and-swap, so exactly one push sees
//! the span parked and that one hands it back to the owner (the heap's `returned` stack). The
//! owner's own free into a parked span clears the bit with one `fetch_and`; whoever clears it
//! moves the span back.
//!
//! `UNTOUCHED`: the owner is not using the span: it is parked, or on its class list behind the
//! current span (the head), and the owner is not in the middle of a slow path on it. The owner
//! sets it with a release read-modify-write when the span stops being current or is parked
//! (`release`, `try_park`) and clears it with an acquire one (`take`, `unpark`, `collect`)
//! before it does anything with the span but free an object into it: make it current, collect
//! it, trim it, move it. Its hot paths never touch such a span but to free into it (they pop from
//! the current span only), and that free writes the object's link before its release store of
//! `used`. So a push into an untouched span after which every object counted in `used` is on
//! `thread_free` (the count equals `used` read with acquire) knows that no object of the span is
//! live and that the owner will look at the word before it touches the span again: it sets
//! `CLAIMED` by a compare-and-swap from the word its push left (`claim`; a take or another push
//! since makes it fail, and that push asks again) and gives the span's pages back to the page
//! layer (remote.rs). A claim and a take cannot both succeed (both are read-modify-writes of
//! the word). An owner that finds `CLAIMED` drops the descriptor from its lists (it gives it
//! back to the pool later, under the slab lock) and never reads the span's lists. A push into a
//! claimed span is refused (every object of it was free).
//!
//! Which spans a push claims: an owner that sleeps would hold the spans others emptied for as
//! long as it sleeps (a producer that filled them and waits), but a busy owner reaches its
//! listed spans again soon, and a claim would send each back to the page layer just before it
//! takes a new one. So a push claims only if its heap's owner has run no slow path
//! (`ThreadHeap::slow_paths`) since the first push after the span was last collected
//! (`epoch_seen`, noted by that push): a heuristic, which the protocol's safety does not rest on.

use core::ptr;
use core::sync::atomic::{fence, AtomicPtr, AtomicU32, Ordering::{Acquire, Relaxed, Release, SeqCst}};

use super::span::{Span, UNLISTED};
use crate::page::GranuleStates;

/// Bit 0 of `thread_free`: the span is parked (full, off its class list).
pub(crate) const PARKED: usize = 1;
/// Bit 1 of `thread_free`: the owner is not using the span (parked, or listed behind the head).
pub(crate) const UNTOUCHED: usize = 2;
/// Bit 2 of `thread_free`: a push found every object the untouched span counts used on
/// `thread_free` and gave the span's pages back; the descriptor waits for its owner to drop it.
pub(crate) const CLAIMED: usize = 4;
/// The objects on `thread_free`, in its high bits: one push adds `ONE_PUSH` (object addresses
/// are below 2^48, `Slab::map_entries`, and a span holds at most 4,096 objects).
const COUNT_SHIFT: u32 = 48;
const ONE_PUSH: usize = 1 << COUNT_SHIFT;
/// The head of the list in a `thread_free` word (objects are 16-byte aligned: the flags' bits
/// are never an address's).
pub(crate) const HEAD: usize = (ONE_PUSH - 1) & !(PARKED | UNTOUCHED | CLAIMED);
/// The highest address of an object (exclusive): what fits in `HEAD`.
pub(crate) const ADDRESS_LIMIT: usize = ONE_PUSH;

impl Span {
    /// The owner moves the other threads' frees to `free` (its own stay on `local_free`, popped
    /// first): how many objects it took back (already out of `used`).
    pub(crate) fn collect(&self) -> u32 {
        // The owner collects a span it took (`take`: no `UNTOUCHED`, no `CLAIMED`), whose word
        // has a count only with a list; Acquire: the pushers' links are visible.
        let mut head = self.thread_free.load(Relaxed);
        if head & HEAD == 0 {
            return 0;
        }
        head = self.thread_free.fetch_and(PARKED, Acquire);
        debug_assert!(head & (UNTOUCHED | CLAIMED) == 0, "a span collected without being taken");
        head &= HEAD;
        // Every object on the list still counts in `used`: a walk longer than that is a list
        // made a cycle by a double free the push's head check missed (a, b, a), which would
        // otherwise spin here forever.
        let used = self.used();
        let mut n = 1u32;
        let mut tail = head;
        // SAFETY: the objects on `thread_free` are free objects of this span, linked through
        // their first words by the pushers before their release compare-and-swap, which the
        // acquire above synchronises with; taken off the list, they are the owner's alone.
        unsafe {
            loop {
                if n > used {
                    crate::message::fatal("free", &crate::error::Error::DoubleFree { addr: tail });
                }
                let next = *(tail as *const usize);
                if next == 0 {
                    break;
                }
                tail = next;
                n += 1;
            }
            *(tail as *mut usize) = self.free.get();
        }
        self.free.set(head);
        self.set_used(self.used().wrapping_sub(n));
        n
    }

    /// The owner parks a span it found full (every object handed out, none on its lists):
    /// `true` if parked (`0 -> PARKED | UNTOUCHED`); `false` if a push came first (collect it).
    pub(crate) fn try_park(&self) -> bool {
        self.thread_free.compare_exchange(0, PARKED | UNTOUCHED, SeqCst, Relaxed).is_ok()
    }

    /// The owner takes a parked span back (its free into it, or giving up its heap):
    /// `PARKED` and `UNTOUCHED` cleared in one read-modify-write (no claim can follow). What it
    /// found: `Unparked` (it cleared `PARKED`: it moves the span back), `HandedBack` (a push did:
    /// the span comes back through `returned`), `Claimed` (a push claimed it: every object was
    /// free, so a free into it is a double free).
    pub(crate) fn unpark(&self) -> TakenBack {
        let w = self.thread_free.fetch_and(!(PARKED | UNTOUCHED), Acquire);
        if w & CLAIMED != 0 {
            TakenBack::Claimed
        } else if w & PARKED != 0 {
            TakenBack::Unparked
        } else {
            TakenBack::HandedBack
        }
    }

    /// The owner takes a span it left (handed back off `returned`, or listed behind its class's
    /// current span) before it does anything with it: `UNTOUCHED` cleared in one read-modify-
    /// write; `true` if a push claimed it first (drop the descriptor without reading the span's
    /// lists: its pages are the page layer's).
    #[must_use]
    pub(crate) fn take(&self) -> bool {
        self.thread_free.fetch_and(!UNTOUCHED, Acquire) & CLAIMED != 0
    }

    /// The owner leaves a listed span (it stops being its class's current one, or the owner's
    /// slow path is done with it): `UNTOUCHED` set; Release: what the owner wrote of it (`used`
    /// above all) is what a claiming push reads.
    pub(crate) fn release(&self) {
        self.thread_free.fetch_or(UNTOUCHED, Release);
    }

    /// Whether a push claimed the span (the statistics and checks; the owner learns it from
    /// `unpark` or `take`).
    pub(crate) fn is_claimed(&self) -> bool {
        self.thread_free.load(Relaxed) & CLAIMED != 0
    }

    /// Another thread frees `addr` (an object of this span): push it on `thread_free`. `Err`:
    /// it is the object pushed last, or the span was claimed (a double free). Else whether this
    /// push handed a parked span back to its owner (the caller pushes it on the heap's
    /// `returned`) and the word it left (for `claim_due`).
    #[inline(always)]
    pub(crate) fn push_remote(&self, addr: usize) -> Result<Pushed, ()> {
        let mut old = self.thread_free.load(Relaxed);
        loop {
            if old & HEAD == addr || old & CLAIMED != 0 {
                return Err(());
            }
            // SAFETY: `addr` is an object of this live span that the caller frees: free memory
            // of the span, whose first word is the list's link.
            unsafe { *(addr as *mut usize) = old & HEAD };
            // `PARKED` cleared, `UNTOUCHED` kept, one more on the list (the count is at most
            // a span's objects, far below 2^16, but for a list a double free made a cycle of,
            // whose wrap leaves the low bits alone).
            let new = ((old & !HEAD & !PARKED).wrapping_add(ONE_PUSH)) | addr;
            // SeqCst: ordered before the caller's load of the heap's `abandoned` (the exiting
            // owner stores it, then collects: one of the two sees the other).
            match self.thread_free.compare_exchange_weak(old, new, SeqCst, Relaxed) {
                Ok(_) => return Ok(Pushed { handed_back: old & PARKED != 0, word: new }),
                Err(now) => old = now,
            }
        }
    }

    /// After a push that left `word` (with `UNTOUCHED`): whether to claim the span (`claim`):
    /// every object `used` counts is on `thread_free`, and the owner ran no slow path
    /// (`slow_paths`, its heap's) since the first push of the list (the module's comment). The
    /// first push notes the owner's count (`epoch_seen`): a span one object of which is used is
    /// never claimed.
    #[inline(always)]
    pub(crate) fn claim_due(&self, word: usize, slow_paths: &AtomicU32) -> bool {
        let count = word >> COUNT_SHIFT;
        // Acquire, after the push's read of the word: the owner's writes before its release
        // of the span (`release`, `try_park`: the word the push replaced is theirs or a later
        // push's) are visible. And `used` with acquire: the owner's frees into the span since
        // (each a release store of `used`, after its link) happen before the claim. `used`
        // only comes down while the span is untouched, so an older value read is larger: never
        // a claim too many. `current` is false.
        fence(Acquire);
        let used = (self.used.load(Acquire) & !UNLISTED) + self.low.load(Acquire);
        if count == 1 {
            self.epoch_seen.store(slow_paths.load(Relaxed), Relaxed);
            return false;
        }
        count == used as usize && slow_paths.load(Relaxed) == self.epoch_seen.load(Relaxed)
    }

    /// Claim the span whose word a push left as `word` (`claim_due` said so): `CLAIMED` set by a
    /// compare-and-swap from that word, so that a take by the owner or another push since makes
    /// it fail (that push asks again). `Some`, the states its pages go back with
    /// (`free_states`), if claimed: read before the compare-and-swap (the span is untouched, and
    /// the owner's give-back of its never-used tail, which changes them, leaves a span with
    /// pushes waiting alone: tail.rs), as after it the owner may give the descriptor to another
    /// span.
    #[cold]
    pub(crate) fn claim(&self, word: usize) -> Option<GranuleStates> {
        let states = self.free_states();
        self.thread_free.compare_exchange(word, word | CLAIMED, SeqCst, Relaxed).ok().map(|_| states)
    }
}

/// What a push did besides pushing (`Span::push_remote`).
pub(crate) struct Pushed {
    /// The span was parked: this push handed it back to its owner.
    pub(crate) handed_back: bool,
    /// The word the push left.
    pub(crate) word: usize,
}

/// What the owner found when it took a parked span back (`Span::unpark`).
#[derive(PartialEq, Eq, Debug)]
pub(crate) enum TakenBack {
    Unparked,
    HandedBack,
    Claimed,
}

/// A stack of spans handed back by pushes (`ThreadHeap::returned`): pushed by any thread,
/// taken whole by the owner with one swap (no pop, hence no ABA).
pub(crate) fn push_returned(head: &AtomicPtr<Span>, s: &Span) {
    let me = s as *const Span as *mut Span;
    let mut old = head.load(Relaxed);
    loop {
        s.returned_next.store(old, Relaxed);
        match head.compare_exchange_weak(old, me, SeqCst, Relaxed) {
            Ok(_) => return,
            Err(now) => old = now,
        }
    }
}

/// Take the whole stack (the owner).
pub(crate) fn take_returned(head: &AtomicPtr<Span>) -> *mut Span {
    if head.load(Relaxed).is_null() {
        return ptr::null_mut();
    }
    head.swap(ptr::null_mut(), Acquire)
}
