# Thin wrapper over CMake for the README's two commands.
#   make demo   set up, build, and run `mlo demo` (the main job, built-in default)
#   make test   set up, build, and run the test suite
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# Warnings are errors in our own test builds (make test and its sanitizer
# runs), never for people who only build mlo: MLO_WERROR is off in CMake.
WERROR ?= OFF

.PHONY: all bootstrap torch-venv build demo test test-asan test-tsan test-install test-build-types clean

all: build

bootstrap:
	@bash scripts/bootstrap.sh

# The Python with torch, diffusers, transformers and peft that the mlo.torch
# tests run under (scripts/torch-venv.sh; `make test` installs it, MLO_TORCH=0
# skips it).  Where it exists, the build hands it to ctest.
TORCH_PYTHON = $(CURDIR)/.cache/torch-venv/bin/python
torch-venv: bootstrap
	@bash scripts/torch-venv.sh

build: bootstrap
	cmake -S . -B $(BUILD) -DMLO_WERROR=$(WERROR) \
	  $(if $(wildcard $(TORCH_PYTHON)),-DMLO_TORCH_PYTHON=$(TORCH_PYTHON)) $(CMAKE_FLAGS) > /dev/null
	cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

demo: build
	$(BUILD)/tools/mlo/mlo demo

# The suite, then the whole suite again under ASan+UBSan+LSan and the
# threaded tests under TSan (docs/reliability.md); any sanitizer report fails
# the run.  SANITIZE=0 skips the sanitizer builds (a quick local run).
SANITIZE ?= 1
test: WERROR = ON
test: torch-venv build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE '^(fuzz|slow)$$'
	$(MAKE) --no-print-directory test-install test-build-types
ifneq ($(SANITIZE),0)
	$(MAKE) --no-print-directory test-asan test-tsan
endif

# Install into a temporary prefix and build a consumer in C and C++, with
# pkg-config and find_package, static and shared, and as a subproject.
test-install:
	bash scripts/install-check.sh $(BUILD)

# Every build type, and one with a user's own sanitizer flags, warning-free
# (library and tool; the suite itself runs in the RelWithDebInfo build).
BUILD_TYPES = Debug Release MinSizeRel
test-build-types: bootstrap
	@for bt in $(BUILD_TYPES) user-sanitize; do \
	  flags="-DCMAKE_BUILD_TYPE=$$bt"; \
	  [ $$bt = user-sanitize ] && flags="-DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-fsanitize=address,undefined"; \
	  echo "build type $$bt"; \
	  cmake -S . -B build-types/$$bt $$flags -DMLO_WERROR=ON -DMLO_BUILD_TESTS=OFF \
	    -DMLO_BUILD_BENCH=OFF -DMLO_BUILD_EXAMPLES=OFF $(CMAKE_FLAGS) > /dev/null && \
	  cmake --build build-types/$$bt -j $(JOBS) -- --no-print-directory > build-types/$$bt.log 2>&1 || \
	  { cat build-types/$$bt.log; exit 1; }; \
	done

# Sanitizer runs.  Every program of a sanitizer build has these options
# built in as well (cmake/san_defaults.c; one BLAS thread through each
# test's own ctest environment), so `ctest` alone in build-asan or
# build-tsan passes too; the variables here say them again for any program
# run by hand.  OPENBLAS_NUM_THREADS=1: OpenBLAS's worker pool is not
# instrumented, so TSan cannot see its synchronization (false reports) and
# ASan cannot attribute its buffers; one BLAS thread also keeps ctest -j from
# oversubscribing a two-core CI machine.  allocator_may_return_null: an
# impossible allocation (a 4 EiB slab in core_hardening) must come back as
# NULL, which the library reports as MLO_ENOMEM, as libc does; ASan would
# abort instead.  The LSan suppressions name only
# third-party libraries (the OpenCL ICD loader, PoCL and its LLVM), never mlo.
SAN_ENV = OPENBLAS_NUM_THREADS=1 \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:allocator_may_return_null=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1
# TSan covers the threaded tests on the host platform only (OpenCL and CUDA
# are not built there): PoCL's and the CUDA runtime's own threads are not
# instrumented and would only add noise.  Only these targets are built.
TSAN_TESTS = core_concurrent core_random_switches C8_no_compute_race C9_no_free_race \
  C17_acquire_release platform_host fault_sweep race_sweep load_test core_hardening core_stream \
  core_progressive core_join \
  core_disk
empty :=
space := $(empty) $(empty)

test-asan: bootstrap
	cmake -S . -B build-asan -DMLO_SANITIZE=ON -DMLO_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) \
	  -LE '^(fuzz|fuzz-smoke|slow|bench)$$'

test-tsan: bootstrap
	cmake -S . -B build-tsan -DMLO_TSAN=ON -DMLO_WITH_CUDA=OFF -DMLO_WITH_OPENCL=OFF -DMLO_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)
	cd build-tsan && $(SAN_ENV) MLO_TEST_PLATFORM=host ctest --output-on-failure -j $(JOBS) \
	  -R '^($(subst $(space),|,$(strip $(TSAN_TESTS))))$$'

clean:
	rm -rf $(BUILD) build-asan build-tsan build-types
