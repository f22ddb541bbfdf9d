//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly || windows)

package natsserver

// lockFile takes no lock where the platform offers no advisory one.
func lockFile(string) (func(), error) { return func() {}, nil }
