// Package topology reads the PCI and NUMA topology of this node from sysfs
// and ranks NICs for a memory location: for device memory the NICs behind
// the device's PCIe switch first, then those on its NUMA node; for host
// memory the NICs on the memory's NUMA node. A multi-rail Manager sends a
// small transfer over the first NIC of the ranking.
//
// sysfs is local and trusted, but it is read defensively: symlink walks
// are bounded, every error names the path it came from, and Rank never
// fails — what it cannot read ranks as unknown, which keeps input order.
// Tests run against recorded-shape trees of p4d.24xlarge and p5.48xlarge
// nodes (testdata, with the source of each fact in testdata/README.md).
package topology
