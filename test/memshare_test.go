package test

import (
	"encoding/binary"
	"encoding/json"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
)

// TestMemFilesKeepAccess speaks the mem route's protocol to an owner
// directly, as a hostile peer of the same user would, without
// fitransfer's own checks: the file of a buffer peers may only read comes
// read-only, so that the kernel refuses a writable mapping; the file of a
// read-write buffer maps writable; every file is sealed against shrinking.
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
				Endpoints []struct {
					Provider string `json:"provider"`
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

			c, err := net.Dial("unixpacket", "@fitransfer/"+hj.Owner)
			require.NoError(t, err)
			defer c.Close()
			uc := c.(*net.UnixConn)
			proof := make([]byte, 512)
			_, err = uc.Read(proof)
			require.NoError(t, err)
			fds := memAsk(t, uc, []byte("MCT1"), 2)
			for _, fd := range fds {
				unix.Close(fd)
			}
			req := append([]byte("MMP1"), binary.LittleEndian.AppendUint64(nil, id)...)
			req = binary.LittleEndian.AppendUint32(req, g.Slot)
			req = binary.LittleEndian.AppendUint64(req, gen)
			fd := memAsk(t, uc, req, 1)[0]
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

// memAsk sends a mem request and returns the files of a successful answer.
func memAsk(t *testing.T, c *net.UnixConn, req []byte, want int) []int {
	t.Helper()
	_, err := c.Write(req)
	require.NoError(t, err)
	b := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 13)
	require.Equal(t, byte(0), b[4], "refused: %s", b[13:n])
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	var fds []int
	for _, cm := range cms {
		got, err := unix.ParseUnixRights(&cm)
		require.NoError(t, err)
		fds = append(fds, got...)
	}
	require.Len(t, fds, want)
	return fds
}
