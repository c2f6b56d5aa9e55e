# hearth — the commands a newcomer types:
#   make run    set up, build, and serve the built-in model
#   make check  build, then the unit and end-to-end tests without sanitizers or
#               fuzzing: the edit-test loop (a few minutes)
#   make test   set up, build (normal, ASan+UBSan, fuzz), and run the whole suite:
#               before pushing (what CI runs, .ci/run)
#   make install [PREFIX=/usr/local] [DESTDIR=...]   binary, libhearth.a + hearth.h,
#               pkg-config file, built-in model, CUDA backend
SHELL := /bin/bash
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local
# make's start, and a line saying how long it has run when a phase ends (the
# phases' times in make test's output)
T0 := $(shell date +%s)
phase = @echo "make: $(1) done at +$$(( $$(date +%s) - $(T0) )) s"

.PHONY: all build run test check setup setup-test clean asan fuzz fuzz-long install

all: build

setup:
	@tools/setup.sh

setup-test:
	@tools/setup.sh --test
	@tools/fetch_test_deps.sh
	$(call phase,setup)

build: setup
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)

run: build
	./build/hearth serve

install: build
	cmake --install build --prefix "$(PREFIX)"

asan: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHEARTH_SANITIZE=ON -DHEARTH_CUDA=OFF >/dev/null
	cmake --build build-asan --target unit_tests -j $(JOBS)
	$(call phase,asan)

fuzz: setup-test
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEARTH_FUZZ=ON -DHEARTH_WERROR=OFF -DHEARTH_CUDA=OFF >/dev/null
	cmake --build build-fuzz --target fuzz_all -j $(JOBS)
	$(call phase,fuzz)

# Every fuzz target for FUZZ_SECONDS (default 300) each, from its seeds and the
# corpus grown by earlier runs; crashes are saved as build-fuzz/crash-*.
FUZZ_SECONDS ?= 300
fuzz-long: fuzz
	@set -e; mkdir -p build-fuzz/corpus; for f in build-fuzz/fuzz/fuzz_*; do \
	  n=$$(basename $$f); s=$${n#fuzz_}; mkdir -p build-fuzz/corpus/$$s; \
	  echo "fuzz-long: $$n for $(FUZZ_SECONDS) s"; \
	  (cd build-fuzz && ./fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 \
	    -print_final_stats=1 corpus/$$s $(CURDIR)/tests/fuzz/seeds/$$s); done

test: setup-test asan fuzz
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DHEARTH_ASAN_DIR=$(CURDIR)/build-asan \
	      -DHEARTH_FUZZ_DIR=$(CURDIR)/build-fuzz $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)
	$(call phase,build)
	@# ctest lists skipped tests (the GPU ones, without a GPU) after its summary: repeat the summary last
	cd build && ctest --output-on-failure -j $(JOBS) 2>&1 | tee ctest.log; rc=$${PIPESTATUS[0]}; \
	  echo "make: ctest done at +$$(( $$(date +%s) - $(T0) )) s"; \
	  grep -E '^[0-9]+% tests passed' ctest.log | tail -n 1; exit $$rc

# The unit and end-to-end tests of the normal build: no ASan+UBSan build, no fuzz
# targets (a build folder that make test configured also skips its sanitizers
# and fuzz tests here).
check: setup-test build
	cd build && ctest --output-on-failure -j $(JOBS) -LE '^(sanitizers|fuzz)$$' 2>&1 | tee ctest.log; rc=$${PIPESTATUS[0]}; \
	  echo "make: ctest done at +$$(( $$(date +%s) - $(T0) )) s"; \
	  grep -E '^[0-9]+% tests passed' ctest.log | tail -n 1; exit $$rc

clean:
	rm -rf build build-asan build-fuzz
