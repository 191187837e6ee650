// Package ofi is fitransfer's only cgo surface: it binds the system
// libfabric (found through pkg-config) and converts between libfabric's C
// structures and plain Go values.
//
// Every other package of the module is plain Go. C types never leave this
// package; handles are wrapped in Go types whose methods make the C calls.
// Symbols that only exist in newer libfabric headers (1.18+, 2.x) are guarded
// with #if on FI_VERSION in the C helper files, so the package builds against
// Debian's 1.17 as well as the AWS EFA installer's 2.x.
package ofi
