package console

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
)

type homeData struct {
	Pending, Executions, Failed, Capabilities, Pools int
	// More: the last hour holds more executions than homeCount.
	More bool
	// MorePending: more approvals are pending than a listing's page holds.
	MorePending bool
}

// homeCount is as many executions as the start page counts.
const homeCount = 500

// home is the start page: what waits, what ran, what serves.
func (c *Console) home(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var d homeData
	now := time.Now()
	if s.approvals != nil { // producers may not read approvals
		page, err := s.approvals.Page(ctx, approvals.ListRequest{Status: approvals.StatusPending, Limit: approvalsrpc.MaxPageSize})
		if err == nil {
			for _, rec := range page.Records {
				if s.p.MayDecide(rec) {
					d.Pending++
				}
			}
			d.MorePending = page.Next != ""
		}
	}
	if s.reads != nil {
		// What ran in the last hour that the principal may see: a page of
		// the listing, and its failures.
		f := parseExecFilter(url.Values{"since": {"1h"}}, now)
		if page, err := s.reads.list(ctx, f.request(homeCount)); err == nil {
			d.Executions, d.More = len(page.Entries), page.Next != ""
		}
		f.Status = "failed"
		if page, err := s.reads.list(ctx, f.request(homeCount)); err == nil {
			d.Failed = len(page.Entries)
		}
	}
	if s.broker() == nil {
		c.render(w, r, s, "home", d)
		return
	}
	if caps, err := readCatalog(ctx, s.broker()); err == nil {
		pools := map[string]bool{}
		for _, dsc := range caps {
			pools[dsc.Pool] = true
		}
		d.Capabilities, d.Pools = len(caps), len(pools)
	}
	c.render(w, r, s, "home", d)
}
