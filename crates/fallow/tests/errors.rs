//! Bad input: every misuse gets its own error naming the address, and the allocator keeps working.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use fallow::{Config, Error, Flags};

fn still_works(a: &fallow::Allocator) {
    let p = a.alloc(3 * 4096, 4096, Flags::ZERO).unwrap();
    // SAFETY: `p` is a live block of three pages from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(p.as_ptr(), 3 * 4096) });
    a.free(p.as_ptr()).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn invalid_pointers() {
    let a = small();
    let outside = 0x1000usize;
    assert_eq!(a.free(outside as *mut u8), Err(Error::InvalidPointer { addr: outside }));
    let stack = 5u64;
    let sp = &stack as *const u64 as usize;
    assert_eq!(a.free(sp as *mut u8), Err(Error::InvalidPointer { addr: sp }));
    // Inside the arena, never allocated.
    let p = a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr() as usize;
    let never = p + (8 << 20);
    assert!(a.owns(never as *const u8));
    assert_eq!(a.free(never as *mut u8), Err(Error::InvalidPointer { addr: never }));
    // Unaligned address inside a live block, and an interior page.
    let big = a.alloc(10 * 4096, 4096, Flags::NONE).unwrap().as_ptr() as usize;
    assert_eq!(a.free((big + 8) as *mut u8), Err(Error::InteriorPointer { addr: big + 8, block: big }));
    assert_eq!(
        a.free((big + 5 * 4096) as *mut u8),
        Err(Error::InteriorPointer { addr: big + 5 * 4096, block: big })
    );
    assert!(Error::InvalidPointer { addr: never }.to_string().contains(&format!("{never:#x}")));
    assert_eq!(a.usable_size((big + 4096) as *const u8), None);
    a.free(big as *mut u8).unwrap();
    a.free(p as *mut u8).unwrap();
    still_works(&a);
}

#[test]
fn double_free() {
    let a = small();
    let p = a.alloc(5 * 4096, 4096, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    let e = a.free(p).unwrap_err();
    assert_eq!(e, Error::DoubleFree { addr: p as usize });
    assert!(e.to_string().contains(&format!("{:#x}", p as usize)));
    assert_eq!(a.stats().free_calls, 1);
    still_works(&a);
}

#[test]
fn bad_sizes_and_alignments() {
    let a = small();
    // With this thread's cache set up and holding a 4 KiB block, so that the hit path sees them.
    a.free(a.alloc(4096, 4096, Flags::NONE).unwrap().as_ptr()).unwrap();
    assert_eq!(a.alloc(0, 8, Flags::NONE), Err(Error::ZeroSize));
    assert!(matches!(a.alloc(4096, 3, Flags::NONE), Err(Error::BadAlignment { align: 3, .. })));
    assert!(matches!(a.alloc(4096, 0, Flags::NONE), Err(Error::BadAlignment { .. })));
    assert!(matches!(a.alloc(4096, 2 << 20, Flags::NONE), Err(Error::BadAlignment { .. })));
    assert!(matches!(a.alloc(usize::MAX, 8, Flags::NONE), Err(Error::TooLarge { .. })));
    assert!(matches!(a.alloc(usize::MAX / 2, 8, Flags::NONE), Err(Error::TooLarge { .. })));
    assert!(matches!(a.alloc(1usize << 46, 8, Flags::NONE), Err(Error::TooLarge { .. })));
    let p = a.alloc(4096, 4096, Flags::NONE).unwrap();
    assert_eq!(
        a.free_sized(p.as_ptr(), 3 * 4096),
        Err(Error::SizeMismatch { addr: p.as_ptr() as usize, given: 3 * 4096, actual: 4096 })
    );
    a.free_sized(p.as_ptr(), 4096).unwrap();
    still_works(&a);
}

#[test]
fn bad_config() {
    let e = fallow::Allocator::new(Config { max_order: 31, ..Config::default() }).err().unwrap();
    assert!(e.to_string().contains("max_order"), "{e}");
    let e = fallow::Allocator::new(Config { max_order: 4, thp: true, ..Config::default() }).err().unwrap();
    assert!(e.to_string().contains("max_order"), "{e}");
}

/// `capget`/`capset` structures (linux/capability.h, version 3: two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;
const CAP_IPC_LOCK: u32 = 14;

fn capabilities() -> Option<[CapData; 2]> {
    let mut h = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let mut d = [CapData::default(); 2];
    // SAFETY: `h` and `d` are live, writable, of the layout `capget` v3 expects (a header and two data words).
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut CapHeader, d.as_mut_ptr()) };
    (r == 0).then_some(d)
}

/// Drop `CAP_IPC_LOCK` (which lets root ignore `RLIMIT_MEMLOCK`) from the calling thread's
/// effective, permitted and inheritable sets (dropping a capability needs no privilege), and
/// check that it is gone.
fn drop_cap_ipc_lock() -> bool {
    let Some(mut d) = capabilities() else { return false };
    for set in [&mut d[0].effective, &mut d[0].permitted, &mut d[0].inheritable] {
        *set &= !(1 << CAP_IPC_LOCK);
    }
    let h = CapHeader { version: CAP_VERSION_3, pid: 0 };
    // SAFETY: `h` and `d` are live and of the layout `capset` v3 reads (a header and two data words).
    if unsafe { libc::syscall(libc::SYS_capset, &h as *const CapHeader, d.as_ptr()) } != 0 {
        return false;
    }
    capabilities().is_some_and(|d| d[0].effective & (1 << CAP_IPC_LOCK) == 0)
}

#[test]
fn lock_refused_gives_block_back() {
    // The refusal must really happen, as root too (where CAP_IPC_LOCK lets `mlock` ignore
    // RLIMIT_MEMLOCK): in a child (limits and capabilities are per process and per thread), lower
    // RLIMIT_MEMLOCK to 64 KiB and drop CAP_IPC_LOCK, check that `mlock` past the limit now fails,
    // then ask for a LOCK block of 4 MiB.
    const LIMIT: usize = 64 << 10;
    in_child(|| {
        let lim = libc::rlimit { rlim_cur: LIMIT as u64, rlim_max: LIMIT as u64 };
        // SAFETY: `lim` is a valid rlimit; the limit applies to this forked child only.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
            return Err("setrlimit(RLIMIT_MEMLOCK) failed".into());
        }
        if !drop_cap_ipc_lock() {
            return Err("could not drop CAP_IPC_LOCK".into());
        }
        // The precondition, checked on memory of our own: mlock past the limit is refused.
        let len = 1 << 20;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh private anonymous mapping, which aliases nothing; the result is checked below.
        let scratch = unsafe { libc::mmap(core::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(scratch, libc::MAP_FAILED);
        // SAFETY: `scratch` is the `len`-byte mapping just created (not `MAP_FAILED`, asserted above).
        let refused = unsafe { libc::mlock(scratch, len) } != 0;
        // SAFETY: `scratch` is that mapping of `len` bytes, which nothing refers to after this.
        unsafe { libc::munmap(scratch, len) };
        if !refused {
            return Err("mlock past RLIMIT_MEMLOCK still succeeds: the refusal cannot be reached here".into());
        }
        let a = small();
        let size = 4 << 20;
        match a.alloc(size, 4096, Flags::LOCK | Flags::ZERO) {
            Err(e @ Error::Lock { size: s, errno }) if s == size && (errno == libc::ENOMEM || errno == libc::EPERM) => {
                if !e.to_string().contains("RLIMIT_MEMLOCK") {
                    return Err(format!("Error::Lock does not name the limit: {e}"));
                }
            }
            other => return Err(format!("a LOCK request past the limit: {other:?}, expected Error::Lock of {size} bytes")),
        }
        // Nothing leaked: no live block, nothing counted locked, every reserved page free.
        let s = a.stats();
        if s.bytes_in_use != 0 || s.live_blocks != 0 || s.locked_bytes != 0 || s.alloc_calls != s.free_calls {
            return Err(format!("the refused block is still live or counted locked:\n{s}"));
        }
        if s.free_pages() * 4096 != s.reserved_bytes {
            return Err(format!("the refused block did not go back to the free lists:\n{s}"));
        }
        a.check_invariants()?;
        // Within the limit LOCK still works, and is counted until the free.
        let p = a.alloc(4 * 4096, 4096, Flags::LOCK).map_err(|e| format!("a LOCK request within the limit: {e}"))?.as_ptr();
        if a.stats().locked_bytes != 4 * 4096 {
            return Err(format!("a LOCK block within the limit is not counted locked: {}", a.stats().locked_bytes));
        }
        a.free(p).unwrap();
        let s = a.stats();
        if s.locked_bytes != 0 || s.bytes_in_use != 0 {
            return Err(format!("freeing a locked block left it counted:\n{s}"));
        }
        a.check_invariants()
    });
}

#[test]
fn exhaustion_is_an_error_not_a_crash() {
    // In a child whose address space is capped, a request past the cap fails with OutOfMemory
    // (ENOMEM), and the allocator serves smaller requests afterwards.
    // SAFETY: the child uses only its own allocator `a` (created after the fork, on its one thread) and
    // leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let a = small();
        let lim = libc::rlimit { rlim_cur: 3 << 30, rlim_max: 3 << 30 };
        // SAFETY: `lim` is a valid rlimit; the limit applies to this forked child only.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
        let r = a.alloc(4 << 30, 4096, Flags::NONE);
        let ok = matches!(r, Err(e @ Error::OutOfMemory { .. }) if e.errno() == libc::ENOMEM)
            && a.alloc(1 << 20, 4096, Flags::ZERO).is_ok()
            && a.check_invariants().is_ok();
        // SAFETY: leaves the child at once, without running the parent's test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: `pid` is the child forked above, not yet waited for; `status` is writable.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
}
