//! `libfallow_preload.so`: an `LD_PRELOAD` drop-in that serves large `malloc`, `calloc`,
//! `realloc` and aligned requests from one process-wide fallow allocator and everything else
//! from glibc. See docs/design.md, "C API and preload".
//!
//! - `entry`: the exported `malloc` family and the routing rules;
//! - `cxx`: C++'s `operator new` / `operator delete` on that `malloc` and `free` (x86-64);
//! - `remap`: `realloc` of fallow blocks (in place, by moving pages, across the threshold);
//! - `process`: lazy settings and allocator, `fork` handlers, statistics at exit; the settings
//!   parser (`FALLOW_*`), the start-up (`LazyAllocator`) and the abort on a bad pointer
//!   (`fatal`) are the core's, from `fallow::binding_support`, shared with the C library and
//!   `FallowAlloc`;
//! - `heap_info`: `malloc_trim`, `mallinfo2`, `mallinfo` and `malloc_stats` over fallow's heap
//!   and glibc's;
//! - `run_record`: under `fallow run`, samples of the free memory by state and the final figures,
//!   appended to the file `FALLOW_RUN_RECORD` names;
//! - `libc_heap`: glibc's `__libc_*` entry points and the Rust global allocator built on them, so
//!   that no Rust code in this library comes back through the interposed `malloc`.

#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]

#[cfg(target_arch = "x86_64")]
pub mod cxx;
pub mod entry;
pub mod free;
pub mod heap_info;
pub mod libc_heap;
pub mod process;
pub mod remap;
pub mod run_record;

#[global_allocator]
static RUST_HEAP: libc_heap::LibcHeap = libc_heap::LibcHeap;

/// Run by the dynamic loader when the library is loaded.
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

extern "C" fn at_load() {
    process::register_fork_handlers();
    // Under `fallow run` only (`FALLOW_RUN_RECORD`): its record, set up here at load time rather
    // than inside a `malloc`; its sampler thread comes with the allocator, as the workers do.
    if run_record::init() {
        process::on_create(run_record::start_sampler);
    }
}
