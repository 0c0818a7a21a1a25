package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnetlink_log (linux/netfilter/nfnetlink_log.h); x/sys/unix lacks them.
const (
	nfulnlMsgPacket   = 0
	nfulnlMsgConfig   = 1
	nfulaCfgCmd       = 1
	nfulaCfgMode      = 2
	nfulaCfgTimeout   = 4
	nfulaCfgQThresh   = 5
	nfulaPayload      = 9
	nfulaPrefix       = 10
	nfulnlCfgCmdBind  = 1
	nfulnlCopyPacket  = 2
	nflogCopyRange    = 64 // an IPv4 header with options and the ports fit
	nflogDedupeWindow = 5 * time.Second
)

// packetLog is one packet the filter logged, decoded.
type packetLog struct {
	SandboxID string
	Allowed   bool
	Proto     string
	Src, Dst  netip.Addr
	SrcPort   uint16
	DstPort   uint16
}

// nflogReader receives the packets the filter logs to an NFLOG group and
// turns them into packetLogs, dropping repeats of one attempt (a SYN the
// client retransmits is one attempt, not several).
type nflogReader struct {
	conn *netlink.Conn
	emit func(packetLog)
	done chan struct{}

	mu   sync.Mutex
	seen map[string]time.Time
}

// startNFLOG binds group in the namespace nsfd (0: current) and delivers
// every logged packet to emit until close.
func startNFLOG(nsfd int, group uint16, emit func(packetLog)) (*nflogReader, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsfd})
	if err != nil {
		return nil, fmt.Errorf("opening nflog socket: %w", err)
	}
	cfg := func(attrs []netlink.Attribute) error {
		ab, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			return err
		}
		hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}
		binary.BigEndian.PutUint16(hdr[2:], group)
		_, err = conn.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(hdr, ab...),
		})
		return err
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, nflogCopyRange)
	mode[4] = nfulnlCopyPacket
	be32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	if err := cfg([]netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("binding nflog group %d (is another program using it?): %w", group, err)
	}
	// Deliver each packet at once rather than batching up to a second.
	if err := cfg([]netlink.Attribute{{Type: nfulaCfgMode, Data: mode}, {Type: nfulaCfgQThresh, Data: be32(1)}, {Type: nfulaCfgTimeout, Data: be32(0)}}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("configuring nflog group %d: %w", group, err)
	}
	r := &nflogReader{conn: conn, emit: emit, done: make(chan struct{}), seen: map[string]time.Time{}}
	go r.loop()
	return r, nil
}

func (r *nflogReader) close() {
	r.conn.Close()
	<-r.done
}

func (r *nflogReader) loop() {
	defer close(r.done)
	for {
		msgs, err := r.conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				continue // a burst overflowed the socket: later packets still come
			}
			return // closed
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) {
				continue
			}
			if pl, ok := parseNFLOG(m.Data); ok && r.fresh(pl) {
				r.emit(pl)
			}
		}
	}
}

// fresh reports whether pl is the first of its attempt within the window.
func (r *nflogReader) fresh(pl packetLog) bool {
	key := fmt.Sprintf("%s %t %s %s:%d %s:%d", pl.SandboxID, pl.Allowed, pl.Proto, pl.Src, pl.SrcPort, pl.Dst, pl.DstPort)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.seen[key]; ok && now.Sub(t) < nflogDedupeWindow {
		return false
	}
	if len(r.seen) > 4096 {
		for k, t := range r.seen {
			if now.Sub(t) >= nflogDedupeWindow {
				delete(r.seen, k)
			}
		}
	}
	r.seen[key] = now
	return true
}

// parseNFLOG decodes an NFULNL_MSG_PACKET: the prefix our rules set and the
// IPv4 and transport headers of the payload.
func parseNFLOG(data []byte) (packetLog, bool) {
	if len(data) < 4 {
		return packetLog{}, false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return packetLog{}, false
	}
	var prefix string
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			prefix = strings.TrimRight(string(ad.Bytes()), "\x00")
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	rest, ok := strings.CutPrefix(prefix, logPrefix)
	if !ok {
		return packetLog{}, false
	}
	verdict, id, ok := strings.Cut(rest, " ")
	if !ok || id == "" || (verdict != logAllow && verdict != logDeny) {
		return packetLog{}, false
	}
	pl := packetLog{SandboxID: id, Allowed: verdict == logAllow}
	if !parseIPv4(payload, &pl) {
		return packetLog{}, false
	}
	return pl, true
}

// parseIPv4 fills the addresses, protocol and ports of pl from an IPv4 packet.
func parseIPv4(p []byte, pl *packetLog) bool {
	if len(p) < 20 || p[0]>>4 != 4 {
		return false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || len(p) < ihl {
		return false
	}
	pl.Src = netip.AddrFrom4([4]byte(p[12:16]))
	pl.Dst = netip.AddrFrom4([4]byte(p[16:20]))
	l4 := p[ihl:]
	switch p[9] {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		pl.Proto = "tcp"
		if p[9] == unix.IPPROTO_UDP {
			pl.Proto = "udp"
		}
		if len(l4) >= 4 {
			pl.SrcPort = binary.BigEndian.Uint16(l4[0:2])
			pl.DstPort = binary.BigEndian.Uint16(l4[2:4])
		}
	case unix.IPPROTO_ICMP:
		pl.Proto = "icmp"
	default:
		pl.Proto = fmt.Sprintf("ip-proto-%d", p[9])
	}
	return true
}
