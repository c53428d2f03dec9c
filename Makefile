# The front door. `make demo` and `make test` each work on a fresh Debian 12 machine:
# they install what is needed (scripts/install_deps.sh), build, and run.
PRESET ?= release
BUILD_DIR := build/$(PRESET)
JOBS ?= $(shell nproc)
BIN := $(BUILD_DIR)/bin/paratrain

.PHONY: all deps build demo test bench clean

all: build

deps:
	bash scripts/install_deps.sh

build: deps
	cmake --preset $(PRESET) > /dev/null
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	bash scripts/demo.sh $(BIN)

test: build
	bash scripts/test.sh $(BUILD_DIR)

bench: build
	cmake --build $(BUILD_DIR) -j $(JOBS) --target paratrain_benchmarks
	bash bench/run_all.sh $(BUILD_DIR)

clean:
	rm -rf build
