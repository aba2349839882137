//! The operating system: every system call fallow makes goes through this module, in three parts:
//! `memory` (mappings, advice, locking, the memfd), `sync` (futex, membarrier), `process`
//! (ids, threads, scheduling, limits, clocks), `tls` (the hot paths' per-thread words) and `pressure` (memory cgroup limits and usage, PSI
//! stall totals, `MemAvailable`).
//!
//! `rustix` makes the calls where it has them: inline system calls that neither allocate nor touch
//! the C `errno`. Paths go to it as `&CStr` (a `&str` or `Path` would be copied into an allocated
//! C string). `libc` remains for what rustix lacks or cannot do from inside `malloc`, each place
//! saying why, and for the C library's own state (`errno`, threads).
//!
//! Nothing here allocates from the heap, so it is safe to call from inside a preloaded `malloc`,
//! and nothing keeps state that a `fork` child could not use. Failures come back as
//! `Err(errno)`.

mod memory;
mod pagemap;
mod pressure;
mod process;
mod sync;
pub(crate) mod tls;

pub use self::memory::*;
pub use self::pagemap::*;
pub use self::pressure::*;
pub use self::process::*;
pub use self::sync::*;

pub const PAGE_SIZE: usize = 4096;
pub const PAGE_SHIFT: u32 = 12;
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

pub type OsResult<T> = Result<T, i32>;

/// A rustix result as an `OsResult`: the errno as a plain number.
#[inline]
fn os_result<T>(r: rustix::io::Result<T>) -> OsResult<T> {
    r.map_err(|e| e.raw_os_error())
}

/// The calling thread's C `errno`.
pub fn errno() -> i32 {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's lifetime.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(value: i32) {
    // SAFETY: as in `errno`: the calling thread's own errno slot.
    unsafe { *libc::__errno_location() = value }
}

/// Write a message to stderr without allocating. A failed or interrupted write drops the rest.
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: descriptor 2 is only handed to the kernel, which checks it: a closed stderr makes
    // the write fail with `EBADF`, and nothing else is done with the descriptor.
    let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(2) };
    let mut off = 0;
    while off < msg.len() {
        match rustix::io::write(fd, &msg[off..]) {
            Ok(n) if n > 0 => off += n,
            _ => return,
        }
    }
}

/// Read up to `buf.len()` bytes of a small file into `buf` with `open`, `read` and `close` (no
/// allocation, no descriptor kept); the length read, `None` when nothing could be read.
fn read_small_file(path: &core::ffi::CStr, buf: &mut [u8]) -> Option<usize> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    // (`fd` is an `OwnedFd`: dropped, hence closed, on return.)
    let n = rustix::io::read(&fd, &mut *buf).ok()?;
    (n > 0).then_some(n)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_decimal_takes_digits_only() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"12345"), Some(12345));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"12a"), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"99999999999999999999999"), None);
    }

    #[test]
    fn read_small_file_reads_and_reports_missing() {
        let mut buf = [0u8; 128];
        let n = read_small_file(c"/proc/self/statm", &mut buf).expect("statm readable");
        assert!(n > 0 && buf[..n].iter().any(|b| b.is_ascii_digit()));
        assert_eq!(read_small_file(c"/nonexistent/fallow", &mut buf), None);
    }

    #[test]
    fn errors_come_back_as_errno() {
        // An unaligned address: `EINVAL` from the kernel, through rustix, as a plain number.
        // SAFETY: the call fails on the unaligned address before touching any mapping.
        assert_eq!(unsafe { madvise(PAGE_SIZE + 1, PAGE_SIZE, Advice::DontNeed) }, Err(libc::EINVAL));
        assert_eq!(memfd(usize::MAX).err(), Some(libc::EINVAL));
    }
}
