// Package watch owns noticing that the cluster file may have changed: it
// watches, with fsnotify, the DIRECTORY of the file and of every symlink on
// the way to its content (editors rename a new file over the old one; NixOS
// swaps the /etc/static symlink; some tools write in place), takes SIGHUP
// (or any other trigger) too, and debounces a burst of events into one call.
// It does not read or parse the file; it must not import other supervisor
// packages.
package watch

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Options tune Run.
type Options struct {
	Debounce time.Duration    // quiet time before calling back; default 200ms
	Trigger  <-chan os.Signal // e.g. SIGHUP; each signal counts as a change
	Logger   *slog.Logger
	Started  func() // called once the watches are in place
}

// point is a directory entry whose change may change the file's content.
type point struct{ dir, name string }

// points resolves path through its symlinks (in any component) and returns
// every directory entry on the way, ending with the file itself.
func points(path string) map[point]bool {
	out := map[point]bool{}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	resolve(abs, out, 0)
	return out
}

func resolve(path string, out map[point]bool, depth int) {
	path = filepath.Clean(path)
	out[point{filepath.Dir(path), filepath.Base(path)}] = true
	if depth > 32 {
		return
	}
	// Find the first component that is a symlink.
	prefix := string(filepath.Separator)
	rest := path[1:]
	for rest != "" {
		var comp string
		if i := indexSep(rest); i >= 0 {
			comp, rest = rest[:i], rest[i+1:]
		} else {
			comp, rest = rest, ""
		}
		p := filepath.Join(prefix, comp)
		fi, err := os.Lstat(p)
		if err != nil {
			return
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			out[point{filepath.Dir(p), filepath.Base(p)}] = true
			target, err := os.Readlink(p)
			if err != nil {
				return
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			resolve(filepath.Join(target, rest), out, depth+1)
			return
		}
		prefix = p
	}
}

func indexSep(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == filepath.Separator {
			return i
		}
	}
	return -1
}

// Run calls changed (from Run's goroutine) once per debounced burst of
// relevant filesystem events or triggers, until ctx ends. reason says what
// happened last ("write cluster.toml", "SIGHUP", …).
func Run(ctx context.Context, path string, o Options, changed func(reason string)) error {
	if o.Debounce == 0 {
		o.Debounce = 200 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	defer w.Close()
	var pts map[point]bool
	watched := map[string]bool{}
	rewatch := func() {
		pts = points(path)
		want := map[string]bool{}
		for p := range pts {
			want[p.dir] = true
		}
		for d := range want {
			if !watched[d] {
				if err := w.Add(d); err != nil {
					o.Logger.Warn("cannot watch directory", "dir", d, "err", err)
					continue
				}
				watched[d] = true
			}
		}
		for d := range watched {
			if !want[d] {
				_ = w.Remove(d)
				delete(watched, d)
			}
		}
	}
	rewatch()
	if len(watched) == 0 {
		return fmt.Errorf("watch %s: no directory could be watched", path)
	}
	if o.Started != nil {
		o.Started()
	}
	var timer <-chan time.Time
	reason := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if !pts[point{filepath.Dir(ev.Name), filepath.Base(ev.Name)}] || ev.Op == fsnotify.Chmod {
				continue
			}
			reason = ev.Op.String() + " " + ev.Name
			timer = time.After(o.Debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			o.Logger.Warn("file watch error", "err", err)
		case sig := <-o.Trigger:
			reason = sig.String()
			timer = time.After(o.Debounce)
		case <-timer:
			timer = nil
			rewatch() // a swapped symlink may point somewhere new
			changed(reason)
		}
	}
}
