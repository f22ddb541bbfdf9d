package broker

import (
	"errors"
	"fmt"
	"os"
)

// ErrReadableByOthers: a file holding a secret (credentials, a seed, bearer
// tokens) may be read by users other than its owner.
var ErrReadableByOthers = errors.New("readable by others")

// CheckPrivate refuses a secret file that users other than its owner may read
// or write, naming the mode to set. On Windows, whose files carry no such
// mode, it only checks that the file exists.
func CheckPrivate(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if mode := fi.Mode().Perm(); loose(mode) {
		return fmt.Errorf("%s is %w (mode %04o): it holds a secret; run chmod 600 %s", path, ErrReadableByOthers, mode, path)
	}
	return nil
}
