package network

import "time"

// Kinds of Event.
const (
	// KindDNS is a query to airlock's resolver.
	KindDNS = "dns"
	// KindHTTP is a plain HTTP connection through the egress proxy (Host header).
	KindHTTP = "http"
	// KindTLS is a TLS connection through the egress proxy (ClientHello SNI).
	KindTLS = "tls"
	// KindConnect is a connection attempt the packet filter decided on:
	// direct traffic to a CIDR entry or, in open mode, anywhere.
	KindConnect = "connect"
)

// Reasons of Event. They are stable strings for the audit trail.
const (
	ReasonAllowed         = "allowed"
	ReasonNotAllowed      = "not_allowed"       // not on the allow list
	ReasonPrivate         = "private_address"   // a private, link-local or reserved range
	ReasonHost            = "host_address"      // the host itself or airlock's API
	ReasonRebind          = "resolves_private"  // an allowed name resolving to a blocked address
	ReasonOffline         = "offline"           // a package registry in offline mode
	ReasonNoName          = "no_server_name"    // no SNI or Host header to check
	ReasonUpstream        = "upstream_error"    // resolving or connecting upstream failed
	ReasonProtocol        = "protocol_error"    // neither TLS nor HTTP, or malformed
	ReasonModeNone        = "network_disabled"  // the sandbox is in mode none
	ReasonOtherSandbox    = "sandbox_address"   // another sandbox or a gateway
	ReasonUnsupportedType = "unsupported_query" // a DNS query type airlock does not answer
)

// Event is one network decision for a sandbox's audit trail: a DNS query, a
// proxied connection, or a connection attempt seen by the packet filter.
// Allowed proxied connections are reported when they close, with their byte
// counts; everything else when it is decided.
type Event struct {
	SandboxID string    `json:"sandbox_id"`
	Kind      string    `json:"kind"`             // dns, http, tls, connect
	Domain    string    `json:"domain,omitempty"` // the name asked for, or the SNI/Host, or the name the address was resolved from
	IP        string    `json:"ip,omitempty"`     // the destination address (for dns: the first answer)
	Port      int       `json:"port,omitempty"`
	Proto     string    `json:"proto,omitempty"` // tcp, udp, icmp…
	Allowed   bool      `json:"allowed"`
	Reason    string    `json:"reason"`
	BytesIn   int64     `json:"bytes_in,omitempty"`  // received by the sandbox
	BytesOut  int64     `json:"bytes_out,omitempty"` // sent by the sandbox
	Time      time.Time `json:"time"`
}
