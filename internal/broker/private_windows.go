//go:build windows

package broker

import "io/fs"

// loose is false: Windows files carry no Unix mode (access is the ACL's).
func loose(fs.FileMode) bool { return false }
