package notifier

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/notify"
)

// The rule of what a revision calls for, at a time, given when notifications
// began.
func TestDue(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	since := t0.Add(-time.Hour)
	rec := func(s approvals.Status, requested time.Time, decided time.Time) *approvals.Record {
		r := &approvals.Record{ID: "a", Status: s, RequestedAt: requested, ExpiresAt: requested.Add(15 * time.Minute)}
		if !decided.IsZero() {
			r.Decision = &approvals.Decision{Status: s, DecidedAt: decided}
		}
		return r
	}
	for _, c := range []struct {
		name  string
		r     *approvals.Record
		now   time.Time
		event notify.Event
		again time.Time
	}{
		{"pending before its expiry: requested, again at the expiry", rec(approvals.StatusPending, t0, time.Time{}), t0.Add(time.Minute), notify.EventRequested, t0.Add(15*time.Minute + expiryMargin)},
		{"pending requested before notifications began: still requested", rec(approvals.StatusPending, since.Add(-10*time.Minute), time.Time{}), since.Add(time.Minute), notify.EventRequested, since.Add(5*time.Minute + expiryMargin)},
		{"pending past its expiry: expired", rec(approvals.StatusPending, t0, time.Time{}), t0.Add(16 * time.Minute), notify.EventExpired, time.Time{}},
		{"pending that expired before notifications began: nothing", rec(approvals.StatusPending, since.Add(-time.Hour), time.Time{}), t0, "", time.Time{}},
		{"approved", rec(approvals.StatusApproved, t0, t0.Add(time.Minute)), t0.Add(2 * time.Minute), notify.EventApproved, time.Time{}},
		{"approved after its expiry passed: still approved (an approval, not an expiry)", rec(approvals.StatusApproved, t0, t0.Add(time.Minute)), t0.Add(time.Hour), notify.EventApproved, time.Time{}},
		{"rejected", rec(approvals.StatusRejected, t0, t0.Add(time.Minute)), t0.Add(2 * time.Minute), notify.EventRejected, time.Time{}},
		{"cancelled", rec(approvals.StatusCancelled, t0, t0.Add(time.Minute)), t0.Add(2 * time.Minute), notify.EventCancelled, time.Time{}},
		{"decided before notifications began: nothing", rec(approvals.StatusRejected, since.Add(-time.Hour), since.Add(-time.Minute)), t0, "", time.Time{}},
		{"written expired", rec(approvals.StatusExpired, t0, time.Time{}), t0.Add(20 * time.Minute), notify.EventExpired, time.Time{}},
		{"consumed: nothing", rec(approvals.StatusConsumed, t0, t0.Add(time.Minute)), t0.Add(2 * time.Minute), "", time.Time{}},
		{"a decision without its decision: nothing", rec(approvals.StatusApproved, t0, time.Time{}), t0, "", time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := due(c.r, since, c.now)
			if p.event != c.event || !p.again.Equal(c.again) {
				t.Fatalf("due = %q again %v, want %q again %v", p.event, p.again, c.event, c.again)
			}
		})
	}
}

func TestRetryBackoff_DoublesUpToMax(t *testing.T) {
	t.Parallel()
	r := Retry{}.withDefaults()
	var got []time.Duration
	var total time.Duration
	for a := 1; a < r.Attempts; a++ {
		got = append(got, r.backoff(a))
		total += r.backoff(a)
	}
	want := "[2s 4s 8s 16s 32s 1m4s 2m8s 4m16s 8m32s 10m0s 10m0s]"
	if fmt.Sprint(got) != want {
		t.Fatalf("waits %v, want %s", got, want)
	}
	if total < 35*time.Minute || total > 40*time.Minute {
		t.Fatalf("12 attempts span %v, documented as about 37 minutes", total)
	}
}

// The key names the event without the payload's "approval." prefix: the
// wire's "<approvalId>.<event>".
func TestKey_ApprovalIDDotEvent(t *testing.T) {
	t.Parallel()
	for e, want := range map[notify.Event]string{
		notify.EventRequested: "a1.requested", notify.EventApproved: "a1.approved", notify.EventRejected: "a1.rejected",
		notify.EventCancelled: "a1.cancelled", notify.EventExpired: "a1.expired",
	} {
		if got := Key("a1", e); got != want {
			t.Errorf("Key(a1, %s) = %q, want %q", e, got, want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HOOK_SECRET": "from-the-environment-0123", "SLACK_URL": "https://hooks.slack.com/services/T1/B2/envsecret"}
	getenv := func(k string) string { return env[k] }
	for _, c := range []struct {
		name string
		json string
		want string // a part of the error; empty: valid
	}{
		{"every kind", `{"consoleUrl":"https://c.example.com","retry":{"attempts":3,"initial":"1s","max":"1m"},"timeout":"5s","channels":[
			{"name":"hook","kind":"webhook","types":["*"],"url":"https://h.example.com/x","secretEnv":"HOOK_SECRET"},
			{"name":"slack","kind":"slack","types":["finance"],"urlEnv":"SLACK_URL"},
			{"name":"mail","kind":"email","types":["finance","legal"],"smtp":{"host":"smtp.example.com","username":"u","password":"p"},"from":"a@example.com","to":["b@example.com"]}]}`, ""},
		{"no channels", `{"channels":[]}`, "no channels"},
		{"unknown field", `{"channels":[],"chanels":[]}`, `unknown field "chanels"`},
		{"unset variable", `{"channels":[{"name":"h","kind":"webhook","types":["*"],"url":"https://h.example.com","secretEnv":"NOPE"}]}`, "secretEnv names NOPE, which is not set"},
		{"inline and variable", `{"channels":[{"name":"h","kind":"webhook","types":["*"],"url":"https://h.example.com","secret":"0123456789abcdef0","secretEnv":"HOOK_SECRET"}]}`, "secret and secretEnv both set"},
		{"short secret", `{"channels":[{"name":"h","kind":"webhook","types":["*"],"url":"https://h.example.com","secret":"short"}]}`, "at least 16 bytes"},
		{"http beyond loopback", `{"channels":[{"name":"s","kind":"slack","types":["*"],"url":"http://hooks.example.com/T/B/secretpath"}]}`, "http to hooks.example.com"},
		{"http beyond loopback, allowed", `{"channels":[{"name":"s","kind":"slack","types":["*"],"url":"http://hooks.example.com/T/B/secretpath","allowHttp":true}]}`, ""},
		{"http on loopback", `{"channels":[{"name":"s","kind":"slack","types":["*"],"url":"http://127.0.0.1:9/T/B/secretpath"}]}`, ""},
		{"credentials in the url", `{"channels":[{"name":"s","kind":"slack","types":["*"],"url":"https://u:pw@hooks.example.com/"}]}`, "credentials in the URL"},
		{"no types", `{"channels":[{"name":"s","kind":"slack","url":"https://hooks.example.com/"}]}`, "types:"},
		{"bad name", `{"channels":[{"name":"Big Name","kind":"slack","types":["*"],"url":"https://hooks.example.com/"}]}`, "name:"},
		{"twice a name", `{"channels":[{"name":"s","kind":"slack","types":["*"],"url":"https://hooks.example.com/"},{"name":"s","kind":"slack","types":["*"],"url":"https://hooks.example.com/"}]}`, "two channels"},
		{"unknown kind", `{"channels":[{"name":"s","kind":"pager","types":["*"]}]}`, `kind "pager"`},
		{"bad tls", `{"channels":[{"name":"m","kind":"email","types":["*"],"smtp":{"host":"h","tls":"sometimes"},"from":"a@example.com","to":["b@example.com"]}]}`, `smtp.tls "sometimes"`},
		{"bad address", `{"channels":[{"name":"m","kind":"email","types":["*"],"smtp":{"host":"h"},"from":"nobody","to":["b@example.com"]}]}`, `from "nobody"`},
		{"bad duration", `{"timeout":"soon","channels":[]}`, "not a duration"},
		{"bad console url", `{"consoleUrl":"console","channels":[{"name":"s","kind":"slack","types":["*"],"url":"https://hooks.example.com/"}]}`, "consoleUrl"},
		{"not JSON", `{"channels":`, "not JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse([]byte(c.json), getenv, "")
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one saying %q", err, c.want)
			case err != nil:
				if !errors.Is(err, ErrConfig) {
					t.Errorf("%v is not ErrConfig", err)
				}
				mustNotContain(t, "the error", err.Error(), "secretpath", "0123456789abcdef0", "pw@", env["HOOK_SECRET"])
			}
		})
	}
}

// A parsed configuration holds its secrets, and prints, logs and marshals
// none of them.
func TestSecrets_NeverPrinted(t *testing.T) {
	t.Parallel()
	cfg, err := parse([]byte(`{"channels":[
		{"name":"hook","kind":"webhook","types":["*"],"url":"https://h.example.com/tokenpath","secret":"signing-key-0123456789"},
		{"name":"mail","kind":"email","types":["*"],"smtp":{"host":"smtp.example.com","username":"u","password":"mail-password-xyz"},"from":"a@example.com","to":["b@example.com"]}]}`), os.Getenv, "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Channels[0].Secret.reveal() != "signing-key-0123456789" || cfg.Channels[1].SMTP.Password.reveal() != "mail-password-xyz" {
		t.Fatal("secrets not read")
	}
	var logged logBuffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg, "secret", cfg.Channels[0].Secret)
	js, _ := json.Marshal(cfg)
	for where, text := range map[string]string{
		"%v": fmt.Sprintf("%v", cfg), "%+v": fmt.Sprintf("%+v", cfg), "%#v": fmt.Sprintf("%#v", cfg),
		"JSON": string(js), "slog": logged.String(),
	} {
		mustNotContain(t, where, text, "tokenpath", "signing-key-0123456789", "mail-password-xyz")
	}
}

// A configuration file anyone but its owner may read is refused, with the
// mode to set.
func TestLoadFile_RefusedUnlessOwnerOnly(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("no permission bits on Windows")
	}
	path := filepath.Join(t.TempDir(), "notify.json")
	doc := `{"channels":[{"name":"s","kind":"slack","types":["*"],"url":"https://hooks.example.com/T/B/secret"}]}`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "chmod 600") || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("LoadFile of a 0644 file: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o620} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadFile(path); !errors.Is(err, ErrConfig) {
			t.Fatalf("mode %#o accepted", mode)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err != nil {
		t.Fatalf("LoadFile of a 0600 file: %v", err)
	}
}
