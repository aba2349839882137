//! `/proc/thread-self/pagemap`: what the kernel holds for each page of this process's private
//! anonymous memory (through the calling thread: `/proc/self`'s memory files read nothing once
//! the process's first thread has ended). The zeroing worker reads it before zeroing a free chunk, and a large `ZERO` request
//! before its memset, so that they write only the pages the program wrote: a page never touched,
//! or only read (the kernel's shared zero page), reads zero already, and a store would make it
//! resident for nothing.
//!
//! An entry is 64 bits (Documentation/admin-guide/mm/pagemap.rst): bit 63 present, 62 swapped,
//! 61 file page or shared anonymous, 56 mapped exclusively; the frame number (bits 0-54) needs
//! `CAP_SYS_ADMIN` and is not used. Measured on this kernel: a page never touched is not present;
//! a page only read is present and not exclusive (the zero page is mapped everywhere), and in a
//! `MADV_HUGEPAGE` range also a file page (the huge zero page: numpy advises its large arrays so);
//! a written page is present and exclusive; a written page shared with a `fork` child is present
//! and not exclusive until one side writes it or the child leaves.

use rustix::fd::{AsFd, OwnedFd};

use super::PAGE_SIZE;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const FILE_OR_SHARED: u64 = 1 << 61;
const EXCLUSIVE: u64 = 1 << 56;

/// What a page of private anonymous memory holds, as far as the kernel says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageUse {
    /// Data the program may have written: a page of its own (present and mapped only here), a
    /// swapped-out page, or anything the entry does not make clear.
    Written,
    /// Nothing behind it: it reads zero and costs no memory.
    Absent,
    /// Present but not this process's alone: the shared zero page (only read), or a page shared
    /// with a `fork` child. Not known to read zero; `MADV_DONTNEED` makes it `Absent` and frees
    /// nothing the process holds alone.
    Shared,
}

/// The use that pagemap entry `e` of private anonymous memory says. A present page not mapped
/// here alone is `Shared` whatever its file bit: the huge zero page shows as a file page.
fn page_use(e: u64) -> PageUse {
    if e & SWAPPED != 0 {
        PageUse::Written
    } else if e & PRESENT == 0 {
        if e & FILE_OR_SHARED != 0 {
            PageUse::Written
        } else {
            PageUse::Absent
        }
    } else if e & EXCLUSIVE == 0 {
        PageUse::Shared
    } else {
        PageUse::Written
    }
}

/// An open `/proc/thread-self/pagemap`. Opened by the thread that reads it, after any `fork`: the file
/// describes the process that opened it.
pub struct Pagemap(OwnedFd);

impl Pagemap {
    /// `None` where the file cannot be read (no procfs, a sandbox).
    pub fn open() -> Option<Pagemap> {
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        rustix::fs::open(c"/proc/thread-self/pagemap", flags, rustix::fs::Mode::empty()).ok().map(Pagemap)
    }

    /// The entries of the `out.len()` pages from `addr` (page-aligned); false if the read failed
    /// or came short.
    pub fn read(&self, addr: usize, out: &mut [u64]) -> bool {
        let offset = (addr / PAGE_SIZE * 8) as u64;
        // SAFETY: `out` is a valid `[u64]`; its bytes are viewed as `u8` (every bit pattern is a
        // valid `u64`, and `u8` has no alignment), for the call only.
        let bytes = unsafe { core::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, out.len() * 8) };
        let want = bytes.len();
        matches!(rustix::io::pread(self.0.as_fd(), bytes, offset), Ok(n) if n == want)
    }
}

/// What a page of free memory needs before it can be handed out zeroed (`for_each_clearing_run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clearing {
    /// Written, or not known not to be: it needs zeros stored.
    Store,
    /// Nothing behind it: it reads zero as it is.
    Absent,
    /// Present, not this process's alone, and reading zero: the shared zero page (only read), or
    /// a zero page shared with a `fork` child. It reads zero as it is; `MADV_DONTNEED` drops it.
    SharedZero,
}

/// Pagemap entries read at a time (4 KiB of them).
const BATCH: usize = 512;

/// Call `f(first, pages, clearing)` for the maximal runs, in order, of the `n` pages from `addr`
/// (page-aligned) that need the same clearing, as `pm` tells them (every page `Store` where it
/// cannot be read, or where `pm` is `None`). A present page not mapped here alone is read.
///
/// # Safety
/// The pages are mapped, private anonymous memory of the caller's that nobody writes during the
/// call.
pub unsafe fn for_each_clearing_run(pm: Option<&Pagemap>, addr: usize, n: usize, mut f: impl FnMut(usize, usize, Clearing)) {
    let Some(pm) = pm else { return f(addr, n, Clearing::Store) };
    let mut entries = [0u64; BATCH];
    let mut kinds = [Clearing::Store; BATCH];
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(BATCH);
        let at = addr + done * PAGE_SIZE;
        let known = pm.read(at, &mut entries[..batch]);
        for (k, c) in kinds[..batch].iter_mut().enumerate() {
            *c = match page_use(entries[k]) {
                _ if !known => Clearing::Store,
                PageUse::Absent => Clearing::Absent,
                // SAFETY: the caller's contract: a mapped page nobody writes meanwhile (present:
                // reading it faults nothing in).
                PageUse::Shared if unsafe { reads_zero(at + k * PAGE_SIZE) } => Clearing::SharedZero,
                _ => Clearing::Store,
            };
        }
        let mut i = 0;
        while i < batch {
            let mut j = i + 1;
            while j < batch && kinds[j] == kinds[i] {
                j += 1;
            }
            f(at + i * PAGE_SIZE, j - i, kinds[i]);
            i = j;
        }
        done += batch;
    }
}

/// Whether the page at `page` reads zero.
///
/// # Safety
/// `page` is a page-aligned, mapped page that nobody writes during the call.
unsafe fn reads_zero(page: usize) -> bool {
    // SAFETY: the caller's contract; a page is 4096-byte aligned, so aligned for `u64`.
    let words = unsafe { core::slice::from_raw_parts(page as *const u64, PAGE_SIZE / 8) };
    words.iter().fold(0, |acc, &w| acc | w) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{madvise, reserve_aligned, unmap, Advice};

    #[test]
    fn tells_written_pages_from_absent_and_zero_pages() {
        let Some(pm) = Pagemap::open() else { return };
        let p = reserve_aligned(4 * PAGE_SIZE, PAGE_SIZE, None).unwrap();
        // SAFETY: the private mapping made above, used by this test only.
        unsafe {
            let _ = ((p + PAGE_SIZE) as *const u8).read_volatile();
            ((p + 2 * PAGE_SIZE) as *mut u8).write_volatile(1);
            ((p + 3 * PAGE_SIZE) as *mut u8).write_volatile(1);
            madvise(p + 3 * PAGE_SIZE, PAGE_SIZE, Advice::DontNeed).unwrap();
        }
        let mut e = [0u64; 4];
        assert!(pm.read(p, &mut e));
        let uses: Vec<PageUse> = e.iter().map(|&x| page_use(x)).collect();
        assert_eq!(uses, [PageUse::Absent, PageUse::Shared, PageUse::Written, PageUse::Absent]);
        // SAFETY: the mapping made above, used no more.
        unsafe { unmap(p, 4 * PAGE_SIZE) };
    }

    #[test]
    fn the_huge_zero_page_reads_as_shared() {
        let Some(pm) = Pagemap::open() else { return };
        let huge = 2 << 20;
        let p = reserve_aligned(huge, huge, None).unwrap();
        // SAFETY: the private mapping made above, used by this test only.
        let advised = unsafe { madvise(p, huge, Advice::HugePage) }.is_ok();
        // SAFETY: as above.
        let _ = unsafe { (p as *const u8).read_volatile() };
        let mut e = [0u64; 1];
        assert!(pm.read(p, &mut e));
        // With or without the huge zero page (THP may be off): a page only read is not written.
        assert_eq!(page_use(e[0]), PageUse::Shared, "advised {advised}: {:#x}", e[0]);
        // SAFETY: the mapping made above, used no more.
        unsafe { unmap(p, huge) };
    }

    #[test]
    fn anything_unclear_counts_as_written() {
        assert_eq!(page_use(PRESENT | SWAPPED), PageUse::Written);
        assert_eq!(page_use(SWAPPED), PageUse::Written);
        assert_eq!(page_use(FILE_OR_SHARED), PageUse::Written);
        assert_eq!(page_use(PRESENT | FILE_OR_SHARED), PageUse::Shared);
        assert_eq!(page_use(PRESENT | FILE_OR_SHARED | EXCLUSIVE), PageUse::Written);
        assert_eq!(page_use(PRESENT | EXCLUSIVE), PageUse::Written);
        assert_eq!(page_use(0), PageUse::Absent);
        assert_eq!(page_use(PRESENT), PageUse::Shared);
    }
}
