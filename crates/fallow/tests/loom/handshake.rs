//! The per-thread cache's `busy` / `frozen` handshake (`cache/`, mirrored), and the `Handshake` the other cache models share.

use super::*;

// ---- The per-thread cache's busy / frozen handshake (cache/, mirrored) ----
//
// Assumption: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on every thread
// of the process that is running at the time, so the owner's store of `busy` and load of
// `frozen`, which only a compiler fence separates, are ordered as if a full fence stood between
// them, wherever the owner was. Loom cannot model that asymmetric barrier. The model therefore
// gives the owner a SeqCst fence where its compiler fence is and the reporter a SeqCst fence
// where it calls `membarrier`: exactly the ordering membarrier provides (a SeqCst fence pair),
// no more. The cache's entries are a loom `UnsafeCell`: loom fails the model if the owner and
// the reporter ever touch them without a happens-before edge between the two, that is if the
// owner is ever inside while the reporter drains or reads.

/// One cache's `busy` and `frozen` words and the owner's side of their handshake, as
/// `ThreadCache::enter` and its `leave` do it (every model of a cache below has one).
pub(crate) struct Handshake {
    pub(crate) busy: AtomicU32,
    pub(crate) frozen: AtomicU32,
}

impl Handshake {
    pub(crate) fn new() -> Handshake {
        Handshake { busy: AtomicU32::new(0), frozen: AtomicU32::new(0) }
    }

    /// Mirrors `ThreadCache::enter`. `fenced: false` is the protocol broken on purpose.
    pub(crate) fn enter(&self, fenced: bool) -> bool {
        self.busy.store(1, Relaxed);
        if fenced {
            fence(SeqCst); // compiler_fence(SeqCst) + what membarrier adds to it (see the top)
        }
        if self.frozen.load(Acquire) != 0 {
            self.busy.store(0, Release);
            return false;
        }
        true
    }

    /// Mirrors `ThreadCache::leave` (its compiler fence keeps the compiler from moving the
    /// call's accesses past the store; the Release store orders them for other threads).
    pub(crate) fn leave(&self) {
        self.busy.store(0, Release);
    }
}

struct Cache {
    hs: Handshake,
    /// The entries and stack sizes (plain memory in `ThreadCache`).
    entries: UnsafeCell<u64>,
}

impl Cache {
    fn new() -> Cache {
        Cache { hs: Handshake::new(), entries: UnsafeCell::new(0) }
    }

    /// One call of the owner: a hit between `enter` and `leave` (writes the entries), or the
    /// locked path (the lists, under the lock; never the entries).
    fn owner_call(&self, lock: &Mutex<()>, fenced: bool) {
        if self.hs.enter(fenced) {
            // SAFETY: `e` is the cell's own pointer, valid for the closure; between `enter` (which saw
            // `frozen` clear after its fence) and `leave` no drainer or checker touches the entries
            // (the handshake this model proves; loom fails a racing access).
            self.entries.with_mut(|e| unsafe { *e += 1 });
            self.hs.leave();
        } else {
            drop(lock.lock().unwrap());
        }
    }
}

/// Mirrors `cache::drain_unanswered` for one unanswered cache: freeze under the lock, then
/// `membarrier` without it, then under the lock again drain if the owner is not `busy`, and thaw.
fn drain_unanswered(c: &Cache, lock: &Mutex<()>) -> bool {
    {
        let _h = lock.lock().unwrap();
        c.hs.frozen.store(1, Relaxed);
    }
    fence(SeqCst); // crate::os::membarrier()
    let _h = lock.lock().unwrap();
    let mut drained = false;
    if c.hs.frozen.load(Relaxed) != 0 {
        if c.hs.busy.load(Acquire) == 0 {
            // SAFETY: `e` is the cell's own pointer, valid for the closure; with `frozen` set, fenced,
            // and `busy` seen clear, the owner stays out of the entries until the thaw (the handshake
            // this model proves; loom fails a racing access).
            c.entries.with_mut(|e| unsafe { *e = 0 });
            drained = true;
        }
        c.hs.frozen.store(0, Release);
    }
    drained
}

/// Mirrors `cache::lock_owners_out` and `FrozenHeap`'s drop (`check_invariants`, `free_runs`):
/// under one hold of the lock, freeze, `membarrier`, and read the entries if the owner is not
/// `busy`; thaw when the lock is let go; retry (here once more) if the owner was inside.
fn check_entries(c: &Cache, lock: &Mutex<()>) -> bool {
    for _ in 0..2 {
        let h = lock.lock().unwrap();
        c.hs.frozen.store(1, Relaxed);
        fence(SeqCst); // crate::os::membarrier()
        let read = c.hs.busy.load(Acquire) == 0;
        if read {
            // SAFETY: `e` is the cell's own pointer, valid for the closure; with `frozen` set, fenced,
            // and `busy` seen clear, the owner does not write the entries until the thaw (the
            // handshake this model proves; loom fails a racing access).
            c.entries.with(|e| unsafe { *e });
        }
        c.hs.frozen.store(0, Release); // FrozenHeap::drop, still under the lock
        drop(h);
        if read {
            return true;
        }
        thread::yield_now(); // crate::os::sleep_ns(100_000)
    }
    false
}

/// The owner makes two calls (the second finds the cache thawed, or not) while the reporter
/// drains the cache as unanswered, or `check_invariants` reads it.
fn cache_model(fenced: bool, reporter: fn(&Cache, &Mutex<()>) -> bool) {
    model(move || {
        let c = Arc::new(Cache::new());
        let lock = Arc::new(Mutex::new(()));
        let (c2, lock2) = (c.clone(), lock.clone());
        let owner = thread::spawn(move || {
            c2.owner_call(&lock2, fenced);
            c2.owner_call(&lock2, fenced);
        });
        reporter(&c, &lock);
        owner.join().unwrap();
    });
}

#[test]
fn the_reporter_never_drains_a_cache_its_owner_is_in() {
    cache_model(true, drain_unanswered);
}

#[test]
fn check_invariants_never_reads_a_cache_its_owner_is_in() {
    cache_model(true, check_entries);
}

// The owner's fence removed (what the handshake would be without `membarrier`): both sides can
// miss the other's store, and loom finds the owner and the reporter in the entries at once.
broken_on_purpose!(
    broken_cache_handshake_without_the_owners_fence,
    without_the_owners_fence_loom_finds_the_owner_inside,
    "Causality violation",
    cache_model(false, drain_unanswered)
);
