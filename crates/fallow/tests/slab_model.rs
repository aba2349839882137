//! Model test of the slab layer: several threads allocate objects of random sizes up to the
//! small-object limit (some with `Flags::ZERO`), fill them with a pattern of their own, free
//! random ones, and hand random others to other threads, which check and free them (remote
//! frees); some threads exit with objects live, freed later by the others. After each round the
//! live objects are checked for overlap and contents, and the allocator's invariants for every
//! span and object; at the end every object and span is accounted for (statistics at zero).

use std::sync::{mpsc, Arc, Barrier};

use fallow::{Allocator, Config, Flags, Tunables};

mod common;
use common::Rng;


static ROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[derive(Clone, Copy)]
struct Obj {
    addr: usize,
    size: usize,
    tag: u8,
}

fn fill(o: &Obj) {
    // SAFETY: a live object of at least `size` bytes, owned by the caller.
    unsafe { (o.addr as *mut u8).write_bytes(o.tag, o.size) };
}

fn check(o: &Obj) {
    // SAFETY: as in `fill`.
    let s = unsafe { std::slice::from_raw_parts(o.addr as *const u8, o.size) };
    if let Some(i) = s.iter().position(|&b| b != o.tag) {
        panic!("object {:#x} of {} bytes lost its contents at byte {i}: {:x?} (tag {:x}) round {}", o.addr, o.size, &s[i..(i + 16).min(s.len())], o.tag, ROUND.load(std::sync::atomic::Ordering::Relaxed));
    }
}

fn random_size(r: &mut Rng) -> usize {
    // Mostly small, some up to the limit.
    match r.below(10) {
        0..=5 => 1 + r.below(256),
        6..=8 => 1 + r.below(4096),
        _ => 1 + r.below(Allocator::SMALL_MAX),
    }
}

#[test]
fn threads_allocate_free_and_free_each_others_objects() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 6;
    const STEPS: usize = 3000;
    let a = Allocator::new(Config {
        arena_size: 512 << 20,
        max_order: 12,
        tunables: Tunables::off(),
        small_objects: true,
        ..Config::default()
    })
    .unwrap();
    // Round 0 with every thread and the main one; after it, one thread has exited.
    let first = Arc::new(Barrier::new(THREADS + 1));
    let rest = Arc::new(Barrier::new(THREADS));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Vec<Obj>>()).unzip();
    let (report_tx, report_rx) = mpsc::channel::<(usize, Vec<Obj>)>();
    let mut handles = Vec::new();
    for (t, rx) in receivers.into_iter().enumerate() {
        let a = a.clone();
        let senders = senders.clone();
        let (first, rest) = (first.clone(), rest.clone());
        let report = report_tx.clone();
        handles.push(std::thread::spawn(move || {
            let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678));
            let mut live: Vec<Obj> = Vec::new();
            let mut tag = t as u8 * 64;
            for round in 0..ROUNDS {
                for _ in 0..STEPS {
                    match r.below(8) {
                        0..=3 => {
                            let size = random_size(&mut r);
                            let zero = r.below(4) == 0;
                            let p = a.malloc(size, 16, if zero { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr();
                            if zero {
                                // SAFETY: a live object of `size` bytes.
                                assert!(unsafe { std::slice::from_raw_parts(p, size) }.iter().all(|&b| b == 0));
                            }
                            tag = tag.wrapping_add(1);
                            let o = Obj { addr: p as usize, size, tag };
                            fill(&o);
                            live.push(o);
                        }
                        4..=5 if !live.is_empty() => {
                            let o = live.swap_remove(r.below(live.len()));
                            check(&o);
                            a.free_any(o.addr as *mut u8).unwrap();
                        }
                        6 if live.len() > 8 => {
                            // Hand a few objects to another thread, which frees them.
                            // After round 0 the last thread has exited: nobody sends to it.
                            let peers = if round == 0 { THREADS } else { THREADS - 1 };
                            if t >= peers {
                                continue;
                            }
                            let to = (t + 1 + r.below(peers - 1)) % peers;
                            let n = 1 + r.below(8);
                            let batch: Vec<Obj> = (0..n).map(|_| live.swap_remove(r.below(live.len()))).collect();
                            senders[to].send(batch).unwrap();
                        }
                        _ => {
                            while let Ok(batch) = rx.try_recv() {
                                for o in batch {
                                    check(&o);
                                    a.free_any(o.addr as *mut u8).unwrap();
                                }
                            }
                        }
                    }
                }
                // Round end: show the live objects to the main thread, wait for its checks.
                report.send((t, live.clone())).unwrap();
                let barrier = if round == 0 { &first } else { &rest };
                barrier.wait();
                barrier.wait();
                // The last thread exits after the first round with its objects live: the others
                // free them (the main thread hands them out).
                if t == THREADS - 1 && round == 0 {
                    // What others sent it in round 0 (all sent before the barrier) goes too.
                    while let Ok(batch) = rx.try_recv() {
                        live.extend(batch);
                    }
                    report.send((t, std::mem::take(&mut live))).unwrap();
                    return;
                }
            }
            // Drain what others sent, then free everything.
            rest.wait();
            while let Ok(batch) = rx.try_recv() {
                for o in batch {
                    check(&o);
                    a.free_any(o.addr as *mut u8).unwrap();
                }
            }
            for o in live.drain(..) {
                check(&o);
                a.free_any(o.addr as *mut u8).unwrap();
            }
        }));
    }
    drop(report_tx);
    let mut alive = THREADS;
    let mut early: Vec<(usize, Vec<Obj>)> = Vec::new();
    for round in 0..ROUNDS {
        ROUND.store(round, std::sync::atomic::Ordering::Relaxed);
        let mut all: Vec<Obj> = Vec::new();
        let kept = early.len();
        for (_, objs) in early.drain(..) {
            all.extend(objs);
        }
        for _ in kept..alive {
            all.extend(report_rx.recv().unwrap().1);
        }
        // Objects in flight between threads are not in `all`; the ones listed must not overlap.
        all.sort_by_key(|o| o.addr);
        for w in all.windows(2) {
            assert!(w[0].addr + w[0].size <= w[1].addr, "objects {:#x}+{} and {:#x} overlap", w[0].addr, w[0].size, w[1].addr);
        }
        for o in &all {
            check(o);
        }
        a.check_invariants().unwrap();
        let barrier = if round == 0 { &first } else { &rest };
        barrier.wait();
        barrier.wait();
        if round == 0 {
            // The exiting thread's objects, spread over the others to free.
            // (Another thread may have finished round 1 first: keep its report for then.)
            let orphans = loop {
                let (from, objs) = report_rx.recv().unwrap();
                if from == THREADS - 1 {
                    break objs;
                }
                early.push((from, objs));
            };
            alive -= 1;
            handles.remove(THREADS - 1).join().unwrap();
            for (i, chunk) in orphans.chunks(16).enumerate() {
                senders[i % alive].send(chunk.to_vec()).unwrap();
            }
            a.check_invariants().unwrap();
        }
    }
    rest.wait();
    for h in handles {
        h.join().unwrap();
    }
    // Every thread has exited: every heap is abandoned, its empty spans given back.
    a.check_invariants().unwrap();
    a.drain_thread_cache();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.small_live_bytes), (0, 0), "{s}");
    assert_eq!((s.small_spans, s.small_span_bytes, s.bytes_in_use), (0, 0, 0), "{s}");
}
