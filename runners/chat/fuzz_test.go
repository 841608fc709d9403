package chat

import (
	"os"
	"testing"
)

// FuzzTemplate: any template source parses and renders to a result or an
// error, never a crash (templates come from downloaded model files).
func FuzzTemplate(f *testing.F) {
	for _, p := range []string{"testdata/features.jinja", "testdata/smollm2_chat_template.jinja"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add(`{{ messages[-1]['content'].split()|join(',') }}{{ raise_exception('x') if messages|length > 3 }}`)
	f.Add(`{% for m in messages[::-1] %}{{ m.content.replace('a', 'b') }}{% endfor %}{{ messages | tojson(indent=2) }}`)
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "Hi there"}, {Role: "assistant", Content: "<think>x</think>y"}}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := Parse(src, "<s>", "</s>")
		if err != nil {
			return
		}
		_, _ = tpl.Render(msgs, true)
		_, _ = tpl.Render(nil, false)
	})
}
