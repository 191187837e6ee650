package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/doctor"
)

func maybeRunChild() (bool, int) { return doctor.MaybeRunCMAChild() }

func runDoctor(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fitransfer doctor", flag.ContinueOnError)
	fs.Usage = defaultUsage(fs, "[--json] [--allow-emulated]")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	allowEmulated := fs.Bool("allow-emulated", false, "count EFA with emulated RMA as usable (P4d-class writes)")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	opts := doctor.Options{}
	if *allowEmulated {
		opts.Policy = fabric.AllowEmulatedRMA
	}
	r := doctor.Run(opts)
	if *asJSON {
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
		fmt.Fprintf(stdout, "verdict: %s\n", r.Verdict)
	}
	if !r.OK {
		return exitFail
	}
	return exitOK
}
