package network

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// DNS timing and limits.
const (
	// upstreamTimeout bounds one upstream exchange; a resolver that has not
	// answered in 3 s is tried again or reported as a failure.
	upstreamTimeout = 3 * time.Second
	// minCacheTTL and maxCacheTTL clamp how long the proxy trusts an answer:
	// short enough to follow a moving CDN, long enough not to re-ask per
	// connection.
	minCacheTTL = 5 * time.Second
	maxCacheTTL = 5 * time.Minute
	// dnsInflight bounds concurrent queries one sandbox has in flight, so a
	// sandbox cannot pile up goroutines in the daemon.
	dnsInflight = 32
	// dnsTCPIdle ends an idle DNS-over-TCP connection from a sandbox.
	dnsTCPIdle = 10 * time.Second
	// maxNamesPerSandbox bounds the address→name memory used for audit.
	maxNamesPerSandbox = 4096
)

// dialFunc dials a network address (the host side's namespace).
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// upstream asks the host's resolvers and caches A answers for the proxy.
type upstream struct {
	servers []string
	dial    dialFunc

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	addrs   []netip.Addr
	expires time.Time
}

// resolvConfServers reads the nameservers of a resolv.conf.
func resolvConfServers(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			a, err := netip.ParseAddr(fields[1])
			if err != nil || !a.Is4() {
				continue // ipv6 resolvers: the daemon side may use them, but keep one family
			}
			out = append(out, netip.AddrPortFrom(a, 53).String())
		}
	}
	return out, sc.Err()
}

// exchange sends q to the upstream servers in turn, over UDP and again over
// TCP when the answer was truncated.
func (u *upstream) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	var errs error
	for _, s := range u.servers {
		r, err := u.exchangeOne(ctx, "udp", s, q)
		if err == nil && r.Truncated {
			r, err = u.exchangeOne(ctx, "tcp", s, q)
		}
		if err == nil {
			return r, nil
		}
		errs = errors.Join(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if errs == nil {
		errs = errors.New("no upstream resolver configured")
	}
	return nil, fmt.Errorf("resolving upstream: %w", errs)
}

func (u *upstream) exchangeOne(ctx context.Context, network, server string, q *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	c, err := u.dial(ctx, network, server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cl := &dns.Client{Net: network, Timeout: upstreamTimeout}
	r, _, err := cl.ExchangeWithConnContext(ctx, q, &dns.Conn{Conn: c})
	return r, err
}

// lookupA returns the IPv4 addresses name resolves to, from the cache when fresh.
func (u *upstream) lookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	u.mu.Lock()
	c, ok := u.cache[name]
	u.mu.Unlock()
	if ok && time.Now().Before(c.expires) {
		return c.addrs, nil
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, err := u.exchange(ctx, q)
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("resolving %s: %s", name, dns.RcodeToString[r.Rcode])
	}
	addrs, ttl := answerAddrs(r)
	u.remember(name, addrs, ttl)
	return addrs, nil
}

// remember caches an answer for the proxy.
func (u *upstream) remember(name string, addrs []netip.Addr, ttl time.Duration) {
	if len(addrs) == 0 {
		return
	}
	ttl = min(max(ttl, minCacheTTL), maxCacheTTL)
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.cache) > 65536 {
		now := time.Now()
		for k, c := range u.cache {
			if now.After(c.expires) {
				delete(u.cache, k)
			}
		}
	}
	u.cache[name] = cached{addrs: addrs, expires: time.Now().Add(ttl)}
}

// answerAddrs returns the A records of an answer and their smallest TTL.
func answerAddrs(r *dns.Msg) ([]netip.Addr, time.Duration) {
	var out []netip.Addr
	ttl := maxCacheTTL
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
				ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
			}
		}
	}
	return out, ttl
}

// forwardedTypes are the query types airlock asks upstream for an allowed
// name. Others (AAAA: sandboxes have no IPv6; HTTPS/SVCB: their address
// hints would bypass the filtering of A records) get an empty answer.
var forwardedTypes = map[uint16]bool{
	dns.TypeA: true, dns.TypeCNAME: true, dns.TypeTXT: true, dns.TypeMX: true,
	dns.TypeSRV: true, dns.TypeNS: true, dns.TypeSOA: true, dns.TypeCAA: true, dns.TypePTR: true,
}

// dnsServer is a sandbox's resolver, listening on its gateway.
type dnsServer struct {
	a      *Attachment
	ctx    context.Context // cancelled by close: no query outlives the server
	cancel context.CancelFunc
	pc     net.PacketConn
	ln     net.Listener
	sem    chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newDNSServer(a *Attachment, pc net.PacketConn, ln net.Listener) *dnsServer {
	ctx, cancel := context.WithCancel(context.Background())
	s := &dnsServer{a: a, ctx: ctx, cancel: cancel, pc: pc, ln: ln, sem: make(chan struct{}, dnsInflight), conns: map[net.Conn]struct{}{}}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s
}

// close stops the server and waits for every query in flight.
func (s *dnsServer) close() {
	s.cancel()
	s.pc.Close()
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *dnsServer) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		req := new(dns.Msg)
		if req.Unpack(buf[:n]) != nil {
			continue
		}
		select {
		case s.sem <- struct{}{}:
		default:
			continue // too many in flight: the client retries
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem }()
			resp := s.a.answer(s.ctx, req, "udp")
			// Keep within the client's UDP size; it retries over TCP.
			size := dns.MinMsgSize
			if o := req.IsEdns0(); o != nil {
				size = int(max(o.UDPSize(), dns.MinMsgSize))
			}
			resp.Truncate(size)
			if b, err := resp.Pack(); err == nil {
				_, _ = s.pc.WriteTo(b, from)
			}
		}()
	}
}

func (s *dnsServer) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.serveConn(c)
		}()
	}
}

// serveConn answers length-prefixed queries on one TCP connection.
func (s *dnsServer) serveConn(c net.Conn) {
	var hdr [2]byte
	for {
		_ = c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		buf := make([]byte, binary.BigEndian.Uint16(hdr[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		req := new(dns.Msg)
		if req.Unpack(buf) != nil {
			return
		}
		s.sem <- struct{}{}
		resp := s.a.answer(s.ctx, req, "tcp")
		<-s.sem
		b, err := resp.Pack()
		if err != nil {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(b)))
		if _, err := c.Write(append(out, b...)); err != nil {
			return
		}
	}
}

// answer decides a sandbox's query: names the policy denies get NXDOMAIN,
// allowed ones are resolved upstream and stripped of addresses the sandbox
// may not reach. Every query is audited.
func (a *Attachment) answer(ctx context.Context, req *dns.Msg, proto string) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		resp.Rcode = dns.RcodeNotImplemented
		return resp
	}
	q := req.Question[0]
	name := normalizeName(q.Name)
	ev := Event{Kind: KindDNS, Domain: name, Proto: proto}
	pol := a.current()
	if name == PackageHost && a.m.mirror != nil && pol.Mode == ModeAllowlist {
		// The package mirror on the sandbox's own gateway.
		if q.Qtype == dns.TypeA && q.Qclass == dns.ClassINET {
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
				A:   a.gw.AsSlice(),
			})
		}
		ev.Allowed, ev.Reason, ev.IP = true, ReasonAllowed, a.gw.String()
		a.m.emit(a.id, ev)
		return resp
	}
	if ok, reason := pol.nameVerdict(name); !ok {
		resp.Rcode = dns.RcodeNameError
		ev.Reason = reason
		a.m.emit(a.id, ev)
		return resp
	}
	if q.Qclass != dns.ClassINET || !forwardedTypes[q.Qtype] {
		ev.Allowed, ev.Reason = true, ReasonAllowed
		a.m.emit(a.id, ev)
		return resp // empty NOERROR: the name exists, this type has nothing
	}
	fq := new(dns.Msg)
	fq.SetQuestion(dns.Fqdn(name), q.Qtype)
	ctx, cancel := context.WithTimeout(ctx, 2*upstreamTimeout)
	defer cancel()
	up, err := a.m.up.exchange(ctx, fq)
	if err != nil {
		resp.Rcode = dns.RcodeServerFailure
		ev.Reason = ReasonUpstream
		a.m.emit(a.id, ev)
		return resp
	}
	resp.Rcode = up.Rcode
	resp.Ns = up.Ns
	var kept, dropped []netip.Addr
	for _, rr := range up.Answer {
		switch r := rr.(type) {
		case *dns.A:
			ip, _ := netip.AddrFromSlice(r.A.To4())
			if ok, _ := a.m.addrVerdict(pol, ip, 0); !ok {
				dropped = append(dropped, ip)
				continue
			}
			kept = append(kept, ip)
		case *dns.AAAA:
			continue
		}
		resp.Answer = append(resp.Answer, rr)
	}
	if q.Qtype == dns.TypeA {
		addrs, ttl := answerAddrs(up)
		a.m.up.remember(name, addrs, ttl)
		a.rememberNames(name, kept)
	}
	ev.Allowed, ev.Reason = true, ReasonAllowed
	if len(kept) > 0 {
		ev.IP = kept[0].String()
	} else if len(dropped) > 0 {
		// An allowed name that points into a blocked range: a rebinding
		// attempt or an internal name; either way the sandbox gets nothing.
		ev.Allowed, ev.Reason, ev.IP = false, ReasonRebind, dropped[0].String()
	}
	a.m.emit(a.id, ev)
	return resp
}
