package fabric

import (
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEFAHints checks every efa prov_errno row: the number finds its row,
// whatever err came with it (FI_EIO up to 1.21, to_fi_errno's value from
// 1.22), and the hint says what the row is about.
func TestEFAHints(t *testing.T) {
	tests := []struct {
		provErrno int
		errno     Errno // as libfabric 2.1 reports it
		want      []string
	}{
		{1, ErrCanceled, []string{"endpoint was destroyed", "not the cause"}},
		{2, ErrInval, []string{"internal error", "dmesg"}},
		{3, ErrInval, []string{"does not support", "rdma-core", "both sides report RDMA write"}},
		{4, ErrInval, []string{"address entry", "AddPeer"}},
		{5, ErrInval, []string{"local buffer", "do not close a local Buffer"}},
		{6, ErrMsgSize, []string{"longer than the device allows", "WithChunkSize"}},
		{7, ErrInval, []string{"key or range does not match", "fresh handle", "mr.ReadWrite"}},
		{8, ErrConnAborted, []string{"aborted", "repeat the bootstrap"}},
		{9, Errno(107), []string{"no longer exists", "new address"}},
		{10, ErrNoRx, []string{"no receive buffer", "FI_OPT_EFA_RNR_RETRY"}},
		{11, ErrMsgSize, []string{"shorter than the data", "handle's length"}},
		{12, ErrRemoteIO, []string{"unexpected status", "firmware"}},
		{13, ErrConnAborted, []string{"stopped answering", "security group"}},
		{14, Errno(107), []string{"initiator's address", "AddPeer(initiator.Address())"}},
		{15, ErrHostUnreach, []string{"never got an answer", "self-referencing", "one subnet"}},
		{18, ErrInval, []string{"feature", "same libfabric and rdma-core"}},
		{4096, ErrOther, []string{"Unspecified", "FI_LOG_LEVEL=warn"}},
		{4105, Errno(105), []string{"reorder buffer", "FI_ENOBUFS", "host memory"}}, // 105: FI_ENOBUFS
		{4110, ErrOther, []string{"could not insert", "address vector is not full"}},
		{4111, ErrOther, []string{"At the target", "times out", "fresh, correct handle"}},
		{4112, ErrOther, []string{"internal receive buffers", "ulimit -l unlimited"}},
		{4113, ErrOther, []string{"handshake", "security group"}},
		{4114, ErrOther, []string{"send queue refused", "reduce the ops in flight"}},
		{4116, ErrOther, []string{"queued read", "reduce the ops in flight"}},
		{4117, ErrOther, []string{"RDMA read could not be posted", "memlock"}},
		{4119, ErrOther, []string{"could not write a completion", "CQ size"}},
		{4122, ErrOther, []string{"internal shm path", "FI_EFA_ENABLE_SHM_TRANSFER=0"}},
		{4124, ErrConnAborted, []string{"answered before", "repeat the bootstrap"}},
		{4126, ErrConnAborted, []string{"handshake came back", "progressing its endpoint"}},
	}
	require.Len(t, tests, len(efaHints), "one case per efa row")
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.provErrno), func(t *testing.T) {
			for _, errno := range []Errno{tt.errno, ErrIO} { // 1.22+ and ≤1.21
				r, ok := LookupHint("efa", errno, tt.provErrno)
				require.True(t, ok)
				assert.Equal(t, tt.provErrno, r.ProvErrno)
				h := Hint("efa", errno, tt.provErrno)
				for _, w := range tt.want {
					assert.Contains(t, h, w)
				}
			}
		})
	}
}

// TestErrnoHints checks every fi_errno row, for a provider without rows
// of its own.
func TestErrnoHints(t *testing.T) {
	tests := []struct {
		errno Errno
		want  []string
	}{
		{ErrHostUnreach, []string{"No route", "self-referencing", "firewall"}},
		{ErrIO, []string{"every device error", "prov_errno"}},
		{ErrCanceled, []string{"canceled or flushed", "not a cancellation"}},
		{ErrTimedOut, []string{"timed out", "lengthen the deadline"}},
		{ErrAccess, []string{"refused access", "access the owner registered"}},
		{ErrKeyRejected, []string{"rejected the memory key", "the handle"}},
		{ErrNotConn, []string{"connection to the peer is gone", "AddPeer"}},
		{ErrConnReset, []string{"connection to the peer is gone", "repeat the bootstrap"}},
		{ErrConnRefused, []string{"connection to the peer is gone", "repeat the bootstrap"}},
		{ErrTrunc, []string{"longer than the remote region", "handle's length"}},
		{ErrAgain, []string{"refused for now", "retry"}},
		{ErrConnAborted, []string{"stopped answering", "alive"}},
		{ErrInval, []string{"invalid argument", "check the arguments"}},
		{ErrMsgSize, []string{"too long", "WithChunkSize"}},
		{ErrNoRx, []string{"no buffer", "FI_RM_DISABLED"}},
		{ErrRemoteIO, []string{"unexpected status", "firmware"}},
		{ErrHostDown, []string{"flushed", "not a cancellation"}},
		{ErrOther, []string{"unspecified", "FI_LOG_LEVEL=warn"}},
	}
	require.Len(t, tests, len(errnoHints), "one case per fi_errno row")
	for _, tt := range tests {
		t.Run(tt.errno.Error(), func(t *testing.T) {
			r, ok := LookupHint("shm", tt.errno, 0)
			require.True(t, ok)
			assert.Equal(t, tt.errno, r.Errno)
			h := Hint("shm", tt.errno, 0)
			for _, w := range tt.want {
				assert.Contains(t, h, w)
			}
		})
	}
}

func TestHintPrecedence(t *testing.T) {
	// efa up to 1.21: FI_EIO, the cause in prov_errno.
	assert.Contains(t, Hint("efa", ErrIO, 15), "security group")
	// A provider number efa does not have: the fi_errno row.
	assert.Contains(t, Hint("efa", ErrIO, 4242), "every device error")
	// prov_errno rows are efa's only: shm's 15 is not efa's 15.
	assert.NotContains(t, Hint("shm", ErrIO, 15), "security group")
	// rxm cancels ops and puts the socket error in prov_errno.
	assert.Contains(t, Hint("tcp;ofi_rxm", ErrCanceled, 107), "connection to the peer is gone")
	assert.Contains(t, Hint("tcp;ofi_rxm", ErrCanceled, 32), "connection to the peer is gone")
	assert.Contains(t, Hint("tcp;ofi_rxm", ErrCanceled, 2), "rejects its key")
	// 2.1's rxm reports the socket error itself; efa's notes stay out.
	for _, e := range []Errno{ErrNotConn, ErrConnReset, ErrConnRefused} {
		h := Hint("tcp;ofi_rxm", e, 115)
		assert.Contains(t, h, "connection to the peer is gone", e)
		assert.NotContains(t, h, "efa", e)
	}
	assert.Contains(t, Hint("tcp;ofi_rxm", ErrTimedOut, 0), "timed out")
	// No row: no hint.
	assert.Empty(t, Hint("shm", ErrNoMem, 0))
	_, ok := LookupHint("efa", ErrNoMem, 0)
	assert.False(t, ok)
}

// TestHintsMatchDocs keeps the table and docs/EFA.md's "Error hints"
// table in step: the same prov_errno and fi_errno numbers in both, and for
// each number the same source, which names a libfabric tag and line.
func TestHintsMatchDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/EFA.md")
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "### Error hints")
	require.GreaterOrEqual(t, start, 0, "docs/EFA.md has an Error hints section")
	section := doc[start:]
	if end := strings.Index(section[4:], "\n#"); end >= 0 {
		section = section[:end+4]
	}
	// \x60 is a backtick, which a raw string cannot hold (here and below).
	provRow := regexp.MustCompile(`(?m)^\| (\d+) \x60`)
	errnoRow := regexp.MustCompile(`(?m)^\| fi_errno .*`)
	errnoNum := regexp.MustCompile(`\x60FI_[A-Z]+\x60 \((\d+)\)`)

	var docProv, docErrno []int
	for _, m := range provRow.FindAllStringSubmatch(section, -1) {
		n, _ := strconv.Atoi(m[1])
		docProv = append(docProv, n)
	}
	for _, line := range errnoRow.FindAllString(section, -1) {
		cell := strings.SplitN(line, "|", 3)[1]
		for _, m := range errnoNum.FindAllStringSubmatch(cell, -1) {
			n, _ := strconv.Atoi(m[1])
			docErrno = append(docErrno, n)
		}
	}
	var codeProv, codeErrno []int
	for _, r := range efaHints {
		codeProv = append(codeProv, r.ProvErrno)
	}
	for _, r := range errnoHints {
		codeErrno = append(codeErrno, int(r.Errno))
	}
	sort.Ints(docProv)
	sort.Ints(docErrno)
	sort.Ints(codeProv)
	sort.Ints(codeErrno)
	assert.Equal(t, docProv, codeProv, "efa prov_errno rows: docs/EFA.md vs fabric/hints.go")
	assert.Equal(t, docErrno, codeErrno, "fi_errno rows: docs/EFA.md vs fabric/hints.go")

	// The last cell of a row is its source: `path@tag:line` entries.
	docSource := map[string]string{}
	for _, line := range regexp.MustCompile(`(?m)^\| (\d+ \x60|fi_errno ).*`).FindAllString(section, -1) {
		cells := strings.Split(strings.TrimSuffix(line, "|"), "|")
		src := strings.ReplaceAll(strings.TrimSpace(cells[len(cells)-1]), "`", "")
		if m := provRow.FindStringSubmatch(line); m != nil {
			docSource["prov "+m[1]] = src
			continue
		}
		for i, m := range errnoNum.FindAllStringSubmatch(cells[1], -1) {
			docSource["errno "+m[1]] = strings.Split(src, "; ")[i]
		}
	}
	entry := regexp.MustCompile(`^[a-z0-9_./]+@v\d+\.\d+\.\d+:\d+(-\d+)?$`)
	check := func(key string, r HintRow) {
		require.NotEmpty(t, r.Source, key)
		for _, e := range strings.Split(r.Source, "; ") {
			assert.Regexp(t, entry, e, "%s: source entries are path@tag:line", key)
		}
		assert.Equal(t, r.Source, docSource[key], "%s: source in docs/EFA.md vs fabric/hints.go", key)
	}
	for _, r := range efaHints {
		check("prov "+strconv.Itoa(r.ProvErrno), r)
	}
	for _, r := range errnoHints {
		check("errno "+strconv.Itoa(int(r.Errno)), r)
	}
}

func TestHintRowString(t *testing.T) {
	r, ok := LookupHint("efa", ErrHostUnreach, 15)
	require.True(t, ok)
	assert.Contains(t, r.String(), "efa prov_errno 15 EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE")
	r, ok = LookupHint("tcp;ofi_rxm", ErrTrunc, 0)
	require.True(t, ok)
	assert.Contains(t, r.String(), "fi_errno 265 FI_ETRUNC")
}
