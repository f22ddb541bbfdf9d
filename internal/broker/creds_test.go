package broker

import (
	"encoding/base64"
	"testing"
)

func TestCredsName_ReadsTheUserJWTsName(t *testing.T) {
	t.Parallel()
	claims := func(json string) string {
		return "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ." + base64.RawURLEncoding.EncodeToString([]byte(json)) + ".c2ln"
	}
	user := claims(`{"name":"alice","nats":{"type":"user"}}`)
	armored := "-----BEGIN NATS USER JWT-----\n" + user + "\n------END NATS USER JWT------\n\n" +
		"************************* IMPORTANT *************************\n\n" +
		"-----BEGIN USER NKEY SEED-----\nSUAEXAMPLE\n------END USER NKEY SEED------\n"
	for name, c := range map[string]struct {
		creds, want string
		ok          bool
	}{
		"armored":           {armored, "alice", true},
		"armored, CRLF":     {"-----BEGIN NATS USER JWT-----\r\n" + user + "\r\n------END NATS USER JWT------\r\n", "alice", true},
		"bare JWT":          {"  " + user + "\n", "alice", true},
		"an account's JWT":  {claims(`{"name":"acct","nats":{"type":"account"}}`), "", false},
		"claims not base64": {"a.%%%.c", "", false},
		"claims not JSON":   {claims(`{"name":`), "", false},
		"not a JWT":         {"-----BEGIN NATS USER JWT-----\nnotajwt\n------END NATS USER JWT------\n", "", false},
		"empty":             {"", "", false},
		"a header, no body": {"-----BEGIN NATS USER JWT-----\n", "", false},
	} {
		got, err := credsName([]byte(c.creds))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: credsName = %q, %v; want %q (ok %v)", name, got, err, c.want, c.ok)
		}
	}
}
