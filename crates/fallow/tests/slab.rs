//! The slab layer (small objects, `Allocator::malloc` / `free_any`): sizes and alignment,
//! `calloc` from fresh and reused objects, bad frees, thread exit with live objects freed
//! later by another thread, and `fork` in a threaded program. The model test is slab_model.rs.

use std::sync::mpsc;

use fallow::{Allocator, Config, Error, Flags, Tunables};

fn cfg() -> Config {
    Config { arena_size: 256 << 20, max_order: 12, tunables: Tunables::off(), small_objects: true, ..Config::default() }
}

/// Nothing small is live and no span is held (the caller's heap trimmed first), and the
/// invariants hold.
fn all_returned(a: &Allocator) {
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.small_live_bytes, s.small_spans, s.small_span_bytes), (0, 0, 0, 0), "{s}");
    assert_eq!(s.bytes_in_use, 0, "{s}");
}

/// Spans are coloured: the first object of each class of up to 128 bytes lies one to eight
/// cache lines past its span's start, each in a line of its own (so in a set of the L1 of its
/// own), and a free of an address in the colour is refused (one object's size below the first
/// object, where an object would start were the span uncoloured). Frees and reuse work from
/// there.
#[test]
fn the_first_objects_of_the_smallest_classes_lie_in_lines_of_their_own() {
    let a = Allocator::new(cfg()).unwrap();
    let firsts: Vec<*mut u8> = (1..=8).map(|k| a.malloc(16 * k, 16, Flags::NONE).unwrap().as_ptr()).collect();
    let lines: Vec<usize> = firsts.iter().map(|&p| (p as usize % (64 << 10)) / 64).collect();
    assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7, 8], "the first objects' lines in their spans");
    for (k, &p) in firsts.iter().enumerate() {
        // An address in the colour, below the first object: no object's.
        let below = p as usize - 16 * (k + 1);
        assert!(a.free_any(below as *mut u8).is_err(), "class {}", 16 * (k + 1));
        a.free_any(p).unwrap();
        // The object freed last is handed out again first.
        assert_eq!(a.malloc(16 * (k + 1), 16, Flags::NONE).unwrap().as_ptr(), p);
        a.free_any(p).unwrap();
    }
    all_returned(&a);
}

#[test]
fn every_size_up_to_the_limit_is_served_aligned_and_kept() {
    let a = Allocator::new(cfg()).unwrap();
    let mut held = Vec::new();
    for size in (1..=Allocator::SMALL_MAX).step_by(37).chain([0, 16, 4096, Allocator::SMALL_MAX]) {
        let p = a.malloc(size, 8, Flags::NONE).unwrap().as_ptr();
        assert_eq!(p as usize % 16, 0, "size {size}");
        let usable = a.usable_size(p).unwrap();
        assert!(usable >= size.max(1) && usable <= size.max(16) * 5 / 4 + 16, "size {size}: usable {usable}");
        // SAFETY: `p` is a live object of `usable` bytes.
        unsafe { p.write_bytes(size as u8, usable) };
        held.push((p, usable, size as u8));
    }
    let s = a.stats();
    assert_eq!(s.small_live_objects, held.len() as u64);
    assert!(s.small_live_bytes >= held.iter().map(|h| h.1 as u64).sum::<u64>());
    a.check_invariants().unwrap();
    for (p, usable, v) in held {
        // SAFETY: `p` is still live, written above.
        assert!(unsafe { std::slice::from_raw_parts(p, usable) }.iter().all(|&b| b == v));
        a.free_any(p).unwrap();
    }
    // Above the limit: a page block, freed the same way.
    let big = a.malloc(Allocator::SMALL_MAX + 1, 16, Flags::NONE).unwrap().as_ptr();
    assert_eq!(a.usable_size(big), Some((Allocator::SMALL_MAX + 1).next_multiple_of(4096)));
    a.free_any(big).unwrap();
    all_returned(&a);
}

#[test]
fn aligned_requests_get_aligned_objects() {
    let a = Allocator::new(cfg()).unwrap();
    for align in [32usize, 64, 256, 4096, 16384] {
        let ps: Vec<_> = (0..20).map(|i| a.malloc(1 + i * 7, align, Flags::NONE).unwrap().as_ptr()).collect();
        for &p in &ps {
            assert_eq!(p as usize % align, 0, "align {align}");
        }
        for p in ps {
            a.free_any(p).unwrap();
        }
    }
    assert!(matches!(a.malloc(10, 3, Flags::NONE), Err(Error::BadAlignment { .. })));
    all_returned(&a);
}

#[test]
fn calloc_reads_zero_from_fresh_spans_and_reused_objects() {
    let a = Allocator::new(cfg()).unwrap();
    for size in [16usize, 100, 1000, 3000, 9000] {
        // Dirty the pages first: a span that was a written page block before.
        let blk = a.alloc(256 << 10, 256 << 10, Flags::NONE).unwrap().as_ptr();
        // SAFETY: a live block of 256 KiB.
        unsafe { blk.write_bytes(0xa5, 256 << 10) };
        a.free(blk).unwrap();
        let mut ps = Vec::new();
        for _ in 0..100 {
            let p = a.malloc(size, 16, Flags::ZERO).unwrap().as_ptr();
            // SAFETY: a live object of at least `size` bytes.
            let s = unsafe { std::slice::from_raw_parts_mut(p, size) };
            assert!(s.iter().all(|&b| b == 0), "fresh calloc({size}) not zero");
            s.fill(0xff);
            ps.push(p);
        }
        for p in ps.drain(..) {
            a.free_any(p).unwrap();
        }
        // Reused objects (freed above, written with 0xff) come back zeroed.
        for _ in 0..100 {
            let p = a.malloc(size, 16, Flags::ZERO).unwrap().as_ptr();
            // SAFETY: as above.
            let s = unsafe { std::slice::from_raw_parts_mut(p, size) };
            assert!(s.iter().all(|&b| b == 0), "reused calloc({size}) not zero");
            s.fill(0xee);
            ps.push(p);
        }
        // A plain malloc in between, then calloc again (objects linked by malloc are memset).
        let m: Vec<_> = (0..50).map(|_| a.malloc(size, 16, Flags::NONE).unwrap().as_ptr()).collect();
        for p in m {
            // SAFETY: a live object of at least `size` bytes.
            unsafe { p.write_bytes(0x11, size) };
            a.free_any(p).unwrap();
        }
        for _ in 0..100 {
            let p = a.malloc(size, 16, Flags::ZERO).unwrap().as_ptr();
            // SAFETY: as above.
            assert!(unsafe { std::slice::from_raw_parts(p, size) }.iter().all(|&b| b == 0), "calloc({size}) after malloc");
            ps.push(p);
        }
        for p in ps {
            a.free_any(p).unwrap();
        }
    }
    all_returned(&a);
}

#[test]
fn bad_frees_are_errors_that_change_nothing() {
    let a = Allocator::new(cfg()).unwrap();
    let p = a.malloc(100, 16, Flags::NONE).unwrap().as_ptr();
    let q = a.malloc(100, 16, Flags::NONE).unwrap().as_ptr();
    // Inside an object (112-byte class): the object's start is named.
    match a.free_any(p.wrapping_add(8)) {
        Err(Error::InteriorPointer { addr, block }) => assert_eq!((addr, block), (p as usize + 8, p as usize)),
        r => panic!("interior free: {r:?}"),
    }
    // Never handed out: far past the objects handed out in this span.
    assert!(matches!(a.free_any(p.wrapping_add(112 * 400)), Err(Error::InvalidPointer { .. })));
    // Not fallow's at all.
    let mut local = 0u64;
    assert!(matches!(a.free_any(&mut local as *mut u64 as *mut u8), Err(Error::InvalidPointer { .. })));
    a.free_any(q).unwrap();
    assert_eq!(a.free_any(q), Err(Error::DoubleFree { addr: q as usize }));
    a.free_any(p).unwrap();
    assert_eq!(a.free_any(p), Err(Error::DoubleFree { addr: p as usize }));
    // A double free by another thread (the remote list's head).
    let r = a.malloc(100, 16, Flags::NONE).unwrap().as_ptr() as usize;
    let a2 = a.clone();
    std::thread::spawn(move || {
        a2.free_any(r as *mut u8).unwrap();
        assert_eq!(a2.free_any(r as *mut u8), Err(Error::DoubleFree { addr: r }));
    })
    .join()
    .unwrap();
    a.check_invariants().unwrap();
    // The object another thread freed counts as live until its span's owner collects it.
    assert_eq!(a.stats().small_live_objects, 1);
    all_returned(&a);
}

#[test]
fn a_dead_threads_objects_freed_by_another_thread_give_every_span_back() {
    let a = Allocator::new(cfg()).unwrap();
    let (tx, rx) = mpsc::channel::<Vec<(usize, usize)>>();
    let producer = {
        let a = a.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            for i in 0..20_000usize {
                let size = 16 + (i * 7919) % 6000;
                let p = a.malloc(size, 16, Flags::NONE).unwrap().as_ptr();
                // SAFETY: a live object of `size` bytes.
                unsafe { p.write_bytes(i as u8, size) };
                // Free a third at once (local frees), keep the rest for the other thread.
                if i % 3 == 0 {
                    a.free_any(p).unwrap();
                } else {
                    v.push((p as usize, size));
                }
            }
            tx.send(v).unwrap();
        })
    };
    let held = rx.recv().unwrap();
    producer.join().unwrap();
    // The producer exited with live objects: its heap is abandoned with its spans.
    let s = a.stats();
    assert_eq!(s.small_live_objects, held.len() as u64, "{s}");
    assert!(s.small_spans > 0);
    a.check_invariants().unwrap();
    for (i, &(p, size)) in held.iter().enumerate() {
        // SAFETY: a live object written by the producer.
        let first = unsafe { *(p as *const u8) };
        let _ = (i, size, first);
        a.free_any(p as *mut u8).unwrap();
    }
    a.check_invariants().unwrap();
    all_returned(&a);
    // A new thread adopts the abandoned heap and uses it.
    let a2 = a.clone();
    std::thread::spawn(move || {
        let ps: Vec<_> = (0..1000).map(|i| a2.malloc(16 + i, 16, Flags::NONE).unwrap().as_ptr()).collect();
        for p in ps {
            a2.free_any(p).unwrap();
        }
    })
    .join()
    .unwrap();
    all_returned(&a);
}

#[test]
fn fork_child_frees_the_other_threads_objects_and_gives_their_spans_back() {
    let a = Allocator::new(cfg()).unwrap();
    let (hold_tx, hold_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<Vec<usize>>();
    let other = {
        let a = a.clone();
        std::thread::spawn(move || {
            let v: Vec<usize> = (0..3000).map(|i| a.malloc(24 + i % 500, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
            ready_tx.send(v.clone()).unwrap();
            hold_rx.recv().unwrap();
            for p in v {
                a.free_any(p as *mut u8).unwrap();
            }
        })
    };
    let theirs = ready_rx.recv().unwrap();
    let mine: Vec<usize> = (0..500).map(|i| a.malloc(40 + i, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    a.before_fork();
    // SAFETY: `a.before_fork()` was called just above, so that the child (one thread) can take
    // `a` over with `after_fork_child`; it leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child of the `fork` just after `before_fork`, with one thread.
        unsafe { a.after_fork_child() };
        let ok = (|| {
            for &p in theirs.iter().chain(&mine) {
                a.free_any(p as *mut u8).ok()?;
            }
            let more: Vec<_> = (0..2000).map(|i| a.malloc(8 + i % 3000, 16, Flags::ZERO).ok()).collect::<Option<Vec<_>>>()?;
            for p in more {
                a.free_any(p.as_ptr()).ok()?;
            }
            a.drain_thread_cache();
            a.check_invariants().ok()?;
            let s = a.stats();
            (s.small_live_objects == 0 && s.small_spans == 0 && s.bytes_in_use == 0).then_some(())
        })();
        // SAFETY: leaves the child at once, without running the parent's test harness.
        unsafe { libc::_exit(if ok.is_some() { 0 } else { 1 }) };
    }
    // SAFETY: this thread called `before_fork` just before the `fork`.
    unsafe { a.after_fork_parent() };
    let mut status = 0;
    // SAFETY: `pid` is the child forked above, not yet waited for; `status` is writable.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status}");
    hold_tx.send(()).unwrap();
    other.join().unwrap();
    for p in mine {
        a.free_any(p as *mut u8).unwrap();
    }
    all_returned(&a);
}

#[test]
fn small_objects_off_serves_page_blocks() {
    let a = Allocator::new(Config { small_objects: false, ..cfg() }).unwrap();
    let p = a.malloc(100, 16, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(p as usize % 4096, 0);
    assert_eq!(a.usable_size(p), Some(4096));
    a.free_any(p).unwrap();
    assert_eq!(a.stats().small_spans, 0);
    all_returned(&a);
}

#[test]
fn spans_other_threads_emptied_go_back_before_the_owner_takes_new_ones() {
    let a = Allocator::new(cfg()).unwrap();
    // 64 spans of 1 KiB objects (64 a span), all freed by another thread: every object is on a
    // span's `thread_free`, which this thread does not look at while it asks for another class.
    let ps: Vec<usize> = (0..64 * 64).map(|_| a.malloc(1024, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    let before = a.stats().small_spans;
    assert!(before >= 64, "{}", a.stats());
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for &p in &ps {
                a.free_any(p as *mut u8).unwrap();
            }
        });
    });
    // 16 spans' worth of 2 KiB objects (32 a span): the sweep before the new spans gives the
    // emptied 1 KiB spans back (all but the class's current one).
    let qs: Vec<usize> = (0..16 * 32).map(|_| a.malloc(2048, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(s.small_live_objects, qs.len() as u64, "{s}");
    assert!(s.small_spans <= 1 + 16 + 2, "{} spans held, {before} before the frees: {s}", s.small_spans);
    for q in qs {
        a.free_any(q as *mut u8).unwrap();
    }
    all_returned(&a);
}

#[test]
fn a_heap_keeps_a_few_spare_spans_over_all_classes() {
    let a = Allocator::new(cfg()).unwrap();
    // In each of 20 classes (sizes of a class each), two spans' worth of objects; then, with no new span taken after
    // (no sweep), the first span's objects of each class are freed: that span is empty and
    // not its class's current one.
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for size in [64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792] {
        let per_span = fallow::binding_support::objects_per_span(size);
        let ps: Vec<usize> = (0..2 * per_span).map(|_| a.malloc(size, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
        first.extend_from_slice(&ps[..per_span]);
        rest.extend_from_slice(&ps[per_span..]);
    }
    let spans = a.stats().small_spans;
    for p in first {
        a.free_any(p as *mut u8).unwrap();
    }
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(s.small_spare_spans, 4, "{s}");
    assert_eq!(s.small_spans, spans - 16, "{s}");
    for p in rest {
        a.free_any(p as *mut u8).unwrap();
    }
    all_returned(&a);
}

/// Spans come from the page layer's locked path and go back to it, never through a per-thread
/// page cache: the caches then hold no span memory, neither a refill's batch when spans are
/// made nor the spans given back (docs/design.md, "Spans and the page caches").
#[test]
fn spans_leave_no_memory_in_the_page_caches() {
    let a = Allocator::new(cfg()).unwrap();
    let b = a.clone();
    // Joined, not scoped: the thread's heap is given up by its thread-local destructor, which
    // a scope's end does not wait for.
    std::thread::spawn(move || {
        let objects: Vec<_> = (0..20_000).map(|i| b.malloc(16 + (i % 64) * 16, 16, Flags::NONE).unwrap()).collect();
        let made = b.stats();
        for p in objects {
            b.free_any(p.as_ptr()).unwrap();
        }
        let freed = b.stats();
        assert!(made.small_spans > 64, "{made}");
        assert_eq!((made.cached_pages, freed.cached_pages), (0, 0), "made: {made}\nfreed: {freed}");
    })
    .join()
    .unwrap();
    all_returned(&a);
}

#[test]
fn the_object_a_thread_freed_last_serves_its_next_request() {
    let a = Allocator::new(cfg()).unwrap();
    // A class's first span hands out a page of never-used objects at a time: without the
    // LIFO pop the request after a free took the next never-used one.
    let objects: Vec<_> = (0..8).map(|_| a.malloc(64, 16, Flags::NONE).unwrap().as_ptr()).collect();
    for &p in [objects[5], objects[2], objects[6]].iter() {
        a.free_any(p).unwrap();
    }
    // The frees come back last first.
    for want in [objects[6], objects[2], objects[5]] {
        assert_eq!(a.malloc(64, 16, Flags::NONE).unwrap().as_ptr(), want);
    }
    a.check_invariants().unwrap();
    for p in objects {
        a.free_any(p).unwrap();
    }
    all_returned(&a);
}
