package auth_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
)

// A secured deployment from zero: generated credentials, a server that
// enforces them, grants that workers read.
func Example() {
	dir, _ := os.MkdirTemp("", "capstan-auth-example-")
	defer os.RemoveAll(dir)

	setup, err := auth.Init(dir+"/secrets", "")
	if err != nil {
		panic(err)
	}
	// A gateway that authenticates its own end users, calling refunds from MCP.
	err = setup.Add(auth.Grant{Principal: "gateway", Role: auth.RoleProducer,
		Actors: []string{"user:*"}, Surfaces: []string{"mcp"}, Capabilities: []string{"orders.*"}})
	if err != nil {
		panic(err)
	}

	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir + "/store", Port: -1,
		ConfigFile: setup.ServerConfigPath(), ResolverDir: dir + "/store/jwt"})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	url := natsserver.ClientURL(srv)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The principals' accounts, pushed to the running server.
	push, err := broker.Connect(broker.ConnectOptions{URL: url, Creds: setup.PushCredsPath()})
	if err != nil {
		panic(err)
	}
	defer push.Close()
	if _, err := auth.PushAccounts(ctx, push, setup); err != nil {
		panic(err)
	}
	admin, err := broker.Connect(broker.ConnectOptions{URL: url, Creds: setup.CredsPath(auth.AdminPrincipal)})
	if err != nil {
		panic(err)
	}
	defer admin.Close()
	b, err := broker.Provision(ctx, admin, broker.Config{})
	if err != nil {
		panic(err)
	}
	if err := auth.PublishGrants(ctx, b.JS, setup, 0); err != nil {
		panic(err)
	}

	// Stage 6 of every request is its principal's grant's decision (workers
	// read the grants PublishGrants wrote); a principal without a grant is
	// refused as unauthenticated.
	bob := envelope.Actor{Kind: "user", ID: "bob"}
	gateway, _ := setup.Grant("gateway")
	fmt.Println(gateway.CheckCall(bob, "mcp", "orders.refund"))
	fmt.Println(codeOf(gateway.CheckCall(bob, "direct", "orders.refund")))
	_, granted := setup.Grant("stranger")
	fmt.Println(granted)

	// The gateway connects with its own credentials, in its own account.
	gw, err := broker.Connect(broker.ConnectOptions{URL: url, Creds: setup.CredsPath("gateway")})
	if err != nil {
		panic(err)
	}
	defer gw.Close()
	fmt.Println(broker.PrincipalOf(gw, setup.Names()))
	// Output:
	// <nil>
	// FORBIDDEN
	// false
	// gateway
}

func codeOf(err error) envelope.Code {
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}
