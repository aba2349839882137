//! Memory: reservations and mappings, advice, `mlock`, the memfd behind a `Backing::Memfd` arena,
//! and the page moves of the preload's `realloc`.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

use rustix::fd::{BorrowedFd, IntoRawFd};
use rustix::mm::{MapFlags, MremapFlags, ProtFlags};

use super::{os_result, OsResult, PAGE_SIZE};

/// The `madvise` advice fallow gives: Linux's own meanings (rustix's `Advice::DontNeed` is
/// POSIX's, which Linux ignores, so fallow names its four here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_DONTNEED`: the pages go back to the kernel now; private anonymous memory reads zero.
    DontNeed,
    /// `MADV_FREE`: the kernel may take the pages back whenever it likes, until written again.
    Free,
    /// `MADV_HUGEPAGE`: back the range with transparent huge pages where possible.
    HugePage,
    /// `MADV_POPULATE_WRITE` (Linux 5.14): fault the pages in for writing, contents kept.
    PopulateWrite,
}

impl Advice {
    fn rustix(self) -> rustix::mm::Advice {
        match self {
            Advice::DontNeed => rustix::mm::Advice::LinuxDontNeed,
            Advice::Free => rustix::mm::Advice::LinuxFree,
            Advice::HugePage => rustix::mm::Advice::LinuxHugepage,
            Advice::PopulateWrite => rustix::mm::Advice::LinuxPopulateWrite,
        }
    }

    /// The number the kernel knows it by (`process_madvise`, which rustix does not wrap).
    fn raw(self) -> libc::c_int {
        match self {
            Advice::DontNeed => libc::MADV_DONTNEED,
            Advice::Free => libc::MADV_FREE,
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::PopulateWrite => libc::MADV_POPULATE_WRITE,
        }
    }
}

/// Reserve `len` bytes of address space, aligned to `align` (a power of two), without committing
/// memory: `MAP_NORESERVE`, private anonymous, or shared over `fd` when one is given.
pub fn reserve_aligned(len: usize, align: usize, fd: Option<i32>) -> OsResult<usize> {
    debug_assert!(align.is_power_of_two() && len.is_multiple_of(PAGE_SIZE));
    let rw = ProtFlags::READ | ProtFlags::WRITE;
    if let Some(fd) = fd {
        // A shared file mapping cannot be over-reserved and trimmed (the offsets would shift), so
        // reserve an anonymous hole first and map the file over its aligned part.
        let hole = reserve_aligned(len, align, None)?;
        let flags = MapFlags::SHARED | MapFlags::NORESERVE | MapFlags::FIXED;
        // SAFETY: the descriptor is only handed to the kernel for this one call, which checks it
        // (a closed one fails with `EBADF`).
        let file = unsafe { BorrowedFd::borrow_raw(fd) };
        // SAFETY: `MAP_FIXED` over `hole`, a range of `len` bytes this call just reserved and nothing
        // else uses, so no live mapping is replaced.
        match unsafe { rustix::mm::mmap(hole as *mut c_void, len, rw, flags, file, 0) } {
            Ok(p) => return Ok(p as usize),
            Err(e) => {
                // SAFETY: `hole` is the reservation made just above, returned to nobody.
                unsafe { unmap(hole, len) };
                return Err(e.raw_os_error());
            }
        }
    }
    // mmap returns page-aligned addresses, so `align - PAGE_SIZE` bytes of slack always hold an
    // aligned start (none for a page alignment): less address space at the peak, which matters
    // under `RLIMIT_AS`.
    let span = len.checked_add(align - PAGE_SIZE).ok_or(libc::ENOMEM)?;
    let flags = MapFlags::PRIVATE | MapFlags::NORESERVE;
    // SAFETY: a fresh anonymous mapping at an address the kernel picks: no existing memory changes.
    let p = os_result(unsafe { rustix::mm::mmap_anonymous(ptr::null_mut(), span, rw, flags) })?;
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

/// Map `len` bytes of scratch memory (private anonymous, committed on touch); `unmap` it after.
pub fn scratch(len: usize) -> OsResult<usize> {
    reserve_aligned(len, PAGE_SIZE, None)
}

/// Unmap `[addr, addr + len)`.
///
/// # Safety
/// The range is one the caller mapped (or a part of it) and nothing references any more: after
/// the call an access to it faults, and a later mapping may reuse the addresses.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: the caller's contract: the range is the caller's own and no longer used. (`munmap`
    // fails only on a range that is not page-aligned or empty: nothing to undo then.)
    let _ = unsafe { rustix::mm::munmap(addr as *mut c_void, len) };
}

/// `madvise(addr, len, advice)`.
///
/// # Safety
/// Destructive advice (`DontNeed`, `Free`) replaces the contents of the range with zeros (now or
/// whenever the kernel likes): the caller owns the whole range and nothing relies on its
/// contents. Any advice: the range is mapped by the caller.
pub unsafe fn madvise(addr: usize, len: usize, advice: Advice) -> OsResult<()> {
    // SAFETY: the caller's contract: a range the caller owns, whose contents may change as
    // `advice` says.
    os_result(unsafe { rustix::mm::madvise(addr as *mut c_void, len, advice.rustix()) })
}

/// `process_madvise(pidfd, iov, advice)`: bytes advised, or the errno.
///
/// # Safety
/// As `madvise`, for every range of `iov` when `pidfd` is this process: Linux 6.13 and later
/// accept destructive advice (`DontNeed`, `Free`) on oneself, which replaces the contents of the
/// ranges with zeros.
pub unsafe fn process_madvise(pidfd: i32, iov: &[libc::iovec], advice: Advice) -> OsResult<usize> {
    // A raw system call: rustix has no `process_madvise`, and glibc's wrapper would require glibc
    // 2.36 of every system the library is loaded on.
    // SAFETY: `iov` is a readable array of `iov.len()` iovecs; the ranges they name are the
    // caller's to advise (its contract).
    let r = unsafe {
        libc::syscall(libc::SYS_process_madvise, pidfd, iov.as_ptr(), iov.len(), advice.raw(), 0u32)
    };
    if r < 0 {
        Err(super::errno())
    } else {
        Ok(r as usize)
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
    if unsafe { madvise(addr, len, Advice::PopulateWrite) }.is_ok() {
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

/// Pin `[addr, addr + len)` in memory.
pub fn mlock(addr: usize, len: usize) -> OsResult<()> {
    // SAFETY: `mlock` only pins pages in memory; it changes no contents, whatever the range.
    os_result(unsafe { rustix::mm::mlock(addr as *mut c_void, len) })
}

/// Unpin `[addr, addr + len)`.
pub fn munlock(addr: usize, len: usize) {
    // SAFETY: `munlock` only unpins pages; it changes no contents, whatever the range.
    let _ = unsafe { rustix::mm::munlock(addr as *mut c_void, len) };
}

/// Move the pages of `[from, from + len)` onto `[to, to + len)` with `mremap(MAYMOVE | FIXED |
/// DONTUNMAP)`: the page-table entries move, no byte is copied, and `from` stays mapped with no
/// pages behind it (it reads zero). `EINVAL` from a kernel without `MREMAP_DONTUNMAP` (before
/// 5.7, or 5.13 for shared mappings) or for a range over several mappings.
///
/// # Safety
/// Both ranges are page-aligned parts of private anonymous mappings the caller owns and nobody
/// else uses: the contents of `to` are replaced and those of `from` read zero afterwards.
pub unsafe fn move_pages(from: usize, to: usize, len: usize) -> OsResult<()> {
    let flags = MremapFlags::MAYMOVE | MremapFlags::DONTUNMAP;
    // SAFETY: the caller's contract: replacing `to`'s pages and emptying `from` is what it asked
    // for, and `MREMAP_FIXED` (which `mremap_fixed` adds) only ever lands on `to`, the caller's.
    let r = unsafe { rustix::mm::mremap_fixed(from as *mut c_void, len, len, flags, to as *mut c_void) };
    let p = os_result(r)?;
    debug_assert_eq!(p as usize, to);
    Ok(())
}

/// An anonymous file of `len` bytes (sparse: nothing is committed), close-on-exec.
pub fn memfd(len: usize) -> OsResult<i32> {
    let fd = os_result(rustix::fs::memfd_create(c"fallow", rustix::fs::MemfdFlags::CLOEXEC))?;
    // (On failure `fd`, an `OwnedFd`, is closed as it is dropped.)
    os_result(rustix::fs::ftruncate(&fd, len as u64))?;
    Ok(fd.into_raw_fd())
}

/// Close `fd`.
///
/// # Safety
/// The caller owns `fd` and uses it no more: a descriptor closed under another owner (a memfd
/// behind a mapping, a file) could be reused by an unrelated `open` and written through.
pub unsafe fn close(fd: i32) {
    // SAFETY: the caller's contract: its own descriptor, not used after this.
    unsafe { rustix::io::close(fd) };
}

/// Free the pages of `[off, off + len)` of a file, keeping its size (reads zero afterwards).
///
/// # Safety
/// `fd` is the caller's, and where the file is mapped, the pages of that part of it are the
/// caller's and nothing relies on their contents: through a mapping they read zero afterwards.
pub unsafe fn punch_hole(fd: i32, off: usize, len: usize) -> OsResult<()> {
    use rustix::fs::FallocateFlags;
    // SAFETY: the caller's contract: its own descriptor, open for the call.
    let file = unsafe { BorrowedFd::borrow_raw(fd) };
    let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    os_result(rustix::fs::fallocate(file, mode, off as u64, len as u64))
}

/// 0: not checked yet; 1: `MADV_DONTNEED` zeroes private anonymous memory; 2: it does not.
static DONTNEED_ZEROES: AtomicU8 = AtomicU8::new(0);

/// Whether `MADV_DONTNEED` really makes private anonymous memory read zero here (some emulators
/// get it wrong). Checked once per process on a scratch page.
pub fn dontneed_zeroes() -> bool {
    match DONTNEED_ZEROES.load(Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let ok = match scratch(PAGE_SIZE) {
        Err(_) => false,
        Ok(p) => {
            let offsets = [0usize, 1, 777, PAGE_SIZE - 1];
            for &o in &offsets {
                // SAFETY: `p` is a private scratch page of PAGE_SIZE bytes and `o < PAGE_SIZE`.
                unsafe { ((p + o) as *mut u8).write_volatile(0x5a) };
            }
            // SAFETY: the private scratch page mapped above, which only this function uses.
            let advised = unsafe { madvise(p, PAGE_SIZE, Advice::DontNeed) }.is_ok();
            // SAFETY: as above: inside the scratch page, still mapped.
            let zero = offsets.iter().all(|&o| unsafe { ((p + o) as *const u8).read_volatile() } == 0);
            // SAFETY: the scratch page, used no more.
            unsafe { unmap(p, PAGE_SIZE) };
            advised && zero
        }
    };
    DONTNEED_ZEROES.store(if ok { 1 } else { 2 }, Relaxed);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_aligned_aligns_and_dontneed_zeroes() {
        let align = 1 << 21;
        let p = reserve_aligned(4 * PAGE_SIZE, align, None).unwrap();
        assert_eq!(p % align, 0);
        // SAFETY: the private mapping made above, used by this test only.
        unsafe {
            (p as *mut u8).write_volatile(7);
            madvise(p, PAGE_SIZE, Advice::DontNeed).unwrap();
            assert_eq!((p as *const u8).read_volatile(), 0);
            unmap(p, 4 * PAGE_SIZE);
        }
    }

    #[test]
    fn memfd_mapping_and_punch_hole() {
        let len = 4 * PAGE_SIZE;
        let fd = memfd(len).unwrap();
        let p = reserve_aligned(len, PAGE_SIZE, Some(fd)).unwrap();
        // SAFETY: the shared mapping of the memfd made above, used by this test only.
        unsafe {
            (p as *mut u8).write_volatile(9);
            ((p + PAGE_SIZE) as *mut u8).write_volatile(9);
            punch_hole(fd, 0, PAGE_SIZE).unwrap();
            assert_eq!((p as *const u8).read_volatile(), 0);
            assert_eq!(((p + PAGE_SIZE) as *const u8).read_volatile(), 9);
            unmap(p, len);
            close(fd);
        }
    }

    #[test]
    fn move_pages_moves_and_leaves_zeros() {
        let len = 2 * PAGE_SIZE;
        let from = scratch(len).unwrap();
        let to = scratch(len).unwrap();
        // SAFETY: two private mappings made above, used by this test only.
        unsafe {
            (from as *mut u8).write_volatile(5);
            match move_pages(from, to, len) {
                Ok(()) => {
                    assert_eq!((to as *const u8).read_volatile(), 5);
                    assert_eq!((from as *const u8).read_volatile(), 0);
                }
                // A kernel without MREMAP_DONTUNMAP: nothing moved.
                Err(e) => {
                    assert_eq!(e, libc::EINVAL);
                    assert_eq!((from as *const u8).read_volatile(), 5);
                }
            }
            unmap(from, len);
            unmap(to, len);
        }
    }
}
