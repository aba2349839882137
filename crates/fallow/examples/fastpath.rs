//! The fast-path benchmark of issue 5: allocation + free of one block in a loop, 4 KiB, 16 KiB,
//! 64 KiB and 2 MiB, on 1 and 2 threads, for fallow with its per-thread caches on and off and for
//! jemalloc and mimalloc (called through their `GlobalAlloc` impls, not installed as the global
//! allocator, so that every peer runs in this one process, interleaved round by round). Figures,
//! not asserts: median over rounds of wall and CPU nanoseconds per alloc+free pair, per thread.
//! Each allocated block gets one byte written to its first page, as a user would.
//!
//! ```text
//! cargo run --release -p fallow --example fastpath                  # the table (7 rounds)
//! cargo run --release -p fallow --example fastpath -- --rounds 11
//! cargo run --release -p fallow --example fastpath -- --size 4096     # one size only
//! cargo run --release -p fallow --example fastpath -- --sweep       # cache batch/high sizing
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/fastpath --count fallow 4096 N        # instructions (see below)
//! ```
//!
//! `--count PEER SIZE N` runs N pairs on one thread and nothing else; running it under callgrind
//! for two values of N and dividing the difference of the instruction totals by the difference of
//! the N gives the instructions per pair with start-up cost cancelled (`scripts/` has no wrapper:
//! the command is in docs/design.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use fallow::{Allocator, Config, Flags, Tunables};
use mimalloc::MiMalloc;
use tikv_jemallocator::Jemalloc;

trait Peer: Sync {
    fn alloc(&self, size: usize) -> *mut u8;
    fn free(&self, p: *mut u8, size: usize);
    /// What the allocator says it did (fallow only).
    fn stats(&self) -> Option<fallow::Stats> {
        None
    }
}

/// Each peer's handle on cache lines of its own: a handle that shares a line with what the
/// harness writes (a thread's result slot, say) made whichever peer was made first ~10 ns slower.
#[repr(align(128))]
struct Fallow(Allocator);
impl Peer for Fallow {
    #[inline]
    fn alloc(&self, size: usize) -> *mut u8 {
        self.0.alloc(size, 4096, Flags::NONE).unwrap().as_ptr()
    }
    #[inline]
    fn free(&self, p: *mut u8, _size: usize) {
        self.0.free(p).unwrap()
    }
    fn stats(&self) -> Option<fallow::Stats> {
        Some(self.0.stats())
    }
}

struct Global<A: GlobalAlloc + Sync>(A);
impl<A: GlobalAlloc + Sync> Peer for Global<A> {
    #[inline]
    fn alloc(&self, size: usize) -> *mut u8 {
        // SAFETY: `size` is a benchmark size (at least one page), so the layout is non-zero and 4096 is a power
        // of two no larger than the size: what `GlobalAlloc::alloc` and the unchecked layout require.
        let p = unsafe { self.0.alloc(Layout::from_size_align_unchecked(size, 4096)) };
        assert!(!p.is_null());
        p
    }
    #[inline]
    fn free(&self, p: *mut u8, size: usize) {
        // SAFETY: `p` came from this peer's `alloc(size)` (every caller in this file frees the block it just
        // allocated, with the same size), so the layout is the one it was allocated with.
        unsafe { self.0.dealloc(p, Layout::from_size_align_unchecked(size, 4096)) }
    }
}

fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a writable `timespec` that outlives the call; the clock id is a valid constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `iters` pairs on each of `threads` threads: (wall ns, CPU ns) per pair, averaged over threads.
fn run(p: &dyn Peer, size: usize, threads: usize, iters: usize) -> (f64, f64) {
    let barrier = std::sync::Barrier::new(threads);
    let per: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    // Warm up this thread's state (caches, arenas) outside the timing.
                    for _ in 0..64 {
                        let b = p.alloc(size);
                        // SAFETY: `b` is a live block of `size` >= 1 byte just returned by `p.alloc` (non-null, checked there),
                        // owned by this thread until the free below.
                        unsafe { b.write_volatile(1) };
                        p.free(b, size);
                    }
                    barrier.wait();
                    let (t0, c0) = (Instant::now(), thread_cpu_ns());
                    for i in 0..iters {
                        let b = black_box(p.alloc(size));
                        // SAFETY: as in the warm-up: `b` is a live block of at least one byte, ours until the free.
                        unsafe { b.write_volatile(i as u8) };
                        p.free(b, size);
                    }
                    (t0.elapsed().as_nanos() as u64, thread_cpu_ns() - c0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let n = (threads * iters) as f64;
    (per.iter().map(|x| x.0).sum::<u64>() as f64 / n, per.iter().map(|x| x.1).sum::<u64>() as f64 / n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn fallow_with(cache: bool, max_order: u8, batch: u32, high: u32) -> Fallow {
    Fallow(
        Allocator::new(Config {
            cache,
            cache_max_order: max_order,
            cache_batch_pages: batch,
            cache_high_pages: high,
            ..Config::default()
        })
        .unwrap(),
    )
}

fn iters_for(size: usize) -> usize {
    let scale: usize = std::env::var("FASTPATH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    scale * if size >= 1 << 20 { 20_000 } else { 200_000 }
}

fn table(rounds: usize, only: Option<usize>) {
    let d = Config::default();
    let peers: Vec<(&str, Box<dyn Peer>)> = vec![
        ("fallow", Box::new(fallow_with(true, d.cache_max_order, d.cache_batch_pages, d.cache_high_pages))),
        // The same with reporting and pre-zeroing off: the workers' cost on this loop (the seed's
        // page-fault check found 1-2%).
        ("fallow noworkers", Box::new(Fallow(Allocator::new(Config { tunables: Tunables::off(), ..Config::default() }).unwrap()))),
        ("fallow noreport", Box::new(Fallow(Allocator::new(Config { tunables: Tunables { report: false, ..Tunables::default() }, ..Config::default() }).unwrap()))),
        ("fallow nozero", Box::new(Fallow(Allocator::new(Config { tunables: Tunables { zeroing: false, ..Tunables::default() }, ..Config::default() }).unwrap()))),
        // Caches for orders 0..3 only, as Linux's per-CPU lists without THP.
        ("fallow cache<=32K", Box::new(fallow_with(true, 3, d.cache_batch_pages, d.cache_high_pages))),
        ("fallow nocache", Box::new(fallow_with(false, d.cache_max_order, d.cache_batch_pages, d.cache_high_pages))),
        // The locked path's own cost, with 4 MiB top blocks instead of 1 GiB ones (fewer levels
        // to split and merge).
        ("fallow nocache mo10", Box::new(Fallow(Allocator::new(Config { cache: false, max_order: 10, ..Config::default() }).unwrap()))),
        ("jemalloc", Box::new(Global(Jemalloc))),
        ("mimalloc", Box::new(Global(MiMalloc))),
        ("glibc", Box::new(Global(System))),
    ];
    let sizes: Vec<usize> = match only {
        Some(size) => vec![size],
        None => vec![4096, 16384, 65536, 2 << 20],
    };
    let thread_counts = [1usize, 2];
    // [peer][size][threads] -> per-round (wall, cpu)
    let mut res = vec![vec![vec![(Vec::new(), Vec::new()); thread_counts.len()]; sizes.len()]; peers.len()];
    for round in 0..rounds {
        for (si, &size) in sizes.iter().enumerate() {
            for (ti, &threads) in thread_counts.iter().enumerate() {
                // Each round starts with another peer: whoever runs first after a change of size
                // or thread count pays for it (frequency, caches), and that is spread evenly.
                for k in 0..peers.len() {
                    let pi = (k + round) % peers.len();
                    let p = &peers[pi].1;
                    // About 30 ms per run: a short calibration run sets the count (slow peers
                    // would otherwise take minutes).
                    let (probe, _) = run(p.as_ref(), size, threads, 200);
                    let iters = ((30e6 / probe.max(1.0)) as usize).clamp(200, iters_for(size));
                    let (w, c) = run(p.as_ref(), size, threads, iters);
                    res[pi][si][ti].0.push(w);
                    res[pi][si][ti].1.push(c);
                }
            }
        }
    }
    println!("median ns per alloc+free pair, per thread, over {rounds} rounds: wall / CPU");
    print!("{:<20}", "peer");
    for &size in &sizes {
        for &t in &thread_counts {
            print!(" {:>16}", format!("{}K x{}", size >> 10, t));
        }
    }
    println!();
    for (pi, (name, _)) in peers.iter().enumerate() {
        print!("{name:<20}");
        for row in &res[pi] {
            for (w, c) in row {
                print!(" {:>16}", format!("{:.1}/{:.1}", median(w.clone()), median(c.clone())));
            }
        }
        println!();
    }
    println!("\nwhat each fallow peer did over the whole run:");
    for (name, p) in &peers {
        if let Some(s) = p.stats() {
            println!(
                "{name:<20} calls {} cache hits {:.1}% refills {} drains {} reported {} MiB zeroed in background {} MiB arenas {}",
                s.alloc_calls + s.free_calls,
                100.0 * s.cache_hits as f64 / (s.alloc_calls + s.free_calls).max(1) as f64,
                s.cache_refills,
                s.cache_drains,
                s.reported_bytes >> 20,
                s.zeroed_background_bytes >> 20,
                s.arenas
            );
        }
    }
}

/// Sizing of batch and high mark: the single-block loop and bursts (allocate N blocks of 4 KiB,
/// free them all) of 64, 256 and 1024 blocks, 1 and 2 threads, for several (batch, high) settings.
fn sweep(rounds: usize) {
    let settings = [(64u32, 256u32), (64, 512), (16, 1024), (32, 1024), (63, 1024), (64, 1024), (128, 1024), (64, 2048), (64, 4096)];
    let peers: Vec<Fallow> = settings.iter().map(|&(b, h)| fallow_with(true, 9, b, h)).collect();
    let cols = ["loop x1", "loop x2", "b64 x1", "b64 x2", "b256 x1", "b256 x2", "b1024 x1", "b1024 x2", "64K b16", "64K b64", "2M b2", "2M b4"];
    let mut res = vec![vec![(Vec::new(), Vec::new()); cols.len()]; settings.len()];
    for _ in 0..rounds {
        for (i, p) in peers.iter().enumerate() {
            let mut k = 0;
            for t in [1, 2] {
                let r = run(p, 4096, t, 100_000);
                res[i][k].0.push(r.0);
                res[i][k].1.push(r.1);
                k += 1;
            }
            for n in [64, 256, 1024] {
                for t in [1, 2] {
                    let r = burst(p, t, 4096, n, 100_000 / n);
                    res[i][k].0.push(r.0);
                    res[i][k].1.push(r.1);
                    k += 1;
                }
            }
            for (size, n) in [(64 << 10, 16), (64 << 10, 64), (2 << 20, 2), (2 << 20, 4)] {
                let r = burst(p, 1, size, n, if size > 1 << 20 { 2_000 } else { 20_000 } / n);
                res[i][k].0.push(r.0);
                res[i][k].1.push(r.1);
                k += 1;
            }
        }
    }
    println!("median ns per pair over {rounds} rounds, wall/CPU per thread; bN = burst of N blocks (4 KiB unless named; named sizes on 1 thread)");
    print!("{:<20}", "");
    for c in cols {
        print!(" {c:>12}");
    }
    println!();
    for (i, (b, h)) in settings.iter().enumerate() {
        print!("{:<20}", format!("batch {b} high {h}"));
        for r in &res[i] {
            print!(" {:>12}", format!("{:.1}/{:.1}", median(r.0.clone()), median(r.1.clone())));
        }
        println!();
    }
}

fn burst(p: &Fallow, threads: usize, size: usize, n: usize, reps: usize) -> (f64, f64) {
    let per: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let mut v = Vec::with_capacity(n);
                    let (t0, c0) = (Instant::now(), thread_cpu_ns());
                    for _ in 0..reps {
                        for _ in 0..n {
                            let b = p.alloc(size);
                            // SAFETY: `b` is a live block of `size` >= 1 byte from `p.alloc`, owned by this thread until the drain frees it.
                            unsafe { b.write_volatile(1) };
                            v.push(b);
                        }
                        for b in v.drain(..) {
                            p.free(b, size);
                        }
                    }
                    (t0.elapsed().as_nanos() as u64, thread_cpu_ns() - c0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let d = (threads * n * reps) as f64;
    (per.iter().map(|x| x.0).sum::<u64>() as f64 / d, per.iter().map(|x| x.1).sum::<u64>() as f64 / d)
}

fn count(peer: &str, size: usize, n: usize) {
    let p: Box<dyn Peer> = match peer {
        "fallow" => Box::new(Fallow(Allocator::new(Config::default()).unwrap())),
        "fallow-nocache" => Box::new(Fallow(Allocator::new(Config { cache: false, ..Config::default() }).unwrap())),
        "fallow-nocache-mo10" => Box::new(Fallow(Allocator::new(Config { cache: false, max_order: 10, ..Config::default() }).unwrap())),
        "fallow-noworkers" => Box::new(Fallow(Allocator::new(Config { tunables: Tunables::off(), ..Config::default() }).unwrap())),
        "fallow-cache3" => Box::new(Fallow(Allocator::new(Config { cache_max_order: 3, ..Config::default() }).unwrap())),
        "jemalloc" => Box::new(Global(Jemalloc)),
        "mimalloc" => Box::new(Global(MiMalloc)),
        _ => panic!("peer: fallow, fallow-nocache, jemalloc or mimalloc"),
    };
    for i in 0..n {
        let b = black_box(p.alloc(size));
        // SAFETY: `b` is a live block of `size` >= 1 byte just returned by `p.alloc`, freed only after the write.
        unsafe { b.write_volatile(i as u8) };
        p.free(b, size);
    }
}

/// The fast-path benchmark: alloc + free of one block in a loop, fallow and its peers.
#[derive(clap::Parser)]
struct Args {
    /// Rounds per figure (the median is reported).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// One block size only, in bytes.
    #[arg(long)]
    size: Option<usize>,
    /// The cache sizing sweep (batch and high mark) instead of the table.
    #[arg(long)]
    sweep: bool,
    /// `PEER SIZE N`: N pairs on one thread and nothing else (for instruction counts).
    #[arg(long, num_args = 3, value_names = ["PEER", "SIZE", "N"])]
    count: Option<Vec<String>>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if let Some(c) = &args.count {
        let size = c[1].parse().unwrap_or_else(|_| panic!("--count: SIZE {:?} is not a number", c[1]));
        let n = c[2].parse().unwrap_or_else(|_| panic!("--count: N {:?} is not a number", c[2]));
        count(&c[0], size, n);
    } else if args.sweep {
        sweep(args.rounds);
    } else {
        table(args.rounds, args.size);
    }
}
