//! Bad input: every misuse gets its own error naming the address, and the allocator keeps working.

mod common;

use common::*;
use fallow::{Config, Error, Flags};

fn still_works(a: &fallow::Allocator) {
    let p = a.alloc(3 * 4096, 4096, Flags::ZERO).unwrap();
    assert!(all_zero(p.as_ptr(), 3 * 4096));
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

#[test]
fn lock_refused_gives_block_back() {
    // As a non-root user RLIMIT_MEMLOCK is 8 MiB; as root mlock is free. Lower the limit for this
    // process's test thread group only if we are allowed to: RLIMIT is per process, so run it in a
    // child to keep the other tests unaffected.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let lim = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
        // Drop CAP_IPC_LOCK's effect: root ignores the limit, so only check what we can.
        let a = small();
        let r = a.alloc(4 << 20, 4096, Flags::LOCK);
        let ok = match r {
            Err(Error::Lock { .. }) => a.stats().bytes_in_use == 0 && a.check_invariants().is_ok(),
            Ok(p) => {
                let root = unsafe { libc::geteuid() } == 0;
                root && a.free(p.as_ptr()).is_ok() && a.stats().locked_bytes == 0
            }
            Err(_) => false,
        };
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
}

#[test]
fn exhaustion_is_an_error_not_a_crash() {
    // In a child whose address space is capped, a request past the cap fails with OutOfMemory
    // (ENOMEM), and the allocator serves smaller requests afterwards.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let a = small();
        let lim = libc::rlimit { rlim_cur: 3 << 30, rlim_max: 3 << 30 };
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
        let r = a.alloc(4 << 30, 4096, Flags::NONE);
        let ok = matches!(r, Err(e @ Error::OutOfMemory { .. }) if e.errno() == libc::ENOMEM)
            && a.alloc(1 << 20, 4096, Flags::ZERO).is_ok()
            && a.check_invariants().is_ok();
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
}
