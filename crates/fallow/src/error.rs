//! Errors. Every error that concerns an address names it; none of them leaves the allocator in a
//! worse state than before the call.

use core::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// A request for zero bytes.
    ZeroSize,
    /// An alignment that is not a power of two, or larger than the largest block.
    BadAlignment { align: usize, max: usize },
    /// A size no arena could ever hold.
    TooLarge { size: usize },
    /// No arena can hold a request of `size` bytes (0: the first arena, at creation) and the
    /// kernel refused a new one: `tried` is the size of the last reservation asked for (0 when
    /// none could be, all arenas being in use).
    OutOfMemory { size: usize, tried: usize, errno: i32 },
    /// `mlock` refused (`RLIMIT_MEMLOCK`, usually); the block was given back.
    Lock { size: usize, errno: i32 },
    /// An address that fallow does not manage, or that is not the start of a live block.
    InvalidPointer { addr: usize },
    /// An address inside a live block, not at its start.
    InteriorPointer { addr: usize, block: usize },
    /// The block at this address was already freed.
    DoubleFree { addr: usize },
    /// `free_sized` with a size that does not match the block.
    SizeMismatch { addr: usize, given: usize, actual: usize },
    /// A setting out of its range.
    Config { setting: &'static str, message: &'static str },
    /// The operating system refused something else.
    Os { op: &'static str, errno: i32 },
}

impl Error {
    /// The `errno` value that a C caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::OutOfMemory { .. } | Error::TooLarge { .. } => libc::ENOMEM,
            Error::Lock { errno, .. } => *errno,
            Error::Os { errno, .. } => *errno,
            _ => libc::EINVAL,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::ZeroSize => write!(f, "allocation of zero bytes"),
            Error::BadAlignment { align, max } => {
                write!(f, "alignment {align} is not a power of two between 1 and {max}")
            }
            Error::TooLarge { size } => write!(f, "allocation of {size} bytes is too large"),
            Error::OutOfMemory { size: _, tried: 0, errno: _ } => {
                write!(f, "out of memory: every arena is in use and no more can be reserved")
            }
            Error::OutOfMemory { size: 0, tried, errno } => {
                write!(f, "out of memory: reserving the first arena of {tried} bytes failed (errno {errno})")
            }
            Error::OutOfMemory { size, tried, errno } => write!(
                f,
                "out of memory: a request of {size} bytes needs a new arena, and reserving {tried} bytes failed (errno {errno})"
            ),
            Error::Lock { size, errno } => write!(
                f,
                "mlock of {size} bytes failed (errno {errno}); raise RLIMIT_MEMLOCK (ulimit -l) or run with CAP_IPC_LOCK"
            ),
            Error::InvalidPointer { addr } => write!(f, "invalid pointer {addr:#x}: not a live block"),
            Error::InteriorPointer { addr, block } => {
                write!(f, "invalid pointer {addr:#x}: inside the live block at {block:#x}")
            }
            Error::DoubleFree { addr } => write!(f, "double free of {addr:#x}"),
            Error::SizeMismatch { addr, given, actual } => write!(
                f,
                "size mismatch freeing {addr:#x}: given {given} bytes, the block holds {actual}"
            ),
            Error::Config { setting, message } => write!(f, "bad setting {setting}: {message}"),
            Error::Os { op, errno } => write!(f, "{op} failed (errno {errno})"),
        }
    }
}

impl std::error::Error for Error {}
