//! Starting a user's program for `fallow run` and `fallow compare`: finding the libraries to
//! preload (fallow's own, and Debian's jemalloc, mimalloc and tcmalloc), running the program and
//! waiting for it with `wait4` (its own wall and CPU time, peak RSS and page faults), its exit
//! status as a shell gives it, and its resident size over time read from `/proc/PID/status` by a
//! thread of this process (the program is not touched).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::measure::{monotonic_ns, read_first_line, timeval_ms};

/// The file name of fallow's preload library.
pub const PRELOAD_NAME: &str = "libfallow_preload.so";

/// Where fallow's preload library may be, in the order tried: beside the `fallow` binary (the
/// build directory, `target/release`), and `../lib` from it (`make install`'s `$PREFIX/bin` and
/// `$PREFIX/lib`).
pub fn preload_candidates(exe: &Path) -> Vec<PathBuf> {
    let dir = exe.parent().unwrap_or(Path::new("."));
    vec![dir.join(PRELOAD_NAME), dir.join("..").join("lib").join(PRELOAD_NAME)]
}

/// fallow's preload library: `given` if set (it must exist), else the first candidate that exists.
pub fn find_preload(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("the preload library {} does not exist", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the fallow binary's own path: {e}"))?;
    let tried = preload_candidates(&exe);
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()));
    }
    let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "the preload library {PRELOAD_NAME} is missing (tried {}); build it with `cargo build --release -p \
         fallow-preload` or install it with `make install`, or name it with --preload",
        list.join(" and ")
    ))
}

/// The directories searched for the peers' shared libraries.
fn lib_dirs() -> Vec<PathBuf> {
    let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    [multiarch.as_str(), "/usr/lib64", "/usr/lib", "/usr/local/lib"].iter().map(PathBuf::from).collect()
}

/// A peer's shared library, as Debian's packages install it (`libjemalloc2`, `libmimalloc2.0`,
/// `libtcmalloc-minimal4`), or `None` when it is not installed.
pub fn peer_library(peer: &str) -> Option<PathBuf> {
    let names: &[&str] = match peer {
        "jemalloc" => &["libjemalloc.so.2", "libjemalloc.so"],
        "mimalloc" => &["libmimalloc.so.2", "libmimalloc.so.3", "libmimalloc.so"],
        "tcmalloc" => &["libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so"],
        _ => return None,
    };
    for dir in lib_dirs() {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
        // Versioned names only (`libmimalloc.so.2.1`).
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let f = e.file_name().to_string_lossy().into_owned();
                if names.iter().any(|n| f.starts_with(&format!("{n}."))) {
                    return Some(e.path());
                }
            }
        }
    }
    None
}

/// `LD_PRELOAD` with `lib` first and what the environment already preloads after it.
pub fn ld_preload_with(lib: &Path) -> OsString {
    let mut v = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// How the program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signaled(i32),
}

impl Ending {
    /// The status a shell reports: the exit status, or 128 + N for a death by signal N.
    pub fn shell_status(self) -> u8 {
        match self {
            Ending::Exited(c) => c as u8,
            Ending::Signaled(n) => (128 + n) as u8,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Ending::Exited(c) => format!("exit {c}"),
            Ending::Signaled(n) => {
                // SAFETY: `strsignal` returns a pointer to a static or thread-local string (or
                // null), read at once.
                let name = unsafe {
                    let p = libc::strsignal(n);
                    if p.is_null() {
                        String::new()
                    } else {
                        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                    }
                };
                format!("signal {n} ({name})")
            }
        }
    }
}

/// What a finished program measured.
#[derive(Clone, Debug)]
pub struct Finished {
    pub pid: u32,
    pub ending: Ending,
    pub wall_ms: f64,
    pub user_ms: f64,
    pub sys_ms: f64,
    /// `ru_maxrss` (the kernel's high-water mark of the resident size), bytes.
    pub peak_rss: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
    /// `CLOCK_MONOTONIC` nanoseconds at the start.
    pub start_ns: u64,
    /// (`CLOCK_MONOTONIC` ns, resident bytes) every sampling interval, from `/proc/PID/status`.
    pub rss: Vec<(u64, u64)>,
}

impl Finished {
    pub fn cpu_ms(&self) -> f64 {
        self.user_ms + self.sys_ms
    }
}

/// `VmRSS` of a process in bytes, if it is still there.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let kib = read_first_line(&format!("/proc/{pid}/status"), "VmRSS:")?;
    Some(kib.split_whitespace().next()?.parse::<u64>().ok()? << 10)
}

/// The program being waited for (0: none), for `forward`.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// `SIGTERM` and `SIGHUP` sent to this process go on to the program, which decides what they do
/// (usually it ends, and its summary is still printed).
extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: `kill` is async-signal-safe. `pid` is our child: it is cleared as soon as `wait4`
        // has reaped it (a signal in between goes to a zombie, or, were its pid reused within
        // those nanoseconds, astray: the kernel hands out pids in turn, so it is not).
        unsafe { libc::kill(pid, sig) };
    }
}

/// Run `cmd` (its environment set by the caller) to its end. With `sample_ms`, a thread of this
/// process reads the program's resident size that often. `quiet` sends the program's output to
/// `/dev/null`. While the program runs, this process ignores `SIGINT` and `SIGQUIT`, as a shell
/// does for a foreground command (a Ctrl-C reaches the program from the terminal, and the summary
/// is still printed), and passes `SIGTERM` and `SIGHUP` on to the program.
pub fn run(mut cmd: Command, sample_ms: Option<u64>, quiet: bool) -> Result<Finished, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    if quiet {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    }
    let start_ns = monotonic_ns();
    let t0 = Instant::now();
    let child = cmd.spawn().map_err(|e| {
        let why = e.to_string();
        let why = why.split(" (os error").next().unwrap_or(&why).to_string();
        format!("cannot start {program}: {why}")
    })?;
    let pid = child.id();
    CHILD.store(pid as i32, Ordering::Relaxed);
    // SAFETY: setting the dispositions of four signals for this process: two ignored, two handled
    // by `forward`, which only calls `kill` (async-signal-safe); the previous dispositions are put
    // back below.
    let (old_int, old_quit, old_term, old_hup) = unsafe {
        let forward = forward as extern "C" fn(libc::c_int) as libc::sighandler_t;
        (
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
            libc::signal(libc::SIGTERM, forward),
            libc::signal(libc::SIGHUP, forward),
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = sample_ms.map(|ms| {
        let (stop, samples) = (stop.clone(), samples.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(r) = vm_rss(pid) {
                    samples.lock().unwrap().push((monotonic_ns(), r));
                }
                std::thread::sleep(Duration::from_millis(ms));
            }
        })
    });
    // SAFETY: `rusage` is plain integers, for which all zeros is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    let mut status = 0;
    let waited = loop {
        // SAFETY: `status` and `ru` are valid and writable; `pid` is our own child, not yet waited for.
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break r;
        }
    };
    CHILD.store(0, Ordering::Relaxed);
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = sampler {
        let _ = t.join();
    }
    // SAFETY: restoring the dispositions saved above.
    unsafe {
        libc::signal(libc::SIGINT, old_int);
        libc::signal(libc::SIGQUIT, old_quit);
        libc::signal(libc::SIGTERM, old_term);
        libc::signal(libc::SIGHUP, old_hup);
    }
    drop(child);
    if waited < 0 {
        return Err(format!("cannot wait for {program}: {}", std::io::Error::last_os_error()));
    }
    let ending = if libc::WIFSIGNALED(status) {
        Ending::Signaled(libc::WTERMSIG(status))
    } else {
        Ending::Exited(libc::WEXITSTATUS(status))
    };
    let rss = std::mem::take(&mut *samples.lock().unwrap());
    Ok(Finished {
        pid,
        ending,
        wall_ms,
        user_ms: timeval_ms(ru.ru_utime),
        sys_ms: timeval_ms(ru.ru_stime),
        peak_rss: ru.ru_maxrss as u64 * 1024,
        minor_faults: ru.ru_minflt as u64,
        major_faults: ru.ru_majflt as u64,
        start_ns,
        rss,
    })
}

/// The status a shell exits with when it cannot start a program: 127 when it is not found, 126
/// when it is found but cannot be executed.
pub fn start_failure_status(program: &std::ffi::OsStr) -> u8 {
    let p = Path::new(program);
    let found = if p.components().count() > 1 {
        p.exists()
    } else {
        std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
            .unwrap_or(false)
    };
    if found {
        126
    } else {
        127
    }
}

/// A command line as a shell user would type it: plain words bare, others quoted (`'a b'`, and
/// `$'...'` for one holding a newline), so that a summary's header stays on one line.
pub fn display_command(args: &[OsString]) -> String {
    let word = |a: &OsString| {
        let a = a.to_string_lossy();
        let plain = |c: char| c.is_ascii_alphanumeric() || "_./=:,+-@%".contains(c);
        if !a.is_empty() && a.chars().all(plain) {
            a.into_owned()
        } else if a.contains('\n') || a.contains('\t') {
            let inner: String = a
                .chars()
                .map(|c| match c {
                    '\n' => "\\n".to_string(),
                    '\t' => "\\t".to_string(),
                    '\'' => "\\'".to_string(),
                    '\\' => "\\\\".to_string(),
                    c => c.to_string(),
                })
                .collect();
            format!("$'{inner}'")
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    };
    args.iter().map(word).collect::<Vec<_>>().join(" ")
}

/// Bytes as people read them: `1.5 GiB`, `640 KiB`, `12 B`.
pub fn human(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v.abs() >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else if v.abs() >= 100.0 {
        format!("{v:.0} {}", units[u])
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_map_to_shell_statuses() {
        assert_eq!(Ending::Exited(3).shell_status(), 3);
        assert_eq!(Ending::Signaled(9).shell_status(), 137);
        assert!(Ending::Signaled(15).describe().starts_with("signal 15"));
    }

    #[test]
    fn the_preload_is_looked_for_beside_the_binary_then_in_lib() {
        let c = preload_candidates(Path::new("/opt/x/bin/fallow"));
        assert_eq!(c[0], PathBuf::from("/opt/x/bin/libfallow_preload.so"));
        assert_eq!(c[1], PathBuf::from("/opt/x/bin/../lib/libfallow_preload.so"));
        let e = find_preload(Some(Path::new("/nonexistent/lib.so"))).unwrap_err();
        assert!(e.contains("/nonexistent/lib.so"), "{e}");
    }

    #[test]
    fn a_program_runs_and_its_status_comes_back() {
        let mut c = Command::new("sh");
        c.args(["-c", "exit 7"]);
        let f = run(c, Some(10), true).unwrap();
        assert_eq!(f.ending, Ending::Exited(7));
        let mut c = Command::new("sh");
        c.args(["-c", "kill -TERM $$"]);
        assert_eq!(run(c, None, true).unwrap().ending, Ending::Signaled(libc::SIGTERM));
        assert!(run(Command::new("/nonexistent/program"), None, true).unwrap_err().contains("cannot start"));
        assert_eq!(human(1536.0), "1.5 KiB");
        let words = ["python3", "-c", "import x\nx.y('a')", "a b", "ok=1"];
        let cmd: Vec<OsString> = words.iter().map(OsString::from).collect();
        assert_eq!(display_command(&cmd), "python3 -c $'import x\\nx.y(\\'a\\')' 'a b' ok=1");
        assert_eq!(human(3.0 * (1u64 << 30) as f64), "3.0 GiB");
    }
}
