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
