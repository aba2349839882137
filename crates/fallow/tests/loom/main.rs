//! Model checks of fallow's lock-free protocols with loom, which runs each model under every
//! interleaving (and every outcome the memory model allows of each atomic access) up to a bound
//! on preemptions: `make test-loom` (`LOOM_MAX_PREEMPTIONS=4`, `--features loom`, in the release
//! target directory, whose dependencies it shares). Without the `loom` feature this test is
//! empty. One file per protocol, below. What each model proves, and what it assumes, is in
//! docs/design.md ("Model-checked protocols", under "Threads and locks").
//!
//! - The worker word (`worker/mod.rs`): the REAL `Worker` code, built on loom's atomics and a futex
//!   modelled by a mutex and condition variable (`sync.rs`: the value is re-checked under the
//!   mutex, as `FUTEX_WAIT` does; timeouts are not modelled, so a lost wake-up is a deadlock that
//!   loom reports). The free path around it (`Allocator::wake_workers_after_free`, `asleep`,
//!   `Allocator::wake`) and the workers' loops (`report::run`, `zero::run`) are mirrored here.
//! - The per-thread cache's `busy` / `frozen` handshake (`cache/`), a cached block's hit
//!   paths against the reporter's drain and report of it (`cache/`, `report.rs`, `heap/`), the
//!   drain request's generations, the slab's remote frees against a span's owner (`slab/`), and
//!   `StartGate` (`start.rs`): standalone models that mirror the
//!   code line by line (the real code needs an allocator, or a kernel thread id per thread, which
//!   loom's threads do not have); each
//!   function says which one it mirrors. Each also runs with its protocol broken on purpose
//!   (an `#[ignore]`d test, run in a child process by `fails_in_child`), and loom must fail it,
//!   so that a model that stopped finding anything fails the suite.
#![cfg(feature = "loom")]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use fallow::loom_support::{futex_wait, futex_wake_all, Worker, IDLE, RUNNING};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// A model run with its protocol broken on purpose (`$broken`, `#[ignore]`d: run in a child
/// process) and the test `$check` that asserts loom fails it with a message containing
/// `$expected`, so that a model that stopped finding anything fails the suite.
macro_rules! broken_on_purpose {
    ($broken:ident, $check:ident, $expected:literal, $model:expr) => {
        #[test]
        #[ignore = "broken on purpose: run in a child process by the test that checks loom fails it"]
        fn $broken() {
            $model;
        }

        #[test]
        fn $check() {
            fails_in_child(&test_path(module_path!(), stringify!($broken)), $expected);
        }
    };
}

// The models, one file per protocol (after the macro, which they use).
mod cached_block;
mod drain_request;
mod handshake;
mod slab_abandon;
mod slab_claim;
mod slab_remote;
mod start_gate;
mod worker;

use handshake::Handshake;

/// Run `f` under loom. The preemption bound comes from `LOOM_MAX_PREEMPTIONS` (the Makefile
/// sets 4); without it, 4 here too, so that a bare `cargo test` stays quick (seconds).
/// Prints how many executions (interleavings and load outcomes) loom explored.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(4);
    }
    // A plain std atomic: counted across loom's executions, outside the model.
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    let name = std::thread::current().name().unwrap_or("model").to_string();
    println!("{name}: {} executions explored", runs.load(std::sync::atomic::Ordering::Relaxed));
}

/// The harness's name of test `name` in module `module` (`module_path!()`, which begins with
/// this test crate's name, which the harness leaves out).
fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, m)) => format!("{m}::{name}"),
        None => name.to_string(),
    }
}

// ---- Broken protocols must fail ----

/// Run the `#[ignore]`d test `name` (a model of a protocol broken on purpose) in a child process
/// of this test binary, and check that loom failed it with `expected` in its report. A child
/// process, because a model that loom fails while threads are blocked (a deadlock) aborts the
/// process: unwinding drops loom objects outside the execution, a panic during a panic.
fn fails_in_child(name: &str, expected: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--test-threads=1", "--nocapture"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "loom passed the broken model {name}:\n{report}");
    assert!(report.contains(expected), "loom failed {name}, but not with {expected:?}:\n{report}");
}
