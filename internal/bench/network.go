package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// NetworkTarget is issue #6's bound on what network setup adds to a cold
// create.
const NetworkTarget = 10 * time.Millisecond

// benchAllowlist is the policy of the measured sandboxes: a domain (the DNS
// resolver and proxy rules) and a CIDR with a port (nftables sets), which
// is everything allowlist setup does. Nothing is ever sent to them.
var benchAllowlist = api.Network{Mode: "allowlist", Allow: []string{"example.com", "*.example.org", "192.0.2.0/24:443"}}

// MeasureNetwork times create → first result with an allowlist network and
// with none (loopback only), in turn, runs times each after one unmeasured
// pair. It returns (with network, without).
func MeasureNetwork(ctx context.Context, c *client.Client, base api.CreateSandboxRequest, runs int) (withNet, without Samples, err error) {
	one := func(req api.CreateSandboxRequest) (time.Duration, error) { return coldCreate(ctx, c, req) }
	netReq, noneReq := base, base
	n := benchAllowlist
	netReq.Network = &n
	none := api.Network{Mode: "none"}
	noneReq.Network = &none
	for i := -1; i < runs; i++ {
		// Alternate the order so that neither always follows the other's
		// teardown.
		first, second := netReq, noneReq
		if i%2 != 0 {
			first, second = noneReq, netReq
		}
		d1, err := one(first)
		if err != nil {
			return nil, nil, err
		}
		d2, err := one(second)
		if err != nil {
			return nil, nil, err
		}
		if i < 0 {
			continue
		}
		if i%2 == 0 {
			withNet, without = append(withNet, d1), append(without, d2)
		} else {
			withNet, without = append(withNet, d2), append(without, d1)
		}
	}
	return withNet, without, nil
}

// NetworkRow is the report row of MeasureNetwork: the p50 difference.
func NetworkRow(withNet, without Samples) Row {
	row := Row{Metric: metricNetwork, Target: "≤ 10 ms", Ratio: math.NaN(),
		Airlock: fmtP(withNet), Baseline: "same with network none, interleaved " + ms(without.Percentile(50))}
	diff := withNet.Percentile(50) - without.Percentile(50)
	row.Airlock = fmt.Sprintf("+%s (%s)", ms(diff), fmtP(withNet))
	ok := diff <= NetworkTarget
	row.OK = &ok
	return row
}
