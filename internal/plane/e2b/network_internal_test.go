package e2b

import (
	"errors"
	"reflect"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestPolicyOf: E2B's egress rules on airlock's deny-by-default policy;
// what airlock cannot enforce is refused, never dropped.
func TestPolicyOf(t *testing.T) {
	yes, no := true, false
	cases := []struct {
		name  string
		c     *networkConfig
		inet  *bool
		want  *api.Network
		class error
	}{
		{"nothing: the default", nil, nil, nil, nil},
		{"internet on", nil, &yes, &api.Network{Mode: "open"}, nil},
		{"internet off", nil, &no, &api.Network{Mode: "none"}, nil},
		{"deny all, allow one", &networkConfig{DenyOut: []string{allTraffic}, AllowOut: []string{"1.1.1.1", "example.com"}}, nil,
			&api.Network{Mode: "allowlist", Allow: []string{"1.1.1.1/32", "example.com"}}, nil},
		{"deny all", &networkConfig{DenyOut: []string{allTraffic}}, nil, &api.Network{Mode: "none"}, nil},
		{"allow only", &networkConfig{AllowOut: []string{"10.1.0.0/16"}}, nil, &api.Network{Mode: "allowlist", Allow: []string{"10.1.0.0/16"}}, nil},
		{"internet off with allowOut", &networkConfig{AllowOut: []string{"example.com"}}, &no, &api.Network{Mode: "allowlist", Allow: []string{"example.com"}}, nil},
		{"update's allow_internet_access", &networkConfig{AllowInternetAccess: &no}, nil, &api.Network{Mode: "none"}, nil},
		{"deny some", &networkConfig{DenyOut: []string{"8.8.8.8"}}, nil, nil, errdefs.ErrCapabilityUnsupported},
		{"deny a name", &networkConfig{DenyOut: []string{"example.com"}}, nil, nil, errdefs.ErrInvalidArgument},
		{"transform rules", &networkConfig{Rules: map[string]any{"api.example.com": []any{}}}, nil, nil, errdefs.ErrCapabilityUnsupported},
	}
	for _, c := range cases {
		got, err := policyOf(c.c, c.inet)
		if c.class != nil {
			if !errors.Is(err, c.class) {
				t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.class)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}
