// Package lifeline tells a process's peers that it lives without a system
// call per look: the process holds a robust, process-shared mutex in
// memory its peers map, from a thread of its own, and the kernel marks the
// mutex's word FUTEX_OWNER_DIED when that thread ends with the process —
// however the process ends (SIGKILL too), in its exit path, before its
// pidfd turns readable. A peer reads the word with one atomic load.
package lifeline

/*
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

struct ft_lifeline {
	pthread_t t;
	pthread_mutex_t *mu;     // in the shared memory
	pthread_mutex_t stop_mu; // the rest is this process's
	pthread_cond_t cv;
	int held, stop, err;
};

static void *ft_lifeline_hold(void *arg)
{
	struct ft_lifeline *l = arg;
	int err = pthread_mutex_lock(l->mu);

	pthread_mutex_lock(&l->stop_mu);
	l->err = err;
	l->held = 1;
	pthread_cond_broadcast(&l->cv);
	while (!l->stop)
		pthread_cond_wait(&l->cv, &l->stop_mu);
	pthread_mutex_unlock(&l->stop_mu);
	if (err == 0)
		pthread_mutex_unlock(l->mu);
	return NULL;
}

static int ft_lifeline_start(struct ft_lifeline *l, void *word)
{
	pthread_mutexattr_t a;
	int err;

	l->mu = word;
	l->held = l->stop = l->err = 0;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	err = pthread_mutex_init(l->mu, &a);
	pthread_mutexattr_destroy(&a);
	if (err)
		return err;
	pthread_mutex_init(&l->stop_mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	// The thread takes no signal: Go's handlers are for Go's threads.
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(&l->t, NULL, ft_lifeline_hold, l);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err)
		return err;
	pthread_mutex_lock(&l->stop_mu);
	while (!l->held)
		pthread_cond_wait(&l->cv, &l->stop_mu);
	err = l->err;
	pthread_mutex_unlock(&l->stop_mu);
	return err;
}

static void ft_lifeline_stop(struct ft_lifeline *l)
{
	pthread_mutex_lock(&l->stop_mu);
	l->stop = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->stop_mu);
	pthread_join(l->t, NULL);
}

static size_t ft_lifeline_size(void) { return sizeof(pthread_mutex_t); }
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Size is the bytes a lifeline takes in the shared memory, 8-aligned.
const Size = 64

// The futex word's bits (linux/futex.h).
const (
	futexOwnerDied = 0x40000000
	futexTIDMask   = 0x3fffffff
)

// Line is a held lifeline.
type Line struct {
	c *C.struct_ft_lifeline
}

// Hold starts a thread that holds a robust, process-shared mutex at the
// start of word (Size bytes, 8-aligned, in memory mapped shared), until
// Release. The memory must stay mapped until then.
func Hold(word []byte) (*Line, error) {
	if len(word) < Size || uintptr(unsafe.Pointer(&word[0]))%8 != 0 || C.ft_lifeline_size() > Size {
		return nil, fmt.Errorf("lifeline: %d bytes at %p: needs %d, 8-aligned", len(word), &word[0], Size)
	}
	l := &Line{c: (*C.struct_ft_lifeline)(C.calloc(1, C.sizeof_struct_ft_lifeline))}
	if rc := C.ft_lifeline_start(l.c, unsafe.Pointer(&word[0])); rc != 0 {
		C.free(unsafe.Pointer(l.c))
		return nil, fmt.Errorf("lifeline: %w", syscall.Errno(rc))
	}
	return l, nil
}

// Release lets the mutex go (its word then reads as not alive) and ends
// the thread.
func (l *Line) Release() {
	if l == nil || l.c == nil {
		return
	}
	C.ft_lifeline_stop(l.c)
	C.free(unsafe.Pointer(l.c))
	l.c = nil
}

// Alive reports whether the process that holds the lifeline whose first
// word is word still lives and holds it: a thread id in the word and no
// FUTEX_OWNER_DIED. A word never held, or let go, reads as not alive.
func Alive(word *uint32) bool {
	w := atomic.LoadUint32(word)
	return w&futexTIDMask != 0 && w&futexOwnerDied == 0
}
