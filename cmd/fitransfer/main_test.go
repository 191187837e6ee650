package main

import (
	"bytes"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// `doctor` starts this binary as its CMA probe target.
	if handled, code := maybeRunChild(); handled {
		os.Exit(code)
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
