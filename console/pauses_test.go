package console_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/capstan-dev/capstan/console"
)

// An admin pauses a capability from the capabilities page and lifts it
// again; the page shows what is paused, by whom and why; a session that is
// not an admin's is refused.
func TestPauses_AnAdminPausesAndUnpausesFromTheCapabilitiesPage(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	admin := newWeb(t, r.base)
	if status, _, body := admin.post("/signin", url.Values{"name": {"user:ops"}, "admin": {"1"}}); status != http.StatusOK {
		t.Fatalf("admin sign-in: %d\n%s", status, body)
	}
	_, _, body := admin.get("/capabilities")
	contains(t, "the capabilities page", body, `id="pauses"`, "Nothing is paused.", `action="/pauses"`)

	_, _, body = admin.post("/pauses", url.Values{"capability": {"email.send"}, "mode": {"hold"}, "reason": {"mail to the wrong list"}})
	contains(t, "the page after pausing", body, "Paused email.send: calls made meanwhile wait in their queue; applied by 1 worker.",
		`id="pause-s.`, "mail to the wrong list", "user:ops", `action="/pauses/unpause"`, "paused</span>")

	other := signInOpen(t, r.base, "user:bob", "")
	other.get("/capabilities")
	_, _, body = other.post("/pauses", url.Values{"all": {"1"}, "reason": {"mine"}})
	contains(t, "a refused pause", body, "Not paused: only an admin may pause calls.")

	_, _, body = admin.post("/pauses/unpause", url.Values{"capability": {"email.send"}, "reason": {"fixed"}})
	contains(t, "the page after unpausing", body, "Unpaused email.send", "Nothing is paused.")
}
