package transport

// Backend describes one transport a manager opened.
type Backend struct {
	Provider string // "shm", "tcp;ofi_rxm", "efa", ...
	Fabric   string
	Domain   string
	Role     string // "same node", "remote", or "forced" (WithProviders)
	Reason   string // why it was chosen
	Address  string // this manager's endpoint address on it
}
