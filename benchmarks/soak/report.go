package main

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The CSV's fixed columns; each stream then has four: NAME_msgs,
// NAME_bytes, NAME_subjects, NAME_deleted.
var csvHead = []string{"seconds", "phase", "windows_full", "load1", "executions", "retained_envelopes", "records", "submitted",
	"server_rss_bytes", "server_heap_inuse_bytes", "server_heap_alloc_bytes", "server_live_heap_bytes", "server_sys_bytes",
	"worker_rss_bytes", "client_rss_bytes", "store_bytes"}

var streamColumns = []string{"_msgs", "_bytes", "_subjects", "_deleted"}

func (s *sampler) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	head := slices.Clone(csvHead)
	for _, name := range s.streams {
		for _, c := range streamColumns {
			head = append(head, name+c)
		}
	}
	_ = w.Write(head)
	for _, r := range s.rows {
		rec := []string{strconv.FormatFloat(r.at.Seconds(), 'f', 1, 64), r.phase, s.cfg.windows(r.at),
			strconv.FormatFloat(r.load1, 'f', 2, 64), u(r.executions), u(r.retained), u(r.records), u(r.submitted),
			i(r.serverRSS), i(r.serverHeapInuse), i(r.serverHeapAlloc), i(r.serverLive), i(r.serverSys),
			i(r.workerRSS), i(r.clientRSS), i(r.storeBytes)}
		for _, name := range s.streams {
			st := r.streams[name]
			rec = append(rec, u(st.Msgs), u(st.Bytes), u(st.NumSubjects), strconv.Itoa(st.NumDeleted))
		}
		_ = w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }
func i(v int64) string  { return strconv.FormatInt(v, 10) }

// replotDir reads cfg.out/soak.csv and writes the plot and the summary
// again.
func replotDir(cfg config) error {
	f, err := os.Open(filepath.Join(cfg.out, "soak.csv"))
	if err != nil {
		return err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return err
	}
	if len(recs) < 2 {
		return fmt.Errorf("%s: no samples", f.Name())
	}
	col := map[string]int{}
	for k, name := range recs[0] {
		col[name] = k
	}
	for _, name := range csvHead {
		if _, ok := col[name]; !ok {
			return fmt.Errorf("%s: no column %s", f.Name(), name)
		}
	}
	s := &sampler{cfg: cfg}
	for _, name := range recs[0][len(csvHead):] {
		if stream, ok := strings.CutSuffix(name, "_msgs"); ok {
			s.streams = append(s.streams, stream)
		}
	}
	for _, rec := range recs[1:] {
		num := func(name string) int64 { v, _ := strconv.ParseInt(rec[col[name]], 10, 64); return v }
		unum := func(name string) uint64 { v, _ := strconv.ParseUint(rec[col[name]], 10, 64); return v }
		secs, _ := strconv.ParseFloat(rec[col["seconds"]], 64)
		l1, _ := strconv.ParseFloat(rec[col["load1"]], 64)
		r := row{at: time.Duration(secs * float64(time.Second)), phase: rec[col["phase"]], load1: l1,
			serverRSS: num("server_rss_bytes"), serverHeapInuse: num("server_heap_inuse_bytes"),
			serverHeapAlloc: num("server_heap_alloc_bytes"), serverLive: num("server_live_heap_bytes"),
			serverSys: num("server_sys_bytes"), workerRSS: num("worker_rss_bytes"), clientRSS: num("client_rss_bytes"),
			storeBytes: num("store_bytes"), streams: map[string]jetstream.StreamState{}}
		for _, name := range s.streams {
			r.streams[name] = jetstream.StreamState{Msgs: unum(name + "_msgs"), Bytes: unum(name + "_bytes"),
				NumSubjects: unum(name + "_subjects"), NumDeleted: int(num(name + "_deleted"))}
		}
		r.fill()
		r.executions, r.submitted = unum("executions"), unum("submitted") // LastSeq is not in the columns
		s.rows = append(s.rows, r)
	}
	l := "unknown (replotted)"
	if n := len(s.rows); n > 0 {
		l = fmt.Sprintf("%.2f (1 min, the last sample)", s.rows[n-1].load1)
	}
	return s.report(l)
}

// fit is a least-squares line y = a + b·x.
func fit(rows []row, x, y func(row) float64) (b float64) {
	var sx, sy, sxx, sxy float64
	for _, r := range rows {
		xv, yv := x(r), y(r)
		sx, sy, sxx, sxy = sx+xv, sy+yv, sxx+xv*xv, sxy+xv*yv
	}
	k := float64(len(rows))
	den := k*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (k*sxy - sx*sy) / den
}

// span is the least and greatest of y over rows.
func span(rows []row, y func(row) int64) (lo, hi int64) {
	lo, hi = math.MaxInt64, math.MinInt64
	for _, r := range rows {
		lo, hi = min(lo, y(r)), max(hi, y(r))
	}
	return lo, hi
}

type series struct {
	name string
	y    func(row) int64
}

var serverSeries = []series{
	{"server RSS", func(r row) int64 { return r.serverRSS }},
	{"server heap in use", func(r row) int64 { return r.serverHeapInuse }},
	{"server live heap", func(r row) int64 { return r.serverLive }},
}

// summary states the server's memory per retained execution while the
// envelope retention fills (past the record and duplicate windows, whose
// contents are then steady), its range once every window is full, and the
// store's bytes per execution.
func (s *sampler) summary(load string) string {
	var loadRows []row
	for _, r := range s.rows {
		if r.phase == "load" && r.executions > 0 {
			loadRows = append(loadRows, r)
		}
	}
	var b strings.Builder
	cfg := s.cfg
	fmt.Fprintf(&b, "%s; server GOGC %d\n", cfg.title(), cfg.gogc)
	fmt.Fprintf(&b, "load average at the end %s", load)
	if len(s.rows) > 0 {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range s.rows {
			lo, hi = math.Min(lo, r.load1), math.Max(hi, r.load1)
		}
		fmt.Fprintf(&b, "; over the run (1 min) %.1f–%.1f", lo, hi)
	}
	b.WriteString("\n")
	if len(loadRows) < 4 {
		fmt.Fprintf(&b, "too few samples under load (%d) for slopes\n", len(loadRows))
		return b.String()
	}
	last := loadRows[len(loadRows)-1]
	fmt.Fprintf(&b, "executions finished: %d in %v (%.0f/s); retained at the end of the load: %d envelopes, %d records\n",
		last.executions, last.at.Round(time.Second), float64(last.executions)/last.at.Seconds(), last.retained, last.records)

	// Filling: past the record and duplicate windows (and a sample's
	// lag), until the sample before the envelope retention is full.
	from := max(cfg.records(), dedupWindow) + cfg.interval
	var filling []row
	for _, r := range loadRows {
		if r.at >= from && r.at < cfg.envelopes() {
			filling = append(filling, r)
		}
	}
	retained := func(r row) float64 { return float64(r.retained) }
	if len(filling) >= 4 {
		f, l := filling[0], filling[len(filling)-1]
		fmt.Fprintf(&b, "while the envelope retention fills (%v to %v: %d to %d envelopes retained, records %d to %d), per retained execution (least squares):\n",
			f.at.Round(time.Second), l.at.Round(time.Second), f.retained, l.retained, f.records, l.records)
		for _, sr := range serverSeries {
			fmt.Fprintf(&b, "  %-20s %6.0f bytes   (%.0f MB to %.0f MB)\n", sr.name,
				fit(filling, retained, func(r row) float64 { return float64(sr.y(r)) }), mb(sr.y(f)), mb(sr.y(l)))
		}
	} else {
		fmt.Fprintf(&b, "the envelope retention (%v) leaves too few samples past the record and duplicate windows (from %v) for a slope\n",
			cfg.envelopes(), from)
	}

	// Plateau: every window full (one sample's lag).
	var plateau []row
	for _, r := range loadRows {
		if r.at >= max(cfg.envelopes(), cfg.records(), dedupWindow)+cfg.interval {
			plateau = append(plateau, r)
		}
	}
	executions := func(r row) float64 { return float64(r.executions) }
	if len(plateau) >= 4 {
		f, l := plateau[0], plateau[len(plateau)-1]
		rlo, rhi := span(plateau, func(r row) int64 { return int64(r.retained) })
		clo, chi := span(plateau, func(r row) int64 { return int64(r.records) })
		fmt.Fprintf(&b, "once every window is full (%v to %v, %d samples: executions %d to %d; retained %d–%d envelopes, %d–%d records):\n",
			f.at.Round(time.Second), l.at.Round(time.Second), len(plateau), f.executions, l.executions, rlo, rhi, clo, chi)
		for _, sr := range append(serverSeries,
			series{"worker RSS", func(r row) int64 { return r.workerRSS }},
			series{"client RSS", func(r row) int64 { return r.clientRSS }}) {
			lo, hi := span(plateau, sr.y)
			fmt.Fprintf(&b, "  %-20s min %6.1f MB  max %6.1f MB  first %6.1f  last %6.1f  slope %+6.1f bytes per execution finished\n",
				sr.name, mb(lo), mb(hi), mb(sr.y(f)), mb(sr.y(l)), fit(plateau, executions, func(r row) float64 { return float64(sr.y(r)) }))
		}
		lo, hi := span(plateau, func(r row) int64 { return r.serverRSS })
		fmt.Fprintf(&b, "  server RSS per retained execution: %.0f–%.0f bytes (all of the server's RSS over the envelopes retained)\n",
			float64(lo)/float64(rhi), float64(hi)/float64(max(rlo, 1)))
	} else {
		fmt.Fprintf(&b, "the windows do not fill within the load (envelopes %v, records %v): no plateau; growth per execution over the load's second half:\n",
			cfg.envelopes(), cfg.records())
		half := loadRows[len(loadRows)/2:]
		for _, sr := range serverSeries {
			fmt.Fprintf(&b, "  %-20s %6.0f bytes   (at the end %.0f MB)\n", sr.name,
				fit(half, executions, func(r row) float64 { return float64(sr.y(r)) }), mb(sr.y(last)))
		}
	}

	// Disk.
	fmt.Fprintf(&b, "store on disk: %.0f MB at the end of the load; %.0f bytes per execution finished (least squares over the load)\n",
		mb(last.storeBytes), fit(loadRows, executions, func(r row) float64 { return float64(r.storeBytes) }))
	fmt.Fprintf(&b, "per stream at the end of the load (bytes per message kept, per execution finished; messages, subjects, interior deletes):\n")
	for _, name := range s.streams {
		st := last.streams[name]
		if st.Msgs == 0 && st.NumDeleted == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %-28s %6.0f B/msg %7.1f B/execution   %9d msgs %9d subjects %9d deletes %8.1f MB\n",
			name, float64(st.Bytes)/float64(max(st.Msgs, 1)), float64(st.Bytes)/float64(last.executions),
			st.Msgs, st.NumSubjects, st.NumDeleted, mb(int64(st.Bytes)))
	}
	b.WriteString(heapSplits(s.cfg.out))
	if idle := s.rows[len(s.rows)-1]; idle.phase == "idle" {
		fmt.Fprintf(&b, "after %v idle: server RSS %.0f MB, heap %.0f MB in use, %.0f MB live; %d envelopes, %d records retained; store %.0f MB\n",
			(idle.at - last.at).Round(time.Second), mb(idle.serverRSS), mb(idle.serverHeapInuse), mb(idle.serverLive),
			idle.retained, idle.records, mb(idle.storeBytes))
	}
	return b.String()
}
