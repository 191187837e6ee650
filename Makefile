# fitransfer — `make demo` runs the main job, `make test` the tests.
# Both install what they need first (libfabric from Debian's packages).
#
# Another libfabric (e.g. the AWS EFA installer's):
#   PKG_CONFIG_PATH=/opt/amazon/efa/lib/pkgconfig make build
# cgo finds it through pkg-config, and the binary gets an rpath to it.
#
# libfabric 2.1, built from Debian 13's source package (make libfabric2):
#   make test LIBFABRIC=2

SHELL := /bin/bash
GO    ?= go
BIN   := bin/fitransfer
SUDO  := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := libfabric-dev libfabric-bin pkg-config iproute2 gdb

# The runtime linker must load the libfabric cgo compiled against. make's
# $(shell) does not see exported variables, so PKG_CONFIG_PATH is passed.
PKG_CONFIG_Q = PKG_CONFIG_PATH='$(PKG_CONFIG_PATH)' pkg-config
LIBFABRIC_LIBDIR = $(shell $(PKG_CONFIG_Q) --variable=libdir libfabric 2>/dev/null)
LIBFABRIC_ID = $(shell { $(PKG_CONFIG_Q) --modversion libfabric; $(PKG_CONFIG_Q) --cflags --libs libfabric; } 2>/dev/null | md5sum | cut -c1-16)
export CGO_LDFLAGS += $(if $(LIBFABRIC_LIBDIR),-Wl$(comma)-rpath$(comma)$(LIBFABRIC_LIBDIR))
# Go's build cache does not hash pkg-config's output or the headers it
# names: without this, a build against one libfabric reuses the objects
# compiled against another.
export CGO_CPPFLAGS += $(if $(LIBFABRIC_LIBDIR),-DFT_LIBFABRIC_ID=$(LIBFABRIC_ID))
comma := ,

.PHONY: deps build test vet demo bench soak integrity fuzz libfabric2 clean

LIBFABRIC         ?= 1
LIBFABRIC2_PREFIX ?= /opt/fitransfer/libfabric-2.1.0
ifeq ($(LIBFABRIC),2)
export PKG_CONFIG_PATH := $(LIBFABRIC2_PREFIX)/lib/pkgconfig$(if $(PKG_CONFIG_PATH),:$(PKG_CONFIG_PATH))
export LD_LIBRARY_PATH := $(LIBFABRIC2_PREFIX)/lib$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))
export PATH := $(LIBFABRIC2_PREFIX)/bin:$(PATH)
DEPS_2 := libfabric2
endif

# libfabric 2.1 from Debian 13's source package, efa compiled in; reused
# when already built (scripts/libfabric2.sh).
libfabric2:
	scripts/libfabric2.sh $(LIBFABRIC2_PREFIX)

deps: $(DEPS_2)
	@if ! command -v pkg-config >/dev/null || ! pkg-config --exists libfabric \
	    || ! command -v fi_info >/dev/null || ! command -v ip >/dev/null \
	    || ! command -v gdb >/dev/null; then \
	  echo "installing $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	@echo "libfabric $$(pkg-config --modversion libfabric) ($$(pkg-config --variable=libdir libfabric))"

build: deps
	$(GO) build -o $(BIN) ./cmd/fitransfer

# staticcheck at a pinned version, run through `go run`: nothing to
# install, and go.mod does not change.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet: deps
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) mod tidy -diff

# Everything under the race detector; then the soak and churn again
# without it, where their resident-memory bound holds (the race
# detector's own memory grows with the work). go test's default
# 10-minute limit per package is a hang guard: under the race detector
# ./test takes about that long on a 2-core machine.
test: deps vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -count=1 -run '^(TestSoak|TestChurn)$$' ./test
	# Allocation counts, which the race detector's own allocations hide.
	$(GO) test -count=1 -run '^(TestNoAllocsPerOp|TestGoneAllocatesLittle|TestMemoOfTwoManagers)$$' ./transport ./internal/proc
	$(GO) test -count=1 -run '^TestRails$$/^allocs$$' ./test

demo: build
	BIN=$(BIN) scripts/demo.sh

# fitransfer's own sweep next to the peer tools, in the same run:
# fi_pingpong always; fabtests' fi_rma_bw and fi_rdm_pingpong (and
# fi_rma_pingpong, fabtests 1.21 on) when FABTESTS_BIN names a directory
# holding them; then 8 B reads and writes one at a time (window 1) next
# to fi_rma_bw -W 1. The 8 B pingpong and window-1 rows over shm and tcp
# are also paired with their floor: the same ops on raw endpoints, no
# engine (internal/floor). Then, as root, tcp over
# 1 and over 4 rate-limited links between two network namespaces (bench
# --rails, docs/PERFORMANCE.md). Then the Go benchmarks.
bench: build
	./$(BIN) bench --compare --repeat 3
	./$(BIN) bench --compare --repeat 3 -S 8 -W 1 --ops read,write --idle 0
	if [ "$$(id -u)" = 0 ]; then ./$(BIN) bench --rails 4 --repeat 3; \
	else echo "make bench: skipping bench --rails 4 (network namespaces need root)"; fi
	$(GO) test -run '^$$' -bench . -benchmem ./transport/
	$(GO) test -run '^$$' -bench 'IdleReap' -count 3 ./internal/ofi/

# The reliability runs (docs/RELIABILITY.md): a minute of random
# transfers with every byte checked, plus 100,000 registrations; and each
# fuzz target for FUZZTIME.
SOAK     ?= 60s
FUZZTIME ?= 60s
soak: deps
	$(GO) test -count=1 -timeout 30m -run 'TestSoak|TestChurn' -v ./test -args -soak=$(SOAK) -churn=100000

# TestIntegrity for INTEGRITY_OPS random ops (make test runs it for 30 s):
# every nil checked byte for byte, every error against the vocabulary.
INTEGRITY_OPS ?= 1000000
integrity: deps
	$(GO) test -count=1 -timeout 6h -run '^TestIntegrity$$' -v ./test -args -integrity.ops=$(INTEGRITY_OPS)

fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalBinary$$' -fuzztime $(FUZZTIME) ./transport
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalJSON$$' -fuzztime $(FUZZTIME) ./transport
	$(GO) test -run '^$$' -fuzz '^FuzzReadMessage$$' -fuzztime $(FUZZTIME) ./bootstrap

clean:
	rm -rf bin
