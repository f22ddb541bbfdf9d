package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
)

// approvalsReader is where a session reads approvals: the bucket itself
// (admins, open servers), or the workers, who answer an approver with the
// approvals of the types its grant lets it decide. Either way a listing is
// a page, in the listing's order (approvals.ListRequest).
type approvalsReader interface {
	Page(ctx context.Context, req approvals.ListRequest) (*approvals.ListReply, error)
	Get(ctx context.Context, id string) (*approvals.Record, error)
}

// workerApprovals reads approvals through the workers, as the principal.
type workerApprovals struct {
	nc    *nats.Conn
	names broker.Names
}

func (w workerApprovals) Page(ctx context.Context, req approvals.ListRequest) (*approvals.ListReply, error) {
	return approvalsrpc.List(ctx, w.nc, w.names, req)
}

func (w workerApprovals) Get(ctx context.Context, id string) (*approvals.Record, error) {
	return approvalsrpc.One(ctx, w.nc, w.names, id)
}

// bucketApprovals reads the approvals bucket itself: every approval, paged
// as the workers page them.
type bucketApprovals struct{ s *approvalstore.Store }

func (b bucketApprovals) Page(ctx context.Context, req approvals.ListRequest) (*approvals.ListReply, error) {
	return approvalsrpc.PageAs(ctx, b.s, nil, "", req, everyApproval{}, 0)
}

func (b bucketApprovals) Get(ctx context.Context, id string) (*approvals.Record, error) {
	return b.s.Get(ctx, id)
}

// everyApproval lets a reader of the bucket see every approval.
type everyApproval struct{}

func (everyApproval) Approver(string, []string) (envelope.Actor, bool, error) {
	return envelope.Actor{}, true, nil
}

// pollEvery is how often a session that may not watch the approvals bucket
// asks the workers whether its approvals changed.
const pollEvery = 2 * time.Second

// pollApprovals emits approvalsReady when the first pages of the
// principal's approvals (what the inbox shows first: pending, and recently
// decided) differ from the last look, for a live page that may not watch
// the bucket.
func pollApprovals(ctx context.Context, r approvalsReader, emit func(any)) error {
	last := ""
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var b strings.Builder
		var err error
		for _, req := range []approvals.ListRequest{pendingFirst, decidedFirst} {
			var page *approvals.ListReply
			if page, err = r.Page(lctx, req); err != nil {
				break
			}
			list := slices.Clone(page.Records)
			slices.SortFunc(list, func(a, b *approvals.Record) int { return strings.Compare(a.ID, b.ID) })
			for _, rec := range list {
				fmt.Fprintf(&b, "%s %s %s\n", rec.ID, rec.Status, rec.ConsumedBy)
			}
			fmt.Fprintf(&b, "next %s\n", page.Next)
		}
		cancel()
		if err == nil {
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
