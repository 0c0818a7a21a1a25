package fakenet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Server is a test server that counts what reached it.
type Server struct {
	Addr string
	hits atomic.Int64
}

// Hits is how many connections (or DNS queries) reached the server.
func (s *Server) Hits() int64 { return s.hits.Load() }

type countingListener struct {
	net.Listener
	s *Server
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.s.hits.Add(1)
	}
	return c, err
}

// ServeHTTP serves h over plain HTTP at addr inside the namespace.
func (n *NS) ServeHTTP(t testing.TB, addr string, h http.Handler) *Server {
	t.Helper()
	s := &Server{Addr: addr}
	ln := n.Listen(t, addr)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: quietLog}
	serve(t, func() error { return srv.Serve(countingListener{ln, s}) }, func() { srv.Close() })
	return s
}

// ServeTLS serves h over TLS at addr with a certificate for names signed by
// ca.
func (n *NS) ServeTLS(t testing.TB, addr string, ca *CA, names []string, h http.Handler) *Server {
	t.Helper()
	s := &Server{Addr: addr}
	ln := n.Listen(t, addr)
	cert := ca.Issue(t, names)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: quietLog,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	serve(t, func() error { return srv.ServeTLS(countingListener{ln, s}, "", "") }, func() { srv.Close() })
	return s
}

// ServeTCP accepts connections at addr and writes banner to each, then
// closes it.
func (n *NS) ServeTCP(t testing.TB, addr, banner string) *Server {
	t.Helper()
	s := &Server{Addr: addr}
	ln := n.Listen(t, addr)
	var wg sync.WaitGroup
	serve(t, func() error {
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			s.hits.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = io.WriteString(c, banner)
			}()
		}
	}, func() { ln.Close(); wg.Wait() })
	return s
}

// quietLog drops the servers' own error logs: the tests provoke refused
// handshakes on purpose and check outcomes, not log lines.
var quietLog = log.New(io.Discard, "", 0)

// serve runs fn in a goroutine until stop, at cleanup.
func serve(t testing.TB, fn func() error, stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = fn()
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
}

// ServeDNS answers A queries from zone (name without trailing dot → IPv4
// addresses) at addr over UDP and TCP; other names are NXDOMAIN. Wildcard
// keys ("*.example.test") answer every name below.
func (n *NS) ServeDNS(t testing.TB, addr string, zone map[string][]string) *Server {
	t.Helper()
	s := &Server{Addr: addr}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		s.hits.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		q := r.Question[0]
		name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
		ips, ok := zone[name]
		for rest := name; !ok; {
			i := strings.IndexByte(rest, '.')
			if i < 0 {
				break
			}
			rest = rest[i+1:]
			ips, ok = zone["*."+rest]
		}
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			for _, ip := range ips {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip).To4()})
			}
		}
		_ = w.WriteMsg(m)
	})
	pc := n.ListenPacket(t, addr)
	ln := n.Listen(t, addr)
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		serve(t, srv.ActivateAndServe, func() { _ = srv.Shutdown() })
		<-started
	}
	return s
}

// Exchange asks the DNS server at server ("ip:port") from inside the
// namespace, over UDP.
func (n *NS) Exchange(ctx context.Context, server, name string, qtype uint16) (*dns.Msg, error) {
	return n.ExchangeOver(ctx, "udp", server, name, qtype)
}

// ExchangeOver is Exchange over "udp" or "tcp".
func (n *NS) ExchangeOver(ctx context.Context, network, server, name string, qtype uint16) (*dns.Msg, error) {
	c, err := n.Dial(ctx, network+"4", server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	cl := &dns.Client{Net: network, Timeout: 3 * time.Second}
	r, _, err := cl.ExchangeWithConnContext(ctx, q, &dns.Conn{Conn: c})
	return r, err
}

// LookupA resolves name through server from inside the namespace.
func (n *NS) LookupA(ctx context.Context, server, name string) ([]string, error) {
	r, err := n.Exchange(ctx, server, name, dns.TypeA)
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, &DNSError{Name: name, Rcode: r.Rcode}
	}
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	if len(out) == 0 {
		return nil, &DNSError{Name: name, Rcode: r.Rcode}
	}
	return out, nil
}

// DNSError is a lookup without addresses.
type DNSError struct {
	Name  string
	Rcode int
}

func (e *DNSError) Error() string {
	return "lookup " + e.Name + ": " + dns.RcodeToString[e.Rcode]
}

// IsNXDOMAIN reports whether err is a lookup that got NXDOMAIN.
func IsNXDOMAIN(err error) bool {
	var de *DNSError
	return errors.As(err, &de) && de.Rcode == dns.RcodeNameError
}

// HTTPClient is an HTTP client whose connections start inside the
// namespace, resolving names through the DNS server at resolver (also from
// inside), and trusting ca. Keep-alives are off, so nothing outlives a request.
func (n *NS) HTTPClient(resolver string, ca *CA) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if net.ParseIP(host) == nil {
			ips, err := n.LookupA(ctx, resolver, host)
			if err != nil {
				return nil, err
			}
			host = ips[0]
		}
		return n.Dial(ctx, "tcp4", net.JoinHostPort(host, port))
	}
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// CA is a throwaway certificate authority for the fake internet's TLS servers.
type CA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
}

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fakenet test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{key: key, cert: cert}
}

// Pool is a cert pool trusting the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue makes a server certificate for names.
func (ca *CA) Issue(t testing.TB, names []string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
