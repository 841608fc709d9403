package decode

import (
	"os"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// TestRenderKeepsToolHistoryWithoutTools: a chat request that offers no
// tools (none given, or tool_choice "none") but carries earlier calls and
// their results renders them through the model's format (SmolLM2: the
// Hermes convention), not through a template that drops the calls.
func TestRenderKeepsToolHistoryWithoutTools(t *testing.T) {
	src, err := os.ReadFile("../chat/testdata/smollm2_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Parse(string(src), "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	out, err := NewText(nil, tmpl).Render([]gen.Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []gen.ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "c1", Content: "18 C"},
	}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `<tool_call>`+"\n"+`{"name":"get_weather","arguments":{"city":"Paris"}}`) ||
		!strings.Contains(out, "<tool_response>\n18 C\n</tool_response>") {
		t.Fatalf("the calls or their result are lost:\n%s", out)
	}
}
