package testmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode"
)

// marshal encodes v as JSON without HTML escaping, indented when indent.
func marshal(v any, indent bool) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		panic(err) // only maps of plain values are encoded here
	}
	out := b.Bytes()
	if !indent {
		out = bytes.TrimSuffix(out, []byte("\n"))
	}
	return out
}

// trainingText is the fixed text the test tokenizer's merges are learned
// from (written for this package).
const trainingText = `The morning train leaves the station at seven, and the people who ride it
every day know each other by their coats and their newspapers. On the first
platform a woman sells hot bread and coffee; on the second a man repairs
umbrellas when it rains and sharpens knives when it does not. Nobody remembers
when the clock above the ticket office last showed the right time.

In the kitchen the water is boiling. Put the rice in the pot, add a little
salt, and cover it. While it cooks, cut the onions, the carrots and the green
peppers into small pieces. Heat the oil in the pan, fry the onions until they
are golden, then add the other vegetables and stir them for five minutes.
When the rice is ready, mix everything together and serve it with lemon.

The river runs past the old mill, under three stone bridges and through the
market square, where children throw bread to the ducks. In summer the water is
low and warm; in winter it is fast and grey, and the fishermen stay at home.
The mill has not turned for a hundred years, but the wheel is still there,
green with moss, and the sound of the water against it never stops.

Numbers are written with digits: 1, 2, 3, 10, 42, 100, 2024, 3.14 and 0.5.
Questions end with a question mark? Answers often end with a full stop.
Lists use commas, colons: and semicolons; quotes use "double" or 'single'
marks, and code uses brackets (like this), [like that] and {like those}.

She said that the weather would change in the afternoon, and it did: the wind
turned to the north, the sky became dark, and the first drops of rain fell on
the roofs of the houses at the edge of the town. The shopkeepers brought their
tables inside, the cats ran under the carts, and the bells of the church began
to ring for the evening, as they have rung every evening for three hundred
years. Later the clouds opened again, the stars came out one by one, and the
town was quiet until the morning train came back with its first passengers.
Caf` + "\u00e9" + ` na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe: a few accented words, so that some merges join multi-byte characters.
`

// byteToRune is GPT-2's byte-to-unicode map used by byte-level BPE:
// printable Latin-1 bytes map to themselves, the rest to U+0100 onwards.
func byteToRune() [256]rune {
	var m [256]rune
	used := [256]bool{}
	for b := '!'; b <= '~'; b++ {
		m[b], used[b] = b, true
	}
	for b := '\u00a1'; b <= '\u00ac'; b++ {
		m[b], used[b] = b, true
	}
	for b := '\u00ae'; b <= '\u00ff'; b++ {
		m[b], used[b] = b, true
	}
	n := rune(0)
	for b := 0; b < 256; b++ {
		if !used[b] {
			m[b] = 256 + n
			n++
		}
	}
	return m
}

// pretokenize splits text roughly as GPT-2's pattern does: contractions,
// an optional space followed by letters, digits or other symbols, and runs
// of whitespace.
func pretokenize(text string) []string {
	var out []string
	rs := []rune(text)
	class := func(r rune) int {
		switch {
		case unicode.IsLetter(r):
			return 1
		case unicode.IsNumber(r):
			return 2
		case unicode.IsSpace(r):
			return 3
		}
		return 4
	}
	for i := 0; i < len(rs); {
		if n := contraction(rs[i:]); n > 0 {
			out = append(out, string(rs[i:i+n]))
			i += n
			continue
		}
		j := i
		if rs[j] == ' ' && j+1 < len(rs) && class(rs[j+1]) != 3 {
			j++
		}
		c := class(rs[j])
		k := j + 1
		for k < len(rs) && class(rs[k]) == c {
			k++
		}
		out = append(out, string(rs[i:k]))
		i = k
	}
	return out
}

// contraction returns the length of an English contraction ('s, 't, 're,
// 've, 'm, 'll, 'd) at the start of rs, or 0.
func contraction(rs []rune) int {
	if len(rs) < 2 || rs[0] != '\'' {
		return 0
	}
	for _, c := range []string{"re", "ve", "ll", "s", "t", "m", "d"} {
		if len(rs) > len(c) && string(rs[1:1+len(c)]) == c {
			return 1 + len(c)
		}
	}
	return 0
}

// learnMerges learns n BPE merges over the byte-level pre-tokenized
// training text. Token ids 0..255 are the bytes; merge m makes id 256+m.
// The most frequent pair wins; ties go to the smaller (left id, right id).
func learnMerges(n int) (vocab []string, merges [][2]int, err error) {
	b2r := byteToRune()
	vocab = make([]string, 256, 256+n)
	for b := 0; b < 256; b++ {
		vocab[b] = string(b2r[b])
	}
	counts := map[string]int{}
	var order []string
	for _, w := range pretokenize(trainingText) {
		if counts[w] == 0 {
			order = append(order, w)
		}
		counts[w]++
	}
	words := make([][]int, len(order))
	freq := make([]int, len(order))
	for i, w := range order {
		for _, b := range []byte(w) {
			words[i] = append(words[i], int(b))
		}
		freq[i] = counts[w]
	}
	for m := 0; m < n; m++ {
		pairs := map[[2]int]int{}
		for i, w := range words {
			for k := 0; k+1 < len(w); k++ {
				pairs[[2]int{w[k], w[k+1]}] += freq[i]
			}
		}
		best, bestN := [2]int{}, 0
		for p, c := range pairs {
			if c > bestN || (c == bestN && (p[0] < best[0] || (p[0] == best[0] && p[1] < best[1]))) {
				best, bestN = p, c
			}
		}
		if bestN == 0 {
			return nil, nil, fmt.Errorf("testmodel: training text yields only %d merges, %d wanted", m, n)
		}
		id := len(vocab)
		vocab = append(vocab, vocab[best[0]]+vocab[best[1]])
		merges = append(merges, best)
		for i, w := range words {
			out := w[:0]
			for k := 0; k < len(w); k++ {
				if k+1 < len(w) && w[k] == best[0] && w[k+1] == best[1] {
					out = append(out, id)
					k++
					continue
				}
				out = append(out, w[k])
			}
			words[i] = out
		}
	}
	return vocab, merges, nil
}

// TokenizerJSON returns an HF tokenizer.json for a byte-level BPE with
// vocabSize tokens: 256 byte tokens, vocabSize-259 learned merges, and the
// AddedTokens at the last three ids.
func TokenizerJSON(vocabSize int) ([]byte, error) {
	nMerges := vocabSize - 256 - len(AddedTokens)
	if nMerges < 0 {
		return nil, fmt.Errorf("testmodel: vocab %d too small", vocabSize)
	}
	vocab, merges, err := learnMerges(nMerges)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, v := range vocab {
		if seen[v] {
			return nil, fmt.Errorf("testmodel: duplicate token %q", v)
		}
		seen[v] = true
	}
	js := func(v any) string { return string(marshal(v, false)) }
	var w bytes.Buffer
	w.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [")
	for i, t := range AddedTokens {
		if i > 0 {
			w.WriteString(",")
		}
		fmt.Fprintf(&w, "\n    {\"id\": %d, \"content\": %s, \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}", len(vocab)+i, js(t))
	}
	w.WriteString("\n  ],\n  \"normalizer\": null,\n")
	w.WriteString("  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},\n")
	w.WriteString("  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true},\n")
	w.WriteString("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n")
	w.WriteString("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {")
	for id, t := range vocab {
		if id > 0 {
			w.WriteString(",")
		}
		fmt.Fprintf(&w, "\n      %s: %d", js(t), id)
	}
	w.WriteString("\n    },\n    \"merges\": [")
	for i, m := range merges {
		if i > 0 {
			w.WriteString(",")
		}
		fmt.Fprintf(&w, "\n      %s", js(vocab[m[0]]+" "+vocab[m[1]]))
	}
	w.WriteString("\n    ]\n  }\n}\n")
	return w.Bytes(), nil
}
