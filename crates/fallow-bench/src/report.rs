//! Text output: a table per experiment (`fallow bench`) and the one summary table of
//! `fallow demo`, plus writing the JSON and PNG files.

use std::path::Path;

use serde_json::{Map, Value};

use crate::experiments::{Experiment, Outcome};

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if n.is_u64() || n.is_i64() {
                n.to_string()
            } else {
                crate::plot::format_value(x)
            }
        }
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(" "),
        Value::Bool(b) => b.to_string(),
        Value::Object(_) => "{..}".into(),
    }
}

fn render(header: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == 0 { format!("{c:<w$}", w = widths[i]) } else { format!("{c:>w$}", w = widths[i]) })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header);
    out.push('\n');
    out.push_str(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// One experiment's table: a row per result, a column per field.
pub fn experiment_table(o: &Outcome) -> String {
    table(&o.results)
}

/// A row per result, a column per field of the first (`peer` first; `allocator` and `variant`
/// left out, and series over time such as pressure's `rss_timeline`, which are for the JSON
/// record and the plot).
pub fn table(results: &[Map<String, Value>]) -> String {
    let skip = |k: &str| ["allocator", "variant", "peer"].contains(&k) || k.ends_with("_timeline");
    let keys: Vec<String> = results
        .first()
        .map(|r| r.keys().filter(|k| !skip(k.as_str())).cloned().collect())
        .unwrap_or_default();
    let mut header = vec!["peer".to_string()];
    header.extend(keys.iter().cloned());
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut row = vec![cell(&r["peer"])];
            row.extend(keys.iter().map(|k| cell(r.get(k).unwrap_or(&Value::Null))));
            row
        })
        .collect();
    render(&header, &rows)
}

fn find<'a>(outcomes: &'a [Outcome], e: Experiment, peer: &str) -> Vec<&'a Map<String, Value>> {
    outcomes
        .iter()
        .filter(|o| o.experiment == e)
        .flat_map(|o| o.results.iter())
        .filter(|r| r.get("peer").and_then(Value::as_str) == Some(peer))
        .collect()
}

/// The demo's one table: a row per peer, the main figure of each experiment as columns.
pub fn demo_table(outcomes: &[Outcome], peers: &[&str], threads: usize) -> String {
    let header: Vec<String> = [
        "peer",
        "pin ms",
        "pin x glibc",
        "density fit",
        "settled MiB",
        "scale ns 1t",
        &format!("scale ns {threads}t"),
        "stream GiB/s",
        "interference",
        "realloc ms",
        "reuse x glibc (1MiB calloc)",
        "reuse worst x glibc",
        "pressure killed",
        "pressure peak MiB",
        "large ms",
        "large peak MiB",
        "mixed ops x glibc",
        "sparse peak MiB",
        "churn x glibc",
        "server x glibc",
        "queue x glibc",
        "random x glibc",
        "burst end MiB",
        "cpu ms (pin)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let get = |e: Experiment, peer: &str, key: &str| -> String {
        find(outcomes, e, peer).first().and_then(|r| r.get(key)).map(cell).unwrap_or_else(|| "-".into())
    };
    let scale = |peer: &str, t: usize| -> String {
        find(outcomes, Experiment::Scale, peer)
            .into_iter()
            .find(|r| r.get("threads").and_then(Value::as_u64) == Some(t as u64))
            .and_then(|r| r.get("ns_per_pair"))
            .map(cell)
            .unwrap_or_else(|| "-".into())
    };
    let settled = |peer: &str| -> String {
        find(outcomes, Experiment::Density, peer)
            .first()
            .and_then(|r| r.get("settled_rss_mib"))
            .and_then(Value::as_array)
            .map(|a| {
                let v: Vec<f64> = a.iter().filter_map(Value::as_f64).collect();
                crate::plot::format_value(crate::measure::median(&v))
            })
            .unwrap_or_else(|| "-".into())
    };
    let small = |peer: &str, shape: &str| -> String {
        find(outcomes, Experiment::Small, peer)
            .into_iter()
            .find(|r| r.get("shape").and_then(Value::as_str) == Some(shape))
            .and_then(|r| r.get("ops_x_glibc"))
            .map(cell)
            .unwrap_or_else(|| "-".into())
    };
    // reuse at 1 thread: one size and mode, and the lowest ratio over all of them.
    let reuse_rows = |peer: &str| -> Vec<&Map<String, Value>> {
        find(outcomes, Experiment::Reuse, peer)
            .into_iter()
            .filter(|r| r.get("threads").and_then(Value::as_u64) == Some(1))
            .collect()
    };
    let reuse_at = |peer: &str, size: &str, mode: &str| -> String {
        reuse_rows(peer)
            .into_iter()
            .find(|r| r.get("size").and_then(Value::as_str) == Some(size) && r.get("mode").and_then(Value::as_str) == Some(mode))
            .and_then(|r| r.get("ratio_vs_glibc"))
            .map(cell)
            .unwrap_or_else(|| "-".into())
    };
    let reuse_worst = |peer: &str| -> String {
        let v: Vec<f64> = reuse_rows(peer).iter().filter_map(|r| r.get("ratio_vs_glibc").and_then(Value::as_f64)).collect();
        if v.is_empty() {
            "-".into()
        } else {
            crate::plot::format_value(v.into_iter().fold(f64::INFINITY, f64::min))
        }
    };
    // pressure: guests OOM-killed, or without a cgroup the turns seen over budget.
    let pressure_failed = |peer: &str| -> String {
        find(outcomes, Experiment::Pressure, peer)
            .first()
            .map(|r| match r.get("guests_killed") {
                Some(Value::Null) | None => format!("{} over", cell(r.get("slots_over_budget").unwrap_or(&Value::Null))),
                Some(v) => cell(v),
            })
            .unwrap_or_else(|| "-".into())
    };
    let rows: Vec<Vec<String>> = peers
        .iter()
        .map(|p| {
            vec![
                p.to_string(),
                get(Experiment::Pin, p, "median_ms"),
                get(Experiment::Pin, p, "ratio_vs_glibc"),
                get(Experiment::Density, p, "guests_fit"),
                settled(p),
                scale(p, 1),
                scale(p, threads),
                get(Experiment::Stream, p, "gib_per_s"),
                get(Experiment::Interference, p, "foreground_slowdown"),
                get(Experiment::Realloc, p, "median_ms"),
                reuse_at(p, "1MiB", "calloc"),
                reuse_worst(p),
                pressure_failed(p),
                get(Experiment::Pressure, p, "peak_rss_mib"),
                get(Experiment::Large, p, "median_ms"),
                get(Experiment::Large, p, "max_rss_mib"),
                get(Experiment::Mixed, p, "ops_x_glibc"),
                get(Experiment::Sparse, p, "max_rss_mib"),
                small(p, "churn"),
                small(p, "server"),
                small(p, "queue"),
                small(p, "random"),
                get(Experiment::Burst, p, "end_mib"),
                get(Experiment::Pin, p, "cpu_ms"),
            ]
        })
        .collect();
    render(&header, &rows)
}

/// A line on stdout; a closed or full stdout (`fallow compare ... | head`) is not an error (`println!`
/// would panic, and this binary aborts on a panic).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// A line on stderr, as `say`: `fallow run` must exit with the program's status whatever happens
/// to its stderr.
pub fn note(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Whether `path` can be written: its directory is created if missing, and the file is created
/// (empty) now, so that a bad path is one plain error before any work is done.
pub fn check_writable(path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create the directory {}: {}", dir.display(), plain(&e)))?;
    }
    if path.is_dir() {
        return Err(format!("cannot write {}: it is a directory", path.display()));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
        .map_err(|e| format!("cannot write {}: {}", path.display(), plain(&e)))
}

/// An I/O error without Rust's `(os error N)` tail.
fn plain(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

pub fn write_json(value: &Value, path: &Path) -> Result<(), String> {
    check_writable(path)?;
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {}", path.display(), plain(&e)))
}

pub fn write_plot(o: &Outcome, path: &Path) -> Result<(), String> {
    check_writable(path)?;
    crate::plot::draw(&o.chart, path)
}
