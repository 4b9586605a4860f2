# Replica — set-up and everyday commands. `make run` and `make test` work on a fresh machine (they run `setup`).
SHELL := /bin/bash
PACKAGES := libsqlite3-dev libsodium-dev libssl-dev pkg-config postgresql libpq-dev pgbouncer
SWIFT ?= swift
# Extra flags for swift build/test/run, e.g. `make test SWIFT_FLAGS="--scratch-path /tmp/build"`.
SWIFT_FLAGS ?=
export SWIFT_DETERMINISTIC_HASHING := 1

.PHONY: setup build test run example bench bench-instructions sim-bench docs clean

## setup: install the system packages Replica links, and PostgreSQL for the tests of its cloud (apt-get when root;
## otherwise print the command).
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
	$(SWIFT) build $(SWIFT_FLAGS)

## test: the whole test suite, beside a throwaway PostgreSQL cluster (Scripts/with-postgres.sh starts it in a temporary
## directory, exports REPLICA_TEST_POSTGRES_URL and REPLICA_REQUIRE_POSTGRES=1, and removes it afterwards).
test: setup
	Scripts/with-postgres.sh $(SWIFT) test $(SWIFT_FLAGS)

# Seeds per built-in scenario for `make run` (a few hundred: about five minutes on two cores).
SIM_SEEDS ?= 250

## run: the main job — simulate every built-in scenario (Simulations/*.json) over $(SIM_SEEDS) seeds in a release
## build, shrink and save any failure under Simulations/failures/, and print the summary table.
run: setup
	$(SWIFT) run $(SWIFT_FLAGS) -c release replica-sim explore --scenario all --seeds $(SIM_SEEDS)

## example: the example host app (trips-example).
example: setup
	$(SWIFT) run $(SWIFT_FLAGS) -c release trips-example

## sim-bench: simulator throughput on the trips scenario, one core (device operations per CPU second).
sim-bench: setup
	$(SWIFT) run $(SWIFT_FLAGS) -c release replica-sim explore --scenario trips --seeds 200 --jobs 1 --no-save

## bench: replica-bench in a release build, full sizes (several minutes). `make bench ARGS=--quick` runs reduced sizes
## in under two minutes; `ARGS="--json"` prints one JSON object per workload; `ARGS="--only B1,B3"` picks workloads.
bench: setup
	$(SWIFT) build -c release $(SWIFT_FLAGS) --product replica-bench
	$$($(SWIFT) build -c release $(SWIFT_FLAGS) --show-bin-path)/replica-bench $(ARGS)

## bench-instructions: instruction counts (valgrind/callgrind) of each side's timed region, e.g.
## `make bench-instructions ARGS="B1 B3"` (quick sizes) or ARGS="--full B1": deterministic on a noisy machine.
bench-instructions: setup
	$(SWIFT) build -c release $(SWIFT_FLAGS) --product replica-bench
	BIN=$$($(SWIFT) build -c release $(SWIFT_FLAGS) --show-bin-path)/replica-bench Scripts/bench-instructions.sh $(ARGS)

## docs: the DocC reference of Replica, ReplicaTesting and ReplicaPostgres with the toolchain's docc
## (Scripts/build-docs.sh: symbol graphs in .build/docs-build, archives in .build/docs); fails on a broken symbol link.
docs: setup
	SWIFT=$(SWIFT) Scripts/build-docs.sh

clean:
	rm -rf .build
