package testpeer

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Stats are a process's resource figures, for leak checks.
type Stats struct {
	Goroutines int   `json:"goroutines"`
	FDs        int   `json:"fds"`
	RSS        int64 `json:"rss"` // bytes
}

// TakeStats measures this process.
func TakeStats() Stats {
	s := Stats{Goroutines: runtime.NumGoroutine()}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.FDs = len(ents)
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				s.RSS = kb << 10
			}
		}
	}
	return s
}
