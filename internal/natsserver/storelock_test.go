package natsserver

import (
	"strings"
	"testing"
)

// A store held by one LockStore is refused to another, saying whose it may be
// and what to do, until the first lets it go.
func TestLockStore_HeldStoreRefusedUntilReleased(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unlock, err := LockStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockStore(dir); err == nil || !strings.Contains(err.Error(), "in use by another process") || !strings.Contains(err.Error(), "--store") {
		t.Fatalf("second lock of a held store: %v", err)
	}
	unlock()
	again, err := LockStore(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again()
}
