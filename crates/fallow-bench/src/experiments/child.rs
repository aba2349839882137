//! Measuring a peer in a child process of its own (large, mixed, small). This binary, re-executed
//! in the hidden `__shape_child` mode, runs one measurement of one peer and reports it, so that the
//! malloc-like libraries, which are process-wide, never share a process with another peer or an
//! earlier measurement: the peak resident size is the measurement's alone, and a preloaded peer
//! (tcmalloc, fallow-small; in small every peer: `preloaded.rs`) runs under `LD_PRELOAD`, as its
//! users get it.
//!
//! The child measures its own window, from just before the workload to just after it (its blocks
//! all freed): the wall time; user and system CPU time and minor page faults as differences of
//! `getrusage(RUSAGE_SELF)` (every thread of the process: an allocator's background workers are
//! charged to it); and the peak resident size over the window: the high-water mark is reset to the
//! current size just before it (`/proc/self/clear_refs`) and read just after it (`VmHWM`), so that
//! it includes the few MiB of the program itself, the same for every peer, and nothing else. Not
//! `ru_maxrss`: when a process execs, the kernel folds the high-water mark of the memory it had
//! until then into it, and a child spawned by a large parent (the demo, after pin and density)
//! reports the parent's peak instead of its own. It writes them on one line to a file the parent
//! names. The parent adds the child's lifetime (spawn to reap, with
//! `wait4`: its start and its exit included) and makes the rows: medians over the rounds, and
//! ratios of the medians to glibc's.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::small::{self, Shape};
use super::{large, mixed, preloaded, row, sparse, Experiment, Options};
use crate::launch::{self, Ending};
use crate::measure::{median, monotonic_ns, num, summary, timeval_ms, Sample};
use crate::peers::{Peer, PeerKind, Setup};

/// What the child is started with (`fallow __shape_child`).
#[derive(clap::Args)]
pub struct ChildArgs {
    #[arg(long, value_enum)]
    pub experiment: Experiment,
    #[arg(long, value_parser = crate::parse_peer)]
    pub allocator: PeerKind,
    #[arg(long)]
    pub size: usize,
    #[arg(long)]
    pub count: usize,
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub seed: u64,
    /// small: the shape.
    #[arg(long, value_enum)]
    pub shape: Option<Shape>,
    /// The file the child writes its figures to.
    #[arg(long)]
    pub report: PathBuf,
}

/// One live block of a child's workload (`large`'s buffers, `mixed`'s blocks): where, how long,
/// and the byte it was written with (null: none yet).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Held {
    pub ptr: *mut u8,
    pub len: usize,
    pub value: u8,
}

/// No block.
pub const NONE: Held = Held { ptr: core::ptr::null_mut(), len: 0, value: 0 };

/// One measurement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub wall_ms: f64,
    pub user_ms: f64,
    pub sys_ms: f64,
    pub minor_faults: u64,
    /// Bytes.
    pub max_rss: u64,
    /// The operations done (large: steps; mixed: alloc+free pairs of all threads).
    pub ops: u64,
    /// Spawn to reap, in the parent.
    pub process_ms: f64,
}

impl Usage {
    fn line(&self) -> String {
        format!("{} {} {} {} {} {}\n", self.wall_ms, self.user_ms, self.sys_ms, self.minor_faults, self.max_rss, self.ops)
    }

    fn parse(line: &str) -> Option<Usage> {
        let v: Vec<&str> = line.split_whitespace().collect();
        let [wall, user, sys, faults, rss, ops] = v[..] else { return None };
        Some(Usage {
            wall_ms: wall.parse().ok()?,
            user_ms: user.parse().ok()?,
            sys_ms: sys.parse().ok()?,
            minor_faults: faults.parse().ok()?,
            max_rss: rss.parse().ok()?,
            ops: ops.parse().ok()?,
            process_ms: 0.0,
        })
    }

    pub fn cpu_ms(&self) -> f64 {
        self.user_ms + self.sys_ms
    }
}

/// The process's resident high-water mark in bytes (`VmHWM`).
fn peak_rss() -> Result<u64, String> {
    let kib = crate::measure::read_first_line("/proc/self/status", "VmHWM:").and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
    kib.map(|k| k << 10).ok_or_else(|| "cannot read VmHWM in /proc/self/status".into())
}

/// Reset the process's resident high-water mark to its current resident size (writing "5" to
/// `clear_refs`, Linux 4.0 and later).
fn reset_peak_rss() -> Result<(), String> {
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| format!("cannot reset the peak RSS (/proc/self/clear_refs): {e}"))
}

fn rusage() -> libc::rusage {
    // SAFETY: `rusage` is plain integers and `timeval`s, for which all zeros is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru
}

/// What a child runs: a small-object shape on the C library's calls, or a workload on a peer.
enum Work {
    Small(Shape),
    Peer(Peer),
}

/// The child: build the peer, run the workload in a measured window, write the figures.
pub fn child_main(a: ChildArgs) -> Result<(), String> {
    let working_set = match a.experiment {
        Experiment::Large => large::working_set(a.size),
        Experiment::Mixed => mixed::working_set(a.size, a.threads),
        Experiment::Sparse => sparse::working_set(a.size),
        Experiment::Small => 0,
        e => return Err(format!("{} does not run in children", e.name())),
    };
    // small calls the C library's malloc, which must be the peer's; the others call the peer.
    let work = match (a.experiment, a.shape) {
        (Experiment::Small, Some(shape)) => {
            preloaded::check_malloc(a.allocator)?;
            Work::Small(shape)
        }
        (Experiment::Small, None) => return Err("small: no --shape".into()),
        _ => Work::Peer(Peer::new(a.allocator, Setup { working_set, thp: false })?),
    };
    reset_peak_rss()?;
    let before = rusage();
    let t0 = Instant::now();
    let ops = match &work {
        Work::Small(shape) => small::workload(*shape, a.count, a.threads, a.seed)?,
        Work::Peer(p) if a.experiment == Experiment::Large => large::workload(p, a.size, a.count, a.seed)?,
        Work::Peer(p) if a.experiment == Experiment::Sparse => sparse::workload(p, a.size, a.count, a.seed)?,
        Work::Peer(p) => mixed::workload(p, a.size, a.count, a.threads, a.seed)?,
    };
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let after = rusage();
    let max_rss = peak_rss()?;
    let usage = Usage {
        wall_ms,
        user_ms: timeval_ms(after.ru_utime) - timeval_ms(before.ru_utime),
        sys_ms: timeval_ms(after.ru_stime) - timeval_ms(before.ru_stime),
        minor_faults: (after.ru_minflt - before.ru_minflt) as u64,
        max_rss,
        ops,
        process_ms: 0.0,
    };
    std::fs::write(&a.report, usage.line()).map_err(|e| format!("cannot write {}: {e}", a.report.display()))
}

/// The child's report file, removed when dropped.
struct ReportFile(PathBuf);

impl Drop for ReportFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One measurement of `kind` in a child: `o.size`, `o.count`, `o.threads`, the generator's `seed`;
/// small: its `shape`. Every peer of small, and the preloaded peers of the others, run with their
/// library in `LD_PRELOAD` and their environment (`preloaded::command`).
pub fn measure(e: Experiment, kind: PeerKind, o: &Options, seed: u64, shape: Option<Shape>) -> Result<Usage, String> {
    let name = format!("fallow-{}-{}-{}.txt", e.name(), std::process::id(), monotonic_ns());
    let report = ReportFile(std::env::temp_dir().join(name));
    let mut cmd = if e == Experiment::Small || kind.preload().is_some() {
        preloaded::command(kind, "__shape_child")?
    } else {
        let mut cmd = Command::new(std::env::current_exe().map_err(|err| format!("cannot find this program: {err}"))?);
        cmd.arg("__shape_child");
        cmd
    };
    cmd.args(["--experiment", e.name(), "--allocator", kind.name(), "--seed", &seed.to_string()])
        .args(["--size", &o.size.to_string(), "--count", &o.count.to_string(), "--threads", &o.threads.to_string()])
        .arg("--report")
        .arg(&report.0);
    if let Some(s) = shape {
        cmd.args(["--shape", s.name()]);
    }
    let f = launch::run(cmd, None, false)?;
    if f.ending != Ending::Exited(0) {
        return Err(format!("{}: the {} child ended with {}", kind.name(), e.name(), f.ending.describe()));
    }
    let text = std::fs::read_to_string(&report.0).unwrap_or_default();
    let mut usage = Usage::parse(&text).ok_or_else(|| format!("{}: the {} child reported {text:?}", kind.name(), e.name()))?;
    usage.process_ms = f.wall_ms;
    Ok(usage)
}

/// The rows of a run, one per peer (`got[i]`: peer i's measurements, one per round): the summary
/// (wall time; `cpu_ms`: user + system), user and system time, peak RSS, minor faults and the
/// child's lifetime, each the median over the rounds; and glibc's medians over the peer's for
/// time (above 1 is faster), the peer's over glibc's for RSS (below 1 is smaller). `own` adds an
/// experiment's fields (peer index, row) before the common ones.
pub fn rows(peers: &[PeerKind], got: &[Vec<Usage>], own: impl Fn(usize, &mut Map<String, Value>)) -> Vec<Map<String, Value>> {
    let med = |i: usize, f: &dyn Fn(&Usage) -> f64| median(&got[i].iter().map(f).collect::<Vec<_>>());
    let glibc = peers.iter().position(|&k| k == PeerKind::Glibc);
    let over_glibc = |i: usize, f: &dyn Fn(&Usage) -> f64, peer_over: bool| -> Value {
        let Some(g) = glibc else { return Value::Null };
        let (a, b) = if peer_over { (med(i, f), med(g, f)) } else { (med(g, f), med(i, f)) };
        if b > 0.0 {
            num(a / b)
        } else {
            Value::Null
        }
    };
    let mib = |u: &Usage| u.max_rss as f64 / (1u64 << 20) as f64;
    let mut results = Vec::new();
    for (i, &kind) in peers.iter().enumerate() {
        let samples: Vec<Sample> = got[i].iter().map(|u| Sample { wall_ms: u.wall_ms, cpu_ms: u.cpu_ms() }).collect();
        let mut m = Map::new();
        own(i, &mut m);
        m.extend(summary(&samples));
        m.insert("user_ms".into(), num(med(i, &|u| u.user_ms)));
        m.insert("sys_ms".into(), num(med(i, &|u| u.sys_ms)));
        m.insert("x_glibc_wall".into(), over_glibc(i, &|u| u.wall_ms, false));
        m.insert("x_glibc_cpu".into(), over_glibc(i, &Usage::cpu_ms, false));
        m.insert("max_rss_mib".into(), num(med(i, &mib)));
        m.insert("rss_x_glibc".into(), over_glibc(i, &mib, true));
        m.insert("minor_faults".into(), json!(med(i, &|u| u.minor_faults as f64).round() as u64));
        m.insert("process_ms".into(), num(med(i, &|u| u.process_ms)));
        results.push(row(kind, m));
    }
    results
}

/// The note of the JSON record on the common fields.
pub const NOTE: &str = "median_ms/min_ms/max_ms: the child's measured window (the workload, from its first allocation to \
    its last free); cpu_ms = user_ms + sys_ms over that window (every thread of the child; the kernel splits the exact sum \
    between user and system by its tick samples, so the split of a window of a few ticks is rough); minor_faults: over that window; \
    max_rss_mib: the child's peak resident size over that window (VmHWM, reset at its start; the program's own \
    few MiB included); process_ms: the child's \
    spawn to reap; x_glibc_wall, x_glibc_cpu: glibc's median over the peer's (above 1 is faster); rss_x_glibc: the \
    peer's median over glibc's (below 1 is smaller); every figure a median over the rounds, one child per peer and round";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_line_round_trips() {
        let u = Usage { wall_ms: 12.5, user_ms: 3.25, sys_ms: 9.0, minor_faults: 777, max_rss: 5 << 20, ops: 42, process_ms: 0.0 };
        assert_eq!(Usage::parse(&u.line()), Some(u));
        assert_eq!(Usage::parse("1 2 3"), None);
        assert_eq!(Usage::parse("1 2 3 x 5 6"), None);
    }

    #[test]
    fn the_peak_rss_is_reset_to_the_current_size() {
        let n = 256 << 20;
        // SAFETY: a fresh private anonymous mapping at no fixed address (it cannot replace one).
        let p = unsafe { libc::mmap(core::ptr::null_mut(), n, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: `p` is this test's own writable mapping of `n` bytes.
        unsafe { crate::measure::touch_pages(p as *mut u8, n, 1) };
        assert!(peak_rss().unwrap() >= n as u64);
        // SAFETY: the mapping made above, not used again.
        unsafe { libc::munmap(p, n) };
        reset_peak_rss().unwrap();
        // The test binary and the tests running beside this one hold far less than 256 MiB.
        let after = peak_rss().unwrap();
        assert!(after < n as u64, "the peak stayed at {after} bytes");
    }

    #[test]
    fn rows_take_medians_and_ratios_to_glibc() {
        let u = |wall: f64, rss_mib: u64| Usage { wall_ms: wall, user_ms: wall / 2.0, sys_ms: wall / 2.0, max_rss: rss_mib << 20, ..Usage::default() };
        let got = vec![vec![u(10.0, 100), u(30.0, 100), u(20.0, 100)], vec![u(5.0, 50), u(5.0, 50), u(100.0, 60)]];
        let r = rows(&[PeerKind::Glibc, PeerKind::Fallow], &got, |i, m| {
            m.insert("own".into(), json!(i));
        });
        assert_eq!(r[1]["peer"], "fallow");
        assert_eq!(r[1]["own"], 1);
        assert_eq!(r[1]["median_ms"], json!(5.0));
        assert_eq!(r[1]["x_glibc_wall"], json!(4.0));
        assert_eq!(r[1]["x_glibc_cpu"], json!(4.0));
        assert_eq!(r[1]["max_rss_mib"], json!(50.0));
        assert_eq!(r[1]["rss_x_glibc"], json!(0.5));
        assert_eq!(r[0]["x_glibc_wall"], json!(1.0));
        // Without glibc, no ratios.
        let r = rows(&[PeerKind::Fallow], &got[1..], |_, _| {});
        assert_eq!(r[0]["x_glibc_wall"], Value::Null);
    }
}
