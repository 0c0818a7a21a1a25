package network

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/pkgcache"
)

// Proxy timing and limits.
const (
	// sniffTimeout bounds the wait for a ClientHello or request head: a
	// client sends it right after connecting, so seconds mean it is not
	// speaking HTTP or TLS (or is holding a slot on purpose).
	sniffTimeout = 10 * time.Second
	// maxSniff bounds what is read before the name is known.
	maxSniff = 64 << 10
	// upstreamDialTimeout bounds connecting to the real server.
	upstreamDialTimeout = 10 * time.Second
	// maxProxyConns bounds one sandbox's concurrent proxied connections.
	maxProxyConns = 512
)

// proxy is a sandbox's egress proxy: TCP 80 and 443 from the sandbox are
// redirected to it. It reads the TLS SNI or HTTP Host, checks the name
// against the policy, resolves it itself and connects to an address the
// name really has (never one in a blocked range the policy does not open),
// then relays bytes without decrypting anything.
type proxy struct {
	a      *Attachment
	ln     net.Listener
	ctx    context.Context // cancelled by close: no lookup or dial outlives the proxy
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[*proxyConn]struct{}
}

// proxyConn is one relayed connection, kept so that a policy update can
// cut it. Its fields after client are guarded by proxy.mu.
type proxyConn struct {
	client net.Conn
	name   string
	remote net.Conn
	cut    bool
}

// cutLocked closes both sides; the relay then ends. Call with proxy.mu held.
func (pc *proxyConn) cutLocked() {
	pc.cut = true
	pc.client.Close()
	if pc.remote != nil {
		pc.remote.Close()
	}
}

func newProxy(a *Attachment, ln net.Listener) *proxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxy{a: a, ln: ln, ctx: ctx, cancel: cancel, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p
}

// close stops accepting, cuts every relayed connection and waits.
func (p *proxy) close() {
	p.cancel()
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.cutLocked()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// recheck cuts relayed connections whose name the policy no longer allows.
func (p *proxy) recheck(pol *compiled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.name == "" {
			continue // not decided yet: handle checks the new policy itself
		}
		if ok, _ := pol.nameVerdict(c.name); !ok || pol.Mode != ModeAllowlist {
			c.cutLocked()
		}
	}
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		pc := &proxyConn{client: c}
		p.mu.Lock()
		if len(p.conns) >= maxProxyConns {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				p.mu.Lock()
				delete(p.conns, pc)
				p.mu.Unlock()
				pc.client.Close()
				if pc.remote != nil {
					pc.remote.Close()
				}
			}()
			p.handle(pc)
		}()
	}
}

func (p *proxy) handle(pc *proxyConn) {
	a, m := p.a, p.a.m
	c := pc.client
	ev := Event{Kind: KindTLS, Proto: "tcp"}
	deny := func(reason string) {
		ev.Allowed, ev.Reason = false, reason
		m.emit(a.id, ev)
	}
	orig, err := originalDst(c)
	if err != nil {
		ev.Kind = KindConnect
		deny(ReasonProtocol)
		return
	}
	ev.IP, ev.Port = orig.Addr().String(), int(orig.Port())
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.AddrPort() == orig {
		// Straight to the proxy's own port: nothing to relay to.
		ev.Kind = KindConnect
		deny(ReasonHost)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReaderSize(c, 4096)
	kind, name, head, err := sniff(br)
	_ = c.SetReadDeadline(time.Time{})
	ev.Kind, ev.Domain = kind, name
	if err != nil {
		if errors.Is(err, errNoName) {
			deny(ReasonNoName)
		} else {
			deny(ReasonProtocol)
		}
		return
	}
	p.mu.Lock()
	pc.name = name
	p.mu.Unlock()
	pol := a.current()
	if pol.Mode != ModeAllowlist {
		deny(ReasonNotAllowed)
		return
	}
	if ok, reason := pol.nameVerdict(name); !ok {
		deny(reason)
		return
	}
	if a.budget.Exhausted() {
		deny(ReasonDownloadCap)
		if kind == KindHTTP {
			_, _ = io.WriteString(c, capResponse)
		}
		return
	}
	if kind == KindHTTP && m.mirror != nil && m.mirror.Serves(pkgcache.RegDebian) && a.registryAllowed(pkgcache.RegDebian) && m.isRegistryHost(pkgcache.RegDebian, name) {
		// Plain HTTP to the Debian mirror: served through the package
		// cache (audited per package there).
		ev.Allowed, ev.Reason = true, ReasonAllowed
		m.emit(a.id, ev)
		a.serveTransparent(c, io.MultiReader(bytes.NewReader(head), br), name)
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, upstreamDialTimeout)
	defer cancel()
	addrs, err := m.up.lookupA(ctx, name)
	if err != nil || len(addrs) == 0 {
		deny(ReasonUpstream)
		return
	}
	target, reason := pickTarget(addrs, orig, func(ip netip.Addr) (bool, string) { return m.addrVerdict(pol, ip, orig.Port()) })
	if !target.IsValid() {
		ev.IP = addrs[0].String()
		deny(reason)
		return
	}
	ev.IP = target.String()
	remote, err := m.ns.dial(ctx, "tcp4", netip.AddrPortFrom(target, orig.Port()).String())
	if err != nil {
		deny(ReasonUpstream)
		return
	}
	p.mu.Lock()
	cut := pc.cut
	if !cut {
		pc.remote = remote
	}
	p.mu.Unlock()
	// A policy update (or teardown) may have raced the dial; checking the
	// policy under the same lock recheck holds means a connection that
	// should be cut never starts relaying.
	if ok, _ := a.current().nameVerdict(name); cut || !ok {
		remote.Close()
		deny(ReasonNotAllowed)
		return
	}
	in, out, capped := relay(c, br, head, remote, a.budget)
	ev.Allowed, ev.Reason, ev.BytesIn, ev.BytesOut = true, ReasonAllowed, in, out
	if capped {
		ev.Allowed, ev.Reason = false, ReasonDownloadCap
	}
	m.emit(a.id, ev)
}

// pickTarget chooses the address to connect to among those the name
// resolves to: the one the sandbox dialled if it is among them, else the
// first the policy allows. It returns the reason when none is allowed.
func pickTarget(addrs []netip.Addr, orig netip.AddrPort, allowed func(netip.Addr) (bool, string)) (netip.Addr, string) {
	var first netip.Addr
	reason := ReasonRebind
	for _, ip := range addrs {
		ok, why := allowed(ip)
		if !ok {
			if why == ReasonHost || why == ReasonOtherSandbox {
				reason = why
			}
			continue
		}
		if ip == orig.Addr() {
			return ip, ""
		}
		if !first.IsValid() {
			first = ip
		}
	}
	if first.IsValid() {
		return first, ""
	}
	if reason != ReasonHost && reason != ReasonOtherSandbox {
		reason = ReasonRebind
	}
	return netip.Addr{}, reason
}

// relay copies both ways until both sides are done, and returns the bytes
// sent to the sandbox (in) and from it (out). What the sandbox receives
// counts against budget; capped reports that the cap cut the connection.
func relay(client net.Conn, br *bufio.Reader, head []byte, remote net.Conn, budget *pkgcache.Budget) (in, out int64, capped bool) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var n int64
		if budget.Limit() > 0 {
			var err error
			n, err = io.Copy(budget.Writer(client), remote)
			if errors.Is(err, pkgcache.ErrCapExceeded) {
				// Cut both ways: the sandbox's side of the transfer ends
				// with a reset, not a clean end that looks complete.
				capped = true
				if tc, ok := client.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				client.Close()
				remote.Close()
			}
		} else {
			// Without a cap the copy may splice, never entering user space.
			n, _ = io.Copy(client, remote)
		}
		in = n
		closeWrite(client)
	}()
	n, err := remote.Write(head)
	out = int64(n)
	if err == nil {
		n, _ := io.Copy(remote, br)
		out += n
	}
	closeWrite(remote)
	wg.Wait()
	return in, out, capped
}

// capResponse answers a plain-HTTP request of a sandbox whose download cap
// is used up.
const capResponse = "HTTP/1.1 507 Insufficient Storage\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 52\r\n\r\nairlock: this sandbox's download cap is used up.\r\n\r\n"

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		c.Close()
	}
}

// errNoName is a well-formed TLS or HTTP start without a usable name.
var errNoName = errors.New("no server name")

// sniff reads the start of a connection: a TLS ClientHello (for its SNI) or
// an HTTP request head (for its Host). It returns every byte it consumed
// from br, which the relay sends upstream before the rest.
func sniff(br *bufio.Reader) (kind, name string, head []byte, err error) {
	first, err := br.Peek(1)
	if err != nil {
		return "", "", nil, err
	}
	var buf bytes.Buffer
	tee := io.TeeReader(io.LimitReader(br, maxSniff), &buf)
	if first[0] == 0x16 { // TLS handshake record
		name, err := clientHelloSNI(tee)
		return KindTLS, name, buf.Bytes(), err
	}
	req, err := http.ReadRequest(bufio.NewReader(tee))
	if err != nil {
		return KindHTTP, "", buf.Bytes(), fmt.Errorf("reading http request: %w", err)
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = normalizeName(host)
	if host == "" {
		return KindHTTP, "", buf.Bytes(), fmt.Errorf("%w: request without host", errNoName)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return KindHTTP, "", buf.Bytes(), fmt.Errorf("%w: host is an address", errNoName)
	}
	return KindHTTP, host, buf.Bytes(), nil
}

var errHelloRead = errors.New("client hello read")

// clientHelloSNI reads a ClientHello from r with crypto/tls's own parser
// (aborting the handshake once the hello is parsed) and returns its server
// name. Nothing is decrypted: only the cleartext hello is read.
func clientHelloSNI(r io.Reader) (string, error) {
	var name string
	var got bool
	conn := tls.Server(readOnlyConn{r: r}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, got = h.ServerName, true
			return nil, errHelloRead
		},
	})
	err := conn.Handshake()
	if !got {
		return "", fmt.Errorf("reading tls client hello: %w", err)
	}
	name = normalizeName(name)
	if name == "" {
		return "", fmt.Errorf("%w: tls client hello without server name", errNoName)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", fmt.Errorf("%w: server name is an address", errNoName)
	}
	return name, nil
}

// readOnlyConn feeds crypto/tls from a reader and swallows what it writes
// (the alert it sends when the handshake is aborted).
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return nil }
func (readOnlyConn) RemoteAddr() net.Addr             { return nil }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }

// originalDst returns where a redirected connection was headed, from
// conntrack (SO_ORIGINAL_DST).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// A sockaddr_in fits the 20 bytes of IPv6Mreq: the usual way to
		// read this option without cgo.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		port := uint16(m.Multiaddr[2])<<8 | uint16(m.Multiaddr[3])
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("reading original destination: %w", serr)
	}
	return ap, nil
}
