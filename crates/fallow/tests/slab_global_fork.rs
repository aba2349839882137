//! `FallowAlloc` with small objects on as the global allocator of this test binary, in a threaded
//! program that forks: threads allocate hard (small objects, large blocks that take the
//! allocator lock, statistics that take the slab's and the allocator's, threads started and
//! ended, whose heaps are made and abandoned under the slab lock) while the main thread forks
//! again and again; each child allocates and frees small objects and large blocks, reads the
//! statistics, and exits 0. Without the `fork` handlers `FallowAlloc` registers, a child forked
//! while another thread held one of those locks waits for it forever.
#![warn(clippy::undocumented_unsafe_blocks)]

mod global_shim;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use fallow::Config;

fallow_global!(Config { arena_size: 1 << 30, small_objects: true, ..Config::default() });

const FORKS: usize = 150;
/// How long the parent waits for a child before it calls it stuck (a child's work takes
/// milliseconds; the bound only turns a hang into a failure).
const CHILD_DEADLINE_MS: u64 = 60_000;

/// One thread's churn until `stop`: a ring of small objects of every class replaced at random,
/// a large block now and then, the statistics now and then.
fn churn(seed: usize, stop: &AtomicBool, rounds: &AtomicUsize) {
    let mut ring: Vec<Vec<u8>> = (0..256).map(|_| Vec::new()).collect();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let slot = x % ring.len();
        let size = 1 + (x >> 20) % (16 << 10);
        if let Some(&b) = ring[slot].first() {
            assert!(ring[slot].iter().all(|&v| v == b), "an object's contents changed");
        }
        ring[slot] = vec![(x >> 8) as u8; size];
        if i.is_multiple_of(64) {
            let big = vec![1u8; 8 << 20];
            assert_eq!(big[(8 << 20) - 1], 1);
        }
        if i.is_multiple_of(512) {
            let a = A.get().allocator().expect("made by the first large request");
            assert!(a.stats().small_spans > 0);
        }
        i += 1;
        rounds.fetch_add(1, Ordering::Relaxed);
    }
}

/// The child's work: small objects of every size class and a large block, written and checked,
/// freed, then the statistics. `true` if everything read back as written.
fn child_work() -> bool {
    let mut held = Vec::new();
    for i in 0..3000usize {
        let size = 1 + i * 37 % (16 << 10);
        held.push(vec![i as u8; size]);
    }
    let big = vec![7u8; 4 << 20];
    let ok = held.iter().enumerate().all(|(i, v)| v.iter().all(|&b| b == i as u8)) && big[(4 << 20) - 1] == 7;
    drop(held);
    drop(big);
    let a = A.get().allocator().expect("inherited from the parent");
    ok && a.owns(Box::into_raw(Box::new([0u8; 100])) as *const u8) && a.stats().small_spans > 0
}

/// Wait for `pid` until it exits, or kill it past the deadline; its wait status, or `None` if
/// it was stuck.
fn wait_for(pid: libc::pid_t) -> Option<libc::c_int> {
    for _ in 0..CHILD_DEADLINE_MS {
        let mut status = 0;
        // SAFETY: `pid` is this process's child, not yet waited for; `status` is writable.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        assert_eq!(r, 0, "waitpid failed");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: the child is stuck; killing and reaping it is all that is left to do with it.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, core::ptr::null_mut(), 0);
    }
    None
}

#[test]
fn a_threaded_program_forks_and_the_child_allocates() {
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    // A large request first: the allocator exists before the threads and the forks.
    drop(vec![0u8; 1 << 20]);
    let mut threads: Vec<_> = (0..3)
        .map(|t| {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || churn(t + 1, &stop, &rounds))
        })
        .collect();
    // Threads that come and go: heaps made, adopted and abandoned under the slab lock.
    threads.push({
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let (stop, rounds) = (stop.clone(), rounds.clone());
                std::thread::spawn(move || {
                    let v: Vec<String> = (0..200).map(|i| format!("{n}-{i}")).collect();
                    assert!(v.iter().all(|s| s.starts_with(&n.to_string())));
                    rounds.fetch_add(1, Ordering::Relaxed);
                    drop(stop);
                })
                .join()
                .unwrap();
                n += 1;
            }
        })
    });
    let mut stuck = 0;
    let mut failed = 0;
    for _ in 0..FORKS {
        let before = rounds.load(Ordering::Relaxed);
        // Fork while the threads are at work.
        while rounds.load(Ordering::Relaxed) < before + 50 {
            std::thread::yield_now();
        }
        // SAFETY: the child runs `child_work` (this allocator and std only, on its one thread)
        // and leaves by `_exit`, without returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = child_work();
            // SAFETY: leaves the child at once, without running the parent's test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        match wait_for(pid) {
            None => stuck += 1,
            Some(s) if !(libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 0) => failed += 1,
            Some(_) => {}
        }
        if stuck > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!((stuck, failed), (0, 0), "of {FORKS} children: stuck (killed after {CHILD_DEADLINE_MS} ms), failed");
    let a = A.get().allocator().unwrap();
    a.check_invariants().unwrap();
}
