//! `fallow`: the benchmark command. `fallow demo` runs every experiment at small sizes and prints
//! one table; `fallow bench EXPERIMENT` runs one with its own options; `fallow run` runs a user's
//! program under the preload library and summarizes what fallow did for it (`run.rs`), `fallow
//! compare` runs it under each allocator (`compare.rs`), both starting it through `launch.rs`.
//! Command-line parsing and the run loop live here; the peers in `peers.rs`, the experiments in
//! `experiments/`, measuring in `measure.rs`, tables and files in `report.rs`, charts in `plot.rs`.

#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]

mod compare;
mod experiments;
mod launch;
mod measure;
mod peers;
mod plot;
mod report;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

use experiments::{Experiment, Options, Outcome};
use peers::PeerKind;

#[derive(Parser)]
#[command(
    name = "fallow",
    version,
    about = "Run a program under fallow, compare allocators on it, or run the seeds' experiments",
    allow_negative_numbers = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every experiment but exit at small sizes: one table on stdout, JSON and PNG files in --out.
    Demo {
        /// Where the JSON and PNG files go.
        #[arg(long, default_value = "fallow-results")]
        out: PathBuf,
        /// Comma-separated peers (glibc, jemalloc, mimalloc, mmap, fallow, fallow-delay, fallow-nozero,
        /// fallow-noreport, fallow-noworkers, fallow-thp, all; tcmalloc and fallow-small for large,
        /// mixed, small and burst only; small and burst take those a program can preload);
        /// default each experiment's own (as `bench`).
        #[arg(long, value_parser = parse_peers)]
        allocators: Option<PeerList>,
        /// Most threads for the scale experiment (default: the online CPUs).
        #[arg(long)]
        threads: Option<usize>,
        /// Tiny sizes and one round (a smoke test; the numbers mean little).
        #[arg(long)]
        tiny: bool,
    },
    /// One experiment.
    Bench(Box<BenchArgs>),
    /// Run a program under fallow (by LD_PRELOAD) and say what fallow did for it.
    Run(Box<run::RunArgs>),
    /// Run a program under glibc, jemalloc, mimalloc, tcmalloc and fallow, and compare.
    Compare(Box<compare::CompareArgs>),
    /// A density guest (started by the density experiment).
    #[command(name = "__guest", hide = true)]
    Guest(GuestArgs),
    /// A pressure guest (started by the pressure experiment).
    #[command(name = "__pressure_guest", hide = true)]
    PressureGuest(GuestArgs),
    /// An exit child (started by the exit experiment).
    #[command(name = "__exit_child", hide = true)]
    ExitChild {
        #[arg(long, value_parser = parse_peer)]
        allocator: PeerKind,
        #[arg(long, value_parser = measure::parse_size)]
        size: usize,
        #[arg(long, value_parser = measure::parse_size)]
        block: usize,
        #[arg(long)]
        idle_ms: u64,
        #[arg(long, value_enum)]
        way: experiments::exit::Way,
    },
    /// One measurement of one peer (started by the large, mixed and small experiments).
    #[command(name = "__shape_child", hide = true)]
    ShapeChild(experiments::child::ChildArgs),
    /// One peer's burst program (started by the burst experiment).
    #[command(name = "__burst_child", hide = true)]
    BurstChild(experiments::burst_child::BurstArgs),
}

/// What a guest process is started with (`experiments::guests::GuestPipe`).
#[derive(clap::Args)]
struct GuestArgs {
    #[arg(long, value_parser = parse_peer)]
    allocator: PeerKind,
    #[arg(long, value_parser = measure::parse_size)]
    size: usize,
    #[arg(long, value_parser = measure::parse_size)]
    chunk: usize,
    #[arg(long)]
    cgroup: Option<PathBuf>,
}

#[derive(clap::Args)]
#[command(allow_negative_numbers = true)]
struct BenchArgs {
    #[arg(value_enum)]
    experiment: Experiment,
    /// Bytes (4096, 64KiB, 512MiB, 1GiB): pin: bytes obtained; density: G per guest; scale: block;
    /// stream: buffer; interference: churned block; realloc: final size; reuse: the one cell
    /// (instead of the sweep); exit: bytes the child touches and frees; pressure: W, what a
    /// guest works on in its turn (it keeps W/8 between turns); large: the largest buffer (default
    /// 25MiB; the smallest is a fifth); mixed: the largest block (default 4MiB; the smallest is a
    /// 64th); sparse: the largest zeroed buffer (default 256MiB; the smallest is a quarter); burst:
    /// the bytes of small objects built (default 1GiB). Not small (each shape has the
    /// sizes of the program it copies).
    #[arg(long, value_parser = measure::parse_size)]
    size: Option<usize>,
    /// scale: most threads (1..N), default the online CPUs; reuse: the second thread count
    /// measured beside 1 (default 2); mixed: the threads (default 2); small: the threads of server
    /// and random (default the online CPUs, at least 2).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Rounds; results are medians over rounds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: Option<u64>,
    /// Comma-separated peers (glibc, jemalloc, mimalloc, mmap, fallow, fallow-delay, fallow-nozero,
    /// fallow-noreport, fallow-noworkers, fallow-thp, all; tcmalloc and fallow-small, preloaded, for
    /// large, mixed, small and burst only); default all but fallow-delay and fallow-thp (large,
    /// mixed: and tcmalloc where installed; exit: glibc, jemalloc, mimalloc and the fallow default,
    /// nozero and noworkers variants; pressure: glibc, jemalloc, mimalloc, fallow-delay and fallow;
    /// small, burst: glibc, jemalloc, mimalloc, tcmalloc where installed, and fallow, every one
    /// preloaded as a program gets it; fallow-small is fallow's preload with FALLOW_SMALL=1).
    #[arg(long, value_parser = parse_peers)]
    allocators: Option<PeerList>,
    /// Write the JSON record here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the PNG chart here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// pin: idle gap after the free (default 1000); density: how long each guest may take to
    /// settle (default 3000); exit: the child's sleep between freeing and leaving (default 20);
    /// pressure: the gap after each guest's turn (default 100); burst: the idle time after the
    /// frees, resident memory read every 200 ms (default 5000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    idle_ms: Option<u64>,
    /// density, pressure: run the peers at once (each with its own guests and budget) instead of in
    /// turn; burst: the peers' children at once.
    #[arg(long)]
    parallel: bool,
    /// pin: mlock the memory (the VFIO pin case).
    #[arg(long)]
    lock: bool,
    /// pin: transparent huge pages.
    #[arg(long)]
    thp: bool,
    /// density: the budget (default 3.75 x --size); pressure: the guests' budget (default: their
    /// live data plus half of what one guest frees, plus the guest programs themselves).
    #[arg(long, value_parser = measure::parse_size)]
    budget: Option<usize>,
    /// density: the allocation size a guest uses to touch its G (default 64KiB); pressure: the
    /// block size of a guest's allocations (default 1MiB).
    #[arg(long, value_parser = measure::parse_size)]
    chunk: Option<usize>,
    /// density: the most guests started (default 8); pressure: the guests (default 4).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    guests: Option<u64>,
    /// scale: alloc+free pairs per thread; stream: buffers per round; pressure: turns per guest;
    /// large: steps (default 2000); mixed: operations per thread (default 10000); sparse: buffers
    /// (default 40); small: operations
    /// per thread of every shape (default: churn 4000000, server 1000000, queue 2000000, random 1000000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    count: Option<u64>,
    /// density, pressure: enforce the budget with a memory cgroup (auto: when the machine allows it) or by
    /// reading the guests' RSS (default auto).
    #[arg(long, value_enum)]
    enforce: Option<experiments::Enforce>,
    /// reuse: the cells of the sweep, comma-separated (default 512KiB,1MiB,8MiB,64MiB; a cell's
    /// requests are uniform in [size/2, 1.375 x size], straddling its size).
    #[arg(long, value_parser = parse_sizes)]
    sizes: Option<SizeList>,
    /// reuse: malloc, calloc, or both (comma-separated; default both).
    #[arg(long, value_enum, value_delimiter = ',')]
    modes: Vec<experiments::reuse::Mode>,
    /// reuse: the time of one measurement (default 300).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    duration_ms: Option<u64>,
    /// exit: CPU-bound processes beside every measurement (default: the online CPUs; 0: none).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=256))]
    hogs: Option<u64>,
    /// exit: how the child leaves: return, _exit, signal (comma-separated; default all three).
    #[arg(long, value_enum, value_delimiter = ',')]
    exits: Vec<experiments::exit::Way>,
    /// exit: the child's allocation block (default 16MiB).
    #[arg(long, value_parser = measure::parse_size)]
    block: Option<usize>,
    /// small: churn, server, queue, random (comma-separated; default all four).
    #[arg(long, value_enum, value_delimiter = ',')]
    shapes: Vec<experiments::small::Shape>,
}

/// A list of sizes as given on the command line.
#[derive(Clone, Debug)]
struct SizeList(Vec<usize>);

fn parse_sizes(s: &str) -> Result<SizeList, String> {
    let v: Vec<usize> = s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(measure::parse_size).collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err("the size list is empty".into());
    }
    Ok(SizeList(v))
}

/// A list of peers as given on the command line.
#[derive(Clone, Debug)]
struct PeerList(Vec<PeerKind>);

fn parse_peers(s: &str) -> Result<PeerList, String> {
    PeerKind::parse_list(s).map(PeerList)
}

fn parse_peer(s: &str) -> Result<PeerKind, String> {
    PeerKind::parse(s).ok_or_else(|| format!("unknown allocator '{s}'"))
}

fn default_count(e: Experiment) -> usize {
    match e {
        // At least ~10 ms a measurement at ~10 ns a pair: a shorter window measures the start of
        // the workers and the scheduler more than the pairs (`TIME_CAP` bounds a slow peer).
        Experiment::Scale => 1_000_000,
        Experiment::Stream => 16,
        Experiment::Pressure => 3,
        Experiment::Large => experiments::large::STEPS,
        Experiment::Mixed => experiments::mixed::OPS,
        Experiment::Sparse => experiments::sparse::STEPS,
        Experiment::Small => 0,
        _ => 1,
    }
}

fn flatten(lists: PeerList) -> Vec<PeerKind> {
    let mut out: Vec<PeerKind> = Vec::new();
    for k in lists.0 {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

fn options(e: Experiment, peers: Vec<PeerKind>) -> Options {
    Options {
        size: e.default_size(),
        threads: if matches!(e, Experiment::Reuse | Experiment::Mixed) { 2 } else { measure::online_cpus() },
        rounds: e.default_rounds(),
        peers,
        idle_ms: e.default_idle_ms(),
        lock: false,
        thp: false,
        budget: 0,
        chunk: if e == Experiment::Pressure { 1 << 20 } else { 64 << 10 },
        max_guests: if e == Experiment::Pressure { 4 } else { 8 },
        enforce: experiments::Enforce::Auto,
        parallel: matches!(e, Experiment::Density | Experiment::Burst),
        count: default_count(e),
        sizes: Vec::new(),
        modes: Vec::new(),
        duration_ms: 300,
        hogs: measure::online_cpus(),
        exits: Vec::new(),
        block: 16 << 20,
        shapes: Vec::new(),
    }
}

/// The options given that `e` does not use, by their names on the command line.
fn unused_options(e: Experiment, a: &BenchArgs) -> Vec<&'static str> {
    use Experiment::*;
    let given: [(&'static str, bool, &[Experiment]); 18] = [
        ("--threads", a.threads.is_some(), &[Scale, Reuse, Mixed, Small]),
        ("--idle-ms", a.idle_ms.is_some(), &[Pin, Density, Exit, Pressure, Burst]),
        ("--parallel", a.parallel, &[Density, Pressure, Burst]),
        ("--lock", a.lock, &[Pin]),
        ("--thp", a.thp, &[Pin]),
        ("--budget", a.budget.is_some(), &[Density, Pressure]),
        ("--chunk", a.chunk.is_some(), &[Density, Pressure]),
        ("--guests", a.guests.is_some(), &[Density, Pressure]),
        ("--count", a.count.is_some(), &[Scale, Stream, Pressure, Large, Mixed, Sparse, Small]),
        ("--enforce", a.enforce.is_some(), &[Density, Pressure]),
        ("--sizes", a.sizes.is_some(), &[Reuse]),
        ("--modes", !a.modes.is_empty(), &[Reuse]),
        ("--duration-ms", a.duration_ms.is_some(), &[Reuse]),
        ("--hogs", a.hogs.is_some(), &[Exit]),
        ("--exits", !a.exits.is_empty(), &[Exit]),
        ("--block", a.block.is_some(), &[Exit]),
        ("--shapes", !a.shapes.is_empty(), &[Small]),
        ("--size", a.size.is_some() && a.sizes.is_some(), &[]),
    ];
    given.iter().filter(|(_, set, applies)| *set && !applies.contains(&e)).map(|(name, _, _)| *name).collect()
}

fn bench(a: BenchArgs) -> Result<(), String> {
    let e = a.experiment;
    let unused = unused_options(e, &a);
    if !unused.is_empty() {
        let what = if unused.len() == 1 { "does not apply" } else { "do not apply" };
        if unused == ["--size"] {
            return Err("reuse takes --size (one largest request) or --sizes (a sweep), not both".into());
        }
        let (list, name) = (unused.join(", "), e.name());
        return Err(format!("{list} {what} to the {name} experiment ('fallow bench --help' says which options apply where)"));
    }
    if e == Experiment::Small && a.size.is_some() {
        return Err("small takes no --size: each shape has the sizes of the program it copies (--shapes, --count, --threads)".into());
    }
    let peers = a.allocators.map(flatten).unwrap_or_else(|| e.default_peers());
    let mut o = options(e, peers);
    if let Some(s) = a.size {
        o.size = s;
        o.sizes = vec![s];
    }
    if let Some(s) = a.sizes {
        o.sizes = s.0;
    }
    if let Some(d) = a.duration_ms {
        o.duration_ms = d;
    }
    if let Some(h) = a.hogs {
        o.hogs = h as usize;
    }
    o.modes = a.modes;
    o.shapes = a.shapes;
    o.exits = a.exits;
    o.block = a.block.unwrap_or(o.block);
    if let Some(t) = a.threads {
        o.threads = t as usize;
    }
    if let Some(r) = a.rounds {
        o.rounds = r as usize;
    }
    if let Some(c) = a.count {
        o.count = c as usize;
    }
    if let Some(ms) = a.idle_ms {
        o.idle_ms = ms;
    }
    o.parallel = a.parallel;
    o.lock = a.lock;
    o.thp = a.thp;
    o.budget = a.budget.unwrap_or(0);
    o.chunk = a.chunk.unwrap_or(o.chunk);
    o.max_guests = a.guests.map_or(o.max_guests, |g| g as usize);
    o.enforce = a.enforce.unwrap_or(o.enforce);
    // A bad output path is an error before the experiment runs, not after.
    for p in [&a.json, &a.plot].into_iter().flatten() {
        report::check_writable(p)?;
    }
    let outcome = e.run(&o)?;
    println!("{}", outcome.chart.title);
    print!("{}", report::experiment_table(&outcome));
    if let Some(line) = outcome.params.get("summary").and_then(|v| v.as_str()) {
        println!("{line}");
    }
    let machine = measure::machine();
    if let Some(path) = &a.json {
        report::write_json(&outcome.to_json(&machine), path)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        report::write_plot(&outcome, path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn demo(out: PathBuf, peers: Option<PeerList>, threads: Option<usize>, tiny: bool) -> Result<(), String> {
    let given = peers.map(flatten);
    let t0 = Instant::now();
    let machine = measure::machine();
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let threads = threads.unwrap_or_else(measure::online_cpus).max(1);
    let peers_of = |e: Experiment| e.peers_of(given.as_deref());
    // small and burst need the peers' libraries (fallow's preload library among them): said now,
    // not after the other experiments.
    for e in [Experiment::Small, Experiment::Burst] {
        experiments::preloaded::check_all(&peers_of(e)).map_err(|err| format!("{}: {err}", e.name()))?;
    }
    let mut outcomes: Vec<Outcome> = Vec::new();
    for e in Experiment::DEMO {
        let mut o = options(e, peers_of(e));
        if o.peers.is_empty() {
            continue;
        }
        o.threads = threads;
        if e == Experiment::Reuse {
            // The 1-thread loop over the default sweep, short measurements.
            o.threads = 1;
            o.duration_ms = 100;
        }
        if e == Experiment::Pressure {
            // 4 guests of 64 MiB, 3 turns each: 12 turns a peer, peers in turn.
            o.size = 64 << 20;
        }
        // A child per peer and round: a few hundred steps or operations each; mixed on its own
        // default of 2 threads (the demo's --threads is scale's).
        if e == Experiment::Large {
            (o.size, o.count) = (8 << 20, 300);
        }
        if e == Experiment::Mixed {
            (o.size, o.count, o.threads) = (2 << 20, 300, 2);
        }
        if e == Experiment::Sparse {
            (o.size, o.count) = (128 << 20, 20);
        }
        // small: every shape at its default count; burst: 128 MiB, the peers at once, 3 s idle
        // (longer than fallow's 2 s reporting delay).
        if e == Experiment::Burst {
            (o.size, o.idle_ms) = (128 << 20, 3000);
        }
        if tiny {
            o.rounds = 1;
            o.idle_ms = 50;
            o.max_guests = if e == Experiment::Pressure { 2 } else { 3 };
            o.size = match e {
                Experiment::Pin => 8 << 20,
                Experiment::Density => 16 << 20,
                Experiment::Scale => 16 << 10,
                Experiment::Stream => 4 << 20,
                Experiment::Interference => 1 << 20,
                Experiment::Realloc => 8 << 20,
                Experiment::Reuse => 64 << 10,
                Experiment::Exit => 8 << 20,
                Experiment::Pressure => 8 << 20,
                Experiment::Large => 1 << 20,
                Experiment::Mixed => 256 << 10,
                Experiment::Sparse => 1 << 20,
                Experiment::Small => 0,
                Experiment::Burst => 4 << 20,
            };
            o.sizes = if e == Experiment::Reuse { vec![64 << 10, 1 << 20] } else { Vec::new() };
            o.duration_ms = 20;
            o.count = match e {
                Experiment::Scale => 500,
                Experiment::Stream => 4,
                Experiment::Pressure => 2,
                Experiment::Large | Experiment::Mixed => 30,
                Experiment::Sparse => 4,
                Experiment::Small => 2000,
                _ => 1,
            };
        }
        let outcome = e.run(&o).map_err(|err| format!("{}: {err}", e.name()))?;
        report::write_json(&outcome.to_json(&machine), &out.join(format!("{}.json", e.name())))?;
        report::write_plot(&outcome, &out.join(format!("{}.png", e.name())))?;
        outcomes.push(outcome);
    }
    // The table's rows: every peer of any experiment, in the order of `PeerKind::every`.
    let names: Vec<&str> = PeerKind::every()
        .filter(|k| outcomes.iter().any(|o| o.results.iter().any(|r| r["peer"] == k.name())))
        .map(|k| k.name())
        .collect();
    let p = |e: Experiment| outcomes.iter().find(|o| o.experiment == e).map(|o| o.params.clone()).unwrap_or_default();
    let (pin, density, scale, stream, interference, realloc) = (
        p(Experiment::Pin),
        p(Experiment::Density),
        p(Experiment::Scale),
        p(Experiment::Stream),
        p(Experiment::Interference),
        p(Experiment::Realloc),
    );
    let (reuse, pressure, large, mixed) = (p(Experiment::Reuse), p(Experiment::Pressure), p(Experiment::Large), p(Experiment::Mixed));
    let (sparse, small, burst) = (p(Experiment::Sparse), p(Experiment::Small), p(Experiment::Burst));
    let list = |v: &serde_json::Value| {
        v.as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(",")).unwrap_or_default()
    };
    println!(
        "fallow demo: pin {} after {} ms idle; density G={} budget {} ({}, peers in parallel, settle wait {} ms); scale {} blocks; stream {} x{}; \
         interference churn {}; realloc 1MiB..{}; reuse {} for {} ms, 1 thread; pressure {} guests of {} in turns, \
         {} each, under {} MiB ({}); large {} steps up to {}; mixed {} ops x{} up to {}; sparse {} zeroed buffers up to {}; small {}; burst {} built, 90% freed, {} ms idle",
        pin["size_human"].as_str().unwrap_or("?"),
        pin["idle_ms"],
        density["guest_human"].as_str().unwrap_or("?"),
        density["budget_human"].as_str().unwrap_or("?"),
        density["enforcement"].as_str().unwrap_or("?"),
        density["settle_wait_ms"],
        scale["size_human"].as_str().unwrap_or("?"),
        stream["size_human"].as_str().unwrap_or("?"),
        stream["buffers_per_round"],
        interference["churn_human"].as_str().unwrap_or("?"),
        realloc["to_human"].as_str().unwrap_or("?"),
        list(&reuse["sizes"]),
        reuse["duration_ms"],
        pressure["guests"],
        pressure["guest_human"].as_str().unwrap_or("?"),
        pressure["cycles"],
        pressure["budget_mib"],
        pressure["enforcement"].as_str().unwrap_or("?"),
        large["steps"],
        large["size_human"].as_str().unwrap_or("?"),
        mixed["ops_per_thread"],
        mixed["threads"],
        mixed["size_human"].as_str().unwrap_or("?"),
        sparse["steps"],
        sparse["size_human"].as_str().unwrap_or("?"),
        small["shapes_human"].as_str().unwrap_or("?"),
        burst["size_human"].as_str().unwrap_or("?"),
        burst["idle_ms"],
    );
    print!("{}", report::demo_table(&outcomes, &names, threads));
    println!(
        "pin x glibc: glibc's time over the peer's (above 1 is faster); density fit: guests that fit (of {}); \
         settled MiB: a guest's resident memory after freeing and idling; scale: ns per alloc+free pair; \
         stream memset ceiling {} GiB/s; interference: foreground slowdown (x alone); reuse: calls per second \
         over glibc's (above 1 is faster), worst: the lowest over sizes and modes; pressure killed: guests \
         OOM-killed (without a cgroup: turns over budget), peak MiB: the guests' summed RSS; large: wall ms and \
         peak RSS MiB, a child per peer; sparse: peak RSS MiB of zeroed buffers read whole and written one page in 64, a child per peer; mixed and small's shapes: operations per CPU-second over glibc's; burst end \
         MiB: resident after the idle time (live data {} MiB); medians over rounds (pin {}, density {}, scale {}, stream {}, \
         interference {}, realloc {}, reuse {}, pressure {}, large {}, mixed {}, sparse {}, small {}, burst {}).",
        density["max_guests"],
        stream["memset_gib_per_s"],
        burst["live_mib"],
        pin["rounds"],
        density["rounds"],
        scale["rounds"],
        stream["rounds"],
        interference["rounds"],
        realloc["rounds"],
        reuse["rounds"],
        pressure["rounds"],
        large["rounds"],
        mixed["rounds"],
        sparse["rounds"],
        small["rounds"],
        burst["rounds"],
    );
    let shown = std::fs::canonicalize(&out).unwrap_or(out);
    println!("results (JSON and PNG): {}  ({:.1} s)", shown.display(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// A command-line error as one plain sentence: clap's first paragraph (the error and what it
/// lists on the lines below it) on one line, without its usage, tip or help pointer.
fn usage_error(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut words: Vec<&str> = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if !l.starts_with("tip:") {
            words.push(l.strip_prefix("error: ").unwrap_or(l));
        }
    }
    words.join(" ")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            let sub = std::env::args().nth(1).filter(|a| ["demo", "bench", "run", "compare"].contains(&a.as_str()));
            let help = match sub {
                Some(c) => format!("'fallow {c} --help' lists its options"),
                None => "'fallow help' lists the commands".into(),
            };
            eprintln!("fallow: error: {} ({help})", usage_error(&e));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Demo { out, allocators, threads, tiny } => demo(out, allocators, threads, tiny),
        Command::Bench(a) => bench(*a),
        Command::Run(a) => match run::main(*a) {
            Ok(status) => return ExitCode::from(status),
            Err(e) => Err(e),
        },
        Command::Compare(a) => compare::main(*a),
        Command::Guest(g) => experiments::density::guest_main(g.allocator, g.size, g.chunk, g.cgroup),
        Command::PressureGuest(g) => experiments::pressure::guest_main(g.allocator, g.size, g.chunk, g.cgroup),
        Command::ExitChild { allocator, size, block, idle_ms, way } => {
            experiments::exit::child_main(allocator, size, block, idle_ms, way)
        }
        Command::ShapeChild(a) => experiments::child::child_main(a),
        Command::BurstChild(a) => experiments::burst_child::child_main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fallow: error: {e}");
            ExitCode::FAILURE
        }
    }
}
