// Package test holds fitransfer's integration tests: real processes,
// real endpoints, and hosts simulated with network namespaces.
package test
