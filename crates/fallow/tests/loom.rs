//! Model checks of fallow's lock-free protocols with loom, which runs each model under every
//! interleaving (and every outcome the memory model allows of each atomic access) up to a bound
//! on preemptions: `make test-loom` (`LOOM_MAX_PREEMPTIONS=4`, `--cfg loom`, its own target
//! directory). Without `--cfg loom` this file is empty. What each model proves, and what it
//! assumes, is in docs/design.md ("Model-checked protocols", under "Access rules").
//!
//! - The worker word (`worker.rs`): the REAL `Worker` code, built on loom's atomics and a futex
//!   modelled by a mutex and condition variable (`sync.rs`: the value is re-checked under the
//!   mutex, as `FUTEX_WAIT` does; timeouts are not modelled, so a lost wake-up is a deadlock that
//!   loom reports). The free path around it (`Allocator::wake_workers_after_free`, `asleep`,
//!   `Allocator::wake`) and the workers' loops (`report::run`, `zero::run`) are mirrored here.
//! - The per-thread cache's `busy` / `frozen` handshake (`cache.rs`) and `StartGate`
//!   (`start.rs`): standalone models that mirror the code line by line (the real code needs an
//!   allocator, or a kernel thread id per thread, which loom's threads do not have); each
//!   function says which one it mirrors. Each also runs with its protocol broken on purpose
//!   (an `#[ignore]`d test, run in a child process by `fails_in_child`), and loom must fail it,
//!   so that a model that stopped finding anything fails the suite.
#![cfg(loom)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use fallow::loom_support::{futex_wait, futex_wake_all, Worker, IDLE, RUNNING};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32};
use loom::sync::{Arc, Mutex};
use loom::thread;

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

/// Mirrors a free on the locked path followed by `Allocator::wake_workers_after_free` (heap.rs),
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

// ---- The per-thread cache's busy / frozen handshake (cache.rs, mirrored) ----
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

struct Cache {
    busy: AtomicU32,
    frozen: AtomicU32,
    /// The entries and stack sizes (plain memory in `ThreadCache`).
    entries: UnsafeCell<u64>,
}

impl Cache {
    fn new() -> Cache {
        Cache { busy: AtomicU32::new(0), frozen: AtomicU32::new(0), entries: UnsafeCell::new(0) }
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

    /// One call of the owner: a hit between `enter` and `leave` (writes the entries), or the
    /// locked path (the lists, under the lock; never the entries).
    fn owner_call(&self, lock: &Mutex<()>, fenced: bool) {
        if self.enter(fenced) {
            // SAFETY: `e` is the cell's own pointer, valid for the closure; between `enter` (which saw
            // `frozen` clear after its fence) and `leave` no drainer or checker touches the entries
            // (the handshake this model proves; loom fails a racing access).
            self.entries.with_mut(|e| unsafe { *e += 1 });
            self.leave();
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
        c.frozen.store(1, Relaxed);
    }
    fence(SeqCst); // crate::os::membarrier()
    let _h = lock.lock().unwrap();
    let mut drained = false;
    if c.frozen.load(Relaxed) != 0 {
        if c.busy.load(Acquire) == 0 {
            // SAFETY: `e` is the cell's own pointer, valid for the closure; with `frozen` set, fenced,
            // and `busy` seen clear, the owner stays out of the entries until the thaw (the handshake
            // this model proves; loom fails a racing access).
            c.entries.with_mut(|e| unsafe { *e = 0 });
            drained = true;
        }
        c.frozen.store(0, Release);
    }
    drained
}

/// Mirrors `cache::lock_owners_out` and `FrozenHeap`'s drop (`check_invariants`, `free_runs`):
/// under one hold of the lock, freeze, `membarrier`, and read the entries if the owner is not
/// `busy`; thaw when the lock is let go; retry (here once more) if the owner was inside.
fn check_entries(c: &Cache, lock: &Mutex<()>) -> bool {
    for _ in 0..2 {
        let h = lock.lock().unwrap();
        c.frozen.store(1, Relaxed);
        fence(SeqCst); // crate::os::membarrier()
        let read = c.busy.load(Acquire) == 0;
        if read {
            // SAFETY: `e` is the cell's own pointer, valid for the closure; with `frozen` set, fenced,
            // and `busy` seen clear, the owner does not write the entries until the thaw (the
            // handshake this model proves; loom fails a racing access).
            c.entries.with(|e| unsafe { *e });
        }
        c.frozen.store(0, Release); // FrozenHeap::drop, still under the lock
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

/// The owner's fence removed (what the handshake would be without `membarrier`): both sides can
/// miss the other's store, and loom finds the owner and the reporter in the entries at once.
#[test]
#[ignore = "the handshake broken on purpose: run by without_the_owners_fence_loom_finds_the_owner_inside"]
fn broken_cache_handshake_without_the_owners_fence() {
    cache_model(false, drain_unanswered);
}

#[test]
fn without_the_owners_fence_loom_finds_the_owner_inside() {
    fails_in_child("broken_cache_handshake_without_the_owners_fence", "Causality violation");
}

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

/// `finish` without its futex wake: a waiter that went to sleep is never woken (a deadlock).
#[test]
#[ignore = "the gate broken on purpose: run by without_the_wake_loom_finds_a_waiter_asleep_for_good"]
fn broken_start_gate_without_the_wake() {
    gate_model(false);
}

#[test]
fn without_the_wake_loom_finds_a_waiter_asleep_for_good() {
    fails_in_child("broken_start_gate_without_the_wake", "deadlock");
}

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
