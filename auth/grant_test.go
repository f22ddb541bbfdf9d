package auth_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
)

func TestGrant_ActorsSurfacesCapabilitiesAndTypes(t *testing.T) {
	t.Parallel()
	gateway := auth.Grant{Principal: "gw", Role: auth.RoleProducer, Actors: []string{"user:*", "service:billing"},
		Surfaces: []string{"mcp"}, Capabilities: []string{"orders.*", "demo.echo"}}
	approver := auth.Grant{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance", "legal"}}
	user := func(kind, id string) envelope.Actor { return envelope.Actor{Kind: kind, ID: id} }
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"delegated user", gateway.CheckActor(user("user", "anyone")), nil},
		{"fixed service", gateway.CheckActor(user("service", "billing")), nil},
		{"other service", gateway.CheckActor(user("service", "payroll")), auth.ErrActorNotGranted},
		{"other kind", gateway.CheckActor(user("agent", "x")), auth.ErrActorNotGranted},
		{"an approver calls", approver.CheckActor(user("user", "carol")), auth.ErrWrongRole},
		{"granted surface", gateway.CheckSurface("mcp"), nil},
		{"other surface", gateway.CheckSurface("direct"), auth.ErrSurfaceNotGranted},
		{"prefix", gateway.CheckCapability("orders.refund"), nil},
		{"deeper under the prefix", gateway.CheckCapability("orders.refund.partial"), nil},
		{"the prefix alone is not under it", gateway.CheckCapability("orders"), auth.ErrCapabilityNotGranted},
		{"a look-alike prefix", gateway.CheckCapability("ordersx.refund"), auth.ErrCapabilityNotGranted},
		{"exact id", gateway.CheckCapability("demo.echo"), nil},
		{"other id", gateway.CheckCapability("demo.sleep"), auth.ErrCapabilityNotGranted},
		{"types held", approver.CheckTypes([]string{"finance"}), nil},
		{"one type not held", approver.CheckTypes([]string{"finance", "ops"}), auth.ErrTypeNotGranted},
		{"no types needs *", approver.CheckTypes(nil), auth.ErrTypeNotGranted},
		{"a producer decides", gateway.CheckTypes([]string{"finance"}), auth.ErrWrongRole},
	} {
		if (tc.want == nil) != (tc.err == nil) || (tc.want != nil && !errors.Is(tc.err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if id := approver.Identity(); id.String() != "user:carol" {
		t.Errorf("approver identity %s", id)
	}
}

func TestGrant_ValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	err := auth.Grant{Principal: "Bad Name", Role: "root", Actors: []string{"nokind", "user:a*"},
		Capabilities: []string{"orders.>"}, Surfaces: []string{"m p"}}.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{`principal "Bad Name"`, `role "root"`, `actor "nokind"`, `actor "user:a*"`, `capability "orders.>"`, `surface "m p"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %s", err, want)
		}
	}
}
