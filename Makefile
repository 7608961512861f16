# The two commands of the README:
#   make demo   set up what is missing (scripts/setup.sh demo), build, then run a real CUDA
#               program through Phos (on the GPU where there is one, else on the emu backend)
#               and say what happened, and move a running program between two routers (live
#               migration), its output compared with an uninterrupted run's
#   make test   set up what is missing (scripts/setup.sh test), then everything CI checks:
#               formatting, clippy, the unit tests, the end-to-end tests with real
#               nvcc-built programs, and the ring protocol's model checking (make loom)
# scripts/setup.sh installs missing tools with apt (as root or through sudo), or stops and
# prints the commands to run; it is silent when everything is there.

CARGO ?= cargo
DEMO_PROGRAM ?= vector_add
SETUP := scripts/setup.sh
# The environment the tests read (the CUDA header directories), written by the set-up.
SETUP_ENV := target/setup.env

.PHONY: build release test fmt-check clippy demo gpu-bins fuzz loom

build:
	@$(SETUP) build
	$(CARGO) build --workspace

release:
	@$(SETUP) build
	$(CARGO) build --workspace --release

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# One recipe, so that the set-up comes first even under `make -j`.
test:
	@$(SETUP) test
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) build --workspace
	. ./$(SETUP_ENV) && $(CARGO) test --workspace
	$(MAKE) loom

# The shared-memory ring's protocol under the loom model checker (protocol/src/ring.rs): every
# interleaving and weak-memory outcome of a producer and a consumer. `--cfg loom` changes how
# every crate builds, so it has a target directory of its own.
loom:
	RUSTFLAGS="--cfg loom" $(CARGO) test -p phos-protocol --release --lib --target-dir target/loom ring::loom_tests

demo:
	@$(SETUP) demo
	$(CARGO) build --workspace --release
	@scripts/demo.sh $(DEMO_PROGRAM)

# Every fuzz target for FUZZ_SECONDS each (docs/fuzzing.md), after the set-up the seeds need
# (nvcc, clang, a C++ compiler for libFuzzer); fails on a crash, a hang or a runaway
# allocation, leaving the input in fuzz/artifacts/.
FUZZ_SECONDS ?= 20
fuzz:
	@$(SETUP) demo
	fuzz/run $(FUZZ_SECONDS)

# Release binaries for the GPU machine (which has no Rust), in .device/bin.
gpu-bins: release
	@mkdir -p .device/bin
	for f in phosctl phos-api-server libphos_guest.so libphos_audit.so; do strip -o .device/bin/$$f target/release/$$f; done
