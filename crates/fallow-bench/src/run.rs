//! `fallow run [OPTIONS] -- PROGRAM ARGS...`: the program under fallow's preload library, its exit
//! status passed through, and a summary of what fallow did for it on stderr at the end.
//!
//! The options are the preload's `FALLOW_*` settings under plain names, checked here by the same
//! parser the preload uses (`fallow::binding_support::env::parse`): a value the preload would
//! warn about is an error before the program starts. The program's figures come from three
//! places: `wait4` (time, peak RSS, page faults: `launch.rs`), `/proc/PID/status` read by this
//! process (RSS over time), and the record the preload appends to the file named in
//! `FALLOW_RUN_RECORD` (samples of fallow's free memory by state every 100 ms, final figures at
//! exit: `fallow-preload/src/run_record.rs`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use crate::launch::{self, human, Finished};

#[derive(clap::Args)]
pub struct RunArgs {
    /// Requests of at least this many bytes go to fallow, smaller ones to glibc (default 256KiB;
    /// 4KiB to the largest block).
    #[arg(long, value_parser = crate::measure::parse_size)]
    pub threshold: Option<usize>,
    /// How free memory that stays unused goes back to the kernel: dontneed, free, off.
    #[arg(long, value_enum)]
    pub report: Option<ReportMode>,
    /// Milliseconds a free block stays unused before it is given back (default 2000).
    #[arg(long)]
    pub report_delay_ms: Option<u64>,
    /// Zero free pages in the background while a CPU is idle (idle, the default) or not (off).
    #[arg(long, value_enum)]
    pub zeroing: Option<Zeroing>,
    /// Transparent huge pages for fallow's memory.
    #[arg(long)]
    pub thp: bool,
    /// Address space per arena (default: the machine's RAM; 1GiB to 1TiB).
    #[arg(long, value_parser = crate::measure::parse_size)]
    pub arena_size: Option<usize>,
    /// Also print fallow's full statistics at the program's exit.
    #[arg(long)]
    pub stats: bool,
    /// Draw fallow's free memory by state and the program's RSS over time into this PNG file.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Write the summary and the samples as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The preload library (default: beside the fallow binary, or ../lib from it).
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    pub command: Vec<OsString>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ReportMode {
    Dontneed,
    Free,
    Off,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Zeroing {
    Idle,
    Off,
}

/// Milliseconds between two RSS samples taken by this process (the preload samples at the same
/// rate).
const SAMPLE_MS: u64 = 100;

/// The `FALLOW_*` variables the options set, each with the option that set it.
pub fn settings(a: &RunArgs) -> Result<Vec<(&'static str, String)>, String> {
    let mut vars: Vec<(&'static str, &'static str, String)> = Vec::new();
    if let Some(t) = a.threshold {
        vars.push(("FALLOW_THRESHOLD", "--threshold", t.to_string()));
    }
    if let Some(r) = a.report {
        let v = match r {
            ReportMode::Dontneed => "dontneed",
            ReportMode::Free => "free",
            ReportMode::Off => "off",
        };
        vars.push(("FALLOW_REPORT", "--report", v.into()));
    }
    if let Some(ms) = a.report_delay_ms {
        vars.push(("FALLOW_REPORT_DELAY_MS", "--report-delay-ms", ms.to_string()));
    }
    if let Some(z) = a.zeroing {
        let v = if matches!(z, Zeroing::Idle) { "idle" } else { "off" };
        vars.push(("FALLOW_ZEROING", "--zeroing", v.into()));
    }
    if a.thp {
        vars.push(("FALLOW_THP", "--thp", "1".into()));
    }
    if let Some(s) = a.arena_size {
        vars.push(("FALLOW_ARENA_SIZE", "--arena-size", s.to_string()));
    }
    if a.stats {
        vars.push(("FALLOW_STATS", "--stats", "1".into()));
    }
    // The preload's own parser: whatever it would warn about is an error here.
    let mut warnings: Vec<String> = Vec::new();
    let get = |name: &std::ffi::CStr| {
        let name = name.to_str().ok()?;
        vars.iter().find(|(v, _, _)| *v == name).map(|(_, _, val)| val.as_bytes())
    };
    fallow::binding_support::env::parse(fallow::Config::default(), get, &mut |w| {
        warnings.push(String::from_utf8_lossy(w).trim().to_string())
    });
    if let Some(w) = warnings.first() {
        let (_, opt, _) = vars.iter().find(|(v, _, _)| w.contains(&format!("{v}="))).unwrap_or(&vars[0]);
        let text = w.trim_start_matches("fallow: warning: ");
        return Err(format!("{opt}: {text} (the preload would use that instead)"));
    }
    Ok(vars.into_iter().map(|(v, _, val)| (v, val)).collect())
}

/// One line of the preload's record: `S|F pid t_ns key=value...`.
#[derive(Clone, Debug)]
pub struct Record {
    pub last: bool,
    pub pid: u32,
    pub t_ns: u64,
    pub fields: BTreeMap<String, u64>,
}

pub fn parse_record(text: &str) -> Vec<Record> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let last = match it.next()? {
                "S" => false,
                "F" => true,
                _ => return None,
            };
            let pid = it.next()?.parse().ok()?;
            let t_ns = it.next()?.parse().ok()?;
            let fields = it
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect();
            Some(Record { last, pid, t_ns, fields })
        })
        .collect()
}

/// What the record says at the program's end: per process, its final record, or its last
/// sample when it left without one (a signal, `_exit`); summed over the processes.
pub struct Totals {
    pub fields: BTreeMap<String, u64>,
    pub processes: usize,
    /// Processes whose figures are a last sample (no final record).
    pub from_samples: usize,
    /// The program's own final record (its pid), if it wrote one.
    pub own_final: Option<Record>,
}

pub fn totals(records: &[Record], pid: u32) -> Totals {
    let mut last: BTreeMap<u32, &Record> = BTreeMap::new();
    for r in records {
        let keep = match last.get(&r.pid) {
            None => true,
            Some(old) => r.last || (!old.last && r.t_ns >= old.t_ns),
        };
        if keep {
            last.insert(r.pid, r);
        }
    }
    let mut fields = BTreeMap::new();
    for r in last.values() {
        for (k, v) in &r.fields {
            // Settings, the same in every process: not summed.
            if k == "threshold" || k == "max_block" {
                fields.insert(k.clone(), *v);
            } else {
                *fields.entry(k.clone()).or_insert(0) += v;
            }
        }
    }
    Totals {
        fields,
        processes: last.len(),
        from_samples: last.values().filter(|r| !r.last).count(),
        own_final: last.get(&pid).filter(|r| r.last).map(|r| (*r).clone()),
    }
}

fn secs(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else {
        format!("{ms:.1} ms")
    }
}

/// The summary's lines and its JSON record.
/// `threshold`: the one the program ran with (for a program that never reached it).
pub fn summarize(
    f: &Finished,
    t: &Totals,
    memset_gib_s: Option<f64>,
    command: &str,
    threshold: usize,
) -> (Vec<String>, Value) {
    let get = |k: &str| t.fields.get(k).copied().unwrap_or(0);
    let mut lines = vec![format!("fallow run: {command}: {}", f.ending.describe())];
    lines.push(format!(
        "  time: wall {}, CPU {} (user {}, system {}; wait4)",
        secs(f.wall_ms),
        secs(f.cpu_ms()),
        secs(f.user_ms),
        secs(f.sys_ms)
    ));
    let (final_rss, rss_source) = match &t.own_final {
        Some(r) => (r.fields.get("rss").copied(), "at exit"),
        None => (f.rss.last().map(|s| s.1), "last sample"),
    };
    lines.push(format!(
        "  RSS: peak {} (wait4), {} {}",
        human(f.peak_rss as f64),
        rss_source,
        final_rss.map(|b| human(b as f64)).unwrap_or_else(|| "unknown (no sample: it ran too briefly)".into())
    ));
    lines.push(format!("  page faults: {} minor, {} major", f.minor_faults, f.major_faults));
    let pre_zeroed = get("zero_skipped").saturating_sub(get("reused_reported"));
    let saved_ms = memset_gib_s.map(|r| pre_zeroed as f64 / (r * (1u64 << 30) as f64) * 1e3);
    if t.processes == 0 {
        lines.push(format!(
            "  fallow served nothing: no request reached the threshold ({})",
            human(threshold as f64)
        ));
    } else if get("alloc_calls") == 0 {
        lines.push(format!(
            "  fallow served nothing: no request was between the threshold ({}) and fallow's largest \
             block ({}); larger ones go to glibc",
            human(get("threshold") as f64),
            human(get("max_block") as f64)
        ));
    } else {
        let procs = if t.processes == 1 { String::new() } else { format!(" in {} processes", t.processes) };
        let n = get("alloc_calls");
        let which = match get("threshold") {
            0 => format!("page block{} served{procs} (small objects on: every size)", if n == 1 { "" } else { "s" }),
            t => format!(
                "large allocation{} served{procs} (requests of at least {}, and from a quarter of it those the block a thread freed last held)",
                if n == 1 { "" } else { "s" },
                human(t as f64)
            ),
        };
        lines.push(format!("  fallow: {n} {which}, {} live at the end", human(get("in_use") as f64)));
        if get("zero_skipped") + get("zeroed_on_alloc") == 0 {
            lines.push("  zeroed requests (calloc): none".into());
        } else {
            lines.push(format!(
                "  zeroed requests (calloc): {} without a memset, {} with a memset at allocation",
                human(get("zero_skipped") as f64),
                human(get("zeroed_on_alloc") as f64)
            ));
            lines.push(format!(
                "    of those without: {} fresh or given-back pages (the kernel zero-fills them at first \
                 touch), at least {} pre-zeroed in the background",
                human(get("zero_skipped").min(get("reused_reported")) as f64),
                human(pre_zeroed as f64)
            ));
        }
        if let (Some(ms), Some(rate)) = (saved_ms, memset_gib_s) {
            lines.push(format!(
                "  memset time saved: about {} (the pre-zeroed bytes at {rate:.1} GiB/s, the memset rate \
                 measured just now on this machine)",
                secs(ms)
            ));
        }
        lines.push(format!(
            "  returned to the kernel: {} in {} calls; free at the end: {} dirty, {} zeroed, {} in thread \
             caches",
            human(get("reported") as f64),
            get("report_calls"),
            human(get("free_dirty") as f64),
            human(get("free_zeroed") as f64),
            human(get("cached") as f64)
        ));
        if get("small_spans") > 0 || get("small_live") > 0 {
            lines.push(format!(
                "  small objects (FALLOW_SMALL=1): {} live ({}) at the end, in {} spans ({}), {} of them free",
                get("small_live"),
                human(get("small_live_bytes") as f64),
                get("small_spans"),
                human(get("small_span_bytes") as f64),
                human(get("small_free") as f64)
            ));
        }
        if t.from_samples > 0 {
            lines.push(format!(
                "  ({} of {} processes left without a final record (a signal or _exit): their figures are \
                 their last sample, taken at most {SAMPLE_MS} ms before the end)",
                t.from_samples, t.processes
            ));
        }
    }
    let record = json!({
        "command": command,
        "status": f.ending.shell_status(),
        "ending": f.ending.describe(),
        "wall_ms": f.wall_ms,
        "cpu_ms": f.cpu_ms(),
        "user_ms": f.user_ms,
        "sys_ms": f.sys_ms,
        "peak_rss_bytes": f.peak_rss,
        "final_rss_bytes": final_rss,
        "final_rss_source": rss_source,
        "minor_faults": f.minor_faults,
        "major_faults": f.major_faults,
        "fallow_processes": t.processes,
        "fallow": t.fields,
        "pre_zeroed_bytes": pre_zeroed,
        "memset_gib_per_s": memset_gib_s,
        "memset_saved_ms": saved_ms,
    });
    (lines, record)
}

/// The threshold the program runs with: `--threshold`, else `FALLOW_THRESHOLD` as the preload reads
/// it from the environment `fallow run` was given, else the default.
fn effective_threshold(vars: &[(&'static str, String)]) -> usize {
    let given = vars.iter().find(|(k, _)| *k == "FALLOW_THRESHOLD").map(|(_, v)| v.clone());
    let Some(v) = given.or_else(|| std::env::var("FALLOW_THRESHOLD").ok()) else {
        return fallow::binding_support::env::DEFAULT_THRESHOLD;
    };
    let get = |name: &std::ffi::CStr| (name.to_bytes() == b"FALLOW_THRESHOLD").then_some(v.as_bytes());
    fallow::binding_support::env::parse(fallow::Config::default(), get, &mut |_| {}).threshold
}

/// The timeline's series in MiB over seconds from the start: the program's RSS (this process's
/// samples) and, from the program's own record, fallow's live bytes, free memory by state and the
/// bytes returned to the kernel so far.
pub fn timeline(f: &Finished, records: &[Record]) -> Vec<(String, Vec<(f64, f64)>)> {
    let x = |t: u64| t.saturating_sub(f.start_ns) as f64 / 1e9;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut series = vec![("RSS".to_string(), f.rss.iter().map(|&(t, b)| (x(t), mib(b))).collect())];
    // The program's own samples; if it wrote none (a shell running the real program), the
    // process that wrote most.
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for r in records {
        *counts.entry(r.pid).or_insert(0) += 1;
    }
    let pid = if counts.contains_key(&f.pid) {
        f.pid
    } else {
        counts.iter().max_by_key(|(_, n)| **n).map(|(p, _)| *p).unwrap_or(f.pid)
    };
    let own: Vec<&Record> = records.iter().filter(|r| r.pid == pid).collect();
    for (key, name) in [
        ("in_use", "fallow live"),
        ("free_dirty", "free dirty"),
        ("free_zeroed", "free zeroed"),
        ("cached", "free in thread caches"),
        ("reported", "returned to the kernel (total)"),
    ] {
        let pts: Vec<(f64, f64)> =
            own.iter().map(|r| (x(r.t_ns), mib(r.fields.get(key).copied().unwrap_or(0)))).collect();
        if !pts.is_empty() {
            series.push((name.to_string(), pts));
        }
    }
    series
}

/// A fresh record file for the preload to append to (removed when dropped).
struct RecordFile(PathBuf);

impl RecordFile {
    fn create() -> Result<RecordFile, String> {
        let name = format!("fallow-run-{}-{}.rec", std::process::id(), crate::measure::monotonic_ns());
        let p = std::env::temp_dir().join(name);
        std::fs::write(&p, b"").map_err(|e| format!("cannot create the record file {}: {e}", p.display()))?;
        Ok(RecordFile(p))
    }
}

impl Drop for RecordFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Run the program; the status to exit with (the program's, as a shell gives it).
pub fn main(a: RunArgs) -> Result<u8, String> {
    let vars = settings(&a)?;
    let lib = launch::find_preload(a.preload.as_deref())?;
    for p in [&a.json, &a.timeline].into_iter().flatten() {
        crate::report::check_writable(p)?;
    }
    let rec = RecordFile::create()?;
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]);
    cmd.env("LD_PRELOAD", launch::ld_preload_with(&lib)).env("FALLOW_RUN_RECORD", &rec.0);
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let f = match launch::run(cmd, Some(SAMPLE_MS), false) {
        Ok(f) => f,
        Err(e) => {
            // As a shell: 127 for a program not found, 126 for one that cannot be executed.
            crate::report::note(&format!("fallow: error: {e}"));
            return Ok(launch::start_failure_status(&a.command[0]));
        }
    };
    let text = std::fs::read_to_string(&rec.0).unwrap_or_default();
    drop(rec);
    let records = parse_record(&text);
    let t = totals(&records, f.pid);
    let field = |k: &str| t.fields.get(k).copied().unwrap_or(0);
    let pre_zeroed = field("zero_skipped").saturating_sub(field("reused_reported"));
    let rate = (pre_zeroed > 0).then(|| crate::measure::memset_gib_per_s(64 << 20, 5));
    let command = launch::display_command(&a.command);
    let (lines, mut record) = summarize(&f, &t, rate, &command, effective_threshold(&vars));
    for l in &lines {
        crate::report::note(l);
    }
    let series = timeline(&f, &records);
    if let Some(path) = &a.json {
        record["timeline"] = series
            .iter()
            .map(|(name, pts)| (name.clone(), json!(pts.iter().map(|(x, y)| [*x, *y]).collect::<Vec<_>>())))
            .collect::<serde_json::Map<String, Value>>()
            .into();
        record["timeline_unit"] = json!("seconds from the start, MiB");
        crate::report::write_json(&record, path)?;
        crate::report::note(&format!("wrote {}", path.display()));
    }
    if let Some(path) = &a.timeline {
        let title = format!("fallow run: {}", crate::plot::shorten(&command, 90));
        crate::plot::draw_lines(&title, "seconds from the start", "MiB", &series, None, path)?;
        crate::report::note(&format!("wrote {}", path.display()));
    }
    Ok(f.ending.shell_status())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_sum_per_process() {
        let text = "S 10 100 rss=5 in_use=1 reported=0\nS 10 200 rss=6 in_use=2 reported=1\n\
                    F 10 300 rss=7 in_use=3 reported=2 threshold=4096\nS 11 150 rss=1 in_use=10 reported=5\n\
                    garbage line\n";
        let r = parse_record(text);
        assert_eq!(r.len(), 4);
        let t = totals(&r, 10);
        assert_eq!(t.processes, 2);
        assert_eq!(t.from_samples, 1);
        assert_eq!(t.fields["in_use"], 13);
        assert_eq!(t.fields["threshold"], 4096);
        assert_eq!(t.own_final.unwrap().fields["rss"], 7);
    }

    #[test]
    fn options_become_settings_and_bad_ones_are_errors() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: RunArgs,
        }
        let p = P::try_parse_from(["x", "--threshold", "1MiB", "--zeroing", "off", "--", "true"]).unwrap();
        let v = settings(&p.a).unwrap();
        assert!(v.contains(&("FALLOW_THRESHOLD", (1 << 20).to_string())));
        assert!(v.contains(&("FALLOW_ZEROING", "off".into())));
        let p = P::try_parse_from(["x", "--threshold", "100", "--", "true"]).unwrap();
        let e = settings(&p.a).unwrap_err();
        assert!(e.starts_with("--threshold: FALLOW_THRESHOLD=\"100\" is below one page"), "{e}");
        let p = P::try_parse_from(["x", "--report-delay-ms", "9999999", "--", "true"]).unwrap();
        assert!(settings(&p.a).unwrap_err().starts_with("--report-delay-ms"));
        assert_eq!(effective_threshold(&[("FALLOW_THRESHOLD", "8388608".into())]), 8 << 20);
    }
}
