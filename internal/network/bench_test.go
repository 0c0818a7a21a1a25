package network_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/airlockhq/airlock/internal/network"
)

// benchSetup measures Setup alone (Teardown runs with the timer stopped):
// the network's share of a sandbox's cold create, whose budget is 10 ms.
func benchSetup(b *testing.B, p network.Policy) {
	w := newWorld(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("sbx_bench%d", i)
		i++
		if _, err := w.m.Setup(ctx, id, p); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := w.m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkSetupNone(b *testing.B) { benchSetup(b, network.Policy{Mode: network.ModeNone}) }

func BenchmarkSetupAllowlist(b *testing.B) {
	benchSetup(b, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test", "*.wild.test", "10.1.2.0/24:443"}})
}

func BenchmarkSetupOpen(b *testing.B) { benchSetup(b, network.Policy{Mode: network.ModeOpen}) }

// BenchmarkTeardown measures removing an allowlist sandbox's network.
func BenchmarkTeardown(b *testing.B) {
	w := newWorld(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("sbx_bench%d", i)
		i++
		b.StopTimer()
		if _, err := w.m.Setup(ctx, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test"}}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := w.m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
