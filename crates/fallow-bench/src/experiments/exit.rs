//! exit: what leaving costs a process, with every CPU busy. A child (this binary re-executed in
//! the hidden `__exit_child` mode) builds the peer, allocates `--size` in `--block`-sized blocks,
//! writes every page, frees it all, sleeps `--idle-ms` (20), reads CLOCK_MONOTONIC, writes it to
//! its stdout (a pipe to the parent) and leaves in one of three ways: `return` (libc `exit`, which
//! runs the atexit handlers: what returning from `main` does), `_exit` (no handlers) or `signal`
//! (SIGTERM with the default disposition). The parent reads that timestamp, reaps the child with
//! `wait4` and reads the clock again: `exit_ms` is the time between the two, the exit latency a
//! parent, a shell or a supervisor sees. `lifetime_ms` is from just before the spawn to the reap.
//!
//! Why the load: a process is gone only when every one of its threads has run its exit path. An
//! allocator's background threads that get CPU time only when a CPU is idle (SCHED_IDLE) can be
//! preempted in the middle of their work and, with the CPUs busy, must wait for a slice before
//! they can die, so the exit waits too. `--hogs` (default: one per online CPU) CPU-bound
//! processes (forked busy loops at the default priority) are started before every measurement
//! and killed after it; `--hogs 0` is the unloaded comparison.
//!
//! Peers are measured in turn within a round, the starting peer rotating from round to round;
//! every measurement has the same procedure and the same fixed waits whatever the peer.
//! `median_ms`, `min_ms` and `max_ms` are the exit latency; `cpu_ms` is the child's own CPU time
//! (all its threads, from `wait4`); the child checks that its blocks keep what it wrote.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use serde_json::{json, Map, Value};

use super::{round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fmt_size, median, monotonic_ns, num, sleep_ms, summary, touch_pages, Progress, Sample};
use crate::peers::{Peer, PeerKind, Setup, PAGE};

/// How long the hogs spin before the child starts (the same for every peer).
const HOG_WARMUP_MS: u64 = 20;

/// How the child leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Way {
    /// libc `exit(0)`: atexit handlers, then the exit system call.
    Return,
    /// `_exit(0)`: the exit system call at once.
    #[value(name = "_exit")]
    Exit,
    /// `raise(SIGTERM)` with the default disposition.
    Signal,
}

impl Way {
    pub const ALL: [Way; 3] = [Way::Return, Way::Exit, Way::Signal];

    pub fn name(self) -> &'static str {
        match self {
            Way::Return => "return",
            Way::Exit => "_exit",
            Way::Signal => "signal",
        }
    }
}

/// The child: touch, free, idle, then leave `way`. Returns only on failure.
pub fn child_main(kind: PeerKind, size: usize, block: usize, idle_ms: u64, way: Way) -> Result<(), String> {
    let peer = Peer::new(kind, Setup { working_set: size, thp: false })?;
    let block = block.clamp(PAGE, size.max(PAGE));
    let count = size.div_ceil(block);
    let mut blocks = Vec::with_capacity(count);
    for k in 0..count {
        let b = peer.alloc(block, false, false);
        if b.is_null() {
            return Err(format!("{}: could not allocate {block} bytes", kind.name()));
        }
        // SAFETY: `b` is the peer's live block of `block` bytes, used by this thread only.
        unsafe { touch_pages(b, block, 1 + (k % 250) as u8) };
        blocks.push(b);
    }
    for (k, &b) in blocks.iter().enumerate() {
        // SAFETY: `b` is a live block of `block` bytes from `peer.alloc` (not freed until just
        // below), and `(block - 1) & !(PAGE - 1)` is below `block` (`block >= PAGE` after the clamp).
        let last = unsafe { core::ptr::read_volatile(b.add((block - 1) & !(PAGE - 1))) };
        if last != 1 + (k % 250) as u8 {
            return Err(format!("{}: block {k} lost what was written", kind.name()));
        }
        // SAFETY: `b` is the peer's live block of `block` bytes, freed once and not used again.
        unsafe { peer.free(b, block) };
    }
    sleep_ms(idle_ms);
    // SAFETY: plain libc calls on valid arguments: SIG_DFL for SIGTERM installs no handler, and
    // `set` is a local `sigset_t` (all-zero is a valid value, sigemptyset initialises it anyway)
    // that outlives the calls; the old-mask pointer is null, which pthread_sigmask allows.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
    }
    // The timestamp, then straight out: one write(2) to the pipe, nothing buffered.
    let line = format!("t {}\n", monotonic_ns());
    // SAFETY: `line` is a live `String`, readable for `line.len()` bytes; fd 1 is only written.
    unsafe { libc::write(1, line.as_ptr() as *const libc::c_void, line.len()) };
    match way {
        Way::Return => std::process::exit(0),
        // SAFETY: `_exit` has no memory-safety preconditions (it does not return).
        Way::Exit => unsafe { libc::_exit(0) },
        // SAFETY: `raise` and `_exit` have no memory-safety preconditions; SIGTERM has the
        // default disposition (set above), so `raise` ends the process and `_exit(3)` is a fallback.
        Way::Signal => unsafe {
            libc::raise(libc::SIGTERM);
            libc::_exit(3)
        },
    }
}

/// CPU-bound busy loops, one process each, killed when dropped.
struct Hogs(Vec<libc::pid_t>);

impl Hogs {
    fn start(n: usize) -> Result<Hogs, String> {
        let mut hogs = Hogs(Vec::new());
        for _ in 0..n {
            // The child only computes (nothing that could need a lock another thread of this
            // process held at the fork); it dies with its parent.
            // SAFETY: `fork` itself has no memory-safety preconditions; what the child may do after
            // a fork of a multithreaded process is restricted, see the next block.
            match unsafe { libc::fork() } {
                // SAFETY: the child only calls `prctl` (a system call wrapper, async-signal-safe)
                // and then spins on integer arithmetic forever: no lock, no allocation, no return
                // into code that could touch state another thread held at the fork.
                0 => unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    let mut x = 1u64;
                    loop {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
                    }
                },
                pid if pid > 0 => hogs.0.push(pid),
                _ => return Err(format!("cannot fork a CPU hog: {}", std::io::Error::last_os_error())),
            }
        }
        Ok(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: plain libc call with no memory-safety preconditions; `pid` is a child forked
            // by `start` and not yet reaped, so it cannot name an unrelated process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in &self.0 {
            let mut status = 0;
            // SAFETY: `status` is a live, writable `c_int` for the call.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
}

/// One measurement.
struct Measured {
    exit_ms: f64,
    lifetime_ms: f64,
    cpu_ms: f64,
}

fn measure(kind: PeerKind, way: Way, o: &Options, exe: &std::path::Path) -> Result<Measured, String> {
    let hogs = Hogs::start(o.hogs)?;
    sleep_ms(HOG_WARMUP_MS);
    let t_spawn = monotonic_ns();
    let mut child = Command::new(exe)
        .arg("__exit_child")
        .args(["--allocator", kind.name(), "--way", way.name()])
        .args(["--size", &o.size.to_string(), "--block", &o.block.to_string(), "--idle-ms", &o.idle_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start an exit child: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let mut status = 0;
    // SAFETY: `rusage` is plain integers and `timeval`s, for which all-zero bytes are valid.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `status` and `ru` are live, writable locals of the types wait4 fills.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let t_end = monotonic_ns();
    drop(hogs);
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let fail = |what: String| format!("{}: the exit child ({}) {what}{}", kind.name(), way.name(), if err.is_empty() { String::new() } else { format!(": {}", err.trim()) });
    if reaped != pid {
        return Err(fail(format!("could not be reaped: {}", std::io::Error::last_os_error())));
    }
    let expected = match way {
        Way::Signal => libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM,
        _ => libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
    };
    if !expected {
        return Err(fail(format!("ended with wait status {status:#x}")));
    }
    let t_child: u64 = line.trim().strip_prefix("t ").and_then(|v| v.parse().ok()).ok_or_else(|| fail("sent no timestamp".into()))?;
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    Ok(Measured {
        exit_ms: t_end.saturating_sub(t_child) as f64 / 1e6,
        lifetime_ms: t_end.saturating_sub(t_spawn) as f64 / 1e6,
        cpu_ms: tv(ru.ru_utime) + tv(ru.ru_stime),
    })
}

/// A JSON number to three significant digits (exit latencies span several decades, so a ratio
/// rounded to three decimals would read 0).
fn significant(x: f64) -> Value {
    if !x.is_finite() || x == 0.0 {
        return num(x);
    }
    let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
    json!((x * scale).round() / scale)
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    if o.size < PAGE {
        return Err(format!("exit needs --size of at least 4KiB (got {} bytes)", o.size));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let ways: Vec<Way> = if o.exits.is_empty() { Way::ALL.to_vec() } else { o.exits.clone() };
    let n = o.peers.len();
    let mut got: Vec<Vec<Vec<Measured>>> = (0..ways.len()).map(|_| (0..n).map(|_| Vec::new()).collect()).collect();
    let mut bar = Progress::new("exit", o.rounds * ways.len() * n);
    for round in 0..o.rounds {
        for (w, &way) in ways.iter().enumerate() {
            for i in round_order(n, round) {
                got[w][i].push(measure(o.peers[i], way, o, &exe)?);
                bar.step(o.peers[i].name());
            }
        }
    }
    bar.finish();
    let glibc = o.peers.iter().position(|&k| k == PeerKind::Glibc);
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (w, &way) in ways.iter().enumerate() {
        let exit_of = |i: usize| median(&got[w][i].iter().map(|m| m.exit_ms).collect::<Vec<_>>());
        for (i, &kind) in o.peers.iter().enumerate() {
            let ms = &got[w][i];
            let samples: Vec<Sample> = ms.iter().map(|m| Sample { wall_ms: m.exit_ms, cpu_ms: m.cpu_ms }).collect();
            let mut m = Map::new();
            m.insert("way".into(), json!(way.name()));
            m.insert("hogs".into(), json!(o.hogs));
            m.insert("exit_ms".into(), num(exit_of(i)));
            m.insert("ratio_vs_glibc".into(), glibc.map(|g| significant(exit_of(g) / exit_of(i))).unwrap_or(Value::Null));
            m.insert("lifetime_ms".into(), num(median(&ms.iter().map(|m| m.lifetime_ms).collect::<Vec<_>>())));
            m.extend(summary(&samples));
            m.insert("exit_ms_rounds".into(), json!(ms.iter().map(|m| num(m.exit_ms)).collect::<Vec<_>>()));
            results.push(row(kind, m));
            bars.push((format!("{} {}", kind.name(), way.name()), exit_of(i)));
        }
    }
    Ok(Outcome {
        experiment: Experiment::Exit,
        params: json!({
            "size": o.size, "size_human": fmt_size(o.size), "block": o.block, "block_human": fmt_size(o.block),
            "idle_ms": o.idle_ms, "hogs": o.hogs, "hog_warmup_ms": HOG_WARMUP_MS,
            "ways": ways.iter().map(|w| w.name()).collect::<Vec<_>>(), "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": "exit_ms (= median_ms; min_ms, max_ms): from the child's last timestamp to wait4 returning in the parent; \
                     lifetime_ms: spawn to reap; cpu_ms: the child's CPU time (all threads); ratio_vs_glibc: glibc's exit_ms \
                     over the peer's (above 1 is faster)",
        }),
        results,
        chart: Chart {
            title: format!(
                "exit: latency after touching and freeing {}, {} CPU hogs (lower is better)",
                fmt_size(o.size),
                o.hogs
            ),
            unit: "ms".into(),
            bars,
            lines: None,
        },
    })
}
