package main

import "runtime/debug"

// buildVersion is the module version from the build info, "devel" for a
// build from a checkout.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}
