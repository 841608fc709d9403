package bounded

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCall: a call that returns gives its value and error; one that never
// returns ends at the bound (ErrTimeout, naming the bound) or when the
// context ends (its cause), and is left behind.
func TestCall(t *testing.T) {
	boom := errors.New("boom")
	v, err := Call(context.Background(), time.Hour, func() (int, error) { return 7, boom })
	if v != 7 || err != boom {
		t.Fatalf("a returning call: %d, %v; want 7, boom", v, err)
	}
	never := make(chan struct{})
	defer close(never) // the calls left behind return at the end
	block := func() (int, error) { <-never; return 1, nil }

	v, err = Call(context.Background(), time.Millisecond, block)
	if v != 0 || !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "1ms") {
		t.Fatalf("past the bound: %d, %v; want 0 and ErrTimeout naming 1ms", v, err)
	}

	lost := errors.New("a peer's link dropped")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(lost)
	v, err = Call(ctx, time.Hour, block)
	if v != 0 || err != lost {
		t.Fatalf("a cancelled context: %d, %v; want 0 and its cause", v, err)
	}
	ctx, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err = Call(ctx, time.Hour, block); !errors.Is(err, context.Canceled) {
		t.Fatalf("a context cancelled without a cause: %v, want context.Canceled", err)
	}
}
