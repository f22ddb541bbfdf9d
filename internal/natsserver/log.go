package natsserver

import (
	"context"
	"fmt"
	"log/slog"
)

// levelTrace is below slog.LevelDebug: nats-server's protocol tracing.
const levelTrace = slog.LevelDebug - 4

// logAdapter implements server.Logger on top of slog. It also keeps the first
// fatal message, which is how nats-server reports a failed start.
type logAdapter struct {
	logger *slog.Logger // nil: discard
	fatal  chan string
}

func newLogAdapter(l *slog.Logger) *logAdapter {
	return &logAdapter{logger: l, fatal: make(chan string, 1)}
}

func (a *logAdapter) log(level slog.Level, format string, v []any) {
	if a.logger == nil || !a.logger.Enabled(context.Background(), level) {
		return
	}
	a.logger.Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "nats-server")
}

func (a *logAdapter) Noticef(format string, v ...any) { a.log(slog.LevelInfo, format, v) }
func (a *logAdapter) Warnf(format string, v ...any)   { a.log(slog.LevelWarn, format, v) }
func (a *logAdapter) Errorf(format string, v ...any)  { a.log(slog.LevelError, format, v) }
func (a *logAdapter) Debugf(format string, v ...any)  { a.log(slog.LevelDebug, format, v) }
func (a *logAdapter) Tracef(format string, v ...any)  { a.log(levelTrace, format, v) }

// Fatalf logs at error level and never exits the process: the embedding program
// decides what a failed server means.
func (a *logAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	select {
	case a.fatal <- msg:
	default:
	}
	if a.logger != nil {
		a.logger.Error(msg, "component", "nats-server", "fatal", true)
	}
}
