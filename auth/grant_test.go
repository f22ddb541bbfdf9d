package auth

import (
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

func TestGrant_ActorsSurfacesCapabilitiesAndTypes(t *testing.T) {
	t.Parallel()
	gateway := Grant{Principal: "gw", Role: RoleProducer, Actors: []string{"user:*", "service:billing"},
		Surfaces: []string{"mcp"}, Capabilities: []string{"orders.*", "demo.echo"}}
	approver := Grant{Principal: "carol", Role: RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance", "legal"}}
	user := func(kind, id string) envelope.Actor { return envelope.Actor{Kind: kind, ID: id} }
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"delegated user", gateway.checkActor(user("user", "anyone")), nil},
		{"fixed service", gateway.checkActor(user("service", "billing")), nil},
		{"other service", gateway.checkActor(user("service", "payroll")), errActorNotGranted},
		{"other kind", gateway.checkActor(user("agent", "x")), errActorNotGranted},
		{"an approver calls", approver.checkActor(user("user", "carol")), errWrongRole},
		{"granted surface", gateway.checkSurface("mcp"), nil},
		{"other surface", gateway.checkSurface("direct"), errSurfaceNotGranted},
		{"prefix", gateway.checkCapability("orders.refund"), nil},
		{"deeper under the prefix", gateway.checkCapability("orders.refund.partial"), nil},
		{"the prefix alone is not under it", gateway.checkCapability("orders"), ErrCapabilityNotGranted},
		{"a look-alike prefix", gateway.checkCapability("ordersx.refund"), ErrCapabilityNotGranted},
		{"exact id", gateway.checkCapability("demo.echo"), nil},
		{"other id", gateway.checkCapability("demo.sleep"), ErrCapabilityNotGranted},
		{"types held", approver.checkTypes([]string{"finance"}), nil},
		{"one type not held", approver.checkTypes([]string{"finance", "ops"}), errTypeNotGranted},
		{"no types needs *", approver.checkTypes(nil), errTypeNotGranted},
		{"a producer decides", gateway.checkTypes([]string{"finance"}), errWrongRole},
	} {
		if (tc.want == nil) != (tc.err == nil) || (tc.want != nil && !errors.Is(tc.err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if id := approver.identity(); id.String() != "user:carol" {
		t.Errorf("approver identity %s", id)
	}
}

func TestGrant_ValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	err := Grant{Principal: "Bad Name", Role: "root", Actors: []string{"nokind", "user:a*"},
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
