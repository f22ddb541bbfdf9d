package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/broker"
	"github.com/nats-io/nats.go"
)

// approvalsReader is where a session reads approvals: the bucket itself
// (admins, open servers), or the workers, who answer an approver with the
// approvals of the types its grant lets it decide.
type approvalsReader interface {
	List(ctx context.Context, f approvals.Filter) ([]*approvals.Record, error)
	Get(ctx context.Context, id string) (*approvals.Record, error)
}

// workerApprovals reads approvals through the workers, as the principal.
type workerApprovals struct {
	nc    *nats.Conn
	names broker.Names
}

func (w workerApprovals) List(ctx context.Context, f approvals.Filter) ([]*approvals.Record, error) {
	return approvals.RequestList(ctx, w.nc, w.names, approvals.ListRequest{Status: f.Status, CapabilityID: f.CapabilityID, Actor: f.Actor})
}

func (w workerApprovals) Get(ctx context.Context, id string) (*approvals.Record, error) {
	list, err := approvals.RequestList(ctx, w.nc, w.names, approvals.ListRequest{ID: id})
	if err != nil {
		return nil, err
	}
	for _, r := range list {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", approvals.ErrNotFound, id)
}

// pollEvery is how often a session that may not watch the approvals bucket
// asks the workers whether its approvals changed.
const pollEvery = 2 * time.Second

// pollApprovals emits approvalsReady when the principal's approvals differ
// from the last look, for a live page that may not watch the bucket.
func pollApprovals(ctx context.Context, r approvalsReader, emit func(any)) error {
	last := ""
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		list, err := r.List(lctx, approvals.Filter{})
		cancel()
		if err == nil {
			var b strings.Builder
			slices.SortFunc(list, func(a, b *approvals.Record) int { return strings.Compare(a.ID, b.ID) })
			for _, rec := range list {
				fmt.Fprintf(&b, "%s %s %s\n", rec.ID, rec.Status, rec.ConsumedBy)
			}
			if d := b.String(); d != last {
				last = d
				emit(approvalsReady)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
