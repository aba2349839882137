//! The worker word (`worker/mod.rs`, the real code): a free that makes work, a kick racing a nap, a stop.

use super::*;

// ---- The worker word (worker/mod.rs, the real code) ----

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
    stop_races(|w| {
        // IdleGate::wait, one nap (it stops napping at a kick).
        if !w.stopping() {
            w.nap_unless_kicked(NAP_NS);
        }
        // report_one_batch: nothing to report; caches_step: nothing to drain.
        w.idle(Worker::IDLE_MAX_NS, || false);
    });
}

/// `request_stop` from this thread racing a worker that runs `step` until it sees the flag.
fn stop_races(step: fn(&Worker)) {
    model(move || {
        let w = started_worker();
        let w2 = w.clone();
        let worker = thread::spawn(move || {
            while !w2.stopping() {
                step(&w2);
            }
        });
        w.request_stop();
        worker.join().unwrap();
    });
}

/// `request_stop` racing a worker that naps twice without looking at the flag in between
/// (`zero::run`: `IdleGate::wait` naps while no CPU is idle and a kick ends it; the step then
/// finds only blocks freed too recently and naps until the oldest is old enough, which may be
/// minutes): the second nap must not sleep through a stop whose kick the first consumed, because
/// a nap reads the flag after announcing `NAPPING`. A lost stop is a deadlock (`stop_and_join`
/// would wait for the whole nap).
#[test]
fn a_stop_is_never_lost_by_a_nap_then_a_nap() {
    stop_races(|w| {
        w.nap_unless_kicked(NAP_NS);
        w.nap(NAP_NS);
    });
}

/// `request_stop` racing a reporter that waits for blocks to age while a memory limit or a
/// pressure signal is watched (`limit::Watch::nap`): a series of naps of at most 100 ms, each
/// ending at a kick or when the stop flag is set, then back in the loop, where the batch finds
/// nothing and the reporter goes idle. The stop is never lost, whichever nap or gap between
/// naps the kick lands in.
#[test]
fn a_stop_is_never_lost_by_a_series_of_watched_naps() {
    stop_races(|w| {
        for _ in 0..2 {
            if w.nap_unless_kicked(NAP_NS) || w.stopping() {
                break;
            }
        }
        w.idle(Worker::IDLE_MAX_NS, || false);
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
