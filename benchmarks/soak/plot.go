package main

import (
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotSamples draws two panels against executions completed: memory and
// disk in MB, and each stream's subjects and the executions bucket's
// interior deletes in thousands.
func plotSamples(rows []row, streams []string, path, title string) error {
	mem := plot.New()
	mem.Title.Text = title
	mem.X.Label.Text = "executions completed (thousands)"
	mem.Y.Label.Text = "MB"
	mem.Legend.Top, mem.Legend.Left = true, true
	mem.Add(plotter.NewGrid())
	series := []struct {
		name string
		y    func(row) float64
	}{
		{"server RSS", func(r row) float64 { return mb(r.serverRSS) }},
		{"server Go heap in use", func(r row) float64 { return mb(r.serverHeapInuse) }},
		{"store on disk", func(r row) float64 { return mb(r.storeBytes) }},
		{"worker RSS", func(r row) float64 { return mb(r.workerRSS) }},
		{"client RSS", func(r row) float64 { return mb(r.clientRSS) }},
	}
	for k, s := range series {
		if err := addLine(mem, rows, k, s.name, s.y); err != nil {
			return err
		}
	}

	idx := plot.New()
	idx.X.Label.Text = "executions completed (thousands)"
	idx.Y.Label.Text = "thousands"
	idx.Legend.Top, idx.Legend.Left = true, true
	idx.Add(plotter.NewGrid())
	k := 0
	for _, name := range streams {
		var peak uint64
		for _, r := range rows {
			peak = max(peak, r.streams[name].NumSubjects)
		}
		if peak < 100 { // the catalog, the pools: a handful of keys
			continue
		}
		if err := addLine(idx, rows, k, strings.TrimPrefix(name, "KV_")+" subjects", func(r row) float64 {
			return float64(r.streams[name].NumSubjects) / 1000
		}); err != nil {
			return err
		}
		k++
		if strings.HasSuffix(name, "_EXECUTIONS") {
			if err := addLine(idx, rows, k, strings.TrimPrefix(name, "KV_")+" interior deletes", func(r row) float64 {
				return float64(r.streams[name].NumDeleted) / 1000
			}); err != nil {
				return err
			}
			k++
		}
	}

	img := vgimg.New(20*vg.Centimeter, 22*vg.Centimeter)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align([][]*plot.Plot{{mem}, {idx}}, tiles, dc)
	mem.Draw(canvases[0][0])
	idx.Draw(canvases[1][0])
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

func addLine(p *plot.Plot, rows []row, k int, name string, y func(row) float64) error {
	xys := make(plotter.XYs, 0, len(rows))
	for _, r := range rows {
		if name == "client RSS" && r.clientRSS == 0 { // the client has exited
			continue
		}
		xys = append(xys, plotter.XY{X: float64(r.executions) / 1000, Y: y(r)})
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
