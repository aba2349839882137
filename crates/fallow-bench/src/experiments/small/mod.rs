//! small: the field's small-object shapes (mimalloc-bench's), each peer as a program gets it. Four
//! shapes (`--shapes`, default all): `churn` (one thread, mixed sizes of 16 B-4 KiB in a ring, as
//! cfrac and espresso), `server` (larson: threads replacing random slots of a shared array of
//! 8-1000 B objects, most frees of another thread's objects), `queue` (xmalloc-test: a producer
//! thread's 64 B objects freed by a consumer thread) and `random` (rptest: threads replacing
//! random objects of up to 16 KiB). Every object the program allocates is written and checked
//! before its free (`objects.rs`).
//!
//! Each measurement runs in a child process of its own (`child.rs`, `fallow __shape_child`) whose
//! `malloc` and `free` are the peer's library (`preloaded.rs`: Debian's jemalloc, mimalloc and
//! tcmalloc by `LD_PRELOAD`, fallow's preload library, `fallow-small` with `FALLOW_SMALL=1`; the
//! child checks which library its `malloc` is before it starts). For every round, every shape in
//! turn, every peer once in the rotating order of `round_order`, the same generator seed for every
//! peer. The figures per shape and peer, medians over the rounds: wall and CPU time (user + system,
//! every thread), operations (a `malloc` and a `free`) per CPU-second and per second, peak RSS
//! over the measured window, minor faults; ratios to glibc's.

pub mod churn;
pub mod objects;
pub mod queue;
pub mod random;
pub mod server;

use serde_json::{json, Value};

use super::child::{self, Usage};
use super::{preloaded, round_order, Chart, Experiment, Options, Outcome};
use crate::measure::{median, num, Progress};
use crate::peers::PeerKind;

/// The generator's seed of round 0 (round r uses `SEED + r`).
const SEED: u64 = 11;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    Churn,
    Server,
    Queue,
    Random,
}

impl Shape {
    pub const ALL: [Shape; 4] = [Shape::Churn, Shape::Server, Shape::Queue, Shape::Random];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Churn => "churn",
            Shape::Server => "server",
            Shape::Queue => "queue",
            Shape::Random => "random",
        }
    }

    /// The threads it runs on for `--threads`: churn one, queue two (producer and consumer), server
    /// and random `threads`, at least two.
    pub fn threads(self, threads: usize) -> usize {
        match self {
            Shape::Churn => 1,
            Shape::Queue => 2,
            Shape::Server | Shape::Random => threads.max(2),
        }
    }

    /// Operations per thread (queue: objects passed) when `--count` is not given: each about
    /// 100-200 ms of glibc on this machine (shorter windows measure the process's start more).
    pub fn default_count(self) -> usize {
        match self {
            Shape::Churn => 4_000_000,
            Shape::Server => 1_000_000,
            Shape::Queue => 2_000_000,
            Shape::Random => 1_000_000,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Shape::Churn => "1 thread, a ring of 512 objects of 16 B-4 KiB, oldest freed first",
            Shape::Server => "threads replace random slots of a shared array of 8-1000 B objects (cross-thread frees)",
            Shape::Queue => "a producer's 64 B objects freed by a consumer, batches of 256 through a bounded queue",
            Shape::Random => "threads each replace random ones of 256 live objects of 16 B-16 KiB",
        }
    }
}

/// The child's work: the shape's operations (`count` per thread, on `threads` threads) from the
/// generator of `seed`; the operations done, all threads.
pub fn workload(shape: Shape, count: usize, threads: usize, seed: u64) -> Result<u64, String> {
    match shape {
        Shape::Churn => churn::workload(count, seed),
        Shape::Server => server::workload(count, threads, seed),
        Shape::Queue => queue::workload(count),
        Shape::Random => random::workload(count, threads, seed),
    }
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    preloaded::check_all(&o.peers)?;
    let shapes: Vec<Shape> = if o.shapes.is_empty() { Shape::ALL.to_vec() } else { o.shapes.clone() };
    let n = o.peers.len();
    let count = |s: Shape| if o.count == 0 { s.default_count() } else { o.count };
    let mut got: Vec<Vec<Vec<Usage>>> = vec![vec![Vec::new(); n]; shapes.len()];
    let mut bar = Progress::new("small", o.rounds * n * shapes.len());
    for round in 0..o.rounds {
        for (j, &s) in shapes.iter().enumerate() {
            let job = Options { count: count(s), threads: s.threads(o.threads), ..o.clone() };
            for i in round_order(n, round) {
                got[j][i].push(child::measure(Experiment::Small, o.peers[i], &job, SEED + round as u64, Some(s))?);
                bar.step(&format!("{} {}", s.name(), o.peers[i].name()));
            }
        }
    }
    bar.finish();
    let glibc = o.peers.iter().position(|&k| k == PeerKind::Glibc);
    let mut results = Vec::new();
    let mut bars = Vec::new();
    let mut verdicts = Vec::new();
    for (j, &s) in shapes.iter().enumerate() {
        let per_cpu = |i: usize| median(&got[j][i].iter().map(|u| u.ops as f64 / (u.cpu_ms() / 1e3)).collect::<Vec<_>>());
        let per_s = |i: usize| median(&got[j][i].iter().map(|u| u.ops as f64 / (u.wall_ms / 1e3)).collect::<Vec<_>>());
        let x_glibc = |i: usize| glibc.map(|g| per_cpu(i) / per_cpu(g));
        results.extend(child::rows(&o.peers, &got[j], |i, m| {
            m.insert("shape".into(), json!(s.name()));
            m.insert("threads".into(), json!(s.threads(o.threads)));
            m.insert("ops".into(), json!(got[j][i].first().map_or(0, |u| u.ops)));
            m.insert("ops_per_cpu_s".into(), num(per_cpu(i).round()));
            m.insert("ops_x_glibc".into(), x_glibc(i).map_or(Value::Null, num));
            m.insert("ops_per_s".into(), num(per_s(i).round()));
        }));
        for (i, k) in o.peers.iter().enumerate() {
            bars.push((format!("{} {}", k.name(), s.name()), x_glibc(i).unwrap_or(per_cpu(i))));
        }
        let rss = |i: usize| median(&got[j][i].iter().map(|u| u.max_rss as f64).collect::<Vec<_>>());
        verdicts.extend(verdict(s, &o.peers, &per_cpu, &rss));
    }
    let summary = if verdicts.is_empty() {
        "goal: not computed (needs fallow or fallow-small and one of jemalloc, mimalloc, tcmalloc)".to_string()
    } else {
        format!("goal: ops per CPU-second >= the best of jemalloc, mimalloc, tcmalloc, peak RSS <= 1.1x their smallest: {}", verdicts.join("; "))
    };
    let (unit, what) = if glibc.is_some() { ("x glibc", "operations per CPU-second over glibc's") } else { ("ops/CPU-s", "operations per CPU-second") };
    Ok(Outcome {
        experiment: Experiment::Small,
        params: json!({
            "shapes": shapes.iter().map(|&s| json!({"shape": s.name(), "threads": s.threads(o.threads), "ops_per_thread": count(s), "what": s.what()})).collect::<Vec<_>>(),
            "shapes_human": shapes.iter().map(|&s| format!("{} {} ops x{}", s.name(), count(s), s.threads(o.threads))).collect::<Vec<_>>().join(", "),
            "seed": SEED, "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "summary": summary,
            "note": format!("every peer's own library as a program gets it: the child's malloc and free, Debian's jemalloc, \
                             mimalloc and tcmalloc and fallow's preload library by LD_PRELOAD (fallow-small: FALLOW_SMALL=1); \
                             every object written (a header with its length and value, its first 16 bytes, a byte per 4 KiB \
                             page, its last byte) and checked before its free; an operation is one malloc and one free; \
                             ops_per_cpu_s: operations (all threads) over the child's user + system time in the window, \
                             median over the rounds; ops_x_glibc: that over glibc's (above 1 is better); ops_per_s: over \
                             wall time; the window includes filling the live set and freeing it; {}", child::NOTE),
        }),
        results,
        chart: Chart { title: format!("small: the field's small-object shapes, {what} (higher is better)"), unit: unit.into(), bars, lines: None },
    })
}

/// The goal for one shape, when fallow (`fallow-small` if measured) and at least one of
/// jemalloc, mimalloc and tcmalloc are among the peers: its operations per CPU-second over the
/// best of theirs, its peak RSS over the smallest of theirs.
fn verdict(s: Shape, peers: &[PeerKind], per_cpu: &dyn Fn(usize) -> f64, rss: &dyn Fn(usize) -> f64) -> Option<String> {
    let ours = peers.iter().position(|&k| k == PeerKind::FallowSmall).or_else(|| peers.iter().position(|&k| k == PeerKind::Fallow))?;
    let field: Vec<usize> = (0..peers.len()).filter(|&i| matches!(peers[i], PeerKind::Jemalloc | PeerKind::Mimalloc | PeerKind::Tcmalloc)).collect();
    let best = field.iter().copied().max_by(|&a, &b| per_cpu(a).total_cmp(&per_cpu(b)))?;
    let least = field.iter().copied().map(rss).fold(f64::INFINITY, f64::min);
    let (speed, mem) = (per_cpu(ours) / per_cpu(best), rss(ours) / least);
    let met = if speed >= 1.0 && mem <= 1.1 { "met" } else { "not met" };
    Some(format!("{} {}: {speed:.2}x {}'s speed, {mem:.2}x the least RSS ({met})", s.name(), peers[ours].name(), peers[best].name()))
}
