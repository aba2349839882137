//! The experiments, one file each, and what they share: their options, their outcome (the JSON
//! record and a bar chart, or lines over time), and running peers interleaved. Guest processes,
//! their budget and running their peers' rounds are in `guests.rs` (density, pressure);
//! pressure's arithmetic in `timeline.rs`; a peer as a program gets it, its library preloaded into
//! a child process, in `preloaded.rs` (small, burst).
//!
//! Every experiment builds all its peers in this process (large, mixed and small: in a child
//! process per measurement, `child.rs`; burst: `burst_child.rs`), then for each round measures every peer once in turn (A B C, then B C A, ...: the starting peer rotates so that no peer always
//! comes first after an idle gap), and reports per peer the median over rounds next to min, max
//! and the median CPU time. Comparisons are only ever made between peers of the same run.

pub mod burst;
pub mod burst_child;
pub mod child;
pub mod density;
pub mod exit;
mod guests;
pub mod interference;
pub mod large;
pub mod mixed;
pub mod pin;
pub mod preloaded;
pub mod pressure;
pub mod realloc;
pub mod reuse;
pub mod scale;
pub mod small;
pub mod sparse;
pub mod stream;
mod timeline;

use serde_json::{Map, Value};

use crate::peers::{Peer, PeerKind, Setup};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Experiment {
    Pin,
    Density,
    Scale,
    Stream,
    Interference,
    Realloc,
    Reuse,
    Exit,
    Pressure,
    Large,
    Mixed,
    Sparse,
    Small,
    Burst,
}

impl Experiment {
    /// The demo's experiments, in its order. Not exit: with the CPUs loaded, a fallow child can
    /// take seconds to leave, far more than the demo can spend (`fallow bench exit` measures it).
    pub const DEMO: [Experiment; 13] = [
        Experiment::Pin,
        Experiment::Density,
        Experiment::Scale,
        Experiment::Stream,
        Experiment::Interference,
        Experiment::Realloc,
        Experiment::Reuse,
        Experiment::Pressure,
        Experiment::Large,
        Experiment::Mixed,
        Experiment::Sparse,
        Experiment::Small,
        Experiment::Burst,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Experiment::Pin => "pin",
            Experiment::Density => "density",
            Experiment::Scale => "scale",
            Experiment::Stream => "stream",
            Experiment::Interference => "interference",
            Experiment::Realloc => "realloc",
            Experiment::Reuse => "reuse",
            Experiment::Exit => "exit",
            Experiment::Pressure => "pressure",
            Experiment::Large => "large",
            Experiment::Mixed => "mixed",
            Experiment::Sparse => "sparse",
            Experiment::Small => "small",
            Experiment::Burst => "burst",
        }
    }

    /// Whether each measurement runs in a child process of its own (`child.rs`; burst:
    /// `burst_child.rs`): its peak RSS is the measurement's alone, and preloaded peers (tcmalloc,
    /// fallow-small) can run.
    pub fn in_children(self) -> bool {
        matches!(self, Experiment::Large | Experiment::Mixed | Experiment::Sparse | Experiment::Small | Experiment::Burst)
    }

    /// Default sizes (reuse: what `--size` would be; its default is a sweep of sizes; small: none,
    /// its shapes have the sizes of the programs they copy).
    pub fn default_size(self) -> usize {
        match self {
            Experiment::Pin => 256 << 20,
            Experiment::Density => 256 << 20,
            Experiment::Scale => 16 << 10,
            Experiment::Stream => 32 << 20,
            Experiment::Interference => 16 << 20,
            Experiment::Realloc => 128 << 20,
            Experiment::Reuse => 1 << 20,
            Experiment::Exit => 256 << 20,
            Experiment::Pressure => 256 << 20,
            Experiment::Large => large::SIZE,
            Experiment::Mixed => mixed::SIZE,
            Experiment::Sparse => sparse::SIZE,
            Experiment::Small => 0,
            Experiment::Burst => burst::SIZE,
        }
    }

    /// The peers when `--allocators` is not given: every one linked in but `fallow-delay` (which
    /// differs from `fallow` under memory pressure only) and `fallow-thp` (a setting, not the
    /// default), and for the experiments that run children tcmalloc too where it is installed; but
    /// for exit the malloc-like libraries and the fallow variants that differ in their background
    /// workers, for pressure the malloc-like libraries and fallow with and without the limit
    /// and the pressure signal, and for small and burst the libraries a program would preload
    /// (glibc, jemalloc, mimalloc, tcmalloc where installed, fallow; `fallow-small` when asked for).
    pub fn default_peers(self) -> Vec<PeerKind> {
        match self {
            Experiment::Pressure => vec![
                PeerKind::Glibc,
                PeerKind::Jemalloc,
                PeerKind::Mimalloc,
                PeerKind::FallowDelay,
                PeerKind::Fallow,
            ],
            Experiment::Exit => vec![
                PeerKind::Glibc,
                PeerKind::Jemalloc,
                PeerKind::Mimalloc,
                PeerKind::Fallow,
                PeerKind::FallowNozero,
                PeerKind::FallowNoworkers,
            ],
            Experiment::Small | Experiment::Burst => preloaded::default_peers(),
            e => PeerKind::every()
                .filter(|&k| !matches!(k, PeerKind::FallowDelay | PeerKind::FallowThp))
                .filter(|&k| k.preload().is_none_or(|lib| e.in_children() && crate::launch::peer_library(lib).is_some()))
                .collect(),
        }
    }

    /// The peers of the demo's run: those given that can run here (small and burst: those a
    /// program can preload, `preloaded::PEERS`; the experiments that run no children: not the
    /// preloaded peers; none left skips the experiment), else the default ones.
    pub fn peers_of(self, given: Option<&[PeerKind]>) -> Vec<PeerKind> {
        let Some(g) = given else { return self.default_peers() };
        let fits = |k: &PeerKind| {
            if preloaded::runs(self) {
                preloaded::PEERS.contains(k)
            } else {
                self.in_children() || k.preload().is_none()
            }
        };
        g.iter().copied().filter(fits).collect()
    }

    pub fn default_rounds(self) -> usize {
        match self {
            Experiment::Density | Experiment::Pressure | Experiment::Burst => 1,
            Experiment::Interference => 5,
            // Its goal is a ratio of 0.97 at every cell; on this machine a round's ratio moves by
            // +-10%, and the median of 3 fell to 0.89-0.95 in some cell of a run where 15 rounds
            // gave 0.99-1.01.
            Experiment::Reuse => 9,
            // The two-thread shapes are bimodal on this machine: glibc's server and queue ran
            // 48-186 ms and 64-353 ms over 5 rounds of one run, as the two threads happened to
            // share a CPU or not.
            Experiment::Small => 5,
            _ => 3,
        }
    }

    /// pin: the idle gap; density: how long a guest may take to settle (longer than fallow's
    /// default reporting delay of 2 s, so that reporting can show); exit: the child's sleep
    /// between freeing and leaving; pressure: the gap after each turn (much shorter than the
    /// reporting delay: a clock alone gives nothing back in time); burst: the idle time after the
    /// frees.
    pub fn default_idle_ms(self) -> u64 {
        match self {
            Experiment::Density => 3000,
            Experiment::Pressure => 100,
            Experiment::Exit => 20,
            Experiment::Burst => burst::IDLE_MS,
            _ => 1000,
        }
    }

    pub fn run(self, o: &Options) -> Result<Outcome, String> {
        match self {
            Experiment::Pin => pin::run(o),
            Experiment::Density => density::run(o),
            Experiment::Scale => scale::run(o),
            Experiment::Stream => stream::run(o),
            Experiment::Interference => interference::run(o),
            Experiment::Realloc => realloc::run(o),
            Experiment::Reuse => reuse::run(o),
            Experiment::Exit => exit::run(o),
            Experiment::Pressure => pressure::run(o),
            Experiment::Large => large::run(o),
            Experiment::Sparse => sparse::run(o),
            Experiment::Mixed => mixed::run(o),
            Experiment::Small => small::run(o),
            Experiment::Burst => burst::run(o),
        }
    }
}

/// Options of one experiment run (each experiment reads the ones it needs).
#[derive(Clone, Debug)]
pub struct Options {
    pub size: usize,
    pub threads: usize,
    pub rounds: usize,
    pub peers: Vec<PeerKind>,
    pub idle_ms: u64,
    pub lock: bool,
    pub thp: bool,
    /// density: the budget in bytes (0: 3.75 x size); pressure: the same (0: from the live data);
    /// both: the allocation chunk of a guest, the guests (density: the most started).
    pub budget: usize,
    pub chunk: usize,
    pub max_guests: usize,
    /// density and pressure: how the budget is enforced; run the peers at once.
    pub enforce: Enforce,
    pub parallel: bool,
    /// scale: alloc+free pairs per thread; stream: buffers per round; pressure: turns per guest;
    /// large: steps; mixed: operations per thread; small: operations per thread of every shape (0:
    /// each shape's own default).
    pub count: usize,
    /// small: the shapes (empty: all).
    pub shapes: Vec<small::Shape>,
    /// reuse: the sizes swept (empty: the default sweep), the modes (empty: both), the time of
    /// one measurement.
    pub sizes: Vec<usize>,
    pub modes: Vec<reuse::Mode>,
    pub duration_ms: u64,
    /// exit: CPU hogs beside every measurement, the ways of leaving (empty: all), the child's
    /// allocation block.
    pub hogs: usize,
    pub exits: Vec<exit::Way>,
    pub block: usize,
}

/// density, pressure: how the budget is enforced: a memory cgroup if the machine allows it, else RSS
/// (`Auto`); a cgroup or fail (`Cgroup`); RSS readings only (`Rss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Enforce {
    Auto,
    Cgroup,
    Rss,
}

/// What an experiment gives back: its JSON record and a chart of its main figure.
pub struct Outcome {
    pub experiment: Experiment,
    pub params: Value,
    pub results: Vec<Map<String, Value>>,
    pub chart: Chart,
}

/// A bar chart: one bar per label; or, when `lines` is set, lines over time (the bars then are
/// for the tables only).
pub struct Chart {
    pub title: String,
    pub unit: String,
    pub bars: Vec<(String, f64)>,
    pub lines: Option<Lines>,
}

/// Lines of (x, y) points, one per label, with a horizontal line for a limit; y is in the
/// chart's unit.
pub struct Lines {
    pub x_desc: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    pub limit: Option<(String, f64)>,
}

impl Outcome {
    pub fn to_json(&self, machine: &Value) -> Value {
        serde_json::json!({
            "experiment": self.experiment.name(),
            "params": self.params,
            "machine": machine,
            "results": self.results,
        })
    }
}

/// Build every peer for an experiment.
pub fn make_peers(kinds: &[PeerKind], setup: Setup) -> Result<Vec<Peer>, String> {
    kinds.iter().map(|&k| Peer::new(k, setup)).collect()
}

/// The order of peers in round `round`: `0..n` from a starting peer that turns with the round,
/// in steps of a stride that changes from round to round (the numbers coprime to `n` in turn,
/// so every peer runs once and follows a different peer from one round to the next). With a rotation alone each peer followed the same one in every round, and paid
/// for its aftermath every time: in `bench scale`, the peer after `mmap` (whose 250 ms of
/// `mmap`/`munmap` leave the kernel work to finish) ran 3% slower in every run, whichever it was.
pub fn round_order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    let strides: Vec<usize> = (1..n.max(2)).filter(|&k| gcd(k, n) == 1).collect();
    let stride = strides[round % strides.len()];
    (0..n).map(move |i| (round + i * stride) % n)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A result row: `allocator`, `variant`, then the summary fields, then the experiment's own.
pub fn row(kind: PeerKind, summary: Map<String, Value>) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("allocator".into(), Value::from(kind.allocator()));
    m.insert("variant".into(), Value::from(kind.variant()));
    m.insert("peer".into(), Value::from(kind.name()));
    m.extend(summary);
    m
}

pub fn alloc_failed(peer: &Peer, size: usize) -> String {
    format!("{}: could not allocate {} bytes", peer.name(), size)
}

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn every_round_runs_each_peer_once_and_no_peer_always_follows_the_same_one() {
        for n in 1..=9 {
            let rounds: Vec<Vec<usize>> = (0..7).map(|r| round_order(n, r).collect()).collect();
            for order in &rounds {
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n}: {order:?}");
            }
            // With three peers or more, each peer's predecessor changes within the seven rounds
            // (a plain rotation kept it the same in every round).
            if n >= 3 {
                for p in 0..n {
                    let before: std::collections::BTreeSet<_> =
                        rounds.iter().filter_map(|o| o.iter().position(|&q| q == p).filter(|&i| i > 0).map(|i| o[i - 1])).collect();
                    assert!(before.len() >= 2, "n {n}: peer {p} always follows {before:?}");
                }
            }
        }
    }
}
