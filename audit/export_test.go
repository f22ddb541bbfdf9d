package audit

import "time"

// SetIndexLinger changes how long e's index entries wait for others; call it
// before e emits.
func SetIndexLinger(e *Emitter, d time.Duration) { e.groups.linger = d }
