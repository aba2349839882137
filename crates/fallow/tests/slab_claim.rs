//! Spans claimed by other threads (slab/span.rs, the remote-free protocol): a thread fills spans
//! and then sleeps, alive, while another frees every object of them; the spans it parked full go
//! back to the page layer without it, its current span stays until it collects it, and when it
//! wakes its heap drops the claimed spans' descriptors and goes on.

use std::sync::mpsc;

use fallow::binding_support::objects_per_span;
use fallow::{Allocator, Config, Flags, Tunables};

fn cfg() -> Config {
    Config { arena_size: 256 << 20, max_order: 12, tunables: Tunables::off(), small_objects: true, ..Config::default() }
}

/// 256-byte objects: 255 to a 64 KiB span (its colour takes one).
const SIZE: usize = 256;
const PER_SPAN: usize = objects_per_span(SIZE);
/// Ten spans' worth and part of an eleventh (the current one when the owner stops).
const OBJECTS: usize = 10 * PER_SPAN + 100;

#[test]
fn spans_a_sleeping_owner_parked_go_back_once_other_threads_free_every_object() {
    let a = Allocator::new(cfg()).unwrap();
    let (objects_tx, objects_rx) = mpsc::channel::<Vec<usize>>();
    let (wake_tx, wake_rx) = mpsc::channel::<()>();
    let owner = {
        let a = a.clone();
        std::thread::spawn(move || {
            let v: Vec<usize> = (0..OBJECTS)
                .map(|i| {
                    let p = a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr();
                    // SAFETY: a live object of `SIZE` bytes.
                    unsafe { p.write_bytes(i as u8, SIZE) };
                    p as usize
                })
                .collect();
            objects_tx.send(v).unwrap();
            // Alive and away from the allocator until woken.
            wake_rx.recv().unwrap();
            // Its own heap, with the claimed spans still on its full list, checks in full.
            a.check_invariants().unwrap();
            // It goes on: takes its spans back (dropping the claimed ones), new spans, frees.
            let again: Vec<_> = (0..OBJECTS).map(|_| a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr()).collect();
            a.check_invariants().unwrap();
            for p in again {
                // SAFETY: a live object of `SIZE` bytes.
                unsafe { p.write_bytes(7, SIZE) };
                a.free_any(p).unwrap();
            }
            a.check_invariants().unwrap();
        })
    };
    let held = objects_rx.recv().unwrap();
    let before = a.stats();
    assert_eq!(before.small_spans, 11, "{before}");
    assert_eq!(before.small_claimed_spans, 0, "{before}");
    for &p in &held {
        a.free_any(p as *mut u8).unwrap();
    }
    // The ten full spans went back while their owner sleeps; the current one waits for it
    // (its objects are on its `thread_free`, counted live until collected).
    let s = a.stats();
    assert_eq!(s.small_claimed_spans, 10, "{s}");
    assert_eq!((s.small_spans, s.small_span_bytes), (1, 64 << 10), "{s}");
    assert_eq!(s.small_live_objects, 100, "{s}");
    assert_eq!(s.bytes_in_use, 64 << 10, "the claimed spans' pages are free in the page layer: {s}");
    // A free of an object of a claimed span is of a pointer no longer live.
    assert!(a.free_any(held[0] as *mut u8).is_err());
    assert!(a.free_any(held[5 * PER_SPAN + 3] as *mut u8).is_err());
    // The pages serve others meanwhile.
    let other: Vec<_> = (0..4 * PER_SPAN).map(|_| a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr()).collect();
    for &p in &other {
        // SAFETY: a live object of `SIZE` bytes.
        unsafe { p.write_bytes(1, SIZE) };
    }
    wake_tx.send(()).unwrap();
    owner.join().unwrap();
    for p in other {
        // SAFETY: written above, untouched by the owner's work since.
        assert!(unsafe { std::slice::from_raw_parts(p, SIZE) }.iter().all(|&b| b == 1));
        a.free_any(p).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.small_spans, s.bytes_in_use), (0, 0, 0), "{s}");
}

/// The owner frees the one object it kept of a parked span while another thread frees the
/// span's last others: the push after the owner's free may claim the span (every object is
/// free), between the owner's store of the count and its look at the span (`unpark`). That
/// free is the program's last of a live object, not a double free. The window is a few
/// instructions wide: the two threads meet at a flag, staggered differently each round (with
/// the false abort this aborted in every run of a release build; how many rounds claim depends
/// on the timing, so it is not asserted).
#[test]
fn an_owners_free_racing_the_claim_of_its_span_is_no_double_free() {
    use std::sync::atomic::{AtomicUsize, Ordering::{Acquire, Release}};
    use std::sync::Arc;
    // 4 KiB objects: 16 to a 64 KiB span.
    const BIG: usize = 4096;
    const N: usize = 16;
    let spin = |n: usize| (0..n).for_each(|_| std::hint::spin_loop());
    let go = Arc::new(AtomicUsize::new(0));
    let (to_other, other_rx) = mpsc::channel::<(Allocator, Vec<usize>, usize)>();
    let (ready_tx, ready) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel::<()>();
    let go2 = go.clone();
    let other = std::thread::spawn(move || {
        while let Ok((a, v, round)) = other_rx.recv() {
            for &p in &v[..v.len() - 1] {
                a.free_any(p as *mut u8).unwrap();
            }
            ready_tx.send(()).unwrap();
            while go2.load(Acquire) != round {
                std::hint::spin_loop();
            }
            spin((round * 7) % 64);
            a.free_any(*v.last().unwrap() as *mut u8).unwrap();
            drop(a);
            done_tx.send(()).unwrap();
        }
    });
    for round in 1..=400 {
        let a = Allocator::new(Config { arena_size: 64 << 20, ..cfg() }).unwrap();
        // The span's 16 objects, and one more: the span is found full and parked.
        let objs: Vec<usize> = (0..N + 1).map(|_| a.malloc(BIG, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
        assert!(objs[..N].iter().all(|&o| o & !0xffff == objs[0] & !0xffff));
        to_other.send((a.clone(), objs[1..N].to_vec(), round)).unwrap();
        ready.recv().unwrap();
        go.store(round, Release);
        spin((round * 3) % 16);
        a.free_any(objs[0] as *mut u8).unwrap();
        done.recv().unwrap();
        a.free_any(objs[N] as *mut u8).unwrap();
        a.drain_thread_cache();
        a.check_invariants().unwrap();
    }
    drop(to_other);
    other.join().unwrap();
}
