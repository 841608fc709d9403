package weights

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// maxHeaderBytes bounds a safetensors JSON header (HF's own limit is 100 MB).
const maxHeaderBytes = 100 << 20

// stEntry is one tensor of a safetensors file; begin/end are absolute
// offsets into the file.
type stEntry struct {
	dtype      engine.DType
	shape      []int
	begin, end uint64
}

// safetensorsFile is a parsed safetensors file over its mapped bytes.
type safetensorsFile struct {
	path    string
	data    []byte
	entries map[string]stEntry
	meta    map[string]string
	m       *mapping
}

func openSafetensors(path string) (*safetensorsFile, error) {
	m, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	f, err := parseSafetensors(m.data)
	if err != nil {
		m.close()
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	f.path, f.m = path, m
	return f, nil
}

func (f *safetensorsFile) close() error {
	if f.m == nil {
		return nil
	}
	m := f.m
	f.m, f.data = nil, nil
	return m.close()
}

// parseSafetensors validates the header of a safetensors file held in b:
// every dtype is known, every shape matches its byte range, and ranges lie
// inside the data section without overlapping.
func parseSafetensors(b []byte) (*safetensorsFile, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: safetensors: file of %d bytes has no header", ErrFormat, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeaderBytes || n > uint64(len(b))-8 {
		return nil, fmt.Errorf("%w: safetensors: header length %d exceeds file (%d bytes) or limit", ErrFormat, n, len(b))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("%w: safetensors: header: %v", ErrFormat, err)
	}
	base := 8 + n
	dataLen := uint64(len(b)) - base
	f := &safetensorsFile{data: b, entries: make(map[string]stEntry, len(raw))}
	type span struct {
		b, e uint64
		name string
	}
	var spans []span
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &f.meta); err != nil {
				return nil, fmt.Errorf("%w: safetensors: __metadata__: %v", ErrFormat, err)
			}
			continue
		}
		var h struct {
			DType   string   `json:"dtype"`
			Shape   []int64  `json:"shape"`
			Offsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &h); err != nil {
			return nil, fmt.Errorf("%w: safetensors: tensor %q: %v", ErrFormat, name, err)
		}
		dt, err := engine.ParseDType(h.DType)
		if err != nil {
			return nil, fmt.Errorf("%w: safetensors: tensor %q: unsupported dtype %q", ErrFormat, name, h.DType)
		}
		if len(h.Offsets) != 2 || h.Offsets[0] > h.Offsets[1] || h.Offsets[1] > dataLen {
			return nil, fmt.Errorf("%w: safetensors: tensor %q: data_offsets %v outside data (%d bytes)", ErrFormat, name, h.Offsets, dataLen)
		}
		elems := uint64(1)
		shape := make([]int, len(h.Shape))
		for i, d := range h.Shape {
			if d < 0 || (d > 0 && elems > (1<<62)/uint64(d)) {
				return nil, fmt.Errorf("%w: safetensors: tensor %q: bad shape %v", ErrFormat, name, h.Shape)
			}
			elems *= uint64(d)
			shape[i] = int(d)
		}
		if want := elems * uint64(dt.Size()); h.Offsets[1]-h.Offsets[0] != want {
			return nil, fmt.Errorf("%w: safetensors: tensor %q: %d bytes for shape %v %s (want %d)", ErrFormat, name, h.Offsets[1]-h.Offsets[0], h.Shape, h.DType, want)
		}
		f.entries[name] = stEntry{dtype: dt, shape: shape, begin: base + h.Offsets[0], end: base + h.Offsets[1]}
		spans = append(spans, span{h.Offsets[0], h.Offsets[1], name})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].b < spans[j].b })
	for i := 1; i < len(spans); i++ {
		if spans[i].b < spans[i-1].e {
			return nil, fmt.Errorf("%w: safetensors: tensors %q and %q overlap", ErrFormat, spans[i-1].name, spans[i].name)
		}
	}
	return f, nil
}

func (f *safetensorsFile) tensor(name string) (engine.Tensor, bool) {
	e, ok := f.entries[name]
	if !ok || f.data == nil {
		return engine.Tensor{}, false
	}
	return engine.Tensor{Name: name, DType: e.dtype, Shape: append([]int(nil), e.shape...), Data: f.data[e.begin:e.end:e.end]}, true
}

// safetensorsName maps engine dtypes to the safetensors header names.
func safetensorsName(d engine.DType) (string, error) {
	switch d {
	case engine.F32:
		return "F32", nil
	case engine.F16:
		return "F16", nil
	case engine.BF16:
		return "BF16", nil
	case engine.I32:
		return "I32", nil
	case engine.U32:
		return "U32", nil
	case engine.U8:
		return "U8", nil
	}
	return "", fmt.Errorf("safetensors: no name for dtype %v", d)
}

// WriteSafetensors writes tensors (in the given order) as a safetensors
// file. The header lists tensors sorted by name (JSON object order), is
// padded with spaces to a multiple of 8 bytes, and carries meta as
// __metadata__ when non-empty. The output is deterministic.
func WriteSafetensors(w io.Writer, tensors []engine.Tensor, meta map[string]string) error {
	type entry struct {
		DType   string   `json:"dtype"`
		Shape   []int    `json:"shape"`
		Offsets []uint64 `json:"data_offsets"`
	}
	header := make(map[string]any, len(tensors)+1)
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	var off uint64
	for _, t := range tensors {
		name, err := safetensorsName(t.DType)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		if n*t.DType.Size() != len(t.Data) {
			return fmt.Errorf("tensor %q: %d bytes for shape %v %s", t.Name, len(t.Data), t.Shape, t.DType)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("tensor %q: duplicate name", t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = entry{name, shape, []uint64{off, off + uint64(len(t.Data))}}
		off += uint64(len(t.Data))
	}
	js, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	bw := bufio.NewWriter(w)
	var lenb [8]byte
	binary.LittleEndian.PutUint64(lenb[:], uint64(len(js)))
	bw.Write(lenb[:])
	bw.Write(js)
	for _, t := range tensors {
		bw.Write(t.Data)
	}
	return bw.Flush()
}

// WriteSafetensorsFile writes tensors to path (see WriteSafetensors).
func WriteSafetensorsFile(path string, tensors []engine.Tensor, meta map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteSafetensors(f, tensors, meta); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
