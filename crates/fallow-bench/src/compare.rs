//! `fallow compare [--runs N] -- PROGRAM ARGS...`: the program N times under each allocator, by
//! `LD_PRELOAD` (glibc: nothing preloaded; jemalloc, mimalloc, tcmalloc: Debian's libraries where
//! installed; fallow: its preload library), the peers interleaved and their order rotated each
//! round, and a table of medians: wall and CPU time, peak RSS, page faults, exit status, and the
//! ratios to glibc. A peer that is not installed is listed, not fatal. The program's output goes to
//! `/dev/null` (it runs many times); its exit status is in the table.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Map, Value};

use crate::experiments::{round_order, Chart};
use crate::launch::{self, Finished};
use crate::measure::median;
use crate::report::say;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Runs per allocator (medians are taken over them).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub runs: u64,
    /// Write the table and every run as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw the median wall time per allocator into this PNG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// fallow's preload library (default: beside the fallow binary, or ../lib from it).
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    pub command: Vec<OsString>,
}

/// The allocators compared, in the table's order.
pub const PEERS: [&str; 5] = ["glibc", "jemalloc", "mimalloc", "tcmalloc", "fallow"];

/// The Debian package that installs a peer's library.
pub fn package(peer: &str) -> &'static str {
    match peer {
        "jemalloc" => "libjemalloc2",
        "mimalloc" => "libmimalloc2.0",
        "tcmalloc" => "libtcmalloc-minimal4",
        _ => "",
    }
}

/// A peer and the library to preload for it (`None`: glibc, nothing).
type Found = (&'static str, Option<PathBuf>);
/// A peer that cannot run, and why.
type Missing = (&'static str, String);

/// Each peer with the library to preload, and the missing ones with why.
pub fn peers(preload: Option<&Path>) -> (Vec<Found>, Vec<Missing>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for p in PEERS {
        match p {
            "glibc" => found.push((p, None)),
            "fallow" => match launch::find_preload(preload) {
                Ok(lib) => found.push((p, Some(lib))),
                Err(e) => missing.push((p, e)),
            },
            _ => match launch::peer_library(p) {
                Some(lib) => found.push((p, Some(lib))),
                None => missing.push((p, format!("not installed (Debian package {})", package(p)))),
            },
        }
    }
    (found, missing)
}

fn one_run(command: &[OsString], lib: Option<&Path>) -> Result<Finished, String> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    // glibc: the environment as it is (what it already preloads stays, as for the others).
    if let Some(l) = lib {
        cmd.env("LD_PRELOAD", launch::ld_preload_with(l));
    }
    launch::run(cmd, None, true)
}

fn statuses(runs: &[Finished]) -> String {
    let mut s: Vec<String> = runs.iter().map(|f| f.ending.shell_status().to_string()).collect();
    s.dedup();
    s.join(",")
}

/// One row of medians for a peer.
fn row(peer: &str, runs: &[Finished], glibc: Option<(f64, f64)>) -> Map<String, Value> {
    let m = |f: &dyn Fn(&Finished) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let wall = m(&|f| f.wall_ms);
    let rss = m(&|f| f.peak_rss as f64);
    let ratio = |base: f64, v: f64| if v > 0.0 { crate::measure::num(base / v) } else { Value::Null };
    let mut r = Map::new();
    r.insert("peer".into(), json!(peer));
    r.insert("wall_ms".into(), crate::measure::num(wall));
    r.insert("x_glibc_wall".into(), glibc.map(|g| ratio(g.0, wall)).unwrap_or(Value::Null));
    r.insert("cpu_ms".into(), crate::measure::num(m(&|f| f.cpu_ms())));
    r.insert("peak_rss_mib".into(), crate::measure::num(rss / (1u64 << 20) as f64));
    r.insert("rss_x_glibc".into(), glibc.map(|g| crate::measure::num(rss / g.1)).unwrap_or(Value::Null));
    r.insert("minor_faults".into(), json!(m(&|f| f.minor_faults as f64) as u64));
    r.insert("major_faults".into(), json!(m(&|f| f.major_faults as f64) as u64));
    r.insert("status".into(), json!(statuses(runs)));
    r
}

pub fn main(a: CompareArgs) -> Result<(), String> {
    for p in [&a.json, &a.plot].into_iter().flatten() {
        crate::report::check_writable(p)?;
    }
    let (found, missing) = peers(a.preload.as_deref());
    let runs = a.runs as usize;
    let mut results: Vec<Vec<Finished>> = vec![Vec::new(); found.len()];
    let command = launch::display_command(&a.command);
    let names = found.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(", ");
    crate::report::note(&format!("fallow compare: {command} x{runs} under {names} (output to /dev/null)"));
    for round in 0..runs {
        for i in round_order(found.len(), round) {
            let (_, lib) = &found[i];
            results[i].push(one_run(&a.command, lib.as_deref())?);
        }
    }
    let glibc = results.first().map(|r| {
        let wall: Vec<f64> = r.iter().map(|f| f.wall_ms).collect();
        let rss: Vec<f64> = r.iter().map(|f| f.peak_rss as f64).collect();
        (median(&wall), median(&rss))
    });
    let rows: Vec<Map<String, Value>> =
        found.iter().zip(&results).map(|((p, _), runs)| row(p, runs, glibc)).collect();
    let chart = Chart {
        title: format!("fallow compare: {} (median wall time of {runs})", crate::plot::shorten(&command, 70)),
        unit: "ms".into(),
        bars: rows
            .iter()
            .map(|r| (r["peer"].as_str().unwrap_or("?").to_string(), r["wall_ms"].as_f64().unwrap_or(f64::NAN)))
            .collect(),
        lines: None,
    };
    say(&format!("fallow compare: {command} (medians of {runs} runs each, interleaved)"));
    say(crate::report::table(&rows).trim_end());
    say(
        "x_glibc_wall: glibc's wall time over the allocator's (above 1 is faster); rss_x_glibc: peak RSS over \
         glibc's (below 1 is smaller); status: the exit statuses seen (128+N: signal N)",
    );
    for (p, why) in &missing {
        say(&format!("{p}: {why}"));
    }
    if let Some(path) = &a.json {
        let every: Vec<Value> = found
            .iter()
            .zip(&results)
            .flat_map(|((p, _), runs)| {
                runs.iter().map(move |f| {
                    json!({"peer": p, "wall_ms": f.wall_ms, "cpu_ms": f.cpu_ms(), "peak_rss_bytes": f.peak_rss,
                           "minor_faults": f.minor_faults, "major_faults": f.major_faults,
                           "status": f.ending.shell_status()})
                })
            })
            .collect();
        let record = json!({
            "command": a.command.iter().map(|s| s.to_string_lossy().into_owned()).collect::<Vec<_>>(),
            "command_line": command,
            "runs": runs,
            "machine": crate::measure::machine(),
            "results": rows,
            "every_run": every,
            "libraries": found
                .iter()
                .map(|(p, lib)| (p.to_string(), json!(lib.as_ref().map(|l| l.display().to_string()))))
                .collect::<Map<String, Value>>(),
            "missing": missing.iter().map(|(p, why)| json!({"peer": p, "why": why})).collect::<Vec<_>>(),
        });
        crate::report::write_json(&record, path)?;
        say(&format!("wrote {}", path.display()));
    }
    if let Some(path) = &a.plot {
        crate::plot::draw(&chart, path)?;
        say(&format!("wrote {}", path.display()));
    }
    Ok(())
}
