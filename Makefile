# fitransfer — `make demo` runs the main job, `make test` the tests.
# Both install what they need first (libfabric from Debian's packages).
#
# Another libfabric (e.g. the AWS EFA installer's):
#   PKG_CONFIG_PATH=/opt/amazon/efa/lib/pkgconfig make build
# cgo finds it through pkg-config, and the binary gets an rpath to it.

SHELL := /bin/bash
GO    ?= go
BIN   := bin/fitransfer
SUDO  := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := libfabric-dev libfabric-bin pkg-config iproute2

# The runtime linker must load the libfabric cgo compiled against.
LIBFABRIC_LIBDIR = $(shell pkg-config --variable=libdir libfabric 2>/dev/null)
export CGO_LDFLAGS += $(if $(LIBFABRIC_LIBDIR),-Wl$(comma)-rpath$(comma)$(LIBFABRIC_LIBDIR))
comma := ,

.PHONY: deps build test vet demo bench soak fuzz clean

deps:
	@if ! command -v pkg-config >/dev/null || ! pkg-config --exists libfabric \
	    || ! command -v fi_info >/dev/null || ! command -v ip >/dev/null; then \
	  echo "installing $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	@echo "libfabric $$(pkg-config --modversion libfabric) ($$(pkg-config --variable=libdir libfabric))"

build: deps
	$(GO) build -o $(BIN) ./cmd/fitransfer

vet: deps
	$(GO) vet ./...

test: deps vet
	$(GO) test -race -count=1 ./...

demo: build
	BIN=$(BIN) scripts/demo.sh

# fitransfer's own sweep next to the peer tools, in the same run:
# fi_pingpong always; fabtests' fi_rma_bw and fi_rdm_pingpong when
# FABTESTS_BIN names a directory holding them. Then the Go benchmarks.
bench: build
	./$(BIN) bench --compare
	$(GO) test -run '^$$' -bench . -benchmem ./transport/

# The reliability runs (docs/RELIABILITY.md): a minute of random
# transfers with every byte checked, plus 100,000 registrations; and each
# fuzz target for FUZZTIME.
SOAK     ?= 60s
FUZZTIME ?= 60s
soak: deps
	$(GO) test -count=1 -timeout 30m -run 'TestSoak|TestChurn' -v ./test -args -soak=$(SOAK) -churn=100000

fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalBinary$$' -fuzztime $(FUZZTIME) ./transport
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalJSON$$' -fuzztime $(FUZZTIME) ./transport
	$(GO) test -run '^$$' -fuzz '^FuzzReadMessage$$' -fuzztime $(FUZZTIME) ./bootstrap

clean:
	rm -rf bin
