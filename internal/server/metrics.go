package server

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
	"github.com/airlockhq/airlock/internal/manager"
)

// Metrics are the daemon's Prometheus metrics. Labels stay low-cardinality:
// routes are patterns (never raw paths with ids), statuses are codes.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.HistogramVec
	execs    *prometheus.HistogramVec

	mu    sync.Mutex
	m     *manager.Manager
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
		}, []string{"status"}),
	}
	reg.MustRegister(mt.requests, mt.execs, &stateCollector{mt: mt}, &auditCollector{mt: mt},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return mt
}

// ObserveExec records an ended exec (manager.Config.OnExecEnd).
func (mt *Metrics) ObserveExec(status string, d time.Duration) {
	mt.execs.WithLabelValues(status).Observe(d.Seconds())
}

func (mt *Metrics) observeRequest(method, route string, status int, d time.Duration) {
	mt.requests.WithLabelValues(method, route, strconv.Itoa(status)).Observe(d.Seconds())
}

func (mt *Metrics) watchManager(m *manager.Manager) {
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

// stateCollector reports live sandboxes by state at scrape time.
type stateCollector struct{ mt *Metrics }

var sandboxesDesc = prometheus.NewDesc("airlock_sandboxes", "Live sandboxes by state.", []string{"state"}, nil)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mt.mu.Lock()
	m := c.mt.m
	c.mt.mu.Unlock()
	if m == nil {
		return
	}
	for state, n := range m.StateCounts() {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), state)
	}
}

// promMetrics serves GET /metrics (admin keys only: it describes every tenant).
func (s *Server) promMetrics(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	return nil
}
