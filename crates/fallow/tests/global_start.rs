//! `FallowAlloc` at program start: threads whose first large requests race while the allocator
//! is being created all get fallow memory (the ones that find it being created wait for it).
//! A test binary of its own, with one test, so that nothing has created the allocator before.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::{Arc, Barrier};

#[global_allocator]
static A: fallow::FallowAlloc = fallow::FallowAlloc::new();

#[test]
fn racing_first_large_requests_are_all_served_by_fallow() {
    const T: usize = 16;
    const SIZE: usize = 64 << 20;
    assert!(A.allocator().is_none(), "nothing large was allocated before this test");
    let barrier = Arc::new(Barrier::new(T));
    let handles: Vec<_> = (0..T)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut v: Vec<u8> = Vec::with_capacity(SIZE);
                v.push(1);
                v
            })
        })
        .collect();
    let blocks: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let a = A.allocator().expect("created by the first large request");
    let ours = blocks.iter().filter(|v| a.owns(v.as_ptr())).count();
    assert_eq!(ours, T, "only {ours} of {T} racing blocks came from fallow");
    assert_eq!(a.stats().live_blocks, T as u64);
    drop(blocks);
    a.check_invariants().unwrap();
}
