package natsserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// errStoreInUse is lockFile's answer when another process holds the
// store: two servers writing one JetStream store directory damage it.
var errStoreInUse = errors.New("in use by another process")

// lockFileName is the file in a store directory whose lock says a process
// serves the store.
const lockFileName = "capstan.lock"

// LockStore takes the store directory dir for this process until unlock is
// called or the process ends (the operating system then releases it, even
// after a crash). A store another process holds is refused at once, before
// the server reads any of it: JetStream's files have no lock of their own, and
// two servers on one store lose and corrupt each other's messages.
func LockStore(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	path := filepath.Join(dir, lockFileName)
	release, err := lockFile(path)
	if errors.Is(err, errStoreInUse) {
		return nil, fmt.Errorf("store %s is in use by another process (another 'capstan dev' or 'capstan server'?): stop it, or give this one its own --store DIR", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	return release, nil
}
