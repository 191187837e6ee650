package testpeer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// envFunc names the function a child started by StartFunc runs.
const envFunc = "FITRANSFER_TESTPEER_FUNC"

// A Func is a program's main for a child process: conn is its stdin and
// stdout, args the arguments StartFunc was given.
type Func func(conn io.ReadWriter, args []string) error

var funcs = map[string]Func{}

// Register makes fn the child side of StartFunc(name). Call it from init
// or a package variable's initializer: the child finds it there before
// TestMain calls MaybeRun.
func Register(name string, fn Func) {
	if _, dup := funcs[name]; dup {
		panic("testpeer: " + name + " registered twice")
	}
	funcs[name] = fn
}

// runFunc is the child side of StartFunc: it runs the registered
// function and returns the exit status.
func runFunc(name string) int {
	fn, ok := funcs[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "testpeer: no function %q registered\n", name)
		return 2
	}
	var args []string
	for i, a := range os.Args {
		if a == "--" {
			args = os.Args[i+1:]
			break
		}
	}
	conn := struct {
		io.Reader
		io.Writer
	}{os.Stdin, os.Stdout}
	if err := fn(conn, args); err != nil {
		fmt.Fprintf(os.Stderr, "testpeer %s: %v\n", name, err)
		return 1
	}
	return 0
}

// Process is a child process running a registered Func, spoken to line by
// line. Unlike Start it needs no testing.TB, so that Examples can start
// one.
type Process struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan lineOrErr
	waitc chan error
}

type lineOrErr struct {
	line string
	err  error
}

// StartFunc starts this test binary again running the Func registered as
// name with args.
func StartFunc(name string, args ...string) (*Process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), envFunc+"="+name)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{name: name, cmd: cmd, in: in, lines: make(chan lineOrErr), waitc: make(chan error, 1)}
	// One reader owns stdout, so that ReadLine can give up after a while
	// without losing a line that comes later.
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			p.lines <- lineOrErr{line: sc.Text()}
		}
		err := sc.Err()
		if err == nil {
			err = io.EOF
		}
		p.lines <- lineOrErr{err: fmt.Errorf("%s exited before answering: %w", name, err)}
		close(p.lines)
		p.waitc <- cmd.Wait()
	}()
	return p, nil
}

// WriteLine sends one line to the child's stdin.
func (p *Process) WriteLine(s string) error {
	if strings.Contains(s, "\n") {
		return errors.New("testpeer: a line must not hold a newline")
	}
	_, err := io.WriteString(p.in, s+"\n")
	return err
}

// ReadLine returns the child's next line of output, waiting at most 60 s.
func (p *Process) ReadLine() (string, error) {
	select {
	case l, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("%s has exited", p.name)
		}
		return l.line, l.err
	case <-time.After(60 * time.Second):
		return "", fmt.Errorf("%s did not answer within 60 s", p.name)
	}
}

// Close closes the child's stdin, its cue to return, and waits up to 10 s
// for it to exit, then kills it. It returns the child's failure, if any.
func (p *Process) Close() error {
	_ = p.in.Close()
	go func() {
		for range p.lines { // output nobody read: the reader then waits for the child
		}
	}()
	select {
	case err := <-p.waitc:
		return err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("%s did not exit within 10 s of its stdin closing: killed", p.name)
	}
}
