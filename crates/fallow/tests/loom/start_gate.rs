//! `StartGate` (`start.rs`, mirrored).

use super::*;

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
