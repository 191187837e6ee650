package perftest

import "math/rand/v2"

// Fill writes the pattern of seed: the same bytes on both hosts.
func Fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, ^seed))
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for v := r.Uint64(); i < len(b); i++ {
		b[i] = byte(v)
		v >>= 8
	}
}

// Mismatch returns the first offset where b differs from the pattern of
// seed, or -1.
func Mismatch(b []byte, seed uint64) int64 {
	r := rand.New(rand.NewPCG(seed, ^seed))
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			if b[i+k] != byte(v>>(8*k)) {
				return int64(i + k)
			}
		}
	}
	for v := r.Uint64(); i < len(b); i++ {
		if b[i] != byte(v) {
			return int64(i)
		}
		v >>= 8
	}
	return -1
}
