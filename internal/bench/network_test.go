package bench

import (
	"testing"
	"time"
)

func TestNetworkRowJudgesTheDifference(t *testing.T) {
	tests := []struct {
		name          string
		withNet, none time.Duration
		want          bool
	}{
		{"within", 46 * time.Millisecond, 40 * time.Millisecond, true},
		{"at_target", 50 * time.Millisecond, 40 * time.Millisecond, true},
		{"over", 51 * time.Millisecond, 40 * time.Millisecond, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			row := NetworkRow(flat(tc.withNet, 9), flat(tc.none, 9))
			if row.OK == nil || *row.OK != tc.want {
				t.Fatalf("row %+v: want ok=%v", row, tc.want)
			}
		})
	}
}
