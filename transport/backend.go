package transport

// Backend describes one transport a manager opened.
type Backend struct {
	Provider string // "shm", "tcp;ofi_rxm", "efa", ...
	Fabric   string
	Domain   string
	// Role is "same node", "remote", or "forced" (WithProviders); or
	// "outgoing" for an shm endpoint only this manager's own ops use
	// (libfabric 2.x: peers never reach it), or "retired" for one that
	// no longer serves.
	Role    string
	Reason  string // why it was chosen
	Address string // this manager's endpoint address on it
}
