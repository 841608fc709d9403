package groupaddr

import "testing"

// TestAfter: MLX's group listens on the link's port + 1, on the link's
// host (IPv6 kept in brackets); a port with no next one is refused.
func TestAfter(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:8003", "127.0.0.1:8004"},
		{"[::1]:9", "[::1]:10"},
		{"[fd00::2]:52504", "[fd00::2]:52505"},
		{"h3:9", "h3:10"},
		{"host:65534", "host:65535"},
		{"host:65535", ""},
		{"host:0", ""},
		{"nohost", ""},
		{"h:x", ""},
	} {
		got, err := After(tc.in)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("After(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
