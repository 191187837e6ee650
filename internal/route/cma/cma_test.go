package cma

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

func open() route.Limit {
	return route.Limit{Ctx: context.Background(), Start: time.Now(), Deadline: time.Now().Add(time.Minute)}
}

func requireCMA(t *testing.T) {
	if ok, why := Available(); !ok {
		testenv.Missing(t, "the cma route is not used here: "+why)
	}
}

// TestRun copies within this process (process_vm_* on its own pid):
// small ops share calls, large ones go in chunks; every byte arrives.
func TestRun(t *testing.T) {
	requireCMA(t)
	remote, err := mr.Alloc(16 << 20)
	require.NoError(t, err)
	defer mr.Free(remote)
	local, err := mr.Alloc(16 << 20)
	require.NoError(t, err)
	defer mr.Free(local)
	for i := range remote {
		remote[i] = byte(i * 7)
	}
	pid := os.Getpid()
	base := uint64(mr.Addr(remote))
	ops := []Op{
		{Dir: progress.Read, PID: pid, Local: local[:8], Remote: base},
		{Dir: progress.Read, PID: pid, Local: local[8:4096], Remote: base + 8},
		{Dir: progress.Read, PID: pid, Local: local[4096 : 10<<20], Remote: base + 4096},
		{Dir: progress.Write, PID: pid, Local: local[:8], Remote: base + 12<<20},
	}
	errs := make([]error, len(ops))
	assert.Zero(t, Run(open(), ops, errs))
	assert.Equal(t, []error{nil, nil, nil, nil}, errs)
	assert.Equal(t, remote[:10<<20], local[:10<<20])
	assert.Equal(t, remote[:8], remote[12<<20:12<<20+8], "the write")
}

// TestRunErrors: each op's error names its op, and batches that fail are
// redone op by op: an unmapped address is a *Error with EFAULT, a
// process that exited is ErrPeerGone, a limit already past a timeout.
func TestRunErrors(t *testing.T) {
	requireCMA(t)
	local, err := mr.Alloc(4096)
	require.NoError(t, err)
	defer mr.Free(local)
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid
	pid := os.Getpid()
	ops := []Op{
		{Dir: progress.Read, PID: pid, Local: local[:8], Remote: uint64(mr.Addr(local[2048:]))},
		{Dir: progress.Read, PID: pid, Local: local[8:16], Remote: 8}, // unmapped
		{Dir: progress.Write, PID: dead, Local: local[:8], Remote: 4096},
	}
	errs := make([]error, len(ops))
	assert.Equal(t, 2, Run(open(), ops, errs))
	assert.NoError(t, errs[0])
	var ce *Error
	require.ErrorAs(t, errs[1], &ce)
	assert.Equal(t, unix.EFAULT, ce.Errno)
	assert.ErrorIs(t, errs[2], errclass.ErrPeerGone)

	past := route.Limit{Ctx: context.Background(), Start: time.Now(), Deadline: time.Now().Add(-time.Second)}
	err = Copy(past, &Op{Dir: progress.Read, PID: pid, Local: local[:8], Remote: uint64(mr.Addr(local[2048:]))})
	var te *progress.TimeoutError
	require.ErrorAs(t, err, &te)
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
}

func TestNames(t *testing.T) {
	assert.Equal(t, 1234, PID(ProcName(1234)))
	assert.Zero(t, PID([]byte("-3")))
	assert.Zero(t, PID([]byte("fi_shm://1")))
	// Digits only: no sign, no blank, nothing longer than an int32.
	for _, bad := range []string{"", "0", "+3", " 3", "3 ", "12345678901", "2147483648", "4294967297", "9999999999"} {
		assert.Zero(t, PID([]byte(bad)), "%q", bad)
	}
	assert.Equal(t, 4194304, PID([]byte("4194304")))
	assert.Equal(t, math.MaxInt32, PID([]byte("2147483647")))
	assert.Equal(t, "process 7", Peer(7))
}

// TestCopyStopsAtANewGeneration: a copy of more than one piece stops
// with ErrClosed before the first piece after its owner's generation
// word changed; a copy that finds the owner's memory gone (EFAULT, the
// owner unmapped a buffer it closed) says ErrClosed too when the
// generation changed, and the errno when it did not.
func TestCopyStopsAtANewGeneration(t *testing.T) {
	requireCMA(t)
	pid := os.Getpid()
	gen, err := mr.Alloc(8)
	require.NoError(t, err)
	genAt := uint64(mr.Addr(gen))
	setGen := func(v uint64) { *mr.Uint64(gen, 0) = v }

	remote, err := mr.Alloc(2 * chunk)
	require.NoError(t, err)
	local := make([]byte, 2*chunk)
	setGen(1)
	o := Op{Dir: progress.Write, PID: pid, Local: local, Remote: uint64(mr.Addr(remote)), GenAt: genAt, Gen: 1}
	require.NoError(t, Copy(open(), &o), "the generation is the op's")
	setGen(2)
	err = Copy(open(), &o)
	require.ErrorIs(t, err, ErrClosed)
	assert.Contains(t, err.Error(), "at offset 4194304")

	// The owner's memory is gone.
	require.NoError(t, mr.Free(remote))
	small := Op{Dir: progress.Write, PID: pid, Local: local[:64], Remote: o.Remote, GenAt: genAt, Gen: 1}
	err = Copy(open(), &small)
	require.ErrorIs(t, err, ErrClosed, "closed, then unmapped")
	small.Gen = 2
	err = Copy(open(), &small)
	var ce *Error
	require.ErrorAs(t, err, &ce, "unmapped under an open generation")
	assert.Equal(t, unix.EFAULT, ce.Errno)

	// The owner's manager closed: its guard table is gone too.
	dest, err := mr.Alloc(2 * chunk)
	require.NoError(t, err)
	defer mr.Free(dest)
	require.NoError(t, mr.Free(gen))
	o = Op{Dir: progress.Write, PID: pid, Local: local, Remote: uint64(mr.Addr(dest)), GenAt: genAt, Gen: 2}
	err = Copy(open(), &o)
	require.ErrorIs(t, err, ErrClosed, "the table's unmapped generation word")
}

// TestMarkBegin: a mark stays only when the link is up and the
// generation is the op's; an ended link is ErrUnmarked (the owner might
// not count the page: the op must not run), a new generation ErrClosed,
// and neither leaves a mark behind.
func TestMarkBegin(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended bool
		gen   uint64
		want  error
		marks uint32
	}{
		{name: "up", gen: 7, marks: 1},
		{name: "link ended", ended: true, gen: 7, want: ErrUnmarked},
		{name: "buffer closed", gen: 8, want: ErrClosed},
		{name: "both", ended: true, gen: 8, want: ErrUnmarked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var use uint32
			var ended atomic.Bool
			ended.Store(tc.ended)
			word := tc.gen
			err := Mark{Use: &use, Ended: &ended}.Begin(&word, 7)
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			assert.Equal(t, tc.marks, use)
		})
	}
}
