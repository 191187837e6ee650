package fabric

import (
	"fmt"
	"strings"
)

// HintRow is one entry of the error-hint table: what an error number means
// and what to do about it. docs/EFA.md ("Error hints") holds the same rows
// with their sources; a test keeps the two in step.
type HintRow struct {
	// Provider is "efa" for a provider error number (prov_errno), "" for
	// an fi_errno row, which applies to every provider.
	Provider  string
	ProvErrno int    // prov_errno; 0 in fi_errno rows
	Errno     Errno  // fi_errno; 0 in prov_errno rows
	Name      string // libfabric's name for the number (v2.1.0; 1.17's where it differs)
	Meaning   string
	Fix       string
	// Source is where libfabric defines the number, and where the meaning
	// comes from when that is another file: "path@tag:line" entries
	// separated by "; ". docs/EFA.md's row names the same.
	Source string
}

// String is the row as one line: name, meaning, fix.
func (r HintRow) String() string {
	code := fmt.Sprintf("fi_errno %d", int(r.Errno))
	if r.Provider != "" {
		code = fmt.Sprintf("%s prov_errno %d", r.Provider, r.ProvErrno)
	}
	return fmt.Sprintf("%s %s: %s %s", code, r.Name, r.Meaning, r.Fix)
}

// hint is the text Hint returns for the row.
func (r HintRow) hint() string {
	return strings.TrimSuffix(r.Meaning, ".") + "; " + lowerFirst(r.Fix)
}

func lowerFirst(s string) string {
	if s == "" || strings.HasPrefix(s, "FI_") || strings.HasPrefix(s, "AddPeer") {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

// efaHints are the efa provider's prov_errno values: 1–18 the device's
// completion status (EFA_IO_COMP_STATUS_*, passed through rdma-core),
// 4096 and up the provider's own codes (FI_EFA_ERR_*). Numbers checked in
// prov/efa/src/efa_errno.h of v1.17.0, v1.21.0, v1.22.0, v2.0.0, v2.1.0
// and v2.6.0 (docs/EFA.md).
var efaHints = []HintRow{
	{ProvErrno: 1, Name: "EFA_IO_COMP_STATUS_FLUSHED (1.17: FI_EFA_FLUSHED)",
		Meaning: "The op was still queued when its local endpoint was destroyed.",
		Fix:     "A consequence, not the cause: look at the other errors of the transfer, and do not close a manager while transfers are in flight.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:60"},
	{ProvErrno: 2, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_QP_INTERNAL_ERROR",
		Meaning: "The local EFA device reported an internal error on this endpoint's queue pair.",
		Fix:     "Close and reopen the manager; if it repeats, check the kernel log (dmesg) and the EFA driver and firmware versions.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:61"},
	{ProvErrno: 3, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_UNSUPPORTED_OP (1.17: FI_EFA_LOCAL_ERROR_INVALID_OP_TYPE)",
		Meaning: "The device was asked for an op it does not support.",
		Fix:     "Use the same libfabric and rdma-core versions on both hosts and report them: the efa provider posts a device write only when both sides report RDMA write, whatever FI_EFA_USE_DEVICE_RDMA says.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:62; prov/efa/src/rdm/efa_rdm_peer.h@v2.1.0:214-216"},
	{ProvErrno: 4, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_INVALID_AH",
		Meaning: "The local address entry for the peer is not valid.",
		Fix:     "Get the peer's current address and call AddPeer again: the address may come from a process that has since exited.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:63"},
	{ProvErrno: 5, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_INVALID_LKEY",
		Meaning: "The local buffer's registration does not cover the op, or it was closed.",
		Fix:     "Do not close a local Buffer during a transfer; otherwise it is a fitransfer bug: report it.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:64"},
	{ProvErrno: 6, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_BAD_LENGTH",
		Meaning: "The op is longer than the device allows.",
		Fix:     "Lower WithChunkSize and check FI_OPT_MAX_RMA_SIZE.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:65"},
	{ProvErrno: 7, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_BAD_ADDRESS",
		Meaning: "The owner's key or range does not match: the buffer was closed, the handle is stale or altered, or the buffer lacks the access right.",
		Fix:     "Get a fresh handle from the owner, and check that it registered the buffer with the right the op needs (mr.ReadWrite for writes).",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:66"},
	{ProvErrno: 8, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_ABORT",
		Meaning: "The remote side aborted the operation.",
		Fix:     "The peer probably exited or restarted: repeat the bootstrap (AddPeer, fresh handles).",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:67"},
	{ProvErrno: 9, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_BAD_DEST_QPN",
		Meaning: "The peer's endpoint no longer exists, typically because the peer process is gone.",
		Fix:     "The peer exited or closed its manager: get its new address and handles.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:68"},
	{ProvErrno: 10, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_RNR",
		Meaning: "A packet found no receive buffer at the peer and the retries ran out (only with FI_RM_DISABLED).",
		Fix:     "Keep the target progressing, do not set FI_RM_DISABLED, and raise FI_OPT_EFA_RNR_RETRY.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:69"},
	{ProvErrno: 11, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_BAD_LENGTH",
		Meaning: "The remote buffer is shorter than the data.",
		Fix:     "Check the handle's length against the transfer, and get a fresh handle.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:70"},
	{ProvErrno: 12, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_BAD_STATUS",
		Meaning: "The remote device answered with an unexpected status.",
		Fix:     "Retry; if it persists, compare the EFA driver and firmware versions on both hosts.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:71"},
	{ProvErrno: 13, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_UNRESP_REMOTE",
		Meaning: "The remote stopped answering (before libfabric 2.0 this also covered a peer that was never reachable).",
		Fix:     "Check that the peer process and host are alive; on libfabric 1.22 and older also check the security group and subnets (as for 15).",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:72"},
	{ProvErrno: 14, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_UNKNOWN_PEER",
		Meaning: "The target has not inserted the initiator's address into its address vector.",
		Fix:     "The owner must call AddPeer(initiator.Address()) before the initiator's first RMA (`fitransfer serve` does).",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:73"},
	{ProvErrno: 15, Name: "EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE",
		Meaning: "The device never got an answer from the peer: most often a security group without its self-referencing rule, or instances in different subnets.",
		Fix:     "Add the security group's self-referencing inbound and outbound rules, put the instances in one subnet, and check that the peer is running.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:74"},
	{ProvErrno: 18, Name: "EFA_IO_COMP_STATUS_REMOTE_ERROR_FEATURE_MISMATCH",
		Meaning: "The peer does not support or did not enable a feature this side asked for.",
		Fix:     "Use the same libfabric and rdma-core versions on both hosts.",
		Source:  "prov/efa/src/efa_errno.h@v2.5.0:75"},
	{ProvErrno: 4096, Name: "FI_EFA_ERR_OTHER",
		Meaning: "Unspecified efa provider error.",
		Fix:     "Rerun with FI_LOG_LEVEL=warn to see the provider's log line.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:80"},
	{ProvErrno: 4105, Name: "FI_EFA_ERR_OOM",
		Meaning: "The efa provider ran out of memory copying an out-of-order packet into a peer's reorder buffer; it reports this on the endpoint's EQ with err FI_ENOBUFS.",
		Fix:     "Free host memory on the receiving host; the memlock limit (ulimit -l) plays no part, the copy registers nothing.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:89; prov/efa/src/rdm/efa_rdm_pke_rtm.c@v2.1.0:485-487"},
	{ProvErrno: 4110, Name: "FI_EFA_ERR_AV_INSERT",
		Meaning: "A receiver could not insert the address of a peer that sent it a packet.",
		Fix:     "Check that the address vector is not full and that the peers run compatible libfabric versions.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:94"},
	{ProvErrno: 4111, Name: "FI_EFA_ERR_RMA_ADDR",
		Meaning: "At the target: the key, range or access check of an emulated RMA failed and the request was dropped; the initiator gets no completion and times out.",
		Fix:     "A handle was stale, altered or used without the access right: give the initiator a fresh, correct handle.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:95; prov/efa/src/rdm/efa_rdm_pke_rtw.c@v2.1.0:148"},
	{ProvErrno: 4112, Name: "FI_EFA_ERR_INTERNAL_RX_BUF_POST",
		Meaning: "The provider could not post its internal receive buffers, often because the memlock limit is low.",
		Fix:     "Set ulimit -l unlimited.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:96"},
	{ProvErrno: 4113, Name: "FI_EFA_ERR_PEER_HANDSHAKE",
		Meaning: "The handshake to a peer could not be posted.",
		Fix:     "Check reachability (security group, subnet) and that the peer is alive.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:97"},
	{ProvErrno: 4114, Name: "FI_EFA_ERR_WR_POST_SEND",
		Meaning: "The device's send queue refused work.",
		Fix:     "Reduce the ops in flight, and report the versions if it persists.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:98"},
	{ProvErrno: 4116, Name: "FI_EFA_ERR_READ_POST",
		Meaning: "A queued read could not be posted when the provider retried it.",
		Fix:     "Reduce the ops in flight, and report the versions if it persists.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:100"},
	{ProvErrno: 4117, Name: "FI_EFA_ERR_RDMA_READ_POST",
		Meaning: "A device RDMA read could not be posted (for the long-read write protocol this happens at the target).",
		Fix:     "Reduce the ops in flight, and check memlock and memory on the target.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:101"},
	{ProvErrno: 4119, Name: "FI_EFA_ERR_WRITE_SEND_COMP",
		Meaning: "The provider could not write a completion.",
		Fix:     "Keep the ops in flight at or below the CQ size (fitransfer does); if it happens anyway, report it.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:103"},
	{ProvErrno: 4122, Name: "FI_EFA_ERR_SHM_INTERNAL_ERROR",
		Meaning: "An error on the efa provider's internal shm path.",
		Fix:     "Set FI_EFA_ENABLE_SHM_TRANSFER=0 and report it.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:106"},
	{ProvErrno: 4124, Name: "FI_EFA_ERR_ESTABLISHED_RECV_UNRESP",
		Meaning: "A peer that answered before stopped answering: its host failed or its process is gone.",
		Fix:     "Repeat the bootstrap with the peer's new process.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:108"},
	{ProvErrno: 4126, Name: "FI_EFA_ERR_UNESTABLISHED_RECV_UNRESP",
		Meaning: "The peer's device is reachable but no handshake came back: the peer process is gone or not progressing its endpoint.",
		Fix:     "Check that the peer process is running and progressing its endpoint.",
		Source:  "prov/efa/src/efa_errno.h@v2.1.0:110"},
}

// errnoHints are fi_errno values, for every provider.
var errnoHints = []HintRow{
	{Errno: ErrHostUnreach, Name: "FI_EHOSTUNREACH",
		Meaning: "No route to the peer (efa: prov_errno 15, or 13 in libfabric 1.22).",
		Fix:     "On EFA add the security group's self-referencing rules and put the instances in one subnet; on tcp;ofi_rxm check the route and firewall.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:159"},
	{Errno: ErrIO, Name: "FI_EIO",
		Meaning: "An I/O error; efa up to libfabric 1.21 reports every device error this way.",
		Fix:     "Look up the provider error number (prov_errno) for the cause.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:51"},
	{Errno: ErrCanceled, Name: "FI_ECANCELED",
		Meaning: "The op was canceled or flushed (efa 2.1+: prov_errno 1).",
		Fix:     "A consequence: the first error of the transfer that is not a cancellation is the cause.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:171"},
	{Errno: ErrTimedOut, Name: "FI_ETIMEDOUT",
		Meaning: "The op timed out: the peer is dead, stopped, not progressing its endpoint, or dropped the request at its key check.",
		Fix:     "Check the peer process, its progress loop and its log, and the handle; lengthen the deadline if the transfer is just large.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:156"},
	{Errno: ErrAccess, Name: "FI_EACCES",
		Meaning: "The target refused access: the buffer was registered without that remote right, or closed.",
		Fix:     "Check the access the owner registered and the handle.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:59"},
	{Errno: ErrKeyRejected, Name: "FI_EKEYREJECTED",
		Meaning: "The target rejected the memory key: the buffer was closed, or the handle is stale or altered.",
		Fix:     "Check the access the owner registered and the handle.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:175"},
	{Errno: ErrNotConn, Name: "FI_ENOTCONN",
		Meaning: "The connection to the peer is gone: the peer process exited or its endpoint closed (efa: prov_errno 9), or the target lacks the initiator's address (efa: prov_errno 14).",
		Fix:     "Repeat the bootstrap with the peer's current process; the owner must AddPeer the initiator.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:153"},
	{Errno: ErrConnReset, Name: "FI_ECONNRESET",
		Meaning: "The connection to the peer is gone: the peer process exited or its endpoint closed.",
		Fix:     "Repeat the bootstrap with the peer's current process.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:150"},
	{Errno: ErrConnRefused, Name: "FI_ECONNREFUSED",
		Meaning: "The connection to the peer is gone: the peer process exited or its endpoint closed.",
		Fix:     "Repeat the bootstrap with the peer's current process.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:157"},
	{Errno: ErrTrunc, Name: "FI_ETRUNC",
		Meaning: "The op is longer than the remote region (not from efa's RMA: there an emulated op beyond the region fails the target's check, prov_errno 4111 on the target's EQ, and the initiator sees a timeout).",
		Fix:     "Check the transfer length against the handle's length.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:192"},
	{Errno: ErrAgain, Name: "FI_EAGAIN",
		Meaning: "A post was refused for now: the queues are full or the peer is backing off.",
		Fix:     "Progress the CQ and retry (fitransfer does); if it never clears, the target is not progressing.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:57"},
	{Errno: ErrConnAborted, Name: "FI_ECONNABORTED",
		Meaning: "The peer stopped answering or aborted (efa 2.0+: prov_errno 8, 13, 4124 or 4126).",
		Fix:     "Check that the peer process and host are alive, and repeat the bootstrap.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:149"},
	{Errno: ErrInval, Name: "FI_EINVAL",
		Meaning: "An invalid argument, or on efa 1.22+ a local or remote device error (prov_errno 2, 3, 4, 5, 7 or 18).",
		Fix:     "Look up the provider error number; as a setup return, check the arguments.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:68"},
	{Errno: ErrMsgSize, Name: "FI_EMSGSIZE",
		Meaning: "The op is too long for the device or the remote buffer (efa: prov_errno 6 or 11).",
		Fix:     "Lower WithChunkSize, and check the handle's length.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:136"},
	{Errno: ErrNoRx, Name: "FI_ENORX",
		Meaning: "The receiver had no buffer and the retries ran out (efa: prov_errno 10).",
		Fix:     "Keep the target progressing and do not set FI_RM_DISABLED.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:196"},
	{Errno: ErrRemoteIO, Name: "FI_EREMOTEIO",
		Meaning: "The remote device answered with an unexpected status (efa: prov_errno 12).",
		Fix:     "Retry; if it persists, compare the EFA driver and firmware versions on both hosts.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:167"},
	{Errno: ErrHostDown, Name: "FI_EHOSTDOWN",
		Meaning: "In efa 1.22 and 2.0 a flushed op (prov_errno 1).",
		Fix:     "A consequence: the first error of the transfer that is not a cancellation is the cause.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:158"},
	{Errno: ErrOther, Name: "FI_EOTHER",
		Meaning: "An unspecified error (efa 1.22+: a prov_errno without a specific mapping).",
		Fix:     "Look up the provider error number; rerun with FI_LOG_LEVEL=warn.",
		Source:  "include/rdma/fi_errno.h@v2.1.0:183"},
}

func init() {
	for i := range efaHints {
		efaHints[i].Provider = "efa"
	}
}

// HintTable returns every row of the table: the efa provider's error
// numbers, then fi_errno values.
func HintTable() []HintRow {
	return append(append([]HintRow(nil), efaHints...), errnoHints...)
}

// LookupHint finds the row for an error: the provider's own number first
// (it names the cause precisely; efa up to 1.21 reports every device error
// as FI_EIO), then the fi_errno.
func LookupHint(provider string, errno Errno, provErrno int) (HintRow, bool) {
	if provider == "efa" && provErrno != 0 {
		for _, r := range efaHints {
			if r.ProvErrno == provErrno {
				return r, true
			}
		}
	}
	for _, r := range errnoHints {
		if r.Errno == errno {
			return r, true
		}
	}
	return HintRow{}, false
}

// Hint returns the likely meaning of a failed op and its fix, or "".
func Hint(provider string, errno Errno, provErrno int) string {
	if provider == "tcp;ofi_rxm" {
		// rxm fails ops posted on a dead connection with the socket error
		// and flushes those in flight with FI_ECANCELED. The tcp provider
		// drops the connection both when the owner exits and when it
		// rejects an op's key (it has no other way to refuse an RMA op),
		// so only a refused connection says the owner is gone; transport
		// dials the owner to tell the two apart and rewrites this hint.
		// The rows' efa notes would only mislead here.
		if errno == ErrConnRefused {
			return "the connection to the peer is gone: nothing listens at its address any more, the peer process exited or closed its endpoint; repeat the bootstrap with the peer's current process"
		}
		if ConnGone(errno) || errno == ErrCanceled && ConnGone(Errno(provErrno)) {
			return "the connection to the peer is gone: the peer process exited or closed its endpoint, or the owner rejected an op's key, address or access (a closed buffer, a stale or altered handle) and dropped the connection, which the next op opens again"
		}
		if errno == ErrCanceled {
			return "tcp;ofi_rxm cancels an op when the target rejects its key or address (buffer closed, or handle altered or stale) or when the connection dropped"
		}
	}
	if r, ok := LookupHint(provider, errno, provErrno); ok {
		return r.hint()
	}
	return ""
}

// ConnGone reports whether a socket error (an fi_errno, or tcp;ofi_rxm's
// prov_errno) means the peer's end of the connection is gone.
func ConnGone(e Errno) bool {
	switch e {
	case ErrNotConn, ErrConnReset, ErrConnRefused, Errno(32): // 32: EPIPE
		return true
	}
	return false
}
