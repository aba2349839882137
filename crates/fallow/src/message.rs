//! Messages written from inside `malloc`, where nothing may allocate: `StackBuf`, a fixed buffer
//! that `core::fmt::Write` fills, and [`fatal`], the one path by which a bad pointer handed to a
//! process-wide allocator (the preload's `free`, `FallowAlloc::dealloc`) ends the program.

use core::fmt::Write;

use crate::error::Error;
use crate::os;

/// A fixed buffer that `fmt::Write` fills without allocating (truncating when full).
pub struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    pub const fn new() -> Self {
        StackBuf { buf: [0; N], len: 0 }
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl<const N: usize> Default for StackBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> core::fmt::Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The line `fatal` writes for `op` failing with `e`: `fallow: free(): double free 0x...`,
/// `fallow: free(): invalid pointer 0x... (not a live block)`, as glibc words its own; any other
/// error in `Error`'s words.
pub fn fatal_message<const N: usize>(b: &mut StackBuf<N>, op: &str, e: &Error) {
    let _ = match *e {
        Error::DoubleFree { addr } => writeln!(b, "fallow: {op}(): double free {addr:#x}"),
        Error::InvalidPointer { addr } => writeln!(b, "fallow: {op}(): invalid pointer {addr:#x} (not a live block)"),
        Error::InteriorPointer { addr, block } => {
            writeln!(b, "fallow: {op}(): invalid pointer {addr:#x} (inside the live block at {block:#x})")
        }
        _ => writeln!(b, "fallow: {op}(): {e}"),
    };
}

/// A bad pointer handed to a process-wide allocator is memory corruption in the program: say
/// which call and which address on stderr, formatted on the stack, and abort, as glibc does.
#[cold]
pub fn fatal(op: &str, e: &Error) -> ! {
    let mut b = StackBuf::<320>::new();
    fatal_message(&mut b, op, e);
    os::write_stderr(b.as_bytes());
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(op: &str, e: Error) -> String {
        let mut b = StackBuf::<320>::new();
        fatal_message(&mut b, op, &e);
        String::from_utf8(b.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn fatal_messages_name_the_call_and_the_address() {
        assert_eq!(line("free", Error::DoubleFree { addr: 0x1000 }), "fallow: free(): double free 0x1000\n");
        assert_eq!(
            line("realloc", Error::InvalidPointer { addr: 0x2000 }),
            "fallow: realloc(): invalid pointer 0x2000 (not a live block)\n"
        );
        assert_eq!(
            line("dealloc", Error::InteriorPointer { addr: 0x3010, block: 0x3000 }),
            "fallow: dealloc(): invalid pointer 0x3010 (inside the live block at 0x3000)\n"
        );
        assert_eq!(line("free", Error::ZeroSize), "fallow: free(): allocation of zero bytes\n");
    }

    #[test]
    fn stack_buf_truncates_when_full() {
        let mut b = StackBuf::<8>::new();
        let _ = write!(b, "0123456789");
        assert_eq!(b.as_bytes(), b"01234567");
        b.clear();
        let _ = write!(b, "ab");
        assert_eq!(b.as_bytes(), b"ab");
    }
}
