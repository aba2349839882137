//! Model checks of fallow's lock-free protocols with loom, which runs each model under every
//! interleaving (and every outcome the memory model allows of each atomic access) up to a bound
//! on preemptions: `make test-loom` (`LOOM_MAX_PREEMPTIONS=4`, `--cfg loom`, its own target
//! directory). Without `--cfg loom` this file is empty. What each model proves, and what it
//! assumes, is in docs/design.md ("Model-checked protocols", under "Threads and locks").
//!
//! - The worker word (`worker.rs`): the REAL `Worker` code, built on loom's atomics and a futex
//!   modelled by a mutex and condition variable (`sync.rs`: the value is re-checked under the
//!   mutex, as `FUTEX_WAIT` does; timeouts are not modelled, so a lost wake-up is a deadlock that
//!   loom reports). The free path around it (`Allocator::wake_workers_after_free`, `asleep`,
//!   `Allocator::wake`) and the workers' loops (`report::run`, `zero::run`) are mirrored here.
//! - The per-thread cache's `busy` / `frozen` handshake (`cache/`), a cached block's hit
//!   paths against the reporter's drain and report of it (`cache/`, `report.rs`, `heap/`), the
//!   drain request's generations, and `StartGate` (`start.rs`): standalone models that mirror the
//!   code line by line (the real code needs an allocator, or a kernel thread id per thread, which
//!   loom's threads do not have); each
//!   function says which one it mirrors. Each also runs with its protocol broken on purpose
//!   (an `#[ignore]`d test, run in a child process by `fails_in_child`), and loom must fail it,
//!   so that a model that stopped finding anything fails the suite.
#![cfg(loom)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use fallow::loom_support::{futex_wait, futex_wake_all, Worker, IDLE, RUNNING};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// A model run with its protocol broken on purpose (`$broken`, `#[ignore]`d: run in a child
/// process) and the test `$check` that asserts loom fails it with a message containing
/// `$expected`, so that a model that stopped finding anything fails the suite.
macro_rules! broken_on_purpose {
    ($broken:ident, $check:ident, $expected:literal, $model:expr) => {
        #[test]
        #[ignore = "broken on purpose: run in a child process by the test that checks loom fails it"]
        fn $broken() {
            $model;
        }

        #[test]
        fn $check() {
            fails_in_child(stringify!($broken), $expected);
        }
    };
}

/// Run `f` under loom. The preemption bound comes from `LOOM_MAX_PREEMPTIONS` (the Makefile
/// sets 4); without it, 4 here too, so that a bare `cargo test` stays quick (seconds).
/// Prints how many executions (interleavings and load outcomes) loom explored.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(4);
    }
    // A plain std atomic: counted across loom's executions, outside the model.
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    let name = std::thread::current().name().unwrap_or("model").to_string();
    println!("{name}: {} executions explored", runs.load(std::sync::atomic::Ordering::Relaxed));
}

// ---- The worker word (worker.rs, the real code) ----

/// Long enough never to end in a real run; the futex model ignores timeouts anyway.
const NAP_NS: u64 = 10_000_000;

/// What the allocator lock guards that the worker protocol reads: the free count (the workers'
/// `has_work` re-check compares it) and the work a free makes (blocks to report or zero).
#[derive(Default)]
struct Lists {
    free_calls: u64,
    work: u64,
}

/// A worker as `Worker::start` leaves it: `RUNNING`.
fn started_worker() -> Arc<Worker> {
    let w = Worker::new(b"model");
    w.word.store(RUNNING, SeqCst);
    Arc::new(w)
}

/// Mirrors a free on the locked path followed by `Shared::wake_workers_after_free` (heap/workers.rs),
/// for one worker: under the lock, make work and count the free, read the worker's word
/// (relaxed); after the lock, wake it if it was asleep (`asleep`: `IDLE`; the `ABSENT` restart
/// is not modelled) and the free made work for it (`Allocator::wake` -> `Worker::wake_idle`).
fn free_and_wake(lists: &Mutex<Lists>, w: &Worker) {
    let mut h = lists.lock().unwrap();
    h.free_calls += 1;
    h.work += 1;
    let word = w.word.load(Relaxed);
    if word == RUNNING {
        return;
    }
    let wake = word == IDLE && h.work > 0;
    drop(h);
    if wake {
        w.wake_idle();
    }
}

/// A free that makes work races with the worker going idle: the worker always gets to the work
/// (it sees it in its scan or in `idle`'s `has_work` re-check, or the free sees `IDLE` and
/// wakes it). A lost wake-up leaves the worker asleep for good: loom reports a deadlock.
#[test]
fn a_free_that_makes_work_never_misses_an_idle_worker() {
    model(|| {
        let w = started_worker();
        let lists = Arc::new(Mutex::new(Lists::default()));
        let (w2, lists2) = (w.clone(), lists.clone());
        // Mirrors the loop of `report::run` / `zero::run` (Next::Idle): scan under the lock,
        // then `idle` with the free count seen, until the one block of work is done.
        let worker = thread::spawn(move || loop {
            let seen = {
                let mut h = lists2.lock().unwrap();
                if h.work > 0 {
                    h.work -= 1;
                    return;
                }
                h.free_calls
            };
            w2.idle(Worker::IDLE_MAX_NS, || lists2.lock().unwrap().free_calls != seen);
        });
        free_and_wake(&lists, &w);
        worker.join().unwrap();
    });
}

/// `stop_and_join`'s `request_stop` (flag, then kick) races with a worker that naps and then
/// goes idle without looking at the flag in between (`report::run`: `IdleGate::wait` naps while
/// no CPU is idle, a kick ends it, the batch finds nothing, `idle`): a kick that the nap consumed
/// still stops it, because `idle` reads the flag after announcing `IDLE`. A lost stop is a
/// deadlock.
#[test]
fn a_stop_is_never_lost_by_a_nap_then_idle() {
    model(|| {
        let w = started_worker();
        let w2 = w.clone();
        let worker = thread::spawn(move || {
            while !w2.stopping() {
                // IdleGate::wait, one nap (it stops napping at a kick).
                if !w2.stopping() {
                    w2.nap_unless_kicked(NAP_NS);
                }
                // report_one_batch: nothing to report; caches_step: nothing to drain.
                w2.idle(Worker::IDLE_MAX_NS, || false);
            }
        });
        w.request_stop();
        worker.join().unwrap();
    });
}

/// A kick racing with a nap (tunables changed, `IdleGate::wait`) is reported by that nap or,
/// if it landed after the nap's swap, by the next one, which then does not sleep. The nap's
/// timeout is a third thread: a futex wake that no kick caused, at any moment (the futex model
/// has no clock), so the first nap may also end on its own just before the kick lands.
#[test]
fn a_kick_racing_a_nap_is_seen_by_it_or_the_next() {
    model(|| {
        let w = started_worker();
        let (w2, w3) = (w.clone(), w.clone());
        let worker = thread::spawn(move || w2.nap_unless_kicked(NAP_NS) || w2.nap_unless_kicked(NAP_NS));
        let timeout = thread::spawn(move || futex_wake_all(&w3.word));
        w.kick();
        assert!(worker.join().unwrap(), "a kick was lost");
        timeout.join().unwrap();
    });
}

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
struct Handshake {
    busy: AtomicU32,
    frozen: AtomicU32,
}

impl Handshake {
    fn new() -> Handshake {
        Handshake { busy: AtomicU32::new(0), frozen: AtomicU32::new(0) }
    }

    /// Mirrors `ThreadCache::enter`. `fenced: false` is the protocol broken on purpose.
    fn enter(&self, fenced: bool) -> bool {
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
    fn leave(&self) {
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

// ---- A cached block against the reporter (cache/, report.rs, heap/; mirrored) ----
//
// One block of one page and one thread's cache, seen whole: the owner takes the block from its
// cache and gives it back on the hit paths, while the reporter asks the caches to drain, drains
// the unanswered one itself, and isolates, reports and returns whatever the lists then hold. The
// block's record word (`HitWord`: here its tag), its page state byte and the cache's stack sizes,
// pages and generations are atomics accessed as the real code accesses them (`Relaxed` but for
// the handshake); the cache's entries and the page's memory are loom `UnsafeCell`s, so two
// accesses to either without a happens-before edge between them fail the model. What the lock
// guards of the block (on a list or not, its record's counts, the in-flight slot) is a loom
// `Mutex`. `membarrier` is a SeqCst fence pair, as in the handshake model above. Left out: the
// counters that only the statistics read, the clock (every block is old enough to report), and
// the workers' wake-ups. Each function names the one it mirrors; with one block of order 0,
// `drain_to_half` never has anything to do and `pop`'s preference for a `Zeroed` block never
// applies (nothing here is zeroed).

const TAG_NONE: u32 = 0;
const TAG_FREE: u32 = 1;
const TAG_ALLOC: u32 = 2;
const TAG_ISOLATED: u32 = 3;
const TAG_CACHED: u32 = 4;

const REPORTED: u8 = 0;
const DIRTY: u8 = 1;
const ALLOCATED: u8 = 4;

/// Entry words: the block, and whether it is a mixed entry whose counts say every page is
/// `Reported` (it then sits on the zero stack). 0 is an empty slot (never read as an entry).
const ENTRY_PLAIN: u8 = 1;
const ENTRY_REPORTED: u8 = 2;
/// Entries of the one order (both stacks: dirty from slot 0 up, zero from slot 1 down) and the
/// high mark, in pages.
const CAP: u32 = 2;
const HIGH: u32 = 2;
/// `ISOLATION_WAITS` (heap/locked.rs), cut to one: after that `alloc_locked` grows the heap.
const WAITS: u32 = 1;

/// Which part of the protocols is broken on purpose.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Break {
    None,
    /// `drain_unanswered` drains a frozen cache without looking at `busy`.
    DrainIgnoresBusy,
    /// `report_one_batch` returns the batch to the lists (pages `Reported`) before its `madvise`.
    ReturnBeforeReport,
}

/// What the allocator lock guards of the block: whether it is on a free list, what its record's
/// counts say (every page `Reported`, else every page `Dirty`), and whether the reporter holds it
/// isolated (its in-flight slot).
#[derive(Default)]
struct Guarded {
    listed: bool,
    reported: bool,
    isolated: bool,
}

/// The block, the owner's cache, and what the lock guards.
struct World {
    lists: Mutex<Guarded>,
    /// The block record's `HitWord` (its tag).
    tag: AtomicU32,
    /// The page's state byte.
    state: AtomicU8,
    /// The page: what the program and `madvise` write.
    mem: UnsafeCell<u8>,
    /// Not in the real code: how many of the owner (from hand-out to free) and the reporter
    /// (from `isolate` to `unisolate`) hold the block. A relaxed read-modify-write orders
    /// nothing, so it adds no happens-before edge that the protocol lacks.
    holders: AtomicU32,
    // `ThreadCache`.
    hs: Handshake,
    entries: UnsafeCell<[u8; CAP as usize]>,
    ndirty: AtomicU32,
    nzero: AtomicU32,
    pages: AtomicU32,
    seen_generation: AtomicU64,
    /// `HitPath::drain_generation`.
    generation: AtomicU64,
    broken: Break,
}

impl World {
    /// The block as a program holds it after writing to it (`live: true`, the cache empty), or
    /// in the owner's cache, dirty, after the program freed it.
    fn new(live: bool, broken: Break) -> World {
        World {
            lists: Mutex::new(Guarded::default()),
            tag: AtomicU32::new(if live { TAG_ALLOC } else { TAG_CACHED }),
            state: AtomicU8::new(if live { ALLOCATED } else { DIRTY }),
            mem: UnsafeCell::new(1),
            holders: AtomicU32::new(live as u32),
            hs: Handshake::new(),
            entries: UnsafeCell::new([if live { 0 } else { ENTRY_PLAIN }, 0]),
            ndirty: AtomicU32::new(!live as u32),
            nzero: AtomicU32::new(0),
            pages: AtomicU32::new(!live as u32),
            seen_generation: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            broken,
        }
    }

    /// Instrumentation: `who` now holds the block, and nobody else may.
    fn take_hold(&self, who: &str) {
        assert_eq!(self.holders.fetch_add(1, Relaxed), 0, "{who} got the block while someone else held it");
    }

    fn let_go(&self) {
        self.holders.fetch_sub(1, Relaxed);
    }

    // -- The owner. --

    /// The entry at `i` (`ThreadCache::read`, a plain read).
    fn read(&self, i: u32) -> u8 {
        // SAFETY: `e` is the cell's own pointer, valid for the closure; the owner reads between
        // `enter` and `leave`, the reporter while the owner is kept out (loom fails a racing access).
        let e = self.entries.with(|e| unsafe { (*e)[i as usize] });
        assert_ne!(e, 0, "an empty slot read as an entry");
        e
    }

    /// `ThreadCache::write`, a plain write.
    fn write(&self, i: u32, e: u8) {
        // SAFETY: as in `read`.
        self.entries.with_mut(|a| unsafe { (*a)[i as usize] = e });
    }

    fn sub_page(&self) {
        self.pages.store(self.pages.load(Relaxed) - 1, Relaxed);
    }

    /// Mirrors `ThreadCache::alloc_hit` (order 0): the top of the dirty stack, if it is a plain
    /// entry whose block is still `Cached`.
    fn alloc_hit(&self) -> bool {
        let nd = self.ndirty.load(Relaxed);
        if nd == 0 {
            return false;
        }
        if self.read(nd - 1) != ENTRY_PLAIN {
            return false;
        }
        if self.tag.load(Relaxed) != TAG_CACHED {
            return false;
        }
        self.ndirty.store(nd - 1, Relaxed);
        self.tag.store(TAG_ALLOC, Relaxed);
        self.take_hold("a hit alloc");
        self.sub_page();
        true
    }

    /// Mirrors `ThreadCache::pop` (without the preference for a `Zeroed` block, see the top):
    /// `pop_dirty`, else `pop_zero`.
    fn pop(&self) -> Option<u8> {
        let nd = self.ndirty.load(Relaxed);
        if nd > 0 {
            self.ndirty.store(nd - 1, Relaxed);
            return Some(self.read(nd - 1));
        }
        let nz = self.nzero.load(Relaxed);
        if nz > 0 {
            self.nzero.store(nz - 1, Relaxed);
            return Some(self.read(CAP - nz));
        }
        None
    }

    /// Mirrors `ThreadCache::push`: a mixed entry that needs no zeroing on the zero stack, any
    /// other on the dirty stack.
    fn push(&self, e: u8) {
        let (nd, nz) = (self.ndirty.load(Relaxed), self.nzero.load(Relaxed));
        assert!(nd + nz < CAP);
        if e == ENTRY_REPORTED {
            self.write(CAP - 1 - nz, e);
            self.nzero.store(nz + 1, Relaxed);
        } else {
            self.write(nd, e);
            self.ndirty.store(nd + 1, Relaxed);
        }
    }

    /// Mirrors `Allocator::prepare`: a `ZERO` request memsets the pages whose state does not read
    /// zero, unless the counts say none needs it; then the pages are `Allocated`.
    fn prepare(&self, zero: bool, reported: bool) {
        if zero && !reported && self.state.load(Relaxed) != REPORTED {
            // SAFETY: `m` is the cell's own pointer, valid for the closure; the owner holds the block
            // (loom fails an access of the reporter's not ordered with this one).
            self.mem.with_mut(|m| unsafe { *m = 0 });
        }
        self.state.store(ALLOCATED, Relaxed);
    }

    /// Mirrors `ThreadCache::alloc` (order 0, inside `enter` / `leave`): pop, else refill and pop
    /// (`alloc_slow`); skip an entry whose block is no longer `Cached`; hand out; prepare.
    fn cache_alloc(&self, zero: bool) -> bool {
        loop {
            let e = match self.pop() {
                Some(e) => e,
                None => {
                    self.refill();
                    match self.pop() {
                        Some(e) => e,
                        None => return false,
                    }
                }
            };
            if self.tag.load(Relaxed) != TAG_CACHED {
                self.sub_page();
                continue;
            }
            self.tag.store(TAG_ALLOC, Relaxed); // hand_out
            self.take_hold("a cache alloc");
            self.sub_page();
            self.prepare(zero, e == ENTRY_REPORTED);
            return true;
        }
    }

    /// Mirrors `ThreadCache::refill` (order 0, the one block): obey a drain request, then take
    /// the block off the lists if it is there (`Arena::take`) into the cache.
    fn refill(&self) {
        let mut h = self.lists.lock().unwrap();
        self.obey_drain_request(&mut h);
        if h.listed {
            h.listed = false;
            self.tag.store(TAG_CACHED, Relaxed);
            self.push(if h.reported { ENTRY_REPORTED } else { ENTRY_PLAIN });
            self.pages.store(self.pages.load(Relaxed) + 1, Relaxed);
        }
    }

    /// Mirrors `Allocator::alloc_locked`: take the block off the lists; while the reporter holds
    /// it isolated, wait (`WAITS` times); then grow the heap (a new arena's block: `false`).
    fn alloc_locked(&self, zero: bool) -> bool {
        let mut waits = 0;
        loop {
            let mut h = self.lists.lock().unwrap();
            if h.listed {
                h.listed = false;
                self.tag.store(TAG_ALLOC, Relaxed);
                self.take_hold("a locked alloc");
                let reported = h.reported;
                drop(h);
                self.prepare(zero, reported);
                return true;
            }
            let isolated = h.isolated;
            drop(h);
            if isolated && waits < WAITS {
                waits += 1;
                thread::yield_now(); // os::sleep_ns(100_000)
                continue;
            }
            return false;
        }
    }

    /// Mirrors `Allocator::alloc` of one page (`zero`: with `Flags::ZERO`): the hit path for a
    /// plain request (`alloc_hit`, then the page `Allocated` after `leave`), else `alloc_slow`:
    /// `alloc_cached` (`ThreadCache::alloc` inside `enter` / `leave`), else `alloc_locked`.
    /// `true`: the program got the block (else a new arena's page).
    fn alloc(&self, zero: bool) -> bool {
        if !zero && self.hs.enter(true) {
            let hit = self.alloc_hit();
            self.hs.leave();
            if hit {
                self.state.store(ALLOCATED, Relaxed); // fill_block
                return true;
            }
        }
        if self.hs.enter(true) {
            let got = self.cache_alloc(zero);
            self.hs.leave();
            if got {
                return true;
            }
        }
        self.alloc_locked(zero)
    }

    /// Mirrors `ThreadCache::needs_room`.
    fn needs_room(&self) -> bool {
        self.pages.load(Relaxed) + 1 > HIGH
            || self.ndirty.load(Relaxed) == CAP - self.nzero.load(Relaxed)
            || self.generation.load(Relaxed) != self.seen_generation.load(Relaxed)
    }

    /// Mirrors `ThreadCache::take_freed` (`free_hit`: `may_drain` false; `free`: true) for the
    /// live block.
    fn take_freed(&self, may_drain: bool) -> bool {
        if self.tag.load(Relaxed) != TAG_ALLOC {
            return false; // live_unlocked
        }
        if self.needs_room() {
            if !may_drain {
                return false;
            }
            self.make_room();
        }
        self.tag.store(TAG_CACHED, Relaxed);
        let nd = self.ndirty.load(Relaxed);
        self.write(nd, ENTRY_PLAIN);
        self.ndirty.store(nd + 1, Relaxed);
        self.pages.store(self.pages.load(Relaxed) + 1, Relaxed);
        self.state.store(DIRTY, Relaxed); // fill_block, before `leave`
        true
    }

    /// Mirrors `ThreadCache::make_room`: obey a drain request (else `drain_to_half`, which finds
    /// nothing over half here).
    fn make_room(&self) {
        let mut h = self.lists.lock().unwrap();
        self.obey_drain_request(&mut h);
    }

    /// Mirrors `ThreadCache::obey_drain_request`.
    fn obey_drain_request(&self, h: &mut Guarded) -> bool {
        let g = self.generation.load(Relaxed);
        if g == self.seen_generation.load(Relaxed) {
            return false;
        }
        self.seen_generation.store(g, Relaxed);
        self.drain_all_locked(h);
        true
    }

    /// Mirrors `Allocator::free_checked`: the hit path (`free_hit` between `enter` and `leave`),
    /// else `free_slow`: `ThreadCache::free` inside `enter` / `leave`, else `free_locked`.
    fn free(&self) {
        self.let_go();
        if self.hs.enter(true) {
            let hit = self.take_freed(false);
            self.hs.leave();
            if hit {
                return;
            }
        }
        if self.hs.enter(true) {
            let hit = self.take_freed(true);
            self.hs.leave();
            if hit {
                return;
            }
        }
        // free_locked: `live_block` checks the record, the pages become `Dirty`, the block listed.
        let mut h = self.lists.lock().unwrap();
        assert_eq!(self.tag.load(Relaxed), TAG_ALLOC, "the locked free found no live block");
        self.state.store(DIRTY, Relaxed);
        self.list(&mut h, false);
    }

    /// The program writes to the block it holds.
    fn write_mem(&self, v: u8) {
        // SAFETY: `m` is the cell's own pointer, valid for the closure; the program holds the block
        // (loom fails an access of the reporter's not ordered with this one).
        self.mem.with_mut(|m| unsafe { *m = v });
    }

    fn read_mem(&self) -> u8 {
        // SAFETY: as in `write_mem`.
        self.mem.with(|m| unsafe { *m })
    }

    // -- Under the lock. --

    /// `Arena::free_block` of the block: tag `Free`, on a list, its counts.
    fn list(&self, h: &mut Guarded, reported: bool) {
        assert!(!h.listed, "the block was listed twice");
        self.tag.store(TAG_FREE, Relaxed);
        h.listed = true;
        h.reported = reported;
    }

    /// Mirrors `ThreadCache::drain_all_locked` -> `drain_locked` -> `give_back`: every entry
    /// back to the lists unless its block is no longer `Cached`.
    fn drain_all_locked(&self, h: &mut Guarded) {
        let (nd, nz) = (self.ndirty.load(Relaxed), self.nzero.load(Relaxed));
        if nd + nz == 0 {
            return;
        }
        let entries = (0..nd).map(|i| self.read(i)).chain((0..nz).map(|i| self.read(CAP - 1 - i)));
        for e in entries.collect::<Vec<_>>() {
            self.sub_page();
            if self.tag.load(Relaxed) != TAG_CACHED {
                continue;
            }
            self.tag.store(TAG_NONE, Relaxed);
            self.list(h, e == ENTRY_REPORTED);
        }
        self.ndirty.store(0, Relaxed);
        self.nzero.store(0, Relaxed);
    }

    // -- The reporter. --

    /// Mirrors `report::caches_step` from the request (`drain_generation.fetch_add`) through its
    /// nap to `cache::drain_unanswered` of that generation. Returns whether it drained the
    /// cache, and whether it found the owner inside.
    fn caches_step(&self) -> (bool, bool) {
        let g = self.generation.fetch_add(1, Relaxed) + 1;
        self.drain_unanswered(g)
    }

    /// Mirrors `cache::drain_unanswered`: freeze under the lock, `membarrier`, then under the
    /// lock again drain if the owner is not `busy`, and thaw.
    fn drain_unanswered(&self, g: u64) -> (bool, bool) {
        {
            let _h = self.lists.lock().unwrap();
            if self.pages.load(Relaxed) == 0 || self.seen_generation.load(Relaxed) == g {
                return (false, false);
            }
            self.hs.frozen.store(1, Relaxed);
        }
        fence(SeqCst); // crate::os::membarrier()
        let mut h = self.lists.lock().unwrap();
        let (mut drained, mut busy) = (false, false);
        if self.hs.frozen.load(Relaxed) != 0 {
            busy = self.hs.busy.load(Acquire) != 0;
            if !busy || self.broken == Break::DrainIgnoresBusy {
                self.drain_all_locked(&mut h);
                self.seen_generation.store(g, Relaxed);
                drained = true;
            }
            self.hs.frozen.store(0, Release);
        }
        (drained, busy)
    }

    /// Mirrors `report::report_one_batch` for the block: isolate it if it is listed and not yet
    /// reported (the scan looks at the `Dirty` and `Zeroed` lists), report it without the lock
    /// (`MADV_DONTNEED`, which zeroes the page), return it under the lock (`Heap::unisolate`:
    /// pages `Reported`, listed).
    fn report_one_batch(&self) {
        {
            let mut h = self.lists.lock().unwrap();
            if !h.listed || h.reported {
                return;
            }
            h.listed = false; // Heap::isolate: unlink, tag `Isolated`, the in-flight slot
            self.tag.store(TAG_ISOLATED, Relaxed);
            h.isolated = true;
            self.take_hold("the reporter's isolation");
        }
        if self.broken == Break::ReturnBeforeReport {
            self.unisolate();
        }
        // SAFETY: `m` is the cell's own pointer, valid for the closure; the reporter holds the block
        // isolated (loom fails an access of the owner's not ordered with this one).
        self.mem.with_mut(|m| unsafe { *m = 0 }); // madvise(MADV_DONTNEED)
        if self.broken != Break::ReturnBeforeReport {
            self.unisolate();
        }
    }

    /// `Heap::unisolate` of the reported block, under the lock.
    fn unisolate(&self) {
        let mut h = self.lists.lock().unwrap();
        self.state.store(REPORTED, Relaxed);
        h.isolated = false;
        self.let_go();
        self.tag.store(TAG_NONE, Relaxed);
        self.list(&mut h, true);
    }

    /// Where the block is once every thread is done: `(listed, in the cache)`.
    fn settle(&self) -> (bool, bool) {
        let h = self.lists.lock().unwrap();
        assert!(!h.isolated);
        let cached = self.ndirty.load(Relaxed) + self.nzero.load(Relaxed);
        assert!(cached <= 1);
        assert_eq!(self.pages.load(Relaxed), cached, "the cache's page count is off");
        if cached == 1 {
            assert_eq!(self.tag.load(Relaxed), TAG_CACHED);
        }
        if h.listed {
            assert_eq!(self.tag.load(Relaxed), TAG_FREE);
        }
        (h.listed, cached == 1)
    }
}

/// The owner takes the cached block on the hit path, writes to it and (`free`) frees it (the hit
/// path, or the locked one if frozen), while the reporter drains the cache as unanswered and
/// reports what the lists then hold: the block is never the owner's while the reporter has it
/// isolated, never listed twice, and ends in exactly one place.
fn hit_alloc_free_model(broken: Break, free: bool) {
    model(move || {
        let w = Arc::new(World::new(false, broken));
        let w2 = w.clone();
        let owner = thread::spawn(move || {
            let got = w2.alloc(false);
            if got {
                w2.write_mem(2);
                if free {
                    w2.free();
                }
            }
            got && !free
        });
        w.caches_step();
        w.report_one_batch();
        let holds = owner.join().unwrap();
        let (listed, cached) = w.settle();
        let places = [listed, cached, holds].iter().filter(|&&x| x).count();
        assert_eq!(places, 1, "the block is listed {listed}, cached {cached}, held {holds}");
        assert_eq!(w.holders.load(Relaxed), holds as u32);
    });
}

/// The owner frees the block it wrote to (the hit path; the cache then holds it), then asks for
/// a zeroed page (`Flags::ZERO`: from its cache, by a refill from the lists, or on the locked
/// path), while the reporter drains the cache as unanswered and reports what the lists hold: a
/// page handed out as zeroed reads zero (a reported block skips the memset only because its
/// pages read zero), and the block is never the owner's while the reporter has it isolated.
fn free_then_zero_alloc_model(broken: Break) {
    model(move || {
        let w = Arc::new(World::new(true, broken));
        let w2 = w.clone();
        let owner = thread::spawn(move || {
            w2.free();
            if w2.alloc(true) {
                assert_eq!(w2.read_mem(), 0, "a page handed out as zeroed does not read zero");
                w2.write_mem(3);
            }
        });
        w.caches_step();
        w.report_one_batch();
        owner.join().unwrap();
        w.settle();
    });
}

#[test]
fn a_cached_block_is_never_the_owners_while_the_reporter_isolates_it() {
    hit_alloc_free_model(Break::None, true);
}

#[test]
fn a_block_handed_out_as_zeroed_reads_zero_though_the_reporter_drained_and_reported_it() {
    free_then_zero_alloc_model(Break::None);
}

// `drain_unanswered` draining a frozen cache without looking at `busy`: the owner's hit alloc
// takes the block while the reporter drains and isolates it. (The owner does not free it here:
// its push would race with the drain's read of the entries, which loom reports first, as in the
// handshake model above.)
broken_on_purpose!(
    broken_drain_ignoring_busy,
    a_drain_that_ignores_busy_hands_the_block_out_twice,
    "while someone else held it",
    hit_alloc_free_model(Break::DrainIgnoresBusy, false)
);

// The reporter returning the block (pages `Reported`) before its `madvise`: the owner's `ZERO`
// request takes it and skips the memset, and its read of the page is not ordered after the
// `madvise` (it may see the program's old data): loom reports the read racing the write.
broken_on_purpose!(
    broken_return_before_report,
    a_block_returned_before_its_report_is_handed_out_unzeroed,
    "Causality violation",
    free_then_zero_alloc_model(Break::ReturnBeforeReport)
);

// ---- The drain request's generations (cache/, report.rs, heap/; mirrored) ----
//
// `Allocator::request_cache_drain` and the reporter's `caches_step` bump `drain_generation`
// (relaxed); a cache obeys at its next free that sees the new value (`needs_room`, then
// `make_room` -> `obey_drain_request` under the lock, which reads it again) or at its next refill,
// and records the generation obeyed in `seen_generation`; the reporter drains a cache that has not
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

    /// Mirrors `ThreadCache::take_freed`: `needs_room` (the high mark and the stack are never
    /// reached here: only the generation), `make_room` if allowed, then the push.
    fn take_freed(&self, block: u8, may_drain: bool) -> bool {
        if self.generation.load(Relaxed) != self.seen_generation.load(Relaxed) {
            if !may_drain {
                return false;
            }
            // make_room: `obey_drain_request` (else `drain_to_half`: nothing over half here).
            let mut h = self.lists.lock().unwrap();
            let g = self.generation.load(Relaxed);
            if g != self.seen_generation.load(Relaxed) {
                self.seen_generation.store(g, Relaxed);
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

    /// Mirrors `report::caches_step`'s request (`fetch_add`) and, after its nap,
    /// `cache::drain_unanswered` of that generation.
    fn caches_step(&self) {
        let g = self.generation.fetch_add(1, Relaxed) + 1;
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

// ---- StartGate (start.rs, mirrored) ----
//
// `os::gettid` is the caller's id here (loom's threads share one kernel thread); the spin
// before the first sleep, the liveness check of the creator (`thread_alive`, for `fork`) and the
// deadline (`Entry::Stalled`) are left out: they only add ways out of the wait. The futex is
// `sync.rs`'s model, so a waiter that is never woken is a deadlock.

const UNINIT: u32 = 0;
const CREATING: u32 = 1;
const READY: u32 = 2;
const FAILED: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Ready,
    Failed,
    Create,
    Reentrant,
}

/// Mirrors `StartGate::enter` (`me`: the caller's `gettid`).
fn gate_enter(word: &AtomicU32, me: u32) -> Entry {
    loop {
        let w = word.load(Acquire);
        match w {
            READY => return Entry::Ready,
            FAILED => return Entry::Failed,
            UNINIT => {
                let mine = me << 2 | CREATING;
                if word.compare_exchange(UNINIT, mine, Acquire, Acquire).is_ok() {
                    return Entry::Create;
                }
            }
            _ => {
                let creator = w >> 2;
                if creator == me {
                    return Entry::Reentrant;
                }
                futex_wait(word, w, Some(2_000_000));
            }
        }
    }
}

/// Mirrors `StartGate::finish`; `wake: false` is the protocol broken on purpose.
fn gate_finish(word: &AtomicU32, ok: bool, wake: bool) {
    word.store(if ok { READY } else { FAILED }, Release);
    if wake {
        futex_wake_all(word);
    }
}

/// Three threads ask at once: exactly one creates (its re-entrant request goes to the fallback),
/// the others wait and return `Ready` after it finished, seeing what it wrote before `finish`
/// (a loom `UnsafeCell`: a read not ordered after the write fails the model).
fn gate_model(wake: bool) {
    model(move || {
        let word = Arc::new(AtomicU32::new(UNINIT));
        let allocator = Arc::new(UnsafeCell::new(0u32));
        let creations = Arc::new(AtomicU32::new(0));
        let run = move |word: &AtomicU32, allocator: &UnsafeCell<u32>, creations: &AtomicU32, me: u32| match gate_enter(word, me) {
            Entry::Create => {
                assert_eq!(gate_enter(word, me), Entry::Reentrant);
                // SAFETY: `a` is the cell's own pointer, valid for the closure; only the creator (the one
                // thread `gate_enter` answered `Create`) writes it, before `gate_finish` publishes it
                // (loom fails a racing access).
                allocator.with_mut(|a| unsafe { *a = 42 });
                creations.fetch_add(1, Relaxed);
                gate_finish(word, true, wake);
            }
            e => {
                assert_eq!(e, Entry::Ready);
                // SAFETY: `a` is the cell's own pointer, valid for the closure; `Ready` is answered only
                // after the creator's `gate_finish`, by an acquire load of the word, so the write is
                // ordered before this read (loom fails it otherwise).
                assert_eq!(allocator.with(|a| unsafe { *a }), 42);
            }
        };
        let threads: Vec<_> = (1..=2)
            .map(|me| {
                let (word, allocator, creations) = (word.clone(), allocator.clone(), creations.clone());
                thread::spawn(move || run(&word, &allocator, &creations, me))
            })
            .collect();
        run(&word, &allocator, &creations, 3);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(creations.load(Relaxed), 1);
    });
}

#[test]
fn start_gate_has_one_creator_and_waiters_see_its_allocator() {
    gate_model(true);
}

// `finish` without its futex wake: a waiter that went to sleep is never woken (a deadlock).
broken_on_purpose!(
    broken_start_gate_without_the_wake,
    without_the_wake_loom_finds_a_waiter_asleep_for_good,
    "deadlock",
    gate_model(false)
);

// ---- Broken protocols must fail ----

/// Run the `#[ignore]`d test `name` (a model of a protocol broken on purpose) in a child process
/// of this test binary, and check that loom failed it with `expected` in its report. A child
/// process, because a model that loom fails while threads are blocked (a deadlock) aborts the
/// process: unwinding drops loom objects outside the execution, a panic during a panic.
fn fails_in_child(name: &str, expected: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--test-threads=1", "--nocapture"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "loom passed the broken model {name}:\n{report}");
    assert!(report.contains(expected), "loom failed {name}, but not with {expected:?}:\n{report}");
}
