# Thin wrapper over CMake for the README's two commands.
#   make demo   set up, build, and run `mlo demo` (the main job, built-in default)
#   make test   set up, build, and run the test suite
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all bootstrap build demo test test-asan test-tsan clean

all: build

bootstrap:
	@bash scripts/bootstrap.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: bootstrap $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

demo: build
	$(BUILD)/tools/mlo/mlo demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE '^(fuzz|slow)$$'

clean:
	rm -rf $(BUILD) build-asan build-tsan
