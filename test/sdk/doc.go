// Package sdk holds the tests that check the Go SDK from outside the tree:
// a program that uses github.com/airlockhq/airlock/client gets the SDK and
// the API types, and none of the daemon's modules (SQLite, nftables,
// netlink, OpenTelemetry, Prometheus, gRPC) nor any airlock internal package.
//
// The package holds only tests; they need the go command and the module
// cache the root module's build filled, nothing from the network.
package sdk
