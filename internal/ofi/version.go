package ofi

/*
#include "ofi.h"
*/
import "C"

import "fmt"

// Version is a libfabric API or provider version, encoded as libfabric
// encodes it: major<<16 | minor.
type Version uint32

// MakeVersion builds a Version from its parts, as FI_VERSION does.
func MakeVersion(major, minor int) Version { return Version(uint32(major)<<16 | uint32(minor)&0xffff) }

// Major is the major part of the version.
func (v Version) Major() int { return int(v >> 16) }

// Minor is the minor part of the version.
func (v Version) Minor() int { return int(v & 0xffff) }

// String prints the version as libfabric does: "1.17".
func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major(), v.Minor()) }

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor int) bool { return v >= MakeVersion(major, minor) }

// MarshalText renders the version as "major.minor".
func (v Version) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText parses "major.minor".
func (v *Version) UnmarshalText(b []byte) error {
	var major, minor int
	if _, err := fmt.Sscanf(string(b), "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("version %q: want major.minor", b)
	}
	*v = MakeVersion(major, minor)
	return nil
}

// CompiledVersion is the API version of the libfabric headers this binary
// was compiled against (FI_MAJOR_VERSION.FI_MINOR_VERSION).
func CompiledVersion() Version { return Version(C.ft_compiled_version()) }

// RuntimeVersion is the API version of the libfabric library loaded at run
// time (fi_version()).
func RuntimeVersion() Version { return Version(C.fi_version()) }

// LibraryVersion is the release string of the loaded library as libfabric
// prints it (fi_tostr(FI_TYPE_VERSION)), e.g. "1.17.0".
func LibraryVersion() string {
	var buf [64]C.char
	return C.GoString(C.ft_library_version(&buf[0], C.size_t(len(buf))))
}

// NegotiatedVersion is the API version fitransfer asks fi_getinfo for:
// the older of the compiled and the runtime version. Asking for a version
// newer than the library knows makes fi_getinfo fail with -FI_ENOSYS; asking
// for an older one than the headers describe would make the provider hide
// behaviour the structures assume.
func NegotiatedVersion() Version {
	c, r := CompiledVersion(), RuntimeVersion()
	if r < c {
		return r
	}
	return c
}
