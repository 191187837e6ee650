package transport_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestShmSurvivesTheProgramsSignals: a fault the program recovers from (a
// nil dereference, a SIGSEGV the Go runtime turns into a panic) and the
// SIGINT and SIGTERM it catches for a clean shutdown (signal.Notify) leave
// its shm endpoints whole: their region files stay, its shm transfers go
// on, and the owner it writes to lives. libfabric's shm takes these four
// signals over at its first endpoint, to unlink its regions' files on an
// unclean exit; it did so for signals the program handled too, and then
// the owner crashed on this process's next command (libfabric 1.x) and
// this process's endpoint stalled (a new user's review).
func TestShmSurvivesTheProgramsSignals(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	m := newManager(t, transport.WithProviders(testenv.RouteSHM))
	owner := testpeer.Start(t, testenv.RouteSHM)
	h := owner.Register(4096, mr.ReadWrite, 1)
	local := register(t, m, alloc(t, 4096), mr.ReadWrite)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, h))
	names := transport.ShmEndpointNames(m)
	require.NotEmpty(t, names)
	for _, name := range names {
		require.False(t, libfabric.ShmRegionsGone([][]byte{name}), "%s before the signals", name)
	}

	recovered := func() (r any) {
		defer func() { r = recover() }()
		var p *[64]byte
		return p[7] // a fault, which the runtime turns into a panic
	}()
	require.NotNil(t, recovered, "the nil dereference panicked")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		caught := make(chan os.Signal, 1)
		signal.Notify(caught, sig)
		require.NoError(t, syscall.Kill(os.Getpid(), sig))
		select {
		case <-caught:
		case <-time.After(10 * time.Second):
			t.Fatalf("%v never reached signal.Notify", sig)
		}
		signal.Stop(caught)
	}
	for _, name := range names {
		assert.False(t, libfabric.ShmRegionsGone([][]byte{name}), "%s after the signals", name)
	}

	h2 := owner.Register(4096, mr.ReadWrite, 2)
	testpeer.Fill(local.Bytes(), 9)
	require.NoError(t, m.WriteFrom(ctxTimeout(t, time.Minute), h2, local))
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, h))
	assert.Equal(t, testpeer.Pattern(4096, 1), local.Bytes())
	assert.Equal(t, testpeer.Sum(testpeer.Pattern(4096, 9)), owner.Sum(1, 0, 4096), "the owner lives, and has the write")
}

func init() {
	// Opens args[0] shm managers at once, in a process of its own (shm
	// takes the signals over at the process's first endpoint), then
	// catches a SIGINT and says whether every region file stayed.
	testpeer.Register("shm managers at once", func(conn io.ReadWriter, args []string) error {
		var n int
		if _, err := fmt.Sscan(args[0], &n); err != nil {
			return err
		}
		ms := make([]*transport.Manager, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range ms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ms[i], errs[i] = transport.New(context.Background(), transport.WithProviders(testenv.RouteSHM))
			}()
		}
		wg.Wait()
		var names [][]byte
		for i, m := range ms {
			if errs[i] != nil {
				return errs[i]
			}
			defer m.Close()
			names = append(names, transport.ShmEndpointNames(m)...)
		}
		caught := make(chan os.Signal, 1)
		signal.Notify(caught, syscall.SIGINT)
		defer signal.Stop(caught)
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			return err
		}
		select {
		case <-caught:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("SIGINT never reached signal.Notify")
		}
		gone := 0
		for _, name := range names {
			if libfabric.ShmRegionsGone([][]byte{name}) {
				gone++
			}
		}
		_, err := fmt.Fprintf(conn, "%d region files gone, of %d managers' %d\n", gone, n, len(names))
		return err
	})
}

// TestShmOpenedAtOnceKeepsTheSignals: managers that open their first shm
// endpoints at the same time, in a new process, leave its handlers as
// they were too: two opens at once took each other's handlers for the
// process's, and one could put libfabric's back for good.
func TestShmOpenedAtOnceKeepsTheSignals(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	for run := range 3 {
		p, err := testpeer.StartFunc("shm managers at once", "8")
		require.NoError(t, err)
		line, err := p.ReadLine()
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(line, "0 region files gone, of 8 managers' "), "run %d: %s", run, line)
		require.NoError(t, p.Close())
	}
}
