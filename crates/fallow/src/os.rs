//! The operating system: every system call fallow makes goes through this file.
//!
//! Nothing here allocates from the heap, so it is safe to call from inside a preloaded `malloc`.
//! Failures come back as `Err(errno)`.

use core::ptr;

pub const PAGE_SIZE: usize = 4096;
pub const PAGE_SHIFT: u32 = 12;
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// `MADV_POPULATE_WRITE` (Linux 5.14); the `libc` crate may not name it on every target.
pub const MADV_POPULATE_WRITE: i32 = 23;

pub type OsResult<T> = Result<T, i32>;

pub fn errno() -> i32 {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's lifetime.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(value: i32) {
    // SAFETY: as in `errno`: the calling thread's own errno slot.
    unsafe { *libc::__errno_location() = value }
}

/// Reserve `len` bytes of address space, aligned to `align` (a power of two), without committing
/// memory: `MAP_NORESERVE`, private anonymous, or shared over `fd` when one is given.
pub fn reserve_aligned(len: usize, align: usize, fd: Option<i32>) -> OsResult<usize> {
    debug_assert!(align.is_power_of_two() && len.is_multiple_of(PAGE_SIZE));
    if let Some(fd) = fd {
        // A shared file mapping cannot be over-reserved and trimmed (the offsets would shift), so
        // reserve an anonymous hole first and map the file over its aligned part.
        let hole = reserve_aligned(len, align, None)?;
        let flags = libc::MAP_SHARED | libc::MAP_NORESERVE | libc::MAP_FIXED;
        // SAFETY: `MAP_FIXED` over `hole`, a range of `len` bytes this call just reserved and nothing
        // else uses, so no live mapping is replaced.
        let p = unsafe {
            libc::mmap(hole as *mut _, len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0)
        };
        if p == libc::MAP_FAILED {
            let e = errno();
            // SAFETY: `hole` is the reservation made just above, returned to nobody.
            unsafe { unmap(hole, len) };
            return Err(e);
        }
        return Ok(p as usize);
    }
    // mmap returns page-aligned addresses, so `align - PAGE_SIZE` bytes of slack always hold an
    // aligned start (none for a page alignment): less address space at the peak, which matters
    // under `RLIMIT_AS`.
    let span = len.checked_add(align - PAGE_SIZE).ok_or(libc::ENOMEM)?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a fresh anonymous mapping at an address the kernel picks: no existing memory changes.
    let p = unsafe {
        libc::mmap(ptr::null_mut(), span, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    if aligned > start {
        // SAFETY: slack of the mapping made just above, below `aligned`: only `[aligned, aligned +
        // len)` is returned.
        unsafe { unmap(start, aligned - start) };
    }
    let end = start + span;
    if end > aligned + len {
        // SAFETY: slack of the same mapping, above `aligned + len`.
        unsafe { unmap(aligned + len, end - (aligned + len)) };
    }
    Ok(aligned)
}

/// Unmap `[addr, addr + len)`.
///
/// # Safety
/// The range is one the caller mapped (or a part of it) and nothing references any more: after
/// the call an access to it faults, and a later mapping may reuse the addresses.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: the caller's contract: the range is the caller's own and no longer used.
    unsafe {
        libc::munmap(addr as *mut _, len);
    }
}

/// `madvise(addr, len, advice)`.
///
/// # Safety
/// Destructive advice (`MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`, ...) replaces the contents
/// of the range with zeros (now or whenever the kernel likes): the caller owns the whole range
/// and nothing relies on its contents. Any advice: the range is mapped by the caller.
pub unsafe fn madvise(addr: usize, len: usize, advice: i32) -> OsResult<()> {
    // SAFETY: the caller's contract: a range the caller owns, whose contents may change as
    // `advice` says.
    let r = unsafe { libc::madvise(addr as *mut _, len, advice) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

pub fn mlock(addr: usize, len: usize) -> OsResult<()> {
    // SAFETY: `mlock` only pins pages in memory; it changes no contents, whatever the range.
    let r = unsafe { libc::mlock(addr as *const _, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

pub fn munlock(addr: usize, len: usize) {
    // SAFETY: `munlock` only unpins pages; it changes no contents, whatever the range.
    unsafe {
        libc::munlock(addr as *const _, len);
    }
}

/// A sealed-size anonymous file of `len` bytes (sparse: nothing is committed).
pub fn memfd(len: usize) -> OsResult<i32> {
    let name = b"fallow\0";
    // SAFETY: `name` is NUL-terminated; the call creates a new descriptor and touches no memory.
    let fd = unsafe { libc::memfd_create(name.as_ptr() as *const _, libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: plain system call on the descriptor just created, no memory-safety preconditions.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        let e = errno();
        // SAFETY: the descriptor this call just created, returned to nobody.
        unsafe { close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// Close `fd`.
///
/// # Safety
/// The caller owns `fd` and uses it no more: a descriptor closed under another owner (a memfd
/// behind a mapping, a file) could be reused by an unrelated `open` and written through.
pub unsafe fn close(fd: i32) {
    // SAFETY: the caller's contract: its own descriptor, not used after this.
    unsafe {
        libc::close(fd);
    }
}

/// Fault in `[addr, addr + len)` for writing: `MADV_POPULATE_WRITE` where the kernel has it,
/// otherwise a read-and-write-back of one byte per page (which preserves the contents).
///
/// # Safety
/// The range is mapped read-write and owned by the caller: no other thread accesses it during
/// the call (the write-back of a byte would race with its writes).
pub unsafe fn populate_write(addr: usize, len: usize) {
    // SAFETY: `MADV_POPULATE_WRITE` only faults pages in and keeps their contents; the range is
    // the caller's (its contract).
    if unsafe { madvise(addr, len, MADV_POPULATE_WRITE) }.is_ok() {
        return;
    }
    let mut p = addr;
    while p < addr + len {
        // SAFETY: `p` is a page of the range, which the caller's contract says is mapped
        // read-write and touched by no other thread meanwhile; the write-back keeps the byte.
        unsafe {
            let b = p as *mut u8;
            b.write_volatile(b.read_volatile());
        }
        p += PAGE_SIZE;
    }
}

/// Physical memory of the machine, in bytes.
pub fn physical_memory() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if pages <= 0 || size <= 0 {
        return 1 << 30;
    }
    (pages as usize).saturating_mul(size as usize)
}

/// Address space this process may still map: `RLIMIT_AS` less its current size (the first field
/// of `/proc/self/statm`, read with `open`/`read` into a stack buffer: no allocation). `None`
/// when the limit is infinite. When the size cannot be read the whole limit is returned (the
/// caller retries smaller reservations when the kernel refuses anyway).
pub fn address_space_room() -> Option<usize> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let limit = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    Some(limit.saturating_sub(mapped_bytes().unwrap_or(0)))
}

/// The size of this process's address space (`/proc/self/statm`, in pages), in bytes.
fn mapped_bytes() -> Option<usize> {
    let mut buf = [0u8; 128];
    let n = read_small_file(c"/proc/self/statm", &mut buf)?;
    // "SIZE RESIDENT ...": the first field, in pages.
    let size = buf[..n].split(|&b| b == b' ').next()?;
    usize::try_from(parse_decimal(size)?).ok()?.checked_mul(PAGE_SIZE)
}

/// Monotonic time in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Write a message to stderr without allocating.
pub fn write_stderr(msg: &[u8]) {
    let mut off = 0;
    while off < msg.len() {
        // SAFETY: `msg[off..]` is readable for `msg.len() - off` bytes.
        let r = unsafe { libc::write(2, msg[off..].as_ptr() as *const _, msg.len() - off) };
        if r <= 0 {
            return;
        }
        off += r as usize;
    }
}

// ---- Background workers (worker.rs, report.rs, zero.rs) ----

/// Sleep while `*word == expected`, at most `timeout_ns` (`None`: until woken).
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live `AtomicU32` borrowed for the call, and `tsp` is null or points to
    // `ts`, alive until the call returns; FUTEX_WAIT only reads both.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const core::sync::atomic::AtomicU32,
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        );
    }
}

/// Wake every thread sleeping on `word`.
pub fn futex_wake_all(word: &core::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a live `AtomicU32` borrowed for the call; FUTEX_WAKE only uses its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const core::sync::atomic::AtomicU32,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// The calling thread's kernel id (`gettid`): below 2^22 (`PID_MAX_LIMIT`), so it fits a 32-bit
/// word with two spare bits (`start.rs`).
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Whether `tid` is a live thread of this process: `tgkill(getpid(), tid, 0)` sends no signal,
/// only checks. A thread of another process (the parent, after `fork`) is not one.
pub fn thread_alive(tid: i32) -> bool {
    if tid <= 0 {
        return false;
    }
    // SAFETY: signal 0 is never delivered; the call only looks the thread up.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    r == 0 || errno() != libc::ESRCH
}

/// The largest `ZERO` request that is served faster by a hot dirty block and a memset than by a
/// block zeroed earlier (cold: the zeroing worker's non-temporal stores leave it in DRAM): a
/// sixteenth of the last-level cache, 512 KiB to 8 MiB, 2 MiB where the cache size is unknown.
/// Measured on a 32 MiB L3 shared with other tenants (`examples/calloc_choice.rs`, four runs):
/// hot won by 1.1-1.8x up to 2 MiB in most runs, the two were even at 4 MiB, and cold won by
/// 1.3-1.9x from 8 MiB in three runs of four (docs/design.md, "Reuse-aware zeroing").
pub fn hot_zero_max_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions (glibc answers from cpuid, no allocation).
    let l3 = unsafe { libc::sysconf(libc::_SC_LEVEL3_CACHE_SIZE) };
    if l3 <= 0 {
        return 2 << 20;
    }
    (l3 as usize / 16).clamp(512 << 10, 8 << 20)
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
    // SAFETY: plain system calls on the calling thread (pid 0), with a valid parameter block.
    unsafe {
        if policy == BackgroundPolicy::Batch && libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 {
            return BackgroundPolicy::Batch;
        }
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, gettid() as libc::id_t, 19);
        }
    }
    BackgroundPolicy::Idle
}

/// Whether a CPU is idle right now, from the count of runnable threads in the whole system (the
/// fourth field of `/proc/loadavg`, which counts the reader too) against the CPUs online: an
/// `open`, `pread` and `close` (a few microseconds; no descriptor is kept, so none leaks into a
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

impl CpuLoad {
    /// `None` where the signal cannot be read or would not mean "a CPU of ours is idle".
    pub fn open() -> Option<CpuLoad> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
        // SAFETY: `set` is a plain bitmask the kernel fills; CPU_COUNT only reads it.
        let allowed = unsafe {
            let mut set: libc::cpu_set_t = core::mem::zeroed();
            if libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            libc::CPU_COUNT(&set) as u32
        };
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

/// Read up to `buf.len()` bytes of a small file into `buf` (no allocation); the length read.
fn read_small_file(path: &core::ffi::CStr, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: reads at most buf.len() bytes into `buf`.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    // SAFETY: the descriptor opened just above, used no more.
    unsafe { close(fd) };
    (n > 0).then_some(n as usize)
}

/// A decimal number (ASCII digits only).
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut v = 0u64;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(v)
}


/// A pidfd for this process (for `process_madvise`).
pub fn pidfd_self() -> OsResult<i32> {
    // SAFETY: plain system calls (getpid, pidfd_open) with no memory-safety preconditions.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as i32)
    }
}

/// `process_madvise(pidfd, iov, advice)`: bytes advised, or the errno.
///
/// # Safety
/// As `madvise`, for every range of `iov` when `pidfd` is this process: Linux 6.13 and later
/// accept destructive advice (`MADV_DONTNEED`, `MADV_FREE`) on oneself, which replaces the
/// contents of the ranges with zeros.
pub unsafe fn process_madvise(pidfd: i32, iov: &[libc::iovec], advice: i32) -> OsResult<usize> {
    // SAFETY: `iov` is a readable array of `iov.len()` iovecs; the ranges they name are the
    // caller's to advise (its contract).
    let r = unsafe {
        libc::syscall(libc::SYS_process_madvise, pidfd, iov.as_ptr(), iov.len(), advice, 0u32)
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Free the pages of `[off, off + len)` of a file, keeping its size (reads zero afterwards).
///
/// # Safety
/// `fd` is the caller's, and where the file is mapped, the pages of that part of it are the
/// caller's and nothing relies on their contents: through a mapping they read zero afterwards.
pub unsafe fn punch_hole(fd: i32, off: usize, len: usize) -> OsResult<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: the caller's contract: its own descriptor, and mapped pages nobody relies on.
    let r = unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Map `len` bytes of scratch memory (private anonymous, committed on touch); `unmap` it after.
pub fn scratch(len: usize) -> OsResult<usize> {
    reserve_aligned(len, PAGE_SIZE, None)
}

/// Sleep for `ns` nanoseconds.
pub fn sleep_ns(ns: u64) {
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: `ts` is a valid timespec; the remainder pointer may be null.
    unsafe { libc::nanosleep(&ts, ptr::null_mut()) };
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// The process for which `membarrier` was registered (0: none yet; -1: not available).
static MEMBARRIER_PID: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(0);

/// A full memory barrier on every running thread of this process (`membarrier(2)`, private
/// expedited): the heavy side of an asymmetric fence, whose light side is a compiler fence.
/// Registers the process first (again in a `fork` child). `false`: not available here.
pub fn membarrier() -> bool {
    use core::sync::atomic::Ordering::Relaxed;
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    let seen = MEMBARRIER_PID.load(Relaxed);
    if seen == -1 {
        return false;
    }
    if seen != pid {
        // SAFETY: plain system call with no memory-safety preconditions.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
        if r != 0 {
            MEMBARRIER_PID.store(-1, Relaxed);
            return false;
        }
        MEMBARRIER_PID.store(pid, Relaxed);
    }
    // SAFETY: plain system call with no memory-safety preconditions (a barrier on running threads).
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
}
