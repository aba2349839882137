//! Adversarial review of the slab layer (small objects): each test here shows one finding of the
//! review (a bad input the slab accepts silently, a list it can be made to corrupt or spin on).

use std::time::{Duration, Instant};

use fallow::{Allocator, Config, Error, Flags, Tunables};

fn cfg() -> Config {
    Config { arena_size: 256 << 20, max_order: 12, tunables: Tunables::off(), small_objects: true, ..Config::default() }
}

/// The owner frees both objects of its span (`used` 0), then the first one again: the head
/// check (`local_free`'s head is the second object) misses it, but a free into a span with no
/// object counted as used is a double free that costs one compare to see (the count is read
/// on that path anyway). Accepted, it makes `local_free` a cycle (a -> b -> a) and `used` wraps
/// to 2^32 - 1, so the span is never empty again and `a` / `b` are handed out again and again.
#[test]
fn owner_double_free_into_an_emptied_span_is_detected() {
    let a = Allocator::new(cfg()).unwrap();
    let p = a.malloc(16, 16, Flags::NONE).unwrap().as_ptr();
    let q = a.malloc(16, 16, Flags::NONE).unwrap().as_ptr();
    a.free_any(p).unwrap();
    a.free_any(q).unwrap();
    assert_eq!(a.free_any(p), Err(Error::DoubleFree { addr: p as usize }), "a free into a span with nothing in use");
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_live_objects, 0);
}

/// The same double free into a span that is no longer its class's current one: a span filled
/// (the next object comes from a new span) and emptied again becomes a spare, off its class
/// list. The owner's free tells a span that counts none used by the same word whether the span
/// is the current one, another listed one or off its list (`used`, with its `current` and
/// `UNLISTED` parts): each must still see the double free.
#[test]
fn owner_double_free_into_a_spare_span_is_detected() {
    let a = Allocator::new(cfg()).unwrap();
    let per_span = fallow::binding_support::objects_per_span(1024);
    let first: Vec<*mut u8> = (0..per_span).map(|_| a.malloc(1024, 16, Flags::NONE).unwrap().as_ptr()).collect();
    let next = a.malloc(1024, 16, Flags::NONE).unwrap().as_ptr();
    for &p in &first {
        a.free_any(p).unwrap();
    }
    assert_eq!(a.stats().small_spare_spans, 1, "the first span, emptied, is a spare");
    let p = first[0];
    assert_eq!(a.free_any(p), Err(Error::DoubleFree { addr: p as usize }), "a free into a spare span");
    a.check_invariants().unwrap();
    a.free_any(next).unwrap();
    assert_eq!(a.stats().small_live_objects, 0);
}

/// Another thread frees `a`, `b`, then `a` again (glibc's fastbins miss this pattern too): the
/// head check sees `b`, so `a` is pushed a second time and `thread_free` becomes the cycle
/// a -> b -> a. When the owner runs out of objects it collects the list, walking it to its
/// tail, which never comes: the owner spins forever in `Span::collect` (a hang, not an abort
/// with a message). The walk is bounded by a count the owner already keeps (`used` counts every
/// pushed object), so the cycle is cheap to detect. Run in a child process: an abort with a
/// message passes, a hang (the child still running after 20 s) fails.
#[test]
fn remote_double_free_cycle_does_not_hang_the_owner() {
    // SAFETY: the child runs only the scenario below and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let a = Allocator::new(cfg()).unwrap();
        let p = a.malloc(16, 16, Flags::NONE).unwrap().as_ptr() as usize;
        let q = a.malloc(16, 16, Flags::NONE).unwrap().as_ptr() as usize;
        let a2 = a.clone();
        let third = std::thread::spawn(move || {
            a2.free_any(p as *mut u8).unwrap();
            a2.free_any(q as *mut u8).unwrap();
            a2.free_any(p as *mut u8)
        })
        .join()
        .unwrap();
        // The owner uses up its span's objects, so that it collects the other thread's frees.
        for _ in 0..5000 {
            if a.malloc(16, 16, Flags::NONE).is_err() {
                break;
            }
        }
        // SAFETY: leaves the child at once, without the harness.
        unsafe { libc::_exit(if third.is_err() { 0 } else { 3 }) };
    }
    let t0 = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: `pid` is the child forked above; `status` is writable.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child, still running.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("the owner hangs collecting a remote list made a cycle by a double free");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Exit 0 (the third free was refused), exit 3 (accepted, but the owner went on: the list
    // was not walked into a cycle), or a deliberate abort.
    let aborted = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGABRT;
    assert!(aborted || (libc::WIFEXITED(status) && [0, 3].contains(&libc::WEXITSTATUS(status))), "child status {status}");
}

/// `Allocator::free` (the page path) given a small object that happens to be the first object
/// of its span (a class with no colour, 4 KiB): the page layer sees the span's live 64 KiB
/// block starting there and frees it whole, while the span stays in the page map and in its
/// heap. The heap keeps handing out objects from pages the page layer hands to someone else. A
/// safe call with a wrong pointer must be an error, as `free` of any other pointer that is not
/// a block's start is.
#[test]
fn page_free_of_a_small_object_is_refused() {
    let a = Allocator::new(cfg()).unwrap();
    let p = a.malloc(4096, 16, Flags::NONE).unwrap().as_ptr();
    assert_eq!(p as usize % (64 << 10), 0, "the span's first object");
    assert!(a.free(p).is_err(), "the page path freed a live span's pages");
    a.check_invariants().unwrap();
    a.free_any(p).unwrap();
}

/// The same through `resize_in_place`: shrinking the "block" at a span's start gives the
/// span's tail pages back to the page layer while the span still hands out objects there.
#[test]
fn resize_in_place_of_a_small_object_is_refused() {
    let a = Allocator::new(cfg()).unwrap();
    let p = a.malloc(4096, 16, Flags::NONE).unwrap().as_ptr();
    assert_eq!(p as usize % (64 << 10), 0, "the span's first object");
    assert!(!matches!(a.resize_in_place(p, 4096), Ok(true)), "the page path shrank a live span");
    a.check_invariants().unwrap();
    a.free_any(p).unwrap();
}

/// An alignment that is not a power of two is `BadAlignment` on the slow path, but the hot
/// path only tests `align <= 16`: the same call fails or succeeds depending on whether the
/// current span has an object to pop.
#[test]
fn a_bad_alignment_is_refused_on_the_hot_path_too() {
    let a = Allocator::new(cfg()).unwrap();
    for align in [0usize, 3, 12] {
        assert!(matches!(a.malloc(16, align, Flags::NONE), Err(Error::BadAlignment { .. })), "slow path, align {align}");
    }
    let warm = a.malloc(16, 16, Flags::NONE).unwrap();
    for align in [0usize, 3, 12] {
        let r = a.malloc(16, align, Flags::NONE);
        if let Ok(p) = r {
            a.free_any(p.as_ptr()).unwrap();
            panic!("hot path accepted align {align}");
        }
    }
    a.free_any(warm.as_ptr()).unwrap();
}

/// `before_fork` takes the slab's lock, then the allocator's ("the slab never takes it while
/// holding the allocator's"), but `stats` / `try_stats` take the slab's lock inside the
/// allocator's (`stats_of` -> `Slab::add_to_stats`): a thread reading the statistics while
/// another forks deadlocks both (lock order inversion). Here one thread reads the statistics in
/// a loop while this one runs `before_fork` / `after_fork_parent` (no fork needed to show it).
#[test]
fn stats_against_before_fork_do_not_deadlock() {
    // In a child process: a deadlocked allocator cannot even be dropped.
    assert_child_finishes(Duration::from_secs(30), || {
        let a = Allocator::new(cfg()).unwrap();
        let _held: Vec<_> = (0..100).map(|i| a.malloc(16 + i, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::black_box(a.stats());
                }
            })
        };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            a.before_fork();
            // SAFETY: this thread called `before_fork` just above.
            unsafe { a.after_fork_parent() };
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().unwrap();
    });
}

/// Run `f` in a child process: it must return (exit 0) within `limit`.
fn assert_child_finishes(limit: Duration, f: impl FnOnce()) {
    // SAFETY: the child runs `f` only and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        f();
        // SAFETY: leaves the child at once, without the harness.
        unsafe { libc::_exit(0) };
    }
    let t0 = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: `pid` is the child forked above; `status` is writable.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break;
        }
        if t0.elapsed() > limit {
            // SAFETY: our own child, still running.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("the child did not finish within {limit:?} (deadlock)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status}");
}

/// Checked sound: every power-of-two alignment up to 1 MiB with sizes 0, 1, 16 KiB - 1, 16 KiB
/// and 16 KiB + 1, plain and zeroed, aligned, usable for the size asked, zeroed when asked (also
/// after the objects were written and freed), freed back to nothing.
#[test]
fn every_alignment_and_the_boundary_sizes() {
    let a = Allocator::new(cfg()).unwrap();
    for round in 0..2 {
        let mut held = Vec::new();
        for shift in 0..=20 {
            let align = 1usize << shift;
            for size in [0, 1, Allocator::SMALL_MAX - 1, Allocator::SMALL_MAX, Allocator::SMALL_MAX + 1] {
                for flags in [Flags::NONE, Flags::ZERO] {
                    let p = a.malloc(size, align, flags).unwrap().as_ptr();
                    assert_eq!(p as usize % align.max(16), 0, "size {size} align {align}");
                    let usable = a.usable_size(p).unwrap();
                    assert!(usable >= size.max(1), "size {size} align {align}: usable {usable}");
                    if flags == Flags::ZERO {
                        // SAFETY: a live object of `usable` bytes.
                        let s = unsafe { std::slice::from_raw_parts(p, usable) };
                        assert!(s.iter().all(|&b| b == 0), "round {round} calloc size {size} align {align}");
                    }
                    // SAFETY: as above.
                    unsafe { p.write_bytes(0xc3, usable) };
                    held.push(p);
                }
            }
        }
        for p in held {
            a.free_any(p).unwrap();
        }
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.small_spans, s.bytes_in_use), (0, 0, 0), "{s}");
}

/// Checked sound: a thread whose own thread-local destructor runs after the slab's table was
/// torn down (registered first, so run last) frees the objects it still holds and allocates new
/// ones (served by the locked heap), which another thread frees later; everything comes back.
#[test]
fn frees_and_mallocs_after_the_threads_heap_was_abandoned() {
    use std::cell::RefCell;
    type Held = (Allocator, Vec<usize>, std::sync::mpsc::Sender<Vec<usize>>);
    struct Late(RefCell<Option<Held>>);
    impl Drop for Late {
        fn drop(&mut self) {
            if let Some((a, held, tx)) = self.0.borrow_mut().take() {
                for p in held {
                    a.free_any(p as *mut u8).unwrap();
                }
                let more: Vec<usize> = (0..500).map(|i| a.malloc(16 + i * 3, 16, Flags::ZERO).unwrap().as_ptr() as usize).collect();
                let _ = tx.send(more);
            }
        }
    }
    thread_local! { static LATE: Late = const { Late(RefCell::new(None)) }; }
    let a = Allocator::new(cfg()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let a2 = a.clone();
    std::thread::spawn(move || {
        // Registered before the slab's table: destroyed after it.
        LATE.with(|_| ());
        let held: Vec<usize> = (0..3000).map(|i| a2.malloc(16 + i % 700, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
        LATE.with(|l| *l.0.borrow_mut() = Some((a2, held, tx)));
    })
    .join()
    .unwrap();
    let more = rx.recv().unwrap();
    for p in more {
        a.free_any(p as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.small_spans, s.bytes_in_use), (0, 0, 0), "{s}");
}

/// A class's current span found full with a successor: the successor becomes the current span
/// (`used` carries one for it), the full one moves to the tail. `check_invariants` compares
/// the current flag and the counts at every step.
#[test]
fn the_next_span_becomes_current_when_the_head_leaves_its_list() {
    let a = Allocator::new(cfg()).unwrap();
    let per = fallow::binding_support::objects_per_span(1024);
    // Span A filled, then span B.
    let sa: Vec<_> = (0..per).map(|_| a.malloc(1024, 16, Flags::NONE).unwrap().as_ptr()).collect();
    let sb: Vec<_> = (0..per).map(|_| a.malloc(1024, 16, Flags::NONE).unwrap().as_ptr()).collect();
    a.check_invariants().unwrap();
    // The owner frees one object of A: A comes back behind B.
    a.free_any(sa[3]).unwrap();
    a.check_invariants().unwrap();
    // B is full: the next request moves it to the tail, A becomes current and serves it.
    let x = a.malloc(1024, 16, Flags::NONE).unwrap().as_ptr();
    assert_eq!(x, sa[3]);
    a.check_invariants().unwrap();
    a.free_any(x).unwrap();
    a.check_invariants().unwrap();
    for (i, &p) in sa.iter().enumerate() {
        if i != 3 {
            a.free_any(p).unwrap();
        }
    }
    for &p in &sb {
        a.free_any(p).unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_live_objects, 0);
}

/// Frees made by a thread-local destructor that runs after the slab table's: the thread has
/// given its heap up by then (it may already be another thread's), so none of them may take the
/// owner's hot path.
/// The allocator, the objects' addresses, and where to say how many frees took the owner's path.
type Late = (Allocator, Vec<usize>, std::sync::mpsc::Sender<usize>);

struct LateFrees(std::cell::RefCell<Option<Late>>);

impl Drop for LateFrees {
    fn drop(&mut self) {
        if let Some((a, v, tx)) = self.0.borrow_mut().take() {
            let mut owner_path = 0;
            for p in v {
                if a.free_hot(p as *mut u8) {
                    owner_path += 1;
                } else {
                    a.free_any(p as *mut u8).unwrap();
                }
            }
            let _ = tx.send(owner_path);
        }
    }
}

thread_local! { static LATE_FREES: LateFrees = const { LateFrees(std::cell::RefCell::new(None)) }; }

#[test]
fn frees_after_the_slab_table_is_gone_never_take_the_owners_path() {
    let a = Allocator::new(cfg()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let a1 = a.clone();
    std::thread::spawn(move || {
        // Registered before the slab table's destructor, so dropped after it.
        LATE_FREES.with(|_| ());
        let v: Vec<usize> = (0..200).map(|i| a1.malloc(16 + (i % 4) * 16, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
        LATE_FREES.with(|g| *g.0.borrow_mut() = Some((a1.clone(), v, tx)));
    })
    .join()
    .unwrap();
    assert_eq!(rx.recv().unwrap(), 0, "frees took the owner's path on a heap given up");
    a.check_invariants().unwrap();
    let st = a.stats();
    assert_eq!((st.small_live_objects, st.small_spans), (0, 0), "the exited thread's spans were kept");
}
