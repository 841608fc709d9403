//go:build cgo && (linux || darwin)

package mlx

// MLX's distributed collectives through mlx-c v0.6.0's API (mlx/c/distributed.h
// and distributed_group.h of that tag). As for the ops in capi.go, the
// declarations below are our own: the group is a handle struct holding one
// pointer, every op writes a new array handle and returns 0 on success.
// The symbols are looked up in the libmlxc the backend loaded (dlopen with
// RTLD_NOLOAD, so it is the same copy); each is optional, and a call whose
// symbol is missing fails with an error naming it.

/*
#cgo linux LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "capi.h"

typedef struct { void* ctx; } xmx_group;

static struct {
	int loaded;
	xmx_group (*init)(bool, const char*);
	bool (*is_available)(const char*);
	int (*group_rank)(xmx_group);
	int (*group_size)(xmx_group);
	int (*all_sum)(xmx_array*, xmx_array, xmx_group, xmx_stream);
	int (*all_gather)(xmx_array*, xmx_array, xmx_group, xmx_stream);
	int (*send)(xmx_array*, xmx_array, int, xmx_group, xmx_stream);
	int (*recv)(xmx_array*, const int*, size_t, int, int, xmx_group, xmx_stream);
	int (*recv_like)(xmx_array*, xmx_array, int, xmx_group, xmx_stream);
} XD;

// xmd_load finds the distributed functions in the already loaded libmlxc
// at path. 0: done (missing symbols stay NULL); 1: the library is not
// loaded in this process (err says why).
static int xmd_load(const char* path, char* err, size_t errlen) {
	if (XD.loaded) return 0;
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
	if (h == NULL) {
		const char* e = dlerror();
		snprintf(err, errlen, "%s: %s", path, e ? e : "not loaded");
		return 1;
	}
	*(void**)(&XD.init) = dlsym(h, "mlx_distributed_init");
	*(void**)(&XD.is_available) = dlsym(h, "mlx_distributed_is_available");
	*(void**)(&XD.group_rank) = dlsym(h, "mlx_distributed_group_rank");
	*(void**)(&XD.group_size) = dlsym(h, "mlx_distributed_group_size");
	*(void**)(&XD.all_sum) = dlsym(h, "mlx_distributed_all_sum");
	*(void**)(&XD.all_gather) = dlsym(h, "mlx_distributed_all_gather");
	*(void**)(&XD.send) = dlsym(h, "mlx_distributed_send");
	*(void**)(&XD.recv) = dlsym(h, "mlx_distributed_recv");
	*(void**)(&XD.recv_like) = dlsym(h, "mlx_distributed_recv_like");
	XD.loaded = 1;
	// The reference dlopen took is dropped: the backend's own keeps the
	// library loaded for the life of the process.
	dlclose(h);
	return 0;
}

// xmd_missing names the first of the functions a Collective needs for
// every call (init, rank, size) that this libmlxc lacks, or NULL.
static const char* xmd_missing_core(void) {
	if (XD.init == NULL) return "mlx_distributed_init";
	if (XD.group_rank == NULL) return "mlx_distributed_group_rank";
	if (XD.group_size == NULL) return "mlx_distributed_group_size";
	return NULL;
}

static int xmd_has(int which) {
	switch (which) {
	case 0: return XD.is_available != NULL;
	case 1: return XD.all_sum != NULL;
	case 2: return XD.all_gather != NULL;
	case 3: return XD.send != NULL;
	case 4: return XD.recv != NULL;
	case 5: return XD.recv_like != NULL;
	}
	return 0;
}

static int xmd_init(xmx_group* g, bool strict, const char* bk) {
	*g = XD.init(strict, bk);
	return g->ctx == NULL;
}
static bool xmd_is_available(const char* bk) { return XD.is_available(bk); }
static int xmd_rank(xmx_group g) { return XD.group_rank(g); }
static int xmd_size(xmx_group g) { return XD.group_size(g); }
static int xmd_all_sum(xmx_array* r, xmx_array x, xmx_group g, xmx_stream s) { return XD.all_sum(r, x, g, s); }
static int xmd_all_gather(xmx_array* r, xmx_array x, xmx_group g, xmx_stream s) { return XD.all_gather(r, x, g, s); }
static int xmd_send(xmx_array* r, xmx_array x, int dst, xmx_group g, xmx_stream s) { return XD.send(r, x, dst, g, s); }
static int xmd_recv(xmx_array* r, const int* shape, size_t n, int dtype, int src, xmx_group g, xmx_stream s) {
	return XD.recv(r, shape, n, dtype, src, g, s);
}
static int xmd_recv_like(xmx_array* r, xmx_array x, int src, xmx_group g, xmx_stream s) { return XD.recv_like(r, x, src, g, s); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// distLoad guards the one-time lookup of the distributed symbols (the
// table lives in C, beside the library it points into).
var distLoad sync.Mutex

// distFn numbers the optional functions for xmd_has, and names them.
type distFn int

const (
	fnIsAvailable distFn = iota
	fnAllSum
	fnAllGather
	fnSend
	fnRecv
	fnRecvLike
)

var distFnNames = [...]string{
	fnIsAvailable: "mlx_distributed_is_available",
	fnAllSum:      "mlx_distributed_all_sum",
	fnAllGather:   "mlx_distributed_all_gather",
	fnSend:        "mlx_distributed_send",
	fnRecv:        "mlx_distributed_recv",
	fnRecvLike:    "mlx_distributed_recv_like",
}

// loadDistributed looks the distributed functions up in b's libmlxc.
func loadDistributed(b *backend) error {
	distLoad.Lock()
	defer distLoad.Unlock()
	cpath := C.CString(b.lib)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	if C.xmd_load(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: mlx distributed: %s", ErrUnavailable, C.GoString(&buf[0]))
	}
	return nil
}

func distHas(f distFn) error {
	if C.xmd_has(C.int(f)) == 0 {
		return fmt.Errorf("%w: this libmlxc has no %s (mlx-c v0.6.0 or later has it)", ErrDistributed, distFnNames[f])
	}
	return nil
}

// ErrDistributed means an MLX distributed group could not be joined or a
// collective is missing from the loaded libmlxc.
var ErrDistributed = errors.New("mlx: distributed")

// GroupOptions says which MLX distributed backend to join.
type GroupOptions struct {
	// Backend is MLX's name for it: "ring" (TCP; every CPU build has it;
	// MLX_RANK and MLX_HOSTFILE), "jaccl" (RDMA over Thunderbolt 5 on
	// macOS), "nccl" (CUDA), "mpi", or "" / "any" for the first that
	// initializes.
	Backend string
	// Strict fails when the backend cannot be initialized; otherwise MLX
	// returns a group of one (this process alone).
	Strict bool
	// StallAfter, when positive, starts a watchdog: an evaluation on the
	// backend that has run StallAfter without returning calls OnStall
	// (once per evaluation, on the watchdog's goroutine, with how long it
	// has run). MLX's ring backend does not fail a collective whose peer
	// process has died: it waits forever (TestDistributedPeerLost), so
	// the evaluation, and the runner's step, never return. A runner that
	// cannot go on then ends its process and the supervisor restarts the
	// group. Choose StallAfter well above the longest legitimate step
	// (a prefill chunk on this hardware).
	StallAfter time.Duration
	// OnStall is required with StallAfter.
	OnStall func(running time.Duration)
}

// Collective is this process's rank in an MLX distributed group, with the
// collectives on one backend's arrays. Its ops are lazy like the backend's:
// they return at once and run, on the backend's MLX thread, when their
// result is evaluated (Eval, Bytes, Float32); a collective blocks there
// until every rank of the group has reached it.
//
// mlx-c v0.6.0 has no function that frees a group: a process joins one
// group per MLX backend for its life (Close only stops the stall
// watchdog).
type Collective struct {
	b *backend
	g C.xmx_group
	// stream is where the collectives run: the backend's, or on a GPU
	// backend (ring, jaccl, mpi) a CPU stream made for the group and kept
	// for the life of the process, as the group is.
	stream  C.xmx_stream
	backend string
	rank    int
	size    int
	// stop ends the watchdog (nil without one).
	stop     chan struct{}
	stopOnce sync.Once
}

// JoinGroup initializes MLX's distributed backend (mlx_distributed_init)
// for the process and returns its rank on the MLX backend eb made by New.
// The ring backend reads MLX_RANK and MLX_HOSTFILE (a JSON list, one
// element per rank, of "ip:port" lists) from the environment, and blocks
// until its neighbours have connected.
//
// On a GPU backend the collectives of ring, jaccl and mpi run on a CPU
// stream (MLX implements them only there); nccl runs on the GPU's. "any"
// is taken as a CPU backend: on CUDA name "nccl". (Only the CPU device is
// tested here: on a GPU backend this path is unverified.)
func JoinGroup(eb engine.Backend, opts GroupOptions) (*Collective, error) {
	b, ok := eb.(*backend)
	if !ok || b == nil {
		return nil, fmt.Errorf("%w: JoinGroup needs a backend made by mlx.New, got %T", ErrDistributed, eb)
	}
	if err := loadDistributed(b); err != nil {
		return nil, err
	}
	if name := C.xmd_missing_core(); name != nil {
		return nil, fmt.Errorf("%w: this libmlxc has no %s", ErrDistributed, C.GoString(name))
	}
	if opts.StallAfter < 0 || (opts.StallAfter > 0 && opts.OnStall == nil) {
		return nil, fmt.Errorf("%w: GroupOptions.StallAfter %v needs a positive duration and an OnStall", ErrDistributed, opts.StallAfter)
	}
	bk := opts.Backend
	if bk == "" {
		bk = "any"
	}
	c := &Collective{b: b, backend: bk}
	err := b.doErr(func() error {
		cbk := C.CString(bk)
		defer C.free(unsafe.Pointer(cbk))
		C.xmx_clear_error()
		if C.xmd_init(&c.g, C.bool(opts.Strict), cbk) != 0 {
			msg := lastError()
			if msg == "" {
				msg = "no group returned"
			}
			return fmt.Errorf("%w: init %q (strict %v): %s", ErrDistributed, bk, opts.Strict, msg)
		}
		c.rank = int(C.xmd_rank(c.g))
		c.size = int(C.xmd_size(c.g))
		if c.size < 1 {
			return fmt.Errorf("%w: group of %q reports size %d: %s", ErrDistributed, bk, c.size, lastError())
		}
		c.stream = b.stream
		if b.name != "mlx-cpu" && bk != "nccl" {
			var cpu C.xmx_device
			if C.xmx_device_new(&cpu, 0) != 0 {
				return fmt.Errorf("%w: cpu device for %q collectives: %s", ErrDistributed, bk, lastError())
			}
			rc := C.xmx_default_stream(&c.stream, cpu)
			C.xmx_device_free(cpu)
			if rc != 0 {
				return fmt.Errorf("%w: cpu stream for %q collectives: %s", ErrDistributed, bk, lastError())
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if opts.StallAfter > 0 {
		c.stop = make(chan struct{})
		go c.watch(opts.StallAfter, opts.OnStall)
	}
	return c, nil
}

// watch polls the backend's running evaluation until Close and calls
// onStall once for each one that has run `after`.
func (c *Collective) watch(after time.Duration, onStall func(time.Duration)) {
	tick := time.NewTicker(max(after/8, 10*time.Millisecond))
	defer tick.Stop()
	var reported int64 // the start of the evaluation last reported
	for {
		select {
		case <-c.stop:
			return
		case now := <-tick.C:
			start := c.b.evalStart.Load()
			if start == 0 || start == reported {
				continue
			}
			if d := now.Sub(time.Unix(0, start)); d >= after {
				reported = start
				onStall(d)
			}
		}
	}
}

// Close stops the stall watchdog, if any. The group itself stays joined
// for the life of the process (mlx-c v0.6.0 cannot free one).
func (c *Collective) Close() {
	if c.stop != nil {
		c.stopOnce.Do(func() { close(c.stop) })
	}
}

// DistributedAvailable reports whether MLX's distributed backend bk ("" or
// "any": any of them) is compiled into the libmlx that eb runs on.
func DistributedAvailable(eb engine.Backend, bk string) (bool, error) {
	b, ok := eb.(*backend)
	if !ok || b == nil {
		return false, fmt.Errorf("%w: DistributedAvailable needs a backend made by mlx.New, got %T", ErrDistributed, eb)
	}
	if err := loadDistributed(b); err != nil {
		return false, err
	}
	if err := distHas(fnIsAvailable); err != nil {
		return false, err
	}
	var avail bool
	err := b.doErr(func() error {
		var cbk *C.char
		if bk != "" {
			cbk = C.CString(bk)
			defer C.free(unsafe.Pointer(cbk))
		}
		C.xmx_clear_error()
		avail = bool(C.xmd_is_available(cbk))
		if msg := lastError(); !avail && msg != "" {
			return fmt.Errorf("%w: is_available(%q): %s", ErrDistributed, bk, msg)
		}
		return nil
	})
	return avail, err
}

// Rank is this process's index in the group, 0 ≤ Rank < Size.
func (c *Collective) Rank() int { return c.rank }

// Size is the number of processes in the group.
func (c *Collective) Size() int { return c.size }

// Backend is the MLX distributed backend asked for ("any" when none was
// named).
func (c *Collective) Backend() string { return c.backend }

func (c *Collective) String() string {
	return fmt.Sprintf("mlx.Collective(%s rank %d of %d)", c.backend, c.rank, c.size)
}

// collective queues one distributed op like the backend's ops: it panics
// at once when the library lacks the function, and later (at the next
// synchronous call) when the op fails.
func (c *Collective) collective(name string, fn distFn, f func(res *C.xmx_array) C.int) engine.Array {
	if err := distHas(fn); err != nil {
		panic(err)
	}
	b := c.b
	return b.op(func() *array {
		return b.mk("distributed "+name, f)
	})
}

// The engine's tensor-parallel ranks sum their partial outputs through
// this type.
var _ engine.Collective = (*Collective)(nil)

// AllSum is the element-wise sum of x over every rank (each rank passes an
// array of the same shape and dtype and gets the sum): engine.Collective's
// AllSum. b must be the backend the group was joined on (x is one of its
// arrays).
func (c *Collective) AllSum(b engine.Backend, x engine.Array) engine.Array {
	if mb, ok := b.(*backend); !ok || mb != c.b {
		panic(fmt.Errorf("%w: AllSum on backend %T, not the MLX backend this group was joined on", ErrDistributed, b))
	}
	return c.collective("all_sum", fnAllSum, func(r *C.xmx_array) C.int {
		return C.xmd_all_sum(r, c.b.arr(x).h, c.g, c.stream)
	})
}

// AllGather concatenates every rank's x along axis 0, in rank order.
func (c *Collective) AllGather(x engine.Array) engine.Array {
	return c.collective("all_gather", fnAllGather, func(r *C.xmx_array) C.int {
		return C.xmd_all_gather(r, c.b.arr(x).h, c.g, c.stream)
	})
}

// Send sends x to rank dst. The transfer happens when the returned array
// (x itself, as MLX returns it) is evaluated; the receiving rank must
// evaluate a matching Recv. The ring backend sends only to a neighbour.
func (c *Collective) Send(x engine.Array, dst int) engine.Array {
	c.checkPeer("send to", dst)
	return c.collective("send", fnSend, func(r *C.xmx_array) C.int {
		return C.xmd_send(r, c.b.arr(x).h, C.int(dst), c.g, c.stream)
	})
}

// Recv receives an array of the given shape and dtype sent by rank src.
func (c *Collective) Recv(shape []int, dt engine.DType, src int) engine.Array {
	c.checkPeer("receive from", src)
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("mlx: Recv: negative dimension in %v", shape))
		}
	}
	mdt := toMLX(dt)
	cs := cInts(shape)
	return c.collective("recv", fnRecv, func(r *C.xmx_array) C.int {
		return C.xmd_recv(r, intsPtr(cs), C.size_t(len(cs)), mdt, C.int(src), c.g, c.stream)
	})
}

// RecvLike receives from rank src an array of like's shape and dtype.
func (c *Collective) RecvLike(like engine.Array, src int) engine.Array {
	c.checkPeer("receive from", src)
	return c.collective("recv_like", fnRecvLike, func(r *C.xmx_array) C.int {
		return C.xmd_recv_like(r, c.b.arr(like).h, C.int(src), c.g, c.stream)
	})
}

func (c *Collective) checkPeer(what string, peer int) {
	if peer < 0 || peer >= c.size || peer == c.rank {
		panic(fmt.Sprintf("mlx: cannot %s rank %d (this is rank %d of %d)", what, peer, c.rank, c.size))
	}
}
