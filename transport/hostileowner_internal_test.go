package transport

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
)

// hostileOwnerEnv, set to a manager ID, makes the test binary run
// hostileOwner for it instead of the tests.
const hostileOwnerEnv = "FITRANSFER_TEST_HOSTILE_OWNER"

// hostileGuard is the guard table hostileOwner's proof announces.
var hostileGuard = guardLoc{table: 1 << 20, key: 7}

func init() {
	if owner := os.Getenv(hostileOwnerEnv); owner != "" {
		fmt.Fprintln(os.Stderr, "hostile owner:", hostileOwner(owner))
		os.Exit(1)
	}
}

// hostileOwner serves the verifier of manager owner as a hostile process
// of this user may: it answers every connection with a proof that passes
// (its own pid, hostileGuard), and when one asks for a mem link (a mem
// dial: a verified peer sends nothing), it asks the connections that
// sent nothing to verify it again (announceReverify) and never answers
// the dial. It prints a line once it listens, and exits when its stdin
// ends.
func hostileOwner(owner string) error {
	var id ID
	if _, err := hex.Decode(id[:], []byte(owner)); err != nil {
		return err
	}
	m := &Manager{guard: &guardTable{base: hostileGuard.table, id: hostileGuard.key}}
	m.set.Store(&backendSet{}) // no shm
	proof := m.proof()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: verifySocket(id), Net: "unixpacket"})
	if err != nil {
		return err
	}
	fmt.Println("listening")
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var mu sync.Mutex
	silent := map[*net.UnixConn]bool{}
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return err
		}
		if _, err := c.Write(proof); err != nil {
			_ = c.Close()
			continue
		}
		mu.Lock()
		silent[c] = true
		mu.Unlock()
		go func() {
			b := make([]byte, 512)
			n, err := c.Read(b)
			dial := err == nil && n > 0
			mu.Lock()
			delete(silent, c)
			for v := range silent {
				if dial { // the verified connections: ask them again
					_, _ = v.Write([]byte{announceReverify})
					_ = v.Close()
					delete(silent, v)
				}
			}
			mu.Unlock()
			if dial {
				_, _ = c.Read(b) // unanswered until the peer ends it
			}
			_ = c.Close()
		}()
	}
}

// TestOwnerAskingToBeVerifiedAgain: an owner process (of this user, that
// passes verification) that asks to be verified again (announceReverify)
// at every mem dial, and never answers the dial, fails an op toward it
// as retryable, nothing moved (memLinkEnded), after at most maxRetake
// verifications replacing the first. Without that bound (a first version
// of 2026-12-07 took verifications until the request's deadline) it
// failed with ErrTimeout after 16,000 to 21,000 verifications in 10 s;
// before that version a request took one and failed with ErrNoRoute.
func TestOwnerAskingToBeVerifiedAgain(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	m, err := New(context.Background(), WithProviders(testenv.RouteMem))
	require.NoError(t, err)
	defer m.Close()

	owner := newManagerID()
	exe, err := os.Executable()
	require.NoError(t, err)
	child := exec.Command(exe, "-test.run=^$")
	child.Env = append(os.Environ(), hostileOwnerEnv+"="+owner.String())
	child.Stderr = os.Stderr
	_, err = child.StdinPipe() // the child exits when this process does
	require.NoError(t, err)
	out, w, err := os.Pipe()
	require.NoError(t, err)
	defer out.Close()
	child.Stdout = w
	require.NoError(t, child.Start())
	w.Close()
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	require.NoError(t, out.SetReadDeadline(time.Now().Add(time.Minute)))
	_, err = bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the owner never listened")

	b, err := readMemByHand(t, m, owner, child.Process.Pid, hostileGuard, 10*time.Second)
	require.Error(t, err)
	assert.True(t, linkEnded(err), "%v", err)
	assert.True(t, Retryable(err), "%v", err)
	assert.NotErrorIs(t, err, ErrTimeout)
	assert.NotErrorIs(t, err, ErrNoRoute)
	assert.NotErrorIs(t, err, ErrPeerGone)
	assert.LessOrEqual(t, m.verified.runs.Load(), uint64(maxRetake+1), "verifications of the owner")
	assert.Equal(t, make([]byte, 64), b, "nothing moved")
}
