package previews

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strconv"
	"strings"
)

// This file is the preview URL's format and token, which the service hands
// out and the preview listener (internal/plane/preview) checks: a preview
// URL is http://<port>-<sandbox id>.<domain>:<listen port>/.

// Target is what the Backend knows of one port of a sandbox.
type Target struct {
	// Token is the sandbox's preview token.
	Token string
	// Exposed is true when the port was made a preview.
	Exposed bool
	// Public is true when the preview needs no token.
	Public bool
}

// URL returns the preview URL of port of sandbox id for a listener at
// listenAddr ("host:port").
func URL(domain, listenAddr, id string, port int) string {
	if domain == "" {
		domain = "localhost"
	}
	_, lport, err := net.SplitHostPort(listenAddr)
	if err != nil {
		lport = ""
	}
	host := strconv.Itoa(port) + "-" + strings.ToLower(id) + "." + strings.Trim(domain, ".")
	if lport != "" && lport != "80" {
		host += ":" + lport
	}
	return "http://" + host + "/"
}

// ParseHost splits a preview host ("8080-sbx_x.localhost:7071") into
// sandbox id and port; ok is false when it is not one under domain.
func ParseHost(host, domain string) (id string, port int, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || strings.Contains(label, ".") {
		return "", 0, false
	}
	ps, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || ps == "" || len(ps) > 5 || ps[0] == '0' {
		return "", 0, false
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	return id, port, true
}

// TokenFor derives sandbox id's preview token from key: no token is
// stored, and a restarted daemon gives the same ones.
func TokenFor(key []byte, id string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("airlock preview token\x00" + id))
	return "apv_" + hex.EncodeToString(mac.Sum(nil))[:40]
}
