package transport_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

func TestMain(m *testing.M) {
	testpeer.MaybeRun() // child owner processes
	testenv.LoopbackOnly()
	os.Exit(m.Run())
}

// providers are the routes the tests force, each in turn; a subtest
// calls testenv.RequireRoute first.
var providers = testenv.Routes()

func alloc(t testing.TB, n int) []byte {
	t.Helper()
	b, err := mr.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(b) })
	return b
}

func newManager(t testing.TB, opts ...transport.Option) *transport.Manager {
	t.Helper()
	m, err := transport.New(context.Background(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func register(t testing.TB, m *transport.Manager, mem []byte, access mr.Access) *transport.Buffer {
	t.Helper()
	b, err := m.Register(mem, access)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// printHandle prints the handle of b, in hex, on a line of conn: a
// child's side of readHandle.
func printHandle(conn io.Writer, b *transport.Buffer) error {
	h, err := b.Remote().MarshalBinary()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(conn, hex.EncodeToString(h))
	return err
}

// serveFilled is a child's side of a test that reads one buffer: it
// allocates n bytes of v in m, prints their handle (printHandle), and
// holds them until conn's input ends.
func serveFilled(conn io.ReadWriter, m *transport.Manager, n int, v byte) error {
	b, err := m.Alloc(n, mr.ReadWrite)
	if err != nil {
		return err
	}
	defer b.Close()
	for i := range b.Bytes() {
		b.Bytes()[i] = v
	}
	if err := printHandle(conn, b); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, conn)
	return err
}

// readHandle reads the next line of p as a handle (printHandle).
func readHandle(t testing.TB, p *testpeer.Process) transport.RemoteBuffer {
	t.Helper()
	line, err := p.ReadLine()
	require.NoError(t, err)
	h, err := hex.DecodeString(strings.TrimSpace(line))
	require.NoError(t, err)
	var r transport.RemoteBuffer
	require.NoError(t, r.UnmarshalBinary(h))
	return r
}
