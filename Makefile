# Replica — set-up and everyday commands. `make run` and `make test` work on a fresh machine (they run `setup`).
SHELL := /bin/bash
PACKAGES := libsqlite3-dev libsodium-dev pkg-config
SWIFT ?= swift
# Extra flags for swift build/test/run, e.g. `make test SWIFT_FLAGS="--scratch-path /tmp/build"`.
SWIFT_FLAGS ?=
export SWIFT_DETERMINISTIC_HASHING := 1

.PHONY: setup build test run example bench clean

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
	$(SWIFT) build $(SWIFT_FLAGS)

## test: the whole test suite.
test: setup
	$(SWIFT) test $(SWIFT_FLAGS)

## run: the main job (until the simulator lands: the trips example host app).
run: setup
	$(SWIFT) run $(SWIFT_FLAGS) -c release trips-example

example: run

clean:
	rm -rf .build
