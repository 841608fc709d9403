package dashboard

import (
	"embed"
	"mime"
	"net/http"
	"path"
)

//go:embed static
var static embed.FS

// csp forbids every script but the page's own file (no inline script, no
// eval, nothing from elsewhere), and any connection but to this gateway.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func secureHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
}

func (d *Dashboard) serveIndex(w http.ResponseWriter, r *http.Request) {
	serveFile(w, r, "index.html")
}

func (d *Dashboard) serveStatic(w http.ResponseWriter, r *http.Request) {
	serveFile(w, r, r.PathValue("file"))
}

func serveFile(w http.ResponseWriter, r *http.Request, name string) {
	b, err := static.ReadFile("static/" + path.Clean(name))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	secureHeaders(w)
	w.Header().Set("Content-Type", mime.TypeByExtension(path.Ext(name)))
	_, _ = w.Write(b)
}
