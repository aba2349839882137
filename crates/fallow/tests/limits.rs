//! Address-space limits (`RLIMIT_AS`): an allocator with the default configuration is created
//! under a limit far below the machine's RAM, serves what fits, and answers a request beyond the
//! limit with `Error::OutOfMemory` naming the reservation it tried.
//!
//! Each case runs in a forked child, which sets the limit on itself; the child reports what went
//! wrong on stderr and through its exit status.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::os::mapped_bytes as mapped;
use fallow::{Allocator, Config, Error, Flags};

const GIB: usize = 1 << 30;

/// Run `f` in a child whose `RLIMIT_AS` leaves `room` bytes beyond what is mapped now.
fn in_child_with_room(room: usize, f: fn() -> Result<(), String>) {
    // SAFETY: the child only runs `f` (which allocates through glibc's fork-safe malloc) and
    // leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let lim = (mapped() + room) as libc::rlim_t;
        let r = libc::rlimit { rlim_cur: lim, rlim_max: lim };
        // SAFETY: `r` is a valid rlimit.
        let code = if unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) } != 0 {
            eprintln!("setrlimit failed");
            2
        } else {
            match f() {
                Ok(()) => 0,
                Err(why) => {
                    eprintln!("limits child: {why}");
                    1
                }
            }
        };
        // SAFETY: leaves the child without running the parent's test harness.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
}

/// Beyond the limit: `OutOfMemory`, errno ENOMEM, and a message naming the request and the
/// reservation tried (at least the request); the allocator keeps working.
fn refused_beyond_limit(a: &Allocator, size: usize) -> Result<(), String> {
    match a.alloc(size, 4096, Flags::NONE) {
        Err(e @ Error::OutOfMemory { size: s, tried, errno }) => {
            let msg = e.to_string();
            if s < size || tried < size || errno != libc::ENOMEM || e.errno() != libc::ENOMEM {
                return Err(format!("{e:?}"));
            }
            if !msg.contains(&format!("request of {s} bytes")) || !msg.contains(&format!("reserving {tried} bytes")) {
                return Err(format!("message names neither the request nor the reservation: {msg}"));
            }
        }
        r => return Err(format!("{size} bytes beyond the limit: {r:?}")),
    }
    let p = a.alloc(1 << 20, 4096, Flags::ZERO).map_err(|e| format!("1 MiB after the refusal: {e}"))?;
    a.free(p.as_ptr()).map_err(|e| e.to_string())?;
    a.check_invariants()
}

#[test]
fn default_config_fits_three_gib_of_room() {
    in_child_with_room(3 * GIB, || {
        let a = Allocator::new(Config::default()).map_err(|e| format!("creation: {e}"))?;
        if a.max_block() != GIB {
            return Err(format!("largest block {} with 3 GiB of room", a.max_block()));
        }
        let small = a.alloc(100_000, 4096, Flags::ZERO).map_err(|e| format!("small: {e}"))?;
        // A large block inside the limit, touched.
        let big = a.alloc(512 << 20, 4096, Flags::NONE).map_err(|e| format!("512 MiB: {e}"))?;
        // SAFETY: `big` is a live block of 512 MiB.
        unsafe { big.as_ptr().add((512 << 20) - 1).write(1) };
        refused_beyond_limit(&a, 4 * GIB)?;
        a.free(big.as_ptr()).map_err(|e| e.to_string())?;
        a.free(small.as_ptr()).map_err(|e| e.to_string())?;
        Ok(())
    });
}

#[test]
fn tight_limit_gets_smaller_blocks_not_a_failure() {
    // One 1 GiB block needs 2 GiB at its peak (the alignment slack): with 1 GiB of room the
    // allocator is created with smaller blocks.
    in_child_with_room(GIB, || {
        let a = Allocator::new(Config::default()).map_err(|e| format!("creation: {e}"))?;
        let max = a.max_block();
        if !(2 << 20..GIB).contains(&max) || a.config().max_order != max.trailing_zeros() as u8 - 12 {
            return Err(format!("largest block {max} with 1 GiB of room"));
        }
        let p = a.alloc(max, max, Flags::ZERO).map_err(|e| format!("one largest block: {e}"))?;
        refused_beyond_limit(&a, 2 * GIB)?;
        a.free(p.as_ptr()).map_err(|e| e.to_string())?;
        Ok(())
    });
}

#[test]
fn no_limit_no_change() {
    // Without a limit the configuration is kept as given.
    let a = Allocator::new(Config { arena_size: 64 << 20, max_order: 10, ..Config::default() }).unwrap();
    assert_eq!(a.max_block(), 4 << 20);
    assert_eq!(a.stats().reserved_bytes, 64 << 20);
}
