// Package perftest is the measuring side of `fitransfer serve`, `read`,
// `write`, `pingpong` and `bench`: a server that gives each client a
// buffer and fills, verifies and answers pingpongs on request, the client
// loops that measure bandwidth and latency as fabtests does, and the rows
// they print (fabtests' columns and units).
package perftest

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultSizes are fabtests' default sizes (no -S).
var DefaultSizes = []uint64{64, 256, 1 << 10, 4 << 10, 64 << 10, 1 << 20}

// AllSizes are fabtests' sizes for -S all: 1 B to 8 MiB, powers of two
// and the 1.5× steps between them.
func AllSizes() []uint64 {
	out := []uint64{1}
	for s := uint64(2); s <= 8<<20; s <<= 1 {
		out = append(out, s)
		if s+s/2 <= 8<<20 && s < 8<<20 {
			out = append(out, s+s/2)
		}
	}
	return out
}

// ParseSizes parses -S as fabtests does: a size ("4096", "64k", "1m",
// "1g"), "all", or a range "r:start,inc,end"; and also a comma-separated
// list of sizes. Empty means DefaultSizes.
func ParseSizes(spec string) ([]uint64, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case strings.Contains(spec, ",") && !strings.HasPrefix(spec, "r:"):
		var out []uint64
		for _, p := range strings.Split(spec, ",") {
			n, err := ParseSize(p)
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
		return out, nil
	case spec == "":
		return DefaultSizes, nil
	case spec == "all":
		return AllSizes(), nil
	case strings.HasPrefix(spec, "r:"):
		parts := strings.Split(spec[2:], ",")
		if len(parts) != 3 {
			return nil, fmt.Errorf("size range %q: want r:start,inc,end", spec)
		}
		var v [3]uint64
		for i, p := range parts {
			n, err := ParseSize(p)
			if err != nil {
				return nil, fmt.Errorf("size range %q: %w", spec, err)
			}
			v[i] = n
		}
		if v[1] == 0 || v[0] == 0 || v[0] > v[2] {
			return nil, fmt.Errorf("size range %q: want 0 < start <= end and inc > 0", spec)
		}
		var out []uint64
		for s := v[0]; s <= v[2] && len(out) < 10000; s += v[1] {
			out = append(out, s)
		}
		return out, nil
	}
	n, err := ParseSize(spec)
	if err != nil {
		return nil, err
	}
	return []uint64{n}, nil
}

// ParseSize parses "4096", "64k", "1m", "1g" (binary multiples), at least 1.
func ParseSize(s string) (uint64, error) {
	s = strings.TrimSpace(strings.ToLower(s))
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q: want a positive number of bytes, optionally with k, m or g", s)
	}
	return n * mult, nil
}

// DefaultIters is fabtests' iteration count for a bandwidth test of size
// bytes (size_to_count).
func DefaultIters(size uint64) int {
	switch {
	case size >= 1<<20:
		return 200
	case size >= 1<<16:
		return 2000
	}
	return 20000
}

// DefaultPingPongIters is fabtests' count for latency tests.
func DefaultPingPongIters(size uint64) int { return DefaultIters(size) / 2 }

// SizeString prints a size as fabtests' size_str does ("1.5k", "64k", "1m").
func SizeString(size uint64) string {
	base, mag := uint64(1), ""
	switch {
	case size >= 1<<30:
		base, mag = 1<<30, "g"
	case size >= 1<<20:
		base, mag = 1<<20, "m"
	case size >= 1<<10:
		base, mag = 1<<10, "k"
	}
	if size/base < 10 {
		if frac := (size % base) * 10 / base; frac != 0 {
			return fmt.Sprintf("%d.%d%s", size/base, frac, mag)
		}
	}
	return fmt.Sprintf("%d%s", size/base, mag)
}

// CountString prints a count as fabtests' cnt_str does ("20k", "2m").
func CountString(n int64) string {
	switch {
	case n >= 1000000000:
		return fmt.Sprintf("%db", n/1000000000)
	case n >= 1000000:
		return fmt.Sprintf("%dm", n/1000000)
	case n >= 1000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprintf("%d", n)
}
