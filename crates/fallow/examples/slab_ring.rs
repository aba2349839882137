//! Instructions per malloc/free pair of small objects: a ring of 64 live objects of 16-4096
//! bytes, each step freeing one and allocating one of another size (the field's ring count),
//! for fallow's small objects (`Allocator::malloc` / `free_any`; `global`: through `FallowAlloc`,
//! the Rust `GlobalAlloc`, with small objects on; `global-off`: `FallowAlloc::new()`, which
//! passes small requests to `System`) and for glibc, jemalloc and mimalloc through their
//! `GlobalAlloc`s, in one process.
//!
//! ```text
//! cargo build --release -p fallow --example slab_ring
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/slab_ring PEER N     # PEER: fallow, global, global-off, glibc, jemalloc, mimalloc
//! ```
//! Run for two values of N; the difference of the instruction totals over the difference of N
//! is the cost of one pair with start-up left out (the loop's own work included, as in the
//! field's figures).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;

use fallow::{Allocator, Config, FallowAlloc, Flags, Tunables};
use mimalloc::MiMalloc;
use tikv_jemallocator::Jemalloc;

const RING: usize = 64;

/// Sizes 16-4096, spread as a log-uniform draw (small sizes as common as large ones per
/// doubling), from a fixed generator so that every peer gets the same sequence.
fn sizes() -> Vec<usize> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let shift = 4 + (x % 8) as u32; // 16 .. 2048
            ((1usize << shift) + (x >> 8) as usize % (1usize << shift)).min(4096)
        })
        .collect()
}

fn run(alloc: impl Fn(usize) -> *mut u8, free: impl Fn(*mut u8, usize), n: usize) {
    let sizes = sizes();
    let mut ring = [(std::ptr::null_mut::<u8>(), 0usize); RING];
    for (i, r) in ring.iter_mut().enumerate() {
        *r = (alloc(sizes[i]), sizes[i]);
    }
    for i in 0..n {
        let slot = &mut ring[i & (RING - 1)];
        free(slot.0, slot.1);
        let size = sizes[i & 1023];
        let p = alloc(size);
        // SAFETY: a live object of at least one byte.
        unsafe { p.write(1) };
        *slot = (black_box(p), size);
    }
    for r in ring {
        free(r.0, r.1);
    }
}

fn global<A: GlobalAlloc>(a: &A, n: usize) {
    let layout = |size| Layout::from_size_align(size, 16).unwrap();
    // SAFETY: sizes are non-zero; every pointer is freed once with the layout it was allocated with.
    run(|size| unsafe { a.alloc(layout(size)) }, |p, size| unsafe { a.dealloc(p, layout(size)) }, n);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let peer = args.get(1).map(String::as_str).unwrap_or("fallow");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    match peer {
        "fallow" => {
            let a = Allocator::new(Config { tunables: Tunables::off(), small_objects: true, ..Config::default() }).unwrap();
            run(|size| a.malloc(size, 16, Flags::NONE).unwrap().as_ptr(), |p, _| a.free_any(p).unwrap(), n);
        }
        "global" => {
            let config = Config { tunables: Tunables::off(), small_objects: true, ..Config::default() };
            global(&FallowAlloc::with_config(FallowAlloc::DEFAULT_THRESHOLD, config), n);
        }
        "global-off" => global(&FallowAlloc::new(), n),
        "glibc" => global(&System, n),
        "jemalloc" => global(&Jemalloc, n),
        "mimalloc" => global(&MiMalloc, n),
        _ => panic!("PEER is one of fallow, global, global-off, glibc, jemalloc, mimalloc"),
    }
}
