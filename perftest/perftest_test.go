package perftest

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

func TestParseSizes(t *testing.T) {
	tests := []struct {
		in   string
		want []uint64
		err  string
	}{
		{"", DefaultSizes, ""},
		{"4096", []uint64{4096}, ""},
		{"64k", []uint64{65536}, ""},
		{"1m", []uint64{1 << 20}, ""},
		{"8,4k,1M", []uint64{8, 4096, 1 << 20}, ""},
		{"r:1k,1k,4k", []uint64{1024, 2048, 3072, 4096}, ""},
		{"r:1,0,4", nil, `bad size "0"`},
		{"r:8,1,4", nil, "start <= end"},
		{"r:8,1", nil, "want r:start,inc,end"},
		{"0", nil, "bad size"},
		{"-5", nil, "bad size"},
		{"99999999999g", nil, "bad size"},
		{"lots", nil, "bad size"},
	}
	for _, tt := range tests {
		got, err := ParseSizes(tt.in)
		if tt.err != "" {
			assert.ErrorContains(t, err, tt.err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
	all, err := ParseSizes("all")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), all[0])
	assert.Equal(t, uint64(8<<20), all[len(all)-1])
	assert.Contains(t, all, uint64(3))
	assert.Contains(t, all, uint64(1536))
}

func TestFabtestsFormats(t *testing.T) {
	for size, want := range map[uint64]string{8: "8", 1536: "1.5k", 65536: "64k", 1 << 20: "1m", 3 << 29: "1.5g", 12 << 10: "12k"} {
		assert.Equal(t, want, SizeString(size))
	}
	for n, want := range map[int64]string{200: "200", 20000: "20k", 2500000: "2m"} {
		assert.Equal(t, want, CountString(n))
	}
	r := newRow("write", "shm", 65536, 2000, 64, 100*time.Millisecond, []time.Duration{time.Microsecond, 3 * time.Microsecond})
	assert.InDelta(t, 1310.72, r.MBps, 0.01) // 65536*2000 B / 100000 us
	assert.InDelta(t, 50, r.UsecPerXfer, 0.01)
	assert.InDelta(t, 0.02, r.MxfersPerS, 0.001)
	assert.Equal(t, 1.0, r.P50Usec)
	assert.Equal(t, 3.0, r.P99Usec)
	r.Complete = true
	assert.Equal(t, "64k     2k      125m        0.10s   1310.72      50.00       0.02         1.00         3.00", r.String())
	p := newRow("pingpong", "shm", 8, 1000, 1, 10*time.Millisecond, nil)
	assert.InDelta(t, 5, p.UsecPerXfer, 0.01, "two transfers per iteration, as fabtests counts")
}

func TestPattern(t *testing.T) {
	b := make([]byte, 1001)
	Fill(b, 42)
	assert.Equal(t, int64(-1), Mismatch(b, 42))
	b[999] ^= 1
	assert.Equal(t, int64(999), Mismatch(b, 42))
	assert.NotEqual(t, int64(-1), Mismatch(b, 43))
	seen := map[byte]bool{}
	for i := 1; i <= 255; i++ {
		assert.NotZero(t, Marker(i))
		assert.NotEqual(t, Marker(i), Marker(i+1))
		seen[Marker(i)] = true
	}
	assert.Len(t, seen, 255)
	assert.NotEqual(t, Marker(1), Marker(pingCalibration), "the calibration's last marker would read as the next exchange's first")
}

// TestServerSurvivesBadClients sends a server garbage, another protocol
// version, an unknown mode and an early disconnect; each gets an error
// line (and, where it can be sent, an error message) and the server keeps
// serving a good client.
func TestServerSurvivesBadClients(t *testing.T) {
	m, err := transport.New(context.Background(), transport.WithProviders("shm"))
	require.NoError(t, err)
	defer m.Close()
	var mu sync.Mutex
	var logs []string
	logf := func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(f, a...))
	}
	srv, err := Listen(m, "127.0.0.1:0", ServerConfig{Size: 1 << 20, Idle: 5 * time.Second}, logf, func(string, ...any) {})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, false) }()
	addr := srv.Addr().String()

	raw := func(payload []byte) string {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_, _ = c.Write(payload)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := bootstrap.ReadFrame(c)
		if err != nil {
			return ""
		}
		return string(b)
	}
	frame := func(s string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
	}
	raw([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	assert.Contains(t, raw(frame(`{"v":9,"type":"hello"}`)), "protocol version 9")
	assert.Contains(t, raw(frame(`{"v":1,"type":"hello","mode":"dance"}`)), `unknown mode \"dance\"`)
	raw(frame(`{"v":1,"type":"hello","mode":"read"}`)[:10]) // cut short

	// A good client still works.
	c, err := transport.New(context.Background(), transport.WithProviders("shm"))
	require.NoError(t, err)
	defer c.Close()
	s, err := Connect(Config{Server: addr, Manager: c, Mode: bootstrap.ModeWrite, Sizes: []uint64{4096},
		Iters: 10, Window: 4, Verify: true, Timeout: 5 * time.Second}, bootstrap.Message{})
	require.NoError(t, err)
	rows, err := s.RunBandwidth(context.Background())
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.True(t, rows[0].Verified)
	s.Close()

	// One line per bad client, naming it and what was wrong; the good
	// client's session logs nothing. The last bad client's line comes
	// when the server reads its EOF.
	want := []*regexp.Regexp{
		regexp.MustCompile(`^client 127\.0\.0\.1:\d+: no hello: frame too large: \d+ bytes \(at most 65536\): not a fitransfer peer\?$`),
		regexp.MustCompile(`^client 127\.0\.0\.1:\d+: protocol version 9; this fitransfer speaks version 1 `),
		regexp.MustCompile(`^client 127\.0\.0\.1:\d+: unknown mode "dance" \(read, write, pingpong\)$`),
		regexp.MustCompile(`^client 127\.0\.0\.1:\d+: no hello: unexpected EOF$`),
	}
	logged := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(logs)
	}
	require.Eventually(t, func() bool { return len(logged()) >= len(want) }, 10*time.Second, 10*time.Millisecond,
		"one log line per bad client: %q", logged())
	cancel()
	require.ErrorIs(t, <-served, context.Canceled)
	got := logged()
	require.Len(t, got, len(want), "%q", got)
	for _, re := range want {
		n := 0
		for _, l := range got {
			if re.MatchString(l) {
				n++
			}
		}
		assert.Equal(t, 1, n, "lines matching %s in %q", re, got)
	}
}

// TestPingPongLeavesNoMarker: each pingpong exchange leaves the server's
// buffer clear, so that no marker of one (the calibration's, a larger
// size's data) reads as the next one's first write; the sizes, larger
// first and verified, would leave such bytes.
func TestPingPongLeavesNoMarker(t *testing.T) {
	m, err := transport.New(context.Background(), transport.WithProviders("shm"))
	require.NoError(t, err)
	defer m.Close()
	srv, err := Listen(m, "127.0.0.1:0", ServerConfig{Size: 1 << 20, Idle: 5 * time.Second}, func(string, ...any) {}, func(string, ...any) {})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Serve(ctx, false) }()

	c, err := transport.New(context.Background(), transport.WithProviders("shm"))
	require.NoError(t, err)
	defer c.Close()
	cfg := Config{Server: srv.Addr().String(), Manager: c, Mode: bootstrap.ModePingPong, Sizes: []uint64{4096, 64, 32},
		Iters: 50, Warmup: 1, WarmupFor: time.Millisecond, Verify: true, Timeout: 5 * time.Second}
	p, err := NewPingPongBuffer(cfg)
	require.NoError(t, err)
	defer p.Close()
	s, err := Connect(cfg, p.Hello())
	require.NoError(t, err)
	defer s.Close()
	rows, err := s.RunPingPong(context.Background(), p)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	for _, r := range rows {
		assert.True(t, r.Verified, "%d B", r.Bytes)
	}

	mem, err := mr.Alloc(2 * 4096)
	require.NoError(t, err)
	defer func() { _ = mr.Free(mem) }()
	local, err := c.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	defer local.Close()
	remote, err := s.remote.Slice(0, 2*4096)
	require.NoError(t, err)
	require.NoError(t, c.ReadInto(context.Background(), local, remote))
	for i, b := range mem {
		if b != 0 {
			t.Fatalf("the server's buffer holds %#x at %d after the exchanges", b, i)
		}
	}
}

// TestListenHint: a failed listen's hint fits its cause: an address in
// use suggests another port, a name or address not of this host says what
// --listen takes, and nothing is suggested for what is not understood.
func TestListenHint(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	_, inUse := net.Listen("tcp", busy.Addr().String())
	_, notHere := net.Listen("tcp", "192.0.2.1:0") // TEST-NET-1: no host has it
	_, noName := net.Listen("tcp", "nosuch.invalid:0")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{inUse, "another server"},
		{notHere, "no interface of this host has that address"},
		{noName, "an address of this host"},
		{fmt.Errorf("something else"), ""},
	} {
		require.Error(t, tc.err)
		if tc.want == "" {
			assert.Empty(t, listenHint(tc.err), "%v", tc.err)
			continue
		}
		assert.Contains(t, listenHint(tc.err), tc.want, "%v", tc.err)
	}
}

// TestBadArguments: a nil context, a non-positive client timeout, and an
// idle limit left at 0 get an error naming them or the documented
// default, not a panic or a session that ends for another reason.
func TestBadArguments(t *testing.T) {
	var nilCtx context.Context
	_, err := (&Session{}).RunBandwidth(nilCtx)
	assert.ErrorContains(t, err, "perftest.RunBandwidth: nil context.Context")
	_, err = (&Session{}).RunPingPong(nilCtx, nil)
	assert.ErrorContains(t, err, "perftest.RunPingPong: nil context.Context")
	assert.ErrorContains(t, (&Server{}).Serve(nilCtx, true), "perftest.Serve: nil context.Context")
	assert.ErrorContains(t, WaitByte(nilCtx, make([]byte, 8), 1, time.Second, nil, nil), "perftest.WaitByte: nil context.Context")
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := Connect(Config{Server: "127.0.0.1:1", Timeout: d}, bootstrap.Message{})
		assert.ErrorContains(t, err, "want a positive duration", "Timeout %v", d)
	}

	m, err := transport.New(context.Background(), transport.WithProviders("tcp;ofi_rxm"))
	require.NoError(t, err)
	defer m.Close()
	s, err := Listen(m, "127.0.0.1:0", ServerConfig{Size: 4096}, t.Logf, t.Logf)
	require.NoError(t, err)
	defer func() { _ = s.ln.Close(); _ = s.Close() }()
	assert.Equal(t, DefaultIdleTimeout, s.idle)
}
