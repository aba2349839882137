//! The process-wide state of the preload library: the settings from the environment and the one
//! fallow allocator, both created lazily, the `fork` handlers and the statistics at exit.
//!
//! Two small state machines, each one atomic byte:
//! - settings: `UNPARSED -> PARSING -> PARSED`. Parsing calls only `getenv` and `write`, never
//!   `malloc`, so a thread that finds `PARSING` spins until `PARSED` (nanoseconds). Until the
//!   settings are parsed `OUT_OF_LINE_FROM` is 0, which sends every request to the slow path
//!   that parses them; afterwards it holds the smallest request that may be fallow's
//!   (`hot_floor` of the threshold), and `THRESHOLD` the threshold.
//! - allocator: a `fallow::binding_support::LazyAllocator`, the start-up `FallowAlloc` uses too:
//!   a `StartGate`, `UNINIT -> creating (by thread tid) -> READY | FAILED` in one 32-bit word,
//!   entered on the first request at or above the threshold, and the slot it guards. This file
//!   gives it what is the preload's own: the configuration from the settings (`create`) and
//!   what happens around publication (`publish`: the exit handler, the fork guard). Not a
//!   `FallowAlloc` static: its threshold and configuration are constants of the program, while
//!   the preload's come from the environment on the first request, and its other side is Rust's
//!   `System`, while the preload's is glibc's `__libc_*` with C's semantics (`entry.rs`).
//!   Creating the allocator allocates (its `Arc`, through glibc) and may register an `atexit`
//!   handler, which may call `malloc`: those requests, made by the creating thread itself, go to
//!   glibc. Any other thread that makes a large request meanwhile waits for the
//!   creation (a short spin, then a futex sleep on the word) and is served by fallow: large
//!   requests racing at program start all get fallow memory. Requests that do go to glibc are
//!   always handled correctly later, because ownership is decided by address
//!   (`Allocator::owns`), never by who was asked.
//!
//! A `fork` by another thread while the allocator is being created leaves the child with a
//! creator that does not exist there: the gate sees that (the creator's tid is not a thread of
//! the child) and the child creates its own allocator. The fork handlers are therefore
//! registered when the library is loaded (`.init_array`), before any thread exists, and do
//! nothing until the allocator does: registered at creation, a `fork` between the registration
//! and the flag that says so could leave a child with the handlers missing or twice.
//!
//! Small objects (`FALLOW_SMALL=1`, `Config::small_objects`): decided once, when the settings
//! are parsed. `OUT_OF_LINE_FROM` then stays 0 for good, so that every request leaves the pass-through
//! for its out-of-line half (`entry.rs`), and `SMALL_ON` says so; the allocator, once published,
//! is also stored in `SMALL`, which those halves load (`malloc`'s after a pop from the thread's
//! heap, `Allocator::malloc_hot_sole`, which needs none) and, when it is set, call
//! `Allocator::malloc` with nothing else asked; `free` then switches to its own path, which
//! loads `SMALL` only past its hot path (`free.rs`: its first free in the span of the arenas
//! that finds `SMALL` set switches it). Until it is set (no allocator yet,
//! or this thread is creating it) they take the same lazy path as large requests, and the
//! creating thread's own requests go to glibc as before: ownership is still decided by address.
//!
//! Fork: prepare takes the fork guard, then the allocator lock if the allocator exists
//! (`before_fork`), so that no other thread is inside the allocator when the address space is
//! copied; the parent releases it, the child resets it and restarts the background workers
//! (`after_fork_child`). The creating thread publishes the allocator under the same guard, so
//! the allocator's existence cannot change between prepare and the handlers after the fork.

use core::cell::UnsafeCell;
use core::fmt::Write;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use fallow::binding_support::env::{self, EnvSettings};
use fallow::binding_support::{LazyAllocator, RawLock, StackBuf};
use fallow::{Allocator, Config};

const UNPARSED: u8 = 0;
const PARSING: u8 = 1;
const PARSED: u8 = 2;

struct Slot<T>(UnsafeCell<MaybeUninit<T>>);
// SAFETY: the `Slot` is written once, by the one thread that won its state machine
// (`SETTINGS_STATE` PARSING), before a Release store that readers Acquire before they take a
// shared `&T`; after that it is only read. It holds `EnvSettings` (plain data, no interior
// mutability), so shared references across threads are fine.
unsafe impl<T> Sync for Slot<T> {}

static SETTINGS_STATE: AtomicU8 = AtomicU8::new(UNPARSED);
static SETTINGS: Slot<EnvSettings> = Slot(UnsafeCell::new(MaybeUninit::uninit()));
/// Requests of at least this many bytes go to fallow; 0 until the settings are parsed.
static THRESHOLD: AtomicUsize = AtomicUsize::new(0);
/// Requests of at least this many bytes leave the pass-through for `entry.rs`'s out-of-line
/// half: `hot_floor` of the threshold, below which nothing of fallow's may serve them; 0 until
/// the settings are parsed, and for good with small objects on. Read by `known_out_of_line_from`,
/// or on x86-64 by `entry::leaves_pass_through`'s compare itself.
pub(crate) static OUT_OF_LINE_FROM: AtomicUsize = AtomicUsize::new(0);
/// The largest block fallow serves (larger requests go to glibc); set with the allocator.
static MAX_BLOCK: AtomicUsize = AtomicUsize::new(0);
/// `FALLOW_SMALL=1`: every size is fallow's (`THRESHOLD` then stays 0). Stored before the
/// settings are published as parsed, never changed after.
static SMALL_ON: AtomicBool = AtomicBool::new(false);
/// With small objects on, the allocator once it is published (stored after the gate says ready,
/// so that `owner` already answers for every pointer it hands out); null before, and always with
/// small objects off. The one load the small-object paths of `entry.rs` make before the allocator.
pub(crate) static SMALL: AtomicPtr<Allocator> = AtomicPtr::new(core::ptr::null_mut());

static ALLOC: LazyAllocator = LazyAllocator::new();
/// Whether the `FALLOW_STATS` exit handler is registered (once per process image: a `fork`
/// child inherits it).
static STATS_AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Register the `fork` handlers: run by the dynamic loader when the library is loaded (`lib.rs`),
/// before any thread of the program exists.
pub(crate) fn register_fork_handlers() {
    // SAFETY: the handlers are `extern "C"` functions that live as long as the library (which an
    // LD_PRELOAD library does: it is never unloaded); they only reach the allocator through
    // `existing()`, so they do nothing before it exists.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
}

/// `OUT_OF_LINE_FROM`: 0 until the settings are parsed (every request then takes the path that
/// parses them: `for_request`).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn known_out_of_line_from() -> usize {
    OUT_OF_LINE_FROM.load(Ordering::Relaxed)
}

/// The smallest request below `threshold` that the calling thread's hot block may serve
/// (`Allocator::alloc_from_hot`; the rule is the core's, `binding_support::hot_from`: a quarter
/// of the threshold, no less than 64 KiB). glibc serves the requests below it as before.
pub(crate) fn hot_floor(threshold: usize) -> usize {
    fallow::binding_support::hot_from(threshold)
}

/// The threshold, parsing the settings first if nobody has: 0 with small objects on (every
/// size is fallow's).
#[inline]
pub fn threshold() -> usize {
    match THRESHOLD.load(Ordering::Relaxed) {
        0 => {
            let s = settings();
            if s.config.small_objects {
                0
            } else {
                s.threshold
            }
        }
        t => t,
    }
}

/// Whether small objects are on (`FALLOW_SMALL=1`), parsing the settings first if nobody has.
#[inline]
pub fn small_on() -> bool {
    if THRESHOLD.load(Ordering::Relaxed) != 0 {
        return false;
    }
    settings();
    SMALL_ON.load(Ordering::Relaxed)
}

/// With small objects on, the allocator once it exists (`SMALL`): one load.
#[inline(always)]
pub fn small() -> Option<&'static Allocator> {
    let a = SMALL.load(Ordering::Acquire);
    // SAFETY: a non-null `SMALL` is the address of the allocator in `ALLOC`'s slot, stored once
    // it was published (the Acquire load pairs with that Release store); it is never moved or
    // dropped while the library is loaded.
    unsafe { a.as_ref() }
}

/// `small`, for a request of `size` bytes aligned to `align`: `None` above the largest block,
/// which glibc serves as with small objects off (`within_largest_block`, as `for_request`).
#[inline(always)]
pub fn small_for(size: usize, align: usize) -> Option<&'static Allocator> {
    small().filter(|_| within_largest_block(size, align))
}

#[cold]
pub fn settings() -> &'static EnvSettings {
    // A plain load first: with small objects on, `THRESHOLD` stays 0 and the slow paths come
    // here on every call, where a failed compare-exchange would still take the line exclusive.
    if SETTINGS_STATE.load(Ordering::Acquire) == PARSED {
        // SAFETY: PARSED is stored (Release) only after the slot was written, and this load
        // read it with Acquire; the slot is never written again.
        return unsafe { (*SETTINGS.0.get()).assume_init_ref() };
    }
    loop {
        match SETTINGS_STATE.compare_exchange(UNPARSED, PARSING, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                let s = env::from_environment(Config::default());
                let small = s.config.small_objects;
                // Small objects on: every size may be fallow's, so the threshold compare of the
                // pass-through stays at 0 (always taken).
                let threshold = if small { 0 } else { s.threshold };
                SMALL_ON.store(small, Ordering::Relaxed);
                // SAFETY: only the thread whose compare_exchange moved UNPARSED -> PARSING gets
                // here, once; nobody reads the slot before the PARSED store below (Release).
                unsafe { (*SETTINGS.0.get()).write(s) };
                SETTINGS_STATE.store(PARSED, Ordering::Release);
                THRESHOLD.store(threshold, Ordering::Relaxed);
                OUT_OF_LINE_FROM.store(hot_floor(threshold), Ordering::Relaxed);
            }
            // SAFETY: PARSED is stored (Release) only after the slot was written, and this
            // thread's failed compare_exchange read it with Acquire; the slot is never written again.
            Err(PARSED) => return unsafe { (*SETTINGS.0.get()).assume_init_ref() },
            Err(_) => core::hint::spin_loop(),
        }
    }
}

/// For a request of `size` bytes below the threshold that left the pass-through: the allocator,
/// if it exists and the request is at least `OUT_OF_LINE_FROM` (`hot_floor`: its hot block may
/// serve it). Never creates the allocator: with none, no thread has a hot block. Both words 0
/// (not parsed yet, or small objects on): `None`.
#[inline]
pub fn for_hot_block(size: usize) -> Option<&'static Allocator> {
    if size >= THRESHOLD.load(Ordering::Relaxed) || size < OUT_OF_LINE_FROM.load(Ordering::Relaxed) {
        return None;
    }
    existing()
}

/// The allocator if it exists (for ownership checks: no allocator, no pointer of ours).
#[inline]
pub fn existing() -> Option<&'static Allocator> {
    ALLOC.get()
}

/// The allocator that owns `p`, if any.
#[inline]
pub fn owner(p: *const u8) -> Option<&'static Allocator> {
    existing().filter(|a| a.owns(p))
}

/// The allocator for a request of `size` bytes aligned to `align`, creating it on first use
/// (or waiting while another thread creates it); `None` sends the request to glibc (too small,
/// too large, this thread is creating the allocator, or it could not be created).
#[inline]
pub fn for_request(size: usize, align: usize) -> Option<&'static Allocator> {
    if size < threshold() {
        return None;
    }
    let a = match existing() {
        Some(a) => a,
        None => ALLOC.get_or_create(create, publish)?,
    };
    within_largest_block(size, align).then_some(a)
}

/// Whether a request of `size` bytes aligned to `align` is one fallow serves at all: at most its
/// largest block (larger ones are glibc's, which maps them and unmaps them at their free).
#[inline(always)]
pub(crate) fn within_largest_block(size: usize, align: usize) -> bool {
    let max = MAX_BLOCK.load(Ordering::Relaxed);
    size <= max && align <= max
}

/// The creating thread's first step: the allocator the settings configure; on failure, a
/// warning, and glibc serves everything.
#[cold]
fn create() -> Option<Allocator> {
    match Allocator::new(settings().config.clone()) {
        Ok(a) => Some(a),
        Err(e) => {
            let mut b = StackBuf::<320>::new();
            let _ = writeln!(b, "fallow: cannot create the allocator ({e}); glibc serves everything");
            fallow::binding_support::write_stderr(b.as_bytes());
            None
        }
    }
}

/// What runs once the allocator exists: by the thread that creates it, right after publishing
/// it, or by `on_create` if that comes later.
static ON_CREATE: OnceLock<fn()> = OnceLock::new();

/// Whether the `on_create` hook has run (it runs once).
static ON_CREATE_RAN: AtomicBool = AtomicBool::new(false);

/// Have `f` run once, by the thread that creates the allocator, right after it is published
/// (`fallow run`'s sampler, which `lib.rs` registers at load time: a hook rather than an import,
/// as that module imports this one). If the allocator exists already, `f` runs now: a library
/// loaded after this one is initialised before it, and its constructor may allocate (libstdc++
/// takes its exception pool with `malloc`), which creates the allocator before this library's
/// own initialisation registers the hook.
pub(crate) fn on_create(f: fn()) {
    let _ = ON_CREATE.set(f);
    // Between the hook's store and the allocator's load, as `publish` between its publication
    // and the hook's load: one of the two sees the other's store.
    core::sync::atomic::fence(Ordering::SeqCst);
    if existing().is_some() {
        run_on_create();
    }
}

/// Run the `on_create` hook if it is set and has not run yet.
fn run_on_create() {
    if let Some(f) = ON_CREATE.get() {
        if !ON_CREATE_RAN.swap(true, Ordering::AcqRel) {
            f();
        }
    }
}

/// The creating thread's last step, before any other thread sees the allocator: the largest
/// block, the `FALLOW_STATS` exit handler, `ready` (publication) under the fork guard, then the
/// `on_create` hook.
#[cold]
fn publish(a: &Allocator, ready: &dyn Fn()) {
    MAX_BLOCK.store(a.max_block(), Ordering::Relaxed);
    if settings().stats && !STATS_AT_EXIT.swap(true, Ordering::Relaxed) {
        // SAFETY: an `extern "C"` function that lives as long as the library and formats on the
        // stack.
        unsafe { libc::atexit(print_stats_at_exit) };
    }
    // Published under the fork guard: a `fork` either sees no allocator in all three of its
    // handlers or the allocator in all three.
    FORK_GUARD.lock();
    ready();
    // After `ready`: a pointer handed out through `SMALL` is then already `owner`'s.
    if SMALL_ON.load(Ordering::Relaxed) {
        SMALL.store(a as *const Allocator as *mut Allocator, Ordering::Release);
    }
    // SAFETY: taken just above by this thread.
    unsafe { FORK_GUARD.unlock() };
    // See `on_create`.
    core::sync::atomic::fence(Ordering::SeqCst);
    run_on_create();
}

/// Held by `fork_prepare` until the parent or child handler runs, and by the creating thread
/// while it publishes the allocator (`publish`): so the allocator cannot become ready between
/// `fork_prepare`, which locks it only if it exists, and the handlers after the fork, which must
/// release (or reset) exactly what prepare took.
static FORK_GUARD: RawLock = RawLock::new();
/// Whether this fork's `fork_prepare` took the allocator lock (written and read under
/// `FORK_GUARD`, which orders it).
static FORK_LOCKED_HEAP: AtomicBool = AtomicBool::new(false);

extern "C" fn fork_prepare() {
    FORK_GUARD.lock();
    let a = existing();
    if let Some(a) = a {
        a.before_fork();
    }
    FORK_LOCKED_HEAP.store(a.is_some(), Ordering::Relaxed);
}

extern "C" fn fork_parent() {
    if FORK_LOCKED_HEAP.load(Ordering::Relaxed) {
        if let Some(a) = existing() {
            // SAFETY: `fork_prepare` took this allocator's lock in this thread (`FORK_LOCKED_HEAP`,
            // under the guard that keeps the allocator's existence fixed until here).
            unsafe { a.after_fork_parent() };
        }
    }
    // SAFETY: `fork_prepare` took the guard in this thread, and this is its parent-side end.
    unsafe { FORK_GUARD.unlock() };
}

extern "C" fn fork_child() {
    if FORK_LOCKED_HEAP.load(Ordering::Relaxed) {
        if let Some(a) = existing() {
            // SAFETY: the child of the `fork` whose `fork_prepare` called `before_fork` on this
            // allocator; it has one thread, this one, and has started none yet.
            unsafe { a.after_fork_child() };
        }
    }
    // SAFETY: the child has one thread, this one, which took the guard in `fork_prepare`.
    unsafe { FORK_GUARD.reset_after_fork() };
}

/// `FALLOW_STATS=1`: the statistics on stderr at exit (`write_stats`).
extern "C" fn print_stats_at_exit() {
    let Some(a) = existing() else { return };
    // Not `stats`: an `exit` from a signal handler that interrupted this thread inside the
    // allocator would wait for the lock its own thread holds.
    let Some(s) = a.try_stats() else {
        fallow::binding_support::write_stderr(b"fallow: no statistics at exit: the allocator was busy (an exit from inside it)\n");
        return;
    };
    write_stats(&s, "stats at exit");
}

/// `s` on stderr, formatted on the stack: a title line, the report of `Stats` (which does not
/// allocate), then this library's own counters (at exit, and for `malloc_stats`).
pub(crate) fn write_stats(s: &fallow::Stats, title: &str) {
    let mut b = StackBuf::<8192>::new();
    let _ = writeln!(b, "fallow: {title} (pid {})", fallow::binding_support::getpid());
    let _ = s.write_report(&mut b, "fallow:   ");
    let _ = writeln!(
        b,
        "fallow:   realloc:   {} page moves (mremap), {} copies",
        crate::remap::MOVES.load(Ordering::Relaxed),
        crate::remap::COPIES.load(Ordering::Relaxed)
    );
    fallow::binding_support::write_stderr(b.as_bytes());
}
