package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// topRefresh is how often `airlock top` redraws.
const topRefresh = 2 * time.Second

// topRow is one sandbox's line in `airlock top`.
type topRow struct {
	sb  api.Sandbox
	cpu float64 // percent of one core; -1 unknown
	mem uint64
	pid uint64
}

func (a *app) newTopCmd() *cobra.Command {
	var once bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show live sandboxes by CPU use",
		Long: `Show the live sandboxes with their CPU use (percent of one core, between
the daemon's last two samples), memory, PIDs and age, busiest first, redrawn
every 2 seconds. q or Ctrl-C quits; --once prints one frame and exits. With
-o json one JSON array of the same rows is printed (cpu_percent null when
unknown), as --once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if once || a.output == "json" {
				rows, err := topRows(ctx, c)
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, topJSON(rows))
				}
				return writeTop(a.stdout, rows, time.Now())
			}
			quit := make(chan struct{}, 1)
			if f, ok := a.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				// Raw mode so that a single q quits without Enter.
				if old, err := term.MakeRaw(int(f.Fd())); err == nil {
					defer term.Restore(int(f.Fd()), old)
				}
			}
			go func() {
				b := make([]byte, 1)
				for {
					n, err := a.stdin.Read(b)
					if err != nil {
						return
					}
					// q, or Ctrl-C arriving as a byte in raw mode.
					if n == 1 && (b[0] == 'q' || b[0] == 'Q' || b[0] == 3) {
						quit <- struct{}{}
						return
					}
				}
			}()
			tick := time.NewTicker(topRefresh)
			defer tick.Stop()
			for {
				rows, err := topRows(ctx, c)
				if err != nil {
					return err
				}
				// Home the cursor and clear the screen: plain ANSI. Raw mode
				// does not turn \n into \r\n, so the frame does it.
				var buf bytes.Buffer
				buf.WriteString("\x1b[H\x1b[2J")
				if err := writeTop(&buf, rows, time.Now()); err != nil {
					return err
				}
				if _, err := a.stdout.Write(bytes.ReplaceAll(buf.Bytes(), []byte("\n"), []byte("\r\n"))); err != nil {
					return err
				}
				select {
				case <-tick.C:
				case <-quit:
					return nil
				case <-a.interrupts:
					return nil
				case <-ctx.Done():
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVar(&once, "once", false, "print one frame and exit")
	return cmd
}

// topRows reads the live sandboxes and their latest samples.
func topRows(ctx context.Context, c *client.Client) ([]topRow, error) {
	var rows []topRow
	for sb, err := range c.Sandboxes(ctx, client.ListOptions{}) {
		if err != nil {
			return nil, err
		}
		if sb.State != api.StateRunning && sb.State != api.StatePaused {
			continue
		}
		r := topRow{sb: sb, cpu: -1}
		mt, err := c.MetricsSeries(ctx, sb.ID, time.Now().Add(-time.Minute))
		if err != nil {
			continue // it went away between the list and now
		}
		r.mem, r.pid = mt.MemoryBytes, mt.PIDs
		r.cpu = cpuPercent(mt.Series)
		rows = append(rows, r)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].cpu != rows[j].cpu {
			return rows[i].cpu > rows[j].cpu
		}
		return rows[i].sb.ID < rows[j].sb.ID
	})
	return rows, nil
}

// cpuPercent is the cpu use between the last two samples, in percent of one
// core, or -1 with fewer than two.
func cpuPercent(s []api.MetricsSample) float64 {
	if len(s) < 2 {
		return -1
	}
	a, b := s[len(s)-2], s[len(s)-1]
	dt := b.Time.Sub(a.Time).Seconds()
	if dt <= 0 {
		return -1
	}
	return max(b.CPUSeconds-a.CPUSeconds, 0) / dt * 100
}

// writeTop prints one frame.
func writeTop(w io.Writer, rows []topRow, now time.Time) error {
	fmt.Fprintf(w, "airlock top - %s - %d sandboxes\n\n", now.Format(time.TimeOnly), len(rows))
	t := newTable(w, "SANDBOX", "TENANT", "TEMPLATE", "STATE", "CPU%", "MEMORY", "PIDS", "AGE")
	for _, r := range rows {
		cpu := "-"
		if r.cpu >= 0 {
			cpu = strconv.FormatFloat(r.cpu, 'f', 1, 64)
		}
		t.row(r.sb.ID, r.sb.Tenant, r.sb.Template, r.sb.State, cpu, humanBytes(r.mem),
			strconv.FormatUint(r.pid, 10), now.Sub(r.sb.CreatedAt).Truncate(time.Second).String())
	}
	return t.flush()
}

// topEntry is one row of `airlock top -o json`.
type topEntry struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Template  string    `json:"template"`
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	// CPUPercent is of one core between the last two samples; null
	// before there are two.
	CPUPercent  *float64 `json:"cpu_percent"`
	MemoryBytes uint64   `json:"memory_bytes"`
	PIDs        uint64   `json:"pids"`
}

func topJSON(rows []topRow) []topEntry {
	out := make([]topEntry, 0, len(rows))
	for _, r := range rows {
		e := topEntry{ID: r.sb.ID, Tenant: r.sb.Tenant, Template: r.sb.Template, State: r.sb.State, CreatedAt: r.sb.CreatedAt,
			MemoryBytes: r.mem, PIDs: r.pid}
		if r.cpu >= 0 {
			cpu := r.cpu
			e.CPUPercent = &cpu
		}
		out = append(out, e)
	}
	return out
}
