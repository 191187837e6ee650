package ofi

/*
#include "ofi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// ParamType is the type libfabric parses a variable's value as
// (enum fi_param_type).
type ParamType int

// The fi_param_type values; ofi.c pins them to the headers.
const (
	ParamString ParamType = 0 // FI_PARAM_STRING
	ParamInt    ParamType = 1 // FI_PARAM_INT
	ParamBool   ParamType = 2 // FI_PARAM_BOOL
	ParamSizeT  ParamType = 3 // FI_PARAM_SIZE_T
)

// String names the type as its C enumerator does.
func (t ParamType) String() string {
	switch t {
	case ParamString:
		return "FI_PARAM_STRING"
	case ParamInt:
		return "FI_PARAM_INT"
	case ParamBool:
		return "FI_PARAM_BOOL"
	case ParamSizeT:
		return "FI_PARAM_SIZE_T"
	}
	return fmt.Sprintf("Unknown(%d)", int(t))
}

// Param is one environment variable that libfabric or one of its providers
// defined (struct fi_param).
type Param struct {
	Name string // e.g. "FI_LOG_LEVEL"
	Type ParamType
	Help string
	// Value is the variable's value in this process's environment when Set;
	// libfabric reports set-but-empty apart from unset, and so does this.
	Value string
	Set   bool
}

// Params returns every variable the loaded libfabric and its providers
// defined, in libfabric's order, each with its value in the environment
// now (fi_getparams, which initializes libfabric first when needed).
func Params() ([]Param, error) {
	var list *C.struct_fi_param
	var n C.int
	var rc C.int
	initialize(func() { rc = C.fi_getparams(&list, &n) })
	if err := check("fi_getparams", rc); err != nil {
		return nil, err
	}
	defer C.fi_freeparams(list)
	if n <= 0 || list == nil {
		return nil, nil
	}
	out := make([]Param, 0, int(n))
	for _, p := range unsafe.Slice(list, int(n)) {
		out = append(out, Param{
			Name:  goString(p.name),
			Type:  ParamType(p._type),
			Help:  goString(p.help_string),
			Value: goString(p.value),
			Set:   p.value != nil,
		})
	}
	return out, nil
}
