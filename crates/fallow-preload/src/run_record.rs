//! The record `fallow run` reads: when `FALLOW_RUN_RECORD` names a file (`fallow run` sets it for
//! the program it starts; it is a channel between the two, not a setting), the process appends to
//! it a sample of fallow's free memory by state every `SAMPLE_MS`, and its final figures at exit.
//! Nothing happens without the variable: no thread, no file, no handler.
//!
//! One line per record, written with one `write` to the file opened `O_APPEND`, so the lines of
//! the processes sharing the file (the program's `fork` children, the programs it executes: they
//! inherit the variable) do not mix: `S pid t_ns key=value...` for a sample, `F pid t_ns
//! key=value...` at exit, both with the same figures; `t_ns` is `CLOCK_MONOTONIC`, which `fallow
//! run` reads too. Every value is a byte count or a count. Formatted on the stack: nothing here
//! calls `malloc`.
//!
//! When the library is loaded (the `.init_array` function of `lib.rs` calls `init`), never inside
//! a `malloc`, the path is copied and the exit handler registered. The sampler thread is started
//! by the thread that creates the allocator, right after it (`start_sampler`, through
//! `process::on_create`), as the allocator's own workers are (or at load time, if a library's
//! constructor made the allocator before this library was initialised): a process that never makes a large
//! request stays single-threaded (one that must, to `unshare` a namespace for instance, still
//! can). The sampler is a thread of this library's own: it sleeps between samples, with every
//! signal blocked (the program's signals go to the program's threads), and takes a snapshot of the
//! statistics (`Allocator::stats`, a short hold of the allocator's lock every `SAMPLE_MS`). The
//! program's threads never do any of this work. Each record opens the file, writes and closes it,
//! so a program that closes every descriptor it did not open (daemons do) can make a record go
//! astray only if it closes ours and opens another in the microseconds between our `open` and
//! our `close`. A `fork` child has no sampler (only the forking thread survives), but writes its
//! own final record. The final record comes from an `atexit` handler (`Allocator::try_stats`: an
//! `exit` from a signal handler that interrupted this thread inside the allocator finds the lock
//! held and leaves no final record rather than waiting for itself), so a program that ends by a
//! signal or `_exit` leaves only its samples.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use fallow::binding_support::{StackBuf, PAGE_SIZE};
use fallow::{Allocator, Stats};

use crate::process::{existing, threshold};

/// Milliseconds between two samples.
const SAMPLE_MS: u64 = 100;

/// The record file's path, NUL-terminated; written once by `init`, at load time.
struct Path(UnsafeCell<[u8; PATH_MAX]>);
// SAFETY: written only by `init`, which runs once, from the loader's `.init_array` call, before
// `ENABLED` is set (Release); read only after `ENABLED` is seen set (Acquire), never written again.
// (The allocator's workers may exist by then, if a library's constructor made it; they never
// read the path.)
unsafe impl Sync for Path {}

const PATH_MAX: usize = 4096;
static PATH: Path = Path(UnsafeCell::new([0; PATH_MAX]));
/// Whether `PATH` holds the record file's path.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// If `FALLOW_RUN_RECORD` names a file: keep its path and register the final record; whether it
/// does (then `start_sampler` is to run once the allocator exists). Called once, when the library
/// is loaded (single-threaded).
pub fn init() -> bool {
    // SAFETY: a NUL-terminated name; at load time no other thread can change the environment.
    let p = unsafe { libc::getenv(c"FALLOW_RUN_RECORD".as_ptr()) };
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` is the NUL-terminated string `getenv` returned, read during this call only.
    let given = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
    if given.is_empty() || given.len() >= PATH_MAX {
        return false;
    }
    // SAFETY: see `Path`: this is the one write, before `ENABLED` is set and before any thread.
    unsafe { (&mut *PATH.0.get())[..given.len()].copy_from_slice(given) };
    ENABLED.store(true, Ordering::Release);
    // SAFETY: an `extern "C"` function that lives as long as the library (never unloaded) and
    // formats on the stack.
    unsafe { libc::atexit(final_record) };
    true
}

/// Start the sampler thread, detached, with every signal blocked (a new thread inherits the mask
/// of its creator, whose mask is restored right after). Run once (`process::on_create`): by the
/// thread that created the allocator, or at load time if the allocator came first.
pub fn start_sampler() {
    // SAFETY: plain-data structures initialised by their own libc calls before any other use; the
    // creating thread's signal mask is saved (also into `CREATOR_MASK`, which this function alone
    // writes, once: `process::on_create` runs it once) and restored around `pthread_create`; `sampler` is
    // an `extern "C"` function that lives as long as the library and ignores its argument.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return;
        }
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 << 10);
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        // Before the thread exists: the thread reads it only after its creation.
        (*CREATOR_MASK.0.get()).write(old);
        let mut t: libc::pthread_t = 0;
        if libc::pthread_create(&mut t, &attr, sampler, core::ptr::null_mut()) == 0 {
            libc::pthread_setname_np(t, c"fallow-sample".as_ptr());
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
    }
}

/// The signal mask of the thread that started the sampler, which the sampler takes back before
/// it ends with the program: the last thread to end runs the program's exit handlers.
struct Mask(core::cell::UnsafeCell<core::mem::MaybeUninit<libc::sigset_t>>);
// SAFETY: written once by `start_sampler` before it creates the one thread that reads it.
unsafe impl Sync for Mask {}
static CREATOR_MASK: Mask = Mask(core::cell::UnsafeCell::new(core::mem::MaybeUninit::uninit()));

extern "C" fn sampler(_: *mut c_void) -> *mut c_void {
    // One of fallow's threads, which ends once the program has no thread left: it must not
    // keep the process alive (the core's `worker/exit_watch.rs`).
    let _own = fallow::binding_support::OwnThread::helper();
    let nap = libc::timespec { tv_sec: 0, tv_nsec: (SAMPLE_MS * 1_000_000) as libc::c_long };
    loop {
        // SAFETY: `nap` is a valid timespec; the remainder is not wanted.
        unsafe { libc::nanosleep(&nap, core::ptr::null_mut()) };
        if fallow::binding_support::program_gone() {
            // SAFETY: written by `start_sampler` before this thread was created; a valid mask.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, (*CREATOR_MASK.0.get()).as_ptr(), core::ptr::null_mut()) };
            return core::ptr::null_mut();
        }
        if let Some(a) = existing() {
            write_record(b'S', a, a.stats());
        }
    }
}

extern "C" fn final_record() {
    if let Some(a) = existing() {
        if let Some(s) = a.try_stats() {
            write_record(b'F', a, s);
        }
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process's resident bytes (`/proc/thread-self/statm`, second field: `/proc/self`'s reads
/// zeros once the first thread has ended), 0 if it cannot be read.
fn rss_bytes() -> u64 {
    let mut buf = [0u8; 128];
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c"/proc/thread-self/statm".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return 0;
    }
    // SAFETY: `buf` is writable for its length; `fd` was opened above and is closed once.
    let n = unsafe {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return 0;
    }
    let text = &buf[..n as usize];
    let mut fields = text.split(|&c| c == b' ');
    let _size = fields.next();
    let resident = fields.next().unwrap_or(b"0");
    let digits = resident.iter().take_while(|c| c.is_ascii_digit());
    let pages = digits.fold(0u64, |v, &c| v * 10 + (c - b'0') as u64);
    pages * PAGE_SIZE as u64
}

fn write_record(kind: u8, a: &Allocator, s: Stats) {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let page = PAGE_SIZE as u64;
    let mut b = StackBuf::<1024>::new();
    let _ = write!(
        b,
        "{} {} {} rss={} free_dirty={} free_zeroed={} free_reported={} free_lazy={} cached={} in_use={} \
         reserved={}",
        kind as char,
        fallow::binding_support::getpid(),
        now_ns(),
        rss_bytes(),
        s.free_dirty_pages * page,
        s.free_zeroed_pages * page,
        s.free_reported_pages * page,
        s.free_lazy_pages * page,
        s.cached_pages * page,
        s.bytes_in_use,
        s.reserved_bytes,
    );
    let _ = write!(
        b,
        " threshold={} max_block={} alloc_calls={} free_calls={} zero_skipped={} zeroed_on_alloc={} \
         reused_reported={} reported={} report_calls={} zeroed_background={} zeroing_wasted={} cache_hits={}",
        threshold(),
        a.max_block(),
        s.alloc_calls,
        s.free_calls,
        s.zero_skipped_bytes,
        s.zeroed_on_alloc_bytes,
        s.reused_reported_bytes,
        s.reported_bytes,
        s.report_calls,
        s.zeroed_background_bytes,
        s.zeroing_wasted_bytes,
        s.cache_hits,
    );
    let _ = write!(
        b,
        " small_live={} small_live_bytes={} small_spans={} small_span_bytes={} small_free={}",
        s.small_live_objects, s.small_live_bytes, s.small_spans, s.small_span_bytes, s.small_free_bytes,
    );
    let _ = writeln!(b);
    let bytes = b.as_bytes();
    // SAFETY: `PATH` is NUL-terminated and no longer written (`ENABLED` was seen set); `bytes` is
    // readable for its length; the descriptor is this call's own, closed once. A failed open or a
    // short write loses this record only.
    unsafe {
        let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC;
        let fd = libc::open((&*PATH.0.get()).as_ptr().cast(), flags);
        if fd >= 0 {
            libc::write(fd, bytes.as_ptr().cast(), bytes.len());
            libc::close(fd);
        }
    }
}
