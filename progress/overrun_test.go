package progress

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// largeJob is a job of n chunks of size bytes (the fake port touches no
// memory), with deadline d from now.
func largeJob(n int, size uint64, d time.Duration) *Job {
	j := NewJob()
	for i := range n {
		off := uint64(i) * size
		j.Chunks = append(j.Chunks, Chunk{Local: uintptr(off + 8), Len: size, Remote: off, Offset: off})
	}
	j.Start = time.Now()
	j.Deadline = j.Start.Add(d)
	return j
}

// TestLongCallAcrossTheDeadline: a 256 MiB job (32 chunks of 8 MiB) with a
// 100 ms deadline, whose reap runs across the deadline moving bytes and
// completing two ops, which leaves room to post two more (tcp inside
// fi_cq_read on a loaded machine), and whose next reap would complete
// every op posted: it ends with its deadline, and nothing more of it is
// posted past it. The round after the
// long call gets the clock of the round before it, as Wait gives it when
// that call did nothing, or a fresh one. Until the deadline check came
// before the round's posts and reap, and the round's job had a bound on
// what it has in flight, such a job had all 32 chunks posted in the first
// milliseconds, was completed by the next reap, and returned nil about
// 800 ms after its 20 ms deadline (test/TestDeadlineEndsLongTransfer, once
// in CI).
func TestLongCallAcrossTheDeadline(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		name := "the round's clock from before the call"
		if fresh {
			name = "a fresh clock"
		}
		t.Run(name, func(t *testing.T) {
			f := newFakePort()
			sp := &scriptedPort{fakePort: f, beforeReap: func(*fakePort) {}}
			l := newLoop(sp, 64, DefaultPollPolicy, zerolog.Nop())
			j := largeJob(32, 8<<20, time.Hour)
			require.NoError(t, l.Submit(j))
			l.drive.Lock()
			defer l.drive.Unlock()
			now := monoNow()
			for l.iterate(now) { // posts while it may
				now = monoNow()
			}
			before := f.posted.Load()
			assert.EqualValues(t, jobInflight/(8<<20), before, "in flight at once")

			// The long call: the deadline comes and passes inside it,
			// whatever the machine's load.
			sp.beforeReap = func(*fakePort) {
				sp.beforeReap = func(*fakePort) {}
				j.Deadline = time.Now().Add(100 * time.Millisecond)
				time.Sleep(105 * time.Millisecond)
			}
			f.complete(2)
			l.iterate(now)
			require.False(t, j.finished, "the round of the long call ended the job")
			require.Equal(t, 2, j.Completed)
			f.complete(-1) // the next reap would complete every op posted, and the round posts first
			if fresh {
				now = monoNow()
			}
			l.iterate(now)
			require.True(t, j.finished, "still running %v after its deadline", time.Since(j.Deadline))
			require.NotEmpty(t, j.Errs, "ended without an error %v after its deadline, %d of %d chunks completed",
				time.Since(j.Deadline), j.Completed, len(j.Chunks))
			var te *TimeoutError
			require.ErrorAs(t, j.Errs[0], &te)
			assert.ErrorIs(t, j.Errs[0], context.DeadlineExceeded)
			assert.Equal(t, before, f.posted.Load(), "posted past its deadline")
		})
	}
}

// TestWaitAcrossALongCall is TestLongCallAcrossTheDeadline through Wait,
// as a request waits. A 64 MiB job is all in flight (the most of a job
// that may be); its deadline is set 20 ms ahead and a round's reap takes
// 100 ms, completing nothing; then Wait drives, and its first reap would
// take 100 ms more and complete every op posted. Each run ends with the
// job's deadline. No goroutine of the loop's runs: Wait must drive (a
// waiter that finds another goroutine in a long call expires the job
// itself at its deadline), and the deadline starts after the posts, so
// that a slow start cannot pass the test without its long calls. Without
// the loop's checks by a fresh clock (checkMulti), every run returns nil
// 180 ms after the deadline.
func TestWaitAcrossALongCall(t *testing.T) {
	for run := range 10 {
		f := newFakePort()
		sp := &scriptedPort{fakePort: f, beforeReap: func(*fakePort) {}}
		l := newLoop(sp, 64, DefaultPollPolicy, zerolog.Nop())
		j := largeJob(int(jobInflight/(8<<20)), 8<<20, time.Hour) // all of it in flight at once
		require.NoError(t, l.Submit(j))
		l.drive.Lock()
		now := monoNow()
		for l.iterate(now) { // posts while it may
			now = monoNow()
		}
		require.EqualValues(t, len(j.Chunks), f.posted.Load(), "run %d: in flight at once", run)
		long := 0 // under the drive lock
		sp.beforeReap = func(f *fakePort) {
			switch long++; long {
			case 1: // the deadline comes and passes inside it, whatever the load
				j.Deadline = time.Now().Add(20 * time.Millisecond)
				time.Sleep(100 * time.Millisecond)
			case 2:
				time.Sleep(100 * time.Millisecond)
				f.complete(-1)
			}
		}
		// This round's reap is the first long call, the test's own. The
		// round has the clock of the round before, as Wait gives it after
		// a round that did nothing.
		l.iterate(now)
		require.False(t, j.finished, "run %d: the round of the long call ended the job", run)
		l.drive.Unlock()
		err := l.Wait(context.Background(), j)
		require.NoError(t, err, "run %d: Wait", run) // the job's errors are its own
		require.NotEmpty(t, j.Errs, "run %d: nil %v after the deadline, %d of %d chunks completed",
			run, time.Since(j.Deadline), j.Completed, len(j.Chunks))
		assert.ErrorIs(t, j.Errs[0], context.DeadlineExceeded, "run %d", run)
	}
}

// scriptedPort is a fakePort that runs beforeReap (under the loop's drive
// lock) before each reap, and beforePost, when set, before each post: a
// test's long call, or its completions.
type scriptedPort struct {
	*fakePort
	beforeReap func(*fakePort)
	beforePost func(*fakePort)
}

func (s *scriptedPort) post(n int) (int, error) {
	if s.beforePost != nil {
		s.beforePost(s.fakePort)
	}
	return s.fakePort.post(n)
}

func (s *scriptedPort) reap() ([]uint32, error) {
	s.beforeReap(s.fakePort)
	return s.fakePort.reap()
}

// TestJobInflightBound: a job has at most jobInflight bytes in flight (or
// one chunk, when larger), whatever the slots and the round's budget
// allow, and still completes every chunk. The bound is in bytes, not in
// chunks of the first one's size: a job whose first chunk is small has no
// more in flight than one whose chunks are all large.
func TestJobInflightBound(t *testing.T) {
	for _, tt := range []struct {
		name   string
		chunks int
		size   uint64
		first  uint64 // the first chunk's size, when not size
		window int
	}{
		{"8 MiB chunks", 40, 8 << 20, 0, 8},
		{"chunks larger than the bound", 5, 100 << 20, 0, 1},
		{"48 MiB chunks", 5, 48 << 20, 0, 1},
		{"64 KiB chunks", 2000, 64 << 10, 0, 1024},
		{"a 64 KiB chunk, then 8 MiB ones", 40, 8 << 20, 64 << 10, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, f := testLoop(t, 4096, false)
			j := largeJob(tt.chunks, tt.size, time.Hour)
			if tt.first != 0 {
				j.Chunks[0].Len = tt.first
			}
			require.NoError(t, l.Submit(j))
			most := 0
			for range 100000 {
				for step(l) { // posts while it may: a round posts postBytes at most
				}
				most = max(most, f.inFlight())
				if j.finished {
					break
				}
				f.complete(1 + f.inFlight()/2)
			}
			require.True(t, j.finished)
			require.Empty(t, j.Errs)
			assert.Equal(t, tt.chunks, j.Completed)
			assert.Equal(t, tt.window, most, "chunks in flight at once")
		})
	}
}

// TestBlockedAcrossTheDeadline: a job of several chunks, all in flight,
// whose loop waits on the CQ's file descriptor (nothing completes, no
// waiter drives) until past the job's deadline, and is then woken with
// every op complete: it ends with its deadline, not with the reap after
// the wait, which is a call begun after it.
func TestBlockedAcrossTheDeadline(t *testing.T) {
	for run := range 20 {
		f := newFakePort()
		f.canWait = true
		// No spin: the loop waits on the descriptor as soon as it is idle, for
		// as long as the test needs (its waits end by the test's signal).
		l := newLoop(f, 64, PollPolicy{Spin: time.Nanosecond, MinSleep: time.Minute, MaxSleep: time.Minute}, zerolog.Nop())
		go l.run()
		j := largeJob(8, 8<<20, time.Hour)
		require.NoError(t, l.Submit(j))
		require.Eventually(t, func() bool { return f.posted.Load() == 8 && f.inWait.Load() },
			10*time.Second, time.Millisecond, "run %d: the loop posted and waits", run)
		// The deadline comes, and passes, while it waits (it holds no lock
		// meanwhile). Set later than the loop's last look at it by more
		// than deadlineGrain: a deadline that passed within the grain of
		// a look may go unseen by the next call.
		l.drive.Lock()
		j.Deadline = time.Now().Add(time.Millisecond)
		l.drive.Unlock()
		time.Sleep(time.Until(j.Deadline))
		require.True(t, f.inWait.Load(), "run %d: the loop woke before the test", run)
		f.complete(-1)
		f.signal()
		select {
		case <-j.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: the job never ended", run)
		}
		l.Close(nil)
		require.NotEmpty(t, j.Errs, "run %d: nil %v after its deadline, %d of %d chunks completed",
			run, time.Since(j.Deadline), j.Completed, len(j.Chunks))
		assert.ErrorIs(t, j.Errs[0], context.DeadlineExceeded, "run %d", run)
	}
}

// TestPostAcrossTheDeadline: a post that runs across a job's deadline
// (2.x's tcp sends inline as the reader drains the socket) posts the
// job's last chunks, and the reap of the same round would complete every
// op of it: the job ends with its deadline, checked between the two
// calls.
func TestPostAcrossTheDeadline(t *testing.T) {
	f := newFakePort()
	sp := &scriptedPort{fakePort: f, beforeReap: func(*fakePort) {}} // nothing completes: the window fills
	l := newLoop(sp, 64, DefaultPollPolicy, zerolog.Nop())
	window := int(jobInflight / (8 << 20))
	j := largeJob(window+2, 8<<20, time.Hour)
	require.NoError(t, l.Submit(j))
	l.drive.Lock()
	defer l.drive.Unlock()
	now := monoNow()
	for l.iterate(now) {
		now = monoNow()
	}
	require.EqualValues(t, window, f.posted.Load())
	f.complete(2)
	l.iterate(monoNow()) // room for the last two
	require.Equal(t, 2, j.Completed)
	sp.beforePost = func(*fakePort) { // the deadline comes and passes inside the post, whatever the load
		sp.beforePost = nil
		j.Deadline = time.Now().Add(100 * time.Millisecond)
		time.Sleep(105 * time.Millisecond)
	}
	sp.beforeReap = func(f *fakePort) { f.complete(-1) } // and the reap after them completes all
	l.iterate(monoNow())
	require.EqualValues(t, window+2, f.posted.Load(), "the last chunks were posted")
	require.True(t, j.finished)
	require.NotEmpty(t, j.Errs, "nil %v after its deadline, %d of %d chunks completed", time.Since(j.Deadline), j.Completed, len(j.Chunks))
	assert.ErrorIs(t, j.Errs[0], context.DeadlineExceeded)
}
