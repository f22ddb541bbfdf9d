package natsserver

import (
	"errors"
	"syscall"
)

// errorSharingViolation is Windows' ERROR_SHARING_VIOLATION, which the
// syscall package does not name.
const errorSharingViolation syscall.Errno = 32

// lockFile opens path sharing it with no one, which Windows undoes when the
// handle is closed or the process ends.
func lockFile(path string) (func(), error) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE, 0, nil,
		syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		if errors.Is(err, errorSharingViolation) {
			return nil, errStoreInUse
		}
		return nil, err
	}
	return func() { _ = syscall.CloseHandle(h) }, nil
}
