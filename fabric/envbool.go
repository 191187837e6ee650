package fabric

import (
	"fmt"
	"math"
	"os"
)

// EnvUseDeviceRDMA is the efa provider's variable for device RDMA. Setting
// it can make libfabric abort() the process; see EFAGate.
const EnvUseDeviceRDMA = "FI_EFA_USE_DEVICE_RDMA"

// ParseBool parses a libfabric boolean variable exactly as libfabric's
// fi_parse_bool does (src/var.c@v1.17.0:234, @v2.1.0:256, unchanged to
// v2.6.0): "0" and "1" compared byte for byte, "false", "no", "off",
// "true", "yes", "on" compared without ASCII case. Anything else — "",
// " 1", "y", "2" — is not a boolean (ok false); fi_param_get_bool then
// returns -FI_EINVAL and leaves the default alone.
func ParseBool(s string) (value, ok bool) {
	switch {
	case s == "0" || asciiFold(s, "false") || asciiFold(s, "no") || asciiFold(s, "off"):
		return false, true
	case s == "1" || asciiFold(s, "true") || asciiFold(s, "yes") || asciiFold(s, "on"):
		return true, true
	}
	return false, false
}

// asciiFold is strcasecmp(a, b) == 0 in the C locale: only ASCII letters
// fold (strings.EqualFold would also fold, say, "ſ" to "s").
func asciiFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// ParseInt117 reads a variable the way libfabric 1.17 reads an
// FI_PARAM_INT one: strtol(s, NULL, 0) stored into a C int
// (src/var.c@v1.17.0:290-291). Leading white space and a sign are
// skipped, "0x" means hex and a leading "0" octal, parsing stops at the
// first other character, a value beyond the range of long saturates, and
// the store into int keeps the low 32 bits. So "true" and "yes" give 0,
// " 1" and "1abc" give 1, and "4294967296" gives 0.
func ParseInt117(s string) int32 {
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	base := uint64(10)
	switch {
	case i+1 < len(s) && s[i] == '0' && (s[i+1] == 'x' || s[i+1] == 'X') && i+2 < len(s) && digitValue(s[i+2]) < 16:
		base, i = 16, i+2
	case i < len(s) && s[i] == '0':
		base = 8
	}
	var v uint64
	overflow := false
	for ; i < len(s); i++ {
		d := uint64(digitValue(s[i]))
		if d >= base {
			break
		}
		if v > (math.MaxUint64-d)/base {
			overflow = true
			continue
		}
		v = v*base + d
	}
	var l int64 // C long on LP64
	switch {
	case !neg && (overflow || v > math.MaxInt64):
		l = math.MaxInt64
	case neg && (overflow || v > 1<<63):
		l = math.MinInt64
	case neg:
		l = -int64(v)
	default:
		l = int64(v)
	}
	return int32(l)
}

func isCSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func digitValue(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'Z':
		return int(c-'A') + 10
	}
	return 99
}

// EnvTruthy reports whether a libfabric FI_PARAM_BOOL variable is set to
// true as libfabric reads it (ParseBool). A value libfabric rejects is not
// true: libfabric keeps the default, which for the variables fitransfer
// asks about (FI_SHM_DISABLE_CMA) is false.
func EnvTruthy(name string) bool {
	v, ok := ParseBool(os.Getenv(name))
	return ok && v
}

// DeviceRDMASetting is FI_EFA_USE_DEVICE_RDMA as one libfabric version
// reads it. The variable changed type: libfabric 1.17 defines it as an
// integer (FI_PARAM_INT, prov/efa/src/rxr/rxr_env.c@v1.17.0:160) read with
// fi_param_get_int (rxr_env.c@v1.17.0:98); from 1.18 it is a boolean
// (FI_PARAM_BOOL, prov/efa/src/efa_env.c@v2.1.0:60) read with
// fi_param_get_bool (prov/efa/src/rdm/efa_rdm_util.c@v2.1.0:54).
type DeviceRDMASetting struct {
	Set   bool   // the variable is in the environment (even if empty)
	Raw   string // its value
	Valid bool   // 1.18+: ParseBool accepts it; 1.17: always (strtol reads anything)
	On    bool   // what libfabric takes it to mean when Valid
	// Int is 1.17's reading (ParseInt117); 0 on 1.18+.
	Int int32
	// Integer is true when the library reads the variable as an integer
	// (libfabric older than 1.18).
	Integer bool
}

// ReadDeviceRDMASetting reads FI_EFA_USE_DEVICE_RDMA from the environment
// as the libfabric of runtime version rt reads it.
func ReadDeviceRDMASetting(rt Version) DeviceRDMASetting {
	raw, set := os.LookupEnv(EnvUseDeviceRDMA)
	return deviceRDMASetting(rt, raw, set)
}

func deviceRDMASetting(rt Version, raw string, set bool) DeviceRDMASetting {
	s := DeviceRDMASetting{Set: set, Raw: raw, Integer: !rt.AtLeast(1, 18)}
	if !set {
		return s
	}
	if s.Integer {
		s.Int = ParseInt117(raw)
		s.Valid, s.On = true, s.Int != 0
		return s
	}
	s.On, s.Valid = ParseBool(raw)
	return s
}

// String says how libfabric reads the setting, for logs and doctor.
func (s DeviceRDMASetting) String() string {
	switch {
	case !s.Set:
		return EnvUseDeviceRDMA + " not set"
	case s.Integer:
		return fmt.Sprintf("%s=%q, which libfabric 1.17 reads with strtol as %d (device RDMA %s)",
			EnvUseDeviceRDMA, s.Raw, s.Int, onOff(s.On))
	case !s.Valid:
		return fmt.Sprintf("%s=%q, which libfabric does not accept as a boolean (0/1/false/true/no/yes/off/on)",
			EnvUseDeviceRDMA, s.Raw)
	}
	return fmt.Sprintf("%s=%q (device RDMA %s)", EnvUseDeviceRDMA, s.Raw, onOff(s.On))
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
