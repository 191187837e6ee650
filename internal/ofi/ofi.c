#include "ofi.h"

#include <errno.h>
#include <stdio.h>

/* The Errno constants in errno.go must equal libfabric's numbers. */
_Static_assert(FI_EAGAIN == 11 && FI_ENODATA == 61 && FI_ENOSYS == 38, "errno");
_Static_assert(FI_EIO == 5 && FI_ECANCELED == 125 && FI_EHOSTUNREACH == 113, "errno");
_Static_assert(FI_ETIMEDOUT == 110 && FI_EINVAL == 22 && FI_ENOMEM == 12, "errno");
_Static_assert(FI_EACCES == 13 && FI_EREMOTEIO == 121 && FI_EKEYREJECTED == 129, "errno");
_Static_assert(FI_ECONNREFUSED == 111 && FI_ECONNRESET == 104 && FI_ENOTCONN == 107, "errno");
_Static_assert(FI_EOPNOTSUPP == 95 && FI_EMSGSIZE == 90 && FI_EOVERFLOW == 75, "errno");
_Static_assert(FI_EAVAIL == 259 && FI_ETRUNC == 265 && FI_ENOKEY == 266, "errno");
_Static_assert(FI_EOVERRUN == 268 && FI_ENORX == 269 && FI_EOTHER == 256, "errno");
/* And the flag bits in flags.go. */
_Static_assert(FI_RMA == (1ULL << 2) && FI_REMOTE_WRITE == (1ULL << 13), "caps");
_Static_assert(FI_HMEM == (1ULL << 47) && FI_SOURCE == (1ULL << 57), "caps");
_Static_assert(FI_DELIVERY_COMPLETE == (1ULL << 28) && FI_COMPLETION == (1ULL << 24), "op flags");
_Static_assert(FI_MR_PROV_KEY == (1 << 6) && FI_MR_ENDPOINT == (1 << 9), "mr mode");
_Static_assert(FI_CONTEXT2 == (1ULL << 52) && FI_CONTEXT == (1ULL << 59), "mode");
_Static_assert(FI_PROV_ATTR_ONLY == (1ULL << 54), "getinfo flags");
_Static_assert(FI_ADDR_EFA == 12 && FI_ADDR_STR == 9 && FI_SOCKADDR_IN6 == 3, "addr format");
_Static_assert(FI_EP_RDM == 3 && FI_AV_TABLE == 2 && FI_PROGRESS_MANUAL == 2, "enums");

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
