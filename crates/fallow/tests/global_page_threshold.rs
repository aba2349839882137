//! `FallowAlloc` with the smallest threshold (one page) as the global allocator of this test
//! binary: a thread's cache is itself a page-sized, page-aligned allocation (cache/table.rs,
//! `CachePage`), so making and retiring one comes back into fallow from inside fallow.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::thread;

#[global_allocator]
static A: fallow::FallowAlloc = fallow::FallowAlloc::with_threshold(4096);

#[test]
fn threads_whose_caches_come_from_fallow_itself() {
    let first = vec![3u8; 4096];
    let a = A.allocator().expect("the first page-sized request creates the allocator");
    assert!(a.owns(first.as_ptr()));
    let handles: Vec<_> = (0..6u8)
        .map(|t| {
            thread::spawn(move || {
                let mut kept = Vec::new();
                for i in 0..200usize {
                    let mut b = vec![t; 4096 << (i % 4)];
                    b[i] = 9;
                    assert_eq!(b[b.len() - 1], t);
                    if i % 7 == 0 {
                        kept.push(b);
                    }
                }
                kept.len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 29);
    }
    assert!(first.iter().all(|&x| x == 3));
    a.check_invariants().unwrap();
}
