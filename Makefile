# airlock — build, test, run and benchmark.
# `make run` and `make test` work on a fresh Debian bookworm machine as root.

GO          ?= go
BIN         := bin
DATA_DIR    ?= /var/lib/airlock
TEST_DATA   ?= /var/lib/airlock-test
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X github.com/airlockhq/airlock/internal/version.Version=$(VERSION)
# The Go SDK and the API types are modules of their own (go.mod replaces them
# with these directories); `go test ./...` from the root does not enter them.
SDK_MODULES := api client
# Host packages the daemon and the test suite need (Debian names; python3 runs
# the Python SDK's tests).
DEB_PACKAGES := runc runsc debootstrap e2fsprogs iproute2 nftables util-linux ca-certificates python3

export AIRLOCK_TEST_DATA_DIR := $(TEST_DATA)

.PHONY: all build deps test unit fuzz vet lint run bench e2b-suite clean

all: build

## deps: install the host packages airlock needs (idempotent; root).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@# Node.js runs the E2B SDK compatibility tests; the machine's own (any
	@# source) is used when present, else Debian's.
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		echo "installing: nodejs npm"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }

## build: bin/airlock (daemon + CLI), bin/airlock-agent (static, runs inside sandboxes), the bench tools.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/airlock-agent ./cmd/airlock-agent
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/airlock ./cmd/airlock
	$(GO) build -trimpath -o $(BIN)/airlock-bench ./cmd/airlock-bench
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/airlock-bench-probe ./cmd/airlock-bench/probe

vet:
	$(GO) vet ./...
	@for m in $(SDK_MODULES); do echo "$(GO) -C $$m vet ./..."; $(GO) -C $$m vet ./... || exit 1; done

lint:
	$(GO) run $(STATICCHECK) ./...
	@for m in $(SDK_MODULES); do echo "(cd $$m && staticcheck ./...)"; (cd $$m && $(GO) run $(STATICCHECK) ./...) || exit 1; done

## test: everything, root tests included (run as root; CI does).
test: deps build vet lint
	$(GO) test -race -count=1 -timeout 25m ./...
	@for m in $(SDK_MODULES); do echo "$(GO) -C $$m test -race -count=1 ./..."; $(GO) -C $$m test -race -count=1 ./... || exit 1; done
	$(MAKE) fuzz

## fuzz: a short run of every fuzz target (FUZZTIME each; make test runs it).
FUZZTIME ?= 30s
FUZZ_TARGETS = internal/agent:FuzzOpenInRoot internal/agent:FuzzUnpack internal/agentproto:FuzzFrameReader \
	internal/build:FuzzParse internal/build:FuzzOpenContext internal/plane/httpapi:FuzzDecodeJSON \
	internal/plane/e2b:FuzzTemplateUpload internal/template:FuzzImportImage
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "$(GO) test ./$$pkg -run '^$$' -fuzz '^$$fn\$$' -fuzztime $(FUZZTIME)"; \
		$(GO) test ./$$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 10s || exit 1; done

## unit: the tests that need neither root nor host packages.
unit:
	$(GO) test -race -short ./...
	@for m in $(SDK_MODULES); do $(GO) -C $$m test -race -short ./... || exit 1; done

## run: install, build, prepare the base template (with progress) and start the daemon.
run: deps build
	$(BIN)/airlock serve --data-dir $(DATA_DIR)

## bench: measure against the targets in ARCHITECTURE.md; writes docs/benchmarks.md.
bench: deps build
	./scripts/bench.sh

## e2b-suite: E2B's own JS SDK tests (E2B_SUITE_DIR, default ../shared/e2b-suite) against a daemon of
## this tree; not part of `make test`. A full run writes the per-file table into docs/e2b.md (root).
e2b-suite: deps
	./scripts/e2b-suite.sh $(E2B_SUITE_FILTER)

clean:
	rm -rf $(BIN)
