//! `FallowAlloc` with small objects on as the global allocator of this test binary: everything
//! the test harness, std and the threads allocate (their thread-local tables' registration, their
//! exit) goes through the slab layer, up to 64 KiB, and through fallow's pages above the
//! threshold. Threads build, exchange and free boxes, strings and vectors, and exit with some of
//! them live, which the main thread then frees.
#![warn(clippy::undocumented_unsafe_blocks)]

mod global_shim;

use std::sync::mpsc;

use fallow::{Config, Tunables};

fallow_global!(Config { arena_size: 1 << 30, tunables: Tunables::off(), small_objects: true, ..Config::default() });

#[test]
fn threads_allocate_exchange_and_exit_through_the_slab() {
    let (tx, rx) = mpsc::channel::<Vec<Box<[u8]>>>();
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut keep = Vec::new();
                for i in 0..20_000usize {
                    let size = 1 + (i * 131 + t as usize * 7) % 3000;
                    let b = vec![t ^ i as u8; size].into_boxed_slice();
                    let s = format!("{t}-{i}");
                    assert!(s.starts_with(&t.to_string()));
                    if i % 5 == 0 {
                        keep.push(b);
                    }
                    if keep.len() >= 64 {
                        tx.send(std::mem::take(&mut keep)).unwrap();
                    }
                }
                // What it still holds is freed as the closure returns; what it sent, by the main
                // thread after this one has exited (its heap abandoned meanwhile).
                keep.len()
            })
        })
        .collect();
    drop(tx);
    let mut received = 0usize;
    for batch in rx {
        for b in batch {
            let v = b[0];
            assert!(b.iter().all(|&x| x == v));
            received += 1;
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert!(received > 10_000);
    let a = A.get().allocator().expect("made by the first request");
    let s = a.stats();
    assert!(s.small_spans > 0, "{s}");
    a.check_invariants().unwrap();
    // A large vector still comes from fallow's pages, a small one from its small objects.
    let big = vec![1u8; 1 << 20];
    assert!(a.owns(big.as_ptr()));
    #[allow(clippy::useless_vec)] // a heap allocation through the global allocator is the point
    let small = vec![2u8; 100];
    assert!(a.owns(small.as_ptr()) && a.usable_size(small.as_ptr()) == Some(112));
}
