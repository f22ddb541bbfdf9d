package console

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/limits"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/nats-io/nats.go/jetstream"
)

// workersWindow is how far back the audit trail is read to see which workers
// serve what: workers announce themselves nowhere else.
const workersWindow = 15 * time.Minute

type capView struct {
	executor.Descriptor
	// Pauses are the operators' pauses that stop some of its calls.
	Pauses  []*pauses.Pause
	Workers []string
	// Served: a live worker of its pool renewed its catalog entry within
	// the catalog TTL (DESIGN §13), whether or not it was called lately.
	Served bool
	// Usage is each of the capability's counters against its limit, now
	// (DESIGN §17); none when the console may not read them.
	Usage []limits.Usage
}

type poolView struct {
	Name     string
	Consumer string
	Caps     []capView
	// Queue depth of the pool's consumer: waiting to be delivered, delivered
	// and not yet acknowledged (running), redelivered, and pull requests
	// waiting (idle worker slots).
	Pending, InFlight, Redelivered, Waiting uint64
	Missing                                 bool
	Workers                                 []workerView
}

type workerView struct {
	ID       string
	LastSeen time.Time
}

type capsData struct {
	Pools    []poolView
	Unrouted *poolView
	Window   time.Duration
	// Pauses are the operators' pauses in force (DESIGN §18).
	Pauses pausesView
	// IDs are the catalog's capability ids, for the pause form.
	IDs []string
}

func (c *Console) capabilities(w http.ResponseWriter, r *http.Request, s *session) {
	if s.broker() == nil {
		c.notPermitted(w, r, s, "the catalog")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	d, err := readCapabilities(ctx, s.broker())
	if err != nil {
		c.fail(w, r, s, http.StatusBadGateway, "reading the catalog: %v", err)
		return
	}
	d.Pauses = readPauses(ctx, s)
	for i := range d.Pools {
		for j := range d.Pools[i].Caps {
			cv := &d.Pools[i].Caps[j]
			cv.Pauses = pausedFor(d.Pauses.List, cv.ID)
			d.IDs = append(d.IDs, cv.ID)
		}
	}
	c.render(w, r, s, "capabilities", d)
}

func readCapabilities(ctx context.Context, b *broker.Broker) (*capsData, error) {
	catalog, err := readCatalog(ctx, b)
	if err != nil {
		return nil, err
	}
	// Which workers served each capability lately, from the trail.
	served := map[string]map[string]time.Time{}
	seen := map[string]time.Time{}
	err = scanAudit(ctx, b, time.Now().Add(-workersWindow), func(ev *audit.Event) {
		if ev.Worker == "" || ev.CapabilityID == "" {
			return
		}
		if served[ev.CapabilityID] == nil {
			served[ev.CapabilityID] = map[string]time.Time{}
		}
		served[ev.CapabilityID][ev.Worker] = ev.Timestamp
		seen[ev.Worker] = ev.Timestamp
	})
	if err != nil {
		return nil, err
	}
	// Limits' usage, for a console that may read the counters (an admin's).
	usage := map[string][]limits.Usage{}
	if us, err := limits.Read(ctx, b.Limits, "", time.Now()); err == nil {
		for _, u := range us {
			usage[u.Capability] = append(usage[u.Capability], u)
		}
	}
	pools := map[string]*poolView{}
	for _, d := range catalog {
		id := d.ID
		p := pools[d.Pool]
		if p == nil {
			p = &poolView{Name: d.Pool, Consumer: b.Names.PoolConsumer(d.Pool)}
			pools[d.Pool] = p
		}
		cv := capView{Descriptor: d, Usage: usage[id], Served: time.Now().Before(d.ExpiresAt)}
		for wk := range served[id] {
			cv.Workers = append(cv.Workers, wk)
		}
		slices.Sort(cv.Workers)
		p.Caps = append(p.Caps, cv)
	}
	out := &capsData{Window: workersWindow}
	var backlogs []broker.Backlog
	if b.Exec != nil {
		backlogs, _ = b.Backlogs(ctx) // unread: every pool's queue is Missing
	}
	for _, p := range pools {
		ws := map[string]bool{}
		for _, cv := range p.Caps {
			for _, wk := range cv.Workers {
				ws[wk] = true
			}
		}
		for wk := range ws {
			p.Workers = append(p.Workers, workerView{ID: wk, LastSeen: seen[wk]})
		}
		slices.SortFunc(p.Workers, func(a, b workerView) int { return strings.Compare(a.ID, b.ID) })
		slices.SortFunc(p.Caps, func(a, b capView) int { return strings.Compare(a.ID, b.ID) })
		queueDepth(backlogs, p)
		out.Pools = append(out.Pools, *p)
	}
	slices.SortFunc(out.Pools, func(a, b poolView) int { return strings.Compare(a.Name, b.Name) })
	u := &poolView{Name: broker.Unrouted, Consumer: b.Names.UnroutedConsumer()}
	queueDepth(backlogs, u)
	out.Unrouted = u
	return out, nil
}

// queueDepth fills p's queue from backlogs, which sum every queue's
// consumer of each pool (DESIGN §3); Missing when they were not read or do
// not name the pool.
func queueDepth(backlogs []broker.Backlog, p *poolView) {
	name := p.Name
	if p.Consumer == broker.Unrouted {
		name = broker.Unrouted
	}
	for _, bl := range backlogs {
		if bl.Pool == name {
			p.Pending, p.InFlight, p.Redelivered, p.Waiting = bl.Pending, uint64(bl.AckPending), uint64(bl.Redelivered), uint64(bl.Waiting)
			return
		}
	}
	p.Missing = true
}

// readCatalog returns the catalog's descriptors.
func readCatalog(ctx context.Context, b *broker.Broker) ([]executor.Descriptor, error) {
	keys, err := b.Catalog.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for k := range keys.Keys() {
		if strings.HasPrefix(k, "_") {
			// Reserved keys (a pool's liveness entry) are no capabilities.
			continue
		}
		ids = append(ids, k)
	}
	var out []executor.Descriptor
	for _, id := range ids {
		e, err := b.Catalog.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var d executor.Descriptor
		if err := envelope.Unmarshal(e.Value(), &d); err != nil {
			continue
		}
		out = append(out, d)
	}
	return out, nil
}
