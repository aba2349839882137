//! The C API (`include/fallow.h`): handles, configuration, allocation with flags, free,
//! statistics, tunables, and error reporting by return code + `errno` + a thread-local message.
//!
//! Invariants.
//! - A `fallow_allocator *` is a `Box<Allocator>` leaked to C; `fallow_destroy` takes it back.
//! - Failing calls return an errno value, store it in `errno` and write the message into a
//!   fixed thread-local buffer (`LAST_ERROR`, NUL-terminated, truncated to fit): no allocation on
//!   the error path either.
//! - Nothing here allocates on the alloc/free paths (the core does not either).

#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use core::fmt::Write;
use core::ptr;

use core_fallow::binding_support::StackBuf;
use core_fallow::{Allocator, Backing, Config, Error, Flags, MemoryLimit, ReportMode, Tunables};

#[cfg(test)]
mod header_test;

pub const FALLOW_ZERO: c_uint = 1;
pub const FALLOW_POPULATE: c_uint = 2;
pub const FALLOW_LOCK: c_uint = 4;
const ALL_FLAGS: c_uint = FALLOW_ZERO | FALLOW_POPULATE | FALLOW_LOCK;

const MSG_LEN: usize = 512;

thread_local! {
    static LAST_ERROR: UnsafeCell<[u8; MSG_LEN]> = const { UnsafeCell::new([0; MSG_LEN]) };
}

/// Record a failure: message into the thread-local buffer, `errno`, and the return code.
fn fail(code: c_int, msg: core::fmt::Arguments) -> c_int {
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

fn fail_with(e: Error) -> c_int {
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

/// Create the allocator `config` describes and hand it to C through `out`.
///
/// # Safety
///
/// `out` is a non-null pointer to a writable `fallow_allocator *`.
unsafe fn create(config: Config, out: *mut *mut Allocator) -> c_int {
    match Allocator::new(config) {
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
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_create_with_cache: out is NULL"));
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
    if from_env != 0 {
        config = core_fallow::binding_support::env::from_environment(config).config;
    }
    // SAFETY: `out` is not null (checked above) and writable (the contract).
    unsafe { create(config, out) }
}

/// `fallow_create` with the `FALLOW_*` environment variables applied over `c`: the preload
/// library's parser (`binding_support::env`), so the same names, ranges and warnings on stderr
/// (one per bad value, naming the value used). `FALLOW_ARENA_SIZE`, `FALLOW_THP` and the
/// `FALLOW_CACHE*` variables set the configuration, `FALLOW_REPORT`, `FALLOW_REPORT_DELAY_MS`,
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

/// # Safety
///
/// `a` is null or a handle from `fallow_create` not yet destroyed; no other thread uses it and
/// it is not used afterwards; blocks it gave are not touched afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_destroy(a: *mut Allocator) {
    if !a.is_null() {
        // SAFETY: a non-null `a` is the `Box` that `fallow_create` leaked, destroyed once and
        // used by no one else (the contract).
        drop(unsafe { Box::from_raw(a) });
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

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `out` is null or points to a writable
/// `void *`.
#[no_mangle]
pub unsafe extern "C" fn fallow_alloc(
    a: *mut Allocator,
    size: usize,
    align: usize,
    flags: c_uint,
    out: *mut *mut c_void,
) -> c_int {
    let a = handle!(a, "fallow_alloc");
    if out.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_alloc: out is NULL"));
    }
    if flags & !ALL_FLAGS != 0 {
        return fail(libc::EINVAL, format_args!("fallow_alloc: unknown flag bits {:#x}", flags & !ALL_FLAGS));
    }
    let align = if align == 0 { core_fallow::binding_support::PAGE_SIZE } else { align };
    match a.alloc(size, align, Flags(flags)) {
        Ok(p) => {
            // SAFETY: `out` is not null (checked above) and writable (the contract).
            unsafe { *out = p.as_ptr() as *mut c_void };
            0
        }
        Err(e) => {
            // SAFETY: `out` is not null (checked above) and writable (the contract).
            unsafe { *out = ptr::null_mut() };
            fail_with(e)
        }
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`. `p` may be anything (it is validated);
/// the block it frees is not touched afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_free(a: *mut Allocator, p: *mut c_void) -> c_int {
    let a = handle!(a, "fallow_free");
    match a.free(p as *mut u8) {
        Ok(()) => 0,
        Err(e) => fail_with(e),
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`. `p` may be anything (it is validated);
/// the block it frees is not touched afterwards.
#[no_mangle]
pub unsafe extern "C" fn fallow_free_sized(a: *mut Allocator, p: *mut c_void, size: usize) -> c_int {
    let a = handle!(a, "fallow_free_sized");
    match a.free_sized(p as *mut u8, size) {
        Ok(()) => 0,
        Err(e) => fail_with(e),
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
    match a.resize_in_place(p as *mut u8, new_size) {
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

/// The tunables of the background workers, by their C name.
const TUNABLES: [&str; 14] = [
    "report",
    "report_order",
    "report_delay_ms",
    "report_batch",
    "resident_free_min",
    "report_mode",
    "zeroing",
    "zero_order",
    "zero_chunk",
    "zero_delay_ms",
    "zeroed_reserve",
    "populated_reserve",
    "memory_limit",
    "pressure",
];

/// `memory_limit` as a `uint64_t`: 0 off, `UINT64_MAX` auto (the cgroup's), else bytes.
const LIMIT_OFF: u64 = 0;
const LIMIT_AUTO: u64 = u64::MAX;

/// The tunable `name` names, or the error (EINVAL, message set) for `func` to return.
///
/// # Safety
/// `name` is null or a NUL-terminated string readable up to its NUL (the contract of the C
/// functions that call this).
unsafe fn tunable_name(name: *const c_char, func: &str) -> Result<&'static str, c_int> {
    if name.is_null() {
        return Err(fail(libc::EINVAL, format_args!("{func}: name is NULL")));
    }
    // SAFETY: not null (checked above), and NUL-terminated and readable by this function's
    // contract; the bytes are only used within this call.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    match TUNABLES.iter().find(|t| t.as_bytes() == n) {
        Some(t) => Ok(t),
        None => Err(fail(
            libc::EINVAL,
            format_args!("{func}: unknown tunable {:?}", core::str::from_utf8(n).unwrap_or("<not utf-8>")),
        )),
    }
}

/// Read one tunable as the C API's `uint64_t`.
fn get_field(t: &Tunables, name: &str) -> u64 {
    match name {
        "report" => t.report as u64,
        "report_order" => t.report_order as u64,
        "report_delay_ms" => t.report_delay_ms as u64,
        "report_batch" => t.report_batch as u64,
        "resident_free_min" => t.resident_free_min as u64,
        "report_mode" => match t.report_mode {
            ReportMode::Auto => 0,
            ReportMode::DontNeed => 1,
            ReportMode::Free => 2,
            ReportMode::Punch => 3,
        },
        "zeroing" => t.zeroing as u64,
        "zero_order" => t.zero_order as u64,
        "zero_chunk" => t.zero_chunk as u64,
        "zero_delay_ms" => t.zero_delay_ms as u64,
        "zeroed_reserve" => t.zeroed_reserve as u64,
        "memory_limit" => match t.memory_limit {
            MemoryLimit::Off => LIMIT_OFF,
            MemoryLimit::Auto => LIMIT_AUTO,
            MemoryLimit::Bytes(n) => n,
        },
        "pressure" => t.pressure as u64,
        _ => t.populated_reserve as u64, // "populated_reserve" (names are checked before)
    }
}

/// Write one tunable from a `uint64_t`; values that do not fit the field are out of range.
fn set_field(t: &mut Tunables, name: &'static str, v: u64) -> Result<(), Error> {
    let range = |message| Error::Config { setting: name, message };
    let flag = |v: u64| match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(range("must be 0 (off) or 1 (on)")),
    };
    let small = |v: u64| u8::try_from(v).map_err(|_| range("must be between 0 and 30"));
    let size = |v: u64| usize::try_from(v).map_err(|_| range("too large"));
    match name {
        "report" => t.report = flag(v)?,
        "report_order" => t.report_order = small(v)?,
        "report_delay_ms" => t.report_delay_ms = u32::try_from(v).map_err(|_| range("must be between 0 and 3600 s"))?,
        "report_batch" => t.report_batch = u32::try_from(v).map_err(|_| range("must be between 1 and 256 blocks"))?,
        "resident_free_min" => t.resident_free_min = size(v)?,
        "report_mode" => {
            t.report_mode = match v {
                0 => ReportMode::Auto,
                1 => ReportMode::DontNeed,
                2 => ReportMode::Free,
                3 => ReportMode::Punch,
                _ => return Err(range("must be 0 (auto), 1 (dontneed), 2 (free) or 3 (punch)")),
            }
        }
        "zeroing" => t.zeroing = flag(v)?,
        "zero_order" => t.zero_order = small(v)?,
        "zero_chunk" => t.zero_chunk = size(v)?,
        "zero_delay_ms" => t.zero_delay_ms = u32::try_from(v).map_err(|_| range("must be between 0 and 3600 s"))?,
        "zeroed_reserve" => t.zeroed_reserve = size(v)?,
        "memory_limit" => {
            t.memory_limit = match v {
                LIMIT_OFF => MemoryLimit::Off,
                LIMIT_AUTO => MemoryLimit::Auto,
                n => MemoryLimit::Bytes(n),
            }
        }
        "pressure" => t.pressure = flag(v)?,
        _ => t.populated_reserve = size(v)?,
    }
    Ok(())
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `name` is null or a NUL-terminated
/// string readable up to its NUL.
#[no_mangle]
pub unsafe extern "C" fn fallow_set_tunable(a: *mut Allocator, name: *const c_char, value: u64) -> c_int {
    let a = handle!(a, "fallow_set_tunable");
    // SAFETY: `name` is null or a readable NUL-terminated string (this function's contract), as
    // `tunable_name` requires.
    let name = match unsafe { tunable_name(name, "fallow_set_tunable") } {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut t = a.tunables();
    match set_field(&mut t, name, value).and_then(|()| a.set_tunables(t)) {
        Ok(()) => 0,
        Err(e) => fail_with(e),
    }
}

/// # Safety
///
/// `a` is null or a live handle from `fallow_create`; `name` is null or a NUL-terminated
/// string readable up to its NUL; `value` is null or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn fallow_get_tunable(a: *mut Allocator, name: *const c_char, value: *mut u64) -> c_int {
    let a = handle!(a, "fallow_get_tunable");
    if value.is_null() {
        return fail(libc::EINVAL, format_args!("fallow_get_tunable: value is NULL"));
    }
    // SAFETY: `name` is null or a readable NUL-terminated string (this function's contract), as
    // `tunable_name` requires.
    match unsafe { tunable_name(name, "fallow_get_tunable") } {
        Ok(t) => {
            let v = get_field(&a.tunables(), t);
            // SAFETY: `value` is not null (checked above) and writable (the contract).
            unsafe { *value = v };
            0
        }
        Err(code) => code,
    }
}

#[no_mangle]
pub extern "C" fn fallow_last_error() -> *const c_char {
    LAST_ERROR.with(|cell| cell.get() as *const c_char)
}

#[no_mangle]
pub extern "C" fn fallow_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
