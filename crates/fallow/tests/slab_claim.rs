//! Spans claimed by other threads (slab/span.rs, the remote-free protocol): a thread fills spans
//! and then sleeps, alive, while another frees every object of them; the spans it parked full go
//! back to the page layer without it, its current span stays until it collects it, and when it
//! wakes its heap drops the claimed spans' descriptors and goes on.

use std::sync::mpsc;

use fallow::{Allocator, Config, Flags, Tunables};

fn cfg() -> Config {
    Config { arena_size: 256 << 20, max_order: 12, tunables: Tunables::off(), small_objects: true, ..Config::default() }
}

/// 256-byte objects: 256 to a 64 KiB span.
const SIZE: usize = 256;
const PER_SPAN: usize = (64 << 10) / SIZE;
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
