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
	RSS        int64 `json:"rss"`        // bytes resident (VmRSS)
	RSSAnon    int64 `json:"rss_anon"`   // of which private memory (RssAnon)
	RSSShmem   int64 `json:"rss_shmem"`  // of which shared memory pages (RssShmem): shm regions
	HeapAlloc  int64 `json:"heap_alloc"` // bytes of live Go heap objects (after a GC when the caller ran one)
}

// TakeStats measures this process.
func TakeStats() Stats {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := Stats{Goroutines: runtime.NumGoroutine(), HeapAlloc: int64(ms.HeapAlloc)}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.FDs = len(ents)
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "VmRSS:":
				s.RSS = kb << 10
			case "RssAnon:":
				s.RSSAnon = kb << 10
			case "RssShmem:":
				s.RSSShmem = kb << 10
			}
		}
	}
	return s
}
