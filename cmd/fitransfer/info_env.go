package main

import (
	"bufio"
	"io"
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
)

// paramTypeWords are fi_info's words for each variable type.
var paramTypeWords = map[fabric.ParamType]string{
	fabric.ParamString: "String",
	fabric.ParamInt:    "Integer",
	fabric.ParamSizeT:  "size_t",
	fabric.ParamBool:   "Boolean (0/1, on/off, true/false, yes/no)",
}

// writeParams prints libfabric's variables as `fi_info -e` does: a comment
// with the name and type, one with the help text, the assignment when the
// variable is set here, then a blank line. With filter, only the variables
// whose name contains substr, ignoring ASCII case, as `fi_info -g` does
// with strcasestr.
//
// fi_info writes a NUL byte on either side of a value without a space
// (printf's %c of '\0'); fitransfer leaves those out, so the assignment
// lines can be read by a shell.
func writeParams(w io.Writer, params []fabric.Param, filter bool, substr string) error {
	bw := bufio.NewWriter(w)
	for _, p := range params {
		if filter && !strings.Contains(asciiLower(p.Name), asciiLower(substr)) {
			continue
		}
		words, ok := paramTypeWords[p.Type]
		if !ok {
			words = "Unknown"
		}
		bw.WriteString("# " + p.Name + ": " + words + "\n")
		bw.WriteString("# " + p.Help + "\n")
		if p.Set {
			quote := ""
			if strings.Contains(p.Value, " ") {
				quote = `"`
			}
			bw.WriteString(p.Name + "=" + quote + p.Value + quote + "\n")
		}
		bw.WriteString("\n")
	}
	return bw.Flush()
}

// asciiLower folds only the bytes A–Z, as strcasestr does in the C locale
// fi_info runs in; strings.ToLower would fold other letters too (the
// Kelvin sign to k) and rewrite invalid UTF-8.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}
