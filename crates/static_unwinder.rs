//! Build-script part shared by the two shared libraries (the preload library and the C API's
//! `libfallow.so`): link the unwinder statically, so that the library does not need
//! `libgcc_s.so.1`.
//!
//! Rust's standard library refers to the unwinder (`_Unwind_*`), and on `*-linux-gnu` rustc
//! links it as `-lgcc_s`: every process the preload library is loaded into also loaded
//! `libgcc_s`, a third of the library's start-up (`perf stat -r 300 /bin/true`, task clock:
//! 0.39 ms alone, 0.675 preloaded, 0.575 preloaded with the unwinder linked in) and about 100
//! KiB of resident memory (docs/measurements.md, "The unwinder, the shared state and a cache's
//! entries"). Nothing in fallow unwinds (the release profile aborts on panic), so
//! the static unwinder (`libgcc_eh.a`, the one `gcc -static-libgcc` links into shared
//! libraries) only resolves the references; its symbols stay hidden, so a program's own C++
//! exceptions keep using `libgcc_s`.
//!
//! How: a linker script named `libgcc_s.so` in the build's output directory, searched before
//! the compiler's directories, that names the static libraries instead. Only the `cdylib`
//! link sees it; tests and binaries link as before.

use std::path::PathBuf;

pub fn link_unwinder_statically() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("libgcc_s.so"), "/* the unwinder, statically */\nINPUT ( -lgcc_eh -lgcc )\n").unwrap();
    println!("cargo:rustc-link-arg-cdylib=-L{}", out.display());
    println!("cargo:rerun-if-changed=../static_unwinder.rs");
}
