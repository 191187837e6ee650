package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
)

// fitransferBin is the fitransfer binary built for these tests.
var fitransferBin string

func TestMain(m *testing.M) {
	testpeer.MaybeRun() // child owners and initiators
	testenv.LoopbackOnly()
	dir, err := os.MkdirTemp("", "fitransfer-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fitransferBin = filepath.Join(dir, "fitransfer")
	build := exec.Command("go", "build", "-o", fitransferBin, "../cmd/fitransfer")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building fitransfer:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
