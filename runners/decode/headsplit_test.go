package decode_test

import (
	"reflect"
	"testing"

	"github.com/exo-pd/exo-pd/runners/decode"
)

// TestParsePrefillHeads: ADDR#H0:H1 (or ADDR#I/N) entries name the ranks
// of a tensor-parallel prefill group (replicas share a range, parts sorted
// by head); mixing kinds or forms, groups of different sizes, overlapping
// or malformed ranges are refused.
func TestParsePrefillHeads(t *testing.T) {
	addrs, parts, err := decode.ParsePrefillEndpoints([]string{"b:2#2:4", "a:1#0:2", "c:3#2:4"})
	if err != nil {
		t.Fatal(err)
	}
	want := []decode.PrefillPart{{Start: 0, End: 2, Endpoints: []string{"a:1"}, Heads: true}, {Start: 2, End: 4, Endpoints: []string{"b:2", "c:3"}, Heads: true}}
	if !reflect.DeepEqual(parts, want) || !reflect.DeepEqual(addrs, []string{"b:2", "a:1", "c:3"}) {
		t.Fatalf("parts %+v addrs %v", parts, addrs)
	}
	_, parts, err = decode.ParsePrefillEndpoints([]string{"a:1#0/2", "b:2#1/2"})
	want = []decode.PrefillPart{{Start: 0, End: 1, Endpoints: []string{"a:1"}, Heads: true, Ranks: 2}, {Start: 1, End: 2, Endpoints: []string{"b:2"}, Heads: true, Ranks: 2}}
	if err != nil || !reflect.DeepEqual(parts, want) {
		t.Fatalf("ranks: %+v %v", parts, err)
	}
	for _, l := range [][]string{{"a:1#0/2", "b:2#1/3"}, {"a:1#0/2", "b:2#1:2"}, {"a:1#2/2"}, {"a:1#0/2", "b:2#0/2", "c:3#0:1"},
		{"a:1#0:2", "b:2@2:4"}, {"a:1#0:2", "b:2"}, {"a:1", "b:2#0:1"}, {"a:1#0:2", "b:2#1:3"},
		{"a:1#2:2"}, {"a:1#-1:2"}, {"a:1#x"}, {"#0:1"}} {
		if _, _, err := decode.ParsePrefillEndpoints(l); err == nil {
			t.Errorf("%q parsed", l)
		}
	}
}
