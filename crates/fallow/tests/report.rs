//! Free page reporting (issue 3): resident size falls, reported memory serves ZERO without a
//! memset, young memory is not reported, concurrency, MADV_FREE never counts as zeroed,
//! validated tunables. No timing is asserted: waits are bounded polls for liveness only.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::wait_for;
use std::time::{Duration, Instant};

use common::os;
use fallow::{Allocator, Config, Error, Flags, MemoryLimit, PageState, ReportMode, Tunables};

const PAGE: usize = 4096;

/// 16 MiB blocks on 4 KiB pages (no huge pages: these tests count resident and reported pages one
/// by one, below a huge page too).
fn config(t: Tunables) -> Config {
    Config { arena_size: 256 << 20, max_order: 12, thp: false, tunables: t, ..Config::default() }
}

/// Reporting by the delay alone: no memory limit and no pressure signal, which would make the
/// reporter hurry past the delay and the floors whenever this machine saw a PSI event or the
/// test ran in a memory cgroup near its limit (their own tests: memory_limit.rs).
fn reporting(delay_ms: u32) -> Tunables {
    Tunables {
        report: true,
        report_delay_ms: delay_ms,
        zeroing: false,
        memory_limit: MemoryLimit::Off,
        pressure: false,
        ..Tunables::default()
    }
}

/// Write `byte` over the `len` bytes at `p`.
///
/// # Safety
/// `p` is valid for writes of `len` bytes (a live block of at least `len` bytes) that no other
/// thread reads or writes during the call.
unsafe fn fill(p: *mut u8, len: usize, byte: u8) {
    // SAFETY: the caller guarantees that `[p, p + len)` is writable and used by no one else.
    unsafe { core::ptr::write_bytes(p, byte, len) };
}

/// Whether the `len` bytes at `p` all equal `byte`.
///
/// # Safety
/// `p` is valid for reads of `len` bytes (a live block, or the parent's copy of one after a
/// fork) that no other thread writes during the call.
unsafe fn all_bytes(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: the caller guarantees that `[p, p + len)` is readable and not written meanwhile.
    unsafe { std::slice::from_raw_parts(p, len) }.iter().all(|&b| b == byte)
}

fn resident_bytes(p: *const u8, len: usize) -> usize {
    os::resident_pages(p as usize, len).unwrap() * PAGE
}

#[test]
fn resident_size_falls_and_reported_memory_is_zero_without_memset() {
    let a = Allocator::new(config(reporting(50))).unwrap();
    assert!(a.workers_running().0);
    let len = 128 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    unsafe { fill(p, len, 0x5a) };
    assert_eq!(resident_bytes(p, len), len);
    a.free(p).unwrap();
    wait_for("128 MiB reported", || a.stats().reported_bytes >= len as u64);
    a.check_invariants().unwrap();
    // Measured by the kernel, not by our counters.
    assert_eq!(resident_bytes(p, len), 0, "reported memory is still resident");
    let s = a.stats();
    assert!(s.report_batches > 0 && s.report_calls > 0);
    // Exactly the pages written were reported, once each (the rest of the arena was never
    // resident), and every free page is now recorded as reported.
    assert_eq!(s.reported_bytes, len as u64, "reported bytes count pages that were not resident, or some twice");
    assert_eq!(s.free_pages() * PAGE as u64, s.reserved_bytes);
    assert_eq!(s.free_reported_pages, s.free_pages(), "{s}");
    let runs = a.free_runs();
    assert!(runs.iter().all(|r| r.2 == PageState::Reported), "a free page is not recorded reported");
    assert_eq!(runs.iter().map(|r| r.1).sum::<usize>() as u64, s.reserved_bytes);

    let memset_before = a.stats().zeroed_on_alloc_bytes;
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) }, "reported memory handed out for ZERO does not read zero");
    let s = a.stats();
    assert_eq!(s.zeroed_on_alloc_bytes, memset_before, "reported memory was memset for ZERO");
    assert!(s.reported_blocks_reused > 0);
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

use os::resident_set_bytes as rss;

#[test]
fn reporting_lowers_the_process_resident_set() {
    // As the kernel accounts it for the whole process (`/proc/self/statm`), not per range: in a
    // child, where no other test allocates meanwhile, 128 MiB written then freed raise the
    // resident set by about 128 MiB, and reporting takes about as much off it again. The
    // tolerance (16 MiB) covers what the child's own bookkeeping and the workers touch.
    const TOL: usize = 16 << 20;
    common::in_child(|| {
        let a = Allocator::new(config(reporting(50))).unwrap();
        let len = 128 << 20;
        let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
        let rss0 = rss();
        // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
        unsafe { fill(p, len, 0x3c) };
        let rss1 = rss();
        if rss1 < rss0 + len - TOL {
            return Err(format!("writing 128 MiB raised the resident set by {} MiB only", (rss1 - rss0) >> 20));
        }
        a.free(p).unwrap();
        wait_for("128 MiB reported", || a.stats().reported_bytes >= len as u64);
        let rss2 = rss();
        if rss2 + len > rss1 + TOL {
            return Err(format!("reporting 128 MiB lowered the resident set by {} MiB only", rss1.saturating_sub(rss2) >> 20));
        }
        drop(a); // joins the workers before the child exits
        Ok(())
    });
}

#[test]
fn resident_floor_is_kept() {
    let floor = 32 << 20;
    let t = Tunables { resident_free_min: floor, ..reporting(20) };
    let a = Allocator::new(config(t)).unwrap();
    let len = 128 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    unsafe { fill(p, len, 1) };
    a.free(p).unwrap();
    wait_for("96 MiB reported", || a.stats().reported_bytes >= (len - floor) as u64);
    // Give the reporter every chance to (wrongly) go below the floor.
    std::thread::sleep(Duration::from_millis(300));
    let r = resident_bytes(p, len);
    assert!(r >= floor, "resident {r} below the floor {floor}");
    assert!(r < floor + (16 << 20), "resident {r}: reporting stopped early");
    a.check_invariants().unwrap();
}

#[test]
fn memory_reused_within_the_delay_is_not_reported() {
    let a = Allocator::new(config(reporting(30_000))).unwrap();
    let len = 32 << 20;
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < Duration::from_millis(400) || rounds < 10 {
        let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
        // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
        unsafe { fill(p, len, rounds as u8) };
        a.free(p).unwrap();
        rounds += 1;
    }
    // The block freed last is still resident and still holds its data.
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(resident_bytes(p, len), len);
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(p, len, (rounds - 1) as u8) });
    a.free(p).unwrap();
    let s = a.stats();
    assert_eq!(s.reported_bytes, 0);
    assert_eq!(s.report_batches, 0);
    a.check_invariants().unwrap();
}

#[test]
fn concurrent_alloc_free_while_reporting_in_tight_loops() {
    let t = Tunables { report_order: 2, report_batch: 4, ..reporting(0) };
    let a = Allocator::new(config(t)).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|id| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut seed = 0x9e3779b97f4a7c15u64 ^ id;
                let mut live: Vec<(usize, usize, u64)> = Vec::new();
                let t0 = Instant::now();
                for i in 0.. {
                    if i >= 3000 && i % 64 == 0 {
                        // Run until the workers have run beside us (they get idle time only).
                        let s = a.stats();
                        if (s.report_batches > 0) || t0.elapsed() > Duration::from_secs(180) {
                            break;
                        }
                        // The workers step only while a CPU is idle: leave one idle now and then.
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let pages = 1 + (seed % 96) as usize;
                    let len = pages * PAGE;
                    let zero = seed & 0x100 != 0;
                    let flags = if zero { Flags::ZERO } else { Flags::NONE };
                    let p = a.alloc(len, PAGE, flags).unwrap().as_ptr() as usize;
                    // SAFETY: `p` is a live block of `len` bytes (a multiple of 8, page-aligned) just allocated, which
                    // only this thread uses; no other reference to it exists.
                    let words = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, len / 8) };
                    if zero {
                        assert!(words.iter().all(|&w| w == 0), "ZERO block not zero");
                    }
                    let pat = (id << 56) | i as u64;
                    for (k, w) in words.iter_mut().enumerate().step_by(61) {
                        *w = pat ^ k as u64;
                    }
                    live.push((p, len, pat));
                    if i % 16 == 0 {
                        // Leave idle time: the workers run only while a CPU is idle.
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    if live.len() > 8 || seed & 1 == 0 {
                        let (q, l, pat) = live.remove((seed as usize >> 9) % live.len());
                        // SAFETY: `q` came from `live`: a block of `l` bytes (page-aligned) this thread allocated and has not
                        // freed, with no other reference to it.
                        let words = unsafe { std::slice::from_raw_parts(q as *const u64, l / 8) };
                        for (k, w) in words.iter().enumerate().step_by(61) {
                            assert_eq!(*w, pat ^ k as u64, "pattern lost at word {k} of {q:#x}");
                        }
                        a.free(q as *mut u8).unwrap();
                    }
                }
                for (q, l, pat) in live {
                    // SAFETY: as above: a live block of `l` bytes this thread holds, page-aligned.
                    let words = unsafe { std::slice::from_raw_parts(q as *const u64, l / 8) };
                    for (k, w) in words.iter().enumerate().step_by(61) {
                        assert_eq!(*w, pat ^ k as u64);
                    }
                    a.free(q as *mut u8).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    a.check_invariants().unwrap();
    assert!(a.stats().report_batches > 0, "the reporter never ran");
}

#[test]
fn madv_free_mode_never_counts_as_zeroed() {
    let t = Tunables { report_mode: ReportMode::Free, ..reporting(0) };
    let a = Allocator::new(config(t)).unwrap();
    let len = 64 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    unsafe { fill(p, len, 0xab) };
    a.free(p).unwrap();
    wait_for("64 MiB lazily freed", || a.stats().reported_bytes >= len as u64);
    let runs = a.free_runs();
    let lazy_in = |lo: usize, hi: usize| -> usize {
        runs.iter()
            .filter(|r| r.2 == PageState::LazyFree)
            .map(|&(s, l, _)| (s + l).min(hi).saturating_sub(s.max(lo)))
            .sum()
    };
    assert_eq!(lazy_in(p as usize, p as usize + len), len, "MADV_FREE'd pages not recorded lazy-free");
    assert!(runs.iter().all(|r| r.2 != PageState::Zeroed));
    let cleared = |s: &fallow::Stats| s.zeroed_on_alloc_bytes + s.zero_unwritten_bytes;
    let before = cleared(&a.stats());
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) });
    // By a memset, or (64 MiB) left as they are where the kernel dropped them.
    let cleared = cleared(&a.stats()) - before;
    assert_eq!(cleared as usize, lazy_in(q as usize, q as usize + len), "lazily freed pages were not cleared");
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn tunables_are_validated_and_change_at_run_time() {
    let a = Allocator::new(config(Tunables::off())).unwrap();
    assert_eq!(a.workers_running(), (false, false));
    let bad = |t: Tunables, name: &str| match a.set_tunables(t) {
        Err(Error::Config { setting, message }) => {
            assert_eq!(setting, name);
            assert!(message.contains("must") || message.contains("accepted"), "{message}");
        }
        other => panic!("{name}: expected a config error, got {other:?}"),
    };
    bad(Tunables { report_batch: 0, ..Tunables::default() }, "report_batch");
    bad(Tunables { report_batch: 1000, ..Tunables::default() }, "report_batch");
    bad(Tunables { report_order: 31, ..Tunables::default() }, "report_order");
    bad(Tunables { report_mode: ReportMode::Punch, ..Tunables::default() }, "report_mode");
    bad(Tunables { zero_chunk: 3 << 20, ..Tunables::default() }, "zero_chunk");
    bad(Tunables { zero_order: 40, ..Tunables::default() }, "zero_order");
    assert_eq!(a.tunables(), Tunables::off(), "a refused setting changed something");

    // Switch reporting on at run time: the worker starts and reports.
    let len = 32 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    unsafe { fill(p, len, 7) };
    a.free(p).unwrap();
    a.set_tunables(reporting(0)).unwrap();
    assert!(a.workers_running().0);
    wait_for("reported after switching on", || a.stats().reported_bytes >= len as u64);
    assert_eq!(resident_bytes(p, len), 0);
    a.check_invariants().unwrap();
}

#[test]
fn memfd_backing_reports_by_punching_holes() {
    let c = Config { backing: fallow::Backing::Memfd, ..config(reporting(0)) };
    let a = Allocator::new(c).unwrap();
    let len = 32 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    unsafe { fill(p, len, 9) };
    a.free(p).unwrap();
    wait_for("memfd pages punched", || a.stats().reported_bytes >= len as u64);
    assert_eq!(resident_bytes(p, len), 0);
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) });
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn last_handle_stops_the_workers() {
    for _ in 0..5 {
        let a = Allocator::new(config(Tunables { zeroing: true, ..reporting(0) })).unwrap();
        let b = a.clone();
        let p = b.alloc(8 << 20, PAGE, Flags::NONE).unwrap();
        b.free(p.as_ptr()).unwrap();
        drop(a);
        assert!(b.workers_running().0);
        drop(b); // joins both workers; a hang here fails the test by timeout
    }
}

#[test]
fn fork_child_gets_its_own_reporter() {
    let a = Allocator::new(config(reporting(0))).unwrap();
    let len = 16 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, used by this thread only.
    unsafe { fill(p, len, 3) };
    a.before_fork();
    // SAFETY: `a.before_fork()` was called just above, so that the child (one thread) can take `a` over
    // with `after_fork_child`; it uses nothing else and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child of the `fork` just after `before_fork`, with one thread.
        unsafe { a.after_fork_child() };
        let ok = (|| {
            if a.workers_running().0 {
                return Some(false);
            }
            a.free(p).ok()?; // restarts the reporter lazily
            let t0 = Instant::now();
            while a.stats().reported_bytes < len as u64 {
                if t0.elapsed() > Duration::from_secs(180) {
                    return Some(false);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            a.check_invariants().ok()?;
            Some(resident_bytes(p, len) == 0 && a.workers_running().0)
        })()
        .unwrap_or(false);
        // SAFETY: leaves the child at once, without running the parent's test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    // SAFETY: this thread called `before_fork` just before the `fork`.
    unsafe { a.after_fork_parent() };
    let mut status = 0;
    // SAFETY: `pid` is the child forked above, not yet waited for; `status` is writable.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status}");
    // SAFETY: in the parent `p` is still a live block of `len` bytes (only the child's copy was freed).
    assert!(unsafe { all_bytes(p, len, 3) }, "the child's reporting touched the parent's memory");
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn thp_arenas_report_whole_huge_pages_only() {
    let bad = Config { thp: true, max_order: 10, tunables: Tunables { report_order: 8, ..reporting(0) }, ..config(reporting(0)) };
    match Allocator::new(bad) {
        Err(Error::Config { setting, .. }) => assert_eq!(setting, "report_order"),
        other => panic!("thp with report_order 8 accepted: {:?}", other.map(|_| ())),
    }
    let c = Config { thp: true, max_order: 10, arena_size: 64 << 20, ..config(reporting(0)) };
    let a = Allocator::new(c).unwrap();
    // Half of a huge page freed while the other half is live: never reported.
    let big = a.alloc(2 << 20, 2 << 20, Flags::POPULATE).unwrap().as_ptr();
    // SAFETY: `big` is a live block of 2 MiB from `alloc` above, used by this thread only.
    unsafe { fill(big, 2 << 20, 1) };
    assert!(a.resize_in_place(big, 1 << 20).unwrap());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.stats().reported_bytes, 0, "a block below 2 MiB was reported");
    // SAFETY: `big` was a 2 MiB block before the shrink, so `big + 1 MiB` is inside the same arena mapping.
    assert_eq!(resident_bytes(unsafe { big.add(1 << 20) }, 1 << 20), 1 << 20);
    // The 2 MiB block goes to this thread's cache, which the reporter drains while the thread
    // waits here (it makes no call that would answer the drain request).
    a.free(big).unwrap();
    wait_for("the 2 MiB block reported", || a.stats().reported_bytes >= 2 << 20);
    assert_eq!(a.stats().reported_bytes % (2 << 20), 0, "part of a huge page was reported");
    assert_eq!(resident_bytes(big, 2 << 20), 0);
    a.check_invariants().unwrap();
}

#[test]
fn workers_run_under_sched_batch() {
    // SCHED_BATCH with their own idle-CPU check (worker/mod.rs, IdleGate), SCHED_IDLE where
    // /proc/loadavg cannot be read: a starved SCHED_IDLE thread delays the process's exit.
    let expected = if std::fs::read_to_string("/proc/loadavg").is_ok() { libc::SCHED_BATCH } else { libc::SCHED_IDLE };
    let a = Allocator::new(config(Tunables { zeroing: true, ..reporting(0) })).unwrap();
    let mut found = Vec::new();
    wait_for("both workers named and scheduled", || {
        found.clear();
        for e in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = e.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let name = comm.trim();
            if name == "fallow-report" || name == "fallow-zero" {
                let tid: i32 = dir.file_name().unwrap().to_str().unwrap().parse().unwrap();
                // SAFETY: `sched_getscheduler` only reads the policy of thread `tid` (an error if it has
                // exited meanwhile); no memory of ours is involved.
                let policy = unsafe { libc::sched_getscheduler(tid) };
                found.push((name.to_string(), policy));
            }
        }
        found.len() >= 2 && found.iter().all(|(_, p)| *p == expected)
    });
    drop(a);
}

#[test]
fn an_idle_threads_cache_is_drained_and_reported() {
    let a = Allocator::new(config(reporting(50))).unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let blocks = std::thread::scope(|sc| {
        let a = &a;
        let t = sc.spawn(move || {
            // Two 2 MiB blocks and sixteen 4 KiB ones, written, freed into this thread's cache.
            let sizes = [2 << 20, 2 << 20].into_iter().chain(std::iter::repeat_n(PAGE, 16));
            let v: Vec<(usize, usize)> = sizes.map(|n| (a.alloc(n, PAGE, Flags::NONE).unwrap().as_ptr() as usize, n)).collect();
            for &(p, n) in &v {
                // SAFETY: each `(p, n)` of `v` is a live block of `n` bytes just allocated on this thread, not yet freed.
                unsafe { fill(p as *mut u8, n, 7) };
            }
            for &(p, _) in &v {
                a.free(p as *mut u8).unwrap();
            }
            ready_tx.send(v.clone()).unwrap();
            // Idle, alive, holding its cache, until told to go on.
            go_rx.recv().unwrap();
            // The cache works as before after the reporter drained it.
            for _ in 0..1000 {
                let p = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap().as_ptr();
                // SAFETY: `p` is a live block of one page from `alloc` above, used by this thread only.
                assert!(unsafe { all_bytes(p, PAGE, 0) });
                // SAFETY: `p` is a live block of one page from `alloc` above, used by this thread only.
                unsafe { fill(p, PAGE, 9) };
                a.free(p).unwrap();
            }
            v
        });
        let v = ready_rx.recv().unwrap();
        // (The second 2 MiB block reached the high mark; the first 4 KiB free drained to half.)
        assert!(a.stats().cached_pages >= 512, "{}", a.stats());
        wait_for("the idle thread's cache drained and its blocks reported", || {
            let s = a.stats();
            s.cached_pages == 0 && v.iter().all(|&(p, n)| resident_bytes(p as *const u8, n) == 0)
        });
        assert!(a.stats().cache_remote_drains >= 1);
        a.check_invariants().unwrap();
        go_tx.send(()).unwrap();
        t.join().unwrap()
    });
    assert_eq!(blocks.len(), 18);
    a.check_invariants().unwrap();
}

#[test]
fn threads_that_pause_while_the_reporter_drains_their_caches_keep_their_data() {
    // Delay 0: the reporter asks, then drains unanswered caches at once, as often as it can,
    // while the threads alternate bursts and pauses. A block handed out twice, or drained while
    // its owner used it, would show up as a broken pattern or a failed invariant.
    // The threads go on (past 200 rounds) until the reporter has drained idle caches at least
    // four times while they ran, so that the race this test is about did take place (a liveness
    // bound of 180 s, not a timing).
    let a = Allocator::new(config(reporting(0))).unwrap();
    let t0 = Instant::now();
    let raced = || a.stats().cache_remote_drains >= 4 || t0.elapsed() > Duration::from_secs(180);
    std::thread::scope(|sc| {
        for t in 0..2u8 {
            let (a, raced) = (&a, &raced);
            sc.spawn(move || {
                let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
                for round in 0u32.. {
                    if round >= 200 && round % 20 == 0 && raced() {
                        break;
                    }
                    for i in 0..32usize {
                        let n = PAGE << ((i + round as usize) % 10);
                        let p = a.alloc(n, PAGE, if i % 3 == 0 { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr();
                        if i % 3 == 0 {
                            // SAFETY: `p` is a live block of `n` bytes from `alloc` above, used by this thread only.
                            assert!(unsafe { all_bytes(p, n, 0) }, "a ZERO block holds data");
                        }
                        let tag = (t * 100).wrapping_add(i as u8);
                        // SAFETY: `p` is a live block of `n` bytes from `alloc` above, used by this thread only.
                        unsafe { fill(p, n, tag) };
                        live.push((p, n, tag));
                    }
                    // Free most of them, keep a few live across the pause.
                    for (p, n, tag) in live.drain(4..) {
                        // SAFETY: each entry of `live` is a block of `n` bytes this thread allocated and has not freed.
                        assert!(unsafe { all_bytes(p, n, tag) }, "block {p:?} changed under its owner");
                        a.free(p).unwrap();
                    }
                    if round % 20 == 0 {
                        // Longer pauses past 200 rounds: the reporter drains only caches whose
                        // threads stay out of the allocator, and steps only while a CPU is idle.
                        std::thread::sleep(Duration::from_millis(if round < 200 { 5 } else { 30 }));
                    }
                }
                for (p, n, tag) in live {
                    // SAFETY: as above: a live block of `n` bytes held by this thread.
                    assert!(unsafe { all_bytes(p, n, tag) });
                    a.free(p).unwrap();
                }
            });
        }
    });
    a.check_invariants().unwrap();
    let s = a.stats();
    assert!(s.cache_remote_drains >= 4, "the reporter drained idle caches only {} times in 180 s", s.cache_remote_drains);
    assert_eq!((s.bytes_in_use, s.live_blocks), (0, 0));
}

/// A dirty block of 32 MiB or more goes back after a tenth of the delay; a smaller one waits for
/// the whole delay, even if freed first (without the rule it would go first: by the delay the
/// reporter takes the smallest order first, the oldest first).
#[test]
fn a_big_dirty_block_goes_back_after_a_tenth_of_the_delay() {
    let a = Allocator::new(Config { max_order: 14, ..config(reporting(60_000)) }).unwrap();
    // 40 MiB freed in all: under the 64 MiB that makes every dirty block go sooner.
    let (small, big) = (8 << 20, 32 << 20);
    // The small block, a live guard beside it (its buddy: the two never merge), the big block.
    let q = a.alloc(small, PAGE, Flags::NONE).unwrap().as_ptr();
    let guard = a.alloc(small, PAGE, Flags::NONE).unwrap().as_ptr();
    let p = a.alloc(big, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(guard as usize ^ q as usize, small, "the guard is not the small block's buddy");
    // SAFETY: `q` and `p` are live blocks of `small` and `big` bytes from `alloc` above, this
    // thread's alone.
    unsafe {
        fill(q, small, 1);
        fill(p, big, 2);
    }
    a.free(q).unwrap();
    a.free(p).unwrap();
    wait_for("the big block reported", || resident_bytes(p, big) == 0);
    assert_eq!(resident_bytes(q, small), small, "the small block went back before its delay");
    a.check_invariants().unwrap();
    a.free(guard).unwrap();
}

/// A big dirty block freed while the reporter waits for a smaller block's delay goes back after
/// a tenth of the delay too: a free wakes only an idle reporter, so the waiting one looks again
/// by then by itself (without that, at the end of the small block's delay).
#[test]
fn a_big_block_freed_while_the_reporter_waits_goes_back_after_a_tenth_of_the_delay() {
    let delay = Duration::from_secs(40);
    let a = Allocator::new(Config { max_order: 14, ..config(reporting(delay.as_millis() as u32)) }).unwrap();
    let (small, big) = (8 << 20, 32 << 20);
    let q = a.alloc(small, PAGE, Flags::NONE).unwrap().as_ptr();
    let guard = a.alloc(small, PAGE, Flags::NONE).unwrap().as_ptr();
    let p = a.alloc(big, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `q` and `p` are live blocks of `small` and `big` bytes from `alloc` above, this
    // thread's alone.
    unsafe {
        fill(q, small, 1);
        fill(p, big, 2);
    }
    a.free(q).unwrap();
    // The free wakes the reporter, which finds the small block young and waits for its delay.
    std::thread::sleep(Duration::from_millis(500));
    a.free(p).unwrap();
    let t0 = Instant::now();
    // Due 4 s after its free: three quarters of the small block's delay is a wide margin.
    while resident_bytes(p, big) != 0 && t0.elapsed() < delay * 3 / 4 {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(resident_bytes(p, big), 0, "the big block waited for the small block's delay");
    assert_eq!(resident_bytes(q, small), small, "the small block went back before its delay");
    a.check_invariants().unwrap();
    a.free(guard).unwrap();
}

/// Free dirty memory piled up past 64 MiB (with little in use) goes back after a twentieth of the
/// delay, oldest first, until what is left is back at 64 MiB: blocks of 16 MiB here, below the
/// size that goes sooner by itself.
#[test]
fn dirty_memory_piled_up_past_the_bound_goes_back_down_to_it() {
    let a = Allocator::new(config(reporting(60_000))).unwrap();
    let block = 16 << 20;
    let blocks: Vec<*mut u8> = (0..6).map(|_| a.alloc(block, PAGE, Flags::NONE).unwrap().as_ptr()).collect();
    for &b in &blocks {
        // SAFETY: `b` is a live block of `block` bytes from `alloc` above, this thread's alone.
        unsafe { fill(b, block, 3) };
    }
    for &b in &blocks {
        a.free(b).unwrap();
    }
    let dirty = || a.stats().free_dirty_pages as usize * PAGE;
    assert_eq!(dirty(), 6 * block);
    wait_for("the pile reported down to 64 MiB", || dirty() <= 64 << 20);
    assert_eq!(dirty(), 64 << 20, "reported past the bound");
    a.check_invariants().unwrap();
}

/// Free dirty memory less than the memory in use is not a pile, however large: a program of many
/// large live buffers replaced at random keeps holes as large as half of what it holds and fills
/// them again, so they wait the whole delay. 192 MiB in use and 96 MiB freed: past 64 MiB and a
/// quarter of what is in use, not past what is in use.
#[test]
fn free_dirty_memory_under_the_memory_in_use_waits_the_whole_delay() {
    let delay_ms = 20_000;
    let a = Allocator::new(Config { arena_size: 512 << 20, max_order: 12, ..config(reporting(delay_ms)) }).unwrap();
    let block = 16 << 20;
    let live: Vec<*mut u8> = (0..12).map(|_| a.alloc(block, PAGE, Flags::NONE).unwrap().as_ptr()).collect();
    let freed: Vec<*mut u8> = (0..6).map(|_| a.alloc(block, PAGE, Flags::NONE).unwrap().as_ptr()).collect();
    for &b in live.iter().chain(&freed) {
        // SAFETY: `b` is a live block of `block` bytes from `alloc` above, this thread's alone.
        unsafe { fill(b, block, 4) };
    }
    for &b in &freed {
        a.free(b).unwrap();
    }
    let dirty = || a.stats().free_dirty_pages as usize * PAGE;
    assert_eq!(dirty(), 6 * block);
    // A pile would go back after a twentieth of the delay (1 s), seen within a tenth of it (the
    // reporter's longest nap): twice that is past both.
    std::thread::sleep(Duration::from_millis(delay_ms as u64 / 5));
    assert_eq!(dirty(), 6 * block, "free memory under what is in use went back before its delay");
    for &b in &live {
        a.free(b).unwrap();
    }
    a.check_invariants().unwrap();
}
