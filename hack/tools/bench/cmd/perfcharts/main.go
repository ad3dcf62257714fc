// Command perfcharts draws the PNG charts of docs/perf/ from a `make bench`
// results file (Go benchmark format), with the standard library's image
// packages and x/image's basic font: horizontal bars, one per measurement.
//
//	perfcharts bin/bench/latest.txt docs/perf
package main

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// result is one benchmark line: its name without the -N suffix, and its
// metrics by unit.
type result struct {
	name    string
	metrics map[string]float64
}

var procs = regexp.MustCompile(`-\d+$`)

func parse(path string) ([]result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []result
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		r := result{name: procs.ReplaceAllString(strings.TrimPrefix(fields[0], "Benchmark"), ""), metrics: map[string]float64{}}
		for i := 2; i+1 < len(fields); i += 2 {
			if v, err := strconv.ParseFloat(fields[i], 64); err == nil {
				r.metrics[fields[i+1]] = v
			}
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

type bar struct {
	label string
	value float64
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: perfcharts <results.txt> <out-dir>")
		os.Exit(2)
	}
	results, err := parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "perfcharts:", err)
		os.Exit(1)
	}
	charts := map[string]struct {
		title string
		unit  string
		log   bool
		bars  []bar
	}{}
	add := func(file, title, unit string, log bool, b bar) {
		c := charts[file]
		if title != "" {
			c.title = title
		}
		c.unit, c.log = unit, log
		c.bars = append(c.bars, b)
		charts[file] = c
	}
	for _, r := range results {
		switch {
		case strings.HasPrefix(r.name, "Failover/"):
			n := strings.TrimPrefix(r.name, "Failover/")
			add("failover.png", "Failover minus TTL (ms): holder stops renewing -> next holder has its token", "ms", false, bar{n + " p50", r.metrics["p50-over-ttl-ms"]})
			add("failover.png", "", "ms", false, bar{n + " p99", r.metrics["p99-over-ttl-ms"]})
		case strings.HasPrefix(r.name, "AdmissionWebhook/"):
			add("admission.png", "Webhook throughput (AdmissionReviews/s), straight to the webhook", "reviews/s", false,
				bar{strings.TrimPrefix(r.name, "AdmissionWebhook/"), r.metrics["reviews/s"]})
		case isIDBench(r.name) && r.metrics["ns/op"] > 0:
			add("ids.png", "IDs per second (log scale), one process, same run", "IDs/s", true, bar{r.name, 1e9 / r.metrics["ns/op"]})
		}
	}
	for file, c := range charts {
		if c.title == "" {
			c.title = file
		}
		if err := drawChart(filepath.Join(os.Args[2], file), c.title, c.unit, c.log, c.bars); err != nil {
			fmt.Fprintln(os.Stderr, "perfcharts:", err)
			os.Exit(1)
		}
		fmt.Printf("wrote %s (%d bars)\n", filepath.Join(os.Args[2], file), len(c.bars))
	}
}

func isIDBench(name string) bool {
	for _, p := range []string{"BlocksNext", "BlocksNextParallel", "SnowflakeNext", "AnchorEtcdTxnPerID", "AnchorSonyflake", "AnchorSonyflakeParallel", "AnchorUUIDv7", "AnchorUUIDv7Parallel"} {
		if name == p {
			return true
		}
	}
	return false
}

// drawChart draws horizontal bars from a zero line, negative to the left.
func drawChart(path, title, unit string, logScale bool, bars []bar) error {
	const labelW, barW, rowH, top, pad = 330, 520, 22, 40, 10
	width, height := labelW+barW+140, top+rowH*len(bars)+pad
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, pad, 20, title, color.Black)

	val := func(v float64) float64 {
		if logScale {
			return math.Log10(math.Max(v, 1))
		}
		return v
	}
	lo, hi := 0.0, 0.0
	for _, b := range bars {
		lo, hi = math.Min(lo, val(b.value)), math.Max(hi, val(b.value))
	}
	if hi == lo {
		hi = lo + 1
	}
	scale := float64(barW) / (hi - lo)
	zero := labelW + int(-lo*scale)
	blue := color.RGBA{0x3b, 0x6e, 0xb5, 0xff}
	red := color.RGBA{0xc0, 0x50, 0x40, 0xff}
	for i, b := range bars {
		y := top + i*rowH
		text(img, pad, y+14, b.label, color.Black)
		x0, x1, c := zero, zero+int(val(b.value)*scale), blue
		if x1 < x0 {
			x0, x1, c = x1, x0, red
		}
		draw.Draw(img, image.Rect(x0, y+4, max(x1, x0+1), y+rowH-4), image.NewUniform(c), image.Point{}, draw.Src)
		text(img, labelW+barW+pad, y+14, format(b.value)+" "+unit, color.Black)
	}
	draw.Draw(img, image.Rect(zero, top, zero+1, height-pad), image.NewUniform(color.Gray{0x60}), image.Point{}, draw.Src)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

func format(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func text(img draw.Image, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
