//! Writes `fallow.pc` (pkg-config) next to the libraries in the target directory, from
//! `fallow.pc.in`, with the repository's `include/` and the target directory as paths, and
//! links the unwinder into `libfallow.so` (`../static_unwinder.rs`).

use std::path::PathBuf;

#[path = "../static_unwinder.rs"]
mod static_unwinder;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().parent().unwrap().to_path_buf();
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: the profile directory is 3 up.
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let libdir = out.ancestors().nth(3).unwrap().to_path_buf();
    let template = std::fs::read_to_string(manifest.join("fallow.pc.in")).unwrap();
    let pc = template
        .replace("@INCLUDEDIR@", &root.join("include").display().to_string())
        .replace("@LIBDIR@", &libdir.display().to_string())
        .replace("@VERSION@", &std::env::var("CARGO_PKG_VERSION").unwrap());
    std::fs::write(libdir.join("fallow.pc"), pc).unwrap();
    static_unwinder::link_unwinder_statically();
    println!("cargo:rerun-if-changed=fallow.pc.in");
    println!("cargo:rerun-if-changed=build.rs");
}
