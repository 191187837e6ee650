package ofi

/*
#cgo pkg-config: libfabric
#include "ofi.h"
*/
import "C"
