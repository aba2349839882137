//! The C API (`include/fallow.h`): handles, configuration, allocation with flags, free,
//! statistics, tunables, and error reporting by return code + `errno` + a thread-local message.
//!
//! Invariants.
//! - A `fallow_allocator *` is a `Box<Allocator>` leaked to C; `fallow_destroy` takes it back.
//! - Every allocator is in the core's `fork` registry from its creation (before the handle is
//!   returned) to its destruction (`binding_support::fork`): locked around every `fork` of the
//!   process, reset in the child.
//! - Failing calls return an errno value, store it in `errno` and write the message into a
//!   fixed thread-local buffer (`LAST_ERROR`, NUL-terminated, truncated to fit): no allocation on
//!   the error path either.
//! - Nothing here allocates on the alloc/free paths (the core does not either).
//! - With small objects on (`Config::small_objects`: `FALLOW_CREATE_SMALL_OBJECTS`, or
//!   `FALLOW_SMALL=1` from the environment) the allocation functions are the core's malloc-like
//!   entry points (`Allocator::malloc`, `free_any`), as the preload's; off, `alloc` and `free`.
//!
//! `tunables`: the workers' tunables by name.

#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::fmt::Write;

use core_fallow::binding_support::{fork, StackBuf};
use core_fallow::{Allocator, Backing, Config, Error};

#[cfg(test)]
mod header_test;

pub const FALLOW_ZERO: c_uint = 1;
pub const FALLOW_POPULATE: c_uint = 2;
pub const FALLOW_LOCK: c_uint = 4;
pub(crate) const ALL_FLAGS: c_uint = FALLOW_ZERO | FALLOW_POPULATE | FALLOW_LOCK;

/// Options of `fallow_create_with_options` (may be or-ed): the `FALLOW_*` environment variables
/// applied over the settings, and small objects on (`Config::small_objects`).
pub const FALLOW_CREATE_FROM_ENV: c_uint = 1;
pub const FALLOW_CREATE_SMALL_OBJECTS: c_uint = 2;
const ALL_OPTIONS: c_uint = FALLOW_CREATE_FROM_ENV | FALLOW_CREATE_SMALL_OBJECTS;

/// The alignment `fallow_alloc` gives for `align` 0 to an allocator with small objects on: every
/// small object's (a page block is page-aligned whatever it is asked).
pub(crate) const SMALL_NATURAL_ALIGN: usize = 16;

const MSG_LEN: usize = 512;

thread_local! {
    static LAST_ERROR: UnsafeCell<[u8; MSG_LEN]> = const { UnsafeCell::new([0; MSG_LEN]) };
}

/// Record a failure: message into the thread-local buffer, `errno`, and the return code. Out of
/// line: its 512-byte message buffer would give every caller's hot path a frame.
#[cold]
#[inline(never)]
pub(crate) fn fail(code: c_int, msg: core::fmt::Arguments) -> c_int {
    let mut b = StackBuf::<MSG_LEN>::new();
    let _ = b.write_fmt(msg);
    LAST_ERROR.with(|cell| {
        // SAFETY: `LAST_ERROR` is this thread's own buffer, and no other reference to it exists
        // while this closure runs: the only other access, `fallow_last_error`, hands C a raw
        // pointer and creates no reference, and nothing here calls back into this crate.
        let buf = unsafe { &mut *cell.get() };
        let n = b.as_bytes().len().min(MSG_LEN - 1);
        buf[..n].copy_from_slice(&b.as_bytes()[..n]);
        buf[n] = 0;
    });
    core_fallow::binding_support::set_errno(code);
    code
}

#[cold]
#[inline(never)]
pub(crate) fn fail_with(e: Error) -> c_int {
    fail(e.errno(), format_args!("{e}"))
}

#[repr(C)]
pub struct FallowConfig {
    pub arena_size: usize,
    pub max_order: u32,
    pub thp: c_int,
    pub backing: c_int,
}

/// `fallow_cache_config`: the per-thread caches' settings of `Config` (`cache`,
/// `cache_max_order`, `cache_batch_pages`, `cache_high_pages`), apart from `fallow_config`,
/// whose layout programs built against an older header rely on.
#[repr(C)]
pub struct FallowCacheConfig {
    pub cache: c_int,
    pub max_order: u32,
    pub batch_pages: u32,
    pub high_pages: u32,
}

impl FallowCacheConfig {
    fn of(c: &Config) -> FallowCacheConfig {
        FallowCacheConfig {
            cache: c.cache as c_int,
            max_order: c.cache_max_order as u32,
            batch_pages: c.cache_batch_pages,
            high_pages: c.cache_high_pages,
        }
    }

    /// Apply over `config`; the ranges are `Config::validate`'s (at creation), EINVAL (message
    /// set) for values no field can hold.
    fn apply(&self, config: &mut Config) -> Result<(), c_int> {
        config.cache = match self.cache {
            0 => false,
            1 => true,
            _ => return Err(fail(libc::EINVAL, format_args!("bad setting cache: must be 0 or 1"))),
        };
        config.cache_max_order = u8::try_from(self.max_order)
            .map_err(|_| fail(libc::EINVAL, format_args!("bad setting cache_max_order: must be between 0 and 11")))?;
        config.cache_batch_pages = self.batch_pages;
        config.cache_high_pages = self.high_pages;
        Ok(())
    }
}

/// `struct fallow_stats`: generated, with its conversion from `Stats`, from the one table of the
/// statistics (`stats.rs` of the core); `header_test` checks `include/fallow.h` against it.
pub use core_fallow::binding_support::CStats as FallowStats;
use core_fallow::binding_support::C_STATS_V1_SIZE;

/// # Safety
///
/// `c` is null or points to a `FallowConfig` (`fallow_config`) writable by this thread.
#[no_mangle]
pub unsafe extern "C" fn fallow_config_init(c: *mut FallowConfig) {
    if c.is_null() {
        return;
    }
    let d = Config::default();
    let init = FallowConfig { arena_size: d.arena_size, max_order: d.max_order as u32, thp: d.thp as c_int, backing: 0 };
    // SAFETY: `c` is not null (checked above) and writable (the contract); `FallowConfig` has no
    // drop glue, so overwriting whatever it held is fine.
    unsafe { *c = init };
}

/// The `Config` a `fallow_config` describes (null: the default), or the error code (EINVAL,
/// message set) for the caller to return.
///
/// # Safety
///
/// `c` is null or points to a readable, initialised `FallowConfig`.
unsafe fn config_from_c(c: *const FallowConfig) -> Result<Config, c_int> {
    let mut config = Config::default();
    // SAFETY: `c` is null (then `None`) or points to an initialised `FallowConfig` (the contract).
    let Some(c) = (unsafe { c.as_ref() }) else { return Ok(config) };
    if c.max_order > 255 {
        return Err(fail(libc::EINVAL, format_args!("bad setting max_order: must be between 0 and 30")));
    }
    config.arena_size = c.arena_size;
    config.max_order = c.max_order as u8;
    config.thp = match c.thp {
        0 => false,
        1 => true,
        _ => return Err(fail(libc::EINVAL, format_args!("bad setting thp: must be 0 or 1"))),
    };
    config.backing = match c.backing {
        0 => Backing::Anonymous,
        1 => Backing::Memfd,
        _ => {
            return Err(fail(
                libc::EINVAL,
                format_args!("bad setting backing: must be FALLOW_BACKING_ANONYMOUS (0) or FALLOW_BACKING_MEMFD (1)"),
            ))
        }
    };
    Ok(config)
}

/// Create the allocator `config` describes, register it with the `fork` handlers (before any
/// other thread can reach it: a `fork` from then on locks it, `fallow_destroy` takes it out), and
/// hand it to C through `out`. A registration refused (no page for the registry) fails the
/// creation: never an allocator that a `fork` could leave locked in the child.
///
/// # Safety
///
/// `out` is a non-null pointer to a writable `fallow_allocator *`.
unsafe fn create(config: Config, out: *mut *mut Allocator) -> c_int {
    let made = Allocator::new(config).and_then(|a| fork::register(&a).map(|()| a));
    match made {
        Ok(a) => {
            let handle = Box::into_raw(Box::new(a));
            // SAFETY: `out` is not null and writable (the contract).
            unsafe { *out = handle };
            0
        }
        Err(e) => fail_with(e),
    }
}

/// # Safety
///
/// `c` is null or points to a readable, initialised `FallowConfig`; `out` is null or points to
/// a writable `fallow_allocator *`.
#[no_mangle]
pub unsafe extern "C" fn fallow_create(c: *const FallowConfig, out: *mut *mut Allocator) -> c_int {
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_create: out is NULL"));
    }
    // SAFETY: `c` is null or a readable, initialised `FallowConfig` (this function's contract).
    match unsafe { config_from_c(c) } {
        // SAFETY: `out` is not null (checked above) and writable (the contract).
        Ok(config) => unsafe { create(config, out) },
        Err(code) => code,
    }
}

/// # Safety
///
/// `c` is null or points to a `FallowCacheConfig` writable by this thread.
#[no_mangle]
pub unsafe extern "C" fn fallow_cache_config_init(c: *mut FallowCacheConfig) {
    if c.is_null() {
        return;
    }
    // SAFETY: `c` is not null (checked above) and writable (the contract); no drop glue.
    unsafe { *c = FallowCacheConfig::of(&Config::default()) };
}

/// `fallow_create` with the per-thread caches' settings of `cache` (null: the default), and with
/// the `FALLOW_*` environment variables applied over both when `from_env` is not 0 (as
/// `fallow_create_from_env` does).
///
/// # Safety
///
/// As `fallow_create`, and `cache` is null or points to a readable, initialised
/// `FallowCacheConfig`; with `from_env`, as `fallow_create_from_env`.
#[no_mangle]
pub unsafe extern "C" fn fallow_create_with_cache(
    c: *const FallowConfig,
    cache: *const FallowCacheConfig,
    from_env: c_int,
    out: *mut *mut Allocator,
) -> c_int {
    let options = if from_env != 0 { FALLOW_CREATE_FROM_ENV } else { 0 };
    // SAFETY: this function's contract is `create_with`'s.
    unsafe { create_with(c, cache, options, out, "fallow_create_with_cache") }
}

/// `fallow_create_with_cache` with options instead of its `from_env`: `FALLOW_CREATE_FROM_ENV`
/// (the environment over everything else, as `from_env`), `FALLOW_CREATE_SMALL_OBJECTS` (small
/// objects on: `fallow_alloc` serves requests of up to `FALLOW_SMALL_MAX` (64 KiB) as objects of the slab layer).
/// Unknown bits are EINVAL. A flag word rather than a field of `fallow_config`, whose layout
/// programs built against an older header rely on.
///
/// # Safety
///
/// As `fallow_create_with_cache`.
#[no_mangle]
pub unsafe extern "C" fn fallow_create_with_options(
    c: *const FallowConfig,
    cache: *const FallowCacheConfig,
    options: c_uint,
    out: *mut *mut Allocator,
) -> c_int {
    // SAFETY: this function's contract is `create_with`'s.
    unsafe { create_with(c, cache, options, out, "fallow_create_with_options") }
}

/// The two functions above.
///
/// # Safety
///
/// `c` and `cache` are null or point to readable, initialised structs of their types; `out` is
/// null or points to a writable `fallow_allocator *`; with `FALLOW_CREATE_FROM_ENV`, no other
/// thread changes the environment during the call.
unsafe fn create_with(
    c: *const FallowConfig,
    cache: *const FallowCacheConfig,
    options: c_uint,
    out: *mut *mut Allocator,
    func: &str,
) -> c_int {
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("{func}: out is NULL"));
    }
    if options & !ALL_OPTIONS != 0 {
        return fail(libc::EINVAL, format_args!("{func}: unknown option bits {:#x}", options & !ALL_OPTIONS));
    }
    // SAFETY: `c` is null or a readable, initialised `FallowConfig` (this function's contract).
    let mut config = match unsafe { config_from_c(c) } {
        Ok(config) => config,
        Err(code) => return code,
    };
    // SAFETY: `cache` is null (then `None`) or a readable, initialised `FallowCacheConfig`.
    if let Some(cache) = unsafe { cache.as_ref() } {
        if let Err(code) = cache.apply(&mut config) {
            return code;
        }
    }
    config.small_objects = options & FALLOW_CREATE_SMALL_OBJECTS != 0;
    if options & FALLOW_CREATE_FROM_ENV != 0 {
        config = core_fallow::binding_support::env::from_environment(config).config;
    }
    // SAFETY: `out` is not null (checked above) and writable (the contract).
    unsafe { create(config, out) }
}

/// `fallow_create` with the `FALLOW_*` environment variables applied over `c`: the preload
/// library's parser (`binding_support::env`), so the same names, ranges and warnings on stderr
/// (one per bad value, naming the value used). `FALLOW_ARENA_SIZE`, `FALLOW_THP`, the
/// `FALLOW_CACHE*` variables and `FALLOW_SMALL` set the configuration, `FALLOW_REPORT`, `FALLOW_REPORT_DELAY_MS`,
/// `FALLOW_ZEROING`, `FALLOW_MEMORY_LIMIT` and `FALLOW_PRESSURE` the tunables; `FALLOW_THRESHOLD`
/// and `FALLOW_STATS` concern the preload only and are just checked.
///
/// # Safety
///
/// As `fallow_create`; and no other thread changes the environment (`setenv`, `putenv`) during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn fallow_create_from_env(c: *const FallowConfig, out: *mut *mut Allocator) -> c_int {
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_create_from_env: out is NULL"));
    }
    // SAFETY: `c` is null or a readable, initialised `FallowConfig` (this function's contract).
    match unsafe { config_from_c(c) } {
        Ok(config) => {
            let settings = core_fallow::binding_support::env::from_environment(config);
            // SAFETY: `out` is not null (checked above) and writable (the contract).
            unsafe { create(settings.config, out) }
        }
        Err(code) => code,
    }
}

/// Through `fork::release`: the handle dropped (the workers joined) while the allocator is still
/// registered, then taken out of the `fork` registry, then its memory unmapped.
///
/// # Safety
///
/// `a` is null or a handle from `fallow_create` not yet destroyed; no other thread uses it and
/// it is not used afterwards; blocks it gave are not touched afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_destroy(a: *mut Allocator) {
    if !a.is_null() {
        // SAFETY: a non-null `a` is the `Box` that `fallow_create` leaked, destroyed once and
        // used by no one else (the contract); its `Allocator` is the allocator's only handle.
        fork::release(*unsafe { Box::from_raw(a) });
    }
}

macro_rules! handle {
    ($a:expr, $f:literal) => {
        // SAFETY: every use is in a function whose contract makes `$a` null or a live handle
        // from `fallow_create` (a leaked `Box<Allocator>`, shared immutably).
        match unsafe { $a.as_ref() } {
            Some(a) => a,
            None => return fail(libc::EINVAL, format_args!(concat!($f, ": allocator is NULL"))),
        }
    };
}

// After `handle!`, which they use.
mod blocks;
mod tunables;
pub use blocks::{fallow_alloc, fallow_free};
pub use tunables::{fallow_get_tunable, fallow_set_tunable};

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`. `p` may be anything (it is validated);
/// the block it frees is not touched afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_free_sized(a: *mut Allocator, p: *mut c_void, size: usize) -> c_int {
    let a = handle!(a, "fallow_free_sized");
    let r = match small_object_size(a, p) {
        // A small object holds its class size; any size from 1 to it may have asked for it.
        Some(actual) if size == 0 || size > actual => Err(Error::SizeMismatch { addr: p as usize, given: size, actual }),
        Some(_) => a.free_any(p as *mut u8),
        None => a.free_sized(p as *mut u8, size),
    };
    match r {
        Ok(()) => 0,
        Err(e) => fail_with(e),
    }
}

/// The class size of the small object at `p`, if small objects are on and `p` is the start of
/// one (handed out once: whether it is live is not known here, as for `usable_size`); `None`
/// sends `p` to the page calls, which check it.
fn small_object_size(a: &Allocator, p: *const c_void) -> Option<usize> {
    if a.config().small_objects {
        a.small_usable_size(p as *const u8)
    } else {
        None
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `p` may be anything (it is validated);
/// `resized` is null or points to a writable `int`. Pages given back by a shrink are not touched
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_resize_in_place(
    a: *mut Allocator,
    p: *mut c_void,
    new_size: usize,
    resized: *mut c_int,
) -> c_int {
    let a = handle!(a, "fallow_resize_in_place");
    let r = match small_object_size(a, p) {
        // A small object stays in its class: in place iff the new size fits it (nothing moves
        // and nothing is given back).
        Some(_) if new_size == 0 => Err(Error::ZeroSize),
        Some(class) => Ok(new_size <= class),
        None => a.resize_in_place(p as *mut u8, new_size),
    };
    match r {
        Ok(done) => {
            if !resized.is_null() {
                // SAFETY: not null (just checked) and writable (the contract).
                unsafe { *resized = done as c_int };
            }
            0
        }
        Err(e) => fail_with(e),
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `given` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn fallow_trim(a: *mut Allocator, keep: usize, given: *mut u64) -> c_int {
    let a = handle!(a, "fallow_trim");
    let bytes = a.trim(keep);
    if !given.is_null() {
        // SAFETY: not null (just checked) and writable (the contract).
        unsafe { *given = bytes };
    }
    0
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `p` may be anything (it is validated).
#[no_mangle]
pub unsafe extern "C" fn fallow_usable_size(a: *mut Allocator, p: *const c_void) -> usize {
    // SAFETY: `a` is null or a live handle from `fallow_create` (the contract).
    match unsafe { a.as_ref() } {
        Some(a) => a.usable_size(p as *const u8).unwrap_or(0),
        None => 0,
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `p` may be anything (only compared).
#[no_mangle]
pub unsafe extern "C" fn fallow_owns(a: *const Allocator, p: *const c_void) -> c_int {
    // SAFETY: `a` is null or a live handle from `fallow_create` (the contract).
    match unsafe { a.as_ref() } {
        Some(a) => a.owns(p as *const u8) as c_int,
        None => 0,
    }
}

/// The statistics into `out`, `size` bytes of them (`size` at least `C_STATS_V1_SIZE`).
///
/// # Safety
///
/// `a` is a live handle; `out` is not null and writable for `size` bytes.
unsafe fn write_stats(a: &Allocator, out: *mut FallowStats, size: usize) {
    let s = FallowStats::from(&a.stats());
    let n = size.min(core::mem::size_of::<FallowStats>());
    // SAFETY: `s` is `n` readable bytes on the stack; `out` is writable for `size >= n` bytes (the
    // contract) and does not overlap a local.
    unsafe { core::ptr::copy_nonoverlapping(&s as *const FallowStats as *const u8, out as *mut u8, n) };
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `out` is null or points to a writable
/// `fallow_stats` of the size it had before the memory limit's figures (`C_STATS_V1_SIZE`
/// bytes), or larger.
#[no_mangle]
pub unsafe extern "C" fn fallow_stats_read(a: *mut Allocator, out: *mut FallowStats) -> c_int {
    let a = handle!(a, "fallow_stats_read");
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_stats_read: out is NULL"));
    }
    // SAFETY: `out` is not null and writable for `C_STATS_V1_SIZE` bytes (the contract), which
    // nothing else accesses during the call.
    unsafe { write_stats(a, out, C_STATS_V1_SIZE) };
    0
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `out` is null or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn fallow_stats_read_size(
    a: *mut Allocator,
    out: *mut FallowStats,
    size: usize,
) -> c_int {
    let a = handle!(a, "fallow_stats_read_size");
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_stats_read_size: out is NULL"));
    }
    if size < C_STATS_V1_SIZE {
        let smallest = C_STATS_V1_SIZE;
        let msg = format_args!("fallow_stats_read_size: size {size} is below the smallest struct fallow_stats ({smallest})");
        return fail(libc::EINVAL, msg);
    }
    // SAFETY: `out` is not null and writable for `size` bytes (the contract), which nothing else
    // accesses during the call.
    unsafe { write_stats(a, out, size) };
    0
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `out` is null or points to a writable
/// `FallowCacheConfig`.
#[no_mangle]
pub unsafe extern "C" fn fallow_cache_config_read(a: *mut Allocator, out: *mut FallowCacheConfig) -> c_int {
    let a = handle!(a, "fallow_cache_config_read");
    // SAFETY: `out` is null (then `None`) or points to a writable `FallowCacheConfig` (the
    // contract), which nothing else accesses during the call.
    let Some(out) = (unsafe { out.as_mut() }) else {
        return fail(libc::EINVAL, format_args!("fallow_cache_config_read: out is NULL"));
    };
    *out = FallowCacheConfig::of(a.config());
    0
}

#[no_mangle]
pub extern "C" fn fallow_last_error() -> *const c_char {
    LAST_ERROR.with(|cell| cell.get() as *const c_char)
}

#[no_mangle]
pub extern "C" fn fallow_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
