//! The process and its threads: ids, the background threads and their scheduling, the CPU load,
//! limits and sizes of the machine, clocks and sleeps.

use core::ffi::{c_void, CStr};

use rustix::process::{getrlimit, Resource};
use rustix::thread::Pid;

use super::{parse_decimal, read_small_file, OsResult, PAGE_SIZE};

/// This process's id (a `fork` child has its own: callers compare it to tell).
pub fn getpid() -> i32 {
    Pid::as_raw(Some(rustix::process::getpid()))
}

/// The calling thread's kernel id (`gettid`): below 2^22 (`PID_MAX_LIMIT`), so it fits a 32-bit
/// word with two spare bits (`start.rs`).
pub fn gettid() -> i32 {
    Pid::as_raw(Some(rustix::thread::gettid()))
}

/// Whether `tid` is a live thread of this process: `tgkill(getpid(), tid, 0)` sends no signal,
/// only checks. A thread of another process (the parent, after `fork`) is not one.
pub fn thread_alive(tid: i32) -> bool {
    if tid <= 0 {
        return false;
    }
    // A raw system call: rustix has no `tgkill`, and glibc's wrapper needs glibc 2.30.
    // SAFETY: signal 0 is never delivered; the call only looks the thread up.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, getpid(), tid, 0) };
    r == 0 || super::errno() != libc::ESRCH
}

/// Whether the process's first thread has ended (a zombie, which the kernel keeps while other
/// threads live) and at most `others` other threads are left: `/proc/self/stat`'s third field
/// (the first thread's state) and twentieth (the threads, the zombie included). `false` when
/// the file cannot be read.
pub fn first_thread_gone_leaving(others: u32) -> bool {
    let mut buf = [0u8; 1024];
    let Some(n) = read_small_file(c"/proc/self/stat", &mut buf) else { return false };
    matches!(stat_state_and_threads(&buf[..n]), Some((b'Z', t)) if t <= others as u64 + 1)
}

/// (state, threads) of a `/proc/<pid>/stat` line: the third and twentieth fields, counted after
/// the command's closing parenthesis (the command, in parentheses, may hold any byte).
fn stat_state_and_threads(line: &[u8]) -> Option<(u8, u64)> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line[close + 1..].split(|&b| b == b' ' || b == b'\n').filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    // Fields 4 to 19 passed, the twentieth.
    let threads = fields.nth(16)?;
    Some((state, parse_decimal(threads)?))
}

/// A pidfd for this process (for `process_madvise`), close-on-exec.
pub fn pidfd_self() -> OsResult<i32> {
    use rustix::fd::IntoRawFd;
    let fd = rustix::process::pidfd_open(rustix::process::getpid(), rustix::process::PidfdFlags::empty());
    super::os_result(fd).map(|fd| fd.into_raw_fd())
}

/// The entry point of a background thread (`spawn_thread`).
pub type ThreadEntry = extern "C" fn(*mut c_void) -> *mut c_void;

/// Start a thread running `entry(arg)` with default attributes; its `pthread_t`. `Err(errno)`
/// when the C library refuses: the caller then still owns `arg`. Threads are the C library's
/// (`pthread_create`: rustix has none), which allocates no Rust heap memory for them.
pub fn spawn_thread(entry: ThreadEntry, arg: *mut c_void) -> OsResult<usize> {
    let mut tid: libc::pthread_t = 0;
    // SAFETY: `tid` is writable and the attributes are the defaults (null); `entry` takes `arg`
    // over only if the thread is created.
    let r = unsafe { libc::pthread_create(&mut tid, core::ptr::null(), entry, arg) };
    if r != 0 {
        return Err(r);
    }
    Ok(tid as usize)
}

/// Wait for a thread that `spawn_thread` started to end.
///
/// # Safety
/// `thread` is a thread of this process from `spawn_thread`, not joined yet and joined by nobody
/// else (a `pthread_t` joined twice is undefined behaviour).
pub unsafe fn join_thread(thread: usize) {
    // SAFETY: the caller's contract: a joinable thread of ours, joined here only.
    unsafe { libc::pthread_join(thread as libc::pthread_t, core::ptr::null_mut()) };
}

/// Name the calling thread (`prctl(PR_SET_NAME)`, as `pthread_setname_np` does for oneself): the
/// first 15 bytes of `name`.
pub fn set_thread_name(name: &[u8]) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name[..n]);
    if let Ok(name) = CStr::from_bytes_until_nul(&buf) {
        let _ = rustix::thread::set_name(name);
    }
}

/// How a background worker is scheduled (`set_background_priority`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackgroundPolicy {
    /// `SCHED_BATCH` at the process's nice value: it never preempts the program on wake-up, and
    /// it keeps a fair share, so that when the process exits under full CPU load the kernel can
    /// end it at once. It takes only idle CPU because the worker itself checks for an idle CPU
    /// (`CpuLoad`) before each step.
    Batch,
    /// `SCHED_IDLE` (or nice 19 where refused): where the load cannot be read, the scheduler
    /// keeps the worker off busy CPUs instead. A starved `SCHED_IDLE` thread delays the process's
    /// exit until it runs again.
    Idle,
}

/// Schedule the calling thread as `policy` says; returns the policy that took.
pub fn set_background_priority(policy: BackgroundPolicy) -> BackgroundPolicy {
    let param = libc::sched_param { sched_priority: 0 };
    // `sched_setscheduler` through glibc: rustix has none.
    // SAFETY: plain system calls on the calling thread (pid 0), with a valid parameter block.
    let set = |p| unsafe { libc::sched_setscheduler(0, p, &param) } == 0;
    if policy == BackgroundPolicy::Batch && set(libc::SCHED_BATCH) {
        return BackgroundPolicy::Batch;
    }
    if !set(libc::SCHED_IDLE) {
        // `PRIO_PROCESS` with a thread id sets that thread's nice value on Linux.
        let _ = rustix::process::setpriority_process(Pid::from_raw(gettid()), 19);
    }
    BackgroundPolicy::Idle
}

/// Back to the default policy (`SCHED_OTHER`) from `SCHED_BATCH`, which needs no privilege (from
/// `SCHED_IDLE` it may be refused: the thread then stays as it was).
pub fn set_normal_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread (pid 0), with a valid parameter block.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
}

/// Whether a CPU is idle right now, from the count of runnable threads in the whole system (the
/// fourth field of `/proc/loadavg`, which counts the reader too) against the CPUs online: an
/// `open`, `read` and `close` (a few microseconds; no descriptor is kept, so none leaks into a
/// `fork` child or is reused under a program that closes descriptors), no allocation.
///
/// The count is the host's, so it is a sound signal only where this process may use every CPU
/// online: `open` refuses (and the worker falls back to `SCHED_IDLE`) when the affinity mask
/// holds fewer CPUs, or when a CPU quota is set on the cgroup seen at `/sys/fs/cgroup` (v2
/// `cpu.max`, v1 `cpu/cpu.cfs_quota_us`; a quota on a parent cgroup outside the process's view
/// is not seen).
pub struct CpuLoad {
    cpus: u32,
}

/// The online CPUs (glibc's count), at least 1.
pub fn online_cpus() -> u32 {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32
}

impl CpuLoad {
    /// `None` where the signal cannot be read or would not mean "a CPU of ours is idle".
    pub fn open() -> Option<CpuLoad> {
        // glibc's count (from `/sys/devices/system/cpu/online`, read into a stack buffer):
        // rustix has none.
        let online = online_cpus();
        let allowed = rustix::thread::sched_getaffinity(None).ok()?.count();
        if allowed < online || cpu_quota_set() {
            return None;
        }
        let load = CpuLoad { cpus: online };
        load.runnable()?;
        Some(load)
    }

    /// Threads runnable in the system now, the caller included.
    fn runnable(&self) -> Option<u32> {
        let mut buf = [0u8; 128];
        let n = read_small_file(c"/proc/loadavg", &mut buf)?;
        // "0.52 0.58 0.59 3/467 12345": the number before '/'.
        let field = buf[..n].split(|&b| b == b' ').nth(3)?;
        u32::try_from(parse_decimal(field.split(|&b| b == b'/').next()?)?).ok()
    }

    /// Whether some CPU would otherwise be idle: at most one runnable thread per CPU, counting
    /// the caller. Unreadable counts as idle (the caller opened it successfully once).
    pub fn cpu_idle(&self) -> bool {
        self.runnable().is_none_or(|r| r <= self.cpus)
    }
}

/// Whether the cgroup at `/sys/fs/cgroup` limits CPU time (v2 `cpu.max` not "max ...", v1
/// `cpu.cfs_quota_us` not -1).
fn cpu_quota_set() -> bool {
    let mut buf = [0u8; 64];
    if let Some(n) = read_small_file(c"/sys/fs/cgroup/cpu.max", &mut buf) {
        return !buf[..n].starts_with(b"max");
    }
    if let Some(n) = read_small_file(c"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &mut buf) {
        return !buf[..n].starts_with(b"-1");
    }
    false
}

/// Physical memory of the machine, in bytes (`sysinfo`); 1 GiB where it cannot be told.
pub fn physical_memory() -> usize {
    let info = rustix::system::sysinfo();
    let bytes = (info.totalram as usize).saturating_mul((info.mem_unit as usize).max(1));
    if bytes == 0 {
        return 1 << 30;
    }
    bytes
}

/// Address space this process may still map: `RLIMIT_AS` less its current size (the first field
/// of `/proc/thread-self/statm`, read into a stack buffer: no allocation). `None` when the limit is
/// infinite. When the size cannot be read the whole limit is returned (the caller retries
/// smaller reservations when the kernel refuses anyway).
pub fn address_space_room() -> Option<usize> {
    let limit = getrlimit(Resource::As).current?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    Some(limit.saturating_sub(mapped_bytes().unwrap_or(0)))
}

/// The size of this process's address space (`/proc/thread-self/statm`, in pages: `/proc/self`'s
/// reads zeros once the first thread has ended), in bytes.
fn mapped_bytes() -> Option<usize> {
    let mut buf = [0u8; 128];
    let n = read_small_file(c"/proc/thread-self/statm", &mut buf)?;
    // "SIZE RESIDENT ...": the first field, in pages.
    let size = buf[..n].split(|&b| b == b' ').next()?;
    usize::try_from(parse_decimal(size)?).ok()?.checked_mul(PAGE_SIZE)
}

/// The value of the environment variable `name`, as the C library's `getenv` gives it: no copy
/// and no allocation (`std::env` allocates, and settings are read inside `malloc`).
///
/// # Safety
///
/// No thread changes the environment (`setenv`, `putenv`, `unsetenv`) while the caller holds the
/// bytes returned: they point into the environment itself (glibc's `getenv` asks the same).
pub unsafe fn getenv<'a>(name: &CStr) -> Option<&'a [u8]> {
    // Not a system call: glibc walks `environ`, without allocating.
    // SAFETY: `name` is a valid NUL-terminated string for the call.
    let v = unsafe { libc::getenv(name.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: a non-null `getenv` result is a NUL-terminated string in the environment, valid
    // while the environment is not changed, which the caller promises for `'a`.
    Some(unsafe { CStr::from_ptr(v) }.to_bytes())
}

/// Monotonic time in nanoseconds (`clock_gettime(CLOCK_MONOTONIC)`, through the vDSO).
pub fn now_ns() -> u64 {
    // glibc's, not rustix's: rustix finds the vDSO on first use by reading the auxiliary vector,
    // either itself (which may allocate) or through `getauxval` looked up with `dlsym` (which
    // takes the loader's lock), and the first use is inside `malloc` (the allocator's creation).
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleep for `ns` nanoseconds, or less when a signal interrupts the sleep.
pub fn sleep_ns(ns: u64) {
    let ts = rustix::thread::Timespec {
        tv_sec: (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as i64,
    };
    let _ = rustix::thread::nanosleep(&ts);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_threads() {
        assert!(getpid() > 0);
        assert!(thread_alive(gettid()));
        assert!(!thread_alive(0));
        extern "C" fn entry(arg: *mut c_void) -> *mut c_void {
            set_thread_name(b"fallow-os-test-long-name");
            let mut buf = [0u8; 64];
            let n = read_small_file(c"/proc/thread-self/comm", &mut buf).unwrap_or(0);
            // SAFETY: `arg` is the `AtomicBool` of the spawning test, alive until the join.
            let ok = unsafe { &*(arg as *const core::sync::atomic::AtomicBool) };
            ok.store(&buf[..n] == b"fallow-os-test-\n", core::sync::atomic::Ordering::Relaxed);
            core::ptr::null_mut()
        }
        let named = core::sync::atomic::AtomicBool::new(false);
        let t = spawn_thread(entry, &named as *const _ as *mut c_void).unwrap();
        // SAFETY: the thread started just above, joined here only.
        unsafe { join_thread(t) };
        assert!(named.load(core::sync::atomic::Ordering::Relaxed));
    }

    #[test]
    fn a_stat_line_gives_the_first_threads_state_and_the_thread_count() {
        let line = b"4242 (a) b) c) Z 1 4242 4242 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 3 0 999 1 2 3\n";
        assert_eq!(stat_state_and_threads(line), Some((b'Z', 3)));
        assert_eq!(stat_state_and_threads(b"1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 17"), Some((b'S', 17)));
        assert_eq!(stat_state_and_threads(b"1 (x) S 0 1"), None);
        assert_eq!(stat_state_and_threads(b"no parenthesis"), None);
        // This test's own process: its first thread runs the harness, alive.
        assert!(!first_thread_gone_leaving(u32::MAX - 1));
    }

    #[test]
    fn clocks_and_sizes() {
        let t0 = now_ns();
        sleep_ns(1_000);
        assert!(now_ns() >= t0);
        assert!(physical_memory() >= PAGE_SIZE);
        assert!(mapped_bytes().is_some_and(|b| b > 0));
        match pidfd_self() {
            // SAFETY: the pidfd opened just above, used no more.
            Ok(fd) => unsafe { super::super::close(fd) },
            // A kernel before 5.3, or a sandbox that refuses the call.
            Err(e) => assert!(e == libc::ENOSYS || e == libc::EPERM, "pidfd_open: errno {e}"),
        }
    }
}
