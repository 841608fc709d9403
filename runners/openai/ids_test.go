package openai

import (
	"regexp"
	"testing"
)

func TestNewID(t *testing.T) {
	re := regexp.MustCompile(`^chatcmpl-[0-9a-f]{24}$`)
	a, b := NewID(nil, "chatcmpl-"), NewID(nil, "chatcmpl-")
	if !re.MatchString(a) || !re.MatchString(b) || a == b {
		t.Errorf("random ids %q %q", a, b)
	}
	if got := NewID(func(p string) string { return p + "x" }, "msg_"); got != "msg_x" {
		t.Errorf("injected id %q", got)
	}
	if LoggerOr(nil) == nil {
		t.Error("no default logger")
	}
}
