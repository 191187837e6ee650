package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadmeSynopsis checks README.md's CLI synopsis against the flag sets
// the commands really parse: every flag of every command is in its
// synopsis, and the synopsis names no flag the command does not define.
func TestReadmeSynopsis(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	synopsis := readmeSynopsis(t, string(b))
	known := map[string]bool{}
	for _, c := range commands() {
		known[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			written, ok := synopsis[c.name]
			require.True(t, ok, "README's synopsis has no `fitransfer %s` line", c.name)
			fs := c.flags()
			inReadme := map[string]bool{}
			for _, w := range written {
				name := strings.TrimLeft(w, "-")
				inReadme[name] = true
				assert.NotNil(t, fs.Lookup(name), "README's synopsis names %s, which `fitransfer %s` does not define", w, c.name)
				assert.Equal(t, dashed(name), w, "README writes a one-letter flag with one dash, others with two")
			}
			var missing []string
			fs.VisitAll(func(f *flag.Flag) {
				if !inReadme[f.Name] {
					missing = append(missing, dashed(f.Name))
				}
			})
			assert.Empty(t, missing, "README's synopsis of `fitransfer %s` misses these flags", c.name)
		})
	}
	for name := range synopsis {
		assert.True(t, known[name], "README's synopsis has a command %q that fitransfer does not have", name)
	}
}

// readmeSynopsis returns the flags (as written, "-S", "--json") of each
// command in the first code block under "## The CLI". A line starting
// with "fitransfer NAME" (or "fitransfer read|write") starts a command;
// indented lines continue it.
func readmeSynopsis(t *testing.T, readme string) map[string][]string {
	_, section, ok := strings.Cut(readme, "\n## The CLI\n")
	require.True(t, ok, "README.md has a \"## The CLI\" section")
	_, block, ok := strings.Cut(section, "```\n")
	require.True(t, ok, "the CLI section opens a code block")
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok, "the CLI section's code block ends")

	flagRE := regexp.MustCompile(`(?:^|[\s\[|(])(--?[A-Za-z][A-Za-z0-9_-]*)`)
	out := map[string][]string{}
	var names []string
	for _, line := range strings.Split(block, "\n") {
		if rest, ok := strings.CutPrefix(line, "fitransfer "); ok {
			first, args, _ := strings.Cut(rest, " ")
			names = strings.Split(first, "|")
			for _, n := range names {
				require.NotContains(t, out, n, "README's synopsis has two lines for %q", n)
				out[n] = []string{}
			}
			line = args
		} else if strings.TrimSpace(line) != "" {
			require.NotEmpty(t, names, "synopsis line %q continues no command", line)
			require.True(t, line[0] == ' ', "synopsis line %q neither starts a command nor is indented", line)
		}
		for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
			for _, n := range names {
				out[n] = append(out[n], m[1])
			}
		}
	}
	return out
}

// dashed is a flag as the README writes it: -x, --name.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}
