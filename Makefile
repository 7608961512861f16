# The two commands of the README:
#   make demo   build, then run a real CUDA program through Phos (on the GPU where there is
#               one, else on the emu backend)
#   make test   everything CI checks: formatting, clippy, the unit tests, and the end-to-end
#               tests with real nvcc-built programs

CARGO ?= cargo
DEMO_PROGRAM ?= vector_add

.PHONY: build release test fmt-check clippy demo gpu-bins

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: fmt-check clippy build
	$(CARGO) test --workspace

demo: release
	@mkdir -p target/demo
	nvcc -cudart shared -O2 -Itests/cuda -o target/demo/$(DEMO_PROGRAM) tests/cuda/$(DEMO_PROGRAM).cu
	target/release/phosctl run -- target/demo/$(DEMO_PROGRAM)

# Release binaries for the GPU machine (which has no Rust), in .device/bin.
gpu-bins: release
	@mkdir -p .device/bin
	for f in phosctl phos-api-server libcudart.so; do strip -o .device/bin/$$f target/release/$$f; done
