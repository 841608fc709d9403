package chat

import (
	"encoding/json"
	"strings"
)

// ParsedCall is one tool call read from generated text: Arguments is JSON
// text (an object).
type ParsedCall struct {
	Name, Arguments string
}

// Markers of each family.
const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
	pythonTag   = "<|python_tag|>"
	mistralTag  = "[TOOL_CALLS]"
)

// ParseToolCalls splits a finished generation into its text and its tool
// calls as family f writes them. Text that looks like a call but does not
// parse as one stays text: nothing is dropped.
func ParseToolCalls(f Family, text string) (content string, calls []ParsedCall) {
	switch f {
	case Llama:
		return parseLlama(text)
	case Mistral:
		return parseMistral(text)
	}
	return parseHermes(text)
}

func parseHermes(text string) (string, []ParsedCall) {
	var content strings.Builder
	var calls []ParsedCall
	rest := text
	for {
		i := strings.Index(rest, hermesOpen)
		if i < 0 {
			content.WriteString(rest)
			break
		}
		body := rest[i+len(hermesOpen):]
		end := strings.Index(body, hermesClose)
		tail := ""
		if end >= 0 {
			tail = body[end+len(hermesClose):]
			body = body[:end]
		}
		c, ok := parseCallObject(body, "arguments")
		content.WriteString(rest[:i])
		if ok {
			calls = append(calls, c)
		} else { // not a call: it stays text
			content.WriteString(hermesOpen + body)
			if end >= 0 {
				content.WriteString(hermesClose)
			}
		}
		if end < 0 {
			break
		}
		rest = tail
	}
	return strings.TrimSpace(content.String()), calls
}

func parseLlama(text string) (string, []ParsedCall) {
	s := strings.TrimSpace(text)
	s = strings.TrimSpace(strings.TrimPrefix(s, pythonTag))
	if !strings.HasPrefix(s, "{") {
		return strings.TrimSpace(text), nil
	}
	var calls []ParsedCall
	// One call, or several separated by ";" (as Llama 3.2 sometimes does).
	for _, part := range splitTopLevel(s, ';') {
		c, ok := parseCallObject(part, "parameters")
		if !ok {
			return strings.TrimSpace(text), nil
		}
		calls = append(calls, c)
	}
	return "", calls
}

func parseMistral(text string) (string, []ParsedCall) {
	i := strings.Index(text, mistralTag)
	if i < 0 {
		return strings.TrimSpace(text), nil
	}
	body := strings.TrimSpace(text[i+len(mistralTag):])
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		return strings.TrimSpace(text), nil
	}
	var calls []ParsedCall
	for _, r := range raw {
		c, ok := parseCallObject(string(r), "arguments")
		if !ok {
			return strings.TrimSpace(text), nil
		}
		calls = append(calls, c)
	}
	return strings.TrimSpace(text[:i]), calls
}

// parseCallObject reads {"name": …, argsKey: …} (also accepting the other
// family's key, and arguments given as a JSON string holding an object).
func parseCallObject(s, argsKey string) (ParsedCall, bool) {
	var o map[string]json.RawMessage
	d := json.NewDecoder(strings.NewReader(strings.TrimSpace(s)))
	if err := d.Decode(&o); err != nil || d.More() {
		return ParsedCall{}, false
	}
	var name string
	if json.Unmarshal(o["name"], &name) != nil || name == "" {
		return ParsedCall{}, false
	}
	args, ok := o[argsKey]
	if !ok {
		for _, k := range []string{"arguments", "parameters"} {
			if a, found := o[k]; found {
				args, ok = a, true
				break
			}
		}
	}
	if !ok {
		return ParsedCall{Name: name, Arguments: "{}"}, true
	}
	var str string
	if json.Unmarshal(args, &str) == nil {
		args = json.RawMessage(strings.TrimSpace(str))
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(args, &obj) != nil || obj == nil {
		return ParsedCall{}, false
	}
	// The arguments text as the model wrote it (what streaming sends).
	return ParsedCall{Name: name, Arguments: string(args)}, true
}

// splitTopLevel splits s at sep outside JSON strings and brackets.
func splitTopLevel(s string, sep byte) []string {
	var parts []string
	depth, inStr, esc, start := 0, false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inStr:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		case c == sep && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if strings.TrimSpace(s[start:]) != "" || len(parts) == 0 {
		parts = append(parts, s[start:])
	}
	return parts
}
