# Replica — set-up and everyday commands. `make run` and `make test` work on a fresh machine (they run `setup`).
SHELL := /bin/bash
PACKAGES := libsqlite3-dev libsodium-dev pkg-config
SWIFT ?= swift
export SWIFT_DETERMINISTIC_HASHING := 1

.PHONY: setup build test run example bench bench-instructions clean

## setup: install the system packages Replica links (apt-get when root; otherwise print the command).
setup:
	@missing=""; for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "setup: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "setup: missing packages:$$missing"; \
	    echo "run: sudo apt-get update && sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

## build: debug build of every target.
build: setup
	$(SWIFT) build

## test: the whole test suite.
test: setup
	$(SWIFT) test

## run: the main job (until the simulator lands: the trips example host app).
run: setup
	$(SWIFT) run -c release trips-example

example: run

## bench: replica-bench in a release build, full sizes (several minutes). `make bench ARGS=--quick` runs reduced sizes
## in under two minutes; `ARGS="--json"` prints one JSON object per workload; `ARGS="--only B1,B3"` picks workloads.
## BUILD_FLAGS passes build options (e.g. BUILD_FLAGS="--scratch-path /tmp/build").
bench: setup
	$(SWIFT) build -c release $(BUILD_FLAGS) --product replica-bench
	$$($(SWIFT) build -c release $(BUILD_FLAGS) --show-bin-path)/replica-bench $(ARGS)

## bench-instructions: instruction counts (valgrind/callgrind) of each side's timed region, e.g.
## `make bench-instructions ARGS="B1 B3"` (quick sizes) or ARGS="--full B1": deterministic on a noisy machine.
bench-instructions: setup
	$(SWIFT) build -c release $(BUILD_FLAGS) --product replica-bench
	BIN=$$($(SWIFT) build -c release $(BUILD_FLAGS) --show-bin-path)/replica-bench Scripts/bench-instructions.sh $(ARGS)

clean:
	rm -rf .build
