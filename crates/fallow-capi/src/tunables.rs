//! Tunables of the background workers by name (`fallow_set_tunable`, `fallow_get_tunable`):
//! every field of `Tunables` as a `uint64_t`, validated by `Allocator::set_tunables`.

use core::ffi::{c_char, c_int, CStr};

use core_fallow::{Allocator, Error, MemoryLimit, ReportMode, Tunables};

use crate::{fail, fail_with};

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
