//! The drain request's generations (`cache/`, `report.rs`, `heap/`; mirrored).

use super::*;

// ---- The drain request's generations (cache/, report.rs, heap/; mirrored) ----
//
// `Allocator::request_cache_drain` and the reporter's `caches_step` (`ask_to_drain`, under the
// lock) bump `drain_generation` and set each cache's `drain_asked`; a cache obeys at its next free
// (the hit sees the flag, the out-of-line free the new generation: `needs_room`, then
// `make_room` -> `obey_drain_request` under the lock, which reads it again and clears the flag)
// or at its next refill, and records the generation obeyed in `seen_generation`; the reporter drains a cache that has not
// obeyed its request and whose owner is not inside (`drain_unanswered`). The model: the owner's
// cache holds block A (cached before the request); the owner frees block B while the reporter
// requests a drain and then drains the cache if it is unanswered; after both, the owner's next
// free (block C), which must see the request. The request is never lost: A is out of the cache by
// then, drained by the owner or by the reporter. The cache's entries (a set of blocks) are a loom
// `UnsafeCell`; the handshake is the one modelled above.

const BLOCK_A: u8 = 1;
const BLOCK_B: u8 = 2;
const BLOCK_C: u8 = 4;

struct Gen {
    /// The blocks on the free lists (under the allocator lock).
    lists: Mutex<u8>,
    /// `HitPath::drain_generation`.
    generation: AtomicU64,
    hs: Handshake,
    /// The blocks in the cache's entries.
    entries: UnsafeCell<u8>,
    pages: AtomicU32,
    seen_generation: AtomicU64,
    /// `ThreadCache::drain_asked`.
    asked: AtomicU32,
    /// Broken on purpose: `drain_unanswered` records the request as obeyed by a cache it left
    /// alone because its owner was inside.
    broken: bool,
}

impl Gen {
    /// Mirrors `Allocator::free_checked` of `block`: `free_hit` inside `enter` / `leave`, else
    /// `ThreadCache::free` inside them, else `free_locked`.
    fn free(&self, block: u8) {
        for may_drain in [false, true] {
            if self.hs.enter(true) {
                let hit = self.take_freed(block, may_drain);
                self.hs.leave();
                if hit {
                    return;
                }
            }
        }
        *self.lists.lock().unwrap() |= block;
    }

    /// Mirrors `ThreadCache::take_freed`: `needs_room_at` (the high mark and the stack are never
    /// reached here: only the request, the flag on the hit path, the generation off it),
    /// `make_room` if allowed, then the push.
    fn take_freed(&self, block: u8, may_drain: bool) -> bool {
        let asked = if may_drain { self.generation.load(Relaxed) != self.seen_generation.load(Relaxed) } else { self.asked.load(Relaxed) != 0 };
        if asked {
            if !may_drain {
                return false;
            }
            // make_room: `obey_drain_request` (else `drain_to_half`: nothing over half here).
            let mut h = self.lists.lock().unwrap();
            let g = self.generation.load(Relaxed);
            if g != self.seen_generation.load(Relaxed) {
                self.seen_generation.store(g, Relaxed);
                self.asked.store(0, Relaxed);
                self.drain_all_locked(&mut h);
            }
        }
        // SAFETY: `e` is the cell's own pointer, valid for the closure; the owner is between
        // `enter` and `leave` (loom fails an access of the reporter's not ordered with this one).
        self.entries.with_mut(|e| unsafe { *e |= block });
        self.pages.store(self.pages.load(Relaxed) + 1, Relaxed);
        true
    }

    /// Mirrors `ThreadCache::drain_all_locked`: every entry to the lists.
    fn drain_all_locked(&self, lists: &mut u8) {
        // SAFETY: `e` is the cell's own pointer, valid for the closure; the owner is between `enter`
        // and `leave`, or the reporter holds it out (loom fails a racing access).
        let all = self.entries.with_mut(|e| unsafe { core::mem::take(&mut *e) });
        assert_eq!(*lists & all, 0, "a block listed twice");
        *lists |= all;
        self.pages.store(0, Relaxed);
    }

    /// Mirrors `report::caches_step`'s request (`ask_to_drain`) and, after its nap,
    /// `cache::drain_unanswered` of that generation.
    fn caches_step(&self) {
        let g = {
            let _h = self.lists.lock().unwrap();
            let g = self.generation.fetch_add(1, Relaxed) + 1;
            self.asked.store(1, Relaxed);
            g
        };
        {
            let _h = self.lists.lock().unwrap();
            if self.pages.load(Relaxed) == 0 || self.seen_generation.load(Relaxed) == g {
                return;
            }
            self.hs.frozen.store(1, Relaxed);
        }
        fence(SeqCst); // crate::os::membarrier()
        let mut h = self.lists.lock().unwrap();
        if self.hs.frozen.load(Relaxed) != 0 {
            if self.hs.busy.load(Acquire) == 0 {
                self.drain_all_locked(&mut h);
                self.seen_generation.store(g, Relaxed);
                self.asked.store(0, Relaxed); // no later request here
            } else if self.broken {
                self.seen_generation.store(g, Relaxed);
            }
            self.hs.frozen.store(0, Release);
        }
    }
}

fn drain_request_model(broken: bool) {
    model(move || {
        let c = Arc::new(Gen {
            lists: Mutex::new(0),
            generation: AtomicU64::new(0),
            hs: Handshake::new(),
            entries: UnsafeCell::new(BLOCK_A),
            pages: AtomicU32::new(1),
            seen_generation: AtomicU64::new(0),
            asked: AtomicU32::new(0),
            broken,
        });
        let c2 = c.clone();
        let owner = thread::spawn(move || c2.free(BLOCK_B));
        c.caches_step();
        owner.join().unwrap();
        // The owner's next call (joined: it sees the request).
        c.free(BLOCK_C);
        let lists = *c.lists.lock().unwrap();
        // SAFETY: `e` is the cell's own pointer, valid for the closure; every thread is done.
        let cached = c.entries.with(|e| unsafe { *e });
        assert_eq!(cached & BLOCK_A, 0, "the drain request was lost: block A is still cached");
        assert_eq!((lists | cached, lists & cached), (BLOCK_A | BLOCK_B | BLOCK_C, 0));
    });
}

#[test]
fn a_drain_request_is_obeyed_by_the_owner_or_the_reporter() {
    drain_request_model(false);
}

// `drain_unanswered` recording its generation on a cache it left alone (owner inside): the
// owner's next calls take the request as obeyed, and block A stays cached.
broken_on_purpose!(
    broken_drain_request_marked_obeyed_when_skipped,
    a_skipped_cache_marked_as_obeyed_loses_the_request,
    "request was lost",
    drain_request_model(true)
);
