package notify

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestVerify(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef")
	body := []byte(`{"idempotencyKey":"a.requested"}`)
	now := time.Unix(1_800_000_000, 0)
	good := Sign(secret, body, now)
	for _, c := range []struct {
		name   string
		header string
		body   []byte
		secret []byte
		at     time.Time
		want   error
	}{
		{"as signed", good, body, secret, now, nil},
		{"within the tolerance", good, body, secret, now.Add(4 * time.Minute), nil},
		{"replayed later", good, body, secret, now.Add(6 * time.Minute), ErrSignatureTooOld},
		{"from the future", good, body, secret, now.Add(-6 * time.Minute), ErrSignatureTooOld},
		{"another body", good, []byte(`{"idempotencyKey":"b.requested"}`), secret, now, ErrSignatureMismatch},
		{"another secret", good, body, []byte("fedcba9876543210"), now, ErrSignatureMismatch},
		{"timestamp changed", strings.Replace(good, "t=1800000000", "t=1800000001", 1), body, secret, now, ErrSignatureMismatch},
		{"a rotated key beside the old one", good + ",v1=" + strings.Repeat("00", 32), body, secret, now, nil},
		{"no v1", "t=1800000000", body, secret, now, ErrSignatureMalformed},
		{"not hex", "t=1800000000,v1=zz", body, secret, now, ErrSignatureMalformed},
		{"empty", "", body, secret, now, ErrSignatureMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if err := Verify(c.secret, c.header, c.body, c.at, 0); !errors.Is(err, c.want) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
		})
	}
}

// The signature is the documented one: hex HMAC-SHA256 of "<t>.<body>".
func TestSign_DocumentedScheme(t *testing.T) {
	t.Parallel()
	got := Sign([]byte("key"), []byte("body"), time.Unix(1700000000, 0))
	// printf '1700000000.body' | openssl dgst -sha256 -hmac key
	want := "t=1700000000,v1=47b6ce0fca59474308e2921c247cb2493dce6b8101d90ac05bd0c6a37d0e046e"
	if got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	if err := Verify([]byte("key"), got, []byte("body"), time.Unix(1700000000, 0), 0); err != nil {
		t.Fatal(err)
	}
}
