package transport

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/progress"
)

// TestRetryable: which errors say that the same request may succeed if
// made again. The blocked errors are built as libfabric.Route.Blocked
// builds them (its TestBlocked checks which kind it gives).
func TestRetryable(t *testing.T) {
	blockedForGood := fmt.Errorf("%w: ops to a dead peer; close the manager and open a new one", errclass.ErrBlocked)
	blockedLeft := fmt.Errorf("%w: ops to a dead peer; %w", errclass.ErrBlocked, errclass.ErrRouteReplaced)
	failed := func(errs ...error) error {
		return &TransferError{Op: "read", Ops: 1, Chunks: len(errs), Failed: len(errs), Errs: errs}
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"a timeout", fmt.Errorf("%w: %w", ErrTimeout, context.DeadlineExceeded), true},
		{"a canceled context", context.Canceled, false},
		{"a peer gone", ErrPeerGone, false},
		{"a wedged endpoint", &progress.WedgedError{Provider: "shm", Since: 10 * time.Second}, false},
		{"an endpoint blocked for the manager's life (1.x)", blockedForGood, false},
		{"a blocked endpoint the next request leaves (2.x)", blockedLeft, true},
		{"the same in a failed transfer", failed(blockedLeft), true},
		{"and with a timeout", failed(blockedLeft, ErrTimeout), true},
		{"but not beside a peer gone", failed(blockedLeft, ErrPeerGone), false},
		{"an unknown error", fmt.Errorf("FI_EIO"), false},
	} {
		assert.Equal(t, c.want, Retryable(c.err), "%s: %v", c.name, c.err)
	}
}

// TestBadArguments: a nil context or a timeout that is not positive is
// refused with an error that names it, not a panic or a transfer that
// fails for another reason.
func TestBadArguments(t *testing.T) {
	var nilCtx context.Context
	t.Run("New", func(t *testing.T) {
		for _, d := range []time.Duration{0, -time.Second} {
			m, err := New(context.Background(), WithTimeout(d))
			assert.Nil(t, m)
			assert.ErrorContains(t, err, "want a positive duration", "WithTimeout(%v)", d)
		}
		_, err := New(nilCtx)
		assert.ErrorContains(t, err, "transport.New: nil context.Context")
		for _, source := range []string{"0.0.0.0", "::"} {
			_, err := New(context.Background(), WithSourceAddress(source))
			assert.ErrorContains(t, err, "a wildcard address", source)
		}
	})
	t.Run("WithProviders", func(t *testing.T) {
		testenv.RequireRoute(t, testenv.RouteTCP)
		testenv.RequireRoute(t, testenv.RouteMem)
		testenv.RequireRoute(t, testenv.RouteCMA)
		_, err := New(context.Background(), WithProviders("MEM"))
		assert.ErrorContains(t, err, `provider "MEM" offers no RDM endpoint with RMA here (usable here: mem, cma, `, "what WithProviders may name")
		assert.ErrorContains(t, err, testenv.RouteTCP)
	})
	t.Run("transfers", func(t *testing.T) {
		testenv.RequireRoute(t, testenv.RouteTCP)
		m, err := New(context.Background(), WithProviders(testenv.RouteTCP))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		b, err := m.Alloc(4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		h := b.Remote()
		assert.ErrorContains(t, m.ReadInto(nilCtx, b, h), "ReadInto: nil context.Context")
		assert.ErrorContains(t, m.WriteFrom(nilCtx, h, b), "WriteFrom: nil context.Context")
		a := m.NewAction()
		a.ReadInto(b, h)
		assert.ErrorContains(t, a.Submit(nilCtx), "Action.Submit: nil context.Context")
	})
}
