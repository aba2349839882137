//! `fallow`: the benchmark command. `fallow demo` runs every experiment at small sizes and prints
//! one table; `fallow bench EXPERIMENT` runs one with its own options. Command-line parsing and the
//! run loop live here; the peers in `peers.rs`, the experiments in `experiments/`, measuring in
//! `measure.rs`, tables and files in `report.rs`, charts in `plot.rs`.

mod experiments;
mod measure;
mod peers;
mod plot;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

use experiments::{Experiment, Options, Outcome};
use peers::PeerKind;

#[derive(Parser)]
#[command(name = "fallow", version, about = "The seeds' experiments against glibc, jemalloc, mimalloc, mmap and fallow")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every experiment at small default sizes: one table on stdout, JSON and PNG files in --out.
    Demo {
        /// Where the JSON and PNG files go.
        #[arg(long, default_value = "fallow-results")]
        out: PathBuf,
        /// Comma-separated peers (glibc, jemalloc, mimalloc, mmap, fallow, fallow-nozero, fallow-noreport, all).
        #[arg(long, default_value = "all", value_parser = parse_peers)]
        allocators: PeerList,
        /// Most threads for the scale experiment (default: the online CPUs).
        #[arg(long)]
        threads: Option<usize>,
        /// Tiny sizes and one round (a smoke test; the numbers mean little).
        #[arg(long)]
        tiny: bool,
    },
    /// One experiment.
    Bench(BenchArgs),
    /// A density guest (started by the density experiment).
    #[command(name = "__guest", hide = true)]
    Guest {
        #[arg(long, value_parser = parse_peer)]
        allocator: PeerKind,
        #[arg(long, value_parser = measure::parse_size)]
        size: usize,
        #[arg(long, value_parser = measure::parse_size)]
        chunk: usize,
        #[arg(long)]
        cgroup: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct BenchArgs {
    #[arg(value_enum)]
    experiment: Experiment,
    /// Bytes (4096, 64KiB, 512MiB, 1GiB): pin: bytes obtained; density: G per guest; scale: block;
    /// stream: buffer; interference: churned block; realloc: final size.
    #[arg(long, value_parser = measure::parse_size)]
    size: Option<usize>,
    /// scale: most threads (1..N); default the online CPUs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Rounds; results are medians over rounds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: Option<u64>,
    /// Comma-separated peers (glibc, jemalloc, mimalloc, mmap, fallow, fallow-nozero, fallow-noreport, all).
    #[arg(long, default_value = "all", value_parser = parse_peers)]
    allocators: PeerList,
    /// Write the JSON record here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the PNG chart here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// pin: idle gap after the free (default 1000); density: how long each guest may take to
    /// settle (default 3000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    idle_ms: Option<u64>,
    /// density: run the peers at once (each with its own guests and budget) instead of in turn.
    #[arg(long)]
    parallel: bool,
    /// pin: mlock the memory (the VFIO pin case).
    #[arg(long)]
    lock: bool,
    /// pin: transparent huge pages.
    #[arg(long)]
    thp: bool,
    /// density: the budget (default 3.75 x --size).
    #[arg(long, value_parser = measure::parse_size)]
    budget: Option<usize>,
    /// density: the allocation size a guest uses to touch its G.
    #[arg(long, default_value = "64KiB", value_parser = measure::parse_size)]
    chunk: usize,
    /// density: the most guests started.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    guests: u64,
    /// scale: alloc+free pairs per thread; stream: buffers per round.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    count: Option<u64>,
    /// density: enforce the budget with a memory cgroup (auto: when the machine allows it) or by
    /// reading the guests' RSS.
    #[arg(long, value_enum, default_value = "auto")]
    enforce: experiments::Enforce,
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
        Experiment::Scale => 20_000,
        Experiment::Stream => 16,
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
        threads: measure::online_cpus(),
        rounds: e.default_rounds(),
        peers,
        idle_ms: e.default_idle_ms(),
        lock: false,
        thp: false,
        budget: 0,
        chunk: 64 << 10,
        max_guests: 8,
        enforce: experiments::Enforce::Auto,
        parallel: e == Experiment::Density,
        count: default_count(e),
    }
}

fn bench(a: BenchArgs) -> Result<(), String> {
    let e = a.experiment;
    let mut o = options(e, flatten(a.allocators));
    if let Some(s) = a.size {
        o.size = s;
    }
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
    o.chunk = a.chunk;
    o.max_guests = a.guests as usize;
    o.enforce = a.enforce;
    let outcome = e.run(&o)?;
    println!("{}", outcome.chart.title);
    print!("{}", report::experiment_table(&outcome));
    let machine = measure::machine();
    if let Some(path) = &a.json {
        report::write_json(&outcome.to_json(&machine), path)?;
        println!("JSON: {}", path.display());
    }
    if let Some(path) = &a.plot {
        report::write_plot(&outcome, path)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

fn demo(out: PathBuf, peers: PeerList, threads: Option<usize>, tiny: bool) -> Result<(), String> {
    let peers = flatten(peers);
    let t0 = Instant::now();
    let machine = measure::machine();
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let threads = threads.unwrap_or_else(measure::online_cpus).max(1);
    let mut outcomes: Vec<Outcome> = Vec::new();
    for e in Experiment::ALL {
        let mut o = options(e, peers.clone());
        o.threads = threads;
        if tiny {
            o.rounds = 1;
            o.idle_ms = 50;
            o.max_guests = 3;
            o.size = match e {
                Experiment::Pin => 8 << 20,
                Experiment::Density => 16 << 20,
                Experiment::Scale => 16 << 10,
                Experiment::Stream => 4 << 20,
                Experiment::Interference => 1 << 20,
                Experiment::Realloc => 8 << 20,
            };
            o.count = match e {
                Experiment::Scale => 500,
                Experiment::Stream => 4,
                _ => 1,
            };
        }
        let outcome = e.run(&o).map_err(|err| format!("{}: {err}", e.name()))?;
        report::write_json(&outcome.to_json(&machine), &out.join(format!("{}.json", e.name())))?;
        report::write_plot(&outcome, &out.join(format!("{}.png", e.name())))?;
        outcomes.push(outcome);
    }
    let names: Vec<&str> = peers.iter().map(|k| k.name()).collect();
    let p = |e: Experiment| outcomes.iter().find(|o| o.experiment == e).map(|o| o.params.clone()).unwrap_or_default();
    let (pin, density, scale, stream, interference, realloc) = (
        p(Experiment::Pin),
        p(Experiment::Density),
        p(Experiment::Scale),
        p(Experiment::Stream),
        p(Experiment::Interference),
        p(Experiment::Realloc),
    );
    println!(
        "fallow demo: pin {} after {} ms idle; density G={} budget {} ({}, peers in parallel, settle wait {} ms); scale {} blocks; stream {} x{}; \
         interference churn {}; realloc 1MiB..{}",
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
    );
    print!("{}", report::demo_table(&outcomes, &names, threads));
    println!(
        "pin x glibc: glibc's time over the peer's (above 1 is faster); density fit: guests that fit (of {}); \
         settled MiB: a guest's resident memory after freeing and idling; scale: ns per alloc+free pair; \
         stream memset ceiling {} GiB/s; interference: foreground slowdown (x alone); medians over rounds \
         (pin {}, density {}, scale {}, stream {}, interference {}, realloc {}).",
        density["max_guests"],
        stream["memset_gib_per_s"],
        pin["rounds"],
        density["rounds"],
        scale["rounds"],
        stream["rounds"],
        interference["rounds"],
        realloc["rounds"],
    );
    let shown = std::fs::canonicalize(&out).unwrap_or(out);
    println!("results (JSON and PNG): {}  ({:.1} s)", shown.display(), t0.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { out, allocators, threads, tiny } => demo(out, allocators, threads, tiny),
        Command::Bench(a) => bench(a),
        Command::Guest { allocator, size, chunk, cgroup } => {
            experiments::density::guest_main(allocator, size, chunk, cgroup)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fallow: error: {e}");
            ExitCode::FAILURE
        }
    }
}
