# mixprec quick start: `make run` (set up, build, run the main job) and `make test` (set up, build, all tests).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DMP_WERROR=ON

.PHONY: setup configure build run test bench bench-suites clean

setup:
	./scripts/setup.sh

configure: setup
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/apps/mixprec/mixprec compare --dataset fashion-mnist --model resnet8 --epochs 5 --no-augment \
	  --runs fp32,bf16 --report report/main

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

bench: build
	./scripts/setup.sh --bench
	./bench/run_all.sh $(BUILD)

# The reference articles' experiments at --quick sizes, side by side with PyTorch where it applies;
# reports in report/bench-*. Full sizes are for a GPU: run the suites without --quick.
bench-suites: build
	./scripts/setup.sh --bench
	for s in op-breakdown lstm-impl lstm-sweep resnets opt-levels; do \
	  ./$(BUILD)/apps/mixprec/mixprec bench $$s --quick || exit 1; done
	./bench/compare_pytorch.sh $(BUILD) --quick

clean:
	rm -rf $(BUILD)
