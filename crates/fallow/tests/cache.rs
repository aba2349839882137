//! Per-thread page caches (issue 5): hits without the lock, frees from another thread, thread exit
//! returning every cached page, drain requests, double free of a cached block, zero-state kept in
//! the cache, allocators dropped while threads still hold cache entries.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use std::sync::mpsc;

use common::*;
use common::os;
use fallow::{Allocator, Config, Error, Flags, PageState, Tunables};

/// Workers off: these tests check exact states and counters, which the workers would change.
fn cfg() -> Config {
    Config { arena_size: 16 << 20, max_order: 8, thp: false, tunables: Tunables::off(), ..Config::default() }
}

/// Everything free, nothing cached, every free page listed, invariants and page states true.
fn all_returned(a: &Allocator) {
    let s = a.stats();
    assert_eq!(s.cached_pages, 0, "{s}");
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.live_blocks, 0);
    assert_eq!(s.alloc_calls, s.free_calls);
    assert_eq!(s.free_pages() * 4096, s.reserved_bytes);
    let listed: u64 = (0..3).map(|c| s.free_blocks[c].iter().enumerate().map(|(o, n)| n << o).sum::<u64>()).sum();
    assert_eq!(listed, s.free_pages());
    // With nothing live and nothing cached, every block merges back to the top order (but for
    // the last dirty run freed on the locked path, listed unmerged: buddy/deferred.rs).
    assert!(merged_to_top(&s, a.config().max_order), "{s}");
    a.check_invariants().unwrap();
    // SAFETY: every caller in this file has joined each other thread that used `a` first (a drainer, if any,
    // only requests drains), so no thread allocates from `a` meanwhile.
    unsafe { check_free_states(a) }.unwrap();
}

#[test]
fn hits_take_the_fast_path_and_stats_fold_per_thread_counters() {
    let a = Allocator::new(cfg()).unwrap();
    for _ in 0..1000 {
        for size in [4096, 8192, 16384, 32768] {
            let p = a.alloc(size, 4096, Flags::NONE).unwrap().as_ptr();
            // SAFETY: `p` is a live block of at least 4096 bytes from `alloc` above, not yet freed.
            unsafe { p.write(1) };
            a.free(p).unwrap();
        }
    }
    let s = a.stats();
    assert_eq!(s.alloc_calls, 4000);
    assert_eq!(s.free_calls, 4000);
    assert_eq!(s.bytes_in_use, 0);
    assert!(s.cached_pages > 0);
    // One refill per order at most: every other operation is a hit.
    assert!(s.cache_refills <= 4, "{s}");
    assert!(s.cache_hits >= 8000 - 4, "{s}");
    a.check_invariants().unwrap();
    // SAFETY: `a` is used by this thread only.
    unsafe { check_free_states(&a) }.unwrap();
    // Cached memory counts as free, by state, and in the per-order table.
    assert_eq!(s.free_pages() * 4096 + s.bytes_in_use + s.slack_bytes, s.reserved_bytes);
    a.drain_thread_cache();
    all_returned(&a);
}

#[test]
fn caches_off_takes_the_locked_path() {
    let a = Allocator::new(Config { cache: false, ..cfg() }).unwrap();
    let p = a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    let s = a.stats();
    assert_eq!((s.cache_hits, s.cache_refills, s.cached_pages), (0, 0, 0));
    all_returned(&a);
}

#[test]
fn free_on_another_thread_what_one_thread_allocated() {
    let a = Allocator::new(cfg()).unwrap();
    let (tx, rx) = mpsc::channel::<Vec<(usize, usize, u8)>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let producer = {
        let a = a.clone();
        std::thread::spawn(move || {
            for round in 0..20u8 {
                let mut batch = Vec::new();
                for i in 0..100usize {
                    let size = 4096 << (i % 4);
                    let zero = i % 3 == 0;
                    let p = a.alloc(size, 4096, if zero { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr();
                    if zero {
                        // SAFETY: `p` is a live block of `size` bytes just allocated, not yet sent to the consumer.
                        assert!(unsafe { all_zero(p, size) });
                    }
                    let v = round.wrapping_mul(7).wrapping_add(i as u8) | 1;
                    // SAFETY: `p` is that live block of `size` bytes, not yet sent.
                    unsafe { std::ptr::write_bytes(p, v, size) };
                    batch.push((p as usize, size, v));
                }
                tx.send(batch).unwrap();
            }
            drop(tx);
            // Stay alive (cache full of the consumer's... no: of our own refills) until the
            // consumer has freed everything, so that its frees cannot land in our cache.
            done_rx.recv().unwrap();
            assert!(a.stats().cached_pages > 0);
        })
    };
    let consumer = {
        let a = a.clone();
        std::thread::spawn(move || {
            for batch in rx {
                for (p, size, v) in batch {
                    // SAFETY: each entry of a batch is a live block of `size` bytes that the producer wrote before sending
                    // and no longer touches; this thread alone frees it, below.
                    assert!(unsafe { all_eq(p as *const u8, size, v) }, "block {p:#x} overwritten");
                    a.free(p as *mut u8).unwrap();
                    // A second free of a block now in this thread's cache is detected.
                    assert_eq!(a.free(p as *mut u8), Err(Error::DoubleFree { addr: p }));
                }
            }
            let s = a.stats();
            assert_eq!(s.bytes_in_use, 0, "{s}");
            assert_eq!(s.live_blocks, 0);
            assert!(s.cache_drains > 0, "frees beyond the high mark drain half: {s}");
            a.check_invariants().unwrap();
            done_tx.send(()).unwrap();
        })
    };
    consumer.join().unwrap();
    producer.join().unwrap();
    all_returned(&a);
}

#[test]
fn thread_exit_returns_every_cached_page() {
    let a = Allocator::new(cfg()).unwrap();
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..2000usize {
                    let size = 4096 << ((i + t) % 4);
                    let p = a.alloc(size, 4096, Flags::NONE).unwrap().as_ptr();
                    // SAFETY: `p` is a live block of at least 4096 bytes from `alloc` above, not yet freed.
                    unsafe { p.write(t as u8) };
                    held.push(p as usize);
                    if i % 3 != 0 {
                        a.free(held.swap_remove((i * 7) % held.len()) as *mut u8).unwrap();
                    }
                }
                for p in held {
                    a.free(p as *mut u8).unwrap();
                }
                let s = a.stats();
                assert!(s.cached_pages > 0, "{s}");
                s.cached_pages
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    all_returned(&a);
}

/// 64 one-page blocks allocated and freed into this thread's cache, then a drain request from
/// another thread (as the reporting worker makes it); nothing moves until this thread's next
/// free, or allocation that refills.
fn cache_64_pages_then_ask_to_drain(a: &Allocator) {
    let mut ps = Vec::new();
    for _ in 0..64 {
        ps.push(a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr());
    }
    for p in ps {
        a.free(p).unwrap();
    }
    assert!(a.stats().cached_pages >= 64);
    let b = a.clone();
    std::thread::spawn(move || b.request_cache_drain()).join().unwrap();
    assert!(a.stats().cached_pages >= 64);
}

#[test]
fn drain_request_is_obeyed_at_the_next_operation() {
    let a = Allocator::new(cfg()).unwrap();
    cache_64_pages_then_ask_to_drain(&a);
    let p = a.alloc(8192, 4096, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    // Drained everything, then this free cached one block of 2 pages (and the alloc refilled at
    // most a batch of order 1).
    let s = a.stats();
    assert!(s.cached_pages <= 2 + a.config().cache_batch_pages as u64, "{s}");
    assert_eq!(s.free_blocks.iter().map(|r| r[0]).sum::<u64>(), 0, "order-0 cache drained: {s}");
    a.drain_thread_cache();
    all_returned(&a);
}

/// The next call may be a free that the hit path would take: it sees the request all the same
/// (the cache's `drain_asked` flag) and drains first, rather than leave the reporter to drain a
/// cache whose owner keeps calling (and date blocks freed just before as idle since the request).
#[test]
fn drain_request_is_obeyed_at_the_next_free_hit() {
    let a = Allocator::new(cfg()).unwrap();
    let live = a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr();
    cache_64_pages_then_ask_to_drain(&a);
    // A free of a live one-page block: the hit path's case, but for the request.
    a.free(live).unwrap();
    let s = a.stats();
    assert_eq!(s.cached_pages, 1, "drained everything, then cached the block just freed: {s}");
    a.drain_thread_cache();
    all_returned(&a);
}

#[test]
fn double_and_invalid_frees_of_cached_blocks_are_detected() {
    let a = Allocator::new(cfg()).unwrap();
    let p = a.alloc(16384, 4096, Flags::NONE).unwrap().as_ptr();
    let q = a.alloc(16384, 4096, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    assert_eq!(a.free(p), Err(Error::DoubleFree { addr: p as usize }));
    assert_eq!(a.free_sized(p, 16384), Err(Error::DoubleFree { addr: p as usize }));
    assert_eq!(a.usable_size(p), None);
    // From another thread too.
    let b = a.clone();
    let pu = p as usize;
    let r = std::thread::spawn(move || b.free(pu as *mut u8)).join().unwrap();
    assert_eq!(r, Err(Error::DoubleFree { addr: pu }));
    // Interior pages and a wrong size of a block of a cached order take the checked path.
    assert_eq!(
        // SAFETY: `q` is a live block of 16384 bytes, so `q + 4096` is inside it.
        a.free(unsafe { q.add(4096) }),
        Err(Error::InteriorPointer { addr: q as usize + 4096, block: q as usize })
    );
    assert_eq!(a.free_sized(q, 4096), Err(Error::SizeMismatch { addr: q as usize, given: 4096, actual: 16384 }));
    a.free_sized(q, 16000).unwrap();
    // A block refilled into the cache but never handed out is not a live block.
    let r = a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr();
    let cached_free: Vec<_> = a
        .free_runs()
        .into_iter()
        .filter(|&(addr, _, _)| addr != r as usize && addr.abs_diff(r as usize) < (64 << 12))
        .collect();
    assert!(!cached_free.is_empty());
    for (addr, _, _) in cached_free {
        assert!(matches!(a.free(addr as *mut u8), Err(Error::InvalidPointer { .. } | Error::DoubleFree { .. })));
    }
    a.free(r).unwrap();
    let s = a.stats();
    assert_eq!((s.alloc_calls, s.free_calls, s.live_blocks), (3, 3, 0));
    a.check_invariants().unwrap();
    a.drain_thread_cache();
    all_returned(&a);
}

#[test]
fn cached_blocks_keep_their_page_states_for_zero_requests() {
    // 1 MiB arena, no growth needed: 256 pages.
    let a = Allocator::new(Config { arena_size: 1 << 20, max_order: 8, thp: false, ..Config::default() }).unwrap();
    // Reported (never touched) blocks in the cache read zero: a ZERO hit skips the memset.
    let p = a.alloc(4096, 4096, Flags::ZERO).unwrap().as_ptr();
    let s = a.stats();
    assert_eq!((s.zero_skipped_bytes, s.zeroed_on_alloc_bytes), (4096, 0));
    assert!(s.free_reported_pages > 0 && s.cached_pages > 0);
    // SAFETY: `p` is a live block of 4096 bytes from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(p, 0xab, 4096) };
    a.free(p).unwrap(); // dirty, in the cache
    // In the locked path's order of preference: a ZERO request takes a Zeroed block, else the
    // dirty block with a memset of exactly its page (cheaper than faulting a reported page in)...
    let z = a.alloc(4096, 4096, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(z, p);
    // SAFETY: `z` is a live 4096-byte block from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(z, 4096) });
    assert_eq!(a.stats().zeroed_on_alloc_bytes, 4096);
    // ...and with no dirty block cached, reported memory, for plain and ZERO requests alike.
    let reused = a.stats().reused_reported_bytes;
    let d = a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr();
    assert_ne!(d, p);
    assert_eq!(a.stats().reused_reported_bytes, reused + 4096);
    let r = a.alloc(4096, 4096, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `r` is a live 4096-byte block from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(r, 4096) });
    assert_eq!(a.stats().zeroed_on_alloc_bytes, 4096);
    assert_eq!(a.stats().zero_skipped_bytes, 2 * 4096);
    a.free(z).unwrap();
    a.free(d).unwrap();
    a.free(r).unwrap();
    // Make every page dirty: take the whole arena page by page, write, free.
    let mut all = Vec::new();
    while let Ok(p) = a.alloc(4096, 4096, Flags::NONE) {
        if a.stats().arenas > 1 {
            a.free(p.as_ptr()).unwrap();
            break;
        }
        // SAFETY: `p` is a live 4096-byte block from `alloc` above, freed only below.
        unsafe { std::ptr::write_bytes(p.as_ptr(), 0xcd, 4096) };
        all.push(p.as_ptr());
    }
    for p in all {
        a.free(p).unwrap();
    }
    // Only the second (fresh) arena holds zero-reading pages; drop it from consideration by
    // checking the counters: every ZERO block from a dirty page is memset and counted.
    let before = a.stats();
    let mut got = Vec::new();
    for _ in 0..300 {
        let p = a.alloc(4096, 4096, Flags::ZERO).unwrap().as_ptr();
        // SAFETY: `p` is a live 4096-byte block from `alloc` above, used by this thread only.
        assert!(unsafe { all_zero(p, 4096) }, "ZERO block {p:?} holds data");
        got.push(p);
    }
    let after = a.stats();
    let memset = after.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes;
    let skipped = after.zero_skipped_bytes - before.zero_skipped_bytes;
    assert_eq!(memset + skipped, 300 * 4096);
    assert!(memset > 0, "dirty cached or listed pages were memset: {after}");
    for p in got {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
    // SAFETY: `a` is used by this thread only.
    unsafe { check_free_states(&a) }.unwrap();
    a.drain_thread_cache();
    all_returned(&a);
}

#[test]
fn allocators_dropped_while_a_thread_holds_cache_entries() {
    // One thread uses many allocators (more than its table of slots), some dropped while its
    // cache of them still holds blocks; live ones evicted from the table are drained.
    std::thread::spawn(|| {
        let keep: Vec<Allocator> = (0..12).map(|_| Allocator::new(cfg()).unwrap()).collect();
        for round in 0..3 {
            for a in &keep {
                let p = a.alloc(4096 << (round % 4), 4096, Flags::NONE).unwrap().as_ptr();
                // SAFETY: `p` is a live block of at least 4096 bytes from `alloc` above, not yet freed.
                unsafe { p.write(1) };
                a.free(p).unwrap();
            }
            // Transient allocators: used, then dropped with entries in this thread's cache.
            for _ in 0..10 {
                let t = Allocator::new(cfg()).unwrap();
                let p = t.alloc(8192, 4096, Flags::NONE).unwrap().as_ptr();
                t.free(p).unwrap();
                assert!(t.stats().cached_pages > 0);
                drop(t);
            }
        }
        for a in &keep {
            a.check_invariants().unwrap();
            let s = a.stats();
            assert_eq!(s.bytes_in_use, 0);
            assert_eq!(s.alloc_calls, 3);
        }
        // Dropped on another thread while this one still has cache entries of them.
        let moved = keep.clone();
        std::thread::spawn(move || drop(moved)).join().unwrap();
        drop(keep);
        // This thread exits with stale entries: nothing touched, nothing freed twice.
    })
    .join()
    .unwrap();
    // And an allocator that outlives the thread gets everything back at its exit.
    let a = Allocator::new(cfg()).unwrap();
    let b = a.clone();
    std::thread::spawn(move || {
        for _ in 0..10 {
            let p = b.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr();
            b.free(p).unwrap();
        }
    })
    .join()
    .unwrap();
    all_returned(&a);
}

#[test]
fn page_states_of_cached_blocks_are_listed_by_free_runs() {
    let a = Allocator::new(cfg()).unwrap();
    let p = a.alloc(32768, 4096, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live 32 KiB block from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(p, 3, 32768) };
    a.free(p).unwrap();
    let runs = a.free_runs();
    assert!(runs.iter().any(|&(addr, len, s)| addr == p as usize && len == 32768 && s == PageState::Dirty));
    let total: usize = runs.iter().map(|r| r.1).sum();
    assert_eq!(total as u64, a.stats().free_pages() * 4096);
    // SAFETY: `a` is used by this thread only.
    unsafe { check_free_states(&a) }.unwrap();
}

#[test]
fn bad_cache_settings_are_refused() {
    for (c, setting) in [
        (Config { cache_max_order: 12, ..cfg() }, "cache_max_order"),
        (Config { cache_high_pages: 0, ..cfg() }, "cache_high_pages"),
        (Config { cache_batch_pages: 0, ..cfg() }, "cache_batch_pages"),
        (Config { cache_batch_pages: 256, cache_high_pages: 128, ..cfg() }, "cache_batch_pages"),
    ] {
        match Allocator::new(c) {
            Err(Error::Config { setting: s, .. }) => assert_eq!(s, setting),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("{setting} accepted"),
        }
    }
}

#[test]
fn blocks_passed_between_threads_while_drains_are_requested() {
    let a = Allocator::new(cfg()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drainer = {
        let (a, stop) = (a.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                a.request_cache_drain();
                std::thread::yield_now();
            }
        })
    };
    // A ring of three threads: each allocates, checks what it receives and frees it.
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| mpsc::channel::<(usize, usize, u8)>()).unzip();
    let mut rxs: Vec<_> = rxs.into_iter().map(Some).collect();
    let hs: Vec<_> = (0..3)
        .map(|t| {
            let a = a.clone();
            let tx = txs[(t + 1) % 3].clone();
            let rx = rxs[t].take().unwrap();
            std::thread::spawn(move || {
                for i in 0..3000usize {
                    let size = 4096 << ((i * 7 + t) % 5); // orders 0..4: cached and not
                    let zero = i % 4 == 0;
                    let p = a.alloc(size, 4096, if zero { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr();
                    if zero {
                        // SAFETY: `p` is a live block of `size` bytes just allocated, not yet sent to the next thread.
                        assert!(unsafe { all_zero(p, size) });
                    }
                    let v = (i as u8) | 1;
                    // SAFETY: `p` is that live block of `size` bytes, not yet sent.
                    unsafe { std::ptr::write_bytes(p, v, size) };
                    tx.send((p as usize, size, v)).unwrap();
                    while let Ok((q, len, w)) = rx.try_recv() {
                        // SAFETY: a received block is live (`len` bytes), written by its sender before sending and no longer
                        // touched by it; this thread alone frees it, below.
                        assert!(unsafe { all_eq(q as *const u8, len, w) }, "block {q:#x} overwritten");
                        a.free(q as *mut u8).unwrap();
                    }
                }
                drop(tx);
                for (q, len, w) in rx {
                    // SAFETY: as above: a live block of `len` bytes, handed over to this thread.
                    assert!(unsafe { all_eq(q as *const u8, len, w) });
                    a.free(q as *mut u8).unwrap();
                }
            })
        })
        .collect();
    drop(txs);
    for h in hs {
        h.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drainer.join().unwrap();
    all_returned(&a);
}

#[test]
fn fork_child_keeps_working_with_other_threads_caches_frozen() {
    let a = Allocator::new(cfg()).unwrap();
    // Another thread holds cache entries while this one forks.
    let (hold_tx, hold_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let other = {
        let a = a.clone();
        std::thread::spawn(move || {
            let p = a.alloc(8192, 4096, Flags::NONE).unwrap().as_ptr();
            a.free(p).unwrap();
            ready_tx.send(()).unwrap();
            hold_rx.recv().unwrap();
        })
    };
    ready_rx.recv().unwrap();
    let p = a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    a.before_fork();
    // SAFETY: `a.before_fork()` was called just above, so that the child (one thread) can take `a` over
    // with `after_fork_child`; it uses nothing else and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child of the `fork` just after `before_fork`, with one thread.
        unsafe { a.after_fork_child() };
        let ok = (|| {
            let mut ps = Vec::new();
            for i in 0..200usize {
                ps.push(a.alloc(4096 << (i % 4), 4096, Flags::ZERO).ok()?.as_ptr());
            }
            for p in ps {
                a.free(p).ok()?;
            }
            a.check_invariants().ok()?;
            let s = a.stats();
            (s.bytes_in_use == 0 && s.cached_pages > 0).then_some(())
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
    a.drain_thread_cache();
    all_returned(&a);
}

#[test]
fn thread_exit_then_reporting_gives_every_cached_page_back_to_the_kernel() {
    // Reporting on (tiny delay, 1 MiB blocks): pages cached by threads that exit are drained and
    // then reported, so the kernel (mincore) and the statistics agree that nothing stays resident.
    let t = Tunables { report: true, report_delay_ms: 10, report_order: 8, zeroing: false, ..Tunables::off() };
    let a = Allocator::new(Config { tunables: t, arena_size: 128 << 20, ..cfg() }).unwrap();
    let hs: Vec<_> = (0..3)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..600usize {
                    let size = 4096 << ((i + t) % 4);
                    let p = a.alloc(size, 4096, Flags::NONE).unwrap().as_ptr();
                    // SAFETY: `p` is a live block of `size` bytes from `alloc` above, not yet freed.
                    unsafe { std::ptr::write_bytes(p, 0x5a, size) };
                    held.push(p as usize);
                }
                for p in held {
                    a.free(p as *mut u8).unwrap();
                }
                assert!(a.stats().cached_pages > 0);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(a.stats().arenas, 1);
    let base = a.free_runs().iter().map(|r| r.0).min().unwrap();
    let len = a.stats().reserved_bytes as usize;
    let t0 = std::time::Instant::now();
    loop {
        let s = a.stats();
        let resident = os::resident_pages(base, len).unwrap();
        if s.cached_pages == 0 && s.free_reported_pages * 4096 == s.reserved_bytes && resident == 0 {
            break;
        }
        assert!(t0.elapsed().as_secs() < 180, "not all reported: {resident} resident pages\n{s}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    a.check_invariants().unwrap();
    // SAFETY: the threads that allocated from `a` have been joined above (its reporting worker may run).
    unsafe { check_free_states(&a) }.unwrap();
}
