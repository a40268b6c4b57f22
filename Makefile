# The two commands a newcomer needs:  make demo  (runs the main job)  and  make test  (builds, runs every test).
# Both install the Debian packages they need first (scripts/install-deps.sh).

BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
HETRA := $(BUILD)/tools/hetra/hetra

.PHONY: all deps build test test-asan test-tsan demo bench format clean

all: build

deps:
	@scripts/install-deps.sh build

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Every test, then the communication tests again under AddressSanitizer + UBSan.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 300
	@$(MAKE) --no-print-directory test-asan

# The sanitizer builds leave LibTorch out: they check our communication code, not LibTorch's.
COMM_TESTS := test_reduce test_communicator test_shm_transport test_shared_algorithms \
              test_tcp_transport test_ring_algorithms

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHETRA_WITH_TORCH=OFF -DHETRA_SANITIZE=address >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(COMM_TESTS)
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) --timeout 600 -L comm

test-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHETRA_WITH_TORCH=OFF -DHETRA_SANITIZE=thread >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(COMM_TESTS)
	TSAN_OPTIONS=suppressions=$(CURDIR)/tests/tsan.supp ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) --timeout 600 -L comm

# The main job: three emulated devices of speeds 1, 1/2 and 1/4 train an MLP on Fashion-MNIST.
demo: build
	$(HETRA) probe
	$(HETRA) run examples/fashion_mnist_hetero.toml --metrics $(BUILD)/demo-metrics.jsonl

# Side-by-side comparison with Open MPI and torch.distributed (gloo); see bench/README.md.
bench: build
	@scripts/install-deps.sh bench
	bench/compare_allreduce.sh

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
