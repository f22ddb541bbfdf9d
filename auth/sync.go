package auth

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
)

// Sync re-signs the accounts whose exports or imports differ from what this
// version's crossings say: the capstan account's exports, and each producer's
// and approver's imports (with new activation tokens), keeping revocations
// and limits. A version of capstan that adds a request the workers serve, or
// a subject sent to principals, thus reaches existing principals at the next
// push (capstan auth push runs it first). It reports whether it changed
// anything, and saves the setup when it did.
func (s *Setup) Sync() (bool, error) {
	if err := s.Current(); err != nil {
		return false, err
	}
	k, err := s.loadKeys()
	if err != nil {
		return false, err
	}
	changed := false
	ac, err := jwt.DecodeAccountClaims(s.AccountJWT)
	if err != nil {
		return false, fmt.Errorf("capstan auth: capstan account: %w", err)
	}
	if !sameExports(ac.Exports, exports(s.names())) {
		if err := s.signCapstanAccount(k, nil); err != nil {
			return false, err
		}
		changed = true
	}
	for i := range s.Principals {
		g := &s.Principals[i]
		if g.Account == "" {
			continue
		}
		pc, err := jwt.DecodeAccountClaims(g.AccountJWT)
		if err != nil {
			return false, fmt.Errorf("capstan auth: account of %q: %w", g.Principal, err)
		}
		want, err := importsFor(s.names(), g.Role, g.Principal, g.Account, s.Account, func(*jwt.ActivationClaims) (string, error) { return "to sign", nil })
		if err != nil {
			return false, err
		}
		if sameImports(pc.Imports, want) {
			continue
		}
		akp, err := s.principalAccountKey(g.Principal, false)
		if err != nil {
			return false, err
		}
		if err := s.signPrincipalAccount(k, akp, g); err != nil {
			return false, err
		}
		changed = true
	}
	if !changed {
		return false, nil
	}
	if err := s.writeServerConfig(); err != nil {
		return false, err
	}
	return true, s.save()
}

// crossing is what Sync compares of an export or an import.
type crossing struct {
	subject   string
	typ       jwt.ExportType
	private   bool
	response  jwt.ResponseType
	threshold time.Duration
}

func sameExports(have, want jwt.Exports) bool {
	key := func(e *jwt.Export) crossing {
		return crossing{string(e.Subject), e.Type, e.TokenReq, e.ResponseType, e.ResponseThreshold}
	}
	return sameSet(have, want, key)
}

func sameImports(have, want jwt.Imports) bool {
	key := func(i *jwt.Import) crossing {
		return crossing{subject: string(i.Subject), typ: i.Type, private: i.Token != ""}
	}
	return sameSet(have, want, key)
}

func sameSet[T any](have, want []T, key func(T) crossing) bool {
	if len(have) != len(want) {
		return false
	}
	set := map[crossing]bool{}
	for _, h := range have {
		set[key(h)] = true
	}
	for _, w := range want {
		if !set[key(w)] {
			return false
		}
	}
	return true
}
