# The two commands a newcomer needs:  make demo  (runs the main job)  and  make test  (builds, runs every test).
# Both install the Debian packages they need first (scripts/install-deps.sh).

BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
HETRA := $(BUILD)/tools/hetra/hetra

# ccache where it is installed: every build below is configured anew in a fresh clone (CI's), and
# six of them cold take most of make test on two cores. The base dir is this clone's root, so a
# second clone of the same sources reuses the objects; hash_dir off for the same reason (-g builds).
# The training layer's precompiled header (torch/torch.h) is cacheable only with pch_defines and
# time_macros sloppiness.
ifneq ($(shell command -v ccache),)
LAUNCHER := -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
endif

.PHONY: all deps build test test-python test-asan test-tsan test-fuzz test-mpi build-cuda build-rocm demo bench image format clean

all: build

deps:
	@scripts/install-deps.sh build

build: deps
	@cmake -S . -B $(BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Every test; the Python package's; then the communication, store, authentication, rank-environment,
# training, launcher, CLI, elastic and config tests again under AddressSanitizer + UBSan and the
# communication tests under ThreadSanitizer; then each fuzz target for FUZZ_SECONDS; then the MPI
# transport; then the CUDA build where the toolkit is installed and the ROCm build where hipcc is.
# Each ctest run (and pytest) leaves a JUnit report; the last line of make test adds them all up.
JUNIT := ctest-junit.xml
PYTEST_JUNIT := pytest-junit.xml
test: build
	@rm -f $(BUILD)/$(PYTEST_JUNIT) $(addsuffix /$(JUNIT),$(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(MPI_BUILD) $(CUDA_BUILD) $(ROCM_BUILD))
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 300 --output-junit $(JUNIT)
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-tsan
	@$(MAKE) --no-print-directory test-fuzz
	@$(MAKE) --no-print-directory test-mpi
	@$(MAKE) --no-print-directory build-cuda
	@$(MAKE) --no-print-directory build-rocm
	@scripts/test-summary.sh $(BUILD)/$(PYTEST_JUNIT) $(addsuffix /$(JUNIT),$(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(MPI_BUILD) $(CUDA_BUILD) $(ROCM_BUILD))

# The Python package (python/): hetra._core from this build, its tests with pytest on real processes
# (Debian's interpreter: the first python3 on PATH may not see Debian's torch and pytest).
test-python: build
	@cmake --build $(BUILD) -j $(JOBS) --target hetra_core hetra
	HETRA_PYTHON_PATH=$(CURDIR)/$(BUILD)/python HETRA_BINARY=$(CURDIR)/$(HETRA) /usr/bin/python3 -m pytest -q python/tests --junitxml=$(CURDIR)/$(BUILD)/$(PYTEST_JUNIT)

# The sanitizer runs pick their tests by ctest label: tests/CMakeLists.txt assigns every test its
# label, and its target tests-LABEL builds that label's binaries (ctest builds nothing).
empty :=
space := $(empty) $(empty)
label-targets = $(addprefix tests-,$(1))
label-regex = ^($(subst $(space),|,$(strip $(1))))$$

# One AddressSanitizer + UBSan build for every layer: our code instrumented, LibTorch as Debian
# built it. The communication, store and rank-environment tests, then the training tests, the
# launcher and CLI tests (tools: they run this build's hetra binary, so elastic runs train) and the
# config tests.
ASAN_LABELS := comm store launch train tools config
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=Debug -DHETRA_WITH_TORCH=ON -DHETRA_SANITIZE=address >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(call label-targets,$(ASAN_LABELS))
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) --timeout 600 -L "$(call label-regex,$(ASAN_LABELS))" --output-junit $(JUNIT)

# The thread sanitizer build leaves LibTorch out: it checks our communication code, not LibTorch's.
TSAN_LABELS := comm
test-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=Debug -DHETRA_WITH_TORCH=OFF -DHETRA_SANITIZE=thread >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(call label-targets,$(TSAN_LABELS))
	TSAN_OPTIONS=suppressions=$(CURDIR)/tests/tsan.supp ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) --timeout 600 -L "$(call label-regex,$(TSAN_LABELS))" --output-junit $(JUNIT)

# The MPI transport (HETRA_WITH_MPI, Open MPI) under mpirun with 3 and 4 ranks.
MPI_BUILD ?= build-mpi
test-mpi: deps
	@cmake -S . -B $(MPI_BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHETRA_WITH_TORCH=OFF -DHETRA_WITH_MPI=ON >/dev/null
	@cmake --build $(MPI_BUILD) -j $(JOBS) --target $(call label-targets,mpi)
	ctest --test-dir $(MPI_BUILD) --output-on-failure --timeout 300 -L "$(call label-regex,mpi)" --output-junit $(JUNIT)

# The CUDA build (NCCL transport, codec kernels, staging) compiles wherever the CUDA toolkit is
# installed, so it never rots; its tests need a GPU (scripts/gpu-check.sh) and run only where one is.
CUDA_BUILD ?= build-cuda
NVCC ?= $(shell command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
build-cuda: deps
	@if [ -z "$(NVCC)" ]; then echo "build-cuda: skipped, no CUDA toolkit (nvcc) on this machine"; else \
	  cmake -S . -B $(CUDA_BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHETRA_WITH_TORCH=OFF -DHETRA_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) >/dev/null && \
	  cmake --build $(CUDA_BUILD) -j $(JOBS) --target hetra_cuda test_cuda test_gpu_kernels hetra-gpu-check && \
	  if nvidia-smi -L >/dev/null 2>&1; then \
	    ctest --test-dir $(CUDA_BUILD) --output-on-failure -L gpu --output-junit $(JUNIT); \
	  else echo "build-cuda: built; its GPU tests not run, no GPU on this machine"; fi; fi

# The ROCm build (HETRA_WITH_ROCM: the codec kernels and the staging as HIP for AMD GPUs) compiles
# wherever hipcc is installed (scripts/install-deps.sh installs Debian's); clang compiles the HIP
# sources, the one hipcc runs (Debian 12: clang++-15). Its GPU tests run only where an AMD GPU is.
ROCM_BUILD ?= build-rocm
HIPCC ?= $(shell command -v hipcc)
HIP_CXX ?= $(shell command -v clang++-15)
build-rocm: deps
	@if [ -z "$(HIPCC)" ] || [ -z "$(HIP_CXX)" ]; then echo "build-rocm: skipped, no hipcc and its clang on this machine"; else \
	  cmake -S . -B $(ROCM_BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHETRA_WITH_TORCH=OFF -DHETRA_WITH_PYTHON=OFF -DHETRA_WITH_ROCM=ON -DCMAKE_CXX_COMPILER=$(HIP_CXX) >/dev/null && \
	  cmake --build $(ROCM_BUILD) -j $(JOBS) --target hetra_rocm test_gpu_kernels && \
	  if [ -e /dev/kfd ]; then \
	    ctest --test-dir $(ROCM_BUILD) --output-on-failure -L gpu --output-junit $(JUNIT); \
	  else echo "build-rocm: built; its GPU tests not run, no AMD GPU on this machine"; fi; fi

# libFuzzer targets (clang) of fuzz/: the config parser and every wire-frame decoder, briefly each.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 8
test-fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHETRA_WITH_TORCH=OFF -DHETRA_BUILD_TESTS=OFF -DHETRA_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers
	fuzz/run-smoke.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# The main job: three emulated devices of speeds 1, 1/2 and 1/4 train an MLP on Fashion-MNIST.
demo: build
	$(HETRA) probe
	$(HETRA) run examples/fashion_mnist_hetero.toml --metrics $(BUILD)/demo-metrics.jsonl \
	  --timeline $(BUILD)/demo-trace.json
	$(HETRA) report $(BUILD)/demo-metrics.jsonl --timeline $(BUILD)/demo-trace.json -o $(BUILD)/demo-report

# Side-by-side comparison with Open MPI and torch.distributed (gloo); see bench/README.md.
bench: build
	@scripts/install-deps.sh bench
	bench/compare_allreduce.sh

# The CPU container image from the binary `make` built (docs/deployment.md): buildah bud, chroot
# isolation; the base is a Debian 12 root made by debootstrap (cached) unless IMAGE_BASE names one.
IMAGE ?= localhost/hetra:cpu
IMAGE_BASE ?= localhost/hetra-debian12-base
image: build
	scripts/build-image.sh $(HETRA) $(IMAGE) $(IMAGE_BASE)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(MPI_BUILD) $(CUDA_BUILD) $(ROCM_BUILD)
