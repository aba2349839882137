//! What the experiments with guest processes share (density, pressure): starting a guest and
//! speaking to it, the memory cgroup that holds a budget, a process's resident set, reaping a
//! guest with its resource use, and running every peer's guests round after round.
//!
//! A guest is this binary re-executed in a hidden mode (`GuestPipe`), told what to do on its
//! stdin a line at a time and answering on its stdout; it joins the cgroup itself (writing its
//! pid to `cgroup.procs`) before it allocates anything, so that everything it touches is charged
//! to the budget.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::measure::timeval_ms;
use crate::peers::PeerKind;

/// A guest process and the pipes to it.
pub struct GuestPipe {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl GuestPipe {
    /// Start `fallow MODE --allocator K --size SIZE --chunk CHUNK [--cgroup DIR]` with the peer's
    /// environment (`PeerKind::guest_env`) over this process's, and `stderr` as its stderr.
    pub fn spawn(
        mode: &str,
        kind: PeerKind,
        size: usize,
        chunk: usize,
        cgroup: Option<&PathBuf>,
        stderr: Stdio,
    ) -> Result<GuestPipe, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.arg(mode)
            .arg("--allocator")
            .arg(kind.name())
            .arg("--size")
            .arg(size.to_string())
            .arg("--chunk")
            .arg(chunk.to_string())
            .envs(kind.guest_env().iter().copied());
        if let Some(dir) = cgroup {
            cmd.arg("--cgroup").arg(dir);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start a guest: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Ok(GuestPipe { child, stdin, stdout })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The guest's next line, trimmed; None once it is gone.
    pub fn read_line(&mut self) -> Option<String> {
        let mut s = String::new();
        match self.stdout.read_line(&mut s) {
            Ok(n) if n > 0 => Some(s.trim().to_string()),
            _ => None,
        }
    }

    /// Send `line`; false if the guest is gone.
    pub fn say(&mut self, line: &str) -> bool {
        writeln!(self.stdin, "{line}").is_ok() && self.stdin.flush().is_ok()
    }

    /// Send `command` and read its answer `done <ms>`: the guest's own time in ms, or None if it
    /// died meanwhile (killed by the OOM killer).
    pub fn ask(&mut self, command: &str) -> Option<f64> {
        if !self.say(command) {
            return None;
        }
        let l = self.read_line()?;
        l.strip_prefix("done ").and_then(|v| v.parse().ok())
    }
}

/// Run `run_peer` for every peer in every round: in turn, the first peer rotating from round to
/// round (`super::round_order`), or with `--parallel` all peers of a round at once (each has its
/// guests and budget); a peer's runs in round order, the first error ends it all.
pub fn rounds<R: Send>(
    o: &super::Options,
    run_peer: impl Fn(PeerKind) -> Result<R, String> + Sync,
) -> Result<Vec<Vec<R>>, String> {
    let mut runs: Vec<Vec<R>> = (0..o.peers.len()).map(|_| Vec::new()).collect();
    for round in 0..o.rounds {
        if o.parallel {
            let got: Vec<Result<R, String>> = std::thread::scope(|sc| {
                let hs: Vec<_> = o.peers.iter().map(|&k| {
                    let run_peer = &run_peer;
                    sc.spawn(move || run_peer(k))
                }).collect();
                hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a guest supervisor thread failed".into()))).collect()
            });
            for (i, r) in got.into_iter().enumerate() {
                runs[i].push(r?);
            }
        } else {
            for i in super::round_order(o.peers.len(), round) {
                runs[i].push(run_peer(o.peers[i])?);
            }
        }
    }
    Ok(runs)
}

/// A memory cgroup limited to the budget, removed when dropped (once its processes are gone).
pub struct Cgroup {
    pub dir: PathBuf,
    version: u8,
}

impl Cgroup {
    /// A fresh cgroup `fallow-{experiment}-{pid}-{tag}` limited to `limit` bytes, or None when the
    /// machine does not let this process create one (not root, no memory controller).
    pub fn create(experiment: &str, tag: &str, limit: usize) -> Option<Cgroup> {
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let name = format!("fallow-{experiment}-{}-{tag}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        if v1.join("memory.limit_in_bytes").exists() {
            let dir = v1.join(&name);
            if std::fs::create_dir(&dir).is_ok() {
                let ok = std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).is_ok();
                let cg = Cgroup { dir, version: 1 };
                if ok {
                    return Some(cg);
                }
            }
        }
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let root = PathBuf::from(root);
            let ctl = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !ctl.split_whitespace().any(|c| c == "memory") {
                continue;
            }
            let dir = root.join(&name);
            if std::fs::create_dir(&dir).is_ok() {
                let ok = std::fs::write(dir.join("memory.max"), limit.to_string()).is_ok()
                    && std::fs::write(dir.join("memory.swap.max"), "0").map(|_| true).unwrap_or(true);
                let cg = Cgroup { dir, version: 2 };
                if ok {
                    return Some(cg);
                }
            }
        }
        None
    }

    fn read(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// How often the limit was hit (v1 `memory.failcnt`, v2 `max` in `memory.events`).
    pub fn failcnt(&self) -> Option<u64> {
        if self.version == 1 {
            self.read("memory.failcnt")
        } else {
            let ev = std::fs::read_to_string(self.dir.join("memory.events")).ok()?;
            ev.lines().find_map(|l| l.strip_prefix("max ").and_then(|v| v.trim().parse().ok()))
        }
    }

    /// Bytes charged now.
    pub fn usage(&self) -> Option<u64> {
        self.read(if self.version == 1 { "memory.usage_in_bytes" } else { "memory.current" })
    }

    /// The most bytes charged since creation (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`
    /// where the kernel has it).
    pub fn peak(&self) -> Option<u64> {
        self.read(if self.version == 1 { "memory.max_usage_in_bytes" } else { "memory.peak" })
    }

    pub fn enforcement(&self) -> &'static str {
        if self.version == 1 {
            "cgroup-v1"
        } else {
            "cgroup-v2"
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The resident and shared pages of process `pid` (`/proc/PID/statm`, second and third fields);
/// none once it is gone.
fn statm(pid: u32) -> Option<(usize, usize)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let mut f = s.split_whitespace().skip(1).map(|v| v.parse::<usize>().ok());
    Some((f.next()??, f.next()??))
}

/// Resident bytes of process `pid` (`/proc/PID/statm`); 0 once it is gone (a zombie has none).
pub fn rss_of(pid: u32) -> usize {
    statm(pid).map_or(0, |(resident, _)| resident * 4096)
}

/// Resident anonymous bytes of process `pid` (`/proc/PID/statm`: resident less shared, which
/// leaves out the program's file pages that every guest maps and a cgroup charges once); 0 once
/// it is gone.
pub fn anon_of(pid: u32) -> usize {
    statm(pid).map_or(0, |(resident, shared)| resident.saturating_sub(shared) * 4096)
}

/// CPU time, in ms, of the threads of process `pid` named `name` (`/proc/PID/task/*/comm`; user
/// and system, `stat` fields 14 and 15): a fallow worker's (`fallow-report`, `fallow-zero`); 0
/// once the process is gone or when it has no such thread.
pub fn thread_cpu_ms(pid: u32, name: &str) -> f64 {
    // SAFETY: `sysconf` has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let mut ticks = 0u64;
    for t in tasks.flatten() {
        let named = std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name);
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
        // The fields after the command, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
        if named && f.len() == 2 {
            ticks += f[0] + f[1];
        }
    }
    ticks as f64 * 1e3 / tick
}

/// How a reaped guest ended, and what it used (`wait4`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Reaped {
    /// Killed by SIGKILL that this program did not send (the OOM killer's signal).
    pub killed: bool,
    /// Ended otherwise than by a clean exit or such a kill (an error exit, another signal).
    pub failed: bool,
    pub cpu_ms: f64,
    pub minflt: u64,
    pub majflt: u64,
}

/// Wait for child `pid` for at most `patience`, then kill it (SIGKILL) and wait for it; reap it
/// with its resource use. A guest killed here is not counted as killed (`Reaped::killed` is the
/// OOM killer's), but as failed. Call once per child, and only for a child not yet reaped (the
/// `Child` handle must not be waited for afterwards).
pub fn reap(pid: u32, patience: Duration) -> Reaped {
    let deadline = Instant::now() + patience;
    let mut killed_here = false;
    let pid = pid as libc::pid_t;
    loop {
        let mut status = 0;
        // SAFETY: `rusage` is plain integers, for which all zeros is a valid value.
        let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
        let flags = if killed_here { 0 } else { libc::WNOHANG };
        // SAFETY: `status` and `ru` are valid, writable locals; `pid` is our own child.
        let rc = unsafe { libc::wait4(pid, &mut status, flags, &mut ru) };
        if rc == pid {
            let signalled = libc::WIFSIGNALED(status);
            let killed = signalled && libc::WTERMSIG(status) == libc::SIGKILL && !killed_here;
            let clean = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            return Reaped {
                killed,
                failed: !killed && !clean,
                cpu_ms: timeval_ms(ru.ru_utime) + timeval_ms(ru.ru_stime),
                minflt: ru.ru_minflt as u64,
                majflt: ru.ru_majflt as u64,
            };
        }
        if rc < 0 {
            // Not our child any more (reaped elsewhere): nothing to tell.
            return Reaped { failed: true, ..Reaped::default() };
        }
        if !killed_here && Instant::now() > deadline {
            // SAFETY: sending a signal to our own unreaped child, which still owns `pid`.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed_here = true;
            continue;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn spawn(script: &str) -> u32 {
        // The handle is dropped without waiting: `reap` waits for the child by its pid.
        Command::new("sh").arg("-c").arg(script).spawn().expect("sh").id()
    }

    #[test]
    fn reaping_tells_a_clean_exit_an_error_an_outside_kill_and_our_own_kill_apart() {
        let r = reap(spawn("exit 0"), Duration::from_secs(20));
        assert!(!r.killed && !r.failed, "{r:?}");
        let r = reap(spawn("exit 3"), Duration::from_secs(20));
        assert!(!r.killed && r.failed, "{r:?}");
        // Killed by SIGKILL from elsewhere (as by the OOM killer): counted as killed.
        let r = reap(spawn("kill -9 $$"), Duration::from_secs(20));
        assert!(r.killed && !r.failed, "{r:?}");
        // Still running when patience runs out: killed here, counted as failed, not as killed.
        // (`exec`: the shell itself sleeps, so that the kill leaves no orphan holding the test's
        // output open for a minute.)
        let r = reap(spawn("exec sleep 60"), Duration::from_millis(50));
        assert!(!r.killed && r.failed, "{r:?}");
    }

    #[test]
    fn a_process_resident_set_is_read_and_a_gone_one_has_none() {
        let mut v = vec![1u8; 8 << 20];
        std::hint::black_box(&mut v);
        let me = std::process::id();
        assert!(rss_of(me) >= 8 << 20);
        assert!(anon_of(me) >= 8 << 20 && anon_of(me) <= rss_of(me));
        let gone = spawn("exit 0");
        reap(gone, Duration::from_secs(20));
        assert_eq!((rss_of(gone), anon_of(gone)), (0, 0));
    }
}
