package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// A NATS URL may carry a user and password or a token: a connection error
// names the server without them.
func TestConnectionError_URLSecretsNotPrinted(t *testing.T) {
	t.Parallel()
	port := freePort(t) // nothing listens there
	for _, url := range []string{
		fmt.Sprintf("nats://alice:s3cret-pass@127.0.0.1:%d", port),
		fmt.Sprintf("nats://s3cret-token@127.0.0.1:%d", port),
		fmt.Sprintf("nats://127.0.0.1:1,nats://bob:s3cret-pass@127.0.0.1:%d", port),
	} {
		for _, args := range [][]string{
			{"call", "demo.echo"},
			{"status", envelope.NewExecutionID()},
		} {
			stdout, stderr, code := capstan(t, url, args...)
			if code != exitUsage {
				t.Fatalf("%s via %s: exit %d, want %d; stdout %s stderr %s", args[0], url, code, exitUsage, stdout, stderr)
			}
			if strings.Contains(stderr, "s3cret") || strings.Contains(stdout, "s3cret") {
				t.Fatalf("%s via %s printed the secret:\n%s%s", args[0], url, stdout, stderr)
			}
			if !strings.Contains(stderr, fmt.Sprintf("127.0.0.1:%d", port)) {
				t.Fatalf("%s via %s: the error does not name the server:\n%s", args[0], url, stderr)
			}
		}
	}
}
