//! Allocate, dirty, free and allocate again with ZERO, printing the statistics at each step: the
//! smallest look at what fallow knows about its free pages.

use fallow::{Allocator, Config, Flags};

fn main() {
    let a = Allocator::new(Config::default()).expect("allocator");
    let len = 256 << 20;
    let p = a.alloc(len, 4096, Flags::ZERO).expect("alloc");
    println!("== 256 MiB ZERO allocation of never-touched memory (reported: no memset)\n{}\n", a.stats());
    // SAFETY: `p` is a live block of `len` bytes (the allocation above), owned here until the free below.
    unsafe { std::ptr::write_bytes(p.as_ptr(), 0xa5, len) };
    a.free(p.as_ptr()).expect("free");
    println!("== after writing and freeing it (dirty)\n{}\n", a.stats());
    let q = a.alloc(len, 4096, Flags::ZERO).expect("alloc");
    println!("== 256 MiB ZERO allocation again: reported memory is preferred over dirty\n{}\n", a.stats());
    let r = a.alloc(len, 4096, Flags::NONE).expect("alloc");
    println!("== 256 MiB plain allocation: takes the dirty (resident) memory\n{}", a.stats());
    a.free(q.as_ptr()).unwrap();
    a.free(r.as_ptr()).unwrap();
}
