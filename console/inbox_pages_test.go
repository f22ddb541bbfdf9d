package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
)

// pendingOf stores n pending refunds requested under principal, as the
// workers would have, and returns their ids.
func pendingOf(t *testing.T, url, principal string, n int) []string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b, err := broker.Provision(testCtx(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := approvalstore.NewStore(b.Approvals, nil)
	var ids []string
	for i := range n {
		input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"orderId": fmt.Sprintf("o-%s-%d", principal, i), "amount": 900 + i}))
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		r := &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", Surface: "direct",
			Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}, Input: input, InputHash: hash,
			Reasons: []string{"refunds above 500 need a finance approval"}, Types: []string{"finance"}, Risk: "high",
			SideEffect: "write", RequestedAt: now, ExpiresAt: now.Add(time.Hour), RequestedBy: envelope.NewExecutionID(), Principal: principal}
		if err := store.Create(testCtx(t), r); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// The inbox is paged: 50 pending a page, the requesters taking turns, so
// that bob's one approval is on the first page beside alice's sixty; the
// next page holds the rest; at a phone's width the pager is within reach.
func TestBrowser_InboxPagedRequestersTakeTurns(t *testing.T) {
	t.Parallel()
	b := browser(t)
	r := startRig(t, "", console.Config{Open: true})
	pendingOf(t, r.url, "alice", 60)
	bobs := pendingOf(t, r.url, "bob", 1)

	carol := tab(t, b)
	signInTab(t, carol, r.base, "user:carol", "finance")
	do(t, carol, "the first page", chromedp.Navigate(r.base+"/approvals"), chromedp.WaitVisible("#more"),
		chromedp.WaitVisible("#pending #a-"+bobs[0]))
	cards := func() int {
		n, err := chromedp.Run(carol, chromedp.Evaluate[int](`document.querySelectorAll("#pending article.card").length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := cards(); n != 50 {
		t.Fatalf("the first page shows %d pending, want 50", n)
	}
	has(t, "the count", text(t, carol, "#pending-count"), "50+")
	has(t, "the page's line", text(t, carol, "#pending-line"), "50 on this page", "each requester in turn")
	viewShot(t, carol, "", "console-inbox-paged.png")
	viewShot(t, carol, "#pending-pager", "console-inbox-paged-pager.png")
	do(t, carol, "the next page", chromedp.Click("#more"), chromedp.WaitVisible("#first"), chromedp.WaitNotPresent("#more"))
	if n := cards(); n != 11 {
		t.Fatalf("the second page shows %d pending, want the 11 left", n)
	}

	phone := tab(t, b)
	do(t, phone, "a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait))
	signInTab(t, phone, r.base, "user:carol", "finance")
	do(t, phone, "the inbox at 390 px", chromedp.Navigate(r.base+"/approvals"), chromedp.WaitVisible("#more"))
	if over, hidden := fits(t, phone, "#more", "#pending-count", "#a-"+bobs[0]+" button.approve"); over > 0 || len(hidden) > 0 {
		t.Errorf("the paged inbox at 390 px: %d px too wide, out of reach: %v", over, hidden)
	}
	viewShot(t, phone, "", "console-phone-inbox-paged.png")
	viewShot(t, phone, "#pending-pager", "console-phone-inbox-paged-pager.png")
}

// viewShot writes what the viewport shows, scrolled to sel (none: the top),
// where screenshot writes the whole page: a page of fifty cards is too long
// to look at whole.
func viewShot(t *testing.T, tab context.Context, sel, name string) {
	t.Helper()
	dir := os.Getenv("CAPSTAN_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithDeadline(tab, deadlineOf(t))
	defer cancel()
	scroll := chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`)
	if sel != "" {
		scroll = chromedp.ScrollIntoView(sel)
	}
	if err := chromedp.Do(ctx, scroll); err != nil {
		t.Fatalf("scroll to %q: %v", sel, err)
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
