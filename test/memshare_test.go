package test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestMemFilesKeepAccess speaks the mem route's protocol to an owner
// directly, without fitransfer's own checks: the file of a buffer peers
// may only read comes read-only, so that the kernel refuses a writable
// mapping of it (a guard against a peer's mistake: a process of the user
// may reopen it through /proc, and the mem route runs only where such a
// process may ptrace the owner anyway); the file of a read-write buffer
// maps writable; every file is sealed against shrinking; the generations
// page cannot be mapped writable even when reopened read-write; a map
// request whose key does not match the buffer's is refused.
func TestMemFilesKeepAccess(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const n = 64 << 10
	owner := testpeer.Start(t, testenv.RouteMem)
	for _, tt := range []struct {
		access   mr.Access
		writable bool
	}{
		{mr.RemoteRead, false},
		{mr.ReadWrite, true},
	} {
		t.Run(tt.access.String(), func(t *testing.T) {
			h := owner.Register(n, tt.access, 1)
			b, err := json.Marshal(h)
			require.NoError(t, err)
			var hj struct {
				Owner     string `json:"owner"`
				ID        string `json:"id"`
				Size      string `json:"size"`
				Endpoints []struct {
					Provider string `json:"provider"`
					Key      string `json:"key"`
					Addr     string `json:"addr"`
					Guard    *struct {
						Slot uint32 `json:"slot"`
						Gen  string `json:"gen"`
					} `json:"guard"`
				} `json:"endpoints"`
			}
			require.NoError(t, json.Unmarshal(b, &hj))
			require.Equal(t, "mem", hj.Endpoints[0].Provider, "the handle offers the mem route first")
			g := hj.Endpoints[0].Guard
			id, err := strconv.ParseUint(hj.ID, 10, 64)
			require.NoError(t, err)
			gen, err := strconv.ParseUint(g.Gen, 10, 64)
			require.NoError(t, err)
			u64 := func(s string) uint64 {
				v, err := strconv.ParseUint(s, 10, 64)
				require.NoError(t, err)
				return v
			}
			key, addr, size := u64(hj.Endpoints[0].Key), u64(hj.Endpoints[0].Addr), u64(hj.Size)

			c, err := net.Dial("unixpacket", "@fitransfer/"+hj.Owner)
			require.NoError(t, err)
			defer c.Close()
			uc := c.(*net.UnixConn)
			proof := make([]byte, 512)
			_, err = uc.Read(proof)
			require.NoError(t, err)
			fds := memAsk(t, uc, []byte("MCT1"), nil, 2)
			gens := fds[0]
			rw, err := unix.Open("/proc/self/fd/"+strconv.Itoa(gens), unix.O_RDWR, 0)
			require.NoError(t, err, "reopening the generations page read-write")
			_, err = unix.Mmap(rw, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			require.ErrorIs(t, err, unix.EPERM, "a writable mapping of the generations page")
			for _, fd := range append(fds, rw) {
				unix.Close(fd)
			}
			mapReq := func(key uint64) []byte {
				req := append([]byte("MMP1"), binary.LittleEndian.AppendUint64(nil, id)...)
				req = binary.LittleEndian.AppendUint32(req, g.Slot)
				req = binary.LittleEndian.AppendUint64(req, gen)
				req = binary.LittleEndian.AppendUint64(req, key)
				req = binary.LittleEndian.AppendUint64(req, addr)
				return binary.LittleEndian.AppendUint64(req, size)
			}
			memAskRefused(t, uc, mapReq(key^1))
			fd := memAsk(t, uc, mapReq(key), mapReq(key)[4:24], 1)[0]
			defer unix.Close(fd)

			seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
			require.NoError(t, err)
			assert.NotZero(t, seals&unix.F_SEAL_SHRINK, "sealed against shrinking")
			require.Error(t, unix.Ftruncate(fd, 0), "shrinking the file (the seal, or a read-only file)")
			m, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if tt.writable {
				require.NoError(t, err)
				require.NoError(t, unix.Munmap(m))
			} else {
				require.ErrorIs(t, err, unix.EACCES, "a writable mapping of a read-only buffer's file")
				fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
				require.NoError(t, err)
				assert.Equal(t, unix.O_RDONLY, fl&unix.O_ACCMODE)
			}
			m, err = unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
			require.NoError(t, err)
			assert.Equal(t, testpeer.Pattern(n, 1), m, "the file holds the buffer")
			require.NoError(t, unix.Munmap(m))
		})
	}
}

// memAsk sends a mem request and returns the files of a successful
// answer, which echoes echo (nil: zeros).
func memAsk(t *testing.T, c *net.UnixConn, req, echo []byte, want int) []int {
	t.Helper()
	b, fds := memRoundTrip(t, c, req)
	require.Equal(t, byte(0), b[4], "refused: %s", b[33:])
	if echo == nil {
		echo = make([]byte, 20)
	}
	require.Equal(t, echo, b[13:33], "the answer echoes the request")
	require.Len(t, fds, want)
	return fds
}

// memAskRefused sends a mem request that must be refused, without files.
func memAskRefused(t *testing.T, c *net.UnixConn, req []byte) {
	t.Helper()
	b, fds := memRoundTrip(t, c, req)
	require.NotEqual(t, byte(0), b[4], "a request that must be refused was answered")
	require.Empty(t, fds)
}

func memRoundTrip(t *testing.T, c *net.UnixConn, req []byte) ([]byte, []int) {
	t.Helper()
	_, err := c.Write(req)
	require.NoError(t, err)
	b := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 33)
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	var fds []int
	for _, cm := range cms {
		got, err := unix.ParseUnixRights(&cm)
		require.NoError(t, err)
		fds = append(fds, got...)
	}
	return b[:n], fds
}

// TestManagerCloseDuringMemCopy: a manager closes while a transfer of
// its own copies into a Manager.Alloc buffer on the mem route. Close must
// not free the memory under the copy (the process would fault); the
// transfer ends, nil or ErrClosed, and the memory goes after it.
func TestManagerCloseDuringMemCopy(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const n = 64 << 20
	owner := testpeer.Start(t, testenv.RouteMem)
	h := owner.Register(n, mr.ReadWrite, 1)
	for i := 0; i < 10; i++ {
		m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteMem))
		require.NoError(t, err)
		local, err := m.Alloc(n, 0)
		require.NoError(t, err)
		require.NoError(t, m.ReadInto(context.Background(), local, h)) // the link and the mapping are up
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			close(started)
			done <- m.ReadInto(context.Background(), local, h)
		}()
		<-started
		time.Sleep(time.Duration(i%5) * 500 * time.Microsecond) // Close at different points of the copy
		require.NoError(t, m.Close())
		if err := <-done; err != nil {
			require.ErrorIs(t, err, transport.ErrClosed, "round %d", i)
		}
	}
}
