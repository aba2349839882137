//! The registry on its own: slots taken and given back, chunks added past the first and reused,
//! the entry dropped at `release`, and a `fork` while another thread holds a registered
//! allocator's lock. Other tests of this binary may register allocators meanwhile (a
//! `FallowAlloc` keeps its slot for good): the checks look at this test's own allocators, and
//! at the number of slots only with a chunk of margin.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::{chunks, register, release, CHUNK, GUARD};
use crate::config::{Config, Tunables};
use crate::flags::Flags;
use crate::heap::Shared;

use super::Allocator;

/// A small allocator without workers (hundreds of them at once stay cheap).
fn small(small_objects: bool) -> Allocator {
    let config = Config { arena_size: 4 << 20, max_order: 9, tunables: Tunables::off(), small_objects, ..Config::default() };
    Allocator::new(config).unwrap()
}

/// Whether the allocator whose shared state is at `key` is in the registry.
fn registered(key: *const Shared) -> bool {
    GUARD.lock();
    let mut found = false;
    // SAFETY: `GUARD` is held until the unlock below; the closure registers nothing.
    unsafe { super::for_each(|a| found |= Arc::as_ptr(&a.shared) == key) };
    // SAFETY: taken above by this thread.
    unsafe { GUARD.unlock() };
    found
}

/// Slots in the registry, taken or not.
fn capacity() -> usize {
    GUARD.lock();
    // SAFETY: `GUARD` is held until the unlock below.
    let n = unsafe { chunks() }.count() * CHUNK;
    // SAFETY: taken above by this thread.
    unsafe { GUARD.unlock() };
    n
}

#[test]
fn allocators_created_and_destroyed_in_a_loop_reuse_their_slots() {
    let before = capacity();
    for i in 0..3 * CHUNK + 7 {
        let a = small(i % 2 == 0);
        register(&a).unwrap();
        let key = Arc::as_ptr(&a.shared);
        assert!(registered(key), "allocator {i} not registered");
        let gone = Arc::downgrade(&a.shared);
        release(a);
        assert!(!registered(key), "allocator {i} still registered after release");
        assert!(gone.upgrade().is_none(), "allocator {i} still alive after release: the registry kept it");
    }
    let after = capacity();
    assert!(after <= before + CHUNK, "{} allocators, one at a time, took {before} -> {after} slots", 3 * CHUNK + 7);
}

#[test]
fn more_allocators_than_a_chunk_holds_are_all_registered_and_their_chunks_reused() {
    let n = CHUNK + 10;
    let make = || {
        (0..n)
            .map(|i| {
                let a = small(i % 3 == 0);
                register(&a).unwrap();
                a
            })
            .collect::<Vec<_>>()
    };
    let all = make();
    for (i, a) in all.iter().enumerate() {
        assert!(registered(Arc::as_ptr(&a.shared)), "allocator {i} of {n} not registered");
    }
    let cap = capacity();
    assert!(cap > n, "{n} allocators in {cap} slots (a chunk holds {CHUNK})");
    let keys: Vec<_> = all.iter().map(|a| Arc::as_ptr(&a.shared)).collect();
    for a in all {
        release(a);
    }
    for (i, &key) in keys.iter().enumerate() {
        assert!(!registered(key), "allocator {i} still registered after release");
    }
    // The same number again fits in the chunks already mapped.
    let again = make();
    assert!(capacity() <= cap + CHUNK, "{n} allocators again took {cap} -> {} slots", capacity());
    for a in again {
        release(a);
    }
}

#[test]
fn a_fork_while_another_thread_holds_a_registered_allocator_leaves_it_usable_in_the_child() {
    let a = small(true);
    register(&a).unwrap();
    let (held_tx, held_rx) = mpsc::channel();
    let holder = {
        let a = a.clone();
        std::thread::spawn(move || {
            let h = a.shared.heap.lock();
            held_tx.send(()).unwrap();
            // Long enough that the `fork` below comes while the lock is held: the `prepare`
            // handler waits for it; without the registry, the child gets it held by a thread it
            // does not have.
            std::thread::sleep(Duration::from_millis(300));
            drop(h);
        })
    };
    held_rx.recv().unwrap();
    // SAFETY: the child runs only the allocator's calls and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: `alarm` only arms a timer: a child stuck on the lock dies of `SIGALRM`.
        unsafe { libc::alarm(30) };
        let ok = (|| {
            let big = a.alloc(2 << 20, 4096, Flags::ZERO).ok()?;
            let obj = a.malloc(100, 16, Flags::NONE).ok()?;
            a.free(big.as_ptr()).ok()?;
            a.free_any(obj.as_ptr()).ok()?;
            a.stats();
            a.check_invariants().ok()
        })();
        // SAFETY: leaves the child at once, without running the parent's test harness.
        unsafe { libc::_exit(if ok.is_some() { 0 } else { 1 }) };
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: `pid` is the child forked above, not yet waited for; `status` is writable.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed (status {status:#x}; SIGALRM {}: stuck on a lock)",
        libc::SIGALRM
    );
    holder.join().unwrap();
    release(a);
}
