package mlx

import (
	"errors"
	"sync"
	"syscall"
	"testing"
)

// Every function runs on the same OS thread, whichever goroutine calls,
// and a panic comes back to the caller.
func TestOSThread(t *testing.T) {
	th := startThread()
	defer th.stop()
	var tid int
	th.do(func() { tid = syscall.Gettid() })
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for range 20 {
				var got int
				th.do(func() { got = syscall.Gettid() })
				if got != tid {
					errs <- errors.New("work ran on another OS thread")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	func() {
		defer func() {
			if r := recover(); r != boom {
				t.Errorf("recovered %v, want the panic value of the work", r)
			}
		}()
		th.do(func() { panic(boom) })
	}()
	var got int
	th.do(func() { got = syscall.Gettid() })
	if got != tid {
		t.Error("thread changed after a panic")
	}
	// A panic in posted work skips the later posted work and comes back
	// from the next do, instead of running do's own function.
	ran := 0
	th.post(func() { ran++ })
	th.post(func() { panic(boom) })
	th.post(func() { ran += 10 })
	func() {
		defer func() {
			if r := recover(); r != boom {
				t.Errorf("do after a failed post: recovered %v, want boom", r)
			}
		}()
		th.do(func() { ran += 100 })
	}()
	th.do(func() {})
	if ran != 1 {
		t.Errorf("work after the failure ran: count %d, want 1", ran)
	}
	th.stop()
	func() {
		defer func() {
			if r := recover(); r != errThreadStopped {
				t.Errorf("do after stop: recovered %v, want errThreadStopped", r)
			}
		}()
		th.do(func() {})
	}()
}

func BenchmarkOSThreadRoundTrip(b *testing.B) {
	th := startThread()
	defer th.stop()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		th.do(func() { n++ })
	}
}
