package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress is a one-line bar redrawn in place every 100 ms. A nil *progress
// draws nothing.
type progress struct {
	w     io.Writer
	total int
	label string
	n     atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

// newProgress starts a bar on w; nil w: no bar.
func newProgress(w io.Writer, total int, label string) *progress {
	if w == nil {
		return nil
	}
	p := &progress{w: w, total: total, label: label, start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				p.draw()
				fmt.Fprintln(p.w)
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

func (p *progress) add(n int) {
	if p != nil {
		p.n.Add(int64(n))
	}
}

func (p *progress) draw() {
	const width = 30
	n := int(p.n.Load())
	filled := min(width, n*width/max(p.total, 1))
	rate := float64(n) / time.Since(p.start).Seconds()
	fmt.Fprintf(p.w, "\r%-9s [%s%s] %d/%d  %.0f/s ", p.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), n, p.total, rate)
}

func (p *progress) done() {
	if p != nil {
		close(p.stop)
		p.wg.Wait()
	}
}
