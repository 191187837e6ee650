/* dladdr and Dl_info (ft_endpoint). */
#define _GNU_SOURCE
#include "ofi.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>

/* The Errno constants in errno.go must equal libfabric's numbers. */
_Static_assert(FI_EAGAIN == 11 && FI_ENODATA == 61 && FI_ENOSYS == 38, "errno");
_Static_assert(FI_EIO == 5 && FI_ECANCELED == 125 && FI_EHOSTUNREACH == 113, "errno");
_Static_assert(FI_ETIMEDOUT == 110 && FI_EINVAL == 22 && FI_ENOMEM == 12, "errno");
_Static_assert(FI_EACCES == 13 && FI_EREMOTEIO == 121 && FI_EKEYREJECTED == 129, "errno");
_Static_assert(FI_ECONNREFUSED == 111 && FI_ECONNRESET == 104 && FI_ENOTCONN == 107, "errno");
_Static_assert(FI_ECONNABORTED == 103 && FI_EHOSTDOWN == 112, "errno");
_Static_assert(FI_EOPNOTSUPP == 95 && FI_EMSGSIZE == 90 && FI_EOVERFLOW == 75, "errno");
_Static_assert(FI_EAVAIL == 259 && FI_ETRUNC == 265 && FI_ENOKEY == 266, "errno");
_Static_assert(FI_EOVERRUN == 268 && FI_ENORX == 269 && FI_EOTHER == 256, "errno");
/* And the flag bits in flags.go. */
_Static_assert(FI_RMA == (1ULL << 2) && FI_REMOTE_WRITE == (1ULL << 13), "caps");
_Static_assert(FI_HMEM == (1ULL << 47) && FI_SOURCE == (1ULL << 57), "caps");
_Static_assert(FI_DELIVERY_COMPLETE == (1ULL << 28) && FI_COMPLETION == (1ULL << 24), "op flags");
_Static_assert(FI_ORDER_RAR == (1ULL << 0), "msg order");
_Static_assert(FI_MR_PROV_KEY == (1 << 6) && FI_MR_ENDPOINT == (1 << 9), "mr mode");
_Static_assert(FI_CONTEXT2 == (1ULL << 52) && FI_CONTEXT == (1ULL << 59), "mode");
_Static_assert(FI_PROV_ATTR_ONLY == (1ULL << 54), "getinfo flags");
_Static_assert(FI_ADDR_EFA == 12 && FI_ADDR_STR == 9 && FI_SOCKADDR_IN6 == 3, "addr format");
_Static_assert(FI_EP_RDM == 3 && FI_AV_TABLE == 2 && FI_PROGRESS_MANUAL == 2, "enums");
_Static_assert(FI_PARAM_STRING == 0 && FI_PARAM_INT == 1 && FI_PARAM_BOOL == 2 && FI_PARAM_SIZE_T == 3,
	       "param types (params.go)");

uint32_t ft_compiled_version(void)
{
	return FT_COMPILED_VERSION;
}

const char *ft_library_version(char *buf, size_t len)
{
	static const char one[] = "1";
	if (!fi_tostr_r(buf, len, one, FI_TYPE_VERSION))
		snprintf(buf, len, "unknown");
	return buf;
}

enum fi_progress ft_domain_data_progress(const struct fi_domain_attr *a)
{
	return a->data_progress;
}

void ft_domain_set_data_progress(struct fi_domain_attr *a, enum fi_progress p)
{
	a->data_progress = p;
}

size_t ft_domain_max_ep_auth_key(const struct fi_domain_attr *a)
{
#if FT_HEADERS_AT_LEAST(2, 0)
	return a->max_ep_auth_key;
#else
	(void)a;
	return 0;
#endif
}

uint32_t ft_domain_max_group_id(const struct fi_domain_attr *a)
{
#if FT_HEADERS_AT_LEAST(2, 0)
	return a->max_group_id;
#else
	(void)a;
	return 0;
#endif
}

void ft_domain_set_2x(struct fi_domain_attr *a, size_t max_ep_auth_key, uint32_t max_group_id)
{
#if FT_HEADERS_AT_LEAST(2, 0)
	a->max_ep_auth_key = max_ep_auth_key;
	a->max_group_id = max_group_id;
#else
	(void)a; (void)max_ep_auth_key; (void)max_group_id;
#endif
}

struct fi_pci_attr *ft_bus_pci(struct fi_bus_attr *b)
{
	return &b->attr.pci;
}

char *ft_info_tostr(const struct fi_info *info)
{
	size_t len = 8192;
	char *buf = calloc(1, len);
	if (!buf)
		return NULL;
	if (!fi_tostr_r(buf, len, info, FI_TYPE_INFO))
		buf[0] = '\0';
	return buf;
}

int ft_ep_efa_emulated(struct fid_ep *ep, int write)
{
#if FT_HEADERS_AT_LEAST(1, 18)
	bool v = false;
	size_t len = sizeof(v);
	int ret = fi_getopt(&ep->fid, FI_OPT_ENDPOINT,
			    write ? FI_OPT_EFA_EMULATED_WRITE : FI_OPT_EFA_EMULATED_READ,
			    &v, &len);
	if (ret)
		return ret;
	return v ? 1 : 0;
#else
	(void)ep; (void)write;
	return -FI_ENOSYS;
#endif
}

int ft_ep_max_rma_size(struct fid_ep *ep, size_t *size)
{
#if FT_HEADERS_AT_LEAST(1, 22)
	size_t len = sizeof(*size);
	return fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MAX_RMA_SIZE, size, &len);
#else
	(void)ep; (void)size;
	return -FI_ENOSYS;
#endif
}

static int ft_set_shared_memory_permitted(struct fid_ep *ep, int v)
{
#if FT_HEADERS_AT_LEAST(1, 21)
	bool b = v != 0;
	return fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_SHARED_MEMORY_PERMITTED, &b, sizeof(b));
#else
	(void)ep; (void)v;
	return -FI_ENOSYS;
#endif
}

static int ft_set_cuda_api_permitted(struct fid_ep *ep, int v)
{
#if FT_HEADERS_AT_LEAST(1, 18)
	bool b = v != 0;
	return fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_CUDA_API_PERMITTED, &b, sizeof(b));
#else
	(void)ep; (void)v;
	return -FI_ENOSYS;
#endif
}

/* ---- endpoints ---- */

static const int ft_kept_signals[] = { SIGBUS, SIGSEGV, SIGTERM, SIGINT };
#define FT_KEPT_SIGNALS (sizeof(ft_kept_signals) / sizeof(ft_kept_signals[0]))

/* Serializes ft_endpoint: two opens at once would each take the other's
 * handlers for the process's own, and one could put libfabric's back. */
static pthread_mutex_t ft_endpoint_lock = PTHREAD_MUTEX_INITIALIZER;

/* ft_from_library reports whether handler is a function of a shared
 * library, not of the program itself (the Go runtime's handlers, and
 * these helpers, are the executable's): only such a handler is put back.
 * SIG_DFL and SIG_IGN are no function; a handler the program installed
 * while the endpoint opened (signal.Notify, say) is its own. */
static int ft_from_library(void *handler)
{
	Dl_info h, self;

	if (!dladdr(handler, &h) || !dladdr((void *)ft_from_library, &self))
		return 0;
	return h.dli_fbase != self.dli_fbase;
}

int ft_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep)
{
	struct sigaction before[FT_KEPT_SIGNALS], now;
	int saved[FT_KEPT_SIGNALS];
	size_t i;
	int ret;

	pthread_mutex_lock(&ft_endpoint_lock);
	for (i = 0; i < FT_KEPT_SIGNALS; i++)
		saved[i] = sigaction(ft_kept_signals[i], NULL, &before[i]) == 0;
	ret = fi_endpoint(domain, info, ep, NULL);
	for (i = 0; i < FT_KEPT_SIGNALS; i++) {
		if (!saved[i] || sigaction(ft_kept_signals[i], NULL, &now) != 0)
			continue;
		/* sa_handler shares sa_sigaction's place. */
		if (now.sa_sigaction != before[i].sa_sigaction && ft_from_library((void *)now.sa_sigaction))
			sigaction(ft_kept_signals[i], &before[i], NULL);
	}
	pthread_mutex_unlock(&ft_endpoint_lock);
	return ret;
}

int ft_ep_open(struct fid_fabric *fabric, struct fid_domain *domain, struct fi_info *info,
	       size_t cq_size, int cq_wait, int *waitable, struct ft_ep_opts *opts,
	       struct ft_ep *out, const char **stage)
{
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT,
				      .wait_obj = FI_WAIT_NONE, .size = cq_size };
	struct fi_eq_attr eq_attr = { .size = 64, .wait_obj = FI_WAIT_NONE };
	int ret;

	memset(out, 0, sizeof(*out));
	*stage = "fi_eq_open";
	ret = fi_eq_open(fabric, &eq_attr, &out->eq, NULL);
	if (ret)
		goto err;
	*stage = "fi_av_open";
	ret = fi_av_open(domain, &av_attr, &out->av, NULL);
	if (ret)
		goto err;
	*stage = "fi_cq_open";
	*waitable = 0;
	out->wait_fd = -1;
	if (cq_wait) {
		/* An fd, not fi_cq_sread: the loop must see traffic wake it
		 * (sread hides that), to spin while peers keep it busy. */
		cq_attr.wait_obj = FI_WAIT_FD;
		ret = fi_cq_open(domain, &cq_attr, &out->cq, NULL);
		if (!ret && fi_control(&out->cq->fid, FI_GETWAIT, &out->wait_fd) == 0 && out->wait_fd >= 0) {
			*waitable = 1;
			out->fabric = fabric;
		} else if (!ret) {
			fi_close(&out->cq->fid);
			out->cq = NULL;
			out->wait_fd = -1;
		}
		cq_attr.wait_obj = FI_WAIT_NONE;
	}
	if (!*waitable) {
		ret = fi_cq_open(domain, &cq_attr, &out->cq, NULL);
		if (ret)
			goto err;
	}
	*stage = "fi_endpoint";
	ret = ft_endpoint(domain, info, &out->ep);
	if (ret)
		goto err;
	*stage = "fi_ep_bind(eq)";
	ret = fi_ep_bind(out->ep, &out->eq->fid, 0);
	if (ret && ret != -FI_ENOSYS)
		goto err;
	*stage = "fi_ep_bind(av)";
	ret = fi_ep_bind(out->ep, &out->av->fid, 0);
	if (ret)
		goto err;
	*stage = "fi_ep_bind(cq)";
	ret = fi_ep_bind(out->ep, &out->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto err;
	if (opts && opts->remote_cntr == 1) {
		/* Optional: without it the loop cannot tell a peer keeps it busy,
		 * and polls as it would anyway. */
		struct fi_cntr_attr cntr_attr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_NONE };
		if (fi_cntr_open(domain, &cntr_attr, &out->remote_cntr, NULL) == 0 &&
		    fi_ep_bind(out->ep, &out->remote_cntr->fid, FI_REMOTE_READ | FI_REMOTE_WRITE) != 0) {
			fi_close(&out->remote_cntr->fid);
			out->remote_cntr = NULL;
		}
	}
	if (opts) {
		/* Options are refused after fi_enable; their answers are the
		 * caller's to judge. */
		opts->shared_memory_rc = opts->shared_memory_permitted < 0 ? 0 :
			ft_set_shared_memory_permitted(out->ep, opts->shared_memory_permitted);
		opts->cuda_api_rc = opts->cuda_api_permitted < 0 ? 0 :
			ft_set_cuda_api_permitted(out->ep, opts->cuda_api_permitted);
	}
	*stage = "fi_enable";
	ret = fi_enable(out->ep);
	if (ret)
		goto err;
	*stage = NULL;
	return 0;
err:
	ft_ep_close(out);
	return ret;
}

void ft_ep_close(struct ft_ep *e)
{
	if (e->ep)
		fi_close(&e->ep->fid);
	if (e->av)
		fi_close(&e->av->fid);
	if (e->cq)
		fi_close(&e->cq->fid);
	if (e->remote_cntr)
		fi_close(&e->remote_cntr->fid);
	if (e->eq)
		fi_close(&e->eq->fid);
	memset(e, 0, sizeof(*e));
	e->wait_fd = -1;
}

int ft_av_insert(struct ft_ep *e, const void *name, uint64_t *addr)
{
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insert(e->av, name, 1, &a, 0, NULL);
	if (ret < 0)
		return ret;
	if (ret != 1 || a == FI_ADDR_NOTAVAIL)
		return -FI_EINVAL;
	*addr = a;
	return 0;
}

/* ---- memory registration ---- */

int ft_mr_reg(struct fid_domain *domain, struct fid_ep *bind_ep, uint64_t addr, size_t len,
	      uint64_t access, uint64_t requested_key, int iface, int device,
	      struct fid_mr **mr, const char **stage)
{
	struct iovec iov = { .iov_base = (void *)(uintptr_t)addr, .iov_len = len };
	struct fi_mr_attr attr;
	uint64_t flags = 0;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.mr_iov = &iov;
	attr.iov_count = 1;
	attr.access = access;
	attr.requested_key = requested_key;
	attr.iface = (enum fi_hmem_iface)iface;
	attr.device.reserved = 0;
	attr.device.cuda = device;
	*stage = "fi_mr_regattr";
	ret = fi_mr_regattr(domain, &attr, flags, mr);
	if (ret)
		return ret;
	if (bind_ep) {
		*stage = "fi_mr_bind";
		ret = fi_mr_bind(*mr, &bind_ep->fid, 0);
		if (!ret) {
			*stage = "fi_mr_enable";
			ret = fi_mr_enable(*mr);
		}
		if (ret) {
			fi_close(&(*mr)->fid);
			*mr = NULL;
			return ret;
		}
	}
	*stage = NULL;
	return 0;
}

/* ---- data path ---- */

int ft_post(struct fid_ep *ep, const struct ft_op *ops, int n,
	    struct fi_context2 *ctx, ssize_t *rc)
{
	int i;

	*rc = 0;
	for (i = 0; i < n; i++) {
		const struct ft_op *op = &ops[i];
		struct iovec iov = { .iov_base = (void *)(uintptr_t)op->local, .iov_len = op->len };
		struct fi_rma_iov rma = { .addr = op->remote, .len = op->len, .key = op->key };
		void *desc = op->desc;
		struct fi_msg_rma msg = {
			.msg_iov = &iov, .desc = &desc, .iov_count = 1,
			.addr = op->peer, .rma_iov = &rma, .rma_iov_count = 1,
			.context = &ctx[op->slot], .data = 0,
		};
		ssize_t ret = op->write ? fi_writemsg(ep, &msg, op->flags)
					: fi_readmsg(ep, &msg, op->flags);
		if (ret) {
			*rc = ret;
			break;
		}
	}
	return i;
}

static uint32_t ft_slot_of(const void *op_context, const struct fi_context2 *ctx, uint32_t nctx)
{
	const struct fi_context2 *c = op_context;
	if (!c || c < ctx || c >= ctx + nctx)
		return FT_NO_SLOT;
	return (uint32_t)(c - ctx);
}

int ft_cq_read(struct fid_cq *cq, const struct fi_context2 *ctx, uint32_t nctx,
	       uint32_t *slots, int max)
{
	struct fi_cq_entry entries[64];
	ssize_t ret;
	int i;

	if (max > 64)
		max = 64;
	ret = fi_cq_read(cq, entries, max);
	if (ret == -FI_EAGAIN)
		return 0;
	if (ret < 0)
		return (int)ret;
	for (i = 0; i < ret; i++)
		slots[i] = ft_slot_of(entries[i].op_context, ctx, nctx);
	return (int)ret;
}

int ft_trywait(struct ft_ep *e)
{
	struct fid *fids[1] = { &e->cq->fid };

	return fi_trywait(e->fabric, fids, 1);
}

int ft_block(struct ft_ep *e, int sig_fd, int timeout_ms)
{
	/* Our own eventfd, not fi_cq_signal: fi_trywait resets the CQ's
	 * signal, so a signal sent just before it would be lost. */
	struct pollfd pfd[2] = { { .fd = e->wait_fd, .events = POLLIN },
				 { .fd = sig_fd, .events = POLLIN } };
	uint64_t drained;
	struct timespec start, now;
	int ret, left = timeout_ms;
	long long spent;

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		ret = poll(pfd, 2, left);
		if (ret > 0)
			break;
		if (ret == 0 || errno != EINTR)
			return 0;
		/* A signal to the thread (the Go runtime sends its threads
		 * some): block for the rest of the time. */
		if (timeout_ms < 0)
			continue;
		clock_gettime(CLOCK_MONOTONIC, &now);
		spent = (long long)(now.tv_sec - start.tv_sec) * 1000 +
			(now.tv_nsec - start.tv_nsec) / 1000000;
		if (spent >= timeout_ms)
			return 0;
		left = timeout_ms - (int)spent;
	}
	if (pfd[1].revents & POLLIN)
		(void)!read(sig_fd, &drained, sizeof(drained));
	if (pfd[0].revents & POLLIN)
		return 2;
	if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL))
		return -pfd[0].revents;
	return 1;
}

int ft_cq_readerr(struct fid_cq *cq, const struct fi_context2 *ctx, uint32_t nctx,
		  struct ft_cq_err *out)
{
	char err_data[512];
	struct fi_cq_err_entry e;
	const char *s;
	ssize_t ret;

	memset(&e, 0, sizeof(e));
	e.err_data = err_data;
	e.err_data_size = sizeof(err_data);
	ret = fi_cq_readerr(cq, &e, 0);
	if (ret == -FI_EAGAIN)
		return 0;
	if (ret < 0)
		return (int)ret;
	out->err = e.err;
	out->prov_errno = e.prov_errno;
	out->slot = ft_slot_of(e.op_context, ctx, nctx);
	out->len = e.len;
	out->flags = e.flags;
	out->msg[0] = '\0';
	s = fi_cq_strerror(cq, e.prov_errno, e.err_data, out->msg, sizeof(out->msg));
	if (s && s != out->msg)
		snprintf(out->msg, sizeof(out->msg), "%s", s);
	return 1;
}

int ft_eq_poll(struct fid_eq *eq, char *msg, size_t len, int *err, int *prov_errno)
{
	struct fi_eq_err_entry e;
	uint32_t event;
	char buf[256];
	const char *s;
	ssize_t ret;

	ret = fi_eq_read(eq, &event, buf, sizeof(buf), 0);
	if (ret == -FI_EAGAIN)
		return 0;
	if (ret == -FI_EAVAIL) {
		memset(&e, 0, sizeof(e));
		ret = fi_eq_readerr(eq, &e, 0);
		if (ret < 0)
			return ret == -FI_EAGAIN ? 0 : (int)ret;
		msg[0] = '\0';
		*err = e.err;
		*prov_errno = e.prov_errno;
		s = fi_eq_strerror(eq, e.prov_errno, e.err_data, msg, len);
		if (s && s != msg)
			snprintf(msg, len, "%s", s);
		if (!msg[0])
			snprintf(msg, len, "%s", fi_strerror(e.err));
		return 1;
	}
	if (ret < 0)
		return (int)ret;
	return 2;
}

int ft_av_remove(struct ft_ep *e, uint64_t addr)
{
	fi_addr_t a = addr;
	return fi_av_remove(e->av, &a, 1, 0);
}
