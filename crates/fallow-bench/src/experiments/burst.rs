//! burst: does memory a program no longer uses stop counting against the machine? A program builds
//! `--size` bytes (default 1 GiB) of small objects, frees 90% of them in a random order, then idles
//! for `--idle-ms` (default 5000); its resident memory is read every 200 ms meanwhile. Each peer
//! runs it in a child process of its own whose `malloc` and `free` are the peer's library
//! (`burst_child.rs`, `preloaded.rs`), peers in turn (`--parallel`: all at once, as the demo does:
//! the idle waits overlap; each child reads only its own memory), the same objects and the same
//! survivors for every peer (one generator seed per round).
//!
//! The figures per peer, medians over the rounds: the live data left (the survivors' bytes, the
//! same for every peer), the program's resident anonymous memory before building (`baseline`),
//! after building, at the end of the frees and at the end of the idle time, and `settle_ms`: the
//! first reading, counted from the end of the frees, at or below the baseline plus the live data
//! plus 5% (the issue's goal for fallow; null if none); the time and CPU time of building and
//! freeing. The chart: resident memory over time, one line per peer, and the live data.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::burst_child::{INTERVAL_MS, KEEP};
use super::{preloaded, round_order, row, Chart, Experiment, Lines, Options, Outcome};
use crate::measure::{fmt_size, median, monotonic_ns, num, summary, Progress, Sample};

/// The default bytes built (`--size`).
pub const SIZE: usize = 1 << 30;
/// The default idle time (`--idle-ms`).
pub const IDLE_MS: u64 = 5000;
/// The generator's seed of round 0 (round r uses `SEED + r`).
const SEED: u64 = 5;
/// Settled: at most the baseline plus the live data plus this fraction of it.
const SLACK: f64 = 0.05;

const MIB: f64 = (1u64 << 20) as f64;

/// One child's report (`burst_child::child_main`), bytes and milliseconds.
#[derive(Clone, Debug, Default)]
struct Seen {
    baseline: f64,
    built: f64,
    live: f64,
    objects: f64,
    build_ms: f64,
    free_ms: f64,
    cpu_ms: f64,
    idle_cpu_ms: f64,
    /// (ms since the end of the frees, resident bytes).
    samples: Vec<(f64, f64)>,
}

impl Seen {
    fn parse(text: &str) -> Option<Seen> {
        let v: Value = serde_json::from_str(text).ok()?;
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        let samples = v.get("samples")?.as_array()?.iter().map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?))).collect::<Option<Vec<_>>>()?;
        Some(Seen {
            baseline: f("baseline")?,
            built: f("built")?,
            live: f("live")?,
            objects: f("objects")?,
            build_ms: f("build_ms")?,
            free_ms: f("free_ms")?,
            cpu_ms: f("cpu_ms")?,
            idle_cpu_ms: f("idle_cpu_ms")?,
            samples,
        })
    }

    /// The first reading at or below the baseline plus the live data plus `SLACK` of it.
    fn settle_ms(&self) -> Option<f64> {
        let line = self.baseline + self.live * (1.0 + SLACK);
        self.samples.iter().find(|s| s.1 <= line).map(|s| s.0)
    }

    fn end(&self) -> f64 {
        self.samples.last().map_or(f64::NAN, |s| s.1)
    }
}

/// The child's report file, removed when dropped.
struct ReportFile(PathBuf);

impl Drop for ReportFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Start one child; `finish` waits for it and reads its report.
fn start(kind: crate::peers::PeerKind, o: &Options, seed: u64) -> Result<(std::process::Child, ReportFile), String> {
    let report = ReportFile(std::env::temp_dir().join(format!("fallow-burst-{}-{}.json", std::process::id(), monotonic_ns())));
    let mut cmd = preloaded::command(kind, "__burst_child")?;
    cmd.args(["--allocator", kind.name(), "--size", &o.size.to_string(), "--idle-ms", &o.idle_ms.to_string()])
        .args(["--seed", &seed.to_string(), "--report"])
        .arg(&report.0);
    let child = cmd.spawn().map_err(|e| format!("{}: cannot start the burst child: {e}", kind.name()))?;
    Ok((child, report))
}

fn finish(kind: crate::peers::PeerKind, (mut child, report): (std::process::Child, ReportFile)) -> Result<Seen, String> {
    let status = child.wait().map_err(|e| format!("{}: {e}", kind.name()))?;
    if !status.success() {
        return Err(format!("{}: the burst child ended with {status}", kind.name()));
    }
    let text = std::fs::read_to_string(&report.0).unwrap_or_default();
    Seen::parse(&text).ok_or_else(|| format!("{}: the burst child reported {text:?}", kind.name()))
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    preloaded::check_all(&o.peers)?;
    if o.size < 1 << 20 {
        return Err(format!("burst needs --size of at least 1MiB (got {} bytes)", o.size));
    }
    let n = o.peers.len();
    let mut got: Vec<Vec<Seen>> = vec![Vec::new(); n];
    let mut bar = Progress::new("burst", o.rounds * n);
    for round in 0..o.rounds {
        let seed = SEED + round as u64;
        if o.parallel {
            let started = o.peers.iter().map(|&k| start(k, o, seed)).collect::<Result<Vec<_>, _>>()?;
            for (i, c) in started.into_iter().enumerate() {
                got[i].push(finish(o.peers[i], c)?);
                bar.step(o.peers[i].name());
            }
        } else {
            for i in round_order(n, round) {
                got[i].push(finish(o.peers[i], start(o.peers[i], o, seed)?)?);
                bar.step(o.peers[i].name());
            }
        }
    }
    bar.finish();
    let mut results = Vec::new();
    let mut series = Vec::new();
    for (i, &kind) in o.peers.iter().enumerate() {
        let g = &got[i];
        let med = |f: &dyn Fn(&Seen) -> f64| median(&g.iter().map(f).collect::<Vec<_>>());
        // The timeline: the median of each reading over the rounds, after the end of the build
        // (0) and the end of the frees.
        let readings = g.iter().map(|s| s.samples.len()).min().unwrap_or(0);
        let mut points = vec![(0.0, med(&|s| s.built) / MIB)];
        for k in 0..readings {
            let t = med(&|s| s.free_ms + s.samples[k].0);
            points.push((t / 1e3, med(&|s| s.samples[k].1) / MIB));
        }
        let settle: Vec<f64> = g.iter().filter_map(Seen::settle_ms).collect();
        let samples: Vec<Sample> = g.iter().map(|s| Sample { wall_ms: s.build_ms + s.free_ms, cpu_ms: s.cpu_ms }).collect();
        let mut m = serde_json::Map::new();
        m.extend(summary(&samples));
        m.insert("objects".into(), json!(med(&|s| s.objects) as u64));
        m.insert("live_mib".into(), num(med(&|s| s.live) / MIB));
        m.insert("baseline_mib".into(), num(med(&|s| s.baseline) / MIB));
        m.insert("built_mib".into(), num(med(&|s| s.built) / MIB));
        m.insert("freed_mib".into(), num(med(&|s| s.samples.first().map_or(f64::NAN, |p| p.1)) / MIB));
        m.insert("end_mib".into(), num(med(&Seen::end) / MIB));
        m.insert("end_over_live".into(), num(med(&|s| (s.end() - s.baseline) / s.live)));
        m.insert("settle_ms".into(), if settle.len() == g.len() { num(median(&settle)) } else { Value::Null });
        m.insert("build_ms".into(), num(med(&|s| s.build_ms)));
        m.insert("free_ms".into(), num(med(&|s| s.free_ms)));
        m.insert("idle_cpu_ms".into(), num(med(&|s| s.idle_cpu_ms)));
        m.insert("rss_timeline".into(), json!(points.iter().map(|&(t, v)| json!([num(t), num(v)])).collect::<Vec<_>>()));
        results.push(row(kind, m));
        series.push((kind.name().to_string(), points));
    }
    let live = median(&got.iter().flatten().map(|s| s.live).collect::<Vec<_>>()) / MIB;
    let printed = over_time(&o.peers, &got, o.idle_ms);
    let bars = o.peers.iter().enumerate().map(|(i, k)| (k.name().to_string(), median(&got[i].iter().map(Seen::end).collect::<Vec<_>>()) / MIB)).collect();
    Ok(Outcome {
        experiment: Experiment::Burst,
        params: json!({
            "size": o.size, "size_human": fmt_size(o.size), "kept": format!("1 in {KEEP}"), "idle_ms": o.idle_ms,
            "interval_ms": INTERVAL_MS, "seed": SEED, "rounds": o.rounds, "parallel": o.parallel,
            "live_mib": num(live),
            "summary": format!("resident MiB over time, s since the end of the frees (live data {live:.1} MiB):\n{}", printed.trim_end()),
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": "each peer's own library by LD_PRELOAD in a child of its own (fallow-small: FALLOW_SMALL=1); objects of \
                     16 B-4 KiB (7 in 8 up to 512 B), each written, until --size bytes; 9 in 10 freed in a random order; \
                     resident memory: the child's statm resident less shared (anonymous), read by itself; baseline_mib \
                     before building; built_mib after; freed_mib at the end of the frees; end_mib after --idle-ms; \
                     end_over_live: (end - baseline) / live (1 is the least possible); settle_ms: the first reading at or \
                     below baseline + 1.05 x live, from the end of the frees (null if not in every round); median_ms and \
                     cpu_ms: building and freeing; idle_cpu_ms: the child's CPU time while idle (background threads); \
                     rss_timeline: [s since the end of the build, MiB], medians over the rounds",
        }),
        results,
        chart: Chart {
            title: format!("burst: {} of small objects built, 90% freed at random, then idle: resident memory", fmt_size(o.size)),
            unit: "MiB".into(),
            bars,
            lines: Some(Lines { x_desc: "seconds since the build ended".into(), series, limit: Some(("live data".into(), live)) }),
        },
    })
}

/// The printed timeline: a row per peer, its resident MiB after building, then at each whole
/// second of the idle time (the median over the rounds of the reading nearest to it).
fn over_time(peers: &[crate::peers::PeerKind], got: &[Vec<Seen>], idle_ms: u64) -> String {
    let rows: Vec<serde_json::Map<String, Value>> = peers
        .iter()
        .zip(got)
        .map(|(k, g)| {
            let mut m = serde_json::Map::new();
            m.insert("peer".into(), json!(k.name()));
            m.insert("built".into(), num(median(&g.iter().map(|s| s.built).collect::<Vec<_>>()) / MIB));
            for sec in 0..=idle_ms / 1000 {
                let at = |s: &Seen| s.samples.iter().min_by(|a, b| (a.0 - sec as f64 * 1e3).abs().total_cmp(&(b.0 - sec as f64 * 1e3).abs())).map_or(f64::NAN, |p| p.1);
                m.insert(format!("{sec} s"), num(median(&g.iter().map(at).collect::<Vec<_>>()) / MIB));
            }
            m
        })
        .collect();
    crate::report::table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_parses_and_settles_at_the_first_reading_within_five_percent() {
        let text = r#"{"baseline": 1000, "built": 50000, "built_bytes": 40000, "objects": 100, "live": 4000,
                       "build_ms": 5, "free_ms": 2, "cpu_ms": 7, "idle_cpu_ms": 0.5,
                       "samples": [[0, 40000], [200, 5300], [400, 5150], [600, 5100]]}"#;
        let s = Seen::parse(text).unwrap();
        assert_eq!((s.live, s.samples.len(), s.end()), (4000.0, 4, 5100.0));
        // 1000 + 4000 x 1.05 = 5200: the third reading.
        assert_eq!(s.settle_ms(), Some(400.0));
        assert!(Seen::parse(r#"{"baseline": 1}"#).is_none());
    }
}
