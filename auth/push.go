package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrNoResolver: no server took an account push. The server does not run
// this setup's configuration (the full resolver), or the connection is not
// the push user's.
var ErrNoResolver = errors.New("capstan auth: no server takes account pushes")

// pushGather is how long a push waits, after the first server's answer, for
// the other servers of a cluster to answer too.
const pushGather = 250 * time.Millisecond

// PushAccounts sends the capstan account and every principal's account (those
// removed included, which revoke their users) to the resolvers of the
// servers nc reaches, nc being a connection of the push user
// (DIR/push.creds). Every server of a cluster takes a push (those down catch
// up from the others), updates the account at once and disconnects the
// users it revokes. It returns how many servers took every account; an
// account a server refused fails the push, naming it.
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
	servers := -1
	for _, a := range all {
		n, err := pushAccount(ctx, nc, a.jwt)
		if err != nil {
			return 0, fmt.Errorf("capstan auth: push the %s: %w", a.name, err)
		}
		if servers < 0 || n < servers {
			servers = n
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
// number of servers that took it, or the first refusal.
func pushAccount(ctx context.Context, nc *nats.Conn, accountJWT string) (int, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(claimsUpdateSubject, inbox, []byte(accountJWT)); err != nil {
		return 0, err
	}
	took := map[string]bool{}
	wait := ctx
	for {
		m, err := sub.NextMsgWithContext(wait)
		if err != nil {
			if len(took) > 0 {
				return len(took), nil // every server that answered in time
			}
			if ctx.Err() != nil {
				return 0, fmt.Errorf("%w: no answer (%v)", ErrNoResolver, ctx.Err())
			}
			return 0, err
		}
		if m.Header.Get("Status") == "503" {
			return 0, fmt.Errorf("%w: nobody listens on %s — is the server running this setup's %s? "+
				"(a server still on a one-account configuration must restart on the one 'capstan auth migrate' wrote)",
				ErrNoResolver, claimsUpdateSubject, ServerConfigFile)
		}
		var a claimUpdateAnswer
		if err := json.Unmarshal(m.Data, &a); err != nil {
			return 0, fmt.Errorf("the answer of a server does not decode: %w", err)
		}
		if a.Error != nil || a.Data == nil || a.Data.Code != 200 {
			desc := string(m.Data)
			if a.Error != nil {
				desc = a.Error.Description
			}
			return 0, fmt.Errorf("server %q refused it: %s", a.Server.Name, desc)
		}
		took[a.Server.Name] = true
		if len(took) == 1 {
			var cancel context.CancelFunc
			wait, cancel = context.WithTimeout(ctx, pushGather)
			defer cancel()
		}
	}
}
