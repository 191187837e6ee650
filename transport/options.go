package transport

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/progress"
)

// Defaults of a Manager's options.
const (
	DefaultTimeout   = 30 * time.Second
	DefaultChunkSize = 8 << 20
)

// Option configures a Manager.
type Option func(*config)

type config struct {
	providers        []string
	policy           fabric.RMAPolicy
	timeout          time.Duration
	chunk            uint64
	transmitComplete bool
	poll             progress.PollPolicy
	log              zerolog.Logger
	source           string
	hmem             bool
	rails            []string // domains of the remote provider; nil: the default (see WithRails)
	railsSet         bool
}

func defaultConfig() config {
	return config{
		timeout: DefaultTimeout,
		chunk:   DefaultChunkSize,
		poll:    progress.DefaultPollPolicy,
		log:     zerolog.Nop(),
	}
}

// WithProviders restricts the manager to these providers ("shm",
// "tcp;ofi_rxm", "efa"), in order of preference, instead of choosing with
// fabric.Select. A peer must share one of them.
func WithProviders(providers ...string) Option {
	return func(c *config) { c.providers = providers }
}

// WithRMAPolicy sets whether EFA with provider-emulated RMA may be used
// (default fabric.RequireDeviceRMA).
func WithRMAPolicy(p fabric.RMAPolicy) Option { return func(c *config) { c.policy = p } }

// WithTimeout sets the deadline of transfers whose context has none
// (default DefaultTimeout), counted from when their ops are routed (over
// several rails, from the call), or from the first wait for a same-node
// owner's answer routing needs (its verification, the mem link, the
// mapping of a buffer not mapped before): those waits end at the
// transfer's deadline too, or when its context ends. It must be positive:
// New refuses 0 and less.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithChunkSize caps the size of one RMA op (default DefaultChunkSize);
// the provider's limit applies too.
func WithChunkSize(n uint64) Option { return func(c *config) { c.chunk = n } }

// WithTransmitComplete makes writes complete when the data left the local
// buffer (FI_TRANSMIT_COMPLETE) instead of when it is visible at the
// target (FI_DELIVERY_COMPLETE, the default). Weaker: on tcp;ofi_rxm a
// write can then return before the target memory changed.
func WithTransmitComplete() Option { return func(c *config) { c.transmitComplete = true } }

// WithPollPolicy sets how progress loops wait (default
// progress.DefaultPollPolicy; progress.BusyPollPolicy spins).
func WithPollPolicy(p progress.PollPolicy) Option { return func(c *config) { c.poll = p } }

// WithLogger sets the logger (default: none).
func WithLogger(l zerolog.Logger) Option { return func(c *config) { c.log = l } }

// WithSourceAddress binds IP-based providers (tcp) to this local address
// (a host name or IP), as fi_getinfo's FI_SOURCE does.
func WithSourceAddress(host string) Option { return func(c *config) { c.source = host } }

// WithDeviceMemory asks for providers that can register device (GPU)
// memory: fi_getinfo is asked for FI_HMEM and FI_MR_HMEM, so only such
// providers are used, and RegisterDevice is allowed. New fails, naming
// what was found, when no provider here has it.
func WithDeviceMemory() Option { return func(c *config) { c.hmem = true } }

// RailsEnv names the environment variable that picks the rails when
// WithRails is not given: a comma-separated list of domain names of the
// remote provider (`rdmap16s27-rdm,rdmap32s27-rdm`, or interface names
// for tcp), or "all".
const RailsEnv = "FITRANSFER_RAILS"

// WithRails sets the rails: the domains (NICs) of the remote provider the
// manager opens, each with its own endpoint, across which large transfers
// are striped. "all" opens every domain (tcp: every interface but
// loopback). Without it (and without FITRANSFER_RAILS), efa opens every
// domain it lists and tcp;ofi_rxm one: tcp's domains are the host's
// interfaces, loopback and management networks among them, not NICs
// toward one peer. New fails, naming what it found, when a named domain
// is not there. Rail i sends to the owner's rail i (modulo the owner's
// rails), so both ends list their rails in the same order: the NIC on
// the same network first. On efa every NIC reaches every other, and the
// order only spreads the load.
func WithRails(domains ...string) Option {
	return func(c *config) { c.rails, c.railsSet = domains, true }
}
