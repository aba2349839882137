//! Links the unwinder into the library (`../static_unwinder.rs`).

#[path = "../static_unwinder.rs"]
mod static_unwinder;

fn main() {
    static_unwinder::link_unwinder_statically();
    println!("cargo:rerun-if-changed=build.rs");
}
