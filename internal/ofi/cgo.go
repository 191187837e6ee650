package ofi

/*
#cgo pkg-config: libfabric
#cgo LDFLAGS: -ldl
#include "ofi.h"
*/
import "C"
