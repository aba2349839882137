# The README's two commands: `make demo` (the main job: every experiment of the benchmark command
# at a small default size) and `make test` (every test; installs what it needs on a fresh machine).
# CI (.ci/run) calls `make test`. `make install` / `make uninstall`: the C library, the preload
# library, the header, the pkg-config file and the `fallow` command, under PREFIX (and DESTDIR).
.PHONY: demo test test-lint test-rust test-debug test-loom test-bench test-capi test-small test-install numpy-full-suite \
	build install uninstall

# small and burst run fallow through its preload library, found beside the `fallow` binary.
demo:
	cargo build --release -p fallow-preload
	cargo run --release -p fallow-bench -- demo

# Every phase below, each through scripts/phase.sh: a line when it starts, one every 50 s while
# it runs, and one when it ends with its counts (cargo tests passed and failed, script checks)
# and duration. scripts/test-preflight.sh first says what will be installed and that apt-get
# needs root. Temporary files go to target/test-tmp (TMPDIR), removed at the end: nothing is left
# in /tmp. One dependency tree, the release profile's, for every phase (clippy's check pass
# aside): test-debug turns debug assertions on for the core alone, test-loom is a feature of the
# core; only `cargo package`'s verifying build (test-install) builds the core's four small
# dependencies in the dev profile.
PHASES = test-lint test-rust test-debug test-loom test-bench test-capi test-small test-install
test:
	@scripts/test-preflight.sh
	@rm -rf target/test-tmp && mkdir -p target/test-tmp
	@for p in $(PHASES); do \
		TMPDIR=$(CURDIR)/target/test-tmp scripts/phase.sh $$p $(MAKE) --no-print-directory $$p || exit 1; \
	done
	@rm -rf target/test-tmp
	@echo "== make test: all phases passed"

# clippy over every crate and target, warnings as errors: with the crates' own lints, every
# `unsafe` block carries a SAFETY comment, every unsafe fn a `# Safety` section, and no unsafe
# operation hides in an unsafe fn without a block of its own. The loom models (tests/loom/)
# build only with the `loom` feature: a second run lints them, sharing the first's dependencies.
test-lint:
	cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
	cargo clippy --workspace --all-targets --release -- -D warnings
	cargo clippy -p fallow --release --features loom --test loom -- -D warnings

# Every crate's unit and integration tests (core, reporting, zeroing, caches, bench, C API adapter).
test-rust:
	cargo test --workspace --release

# The core again with debug assertions and overflow checks on: in the release profile with both
# turned on for the core only, so that its dependencies are the release build's (only the core
# and its tests are built again; its artifacts carry their own hash beside the release ones).
test-debug:
	cargo test -p fallow --release --config 'profile.release.package.fallow.debug-assertions=true' \
		--config 'profile.release.package.fallow.overflow-checks=true'

# loom model checks of the lock-free protocols (crates/fallow/tests/loom/; docs/design.md,
# "Model-checked protocols"). The `loom` feature swaps the atomics of the real protocol code for
# loom's; only the core and loom are built again, the other dependencies are test-rust's. Bound 4
# checks in about 15 s here; `--nocapture` shows how many executions each model explored.
test-loom:
	LOOM_MAX_PREEMPTIONS=4 cargo test -p fallow --release --features loom --test loom -- --test-threads=1 --nocapture

# The benchmark command, every experiment once at a tiny size (no timing asserted).
test-bench:
	scripts/test-bench.sh

# The C API (static and shared, through pkg-config) and the LD_PRELOAD library: C tests, redis-server,
# and numpy's numpy._core tests with and without the preload (creates .venv).
test-capi:
	scripts/test-capi.sh

# The LD_PRELOAD library with small objects on (FALLOW_SMALL=1): the preload's C tests again, the
# small-object tests (every size, realloc across 256 KiB and the threshold, alignments, glibc's
# pointers, threads freeing each other's objects, thread exit, fork), bad frees that must abort,
# and real programs (python, sort, gcc, ls) with the same output as without the preload.
test-small:
	scripts/test-small.sh

# Not part of `make test` (about 15 minutes): numpy's whole test suite with and without the preload.
numpy-full-suite:
	scripts/numpy-full-suite.sh

# Installation as C users expect: `make install PREFIX=/usr/local` (the default), with DESTDIR
# for staging (paths inside the installed files name PREFIX, not DESTDIR). `make uninstall` with
# the same PREFIX and DESTDIR removes exactly the files listed in INSTALLED (directories stay, as
# they may hold other packages' files). scripts/test-install.sh checks both.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
INSTALLED = $(BINDIR)/fallow $(LIBDIR)/libfallow.so $(LIBDIR)/libfallow.a $(LIBDIR)/libfallow_preload.so \
	$(INCLUDEDIR)/fallow.h $(PKGCONFIGDIR)/fallow.pc

# `sudo make install` where root has no cargo installs what `make build` built before.
build:
	@if command -v cargo >/dev/null 2>&1; then \
		cargo build --release -p fallow-capi -p fallow-preload -p fallow-bench; \
	else \
		echo "cargo not found: installing what target/release holds (run 'make build' first)"; \
	fi

install: build
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(INCLUDEDIR)" "$(DESTDIR)$(PKGCONFIGDIR)"
	install -m 755 target/release/fallow "$(DESTDIR)$(BINDIR)/fallow"
	install -m 755 target/release/libfallow.so target/release/libfallow_preload.so "$(DESTDIR)$(LIBDIR)/"
	install -m 644 target/release/libfallow.a "$(DESTDIR)$(LIBDIR)/"
	install -m 644 include/fallow.h "$(DESTDIR)$(INCLUDEDIR)/"
	sed -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(VERSION)|' \
		crates/fallow-capi/fallow.pc.in > "$(DESTDIR)$(PKGCONFIGDIR)/fallow.pc"
	chmod 644 "$(DESTDIR)$(PKGCONFIGDIR)/fallow.pc"

uninstall:
	rm -f $(addprefix "$(DESTDIR),$(addsuffix ",$(INSTALLED)))

# `make install` and `make uninstall` into temporary prefixes (with and without DESTDIR), the C
# API's tests built against the installed pkg-config file, `cargo package -p fallow`, `cargo doc`
# without warnings, and the README's links (inside the repository, resolving).
test-install:
	scripts/test-install.sh
