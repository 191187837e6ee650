package doctor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/mr"
)

// cmaChildEnv marks a process started as the target of the CMA probe.
const cmaChildEnv = "FITRANSFER_CMA_PROBE_CHILD"

const cmaProbeLen = 64

// MaybeRunCMAChild runs the CMA probe's target side when this process was
// started as one, and reports that it did; main (and TestMain) call it
// first.
//
// The target maps a page, prints its pid and the page's address, waits for
// "check <hex>" on stdin and answers "ok" when the page holds those bytes.
func MaybeRunCMAChild() (handled bool, code int) {
	if os.Getenv(cmaChildEnv) != "1" {
		return false, 0
	}
	page, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		fmt.Println("error", err)
		return true, 1
	}
	fmt.Printf("%d %d\n", os.Getpid(), mr.Addr(page))
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return true, 1
	}
	want, err := hex.DecodeString(strings.TrimPrefix(strings.TrimSpace(line), "check "))
	if err != nil || !bytes.Equal(page[:len(want)], want) {
		fmt.Println("mismatch")
		return true, 1
	}
	fmt.Println("ok")
	return true, 0
}

// probeCMA starts exe as a CMA target and writes into it with
// process_vm_writev, as the shm provider does for a peer's memory. It
// returns nil when the bytes arrived.
func probeCMA(ctx context.Context, exe string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), cmaChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start probe target: %w", err)
	}
	defer func() { _ = cmd.Wait() }()
	defer stdin.Close()
	out := bufio.NewReader(stdout)
	var pid int
	var addr uintptr
	line, err := out.ReadString('\n')
	if err != nil {
		return fmt.Errorf("probe target did not start: %w", err)
	}
	if _, err := fmt.Sscanf(line, "%d %d", &pid, &addr); err != nil {
		return fmt.Errorf("probe target said %q", strings.TrimSpace(line))
	}
	pattern := make([]byte, cmaProbeLen)
	_, _ = rand.Read(pattern)
	n, err := unix.ProcessVMWritev(pid,
		[]unix.Iovec{{Base: &pattern[0], Len: cmaProbeLen}},
		[]unix.RemoteIovec{{Base: addr, Len: cmaProbeLen}}, 0)
	if err != nil {
		return fmt.Errorf("process_vm_writev: %w", err)
	}
	if n != cmaProbeLen {
		return fmt.Errorf("process_vm_writev wrote %d of %d bytes", n, cmaProbeLen)
	}
	if _, err := io.WriteString(stdin, "check "+hex.EncodeToString(pattern)+"\n"); err != nil {
		return err
	}
	answer, _ := out.ReadString('\n')
	if strings.TrimSpace(answer) != "ok" {
		return fmt.Errorf("target memory did not change after process_vm_writev (%q)", strings.TrimSpace(answer))
	}
	return nil
}
