//! A remote free against its span's owner abandoning the heap (`Slab::abandon` and
//! `Slab::free_remote` / `collect_abandoned`, slab/mod.rs; `Span::collect`, slab/span.rs;
//! mirrored).

use super::*;

use loom::sync::atomic::{AtomicBool, AtomicUsize};

// The exiting owner, under the slab lock, stores `abandoned` (SeqCst) and collects its spans
// (`collect_all` -> `Span::collect`, whose first look at `thread_free` is a Relaxed load); another
// thread pushes an object on the span's `thread_free` (SeqCst compare-and-swap) and then loads
// `abandoned` (SeqCst): if set, it collects the span itself under the lock. The design says
// "either it saw the push or this load sees the flag" (a store-buffering / Dekker pattern). The
// object must end collected by one of the two; otherwise it waits on an abandoned heap's span
// for a thread that may never adopt the heap.
//
// loom treats SeqCst accesses as AcqRel (its README), so the remote's SeqCst compare-and-swap
// followed by its SeqCst load is modelled with a `fence(SeqCst)` between them, which is what
// C++'s single total order of SeqCst operations gives those two; the owner side is modelled as
// written. `fenced`: the owner also has a `fence(SeqCst)` after its store of `abandoned`. Without
// it, the owner's Relaxed pre-check in `collect` may read the word from before the push even
// though the remote's load of `abandoned` read `false` (allowed by C++'s model: only SeqCst
// operations and fences take part in the total order; a Relaxed load after a SeqCst store is not
// ordered with another thread's SeqCst store to a different location).

const OBJ: usize = 2;

struct Abandon {
    lock: Mutex<()>,
    abandoned: AtomicBool,
    thread_free: AtomicUsize,
    /// The object's first word (its link).
    link: UnsafeCell<usize>,
    /// The owner's `free` (the lock holder's while the heap is abandoned).
    free: UnsafeCell<usize>,
    fenced: bool,
}

impl Abandon {
    /// `Span::collect`: a Relaxed look first, then the swap.
    fn collect(&self) {
        if self.thread_free.load(Relaxed) == 0 {
            return;
        }
        let head = self.thread_free.fetch_and(0, Acquire);
        // SAFETY: the object was linked before its pusher's compare-and-swap, which the
        // acquire above synchronises with; `free` is the owner's (the lock holder's).
        let next = self.link.with(|l| unsafe { *l });
        assert_eq!(next, 0);
        // SAFETY: as above.
        self.free.with_mut(|f| unsafe { *f = head });
    }

    /// `Slab::abandon` (the exiting owner).
    fn abandon(&self) {
        let _g = self.lock.lock().unwrap();
        self.abandoned.store(true, SeqCst);
        if self.fenced {
            fence(SeqCst);
        }
        self.collect();
    }

    /// `Slab::free_remote`: push, then look at `abandoned`, then `collect_abandoned`.
    fn free_remote(&self) {
        // SAFETY: the object is the freeing thread's until its push succeeds.
        self.link.with_mut(|l| unsafe { *l = 0 });
        self.thread_free.compare_exchange(0, OBJ, SeqCst, Relaxed).unwrap();
        fence(SeqCst);
        if self.abandoned.load(SeqCst) {
            let _g = self.lock.lock().unwrap();
            if self.abandoned.load(SeqCst) {
                self.collect();
            }
        }
    }
}

fn slab_abandon_model(fenced: bool) {
    model(move || {
        let a = Arc::new(Abandon {
            lock: Mutex::new(()),
            abandoned: AtomicBool::new(false),
            thread_free: AtomicUsize::new(0),
            link: UnsafeCell::new(0),
            free: UnsafeCell::new(0),
            fenced,
        });
        let r = a.clone();
        let remote = thread::spawn(move || r.free_remote());
        a.abandon();
        remote.join().unwrap();
        let _g = a.lock.lock().unwrap();
        // SAFETY: both threads are done.
        let free = a.free.with(|f| unsafe { *f });
        assert!(
            free == OBJ && a.thread_free.load(Relaxed) == 0,
            "a remote free into an abandoned heap's span was left uncollected"
        );
    });
}

#[test]
fn a_remote_free_racing_the_owners_abandon_is_collected() {
    slab_abandon_model(true);
}

// The code as it was: no fence after the store of `abandoned`.
broken_on_purpose!(
    broken_slab_abandon_unfenced,
    abandon_without_a_fence_leaves_a_remote_free,
    "left uncollected",
    slab_abandon_model(false)
);
