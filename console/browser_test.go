package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// The browser tests drive Debian's chromium, headless, with no network but
// loopback. CAPSTAN_CHROMIUM names another binary; without one they skip.
// With CAPSTAN_CONSOLE_SCREENSHOTS set to a directory, they write the
// screenshots docs/console.md shows there.

func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CAPSTAN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("SKIPPED: no chromium found; the console's browser tests need Debian's chromium (apt-get install chromium) or CAPSTAN_CHROMIUM")
	return ""
}

// browser starts one headless chromium for the test and returns its context.
// A chromium that dies while starting (on a loaded machine it sometimes
// does, before it listens) is started again, twice at most.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	var err error
	for try := 0; try < 3; try++ {
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
			chromedp.ExecPath(path),
			chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
			chromedp.Flag("disable-quic", true),
			chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			chromedp.Flag("disable-extensions", true),
			chromedp.Flag("disable-default-apps", true),
			chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.Flag("hide-scrollbars", true),
			chromedp.UserDataDir(t.TempDir()),
			chromedp.WindowSize(1280, 860),
		)
		ctx, cancel := chromedp.NewContext(alloc)
		// The first run starts the browser, and must not carry a timeout.
		if err = chromedp.Do(ctx, chromedp.Navigate("about:blank")); err == nil {
			t.Cleanup(func() { cancel(); cancelAlloc() })
			return ctx
		}
		cancel()
		cancelAlloc()
		t.Logf("chromium did not start (try %d): %v", try+1, err)
	}
	t.Fatalf("start chromium: %v", err)
	return nil
}

// tab opens a tab in a browser context of its own: its own cookies, so one
// principal per tab.
func tab(t *testing.T, b context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return ctx
}

// do runs steps on a tab within the test's deadline; on failure it logs
// what the page shows.
func do(t *testing.T, tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithDeadline(tab, deadlineOf(t))
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		lctx, lcancel := context.WithTimeout(tab, 10*time.Second)
		defer lcancel()
		loc, _ := chromedp.Run(lctx, chromedp.Location())
		body, _ := chromedp.Run(lctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("%s: %v\npage %s shows:\n%s", what, err, loc, body)
	}
}

func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	ctx, cancel := context.WithDeadline(tab, deadlineOf(t))
	defer cancel()
	for {
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err == nil {
			return s
		}
		// A live page patches itself: the node found may be replaced
		// before its text is read. The selector finds its successor.
		var gone *cdproto.Error
		if errors.As(err, &gone) && strings.Contains(gone.Message, "No node with given id") && ctx.Err() == nil {
			continue
		}
		t.Fatalf("text of %s: %v", sel, err)
	}
}

// deadlineOf bounds one browser step: the test's deadline, or two minutes,
// whichever comes first, so that a page that never shows what a step waits
// for fails the step with the page's text.
func deadlineOf(t *testing.T) time.Time {
	d, _ := testCtx(t).Deadline()
	if guard := time.Now().Add(2 * time.Minute); guard.Before(d) {
		return guard
	}
	return d
}

func screenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	dir := os.Getenv("CAPSTAN_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithDeadline(tab, deadlineOf(t))
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func has(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Fatalf("%s lacks %q:\n%s", what, w, got)
		}
	}
}

func signInTab(t *testing.T, tab context.Context, base, name, types string) {
	t.Helper()
	do(t, tab, "sign in as "+name,
		chromedp.Navigate(base+"/approvals"),
		chromedp.WaitVisible("#name"),
		chromedp.SendKeys("#name", name),
		chromedp.SendKeys("#types", types),
		chromedp.Click("#signin"),
		chromedp.WaitVisible("#principal"),
	)
	has(t, "the header", text(t, tab, "#principal"), name)
}

// A refund above 500 asks for approval: bob sees it appear in his inbox
// without reloading, alice is refused when she approves her own call, bob
// approves it, alice's open inbox shows his decision live, bob resumes it and
// sees the new execution's timeline complete.
func TestBrowser_ApprovalAppearsIsApprovedBySomeoneElseAndResumes(t *testing.T) {
	t.Parallel()
	b := browser(t)
	r := startRig(t, "", console.Config{Open: true})
	bobTab, aliceTab := tab(t, b), tab(t, b)

	signInTab(t, bobTab, r.base, "user:bob", "finance")
	do(t, bobTab, "an empty inbox", chromedp.WaitVisible("#a-none"))

	env := r.call(t, "orders.refund", demo.RefundInput{OrderID: "o-1001", Amount: 900}, alice)
	if env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("refund of 900: %s, want approval-required", env.Status)
	}
	card := "#a-" + env.Approval.ID
	do(t, bobTab, "the approval appears live", chromedp.WaitVisible(card), chromedp.WaitNotPresent("#a-none"))
	has(t, "the pending card", text(t, bobTab, card), "orders.refund", "risk high", "finance", "user:alice",
		"refunds above 500 need a finance approval", `"amount": 900`, `"orderId": "o-1001"`, "pending")
	do(t, bobTab, "the countdown runs", chromedp.Poll[chromedp.Void](`document.querySelector("`+card+` time.countdown").textContent.startsWith("in 1")`))

	signInTab(t, aliceTab, r.base, "user:alice", "")
	do(t, aliceTab, "alice approves her own call",
		chromedp.WaitVisible(card+" .badge.mine"),
		chromedp.Click(card+" button.approve"),
		chromedp.WaitVisible("#flash.error"),
	)
	has(t, "the refusal", text(t, aliceTab, "#flash"), "APPROVAL_SELF_APPROVAL", "someone else must decide it")
	do(t, aliceTab, "the approval is still pending", chromedp.WaitVisible("#pending "+card))

	do(t, bobTab, "bob comments",
		chromedp.SendKeys(card+" textarea[name=comment]", "order o-1001 checked"),
	)
	screenshot(t, bobTab, "console-inbox.png")
	do(t, bobTab, "bob approves",
		chromedp.Click(card+" button.approve"),
		chromedp.WaitVisible("#flash.ok"),
		chromedp.WaitVisible("#decided "+card),
	)
	has(t, "bob's confirmation", text(t, bobTab, "#flash"), "Approved orders.refund for user:alice")
	do(t, aliceTab, "alice's inbox shows bob's decision without a reload",
		chromedp.WaitVisible("#decided "+card+" .decision .approver"),
		chromedp.WaitNotPresent("#pending "+card),
	)
	has(t, "the decided card", text(t, aliceTab, "#decided "+card), "approved by user:bob", "order o-1001 checked")

	do(t, bobTab, "bob resumes the call",
		chromedp.Click("#decided "+card+" form.resume button"),
		chromedp.WaitVisible("#timeline"),
		chromedp.WaitVisible(`#timeline li[data-type="capability.completed"]`),
		chromedp.WaitVisible("#envelope"),
	)
	loc, err := chromedp.Run(bobTab, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	resumed := loc[strings.LastIndex(loc, "/")+1:]
	if err := envelope.ValidExecutionID(resumed); err != nil || resumed == env.ExecutionID {
		t.Fatalf("resume went to %s, want a new execution's page", loc)
	}
	has(t, "the resumed execution's status", text(t, bobTab, "#exec-status"), "completed")
	has(t, "the resumed execution's timeline", text(t, bobTab, "#timeline"), "requested by user:alice", "attempt 1 started",
		"resumes approval "+env.Approval.ID, "approval consumed", "completed")
	has(t, "the resume's approval", text(t, bobTab, "#exec-approval"), "resumed with it; asked for by execution "+env.ExecutionID)
	has(t, "the envelope", text(t, bobTab, "#envelope"), `"status": "completed"`, `"orderId": "o-1001"`)
	screenshot(t, bobTab, "console-execution.png")

	do(t, bobTab, "the original execution's trail has the decision",
		chromedp.Navigate(r.base+"/executions/"+env.ExecutionID),
		chromedp.WaitVisible(`#timeline li[data-type="capability.approved"]`),
	)
	has(t, "the original timeline", text(t, bobTab, "#timeline"), "approval requested", "approved by user:bob", "order o-1001 checked")
	has(t, "the original's approval", text(t, bobTab, "#exec-approval"), "consumed; approved by user:bob, used by execution "+resumed)
}

// A retried execution's page grows live: the retry and the outcome appear as
// the worker records them.
func TestBrowser_ExecutionsListAndARetriedTimeline(t *testing.T) {
	t.Parallel()
	b := browser(t)
	r := startRig(t, "", console.Config{Open: true})
	ops := tab(t, b)
	signInTab(t, ops, r.base, "user:ops", "")
	do(t, ops, "the executions list", chromedp.Navigate(r.base+"/executions"), chromedp.WaitVisible("#exec-table"))

	env := r.call(t, "demo.flaky", demo.FlakyInput{FailTimes: 1}, bob)
	row := "#e-" + env.ExecutionID
	do(t, ops, "the execution appears in the list live", chromedp.WaitVisible(row+" .s-completed"))
	has(t, "its row", text(t, ops, row), "demo.flaky", "user:bob", "2")
	do(t, ops, "its page",
		chromedp.Click(row+" a"),
		chromedp.WaitVisible(`#timeline li[data-type="capability.completed"]`),
	)
	has(t, "the timeline", text(t, ops, "#timeline"), "attempt 1 started", "retry: attempt 2", "after EXECUTION_FAILED", "attempt 2 started", "completed")
	screenshot(t, ops, "console-execution-retry.png")

	do(t, ops, "the capabilities",
		chromedp.Navigate(r.base+"/capabilities"),
		chromedp.WaitVisible("#pool-default"),
	)
	has(t, "the default pool", text(t, ops, "#pool-default"), "orders.refund", "demo.flaky", "queued", r.worker.ID())

	// An execution's page opened before anything of it is stored shows it
	// once it is.
	id := envelope.NewExecutionID()
	do(t, ops, "a page waiting for its execution",
		chromedp.Navigate(r.base+"/executions/"+id),
		chromedp.WaitVisible("#exec-unknown"),
	)
	if _, err := r.client.Submit(testCtx(t), "demo.echo", map[string]any{"late": true}, executor.WithID(id), executor.As(alice)); err != nil {
		t.Fatal(err)
	}
	do(t, ops, "the execution appears on its page",
		chromedp.WaitVisible(`#timeline li[data-type="capability.completed"]`),
		chromedp.WaitVisible("#envelope"),
	)
	has(t, "the late execution's envelope", text(t, ops, "#envelope"), `"late": true`, `"status": "completed"`)
}

// colorScheme makes the tab's pages prefer scheme: light or dark.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

// fits reports, for the page in tab, how far the document is wider than the
// window (0: no horizontal scrolling), and the actions among sel that are
// not wholly within the window's width or not shown at all.
func fits(t *testing.T, tab context.Context, sel ...string) (overflow int, hidden []string) {
	t.Helper()
	ctx, cancel := context.WithDeadline(tab, deadlineOf(t))
	defer cancel()
	over, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`))
	if err != nil {
		t.Fatalf("measure the page: %v", err)
	}
	for _, s := range sel {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
			const els = document.querySelectorAll(`+"`"+s+"`"+`);
			if (!els.length) return false;
			for (const el of els) {
				const r = el.getBoundingClientRect(), st = getComputedStyle(el);
				if (r.width === 0 || r.height === 0 || st.visibility === "hidden" || st.display === "none") return false;
				if (r.left < 0 || r.right > window.innerWidth) return false;
			}
			return true;
		})()`))
		if err != nil {
			t.Fatalf("measure %s: %v", s, err)
		}
		if !ok {
			hidden = append(hidden, s)
		}
	}
	return over, hidden
}

// On a phone's 390 px, in light and in dark, no page scrolls sideways and
// every action is within reach: the navigation, sign out, the filters, an
// approval's approve, reject and comment, an execution's cancel and copy,
// the list's links. The favicon is served.
func TestBrowser_PhoneWidthNoHorizontalScrollEveryActionVisible(t *testing.T) {
	t.Parallel()
	b := browser(t)
	r := startRig(t, "", console.Config{Open: true})
	pending := r.call(t, "orders.refund", demo.RefundInput{OrderID: "o-2002", Amount: 1200}, alice)
	r.call(t, "demo.flaky", demo.FlakyInput{FailTimes: 1}, alice)
	r.call(t, "orders.refund", demo.RefundInput{OrderID: "o-2003", Amount: -1}, alice)
	// Running for minutes (email.send's hold would end at its 30 s timeout,
	// which a loaded machine reaches before the second pass), and
	// reporting its progress.
	running, err := r.client.Submit(testCtx(t), "demo.report", demo.ReportInput{Pages: 100_000, PageMs: 5}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	header := []string{".top .brand", `.top nav a[href="/approvals"]`, `.top nav a[href="/executions"]`, `.top nav a[href="/capabilities"]`,
		"#principal", "form[action='/signout'] button"}
	pages := []struct {
		name, path, wait string
		actions          []string
	}{
		{"home", "/", "#tile-executions", []string{"#tile-approvals", "#tile-executions", "#tile-capabilities"}},
		{"inbox", "/approvals", "#a-" + pending.Approval.ID, []string{"#a-" + pending.Approval.ID + " button.approve",
			"#a-" + pending.Approval.ID + " button.reject", "#a-" + pending.Approval.ID + " textarea"}},
		{"executions", "/executions", "#exec-table", []string{"#filters button", "#filters input[name=capability]",
			"#filters select[name=status]", "#e-" + running + " a"}},
		{"execution", "/executions/" + running, "#exec-progress", []string{"#cancel", "button.copy", "#exec-id", "#exec-progress-bar", "#exec-progress-text"}},
		{"approval's execution", "/executions/" + pending.ExecutionID, "#exec-input", []string{"#exec-approval a", "button.copy"}},
		{"capabilities", "/capabilities", "#pool-default", []string{`[id="cap-orders.refund"]`}},
	}
	for _, scheme := range []string{"light", "dark"} {
		phone := tab(t, b)
		do(t, phone, "a phone's viewport, "+scheme, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
			colorScheme(scheme))
		signInTab(t, phone, r.base, "user:alice", "finance")
		for _, pg := range pages {
			do(t, phone, pg.name+" at 390 px", chromedp.Navigate(r.base+pg.path), chromedp.WaitVisible(pg.wait))
			over, hidden := fits(t, phone, append(header, pg.actions...)...)
			if over > 0 {
				t.Errorf("%s (%s) is %d px wider than a 390 px phone", pg.name, scheme, over)
			}
			if len(hidden) > 0 {
				t.Errorf("%s (%s): out of reach at 390 px: %v", pg.name, scheme, hidden)
			}
			if bg, err := chromedp.Run(phone, chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor`)); err != nil {
				t.Fatal(err)
			} else if dark := bg != "rgb(246, 247, 249)"; dark != (scheme == "dark") {
				t.Errorf("%s in %s has the background %s", pg.name, scheme, bg)
			}
			switch pg.name {
			case "inbox", "execution", "executions":
				screenshot(t, phone, "console-phone-"+strings.ReplaceAll(pg.name, " ", "-")+"-"+scheme+".png")
			}
		}
		// The sign-in page too, signed out.
		do(t, phone, "sign out", chromedp.Click("form[action='/signout'] button"), chromedp.WaitVisible("#signin"))
		if over, hidden := fits(t, phone, "#name", "#signin"); over > 0 || len(hidden) > 0 {
			t.Errorf("sign-in (%s) at 390 px: %d px too wide, out of reach: %v", scheme, over, hidden)
		}
	}
	// Wide, in dark: the same pages lay out as on a desktop.
	wide := tab(t, b)
	do(t, wide, "a desktop, dark", colorScheme("dark"))
	signInTab(t, wide, r.base, "user:alice", "finance")
	do(t, wide, "the executions", chromedp.Navigate(r.base+"/executions"), chromedp.WaitVisible("#exec-table"))
	if over, hidden := fits(t, wide, append(header, "#filters button")...); over > 0 || len(hidden) > 0 {
		t.Errorf("executions at 1280 px: %d px too wide, out of reach: %v", over, hidden)
	}
	screenshot(t, wide, "console-executions-dark.png")
	icon, err := chromedp.Run(wide, chromedp.Evaluate[string](`fetch("/favicon.ico").then(r => r.status + " " + r.headers.get("content-type"))`,
		chromedp.EvalAwaitPromise))
	if err != nil || !strings.HasPrefix(icon, "200 image/") {
		t.Fatalf("/favicon.ico: %q %v, want an image", icon, err)
	}
}

// An execution's page shows its handler's progress and follows it live: the
// bar and its text move without the page being loaded again; once the
// execution ends, its outcome replaces them.
func TestBrowser_ExecutionPageFollowsItsProgress(t *testing.T) {
	t.Parallel()
	b := browser(t)
	r := startRig(t, "", console.Config{Open: true})
	ctx := testCtx(t)
	id, err := r.client.Submit(ctx, "demo.report", demo.ReportInput{Pages: 600, PageMs: 50}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	ops := tab(t, b)
	signInTab(t, ops, r.base, "user:ops", "")
	do(t, ops, "the report's page shows its progress",
		chromedp.Navigate(r.base+"/executions/"+id),
		chromedp.WaitVisible("#exec-progress"),
	)
	mctx, mcancel := context.WithDeadline(ops, deadlineOf(t))
	defer mcancel()
	if _, err := chromedp.Run(mctx, chromedp.Evaluate[bool](`window.stayed = true`)); err != nil {
		t.Fatal(err)
	}
	// The page may come before the handler's first report: it shows the
	// report when it arrives, without a reload.
	wctx, wcancel := context.WithDeadline(ops, deadlineOf(t))
	defer wcancel()
	// The text is read by the poll that finds it: the live page replaces
	// its progress card as reports come, between two reads.
	first, err := chromedp.Run(wctx, chromedp.Poll[string](`(() => {
		const t = document.querySelector("#exec-progress-text")?.textContent ?? "";
		return t.includes("of 600") ? t : "";
	})()`))
	if err != nil {
		t.Fatalf("the report's first progress never showed: %v (text %q)", err, text(t, ops, "#exec-progress-text"))
	}
	has(t, "the progress", first, "of 600", "rendered")
	pctx, cancel := context.WithDeadline(ops, deadlineOf(t))
	defer cancel()
	if _, err := chromedp.Run(pctx, chromedp.Poll[bool](`(() => {
		const bar = document.querySelector("#exec-progress-bar");
		return document.querySelector("#exec-progress-text").textContent !== `+strconvQuote(first)+` && bar.max === 600 && bar.value > 0;
	})()`)); err != nil {
		t.Fatalf("the progress did not move on the page (it shows %q): %v", text(t, ops, "#exec-progress-text"), err)
	}
	stayed, err := chromedp.Run(pctx, chromedp.Evaluate[bool](`window.stayed === true`))
	if err != nil || !stayed {
		t.Fatalf("the page was loaded again to show progress (%v)", err)
	}
	screenshot(t, ops, "console-execution-progress.png")

	if _, err := r.client.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	do(t, ops, "the cancelled report's page shows its envelope and no progress",
		chromedp.WaitVisible("#envelope"),
		chromedp.WaitNotPresent("#exec-progress"),
	)
	has(t, "the envelope", text(t, ops, "#envelope"), `"status": "cancelled"`)
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
