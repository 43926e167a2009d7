# Quick start:  make run   (install deps, build, run the two-process benchmark)
#               make test  (install deps, build, run every test incl. sanitizers and fuzzing)
.PHONY: bench-gpu test-gpu test-ray python-package bench-python bench-engines bench-lookup bench-torch test-engines test-python-asan all deps deps-test deps-bench deps-guest build run install test test-release test-python test-asan test-tsan test-fuzz \
        test-package test-browser test-loaded test-rdma test-rdma-sanitized test-rdma-wire bench-rdma-wire bench-rdma bench-rdma-stream check-layers bench-compare format tidy clean

JOBS ?= $(shell nproc)
FUZZ_RUNS ?= 300000
PREFIX ?= /usr/local

all: build

# What each purpose needs (scripts/install-deps.sh): building with the tools, testing, benching.
deps:
	@bash scripts/install-deps.sh tools
deps-test:
	@bash scripts/install-deps.sh test
deps-bench:
	@bash scripts/install-deps.sh bench
deps-guest:
	@bash scripts/install-deps.sh tools guest

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

run: build
	./build/release/tools/ferry bench

install: build
	cmake --install build/release --prefix $(PREFIX)

test: deps-test check-layers test-release test-package test-python test-ray test-engines test-browser tidy test-rdma test-asan test-tsan test-rdma-sanitized test-rdma-wire test-python-asan test-fuzz
	@echo "all test suites passed (layers, release, packaging, python, ray, engines side by side, browser, clang-tidy, soft-roce guest, asan+ubsan, tsan, asan+ubsan and tsan guest, two guests over a wire, python under asan+ubsan, fuzz)"
	@echo "suites: 15 passed, 0 failed"

# The whole suite with two CPU-bound processes beside it, as on a busy machine: no assertion may
# depend on timing (run this before resolving anything that touches threads or timeouts).
test-loaded:
	@bash scripts/with-cpu-hogs.sh 2 $(MAKE) test

# ctest runs JOBS tests at once: most wait on peers, timers or children, and every test picks its
# own ports, files and data directories, so they share a machine as they would a busy one.
test-release: deps-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)
	ctest --preset release -j $(JOBS)

test-asan: deps-test
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# The TSan build carries line tables only (-g1, CMakePresets.json): its reports need no more, and
# its compile takes ~40% less time than with -g (stream_test.cpp: 9.4 s against 17.2 s).
test-tsan: deps-test
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan -j $(JOBS)

test-fuzz: deps-test
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS) --target ferry_fuzz_decoders
	mkdir -p build/fuzz/corpus
	./build/fuzz/tests/ferry_fuzz_decoders -runs=$(FUZZ_RUNS) -seed=1 -max_len=512 build/fuzz/corpus

# Real ibverbs in a qemu guest with Soft-RoCE (tests/rdma/README.md): the project's binaries
# plus perftest's self-check, in one boot.
test-rdma: deps-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)
	mkdir -p build/rdma-guest
	cat tests/rdma/ferry.tests tests/rdma/perftest.tests > build/rdma-guest/suite.tests
	bash tests/rdma/run-guest.sh --tests build/rdma-guest/suite.tests --timeout 900 \
	  --bin build/release/tools/ferry --bin build/release/tests/ferry_unit_tests \
	  --bin build/release/tests/ferry_verbs_tests --bin build/release/tests/ferry_integration_tests \
	  --bin build/release/tests/ferry_test_target

# The verbs suite and the message tests built with ASan+UBSan and with TSan, in the guest (after
# test-asan and test-tsan built them): the verbs data path exists only there.
test-rdma-sanitized: deps-test
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS) --target ferry_verbs_tests ferry_integration_tests
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS) --target ferry_verbs_tests ferry_integration_tests
	mkdir -p build/rdma-guest/sanitized
	for s in asan tsan; do for t in ferry_verbs_tests ferry_integration_tests; do \
	  cp build/$$s/tests/$$t build/rdma-guest/sanitized/$${t}_$$s; done; done
	bash tests/rdma/run-guest.sh --tests tests/rdma/sanitized.tests --timeout 1200 \
	  --bin build/rdma-guest/sanitized/ferry_verbs_tests_asan \
	  --bin build/rdma-guest/sanitized/ferry_integration_tests_asan \
	  --bin build/rdma-guest/sanitized/ferry_verbs_tests_tsan \
	  --bin build/rdma-guest/sanitized/ferry_integration_tests_tsan

# Two guests joined by an emulated wire (lossless, then lossy): faults injected while a probe's
# operations are in flight, with a healthy peer beside; ferry bench across the wire beside
# perftest (WIRE_ROUNDS rounds; make bench-rdma-wire runs three). tests/rdma/README.md.
WIRE_ROUNDS ?= 1
test-rdma-wire: deps-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target ferry_cli ferry_test_target ferry_wire_probe
	python3 tests/rdma/two-guest.py --rounds $(WIRE_ROUNDS) --bin build/release/tools/ferry \
	  --bin build/release/tests/ferry_test_target --bin build/release/tests/ferry_wire_probe
bench-rdma-wire:
	$(MAKE) test-rdma-wire WIRE_ROUNDS=3

# ferry stream over verbs beside ferry bench write, and the emulator through a verifying stream
# for 60 s, in one guest run (tests/rdma/stream-bench.tests); prints the ratio.
bench-rdma-stream: deps-guest
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target ferry_cli
	bash tests/rdma/run-guest.sh --tests tests/rdma/stream-bench.tests --timeout 900 \
	  --bin build/release/tools/ferry --bin tests/rdma/guest/stream-bench.sh
	python3 tests/rdma/ratios.py build/rdma-guest/last-run.log --present

# Ferry over verbs against perftest, in one guest run; prints ratios.
bench-rdma: deps-guest
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)
	bash tests/rdma/run-guest.sh --tests tests/rdma/bench.tests --timeout 900 --bin build/release/tools/ferry
	python3 tests/rdma/ratios.py build/rdma-guest/last-run.log

# Ferry as another project uses it: install layout, find_package, pkg-config, add_subdirectory,
# FetchContent, and every cpp block of the README.
test-package: test-release
	bash tests/package/run.sh build/release

# The Python package as a user gets it: pip install . into a virtual environment (the build
# directory build/python-* is kept between runs), then its pytest suite and every example.
VENV ?= build/venv
# Debian's interpreter, whose site packages hold the suite's torch (scripts/install-deps.sh);
# the venv sees them, and pip adds only what they lack.
SYSTEM_PYTHON ?= /usr/bin/python3
# What the Python suites require rather than skip: torch, and the CUDA stand-in the GPU cases
# load as libcuda.so.1 (python/tests/test_cuda.py).
PYTHON_TEST_ENV = FERRY_REQUIRE_TORCH=1 FERRY_REQUIRE_CUDA_STANDIN=1 \
  FERRY_CUDA_STANDIN=$(CURDIR)/build/release/tests/cuda-standin
# The pytest suite (torch included), then `pip wheel .` (the compile cached in the same build
# folder) installed alone into a venv of its own, running an example.
test-python: deps-test
	test -x $(VENV)/bin/python || $(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q ".[test]"
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target ferry_cuda_standin
	cd python/tests && $(PYTHON_TEST_ENV) ../../$(VENV)/bin/python -m pytest -q -p no:cacheprovider .
	rm -rf build/wheels build/venv-wheel
	$(VENV)/bin/python -m pip wheel -q --no-deps -w build/wheels .
	$(SYSTEM_PYTHON) -m venv --system-site-packages build/venv-wheel
	build/venv-wheel/bin/python -m pip install -q --no-deps build/wheels/ferry-*.whl
	cd build && venv-wheel/bin/python ../examples/python/p2p_write.py

# The live gauge page in headless Chromium (tests/browser): its rate follows `ferry gauge`'s UDP
# input and a running `ferry stream --web`; screenshots land in build/ (gauge-*.png). And the
# stream's /metrics, read by prometheus_client's parser, against the bytes it moved.
test-browser: deps-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target ferry_cli
	test -x $(VENV)/bin/python || $(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q pytest selenium prometheus_client
	FERRY=build/release/tools/ferry FERRY_ARTIFACTS=build $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/browser

# The CUDA suite (tests/cuda) against the real driver, on a machine with a GPU: make test runs it
# against the stand-in (docs/gpu.md). Refuses to start where no CUDA driver answers.
test-gpu: deps-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target ferry_cli ferry_cuda_tests
	build/release/tools/ferry info | grep -A9 '^gpus (CUDA driver' || \
	  { echo "test-gpu: no CUDA driver here (ferry info says why)"; exit 1; }
	build/release/tests/ferry_cuda_tests

# The same suite against an ASan+UBSan build of the extension (its own venv and build folder).
test-python-asan: deps-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target ferry_cuda_standin
	$(PYTHON_TEST_ENV) SYSTEM_PYTHON=$(SYSTEM_PYTHON) bash scripts/test-python-asan.sh

# The package as it is now, in build/venv, for the Python benchmarks.
python-package: build
	test -x $(VENV)/bin/python || $(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q .

# Ferry beside NIXL and Mooncake (PyPI wheels in build/venv-peers), interleaved, three rounds,
# ratios printed (bench/compare_engines.sh; docs/performance.md, "Against other engines").
bench-engines: python-package
	bash bench/compare_engines.sh

# Ferry as Ray's tensor transport on a local Ray cluster (python/tests/test_ray.py): Ray from PyPI
# in a venv of its own, with the wheel test-python built (Ray's dependencies stay out of the
# main suite's venv).
RAY_VERSION ?= 2.60.0
test-ray: test-python
	test -x build/venv-ray/bin/python || $(SYSTEM_PYTHON) -m venv --system-site-packages build/venv-ray
	build/venv-ray/bin/python -m pip install -q "ray==$(RAY_VERSION)" pytest
	build/venv-ray/bin/python -m pip install -q --no-deps --force-reinstall build/wheels/ferry-*.whl
	cd python/tests && FERRY_REQUIRE_RAY=1 ../../build/venv-ray/bin/python -m pytest -q -p no:cacheprovider test_ray.py

# The same in its fast mode (one shape, one round), after test-python installed the package: the
# script and every driver still work; a peer that cannot be installed is reported as skipped.
test-engines: test-python
	bash bench/compare_engines.sh --fast

# Discovery: resolve, region_named and connect_named through an etcd of its own beside a direct
# connect, p50 and p99 (bench/compare_lookup.sh; docs/discovery.md, "Lookup latency").
bench-lookup: deps-test build
	bash bench/compare_lookup.sh

# The torch.distributed backend: batch_isend_irecv of 64 x 1 MiB between two torchrun ranks beside
# Ferry's C++ batch write and gloo, over TCP and shm (bench/compare_torch.sh).
bench-torch: deps-test python-package
	bash bench/compare_torch.sh

# What the Python package adds over the C++ API, side by side (docs/performance.md).
bench-python: build test-python
	$(VENV)/bin/python bench/python_overhead.py build/release/tools/ferry
	$(VENV)/bin/python bench/python_asyncio.py build/release/tools/ferry

check-layers:
	@bash scripts/check-layers.sh

bench-compare: deps-bench build
	bash bench/compare_tcp.sh
	bash bench/compare_shm.sh
	bash bench/compare_msgrate.sh

# The GPU paths beside their parts (bench/compare_gpu.sh): against the CUDA stand-in where no GPU
# driver answers.
bench-gpu: build
	bash bench/compare_gpu.sh

format:
	find include src tools tests bench \( -name '*.cpp' -o -name '*.hpp' \) -print0 | xargs -0 clang-format -i

tidy: build
	run-clang-tidy -quiet -p build/release $(CURDIR)/src $(CURDIR)/tools

clean:
	rm -rf build
