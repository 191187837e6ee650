package main

import (
	"bytes"
	"os"
	"testing"
)

// asCLI makes this test binary behave as the fitransfer binary, for
// tests that need it in another process.
const asCLI = "FITRANSFER_TEST_AS_CLI"

func TestMain(m *testing.M) {
	// `doctor` starts this binary as its CMA probe target, and `bench
	// --compare` as the floor's peer.
	if handled, code := maybeRunChild(); handled {
		os.Exit(code)
	}
	if os.Getenv(asCLI) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// runCLI runs the command in-process and returns stdout, stderr and the
// exit status.
func runCLI(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}
