package test

import (
	"testing"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
)

// What each fault must produce, per route and libfabric major: a fault
// test looks its expectation up here and asserts it; it never picks the
// assertion from what happened. A change of behaviour, wanted or not, is
// a change of this table. The values are what libfabric 1.17.0 and 2.1.0
// produced, run after run (the commit that sets a value says how many).

// outcomeKey is a route (testenv.RouteMem, RouteCMA, RouteSHM, RouteTCP) under a
// libfabric major (the library loaded at run time).
type outcomeKey struct {
	route string
	major int
}

// stoppedEnd is how a transfer to a stopped owner (SIGSTOP) ends.
type stoppedEnd int

const (
	// completes: the initiator copies alone (from its mapping of the
	// owner's memfd, process_vm_readv/writev, shm's single copy), the
	// owner need not run.
	completes stoppedEnd = iota
	// checkTimesOut: the transfer times out in the handle check that
	// precedes its ops (a read of the owner's guard entry the owner must
	// answer): no op of the transfer was posted, none is in flight.
	checkTimesOut
	// opsTimeOut: the transfer's own ops time out, still in flight.
	opsTimeOut
	// answerTimesOut: the transfer times out waiting for an answer of
	// the owner's manager it needs before any op (its verification, or
	// the mapping of a buffer on the mem route): nothing was posted.
	answerTimesOut
)

func (e stoppedEnd) String() string {
	return [...]string{"completes", "handle check times out", "ops time out", "the owner's answer times out"}[e]
}

type outcome struct {
	// ownerKilledBlocks: after an owner was killed with ops in flight,
	// the manager's next transfer to another peer fails at once with
	// ErrEndpointBlocked (shm completes an endpoint's ops in order)
	// instead of working. None does now: on libfabric 2.x the manager's
	// own shm ops leave such an endpoint for a new one.
	ownerKilledBlocks bool
	// ownerStopped: how a 1 MiB transfer to a stopped owner ends.
	ownerStopped stoppedEnd
	// stoppedBig: how a 64 MiB transfer to a stopped owner ends, with the
	// manager's timeout of 1 s (TestCloseWithOpsInFlight).
	stoppedBig stoppedEnd
	// stoppedUnverified: how the first transfer of a new manager to an
	// owner stopped before it ends (TestOwnerStoppedFirst).
	stoppedUnverified stoppedEnd
	// stoppedNewBuffer: how the first transfer to a buffer the stopped
	// owner registered before it stopped ends, after transfers to another
	// of its buffers (TestOwnerStoppedFirst).
	stoppedNewBuffer stoppedEnd
}

var outcomes = map[outcomeKey]outcome{
	{testenv.RouteMem, 1}: {ownerKilledBlocks: false, ownerStopped: completes, stoppedBig: completes, stoppedUnverified: answerTimesOut, stoppedNewBuffer: answerTimesOut},
	{testenv.RouteMem, 2}: {ownerKilledBlocks: false, ownerStopped: completes, stoppedBig: completes, stoppedUnverified: answerTimesOut, stoppedNewBuffer: answerTimesOut},
	{testenv.RouteCMA, 1}: {ownerKilledBlocks: false, ownerStopped: completes, stoppedBig: completes, stoppedUnverified: answerTimesOut, stoppedNewBuffer: completes},
	{testenv.RouteCMA, 2}: {ownerKilledBlocks: false, ownerStopped: completes, stoppedBig: completes, stoppedUnverified: answerTimesOut, stoppedNewBuffer: completes},
	{testenv.RouteSHM, 1}: {ownerKilledBlocks: false, ownerStopped: completes, stoppedBig: completes, stoppedUnverified: answerTimesOut, stoppedNewBuffer: completes},
	{testenv.RouteSHM, 2}: {ownerKilledBlocks: false, ownerStopped: opsTimeOut, stoppedBig: opsTimeOut, stoppedUnverified: answerTimesOut, stoppedNewBuffer: checkTimesOut},
	{testenv.RouteTCP, 1}: {ownerKilledBlocks: false, ownerStopped: opsTimeOut, stoppedBig: opsTimeOut, stoppedUnverified: opsTimeOut, stoppedNewBuffer: opsTimeOut},
	{testenv.RouteTCP, 2}: {ownerKilledBlocks: false, ownerStopped: opsTimeOut, stoppedBig: opsTimeOut, stoppedUnverified: opsTimeOut, stoppedNewBuffer: opsTimeOut},
}

// expect is the outcome of faults on route under the libfabric loaded
// here; a pair the table lacks fails the test.
func expect(t *testing.T, route string) outcome {
	t.Helper()
	k := outcomeKey{route, fabric.RuntimeVersion().Major()}
	o, ok := outcomes[k]
	if !ok {
		t.Fatalf("no expected outcome for route %s on libfabric %s: measure it and add it to the table", route, fabric.CurrentVersions().Library)
	}
	return o
}
