package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/internal/credfile"
)

// ErrNoResolver: no server took an account push. The server does not run
// this setup's configuration (the full resolver), or the connection is not
// the push user's.
var ErrNoResolver = errors.New("capstan auth: no server takes account pushes")

// pushGather is how long a push waits, after a server's answer, for another
// server of a cluster to answer too, while it does not know them all;
// pushSettle bounds the wait, after the first answer, for servers an earlier
// account's push heard from.
const (
	pushGather = time.Second
	pushSettle = 5 * time.Second
)

// PushAccounts sends the capstan account and every principal's account (those
// removed included, which revoke their users) to the resolvers of the
// servers nc reaches, nc being a connection of the push user
// (DIR/push.creds). Every server of a cluster takes a push (those down catch
// up from the others), updates the account at once and disconnects the
// users it revokes. It returns how many servers took every account; an
// account a server refused fails the push, naming it.
//
// Pushing to the full resolver, rather than rewriting a memory resolver's
// configuration, spares every node a reload per principal added (and
// nats-server 2.15.2's ReloadOptions races with direct gets in flight).
func PushAccounts(ctx context.Context, nc *nats.Conn, s *Setup) (int, error) {
	if err := s.Current(); err != nil {
		return 0, err
	}
	type account struct{ name, jwt string }
	all := []account{{"capstan account", s.AccountJWT}}
	for _, g := range s.Principals {
		if g.AccountJWT != "" {
			all = append(all, account{"account of " + g.Principal, g.AccountJWT})
		}
	}
	for _, r := range s.Removed {
		all = append(all, account{"account of removed " + r.Principal, r.AccountJWT})
	}
	// The first account's push learns which servers answer: later pushes
	// wait for those, not for a guess of how long a loaded server takes.
	servers, known := -1, map[string]bool{}
	for _, a := range all {
		took, err := pushAccount(ctx, nc, a.jwt, known)
		if err != nil {
			return 0, fmt.Errorf("capstan auth: push the %s: %w", a.name, err)
		}
		if servers < 0 || len(took) < servers {
			servers = len(took)
		}
		for name := range took {
			known[name] = true
		}
	}
	return servers, nil
}

// claimUpdateAnswer is a server's answer to an account push.
type claimUpdateAnswer struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Data *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// pushAccount sends one account JWT and reads every server's answer: the
// servers that took it, or the first refusal. It waits for every server in
// known (up to pushSettle after the first answer); knowing none, for as many
// as the connection knows of (the URLs it was given and those the cluster
// told it), each answer giving the next pushGather more.
func pushAccount(ctx context.Context, nc *nats.Conn, accountJWT string, known map[string]bool) (map[string]bool, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(claimsUpdateSubject, inbox, []byte(accountJWT)); err != nil {
		return nil, err
	}
	took := map[string]bool{}
	var settle time.Time
	for {
		wait, cancel := ctx, context.CancelFunc(func() {})
		if len(took) > 0 {
			switch {
			case allOf(known, took) || (len(known) == 0 && len(took) >= len(nc.Servers())):
				// Every server heard from before, or every one the
				// connection knows of: only what is queued.
				wait, cancel = context.WithDeadline(ctx, time.Now())
			case len(known) > 0:
				wait, cancel = context.WithDeadline(ctx, settle)
			default:
				wait, cancel = context.WithTimeout(ctx, pushGather)
			}
		}
		m, err := sub.NextMsgWithContext(wait)
		cancel()
		if err != nil {
			if len(took) > 0 {
				return took, nil // every server that answered in time
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: no answer (%v)", ErrNoResolver, ctx.Err())
			}
			return nil, err
		}
		if m.Header.Get("Status") == "503" {
			return nil, fmt.Errorf("%w: nobody listens on %s — is the server running this setup's %s? "+
				"(a server still on a one-account configuration must restart on the one 'capstan auth migrate' wrote)",
				ErrNoResolver, claimsUpdateSubject, credfile.ServerConfigFile)
		}
		var a claimUpdateAnswer
		if err := json.Unmarshal(m.Data, &a); err != nil {
			return nil, fmt.Errorf("the answer of a server does not decode: %w", err)
		}
		if a.Error != nil || a.Data == nil || a.Data.Code != 200 {
			desc := string(m.Data)
			if a.Error != nil {
				desc = a.Error.Description
			}
			return nil, fmt.Errorf("server %q refused it: %s", a.Server.Name, desc)
		}
		if len(took) == 0 {
			settle = time.Now().Add(pushSettle)
		}
		took[a.Server.Name] = true
	}
}

// allOf reports whether every server in known is in took (and known is not
// empty).
func allOf(known, took map[string]bool) bool {
	if len(known) == 0 {
		return false
	}
	for name := range known {
		if !took[name] {
			return false
		}
	}
	return true
}
