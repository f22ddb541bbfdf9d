package auth

// FailMigrationAt makes Migrate fail at the named step, as a crash there
// would, until the returned function restores it.
func FailMigrationAt(step string) (restore func()) {
	old := migrateStep
	migrateStep = func(s string) error {
		if s == step {
			return errInterrupted
		}
		return nil
	}
	return func() { migrateStep = old }
}

var errInterrupted = errorString("interrupted (test)")

type errorString string

func (e errorString) Error() string { return string(e) }
