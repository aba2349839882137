//! `FallowAlloc` as the global allocator of this test binary: everything the test harness and
//! std allocate goes through it, small to `System`, large to fallow.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::Arc;
use std::thread;

#[global_allocator]
static A: fallow::FallowAlloc = fallow::FallowAlloc::new();

#[test]
fn large_from_fallow_small_from_system_from_many_threads() {
    let big = vec![0u8; 4 << 20];
    assert!(big.iter().all(|&b| b == 0));
    let a = A.allocator().expect("the first large request creates the allocator");
    assert!(a.owns(big.as_ptr()));
    #[allow(clippy::useless_vec)] // a heap allocation through the global allocator is the point
    let small = vec![1u8; 100];
    assert!(!a.owns(small.as_ptr()));
    // A vector growing from small to large crosses the threshold through realloc.
    let mut v: Vec<u64> = Vec::new();
    for i in 0..1_000_000u64 {
        v.push(i);
    }
    assert!(a.owns(v.as_ptr() as *const u8));
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    v.truncate(10);
    v.shrink_to_fit();
    assert!(!a.owns(v.as_ptr() as *const u8));
    let shared = Arc::new(big);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                for i in 0..50usize {
                    let mut b = vec![t as u8; (256 << 10) + i * 4096];
                    b[i] = 7;
                    assert_eq!(b[b.len() - 1], t as u8);
                }
                shared.len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 4 << 20);
    }
    drop(shared);
    a.check_invariants().unwrap();
}
