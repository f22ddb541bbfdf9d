//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package natsserver

import (
	"errors"
	"os"
	"syscall"
)

// lockFile holds an exclusive flock on path, which the kernel drops when the
// file is closed or the process ends.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errStoreInUse
		}
		return nil, err
	}
	return func() { _ = f.Close() }, nil
}
