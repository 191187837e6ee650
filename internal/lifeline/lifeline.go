// Package lifeline tells a process's peers that it lives without a system
// call per look: a thread of the process's own registers, as its robust
// futex list, a list in memory its peers map, whose one entry is a word
// holding the thread's id. When the thread ends with the process — exit,
// SIGKILL — the kernel walks that list in the exit path, before the
// process's pidfd turns readable, and marks the word FUTEX_OWNER_DIED. The
// list lives in the shared page, not on the thread's stack, so a dying
// process whose private memory is reaped first (the OOM reaper,
// process_mrelease) is still marked. A peer reads the word with one
// atomic load. Where the kernel takes no robust list (seccomp, emulators),
// Hold fails and peers must ask the kernel as before.
package lifeline

/*
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

// In the shared memory: the word, then the thread's robust list head and
// its one entry, so that nothing the kernel reads at exit lies in memory
// that may be reaped first.
struct ft_shared {
	uint32_t word;
	uint32_t pad;
	struct robust_list_head head;
	struct robust_list entry;
};

struct ft_lifeline {
	pthread_t t;
	struct ft_shared *s;
	struct robust_list_head *libc_head; // the thread's own, restored before it ends
	size_t libc_len;
	pthread_mutex_t stop_mu;
	pthread_cond_t cv;
	int held, stop, err;
};

static void *ft_lifeline_hold(void *arg)
{
	struct ft_lifeline *l = arg;
	struct ft_shared *s = l->s;
	int err = 0;

	if (syscall(SYS_get_robust_list, 0, &l->libc_head, &l->libc_len) != 0) {
		err = errno;
	} else {
		s->entry.next = &s->head.list;
		s->head.list.next = &s->entry;
		s->head.futex_offset = (char *)&s->word - (char *)&s->entry;
		s->head.list_op_pending = NULL;
		if (syscall(SYS_set_robust_list, &s->head, sizeof(s->head)) != 0)
			err = errno;
		else
			__atomic_store_n(&s->word, (uint32_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
	}

	pthread_mutex_lock(&l->stop_mu);
	l->err = err;
	l->held = 1;
	pthread_cond_broadcast(&l->cv);
	while (!l->stop && !err)
		pthread_cond_wait(&l->cv, &l->stop_mu);
	pthread_mutex_unlock(&l->stop_mu);
	if (!err) {
		__atomic_store_n(&s->word, 0, __ATOMIC_SEQ_CST);
		syscall(SYS_set_robust_list, l->libc_head, l->libc_len);
	}
	return NULL;
}

static int ft_lifeline_start(struct ft_lifeline *l, void *mem)
{
	sigset_t all, old;
	int err;

	l->s = mem;
	l->held = l->stop = l->err = 0;
	pthread_mutex_init(&l->stop_mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	// The thread takes no signal: Go's handlers are for Go's threads.
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
	if (err)
		pthread_join(l->t, NULL); // it ends at once on an error
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
*/
import "C"

import (
	"errors"
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

// Hold starts a thread whose robust futex list is a list at the start of
// mem (Size bytes, 8-aligned, mapped shared) holding the word there, set
// to the thread's id, until Release. The memory must stay mapped until
// then.
func Hold(mem []byte) (*Line, error) {
	if len(mem) < Size || uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 || C.sizeof_struct_ft_shared > Size {
		return nil, fmt.Errorf("lifeline: %d bytes: needs %d, 8-aligned", len(mem), Size)
	}
	c := (*C.struct_ft_lifeline)(C.calloc(1, C.sizeof_struct_ft_lifeline))
	if c == nil {
		return nil, errors.New("lifeline: out of memory")
	}
	if rc := C.ft_lifeline_start(c, unsafe.Pointer(&mem[0])); rc != 0 {
		C.free(unsafe.Pointer(c))
		return nil, fmt.Errorf("lifeline: the kernel takes no robust futex list here: %w", syscall.Errno(rc))
	}
	return &Line{c: c}, nil
}

// Release clears the word (it then reads as not alive) and ends the
// thread. Not for concurrent callers.
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
// FUTEX_OWNER_DIED. A word never held, or released, reads as not alive.
func Alive(word *uint32) bool {
	w := atomic.LoadUint32(word)
	return w&futexTIDMask != 0 && w&futexOwnerDied == 0
}
