# The README's two commands: `make demo` (the main job) and `make test` (every test; installs what
# it needs on a fresh machine). CI (.ci/run) calls `make test`.
.PHONY: demo test test-rust

demo:
	cargo run --release -p fallow --example quickstart

test: test-rust

test-rust:
	cargo test --workspace --release
