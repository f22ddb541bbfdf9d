//go:build !windows

package broker

import "io/fs"

// loose reports whether mode lets anyone but the owner read or write.
func loose(mode fs.FileMode) bool { return mode&0o077 != 0 }
