package httpapi

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/service/exec"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// Metrics are the daemon's Prometheus metrics. Labels stay low-cardinality:
// routes are patterns (never raw paths with ids), statuses are codes.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.HistogramVec
	execs    *prometheus.HistogramVec
	creates  *prometheus.HistogramVec
	agent    prometheus.Histogram
	errors   *prometheus.CounterVec
	sbErrors *prometheus.CounterVec

	mu    sync.Mutex
	m     gauges
	audit *audit.Recorder
}

// NewMetrics registers the metrics in reg (a new registry when nil), with
// the Go runtime and process collectors.
func NewMetrics(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	mt := &Metrics{
		reg: reg,
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "airlock_http_request_duration_seconds",
			Help:    "HTTP request latency by method, route pattern and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"method", "route", "code"}),
		execs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "airlock_exec_duration_seconds",
			Help:    "Duration of commands run in sandboxes, by final status.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800},
		}, []string{"runtime", "status"}),
		creates: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "airlock_create_duration_seconds",
			Help:    "Duration of sandbox creates, by runtime and result (ok or error).",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120},
		}, []string{"runtime", "result"}),
		agent: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "airlock_agent_call_duration_seconds",
			Help:    "Duration of manager-to-agent round trips (one call, retries apart).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .5, 1, 5},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_api_errors_total",
			Help: "API error responses by error code.",
		}, []string{"code"}),
		sbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_sandbox_errors_total",
			Help: "Sandboxes that ended in state error, by error code (sandbox_crashed, agent_unavailable).",
		}, []string{"code"}),
	}
	reg.MustRegister(mt.requests, mt.execs, mt.creates, mt.agent, mt.errors, mt.sbErrors, &stateCollector{mt: mt}, &auditCollector{mt: mt},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return mt
}

var (
	_ sandbox.Observer             = (*Metrics)(nil)
	_ sandbox.SandboxErrorObserver = (*Metrics)(nil)
	_ exec.Observer                = (*Metrics)(nil)
)

// SandboxError implements sandbox.SandboxErrorObserver.
func (mt *Metrics) SandboxError(code string) { mt.sbErrors.WithLabelValues(code).Inc() }

// ExecDone implements exec.Observer.
func (mt *Metrics) ExecDone(runtime, status string, d time.Duration) {
	mt.execs.WithLabelValues(runtime, status).Observe(d.Seconds())
}

// CreateDone implements sandbox.Observer.
func (mt *Metrics) CreateDone(runtime string, d time.Duration, ok bool) {
	result := "ok"
	if !ok {
		result = "error"
	}
	mt.creates.WithLabelValues(runtime, result).Observe(d.Seconds())
}

// AgentCall implements sandbox.Observer.
func (mt *Metrics) AgentCall(d time.Duration) { mt.agent.Observe(d.Seconds()) }

func (mt *Metrics) observeError(code string) { mt.errors.WithLabelValues(code).Inc() }

func (mt *Metrics) observeRequest(method, route string, status int, d time.Duration) {
	mt.requests.WithLabelValues(method, route, strconv.Itoa(status)).Observe(d.Seconds())
}

// gauges is what the state collector reads of the sandboxes.
type gauges interface {
	SandboxCounts() []sandbox.SandboxCount
	Capacity() (max, used int)
}

func (mt *Metrics) watchSandboxes(m gauges) {
	mt.mu.Lock()
	mt.m = m
	mt.mu.Unlock()
}

func (mt *Metrics) watchAudit(r *audit.Recorder) {
	mt.mu.Lock()
	mt.audit = r
	mt.mu.Unlock()
}

// auditCollector reports the audit trail's writer: events written,
// dropped (a full queue or a failed write) and waiting.
type auditCollector struct{ mt *Metrics }

var (
	auditWrittenDesc = prometheus.NewDesc("airlock_audit_events_written_total", "Audit events written to the store.", nil, nil)
	auditDroppedDesc = prometheus.NewDesc("airlock_audit_events_dropped_total",
		"Audit events lost: the queue was full or the store failed. Anything but 0 needs attention.", nil, nil)
	auditQueuedDesc = prometheus.NewDesc("airlock_audit_queue_length", "Audit events waiting to be written.", nil, nil)
)

func (c *auditCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- auditWrittenDesc
	ch <- auditDroppedDesc
	ch <- auditQueuedDesc
}

func (c *auditCollector) Collect(ch chan<- prometheus.Metric) {
	c.mt.mu.Lock()
	r := c.mt.audit
	c.mt.mu.Unlock()
	written, dropped, queued := r.Stats() // zeros without a recorder
	ch <- prometheus.MustNewConstMetric(auditWrittenDesc, prometheus.CounterValue, float64(written))
	ch <- prometheus.MustNewConstMetric(auditDroppedDesc, prometheus.CounterValue, float64(dropped))
	ch <- prometheus.MustNewConstMetric(auditQueuedDesc, prometheus.GaugeValue, float64(queued))
}

// stateCollector reports, at scrape time, live sandboxes by state, runtime
// and template, the capacity and the warm pools.
type stateCollector struct{ mt *Metrics }

var (
	sandboxesDesc = prometheus.NewDesc("airlock_sandboxes", "Live sandboxes by state, runtime and template.",
		[]string{"state", "runtime", "template"}, nil)
	capacityDesc = prometheus.NewDesc("airlock_capacity_sandboxes", "Host sandbox capacity (max_sandboxes).", nil, nil)
	usedDesc     = prometheus.NewDesc("airlock_capacity_used_sandboxes", "Live sandboxes counted against the capacity.", nil, nil)
	poolDesc     = prometheus.NewDesc("airlock_pool_sandboxes",
		"Warm pool size by runtime and template (0: warm pools do not exist yet).", []string{"runtime", "template"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- capacityDesc
	ch <- usedDesc
	ch <- poolDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mt.mu.Lock()
	m := c.mt.m
	c.mt.mu.Unlock()
	if m == nil {
		return
	}
	for _, sc := range m.SandboxCounts() {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(sc.N), sc.State, sc.Runtime, sc.Template)
	}
	maxN, used := m.Capacity()
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(maxN))
	ch <- prometheus.MustNewConstMetric(usedDesc, prometheus.GaugeValue, float64(used))
	// No warm pools yet: the series exists so dashboards and alerts can be
	// written against it now.
	ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, 0, "", "")
}

// promMetrics serves GET /metrics (admin keys only: it describes every tenant).
func (s *Server) promMetrics(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	return nil
}
