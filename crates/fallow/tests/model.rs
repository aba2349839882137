//! Model-based property tests: random sequences of allocations, frees and resizes of random sizes,
//! alignments and flags, checked against a simple model of the live blocks. `model`: one thread,
//! workers off, checked after every step. `model_threads`: three threads with both workers on
//! (zero delays), whose operations also include `free_reported`, `set_tunables`, cache drains and
//! handing blocks to another thread, checked at a barrier every few steps.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use fallow::{Allocator, Config, Error, Flags, ReportMode, Tunables};
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
enum Op {
    Alloc { pages: usize, extra: usize, align_log: u8, zero: bool, populate: bool, lock: bool },
    Free { idx: usize, sized: bool },
    Resize { idx: usize, pages: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (
            prop_oneof![3 => 1usize..8, 2 => 8usize..300, 1 => 200usize..600],
            0usize..4096,
            prop_oneof![4 => Just(0u8), 1 => 12u8..21],
            any::<bool>(),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.05),
        )
            .prop_map(|(pages, extra, align_log, zero, populate, lock)| Op::Alloc {
                pages,
                extra,
                align_log,
                zero,
                populate,
                lock
            }),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(idx, sized)| Op::Free { idx, sized }),
        1 => (any::<usize>(), 1usize..400).prop_map(|(idx, pages)| Op::Resize { idx, pages }),
    ]
}

/// A live block: `len` bytes at `addr`, every byte `fill`. Made only for a block just allocated
/// (and written with `fill`); held by one thread at a time (in its `live` list, or in `pool`
/// between two threads) and dropped once the block is freed. (The copies in `model`'s `others`
/// are only compared by address, never read through.)
struct Live {
    addr: usize,
    len: usize,
    fill: u8,
}

fn overlaps(live: &[Live], addr: usize, len: usize) -> bool {
    live.iter().any(|l| addr < l.addr + l.len && l.addr < addr + len)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn model(ops in prop::collection::vec(op(), 1..120)) {
        let a = small();
        let mut live: Vec<Live> = Vec::new();
        let mut fill = 1u8;
        for op in ops {
            match op {
                Op::Alloc { pages, extra, align_log, zero, populate, lock } => {
                    let size = (pages - 1) * 4096 + extra.max(1);
                    let align = if align_log == 0 { 8 } else { 1usize << align_log };
                    let mut flags = Flags::NONE;
                    if zero { flags = flags | Flags::ZERO; }
                    if populate { flags = flags | Flags::POPULATE; }
                    if lock { flags = flags | Flags::LOCK; }
                    let before = a.stats();
                    let p = a.alloc(size, align, flags).unwrap().as_ptr() as usize;
                    let len = a.usable_size(p as *const u8).unwrap();
                    prop_assert_eq!(len, size.div_ceil(4096) * 4096, "no waste beyond page granularity");
                    prop_assert_eq!(p % align, 0);
                    prop_assert!(!overlaps(&live, p, len), "block {:#x}+{} overlaps a live block", p, len);
                    if zero {
                        // SAFETY: `p` is a live block of `len` usable bytes just allocated, used by this thread only.
                        prop_assert!(unsafe { all_zero(p as *const u8, len) }, "ZERO block {:#x} holds data", p);
                        let after = a.stats();
                        let counted = (after.zero_skipped_bytes - before.zero_skipped_bytes)
                            + (after.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes);
                        prop_assert_eq!(counted, len as u64);
                    }
                    if populate || lock {
                        prop_assert_eq!(common::os::resident_pages(p, len).unwrap(), len / 4096);
                    }
                    fill = fill.wrapping_add(1).max(1);
                    // SAFETY: `p` is that live block of `len` bytes, not yet freed.
                    unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
                    live.push(Live { addr: p, len, fill });
                }
                Op::Free { idx, sized } => {
                    if live.is_empty() { continue; }
                    let l = live.swap_remove(idx % live.len());
                    // SAFETY: `l` was in `live`: a block of `l.len` bytes allocated on this thread and not yet freed.
                    prop_assert!(unsafe { all_eq(l.addr as *const u8, l.len, l.fill) }, "block {:#x} lost its pattern", l.addr);
                    if sized {
                        prop_assert_eq!(
                            a.free_sized(l.addr as *mut u8, l.len + 4096),
                            Err(Error::SizeMismatch { addr: l.addr, given: l.len + 4096, actual: l.len })
                        );
                        a.free_sized(l.addr as *mut u8, l.len - 1).unwrap();
                    } else {
                        a.free(l.addr as *mut u8).unwrap();
                    }
                    prop_assert_eq!(a.free(l.addr as *mut u8), Err(Error::DoubleFree { addr: l.addr }));
                }
                Op::Resize { idx, pages } => {
                    if live.is_empty() { continue; }
                    let i = idx % live.len();
                    let new_len = pages * 4096;
                    let (addr, old_len, f) = (live[i].addr, live[i].len, live[i].fill);
                    let others: Vec<Live> = live.iter().enumerate().filter(|(j, _)| *j != i)
                        .map(|(_, l)| Live { addr: l.addr, len: l.len, fill: l.fill }).collect();
                    if a.resize_in_place(addr as *mut u8, new_len).unwrap() {
                        prop_assert_eq!(a.usable_size(addr as *const u8), Some(new_len));
                        prop_assert!(!overlaps(&others, addr, new_len));
                        // SAFETY: `addr` is a live block, resized in place to `new_len` usable bytes (asserted above).
                        prop_assert!(unsafe { all_eq(addr as *const u8, old_len.min(new_len), f) }, "block {:#x} lost its pattern in a resize", addr);
                        // SAFETY: `addr` is a live block of `new_len` usable bytes (asserted above), used by this thread only.
                        unsafe { std::ptr::write_bytes(addr as *mut u8, f, new_len) };
                        live[i].len = new_len;
                    } else {
                        prop_assert_eq!(a.usable_size(addr as *const u8), Some(old_len));
                    }
                }
            }
            if let Err(e) = a.check_invariants() { prop_assert!(false, "{}", e); }
            // SAFETY: `a` is this case's own allocator, used by this thread only.
            if let Err(e) = unsafe { check_free_states(&a) } { prop_assert!(false, "{}", e); }
            let s = a.stats();
            prop_assert_eq!(s.live_blocks, live.len() as u64);
            prop_assert_eq!(s.bytes_in_use, live.iter().map(|l| l.len as u64).sum::<u64>());
            prop_assert_eq!(s.free_pages() * 4096 + s.bytes_in_use + s.slack_bytes + s.isolated_pages * 4096, s.reserved_bytes);
            let listed: u64 = (0..3).map(|c| s.free_blocks[c].iter().enumerate()
                .map(|(o, n)| n << o).sum::<u64>()).sum();
            prop_assert_eq!(listed, s.free_pages());
        }
        for l in live {
            a.free(l.addr as *mut u8).unwrap();
        }
        let s = a.stats();
        prop_assert_eq!(s.bytes_in_use, 0);
        if let Err(e) = a.check_invariants() { prop_assert!(false, "{}", e); }
    }
}

// ---- Multi-threaded, workers on ----

#[derive(Clone, Debug)]
enum MtOp {
    Alloc { pages: usize, extra: usize, align_log: u8, zero: bool, populate: bool },
    Free { idx: usize, sized: bool },
    /// `MADV_DONTNEED` the block's pages, then `free_reported` it.
    FreeReported { idx: usize },
    Resize { idx: usize, pages: usize },
    /// Hand a block to the shared pool, for another thread to free.
    Give { idx: usize },
    /// Take a block from the pool (checking its pattern) and make it this thread's.
    Adopt,
    SetTunables { which: usize },
    RequestCacheDrain,
    DrainThreadCache,
    /// Sleep, leaving idle CPU (the workers step only while a CPU is idle).
    Pause { us: u64 },
}

fn mt_op() -> impl Strategy<Value = MtOp> {
    prop_oneof![
        8 => (
            prop_oneof![4 => 1usize..9, 2 => 9usize..64, 1 => 64usize..300],
            prop_oneof![Just(4096usize), 1usize..4096],
            prop_oneof![6 => Just(0u8), 1 => 12u8..19],
            any::<bool>(),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(pages, extra, align_log, zero, populate)| MtOp::Alloc { pages, extra, align_log, zero, populate }),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(idx, sized)| MtOp::Free { idx, sized }),
        2 => any::<usize>().prop_map(|idx| MtOp::FreeReported { idx }),
        1 => (any::<usize>(), 1usize..300).prop_map(|(idx, pages)| MtOp::Resize { idx, pages }),
        1 => any::<usize>().prop_map(|idx| MtOp::Give { idx }),
        1 => Just(MtOp::Adopt),
        1 => (0usize..TUNABLES).prop_map(|which| MtOp::SetTunables { which }),
        1 => Just(MtOp::RequestCacheDrain),
        1 => Just(MtOp::DrainThreadCache),
        1 => (50u64..2000).prop_map(|us| MtOp::Pause { us }),
    ]
}

const TUNABLES: usize = 4;

/// Settings the threads switch between: both workers on, delays of a few milliseconds at most
/// (the zeroing worker leaves alone a block older than the report delay, which the reporter is
/// about to take: the zero delay is the shorter), small orders and batches (so that they work on
/// the small blocks the threads free), `MADV_FREE` in one of them, a resident floor in another;
/// the last switches zeroing off.
fn tunables(which: usize) -> Tunables {
    let base = Tunables {
        report: true,
        report_order: 0,
        report_delay_ms: 3,
        report_batch: 4,
        zeroing: true,
        zero_order: 0,
        zero_chunk: 64 << 10,
        zero_delay_ms: 0,
        zeroed_reserve: 4 << 20,
        ..Tunables::default()
    };
    match which {
        0 => base,
        1 => Tunables { report_order: 2, report_delay_ms: 1, report_batch: 16, report_mode: ReportMode::Free, zero_order: 2, zero_chunk: 256 << 10, ..base },
        2 => Tunables { report_order: 4, report_batch: 1, resident_free_min: 1 << 20, zero_chunk: 4096, ..base },
        _ => Tunables { zeroing: false, report_delay_ms: 0, ..base },
    }
}

const THREADS: usize = 3;
/// How long a case repeats its operations for the zeroing worker to run beside them.
const ZEROING_WAIT: Duration = Duration::from_secs(2);
/// How long a case repeats its operations at most for the workers to run beside them (a
/// liveness bound; 24 cases, so a machine that never leaves a CPU idle costs 8 minutes).
const WORKERS_WAIT: Duration = Duration::from_secs(20);
/// Cases in which the zeroing worker zeroed something.
static ZEROING_CASES: AtomicU64 = AtomicU64::new(0);
/// Cases in which the reporting worker reported a batch.
static REPORTING_CASES: AtomicU64 = AtomicU64::new(0);
/// Operations between two checkpoints.
const CHECK: usize = 8;
/// Live blocks a thread keeps at most (an allocation past it frees one first).
const MAX_LIVE: usize = 12;

struct Shared {
    a: Allocator,
    pool: Mutex<Vec<Live>>,
    /// Live blocks and bytes over every thread and the pool (exact at a checkpoint).
    live_blocks: AtomicU64,
    live_bytes: AtomicU64,
    failure: Mutex<Option<String>>,
    failed: AtomicBool,
    again: AtomicBool,
}

impl Shared {
    fn fail(&self, e: String) {
        let mut f = self.failure.lock().unwrap();
        if f.is_none() {
            *f = Some(e);
        }
        self.failed.store(true, Ordering::SeqCst);
    }
}

fn check_live(l: &Live) -> Result<(), String> {
    // SAFETY: a `Live` describes a block of `len` bytes that is live and held by one thread (see `Live`):
    // the caller's, which is the only one writing it.
    if unsafe { all_eq(l.addr as *const u8, l.len, l.fill) } {
        Ok(())
    } else {
        Err(format!("block {:#x}+{} lost its pattern {}", l.addr, l.len, l.fill))
    }
}

fn release(sh: &Shared, l: &Live) {
    sh.live_blocks.fetch_sub(1, Ordering::Relaxed);
    sh.live_bytes.fetch_sub(l.len as u64, Ordering::Relaxed);
}

fn mt_step(sh: &Shared, t: usize, op: &MtOp, live: &mut Vec<Live>, fill: &mut u8) -> Result<(), String> {
    let a = &sh.a;
    match *op {
        MtOp::Alloc { pages, extra, align_log, zero, populate } => {
            if live.len() >= MAX_LIVE {
                let l = live.remove(0);
                check_live(&l)?;
                a.free(l.addr as *mut u8).map_err(|e| e.to_string())?;
                release(sh, &l);
            }
            let size = (pages - 1) * 4096 + extra;
            let align = if align_log == 0 { 4096 } else { 1usize << align_log };
            let mut flags = Flags::NONE;
            if zero {
                flags = flags | Flags::ZERO;
            }
            if populate {
                flags = flags | Flags::POPULATE;
            }
            let p = a.alloc(size, align, flags).map_err(|e| format!("alloc {size}: {e}"))?.as_ptr() as usize;
            let len = size.div_ceil(4096) * 4096;
            if !p.is_multiple_of(align) {
                return Err(format!("block {p:#x} not aligned to {align}"));
            }
            // SAFETY: `p` is a live block of `len` bytes just allocated, not yet shared with another thread.
            if zero && !unsafe { all_zero(p as *const u8, len) } {
                return Err(format!("ZERO block {p:#x}+{len} holds data"));
            }
            if populate && os::resident_pages(p, len) != Ok(len / 4096) {
                return Err(format!("POPULATE block {p:#x}+{len} not resident"));
            }
            *fill = fill.wrapping_add(1).max(1);
            let f = (t as u8) << 6 | (*fill & 63) | 1;
            // SAFETY: `p` is that live block of `len` bytes, not yet shared.
            unsafe { std::ptr::write_bytes(p as *mut u8, f, len) };
            live.push(Live { addr: p, len, fill: f });
            sh.live_blocks.fetch_add(1, Ordering::Relaxed);
            sh.live_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        MtOp::Free { idx, sized } => {
            if live.is_empty() {
                return Ok(());
            }
            let l = live.swap_remove(idx % live.len());
            check_live(&l)?;
            let r = if sized { a.free_sized(l.addr as *mut u8, l.len) } else { a.free(l.addr as *mut u8) };
            r.map_err(|e| format!("free {:#x}: {e}", l.addr))?;
            release(sh, &l);
            // (No second free to check the double-free error, as `model` does: another thread
            // may have been handed the same address meanwhile.)
        }
        MtOp::FreeReported { idx } => {
            if live.is_empty() {
                return Ok(());
            }
            let l = live.swap_remove(idx % live.len());
            check_live(&l)?;
            // SAFETY: `l` was this thread's live block of `l.len` bytes (see `Live`), mapped, and holds nothing
            // anyone still needs; it is handed back by `free_reported` below.
            if unsafe { libc::madvise(l.addr as *mut libc::c_void, l.len, libc::MADV_DONTNEED) } != 0 {
                return Err(format!("madvise {:#x}: {}", l.addr, std::io::Error::last_os_error()));
            }
            // Not read again (that would fault the pages back in): checked gone by `mincore`.
            let r = os::resident_pages(l.addr, l.len);
            if r != Ok(0) {
                return Err(format!("block {:#x} still resident after MADV_DONTNEED: {r:?}", l.addr));
            }
            // SAFETY: the block is this thread's, live, and its pages were just dropped from the
            // page tables (`MADV_DONTNEED`, checked by `mincore`): they read zero and are not resident.
            unsafe { a.free_reported(l.addr as *mut u8) }.map_err(|e| format!("free_reported {:#x}: {e}", l.addr))?;
            release(sh, &l);
        }
        MtOp::Resize { idx, pages } => {
            if live.is_empty() {
                return Ok(());
            }
            let i = idx % live.len();
            let new_len = pages * 4096;
            let l = &mut live[i];
            check_live(l)?;
            if a.resize_in_place(l.addr as *mut u8, new_len).map_err(|e| e.to_string())? {
                if a.usable_size(l.addr as *const u8) != Some(new_len) {
                    return Err(format!("resized block {:#x} does not hold {new_len} bytes", l.addr));
                }
                // SAFETY: `l` is this thread's live block (see `Live`), resized in place to `new_len` usable
                // bytes (checked above), so its first `min(l.len, new_len)` bytes are readable.
                if !unsafe { all_eq(l.addr as *const u8, l.len.min(new_len), l.fill) } {
                    return Err(format!("resizing {:#x} changed its contents", l.addr));
                }
                // SAFETY: `l` is this thread's live block, resized in place to `new_len` usable bytes (checked above).
                unsafe { std::ptr::write_bytes(l.addr as *mut u8, l.fill, new_len) };
                sh.live_bytes.fetch_add(new_len as u64, Ordering::Relaxed);
                sh.live_bytes.fetch_sub(l.len as u64, Ordering::Relaxed);
                l.len = new_len;
            }
        }
        MtOp::Give { idx } => {
            if !live.is_empty() {
                let l = live.swap_remove(idx % live.len());
                sh.pool.lock().unwrap().push(l);
            }
        }
        MtOp::Adopt => {
            let l = sh.pool.lock().unwrap().pop();
            if let Some(l) = l {
                check_live(&l)?;
                live.push(l);
            }
        }
        MtOp::SetTunables { which } => a.set_tunables(tunables(which)).map_err(|e| e.to_string())?,
        MtOp::RequestCacheDrain => a.request_cache_drain(),
        MtOp::DrainThreadCache => a.drain_thread_cache(),
        MtOp::Pause { us } => std::thread::sleep(Duration::from_micros(us)),
    }
    Ok(())
}

/// At a checkpoint (every thread waiting at the barrier, the workers running): the invariants,
/// the recorded state of every free page, and the counters against the model.
fn checkpoint(sh: &Shared) -> Result<(), String> {
    let a = &sh.a;
    a.check_invariants()?;
    // SAFETY: called only by the barrier's leader while every other test thread waits at the barrier, so
    // no thread allocates from `a` meanwhile (its workers may run).
    unsafe { check_free_states(a) }?;
    let s = a.stats();
    let (blocks, bytes) = (sh.live_blocks.load(Ordering::Relaxed), sh.live_bytes.load(Ordering::Relaxed));
    if s.live_blocks != blocks || s.bytes_in_use != bytes {
        return Err(format!("{blocks} blocks of {bytes} bytes live, stats say {} of {}", s.live_blocks, s.bytes_in_use));
    }
    if s.free_pages() * 4096 + s.bytes_in_use + s.slack_bytes + s.isolated_pages * 4096 != s.reserved_bytes {
        return Err(format!("free + in use + slack + isolated != reserved:\n{s}"));
    }
    Ok(())
}

fn run_threads(ops: &[Vec<MtOp>]) -> Result<(), String> {
    let config = Config { arena_size: 16 << 20, max_order: 8, thp: false, tunables: tunables(0), ..Config::default() };
    let sh = Shared {
        a: Allocator::new(config).unwrap(),
        pool: Mutex::new(Vec::new()),
        live_blocks: AtomicU64::new(0),
        live_bytes: AtomicU64::new(0),
        failure: Mutex::new(None),
        failed: AtomicBool::new(false),
        again: AtomicBool::new(false),
    };
    let barrier = Barrier::new(THREADS);
    let t0 = Instant::now();
    let left: Vec<Vec<Live>> = std::thread::scope(|sc| {
        let hs: Vec<_> = ops
            .iter()
            .enumerate()
            .map(|(t, ops)| {
                let (sh, barrier) = (&sh, &barrier);
                sc.spawn(move || {
                    let mut live: Vec<Live> = Vec::new();
                    let mut fill = 0u8;
                    // The same operations again until the reporter has worked beside them, and
                    // the zeroing worker too or `ZEROING_WAIT` has passed, for at most
                    // `WORKERS_WAIT` (the workers step only on an idle CPU: on a busy machine they
                    // may not run in every case, and `model_threads` asks each to have run in
                    // one case at least). Each pass ends at a checkpoint.
                    loop {
                        for chunk in ops.chunks(CHECK) {
                            if !sh.failed.load(Ordering::SeqCst) {
                                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    chunk.iter().try_for_each(|op| mt_step(sh, t, op, &mut live, &mut fill))?;
                                    live.iter().try_for_each(check_live)
                                }));
                                if let Err(e) = r.unwrap_or_else(|_| Err(format!("thread {t} panicked"))) {
                                    sh.fail(format!("thread {t}: {e}"));
                                }
                            }
                            if barrier.wait().is_leader() && !sh.failed.load(Ordering::SeqCst) {
                                if let Err(e) = checkpoint(sh) {
                                    sh.fail(format!("checkpoint: {e}"));
                                }
                                let s = sh.a.stats();
                                let zeroed = s.zeroed_background_bytes > 0 || t0.elapsed() > ZEROING_WAIT;
                                let done = s.report_batches > 0 && zeroed;
                                sh.again.store(!done && t0.elapsed() < WORKERS_WAIT, Ordering::SeqCst);
                            }
                            barrier.wait();
                        }
                        if sh.failed.load(Ordering::SeqCst) || !sh.again.load(Ordering::SeqCst) {
                            break;
                        }
                        // The next pass starts from nothing live: passes repeat until the workers
                        // have run, which on a busy machine takes many, and what each pass leaves
                        // would otherwise pile up until the arenas run out.
                        if let Err(e) = free_all(sh, &mut live, t == 0) {
                            sh.fail(format!("thread {t}: {e}"));
                        }
                        // Every thread idle at once for a moment: the workers step only while a
                        // CPU is idle, and these threads alone would keep both CPUs busy.
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    live
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    if let Some(e) = sh.failure.lock().unwrap().take() {
        return Err(e);
    }
    // Whether the workers ran is counted over the cases, not failed per case: on a machine kept
    // busy by others they may not get an idle CPU within the `WORKERS_WAIT` a case waits, and a failed
    // case would be shrunk, each try waiting as long again.
    let s = sh.a.stats();
    if s.report_batches > 0 {
        REPORTING_CASES.fetch_add(1, Ordering::Relaxed);
    }
    if s.zeroed_background_bytes > 0 {
        ZEROING_CASES.fetch_add(1, Ordering::Relaxed);
    }
    // The threads are gone (their caches drained at exit): free what is left, from here.
    free_all(&sh, &mut left.into_iter().flatten().collect(), true)?;
    checkpoint(&sh)?;
    let s = sh.a.stats();
    if s.bytes_in_use != 0 || s.live_blocks != 0 || s.alloc_calls != s.free_calls {
        return Err(format!("blocks left after every free:\n{s}"));
    }
    Ok(())
}

/// Free every block of `live` (and of the pool too, when `pool`), checking their patterns.
fn free_all(sh: &Shared, live: &mut Vec<Live>, pool: bool) -> Result<(), String> {
    let mut blocks = std::mem::take(live);
    if pool {
        blocks.append(&mut sh.pool.lock().unwrap());
    }
    for l in blocks {
        check_live(&l)?;
        sh.a.free(l.addr as *mut u8).map_err(|e| format!("free {:#x}: {e}", l.addr))?;
        release(sh, &l);
    }
    Ok(())
}

/// 24 generated cases of `THREADS` threads' operations, each run by `run_threads`.
fn run_model_threads() {
    let config = ProptestConfig { cases: 24, max_shrink_iters: 32, source_file: Some(file!()), ..ProptestConfig::default() };
    let ops = (8usize..80).prop_flat_map(|n| prop::collection::vec(prop::collection::vec(mt_op(), n), THREADS));
    let mut runner = proptest::test_runner::TestRunner::new(config);
    if let Err(e) = runner.run(&ops, |ops| run_threads(&ops).map_err(TestCaseError::fail)) {
        panic!("{e}");
    }
}

#[test]
fn model_threads() {
    run_model_threads();
    assert!(REPORTING_CASES.load(Ordering::Relaxed) > 0, "the reporter reported nothing beside the threads in any case");
    assert!(ZEROING_CASES.load(Ordering::Relaxed) > 0, "the zeroing worker zeroed nothing beside the threads in any case");
}
