package network

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
)

var farFuture = time.Now().Add(365 * 24 * time.Hour)

// clientHello captures the first flight a real crypto/tls client sends for serverName.
func clientHello(t *testing.T, serverName string) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		cl := tls.Client(c1, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		_ = cl.Handshake() // fails when c2 closes
	}()
	buf := make([]byte, 16<<10)
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c2.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	c1.Close()
	<-done
	return buf[:n]
}

func TestSniff(t *testing.T) {
	hello := clientHello(t, "Pypi.org")
	tests := []struct {
		name     string
		in       []byte
		wantKind string
		wantName string
		wantErr  error // nil: success; errNoName or any other error
		anyErr   bool
	}{
		{name: "tls_sni", in: hello, wantKind: KindTLS, wantName: "pypi.org"},
		{name: "tls_no_sni", in: clientHelloNoSNI(t), wantKind: KindTLS, wantErr: errNoName},
		{name: "http_host", in: []byte("GET /simple/ HTTP/1.1\r\nHost: Files.Example.COM:8080\r\nUser-Agent: x\r\n\r\nBODY"), wantKind: KindHTTP, wantName: "files.example.com"},
		{name: "http_absolute", in: []byte("GET http://abs.example.com/x HTTP/1.1\r\nHost: other.example.com\r\n\r\n"), wantKind: KindHTTP, wantName: "abs.example.com"},
		{name: "http_ip_host", in: []byte("GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n"), wantKind: KindHTTP, wantErr: errNoName},
		{name: "http10_no_host", in: []byte("GET / HTTP/1.0\r\n\r\n"), wantKind: KindHTTP, wantErr: errNoName},
		{name: "garbage", in: []byte("SSH-2.0-OpenSSH_9.2\r\n"), wantKind: KindHTTP, anyErr: true},
		{name: "truncated_tls", in: hello[:20], wantKind: KindTLS, anyErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReader(bytes.NewReader(tc.in))
			kind, name, head, err := sniff(br)
			if kind != tc.wantKind {
				t.Errorf("kind = %q, want %q", kind, tc.wantKind)
			}
			switch {
			case tc.anyErr:
				if err == nil {
					t.Fatalf("err = nil, want an error")
				}
				return
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if name != tc.wantName {
				t.Errorf("name = %q, want %q", name, tc.wantName)
			}
			// Nothing is lost: what sniff consumed plus what is left is the input.
			rest, _ := io.ReadAll(br)
			if got := append(append([]byte{}, head...), rest...); !bytes.Equal(got, tc.in) {
				t.Errorf("head+rest (%d bytes) != input (%d bytes)", len(got), len(tc.in))
			}
		})
	}
}

// clientHelloNoSNI is a ClientHello for an address: crypto/tls sends no SNI then.
func clientHelloNoSNI(t *testing.T) []byte {
	return clientHello(t, "")
}

func TestParseNFLOG(t *testing.T) {
	pkt := func(proto byte, src, dst string, sport, dport uint16) []byte {
		p := make([]byte, 28)
		p[0] = 0x45
		p[9] = proto
		s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
		copy(p[12:], s[:])
		copy(p[16:], d[:])
		binary.BigEndian.PutUint16(p[20:], sport)
		binary.BigEndian.PutUint16(p[22:], dport)
		return p
	}
	msg := func(prefix string, payload []byte) []byte {
		ab, err := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: nfulaPrefix, Data: append([]byte(prefix), 0)},
			{Type: nfulaPayload, Data: payload},
		})
		if err != nil {
			t.Fatal(err)
		}
		return append([]byte{2, 0, 0x10, 0x87}, ab...)
	}
	tests := []struct {
		name string
		data []byte
		want packetLog
		ok   bool
	}{
		{"deny_tcp", msg("airlock d sbx_1", pkt(6, "10.231.0.2", "203.0.113.11", 40000, 8080)),
			packetLog{SandboxID: "sbx_1", Proto: "tcp", Src: netip.MustParseAddr("10.231.0.2"), Dst: netip.MustParseAddr("203.0.113.11"), SrcPort: 40000, DstPort: 8080}, true},
		{"allow_udp", msg("airlock a sbx_2", pkt(17, "10.231.0.6", "203.0.113.20", 5000, 5432)),
			packetLog{SandboxID: "sbx_2", Allowed: true, Proto: "udp", Src: netip.MustParseAddr("10.231.0.6"), Dst: netip.MustParseAddr("203.0.113.20"), SrcPort: 5000, DstPort: 5432}, true},
		{"icmp", msg("airlock d sbx_3", pkt(1, "10.231.0.2", "169.254.169.254", 0, 0)),
			packetLog{SandboxID: "sbx_3", Proto: "icmp", Src: netip.MustParseAddr("10.231.0.2"), Dst: netip.MustParseAddr("169.254.169.254")}, true},
		{"foreign_prefix", msg("other d sbx_1", pkt(6, "10.231.0.2", "1.2.3.4", 1, 2)), packetLog{}, false},
		{"bad_verdict", msg("airlock x sbx_1", pkt(6, "10.231.0.2", "1.2.3.4", 1, 2)), packetLog{}, false},
		{"ipv6_payload", msg("airlock d sbx_1", append([]byte{0x60}, make([]byte, 39)...)), packetLog{}, false},
		{"short", []byte{1, 2}, packetLog{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseNFLOG(tc.data)
			if ok != tc.ok || got != tc.want {
				t.Fatalf("parseNFLOG = %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestNFLOGDedupe(t *testing.T) {
	r := &nflogReader{seen: map[string]time.Time{}}
	a := packetLog{SandboxID: "s", Proto: "tcp", Dst: netip.MustParseAddr("1.2.3.4"), SrcPort: 1000, DstPort: 80}
	b := a
	b.SrcPort = 1001 // a new attempt: new source port
	if !r.fresh(a) || r.fresh(a) || !r.fresh(b) {
		t.Fatal("want the first packet of each attempt once")
	}
}

func TestResolvConfServers(t *testing.T) {
	p := t.TempDir() + "/resolv.conf"
	body := "# comment\nnameserver 10.0.0.53\nnameserver ::1\nsearch example\nnameserver 192.0.2.1\n"
	if err := writeFileAtomic(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := resolvConfServers(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "10.0.0.53:53,192.0.2.1:53" {
		t.Fatalf("servers = %v", got)
	}
}
