/* C helpers for package ofi: the parts of libfabric that differ between
 * header versions, and batched calls that save cgo crossings. */
#ifndef FITRANSFER_OFI_H
#define FITRANSFER_OFI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_ext.h>

#define FT_COMPILED_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)
#define FT_HEADERS_AT_LEAST(maj, min) (FT_COMPILED_VERSION >= FI_VERSION(maj, min))

uint32_t ft_compiled_version(void);
const char *ft_library_version(char *buf, size_t len);

/* fi_domain_attr fields that moved or appeared between 1.x and 2.x. */
enum fi_progress ft_domain_data_progress(const struct fi_domain_attr *a);
void ft_domain_set_data_progress(struct fi_domain_attr *a, enum fi_progress p);
size_t ft_domain_max_ep_auth_key(const struct fi_domain_attr *a);
uint32_t ft_domain_max_group_id(const struct fi_domain_attr *a);
void ft_domain_set_2x(struct fi_domain_attr *a, size_t max_ep_auth_key, uint32_t max_group_id);

/* The PCI address of a NIC's bus attribute (a union in C). */
struct fi_pci_attr *ft_bus_pci(struct fi_bus_attr *b);

/* fi_tostr(info, FI_TYPE_INFO) into a malloc'd buffer the caller frees;
 * the same 8 KiB bound fi_info uses. */
char *ft_info_tostr(const struct fi_info *info);

#endif

/* fi_getopt(FI_OPT_ENDPOINT, FI_OPT_EFA_EMULATED_READ or _WRITE): 1 when
 * the op is emulated, 0 when the device does it, a negative libfabric error
 * otherwise; -FI_ENOSYS when the headers predate the option (< 1.18). */
int ft_ep_efa_emulated(struct fid_ep *ep, int write);

/* fi_getopt(FI_OPT_ENDPOINT, FI_OPT_MAX_RMA_SIZE) (1.22+): 0 and *size set,
 * or a negative error; -FI_ENOSYS when the headers predate the option. */
int ft_ep_max_rma_size(struct fid_ep *ep, size_t *size);

/* ---- endpoints ---- */

/* An RDM endpoint with its address vector, completion queue and event
 * queue, bound and enabled. */
struct ft_ep {
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_eq *eq;
	/* With a CQ wait object: the fabric (fi_trywait) and the wait fd
	 * (FI_GETWAIT), -1 without. */
	struct fid_fabric *fabric;
	int wait_fd;
	/* Counts peers' RMA ops on this endpoint (FI_REMOTE_READ |
	 * FI_REMOTE_WRITE), when asked for and the provider takes it. */
	struct fid_cntr *remote_cntr;
};

/* Endpoint options set before fi_enable: 0 or 1, or -1 to leave one alone.
 * The *_rc fields return fi_setopt's answer, -FI_ENOSYS when the headers
 * this was compiled with do not declare the option. */
struct ft_ep_opts {
	int shared_memory_permitted; /* FI_OPT_SHARED_MEMORY_PERMITTED, headers 1.21+ */
	int cuda_api_permitted;      /* FI_OPT_CUDA_API_PERMITTED, headers 1.18+ */
	int remote_cntr;             /* 1: bind a counter of peers' RMA ops (Endpoint.RemoteOps) */
	int shared_memory_rc;
	int cuda_api_rc;
};

/* fi_endpoint, leaving the process's handlers of SIGBUS, SIGSEGV, SIGTERM
 * and SIGINT as they were: libfabric's shm provider replaces them at its
 * first endpoint (smr_init_sig_handlers, prov/shm/src/smr_ep.c, v1.17.0
 * and v2.1.0, also for efa's shm peer endpoint) with one that unlinks
 * every shm region file of the process and then calls the old handler,
 * on every such signal: also on a fault the Go runtime turns into a
 * recovered panic, or a SIGTERM the program catches to shut down
 * cleanly. */
int ft_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep);

/* Opens and enables an endpoint on the domain. cq_size 0 lets the provider
 * choose. With cq_wait the CQ gets an FI_WAIT_FD wait object (ft_trywait,
 * ft_block) when the provider supports one; *waitable says whether it
 * did. opts may be NULL. On error *stage names the call that failed. */
int ft_ep_open(struct fid_fabric *fabric, struct fid_domain *domain, struct fi_info *info,
	       size_t cq_size, int cq_wait, int *waitable, struct ft_ep_opts *opts,
	       struct ft_ep *out, const char **stage);

/* fi_trywait on the endpoint's CQ: 0 when the caller may block on its
 * wait fd (ft_block), -FI_EAGAIN when it must read the CQ first. */
int ft_trywait(struct ft_ep *e);

/* Blocks up to timeout_ms on the CQ's wait fd and sig_fd (an eventfd,
 * consumed here); returns 2 when the CQ's fd woke it (traffic), 1 when
 * sig_fd alone did, 0 on timeout (a signal to the thread does not end
 * the block) or a failed poll, and minus the
 * CQ fd's revents when it reported POLLERR, POLLHUP or POLLNVAL. It calls
 * no libfabric function. */
int ft_block(struct ft_ep *e, int sig_fd, int timeout_ms);
void ft_ep_close(struct ft_ep *e);

/* fi_av_insert of one address; *addr gets the fi_addr_t. */
int ft_av_insert(struct ft_ep *e, const void *name, uint64_t *addr);

/* ---- memory registration ---- */

int ft_mr_reg(struct fid_domain *domain, struct fid_ep *bind_ep, uint64_t addr, size_t len,
	      uint64_t access, uint64_t requested_key, int iface, int device,
	      struct fid_mr **mr, const char **stage);

/* ---- data path: posting and reaping in batches ---- */

/* One RMA operation as the Go side describes it. */
struct ft_op {
	uint64_t local;   /* local buffer address */
	uint64_t len;
	void    *desc;    /* fi_mr_desc of the local MR (NULL when not needed) */
	uint64_t remote;  /* remote address: virtual address or offset */
	uint64_t key;     /* remote MR key */
	uint64_t peer;    /* fi_addr_t */
	uint64_t flags;   /* FI_COMPLETION | FI_DELIVERY_COMPLETE ... */
	uint32_t slot;    /* index of the op's fi_context2 */
	uint32_t write;   /* 1: fi_writemsg, 0: fi_readmsg */
};

/* Posts ops[0..n) in order. Returns how many were posted; when fewer than
 * n, *rc holds the error of the first one that was not (-FI_EAGAIN: out of
 * resources, progress and retry). */
int ft_post(struct fid_ep *ep, const struct ft_op *ops, int n,
	    struct fi_context2 *ctx, ssize_t *rc);

#define FT_NO_SLOT UINT32_MAX

/* Reads up to max completions and writes the slot of each into slots[].
 * Returns the count, 0 when the CQ is empty, or a negative error
 * (-FI_EAVAIL: an error entry is waiting, read it with ft_cq_readerr). */
int ft_cq_read(struct fid_cq *cq, const struct fi_context2 *ctx, uint32_t nctx,
	       uint32_t *slots, int max);

/* A completion error, copied out at once: err_data (behind the provider
 * message) is only valid until the next CQ read. */
struct ft_cq_err {
	int32_t  err;
	int32_t  prov_errno;
	uint32_t slot;      /* FT_NO_SLOT when the error has no op context */
	uint64_t len;
	uint64_t flags;
	char     msg[512];  /* fi_cq_strerror text */
};

/* 1 and *out filled, 0 when no error entry is waiting, or negative. */
int ft_cq_readerr(struct fid_cq *cq, const struct fi_context2 *ctx, uint32_t nctx,
		  struct ft_cq_err *out);

/* Reads one EQ entry: 1 with msg set for an error entry, 2 for another
 * event, 0 when empty, negative on failure. */
int ft_eq_poll(struct fid_eq *eq, char *msg, size_t len, int *err, int *prov_errno);

/* fi_av_remove of one address. */
int ft_av_remove(struct ft_ep *e, uint64_t addr);
