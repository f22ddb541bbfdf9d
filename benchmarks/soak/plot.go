package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotSamples draws three panels against minutes since the load started:
// memory in MB; executions retained (envelopes, records) and each stream's
// subjects in thousands; the store on disk in MB. Dashed vertical lines mark
// when the record window and the envelope retention fill, and when the load
// ended.
func plotSamples(rows []row, streams []string, cfg config, path string) error {
	mem := newPanel(cfg.title(), "MB")
	for k, s := range []struct {
		name string
		y    func(row) float64
	}{
		{"server RSS", func(r row) float64 { return mb(r.serverRSS) }},
		{"server Go heap in use", func(r row) float64 { return mb(r.serverHeapInuse) }},
		{"server live heap (at the last GC)", func(r row) float64 { return mb(r.serverLive) }},
		{"worker RSS", func(r row) float64 { return mb(r.workerRSS) }},
		{"client RSS", func(r row) float64 { return mb(r.clientRSS) }},
	} {
		if err := addLine(mem, rows, k, s.name, s.y); err != nil {
			return err
		}
	}

	// Envelopes and records have one subject each: their curves are
	// also those streams' subjects, drawn apart only where they differ.
	idx := newPanel("", "thousands")
	k := 0
	for _, c := range []struct {
		name, suffix string
		n            func(row) uint64
	}{
		{"envelopes retained", "_ENVELOPES", func(r row) uint64 { return r.retained }},
		{"records retained", "_EXECUTIONS", func(r row) uint64 { return r.records }},
	} {
		stream := ""
		for _, name := range streams {
			if strings.HasSuffix(name, c.suffix) {
				stream = name
			}
		}
		same := true
		for _, r := range rows {
			same = same && r.streams[stream].NumSubjects == c.n(r)
		}
		label := c.name
		if same {
			label += " (= " + strings.TrimPrefix(stream, "KV_") + " subjects)"
		}
		if err := addLine(idx, rows, k, label, func(r row) float64 { return float64(c.n(r)) / 1000 }); err != nil {
			return err
		}
		k++
		if !same {
			if err := addSubjects(idx, rows, k, stream); err != nil {
				return err
			}
			k++
		}
	}
	for _, name := range streams {
		if strings.HasSuffix(name, "_ENVELOPES") || strings.HasSuffix(name, "_EXECUTIONS") {
			continue
		}
		var peak uint64
		for _, r := range rows {
			peak = max(peak, r.streams[name].NumSubjects)
		}
		if peak < 100 { // the catalog, the pools: a handful of keys
			continue
		}
		if err := addSubjects(idx, rows, k, name); err != nil {
			return err
		}
		k++
	}
	for _, name := range streams {
		if !strings.HasSuffix(name, "_EXECUTIONS") {
			continue
		}
		if err := addLine(idx, rows, k, strings.TrimPrefix(name, "KV_")+" interior deletes", func(r row) float64 {
			return float64(r.streams[name].NumDeleted) / 1000
		}); err != nil {
			return err
		}
		k++
	}

	disk := newPanel("", "MB")
	disk.X.Label.Text = "minutes since the load started"
	if err := addLine(disk, rows, 0, "store on disk", func(r row) float64 { return mb(r.storeBytes) }); err != nil {
		return err
	}
	k = 1
	for _, name := range streams {
		var peak uint64
		for _, r := range rows {
			peak = max(peak, r.streams[name].Bytes)
		}
		if peak < 1<<20 {
			continue
		}
		if err := addLine(disk, rows, k, strings.TrimPrefix(name, "KV_")+" bytes", func(r row) float64 {
			return mb(int64(r.streams[name].Bytes))
		}); err != nil {
			return err
		}
		k++
	}

	var loadEnd time.Duration
	for _, r := range rows {
		if r.phase == "load" {
			loadEnd = r.at
		}
	}
	end := rows[len(rows)-1].at
	for n, p := range []*plot.Plot{mem, idx, disk} {
		p.X.Tick.Marker = minuteTicks{}
		marks := []struct {
			at   time.Duration
			name string
		}{
			{cfg.records(), "record window full (" + short(cfg.records()) + ")"},
			{cfg.envelopes(), "envelope retention full (" + short(cfg.envelopes()) + ")"},
			{loadEnd, "load ended"},
		}
		for m, mk := range marks {
			if mk.at > end || mk.at <= 0 {
				continue
			}
			if err := addMark(p, mk.at, m, mk.name, n == 0); err != nil {
				return err
			}
		}
	}

	img := vgimg.New(20*vg.Centimeter, 30*vg.Centimeter)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 3, Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align([][]*plot.Plot{{mem}, {idx}, {disk}}, tiles, dc)
	mem.Draw(canvases[0][0])
	idx.Draw(canvases[1][0])
	disk.Draw(canvases[2][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func newPanel(title, unit string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	return p
}

// addSubjects draws the number of subjects a stream holds, in thousands.
func addSubjects(p *plot.Plot, rows []row, k int, stream string) error {
	return addLine(p, rows, k, strings.TrimPrefix(stream, "KV_")+" subjects", func(r row) float64 {
		return float64(r.streams[stream].NumSubjects) / 1000
	})
}

func addLine(p *plot.Plot, rows []row, k int, name string, y func(row) float64) error {
	xys := make(plotter.XYs, 0, len(rows))
	for _, r := range rows {
		if name == "client RSS" && r.clientRSS == 0 { // the client has exited
			continue
		}
		xys = append(xys, plotter.XY{X: r.at.Minutes(), Y: y(r)})
	}
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(k)
	l.Dashes = plotutil.Dashes(k / 7)
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// addMark draws a dashed vertical line at minute at across the panel's
// current range, in the legend of the first panel only.
func addMark(p *plot.Plot, at time.Duration, k int, name string, legend bool) error {
	l, err := plotter.NewLine(plotter.XYs{{X: at.Minutes(), Y: p.Y.Min}, {X: at.Minutes(), Y: p.Y.Max}})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	styles := []struct {
		c      color.Color
		dashes []vg.Length
	}{
		{color.RGBA{R: 40, G: 90, B: 200, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}},
		{color.RGBA{R: 200, G: 40, B: 40, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}},
		{color.Gray{Y: 90}, []vg.Length{vg.Points(2), vg.Points(2)}},
	}
	st := styles[k%len(styles)]
	l.Color, l.Dashes = st.c, st.dashes
	l.Width = vg.Points(1)
	p.Add(l)
	if legend {
		p.Legend.Add(name, l)
	}
	return nil
}

// minuteTicks labels whole minutes, every 1, 2, 5, 10, 15, 30 or 60 of
// them, whichever gives at most a dozen labels.
type minuteTicks struct{}

func (minuteTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 60.0
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60} {
		if (hi-lo)/s <= 12 {
			step = s
			break
		}
	}
	var ticks []plot.Tick
	for m := math.Ceil(lo/step) * step; m <= hi; m += step {
		ticks = append(ticks, plot.Tick{Value: m, Label: strconv.FormatFloat(m, 'f', -1, 64)})
	}
	return ticks
}
