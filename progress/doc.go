// Package progress drives libfabric's manual progress: one Loop per
// endpoint posts ops in batches within the endpoint's credits, reads the
// completion queue in batches, turns error completions (fi_cq_readerr)
// into typed errors, and keeps progressing when the endpoint is only a
// target, because on every provider fitransfer uses the target must poll
// too or initiators never see their ops complete. An idle loop parks where
// no peer can be kept waiting by it: on the CQ's wait fd, which traffic wakes,
// or, on an endpoint peers announce themselves to, while none has
// (Loop.ParkWhenUnattended, Loop.Attend).
package progress
