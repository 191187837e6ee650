package perftest

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/fitransfer/fitransfer/transport"
)

// Row is one line of results: one op and size, as fabtests' show_perf
// prints it, plus latency percentiles.
type Row struct {
	Provider    string  `json:"provider"`
	Peer        string  `json:"peer"` // the server's endpoint address
	Op          string  `json:"op"`   // read, write, pingpong
	Bytes       uint64  `json:"bytes"`
	Iters       int     `json:"iters"`
	Window      int     `json:"window"`
	TotalBytes  uint64  `json:"total_bytes"`
	Seconds     float64 `json:"seconds"`
	MBps        float64 `json:"mb_per_sec"` // decimal megabytes
	UsecPerXfer float64 `json:"usec_per_xfer"`
	MxfersPerS  float64 `json:"mxfers_per_sec"`
	P50Usec     float64 `json:"p50_usec"` // per op
	P99Usec     float64 `json:"p99_usec"`
	Verified    bool    `json:"verified"`
	Complete    bool    `json:"complete"` // false when interrupted
	// Rails: the bytes each rail moved in the timed part, with -v on a
	// manager with more than one rail.
	Rails []RailBytes `json:"rails,omitempty"`
}

// RailBytes is what one rail moved during a row.
type RailBytes struct {
	Rail     int    `json:"rail"`
	Domain   string `json:"domain"`
	Bytes    uint64 `json:"bytes"`
	Up       bool   `json:"up"`       // in use at the end
	Failures uint64 `json:"failures"` // times taken out of use during the row
}

// railDelta is what each rail moved between two Rails reports.
func railDelta(before, after []transport.Rail) []RailBytes {
	if len(after) < 2 || len(before) != len(after) {
		return nil
	}
	out := make([]RailBytes, len(after))
	for i, r := range after {
		out[i] = RailBytes{Rail: r.Rail, Domain: r.Domain, Bytes: r.Bytes - before[i].Bytes, Up: r.Up,
			Failures: r.Failures - before[i].Failures}
	}
	return out
}

// RailLine prints the rails of a row on one line ("" without rails).
func (r Row) RailLine() string {
	if len(r.Rails) == 0 {
		return ""
	}
	var parts []string
	for _, rb := range r.Rails {
		p := fmt.Sprintf("%s %s", rb.Domain, SizeString(rb.Bytes))
		if rb.Failures > 0 {
			p += fmt.Sprintf(" (failed %d×)", rb.Failures)
		}
		if !rb.Up {
			p += " (down)"
		}
		parts = append(parts, p)
	}
	return "  rails: " + strings.Join(parts, ", ")
}

// newRow computes the figures of n ops of size bytes that took elapsed,
// with per-op latency samples.
func newRow(op, provider string, size uint64, n, window int, elapsed time.Duration, lat []time.Duration) Row {
	r := Row{Provider: provider, Op: op, Bytes: size, Iters: n, Window: window, Seconds: elapsed.Seconds()}
	r.TotalBytes = size * uint64(n)
	xfers := n
	if op == "pingpong" {
		xfers = 2 * n // fabtests counts both directions
	}
	us := float64(elapsed) / float64(time.Microsecond)
	if xfers > 0 && us > 0 {
		r.MBps = float64(size) * float64(xfers) / us
		r.UsecPerXfer = us / float64(xfers)
		r.MxfersPerS = 1 / r.UsecPerXfer
	}
	if op == "pingpong" {
		r.TotalBytes *= 2
	}
	r.P50Usec, r.P99Usec = percentile(lat, 0.50), percentile(lat, 0.99)
	return r
}

func percentile(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p*float64(len(s)))) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i]) / float64(time.Microsecond)
}

// Header is the column line: fabtests' columns (show_perf in
// fabtests/common/shared.c), then the percentiles.
var Header = fmt.Sprintf("%-8s%-8s%-8s%8s %10s%13s%13s%13s%13s",
	"bytes", "iters", "total", "time", "MB/sec", "usec/xfer", "Mxfers/sec", "p50 usec", "p99 usec")

// WriteHeader prints Header.
func WriteHeader(w io.Writer) { fmt.Fprintln(w, Header) }

// String prints the row under Header, with fabtests' widths and units.
func (r Row) String() string {
	s := fmt.Sprintf("%-8s%-8s%-8s%8.2fs%10.2f%11.2f%11.2f%13.2f%13.2f",
		SizeString(r.Bytes), CountString(int64(r.Iters)), SizeString(r.TotalBytes),
		r.Seconds, r.MBps, r.UsecPerXfer, r.MxfersPerS, r.P50Usec, r.P99Usec)
	if !r.Complete {
		s += "   (interrupted)"
	}
	return s
}
