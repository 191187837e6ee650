package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/doctor"
)

// doctorOptions are doctor's flags.
type doctorOptions struct {
	asJSON        bool
	allowEmulated bool
}

// doctorFlags is doctor's flag set and the options it fills.
func doctorFlags() (*flag.FlagSet, *doctorOptions) {
	fs := flag.NewFlagSet("fitransfer doctor", flag.ContinueOnError)
	o := &doctorOptions{}
	fs.Usage = defaultUsage(fs, "[--json] [--allow-emulated]")
	fs.BoolVar(&o.asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&o.allowEmulated, "allow-emulated", false, "count EFA with emulated RMA as usable (P4d-class writes)")
	return fs, o
}

func runDoctor(args []string, stdout, stderr io.Writer) int {
	fs, o := doctorFlags()
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	opts := doctor.Options{}
	if o.allowEmulated {
		opts.Policy = fabric.AllowEmulatedRMA
	}
	r := doctor.Run(opts)
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "fitransfer doctor: %v\n", err)
			return exitFail
		}
	} else {
		for _, c := range r.Checks {
			fmt.Fprintf(stdout, "%-4s  %-20s %s\n", c.Status, c.Name, c.Detail)
			if c.Fix != "" {
				fmt.Fprintf(stdout, "      %-20s fix: %s\n", "", c.Fix)
			}
		}
		if r.Rails != nil {
			if err := r.Rails.WriteText(stdout); err != nil {
				fmt.Fprintf(stderr, "fitransfer doctor: %v\n", err)
				return exitFail
			}
		}
		fmt.Fprintf(stdout, "verdict: %s\n", r.Verdict)
	}
	if !r.OK {
		return exitFail
	}
	return exitOK
}
