//go:build cgo && (linux || darwin)

package mlx

// The C side: a table of mlx-c function pointers filled by dlsym, and one
// shim per function we call (cgo cannot call through a function pointer).
// Shims take and return our own handle types (capi.h), which have the same
// layout as mlx-c's.

/*
#cgo linux LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#include "capi.h"

typedef void (*xmx_err_fn)(const char* msg, void* data);

static struct {
	void* lib;
	void (*set_error_handler)(xmx_err_fn, void*, void (*)(void*));
	int (*version)(xmx_string*);
	xmx_string (*string_new)(void);
	const char* (*string_data)(xmx_string);
	int (*string_free)(xmx_string);

	xmx_device (*device_new_type)(int, int);
	int (*device_free)(xmx_device);
	int (*device_is_available)(bool*, xmx_device);
	int (*get_default_stream)(xmx_stream*, xmx_device);
	int (*stream_free)(xmx_stream);
	int (*synchronize)(xmx_stream);
	int (*get_active_memory)(size_t*);
	int (*get_cache_memory)(size_t*);
	int (*clear_cache)(void);
	int (*get_peak_memory)(size_t*);
	int (*reset_peak_memory)(void);

	xmx_array (*array_new)(void);
	int (*array_free)(xmx_array);
	xmx_array (*array_new_data)(const void*, const int*, int, int);
	xmx_array (*array_new_float32)(float);
	size_t (*array_ndim)(xmx_array);
	const int* (*array_shape)(xmx_array);
	int (*array_dtype)(xmx_array);
	const uint8_t* (*array_data_uint8)(xmx_array);
	xmx_vector_array (*vector_array_new_data)(const xmx_array*, size_t);
	int (*vector_array_free)(xmx_vector_array);
	int (*eval)(xmx_vector_array);
	int (*async_eval)(xmx_vector_array);

	int (*add)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*multiply)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*matmul)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*sigmoid)(xmx_array*, xmx_array, xmx_stream);
	int (*tanh)(xmx_array*, xmx_array, xmx_stream);
	int (*minimum)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*maximum)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*contiguous)(xmx_array*, xmx_array, bool, xmx_stream);
	int (*transpose_axes)(xmx_array*, xmx_array, const int*, size_t, xmx_stream);
	int (*reshape)(xmx_array*, xmx_array, const int*, size_t, xmx_stream);
	int (*expand_dims)(xmx_array*, xmx_array, int, xmx_stream);
	int (*slice)(xmx_array*, xmx_array, const int*, size_t, const int*, size_t, const int*, size_t, xmx_stream);
	int (*slice_update)(xmx_array*, xmx_array, xmx_array, const int*, size_t, const int*, size_t, const int*, size_t, xmx_stream);
	int (*concatenate_axis)(xmx_array*, xmx_vector_array, int, xmx_stream);
	int (*astype)(xmx_array*, xmx_array, int, xmx_stream);
	int (*view)(xmx_array*, xmx_array, int, xmx_stream);
	int (*softmax_axis)(xmx_array*, xmx_array, int, bool, xmx_stream);
	int (*argmax_axis)(xmx_array*, xmx_array, int, bool, xmx_stream);
	int (*take_axis)(xmx_array*, xmx_array, xmx_array, int, xmx_stream);
	int (*zeros)(xmx_array*, const int*, size_t, int, xmx_stream);
	int (*quantized_matmul)(xmx_array*, xmx_array, xmx_array, xmx_array, xmx_array, bool, xmx_opt_int, xmx_opt_int, const char*, xmx_stream);
	int (*dequantize)(xmx_array*, xmx_array, xmx_array, xmx_array, xmx_opt_int, xmx_opt_int, const char*, xmx_array, xmx_opt_dtype, xmx_stream);
	int (*rms_norm)(xmx_array*, xmx_array, xmx_array, float, xmx_stream);
	int (*rope)(xmx_array*, xmx_array, int, bool, xmx_opt_float, float, int, xmx_array, xmx_stream);
	int (*sdpa)(xmx_array*, xmx_array, xmx_array, xmx_array, float, const char*, xmx_array, xmx_array, xmx_stream);

	// Optional: MoE routing inside the graph.
	int (*argpartition_axis)(xmx_array*, xmx_array, int, int, xmx_stream);
	int (*argsort_axis)(xmx_array*, xmx_array, int, xmx_stream);
	int (*take_along_axis)(xmx_array*, xmx_array, xmx_array, int, xmx_stream);
	// Optional: a batched decode's cache writes (batch.go).
	int (*put_along_axis)(xmx_array*, xmx_array, xmx_array, xmx_array, int, xmx_stream);
	int (*rope_dynamic)(xmx_array*, xmx_array, int, bool, xmx_opt_float, float, xmx_array, xmx_array, xmx_stream);
	int (*gather_mm)(xmx_array*, xmx_array, xmx_array, xmx_array, xmx_array, bool, xmx_stream);
	int (*gather_qmm)(xmx_array*, xmx_array, xmx_array, xmx_array, xmx_array, xmx_array, xmx_array, bool, xmx_opt_int, xmx_opt_int, const char*, bool, xmx_stream);
	// Optional: the gated delta rule.
	int (*exp)(xmx_array*, xmx_array, xmx_stream);
	int (*negative)(xmx_array*, xmx_array, xmx_stream);
	int (*logaddexp)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*subtract)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*sum_axis)(xmx_array*, xmx_array, int, bool, xmx_stream);
	int (*repeat_axis)(xmx_array*, xmx_array, int, int, xmx_stream);
	int (*log)(xmx_array*, xmx_array, xmx_stream);
	int (*cumsum)(xmx_array*, xmx_array, int, bool, bool, xmx_stream);
	// Optional: picking tokens on the device (xmx_sample_rows).
	int (*where)(xmx_array*, xmx_array, xmx_array, xmx_array, xmx_stream);
	int (*greater)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*greater_equal)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*less)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*less_equal)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*equal)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*is_nan)(xmx_array*, xmx_array, xmx_stream);
	int (*is_neginf)(xmx_array*, xmx_array, xmx_stream);
	int (*logical_and)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*logical_or)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*logical_not)(xmx_array*, xmx_array, xmx_stream);
	int (*max_axis)(xmx_array*, xmx_array, int, bool, xmx_stream);
	int (*divide)(xmx_array*, xmx_array, xmx_array, xmx_stream);
	int (*arange)(xmx_array*, double, double, double, int, xmx_stream);

	// Optional: compilation (kernel fusion).
	xmx_vector_array (*vector_array_new)(void);
	size_t (*vector_array_size)(xmx_vector_array);
	int (*vector_array_get)(xmx_array*, xmx_vector_array, size_t);
	int (*vector_array_set_value)(xmx_vector_array*, xmx_array);
	xmx_closure (*closure_new_func_payload)(int (*)(xmx_vector_array*, const xmx_vector_array, void*), void*, void (*)(void*));
	int (*closure_free)(xmx_closure);
	int (*closure_apply)(xmx_vector_array*, xmx_closure, xmx_vector_array);
	int (*compile)(xmx_closure*, xmx_closure, bool);

	// Optional: weights through MLX's own safetensors loader (xmx_array_load).
	xmx_io_reader (*io_reader_new)(void*, xmx_io_vtable);
	int (*io_reader_free)(xmx_io_reader);
	int (*load_safetensors_reader)(xmx_map*, xmx_map*, xmx_io_reader, xmx_stream);
	int (*map_string_to_array_get)(xmx_array*, xmx_map, const char*);
	int (*map_string_to_array_free)(xmx_map);
	int (*map_string_to_string_free)(xmx_map);
} X;

// The last error mlx-c reported on this thread (all our calls come from the
// one locked OS thread that owns a backend).
static __thread char xmx_err[4096];

static void xmx_on_error(const char* msg, void* data) {
	(void)data;
	snprintf(xmx_err, sizeof xmx_err, "%s", msg ? msg : "(no message)");
}

const char* xmx_last_error(void) { return xmx_err; }
void xmx_clear_error(void) { xmx_err[0] = 0; }

#define XMX_SYM(field, name, required)                                         \
	do {                                                                       \
		*(void**)(&X.field) = dlsym(h, name);                                  \
		if (required && X.field == NULL) {                                     \
			snprintf(err, errlen, "%s: missing symbol %s", path, name);        \
			memset(&X, 0, sizeof X);                                           \
			dlclose(h);                                                        \
			return 2;                                                          \
		}                                                                      \
	} while (0)

int xmx_load(const char* path, const char* preload, char* err, size_t errlen) {
	char pre_err[512] = "";
	if (preload != NULL && preload[0] != 0) {
		// libmlxc needs libmlx; load the copy beside it first so the
		// dynamic loader finds it without LD_LIBRARY_PATH or an RPATH.
		// Failure is not fatal: the loader may still find one.
		if (dlopen(preload, RTLD_NOW | RTLD_GLOBAL) == NULL) {
			const char* e = dlerror();
			snprintf(pre_err, sizeof pre_err, " (loading %s first failed: %s)", preload, e ? e : "?");
		}
	}
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char* e = dlerror();
		snprintf(err, errlen, "%s%s", e ? e : "dlopen failed", pre_err);
		return 1;
	}
	XMX_SYM(set_error_handler, "mlx_set_error_handler", 1);
	XMX_SYM(version, "mlx_version", 1);
	XMX_SYM(string_new, "mlx_string_new", 1);
	XMX_SYM(string_data, "mlx_string_data", 1);
	XMX_SYM(string_free, "mlx_string_free", 1);
	XMX_SYM(device_new_type, "mlx_device_new_type", 1);
	XMX_SYM(device_free, "mlx_device_free", 1);
	XMX_SYM(device_is_available, "mlx_device_is_available", 1);
	XMX_SYM(get_default_stream, "mlx_get_default_stream", 1);
	XMX_SYM(stream_free, "mlx_stream_free", 1);
	XMX_SYM(synchronize, "mlx_synchronize", 0);
	XMX_SYM(get_active_memory, "mlx_get_active_memory", 1);
	XMX_SYM(get_cache_memory, "mlx_get_cache_memory", 1);
	XMX_SYM(clear_cache, "mlx_clear_cache", 1);
	XMX_SYM(get_peak_memory, "mlx_get_peak_memory", 0);
	XMX_SYM(reset_peak_memory, "mlx_reset_peak_memory", 0);
	XMX_SYM(array_new, "mlx_array_new", 1);
	XMX_SYM(array_free, "mlx_array_free", 1);
	XMX_SYM(array_new_data, "mlx_array_new_data", 1);
	XMX_SYM(array_new_float32, "mlx_array_new_float32", 1);
	XMX_SYM(array_ndim, "mlx_array_ndim", 1);
	XMX_SYM(array_shape, "mlx_array_shape", 1);
	XMX_SYM(array_dtype, "mlx_array_dtype", 1);
	XMX_SYM(array_data_uint8, "mlx_array_data_uint8", 1);
	XMX_SYM(vector_array_new_data, "mlx_vector_array_new_data", 1);
	XMX_SYM(vector_array_free, "mlx_vector_array_free", 1);
	XMX_SYM(eval, "mlx_eval", 1);
	XMX_SYM(async_eval, "mlx_async_eval", 0);
	XMX_SYM(add, "mlx_add", 1);
	XMX_SYM(multiply, "mlx_multiply", 1);
	XMX_SYM(matmul, "mlx_matmul", 1);
	XMX_SYM(sigmoid, "mlx_sigmoid", 1);
	XMX_SYM(tanh, "mlx_tanh", 1);
	XMX_SYM(minimum, "mlx_minimum", 1);
	XMX_SYM(maximum, "mlx_maximum", 1);
	XMX_SYM(contiguous, "mlx_contiguous", 1);
	XMX_SYM(transpose_axes, "mlx_transpose_axes", 1);
	XMX_SYM(reshape, "mlx_reshape", 1);
	XMX_SYM(expand_dims, "mlx_expand_dims", 1);
	XMX_SYM(slice, "mlx_slice", 1);
	XMX_SYM(slice_update, "mlx_slice_update", 1);
	XMX_SYM(concatenate_axis, "mlx_concatenate_axis", 1);
	XMX_SYM(astype, "mlx_astype", 1);
	XMX_SYM(view, "mlx_view", 1);
	XMX_SYM(softmax_axis, "mlx_softmax_axis", 1);
	XMX_SYM(argmax_axis, "mlx_argmax_axis", 1);
	XMX_SYM(take_axis, "mlx_take_axis", 1);
	XMX_SYM(zeros, "mlx_zeros", 1);
	XMX_SYM(dequantize, "mlx_dequantize", 1);
	XMX_SYM(rms_norm, "mlx_fast_rms_norm", 1);
	XMX_SYM(rope, "mlx_fast_rope", 1);
	XMX_SYM(sdpa, "mlx_fast_scaled_dot_product_attention", 1);
	// Optional: a build without quantized matmul falls back to dequantize.
	XMX_SYM(quantized_matmul, "mlx_quantized_matmul", 0);
	XMX_SYM(argpartition_axis, "mlx_argpartition_axis", 0);
	XMX_SYM(argsort_axis, "mlx_argsort_axis", 0);
	XMX_SYM(take_along_axis, "mlx_take_along_axis", 0);
	XMX_SYM(put_along_axis, "mlx_put_along_axis", 0);
	XMX_SYM(rope_dynamic, "mlx_fast_rope_dynamic", 0);
	XMX_SYM(gather_mm, "mlx_gather_mm", 0);
	XMX_SYM(gather_qmm, "mlx_gather_qmm", 0);
	XMX_SYM(exp, "mlx_exp", 0);
	XMX_SYM(negative, "mlx_negative", 0);
	XMX_SYM(logaddexp, "mlx_logaddexp", 0);
	XMX_SYM(subtract, "mlx_subtract", 0);
	XMX_SYM(sum_axis, "mlx_sum_axis", 0);
	XMX_SYM(repeat_axis, "mlx_repeat_axis", 0);
	XMX_SYM(log, "mlx_log", 0);
	XMX_SYM(cumsum, "mlx_cumsum", 0);
	XMX_SYM(where, "mlx_where", 0);
	XMX_SYM(greater, "mlx_greater", 0);
	XMX_SYM(greater_equal, "mlx_greater_equal", 0);
	XMX_SYM(less, "mlx_less", 0);
	XMX_SYM(less_equal, "mlx_less_equal", 0);
	XMX_SYM(equal, "mlx_equal", 0);
	XMX_SYM(is_nan, "mlx_isnan", 0);
	XMX_SYM(is_neginf, "mlx_isneginf", 0);
	XMX_SYM(logical_and, "mlx_logical_and", 0);
	XMX_SYM(logical_or, "mlx_logical_or", 0);
	XMX_SYM(logical_not, "mlx_logical_not", 0);
	XMX_SYM(max_axis, "mlx_max_axis", 0);
	XMX_SYM(divide, "mlx_divide", 0);
	XMX_SYM(arange, "mlx_arange", 0);
	// Optional: without them SwiGLU runs as three unfused ops.
	XMX_SYM(vector_array_new, "mlx_vector_array_new", 0);
	XMX_SYM(vector_array_size, "mlx_vector_array_size", 0);
	XMX_SYM(vector_array_get, "mlx_vector_array_get", 0);
	XMX_SYM(vector_array_set_value, "mlx_vector_array_set_value", 0);
	XMX_SYM(closure_new_func_payload, "mlx_closure_new_func_payload", 0);
	XMX_SYM(closure_free, "mlx_closure_free", 0);
	XMX_SYM(closure_apply, "mlx_closure_apply", 0);
	XMX_SYM(compile, "mlx_compile", 0);
	XMX_SYM(io_reader_new, "mlx_io_reader_new", 0);
	XMX_SYM(io_reader_free, "mlx_io_reader_free", 0);
	XMX_SYM(load_safetensors_reader, "mlx_load_safetensors_reader", 0);
	XMX_SYM(map_string_to_array_get, "mlx_map_string_to_array_get", 0);
	XMX_SYM(map_string_to_array_free, "mlx_map_string_to_array_free", 0);
	XMX_SYM(map_string_to_string_free, "mlx_map_string_to_string_free", 0);
	X.lib = h;
	return 0;
}

#define XMX_NEED(field) \
	if (X.field == NULL) { snprintf(xmx_err, sizeof xmx_err, "mlx-c function %s not loaded", #field); return 3; }

void xmx_install_error_handler(void) { X.set_error_handler(xmx_on_error, NULL, NULL); }

int xmx_has_qmm(void) { return X.quantized_matmul != NULL; }

int xmx_version(char* buf, size_t n) {
	xmx_string s = X.string_new();
	int rc = X.version(&s);
	if (rc == 0) {
		const char* d = X.string_data(s);
		snprintf(buf, n, "%s", d ? d : "");
	}
	X.string_free(s);
	return rc;
}

int xmx_device_new(xmx_device* dev, int gpu) {
	*dev = X.device_new_type(gpu ? 1 : 0, 0);
	return dev->ctx == NULL;
}
int xmx_device_free(xmx_device dev) { return X.device_free(dev); }
int xmx_device_available(bool* res, xmx_device dev) { return X.device_is_available(res, dev); }
int xmx_default_stream(xmx_stream* res, xmx_device dev) { return X.get_default_stream(res, dev); }
int xmx_stream_free(xmx_stream s) { return X.stream_free(s); }
// xmx_synchronize waits until the stream has run everything queued on it
// (0 where this mlx-c lacks mlx_synchronize).
int xmx_synchronize(xmx_stream s) { return X.synchronize ? X.synchronize(s) : 0; }
int xmx_active_memory(size_t* res) { return X.get_active_memory(res); }
int xmx_cache_memory(size_t* res) { return X.get_cache_memory(res); }
int xmx_clear_cache(void) { return X.clear_cache(); }
int xmx_peak_memory(size_t* res) { XMX_NEED(get_peak_memory); return X.get_peak_memory(res); }
int xmx_reset_peak_memory(void) { XMX_NEED(reset_peak_memory); return X.reset_peak_memory(); }

int xmx_array_free(xmx_array a) { return X.array_free(a); }
void xmx_array_free_n(const xmx_array* a, size_t n) { for (size_t i = 0; i < n; i++) X.array_free(a[i]); }
int xmx_array_from(xmx_array* res, const void* data, const int* shape, int ndim, int dtype) {
	*res = X.array_new_data(data, shape, ndim, dtype);
	return res->ctx == NULL;
}

// ---- Weights through MLX's safetensors loader ----
//
// xmx_array_load makes an array from bytes in memory the way mlx.core.load
// makes one from a file: a one-tensor safetensors stream (an 8-byte length,
// the JSON header, the bytes) is handed to mlx_load_safetensors_reader, MLX
// allocates the array's buffer and asks the stream to fill it
// (read_at_offset). That call is the one moment the destination exists and
// none of its pages has been touched: on Linux it asks for transparent huge
// pages on the buffer's 2 MiB-aligned interior (madvise MADV_HUGEPAGE; THP
// in "madvise" mode serves it at the first write) before copying. See
// backend.go's loadViaReader for why.

typedef struct {
	char* hdr;         // length prefix + JSON header (owned, malloc'd)
	size_t hdrlen;
	const char* data;  // the tensor's bytes (the caller's; NULL once closed)
	size_t n;
	size_t pos;        // for the sequential reads of the header
	int huge;          // advise huge pages on the destination
	int failed;        // a read outside the stream, or after close
	int advised;       // bytes advised (for tests: xmx_array_load's *advised)
} xmx_memreader;

static bool xmr_is_open(void* d) { return ((xmx_memreader*)d)->data != NULL; }
static bool xmr_good(void* d) { return ((xmx_memreader*)d)->failed == 0; }
static size_t xmr_tell(void* d) { return ((xmx_memreader*)d)->pos; }
static void xmr_seek(void* d, int64_t off, int whence) {
	xmx_memreader* r = d;
	int64_t base = whence == SEEK_CUR ? (int64_t)r->pos : whence == SEEK_END ? (int64_t)(r->hdrlen + r->n) : 0;
	if (base + off < 0 || base + off > (int64_t)(r->hdrlen + r->n)) {
		r->failed = 1;
		return;
	}
	r->pos = (size_t)(base + off);
}

// xmr_fill copies stream bytes [off, off+n) to dst; outside the stream (or
// once closed) it zeroes dst and marks the reader failed, which
// xmx_array_load reports: MLX's reader interface has no error return.
static void xmr_fill(xmx_memreader* r, char* dst, size_t n, size_t off) {
	if (r->data == NULL || off > r->hdrlen + r->n || n > r->hdrlen + r->n - off) {
		memset(dst, 0, n);
		r->failed = 1;
		return;
	}
	if (off < r->hdrlen) {
		size_t k = r->hdrlen - off < n ? r->hdrlen - off : n;
		memcpy(dst, r->hdr + off, k);
		dst += k, off += k, n -= k;
	}
	if (n > 0) memcpy(dst, r->data + (off - r->hdrlen), n);
}

static void xmr_read(void* d, char* dst, size_t n) {
	xmx_memreader* r = d;
	xmr_fill(r, dst, n, r->pos);
	r->pos += n;
}

static void xmr_read_at(void* d, char* dst, size_t n, size_t off) {
	xmx_memreader* r = d;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
	if (r->huge) {
		const uintptr_t huge = (uintptr_t)2 << 20;
		uintptr_t lo = ((uintptr_t)dst + huge - 1) & ~(huge - 1);
		uintptr_t hi = ((uintptr_t)dst + n) & ~(huge - 1);
		// Advice only: where THP is off or no 2 MiB page is free the
		// kernel uses small pages, as without it.
		if (hi > lo && madvise((void*)lo, hi - lo, MADV_HUGEPAGE) == 0) r->advised += (int)((hi - lo) >> 20);
	}
#endif
	xmr_fill(r, dst, n, off);
}

static void xmr_write(void* d, const char* data, size_t n) { (void)data; (void)n; ((xmx_memreader*)d)->failed = 1; }
static const char* xmr_label(void* d) { (void)d; return "exo weight bytes"; }
static void xmr_free(void* d) {
	xmx_memreader* r = d;
	free(r->hdr);
	free(r);
}

int xmx_has_reader_load(void) {
	return X.io_reader_new && X.io_reader_free && X.load_safetensors_reader && X.map_string_to_array_get &&
		X.map_string_to_array_free && X.map_string_to_string_free;
}

// xmx_array_load makes *res from n bytes at data described by the
// safetensors JSON header hdr (one tensor named "w"), evaluated before it
// returns: the stream's pointer to data is dropped before the return, so no
// caller memory is kept. *advised is the MiB advised as huge pages.
int xmx_array_load(xmx_array* res, const char* hdr, size_t hdrlen, const void* data, size_t n, int huge, int* advised, xmx_stream s) {
	XMX_NEED(io_reader_new);
	*advised = 0;
	xmx_memreader* r = calloc(1, sizeof *r);
	if (r == NULL) { snprintf(xmx_err, sizeof xmx_err, "out of memory"); return 1; }
	r->hdrlen = 8 + hdrlen;
	r->hdr = malloc(r->hdrlen);
	if (r->hdr == NULL) { free(r); snprintf(xmx_err, sizeof xmx_err, "out of memory"); return 1; }
	for (int i = 0; i < 8; i++) r->hdr[i] = (char)((uint64_t)hdrlen >> (8 * i)); // little-endian length
	memcpy(r->hdr + 8, hdr, hdrlen);
	r->data = data;
	r->n = n;
	r->huge = huge;
	xmx_io_vtable vt = {xmr_is_open, xmr_good, xmr_tell, xmr_seek, xmr_read, xmr_read_at, xmr_write, xmr_label, xmr_free};
	xmx_io_reader rd = X.io_reader_new(r, vt); // owns r from here (xmr_free)
	if (rd.ctx == NULL) { xmr_free(r); return 1; }
	xmx_map arrays = {NULL}, meta = {NULL};
	int rc = X.load_safetensors_reader(&arrays, &meta, rd, s);
	if (rc == 0) rc = X.map_string_to_array_get(res, arrays, "w");
	if (rc == 0) {
		xmx_vector_array v = X.vector_array_new_data(res, 1);
		rc = X.eval(v);
		X.vector_array_free(v);
	}
	if (rc == 0 && r->failed) {
		snprintf(xmx_err, sizeof xmx_err, "weight stream read outside its %zu bytes", r->hdrlen + n);
		rc = 1;
	}
	*advised = r->advised;
	r->data = NULL; // MLX may hold the stream longer (its Load primitive); it keeps no caller memory
	X.map_string_to_array_free(arrays);
	X.map_string_to_string_free(meta);
	X.io_reader_free(rd);
	return rc;
}

int xmx_scalar_f32(xmx_array* res, float v) {
	*res = X.array_new_float32(v);
	return res->ctx == NULL;
}
size_t xmx_ndim(xmx_array a) { return X.array_ndim(a); }
const int* xmx_shape(xmx_array a) { return X.array_shape(a); }
int xmx_dtype(xmx_array a) { return X.array_dtype(a); }
xmx_info_t xmx_info(xmx_array a) {
  xmx_info_t r = {X.array_shape(a), X.array_ndim(a), X.array_dtype(a)};
  return r;
}
const void* xmx_data(xmx_array a, int dtype) {
	(void)dtype;
	// mlx-c's typed accessors only reinterpret the buffer pointer; the
	// uint8 one exists on every platform (the bfloat16 one does not on x86).
	return X.array_data_uint8(a);
}
int xmx_eval(const xmx_array* arrs, size_t n) {
	xmx_vector_array v = X.vector_array_new_data(arrs, n);
	int rc = X.eval(v);
	X.vector_array_free(v);
	return rc;
}
// xmx_async_eval schedules arrs without waiting for them (mlx_eval where
// this mlx-c lacks mlx_async_eval).
int xmx_async_eval(const xmx_array* arrs, size_t n) {
	xmx_vector_array v = X.vector_array_new_data(arrs, n);
	int rc = X.async_eval ? X.async_eval(v) : X.eval(v);
	X.vector_array_free(v);
	return rc;
}

int xmx_add(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s) { return X.add(res, a, b, s); }
int xmx_multiply(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s) { return X.multiply(res, a, b, s); }
int xmx_matmul(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s) { return X.matmul(res, a, b, s); }
int xmx_sigmoid(xmx_array* res, xmx_array a, xmx_stream s) { return X.sigmoid(res, a, s); }
int xmx_tanh(xmx_array* res, xmx_array a, xmx_stream s) { return X.tanh(res, a, s); }
int xmx_minimum(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s) { return X.minimum(res, a, b, s); }
int xmx_maximum(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s) { return X.maximum(res, a, b, s); }
int xmx_contiguous(xmx_array* res, xmx_array a, xmx_stream s) { return X.contiguous(res, a, false, s); }
int xmx_transpose(xmx_array* res, xmx_array a, const int* axes, size_t n, xmx_stream s) {
	return X.transpose_axes(res, a, axes, n, s);
}
int xmx_reshape(xmx_array* res, xmx_array a, const int* shape, size_t n, xmx_stream s) {
	return X.reshape(res, a, shape, n, s);
}
int xmx_expand_dims(xmx_array* res, xmx_array a, int axis, xmx_stream s) { return X.expand_dims(res, a, axis, s); }
int xmx_slice(xmx_array* res, xmx_array a, const int* start, const int* stop, const int* strides, size_t n, xmx_stream s) {
	return X.slice(res, a, start, n, stop, n, strides, n, s);
}
int xmx_slice_update(xmx_array* res, xmx_array src, xmx_array upd, const int* start, const int* stop, const int* strides, size_t n, xmx_stream s) {
	return X.slice_update(res, src, upd, start, n, stop, n, strides, n, s);
}
int xmx_concat(xmx_array* res, const xmx_array* arrs, size_t n, int axis, xmx_stream s) {
	xmx_vector_array v = X.vector_array_new_data(arrs, n);
	int rc = X.concatenate_axis(res, v, axis, s);
	X.vector_array_free(v);
	return rc;
}
int xmx_astype(xmx_array* res, xmx_array a, int dtype, xmx_stream s) { return X.astype(res, a, dtype, s); }
int xmx_view(xmx_array* res, xmx_array a, int dtype, xmx_stream s) { return X.view(res, a, dtype, s); }
int xmx_softmax(xmx_array* res, xmx_array a, int axis, xmx_stream s) { return X.softmax_axis(res, a, axis, true, s); }
int xmx_argmax(xmx_array* res, xmx_array a, int axis, xmx_stream s) { return X.argmax_axis(res, a, axis, false, s); }
int xmx_take(xmx_array* res, xmx_array a, xmx_array idx, int axis, xmx_stream s) { return X.take_axis(res, a, idx, axis, s); }
int xmx_zeros(xmx_array* res, const int* shape, size_t n, int dtype, xmx_stream s) { return X.zeros(res, shape, n, dtype, s); }
int xmx_qmm(xmx_array* res, xmx_array x, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, xmx_stream s) {
	XMX_NEED(quantized_matmul);
	xmx_opt_int g = {group, true}, b = {bits, true};
	return X.quantized_matmul(res, x, w, scales, biases, true, g, b, "affine", s);
}
int xmx_qmm_mode(xmx_array* res, xmx_array x, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, const char* mode, xmx_stream s) {
	XMX_NEED(quantized_matmul);
	xmx_opt_int g = {group, true}, b = {bits, true};
	return X.quantized_matmul(res, x, w, scales, biases, true, g, b, mode, s);
}
int xmx_dequantize_mode(xmx_array* res, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, const char* mode, xmx_stream s) {
	xmx_opt_int g = {group, true}, b = {bits, true};
	xmx_opt_dtype dt = {0, false};
	xmx_array none = {NULL};
	return X.dequantize(res, w, scales, biases, g, b, mode, none, dt, s);
}
int xmx_dequantize(xmx_array* res, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, xmx_stream s) {
	xmx_opt_int g = {group, true}, b = {bits, true};
	xmx_opt_dtype dt = {0, false};
	xmx_array none = {NULL};
	return X.dequantize(res, w, scales, biases, g, b, "affine", none, dt, s);
}
int xmx_rms_norm(xmx_array* res, xmx_array x, xmx_array w, float eps, xmx_stream s) { return X.rms_norm(res, x, w, eps, s); }
int xmx_rope(xmx_array* res, xmx_array x, int dims, bool has_base, float base, float scale, int offset, xmx_array freqs, xmx_stream s) {
	xmx_opt_float b = {base, has_base};
	return X.rope(res, x, dims, false, b, scale, offset, freqs, s);
}
int xmx_sdpa_ext(xmx_array* res, xmx_array q, xmx_array k, xmx_array v, float scale, const char* mask_mode, xmx_array mask, xmx_array sinks, xmx_stream s) {
	return X.sdpa(res, q, k, v, scale, mask_mode, mask, sinks, s);
}

int xmx_argpartition(xmx_array* res, xmx_array a, int kth, int axis, xmx_stream s) {
	XMX_NEED(argpartition_axis);
	return X.argpartition_axis(res, a, kth, axis, s);
}
int xmx_argsort(xmx_array* res, xmx_array a, int axis, xmx_stream s) {
	XMX_NEED(argsort_axis);
	return X.argsort_axis(res, a, axis, s);
}
int xmx_take_along_axis(xmx_array* res, xmx_array a, xmx_array idx, int axis, xmx_stream s) {
	XMX_NEED(take_along_axis);
	return X.take_along_axis(res, a, idx, axis, s);
}
int xmx_put_along_axis(xmx_array* res, xmx_array a, xmx_array idx, xmx_array values, int axis, xmx_stream s) {
	XMX_NEED(put_along_axis);
	return X.put_along_axis(res, a, idx, values, axis, s);
}
bool xmx_has_put_along_axis(void) { return X.put_along_axis != NULL; }
// xmx_rope_dynamic is xmx_rope with one offset per row of x (offset I32
// [x.shape[0]]).
int xmx_rope_dynamic(xmx_array* res, xmx_array x, int dims, bool has_base, float base, float scale, xmx_array offset, xmx_array freqs, xmx_stream s) {
	XMX_NEED(rope_dynamic);
	xmx_opt_float b = {base, has_base};
	return X.rope_dynamic(res, x, dims, false, b, scale, offset, freqs, s);
}
bool xmx_has_rope_dynamic(void) { return X.rope_dynamic != NULL; }
// The gathered matmuls take only rhs_indices (which matrix of b / w each
// batch row uses); lhs_indices is null, so a's batch rows are taken in
// order (broadcast against rhs when a has one).
int xmx_gather_mm(xmx_array* res, xmx_array a, xmx_array b, xmx_array rhs, bool sorted, xmx_stream s) {
	XMX_NEED(gather_mm);
	xmx_array none = {NULL};
	return X.gather_mm(res, a, b, none, rhs, sorted, s);
}
int xmx_gather_qmm(xmx_array* res, xmx_array x, xmx_array w, xmx_array scales, xmx_array biases, xmx_array rhs, int group, int bits, const char* mode, bool sorted, xmx_stream s) {
	XMX_NEED(gather_qmm);
	xmx_opt_int g = {group, true}, b = {bits, true};
	xmx_array none = {NULL};
	return X.gather_qmm(res, x, w, scales, biases, none, rhs, true, g, b, mode, sorted, s);
}

// Temporaries of the shims below: every handle made goes into a pool
// freed at the end (handles are reference counts: the results keep what
// they need).
typedef struct { xmx_array a[256]; int n; } xmx_pool;
static xmx_array* xmx_new(xmx_pool* p) {
	if (p->n == 256) return NULL;
	p->a[p->n].ctx = NULL;
	return &p->a[p->n++];
}
static void xmx_drain(xmx_pool* p) {
	for (int i = 0; i < p->n; i++) if (p->a[i].ctx) X.array_free(p->a[i]);
	p->n = 0;
}
#define XMX_T(var) xmx_array* var = xmx_new(&pool); if (var == NULL) { rc = 1; goto out; }
#define XMX_DO(call) if (rc == 0) rc = (call)

// xmx_sdpa3 is attention on q [H, L, Dh], k, v [Hkv, T, Dh] (3-D): the
// [1, H, L, Dh] views, MLX's attention and the [H, L, Dh] result in one
// crossing (expand_dims never copies; a reshape of a cache slice would).
int xmx_sdpa3(xmx_array* res, xmx_array q, xmx_array k, xmx_array v, float scale, const char* mask_mode, xmx_stream s) {
	xmx_pool pool = {.n = 0};
	int rc = 0;
	XMX_T(q4) XMX_T(k4) XMX_T(v4) XMX_T(o)
	XMX_DO(X.expand_dims(q4, q, 0, s));
	XMX_DO(X.expand_dims(k4, k, 0, s));
	XMX_DO(X.expand_dims(v4, v, 0, s));
	XMX_DO(X.sdpa(o, *q4, *k4, *v4, scale, mask_mode, (xmx_array){NULL}, (xmx_array){NULL}, s));
	if (rc == 0) {
		const int* qs = X.array_shape(q);
		int shape[3] = {qs[0], qs[1], X.array_shape(v)[2]};
		rc = X.reshape(res, *o, shape, 3, s);
	}
out:
	xmx_drain(&pool);
	return rc;
}

int xmx_delta_gates(xmx_array* g, xmx_array* beta, xmx_array a, xmx_array b, xmx_array alog, xmx_array dtbias, xmx_stream s) {
	XMX_NEED(exp); XMX_NEED(negative); XMX_NEED(logaddexp);
	xmx_pool pool = {.n = 0};
	int rc = 0;
	XMX_T(af) XMX_T(df) XMX_T(x) XMX_T(zero) XMX_T(sp) XMX_T(lf) XMX_T(ea) XMX_T(t) XMX_T(nt) XMX_T(bf)
	XMX_DO(X.astype(af, a, XMX_FLOAT32, s));
	XMX_DO(X.astype(df, dtbias, XMX_FLOAT32, s));
	XMX_DO(X.add(x, *af, *df, s));
	if (rc == 0) { *zero = X.array_new_float32(0); rc = zero->ctx == NULL; }
	XMX_DO(X.logaddexp(sp, *x, *zero, s)); // softplus, as MLX's nn.softplus
	XMX_DO(X.astype(lf, alog, XMX_FLOAT32, s));
	XMX_DO(X.exp(ea, *lf, s));
	XMX_DO(X.multiply(t, *ea, *sp, s));
	XMX_DO(X.negative(nt, *t, s));
	XMX_DO(X.exp(g, *nt, s));
	XMX_DO(X.astype(bf, b, XMX_FLOAT32, s));
	XMX_DO(X.sigmoid(beta, *bf, s));
out:
	xmx_drain(&pool);
	return rc;
}

// xmx_row takes row t of a [L, ...] array and reshapes it to shape.
static int xmx_row(xmx_array* res, xmx_array a, int t, int ndim, const int* full, const int* shape, int rdim, xmx_stream s) {
	int start[4] = {0}, stop[4], str[4];
	for (int i = 0; i < ndim; i++) { stop[i] = full[i]; str[i] = 1; }
	start[0] = t; stop[0] = t + 1;
	xmx_array tmp = {NULL};
	int rc = X.slice(&tmp, a, start, ndim, stop, ndim, str, ndim, s);
	if (rc == 0) rc = X.reshape(res, tmp, shape, rdim, s);
	if (tmp.ctx) X.array_free(tmp);
	return rc;
}

// xmx_gated_delta is mlx-lm's gated_delta_ops: for each token, S = g·S;
// mem = Σ_k S·k; S += k ⊗ (β(v − mem)); y = Σ_k S·q. q, k [L, Hk, dk]
// (repeated rep times to hv heads), v [L, hv, dv], g, beta [L, hv] float32,
// state [hv, dv, dk] float32 → y [L, hv, dv] in q's dtype, state_out.
int xmx_gated_delta(xmx_array* y, xmx_array* state_out, xmx_array q, xmx_array k, xmx_array v, xmx_array g, xmx_array beta, xmx_array state, int L, int hv, int dv, int dk, int rep, xmx_stream s) {
	XMX_NEED(subtract); XMX_NEED(sum_axis); XMX_NEED(repeat_axis);
	int rc = 0;
	xmx_pool pool = {.n = 0};
	xmx_array S = {NULL}, qr = {NULL}, kr = {NULL};
	xmx_array* ys = calloc(L > 0 ? L : 1, sizeof(xmx_array));
	if (ys == NULL) return 1;
	int qdt = X.array_dtype(q);
	if (rep > 1) {
		rc = X.repeat_axis(&qr, q, rep, 1, s);
		if (rc == 0) rc = X.repeat_axis(&kr, k, rep, 1, s);
	} else {
		qr = q; kr = k; // borrowed
	}
	const int fq[3] = {L, hv, dk}, fv[3] = {L, hv, dv}, fg[2] = {L, hv};
	const int sq[3] = {hv, 1, dk}, sv[2] = {hv, dv}, sg[3] = {hv, 1, 1}, sb[2] = {hv, 1}, sd[3] = {hv, dv, 1}, sy[3] = {1, hv, dv};
	if (rc == 0) {
		// An own handle on the state to replace as the tokens go (adding 0
		// keeps the values).
		xmx_array zero = X.array_new_float32(0);
		rc = zero.ctx == NULL || X.add(&S, state, zero, s);
		if (zero.ctx) X.array_free(zero);
	}
	for (int t = 0; rc == 0 && t < L; t++) {
		XMX_T(qt) XMX_T(kt) XMX_T(vt) XMX_T(gt) XMX_T(bt) XMX_T(S1) XMX_T(p) XMX_T(mem) XMX_T(d0) XMX_T(d) XMX_T(d3) XMX_T(u) XMX_T(S2) XMX_T(p2) XMX_T(yt)
		XMX_DO(xmx_row(qt, qr, t, 3, fq, sq, 3, s));
		XMX_DO(xmx_row(kt, kr, t, 3, fq, sq, 3, s));
		XMX_DO(xmx_row(vt, v, t, 3, fv, sv, 2, s));
		XMX_DO(xmx_row(gt, g, t, 2, fg, sg, 3, s));
		XMX_DO(xmx_row(bt, beta, t, 2, fg, sb, 2, s));
		XMX_DO(X.multiply(S1, S, *gt, s));          // decay
		XMX_DO(X.multiply(p, *S1, *kt, s));
		XMX_DO(X.sum_axis(mem, *p, -1, false, s));  // [hv, dv]
		XMX_DO(X.subtract(d0, *vt, *mem, s));
		XMX_DO(X.multiply(d, *d0, *bt, s));
		XMX_DO(X.reshape(d3, *d, sd, 3, s));
		XMX_DO(X.multiply(u, *kt, *d3, s));         // [hv, dv, dk]
		XMX_DO(X.add(S2, *S1, *u, s));
		XMX_DO(X.multiply(p2, *S2, *qt, s));
		XMX_DO(X.sum_axis(yt, *p2, -1, false, s));
		if (rc == 0) rc = X.reshape(&ys[t], *yt, sy, 3, s);
		if (rc == 0) { X.array_free(S); S = *S2; S2->ctx = NULL; }
		xmx_drain(&pool);
	}
	xmx_array cat = {NULL};
	if (rc == 0 && L > 0) {
		xmx_vector_array vec = X.vector_array_new_data(ys, L);
		rc = X.concatenate_axis(&cat, vec, 0, s);
		X.vector_array_free(vec);
	}
	if (rc == 0) rc = X.astype(y, cat, qdt, s);
	if (rc == 0) { *state_out = S; S.ctx = NULL; }
out:
	xmx_drain(&pool);
	for (int t = 0; t < L; t++) if (ys[t].ctx) X.array_free(ys[t]);
	free(ys);
	if (cat.ctx) X.array_free(cat);
	if (S.ctx) X.array_free(S);
	if (rep > 1) { if (qr.ctx) X.array_free(qr); if (kr.ctx) X.array_free(kr); }
	return rc;
}

// xmx_mask makes a [n, n] float32 constant: 1 where keep(i, j), else 0.
static int xmx_mask(xmx_array* res, int n, int kind) {
	float* m = calloc((size_t)n * n, sizeof(float));
	if (m == NULL) return 1;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			m[i * n + j] = (kind == 0 && j < i) || (kind == 1 && j <= i);
	int shape[2] = {n, n};
	*res = X.array_new_data(m, shape, 2, XMX_FLOAT32);
	free(m);
	return res->ctx == NULL;
}

// xmx_gated_delta_chunked computes what xmx_gated_delta does, chunk by
// chunk of `chunk` tokens with matrix products (the WY form of the delta
// rule): per head, with Γ the running product of g inside the chunk,
// E[t,j] = Γt/Γj (j ≤ t), the chunk's pseudo-values U solve
// (I + A) U = β(V − Γ K S0ᵀ) with A = strictly-lower(β E ⊙ K Kᵀ), the
// inverse taken as Π (I + N^(2^m)), N = −A nilpotent, applied factor by
// factor to the right-hand side (X += N^(2^m) X: C²·dv flops each, where
// forming the inverse would cost C³); then
// Y = Γ Q S0ᵀ + lower(E ⊙ Q Kᵀ) U and S = Γ_C S0 + Uᵀ (Γ_C/Γ ⊙ K).
// The masks are made once, for a full chunk; a shorter last chunk uses
// their top-left corner.
int xmx_gated_delta_chunked(xmx_array* y, xmx_array* state_out, xmx_array q, xmx_array k, xmx_array v, xmx_array g, xmx_array beta, xmx_array state, int L, int hv, int dv, int dk, int rep, int chunk, xmx_stream s) {
	XMX_NEED(subtract); XMX_NEED(repeat_axis); XMX_NEED(log); XMX_NEED(cumsum); XMX_NEED(minimum); XMX_NEED(maximum); XMX_NEED(exp); XMX_NEED(negative);
	int rc = 0;
	xmx_pool pool = {.n = 0};
	xmx_pool top = {.n = 0};
	int nch = (L + chunk - 1) / chunk;
	xmx_array* ys = calloc(nch > 0 ? nch : 1, sizeof(xmx_array));
	if (ys == NULL) return 1;
	xmx_array S = {NULL}, cat = {NULL};
	int qdt = X.array_dtype(q);
	const int perm[3] = {1, 0, 2}, perm2[2] = {1, 0};
	xmx_array *qf, *kf, *qr, *kr, *qT, *kT, *vf, *vT, *gT, *bT, *lg, *lg0, *floor, *zero, *strict0, *lower0;
	// Inputs as float32, heads first: [hv, L, d] and [hv, L].
	#define XMX_TOP(var) var = xmx_new(&top); if (var == NULL) { rc = 1; goto out; }
	XMX_TOP(qf) XMX_TOP(kf) XMX_TOP(qr) XMX_TOP(kr) XMX_TOP(qT) XMX_TOP(kT) XMX_TOP(vf) XMX_TOP(vT) XMX_TOP(gT) XMX_TOP(bT) XMX_TOP(lg) XMX_TOP(zero)
	XMX_TOP(strict0) XMX_TOP(lower0)
	if (rc == 0) rc = xmx_mask(strict0, chunk, 0);
	if (rc == 0) rc = xmx_mask(lower0, chunk, 1);
	XMX_DO(X.astype(qf, q, XMX_FLOAT32, s));
	XMX_DO(X.astype(kf, k, XMX_FLOAT32, s));
	XMX_DO(X.repeat_axis(qr, *qf, rep, 1, s));
	XMX_DO(X.repeat_axis(kr, *kf, rep, 1, s));
	XMX_DO(X.transpose_axes(qT, *qr, perm, 3, s));
	XMX_DO(X.transpose_axes(kT, *kr, perm, 3, s));
	XMX_DO(X.astype(vf, v, XMX_FLOAT32, s));
	XMX_DO(X.transpose_axes(vT, *vf, perm, 3, s));
	XMX_DO(X.transpose_axes(gT, g, perm2, 2, s));
	XMX_DO(X.transpose_axes(bT, beta, perm2, 2, s));
	XMX_TOP(lg0) XMX_TOP(floor)
	XMX_DO(X.log(lg0, *gT, s));
	// log g floored at −60: a gate that underflowed to 0 (large A·softplus)
	// would make −inf and then NaN (−inf − −inf); e^−60 ≈ 1e−26 scales the
	// state below float32's resolution of anything it is added to, as 0 does.
	if (rc == 0) { *floor = X.array_new_float32(-60); rc = floor->ctx == NULL; }
	XMX_DO(X.maximum(lg, *lg0, *floor, s));
	if (rc == 0) { *zero = X.array_new_float32(0); rc = zero->ctx == NULL; }
	if (rc == 0) {
		xmx_array z = X.array_new_float32(0);
		rc = z.ctx == NULL || X.add(&S, state, z, s);
		if (z.ctx) X.array_free(z);
	}
	for (int ci = 0; rc == 0 && ci < nch; ci++) {
		int c0 = ci * chunk, c1 = c0 + chunk < L ? c0 + chunk : L, C = c1 - c0;
		int st3[3] = {0, c0, 0}, sp3q[3] = {hv, c1, dk}, sp3v[3] = {hv, c1, dv}, one3[3] = {1, 1, 1};
		int st2[2] = {0, c0}, sp2[2] = {hv, c1}, one2[2] = {1, 1};
		int col[3] = {hv, C, 1}, row[3] = {hv, 1, C}, last0[2] = {0, C - 1}, last1[2] = {hv, C}, g3[3] = {hv, 1, 1};
		const int sw[3] = {0, 2, 1};
		XMX_T(Qc) XMX_T(Kc) XMX_T(Vc) XMX_T(lc) XMX_T(bc) XMX_T(cl) XMX_T(G) XMX_T(clc) XMX_T(clr) XMX_T(D) XMX_T(Dm) XMX_T(E)
		XMX_T(KtT) XMX_T(KK) XMX_T(strict) XMX_T(lower) XMX_T(b3) XMX_T(A0) XMX_T(A1) XMX_T(A) XMX_T(N)
		XMX_T(S0T) XMX_T(KS) XMX_T(G3) XMX_T(GKS) XMX_T(VmG) XMX_T(B) XMX_T(NB) XMX_T(U)
		XMX_T(QK) XMX_T(W0) XMX_T(W) XMX_T(QS) XMX_T(GQS) XMX_T(WU) XMX_T(Yc)
		XMX_T(cll) XMX_T(dl0) XMX_T(dl1) XMX_T(dl) XMX_T(dl3) XMX_T(Kd) XMX_T(UT) XMX_T(UK) XMX_T(GC) XMX_T(GC3) XMX_T(S1) XMX_T(S2)
		XMX_DO(X.slice(Qc, *qT, st3, 3, sp3q, 3, one3, 3, s));
		XMX_DO(X.slice(Kc, *kT, st3, 3, sp3q, 3, one3, 3, s));
		XMX_DO(X.slice(Vc, *vT, st3, 3, sp3v, 3, one3, 3, s));
		XMX_DO(X.slice(lc, *lg, st2, 2, sp2, 2, one2, 2, s));
		XMX_DO(X.slice(bc, *bT, st2, 2, sp2, 2, one2, 2, s));
		XMX_DO(X.cumsum(cl, *lc, 1, false, true, s));          // [hv, C] log Γ
		XMX_DO(X.exp(G, *cl, s));                              // Γ
		XMX_DO(X.reshape(clc, *cl, col, 3, s));
		XMX_DO(X.reshape(clr, *cl, row, 3, s));
		XMX_DO(X.subtract(D, *clc, *clr, s));                  // log Γt − log Γj
		XMX_DO(X.minimum(Dm, *D, *zero, s));                   // ≤ 0 where it is used (j ≤ t)
		XMX_DO(X.exp(E, *Dm, s));
		XMX_DO(X.transpose_axes(KtT, *Kc, sw, 3, s));           // [hv, dk, C]
		XMX_DO(X.matmul(KK, *Kc, *KtT, s));                    // k_t · k_j
		xmx_array *sm = strict0, *lm = lower0;
		if (C < chunk) {
			int mst[2] = {0, 0}, msp[2] = {C, C};
			XMX_DO(X.slice(strict, *strict0, mst, 2, msp, 2, one2, 2, s));
			XMX_DO(X.slice(lower, *lower0, mst, 2, msp, 2, one2, 2, s));
			sm = strict; lm = lower;
		}
		XMX_DO(X.reshape(b3, *bc, col, 3, s));                 // β_t per row
		XMX_DO(X.multiply(A0, *E, *KK, s));
		XMX_DO(X.multiply(A1, *A0, *b3, s));
		XMX_DO(X.multiply(A, *A1, *sm, s));
		XMX_DO(X.negative(N, *A, s));
		XMX_DO(X.transpose_axes(S0T, S, sw, 3, s));            // [hv, dk, dv]
		XMX_DO(X.matmul(KS, *Kc, *S0T, s));                    // [hv, C, dv]
		XMX_DO(X.reshape(G3, *G, col, 3, s));
		XMX_DO(X.multiply(GKS, *G3, *KS, s));
		XMX_DO(X.subtract(VmG, *Vc, *GKS, s));
		XMX_DO(X.multiply(B, *VmG, *b3, s));
		XMX_DO(X.matmul(NB, *N, *B, s));
		XMX_DO(X.add(U, *B, *NB, s));                          // (I + N) B
		if (rc == 0) {
			// U = (I + N^(C/2))…(I + N²)(I + N) B, [hv, C, dv]
			xmx_array P = {NULL}, P2 = {NULL}, PU = {NULL}, U2 = {NULL};
			rc = X.add(&P, *N, *zero, s);
			for (int p = 2; rc == 0 && p < C; p *= 2) {
				rc = X.matmul(&P2, P, P, s);                       // N^(2^m)
				if (rc == 0) rc = X.matmul(&PU, P2, *U, s);
				if (rc == 0) rc = X.add(&U2, *U, PU, s);
				if (rc == 0) { X.array_free(P); P = P2; P2.ctx = NULL; X.array_free(*U); *U = U2; U2.ctx = NULL; }
				if (PU.ctx) { X.array_free(PU); PU.ctx = NULL; }
			}
			if (P.ctx) X.array_free(P);
			if (P2.ctx) X.array_free(P2);
		}
		XMX_DO(X.matmul(QK, *Qc, *KtT, s));
		XMX_DO(X.multiply(W0, *E, *QK, s));
		XMX_DO(X.multiply(W, *W0, *lm, s));
		XMX_DO(X.matmul(QS, *Qc, *S0T, s));
		XMX_DO(X.multiply(GQS, *G3, *QS, s));
		XMX_DO(X.matmul(WU, *W, *U, s));
		XMX_DO(X.add(Yc, *GQS, *WU, s));
		// The state after the chunk.
		XMX_DO(X.slice(cll, *cl, last0, 2, last1, 2, one2, 2, s)); // [hv, 1] log Γ_C
		XMX_DO(X.subtract(dl0, *cll, *cl, s));                 // log(Γ_C/Γ_j) ≤ 0
		XMX_DO(X.minimum(dl1, *dl0, *zero, s));
		XMX_DO(X.exp(dl, *dl1, s));
		XMX_DO(X.reshape(dl3, *dl, col, 3, s));
		XMX_DO(X.multiply(Kd, *dl3, *Kc, s));                  // [hv, C, dk]
		XMX_DO(X.transpose_axes(UT, *U, sw, 3, s));            // [hv, dv, C]
		XMX_DO(X.matmul(UK, *UT, *Kd, s));                     // [hv, dv, dk]
		XMX_DO(X.exp(GC, *cll, s));
		XMX_DO(X.reshape(GC3, *GC, g3, 3, s));
		XMX_DO(X.multiply(S1, *GC3, S, s));
		XMX_DO(X.add(S2, *S1, *UK, s));
		if (rc == 0) { ys[ci] = *Yc; Yc->ctx = NULL; X.array_free(S); S = *S2; S2->ctx = NULL; }
		xmx_drain(&pool);
	}
	if (rc == 0 && nch > 0) {
		xmx_vector_array vec = X.vector_array_new_data(ys, nch);
		xmx_array yh = {NULL};
		rc = X.concatenate_axis(&yh, vec, 1, s);               // [hv, L, dv]
		X.vector_array_free(vec);
		if (rc == 0) rc = X.transpose_axes(&cat, yh, perm, 3, s);
		if (yh.ctx) X.array_free(yh);
	}
	if (rc == 0) rc = X.astype(y, cat, qdt, s);
	if (rc == 0) { *state_out = S; S.ctx = NULL; }
out:
	#undef XMX_TOP
	xmx_drain(&pool);
	xmx_drain(&top);
	for (int i = 0; i < nch; i++) if (ys[i].ctx) X.array_free(ys[i]);
	free(ys);
	if (cat.ctx) X.array_free(cat);
	if (S.ctx) X.array_free(S);
	return rc;
}

int xmx_has_compile(void) {
	return X.vector_array_new && X.vector_array_size && X.vector_array_get && X.vector_array_set_value &&
		X.closure_new_func_payload && X.closure_free && X.closure_apply && X.compile;
}

// xmx_swiglu is the graph itself: (gate * sigmoid(gate)) * up, the order
// of MLX's nn.silu followed by the multiply in mlx-lm's swiglu.
int xmx_swiglu(xmx_array* res, xmx_array gate, xmx_array up, xmx_stream s) {
	xmx_array sg = {NULL}, t = {NULL};
	int rc = X.sigmoid(&sg, gate, s);
	if (rc == 0) rc = X.multiply(&t, gate, sg, s);
	if (rc == 0) rc = X.multiply(res, t, up, s);
	if (sg.ctx) X.array_free(sg);
	if (t.ctx) X.array_free(t);
	return rc;
}

// The closures mlx_compile traces get a payload: the stream, and eps for
// rms_norm.
typedef struct { xmx_stream s; float eps; } xmx_payload;

// xmx_inputs checks that a closure got n inputs and takes them into a
// (xmx_output frees them).
static int xmx_inputs(const xmx_vector_array in, const char* name, xmx_array* a, size_t n) {
	size_t got = X.vector_array_size(in);
	if (got != n) {
		snprintf(xmx_err, sizeof xmx_err, "%s closure: %zu inputs, want %zu", name, got, n);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		if (X.vector_array_get(&a[i], in, i) != 0) return 1;
	}
	return 0;
}

// xmx_output sets a closure's one output when rc is 0 and frees its
// inputs and out.
static int xmx_output(xmx_vector_array* res, int rc, xmx_array* a, size_t n, xmx_array out) {
	if (rc == 0) rc = X.vector_array_set_value(res, out);
	for (size_t i = 0; i < n; i++) if (a[i].ctx) X.array_free(a[i]);
	if (out.ctx) X.array_free(out);
	return rc;
}

// xmx_swiglu_body: inputs gate, up.
static int xmx_swiglu_body(xmx_vector_array* res, const xmx_vector_array in, void* payload) {
	xmx_array a[2] = {{NULL}, {NULL}}, out = {NULL};
	int rc = xmx_inputs(in, "swiglu", a, 2);
	if (rc == 0) rc = xmx_swiglu(&out, a[0], a[1], ((xmx_payload*)payload)->s);
	return xmx_output(res, rc, a, 2, out);
}

// xmx_compile_body compiles body with the payload {s, eps}.
static int xmx_compile_body(xmx_closure* res, int (*body)(xmx_vector_array*, const xmx_vector_array, void*), xmx_stream s, float eps, bool shapeless) {
	XMX_NEED(compile);
	xmx_payload* p = malloc(sizeof *p);
	if (p == NULL) {
		snprintf(xmx_err, sizeof xmx_err, "out of memory");
		return 1;
	}
	p->s = s; // borrowed: the backend frees the stream after its closures
	p->eps = eps;
	// From here mlx-c owns p (its shared_ptr frees it, on failure too).
	xmx_closure f = X.closure_new_func_payload(body, p, free);
	if (f.ctx == NULL) return 1;
	xmx_closure c = {NULL};
	int rc = X.compile(&c, f, shapeless);
	X.closure_free(f); // the compiled closure holds its own copy
	if (rc != 0) {
		if (c.ctx) X.closure_free(c);
		return rc;
	}
	*res = c;
	return 0;
}

int xmx_swiglu_compile(xmx_closure* res, xmx_stream s) { return xmx_compile_body(res, xmx_swiglu_body, s, 0, true); }

// xmx_apply applies a compiled closure to n inputs and returns its one
// output.
int xmx_apply(xmx_array* res, xmx_closure f, const xmx_array* in, size_t n) {
	xmx_vector_array vin = X.vector_array_new_data(in, n);
	xmx_vector_array vout = X.vector_array_new();
	int rc = X.closure_apply(&vout, f, vin);
	if (rc == 0) rc = X.vector_array_get(res, vout, 0);
	X.vector_array_free(vin);
	X.vector_array_free(vout);
	return rc;
}

// xmx_apply2 applies a compiled closure of two inputs and one output.
int xmx_apply2(xmx_array* res, xmx_closure f, xmx_array a, xmx_array b) {
	xmx_array in[2] = {a, b};
	return xmx_apply(res, f, in, 2);
}

// On MLX's CPU backend fast::rms_norm and fast::rope have no kernels: each
// call builds their fallback graphs (rope: ~25 ops, its sines and cosines
// computed anew every call). The backend compiles both instead; these
// closures are the same ops, so the results are the same bits on x86 (the
// tests compare them).

// xmx_rms_body: inputs x, w; MLX's rms_norm with the payload's eps.
static int xmx_rms_body(xmx_vector_array* res, const xmx_vector_array in, void* payload) {
	xmx_payload* p = payload;
	xmx_array a[2] = {{NULL}, {NULL}}, out = {NULL};
	int rc = xmx_inputs(in, "rms_norm", a, 2);
	if (rc == 0) rc = X.rms_norm(&out, a[0], a[1], p->eps, p->s);
	return xmx_output(res, rc, a, 2, out);
}

// xmx_rms_compile compiles rms_norm for one eps, shapeless: the trace
// bakes in 1/N of the mean, so the caller keeps one closure per width N.
int xmx_rms_compile(xmx_closure* res, float eps, xmx_stream s) { return xmx_compile_body(res, xmx_rms_body, s, eps, true); }

// xmx_rope_body: inputs x1, x2 (the two rotated halves of x), c, s (the
// cosines and sines in x's type); output [x1·c − x2·s, x1·s + x2·c] along
// the last axis, in the order of MLX's rope fallback (forward,
// non-traditional).
static int xmx_rope_body(xmx_vector_array* res, const xmx_vector_array in, void* payload) {
	xmx_stream st = ((xmx_payload*)payload)->s;
	xmx_array x[4] = {{NULL}, {NULL}, {NULL}, {NULL}}, cat = {NULL};
	xmx_pool pool = {.n = 0};
	int rc = xmx_inputs(in, "rope", x, 4);
	XMX_T(a) XMX_T(b) XMX_T(o1) XMX_T(d) XMX_T(e) XMX_T(o2)
	XMX_DO(X.multiply(a, x[0], x[2], st));
	XMX_DO(X.multiply(b, x[1], x[3], st));
	XMX_DO(X.subtract(o1, *a, *b, st));
	XMX_DO(X.multiply(d, x[0], x[3], st));
	XMX_DO(X.multiply(e, x[1], x[2], st));
	XMX_DO(X.add(o2, *d, *e, st));
	if (rc == 0) {
		xmx_array halves[2] = {*o1, *o2};
		xmx_vector_array v = X.vector_array_new_data(halves, 2);
		rc = X.concatenate_axis(&cat, v, -1, st);
		X.vector_array_free(v);
	}
out:
	xmx_drain(&pool);
	return xmx_output(res, rc, x, 4, cat);
}

int xmx_rope_compile(xmx_closure* res, xmx_stream s) {
	XMX_NEED(subtract);
	return xmx_compile_body(res, xmx_rope_body, s, 0, true);
}

// xmx_rope_apply rotates the first dims of x's last axis with the compiled
// rope closure f and the tables c, s ([..., L, dims/2], broadcasting
// against x [..., L, Dh]); the rest of the axis passes through.
int xmx_rope_apply(xmx_array* res, xmx_closure f, xmx_array x, xmx_array c, xmx_array s, int dims, xmx_stream st) {
	size_t nd = X.array_ndim(x);
	if (nd < 1 || nd > 8) {
		snprintf(xmx_err, sizeof xmx_err, "rope of a %zu-dimensional array", nd);
		return 1;
	}
	const int* shape = X.array_shape(x);
	int dh = shape[nd - 1], h = dims / 2;
	int start[8] = {0}, stop[8], step[8];
	for (size_t i = 0; i < nd; i++) { stop[i] = shape[i]; step[i] = 1; }
	xmx_pool pool = {.n = 0};
	int rc = 0;
	XMX_T(x1) XMX_T(x2) XMX_T(rot) XMX_T(tail)
	stop[nd - 1] = h;
	XMX_DO(X.slice(x1, x, start, nd, stop, nd, step, nd, st));
	start[nd - 1] = h;
	stop[nd - 1] = dims;
	XMX_DO(X.slice(x2, x, start, nd, stop, nd, step, nd, st));
	if (rc == 0) {
		xmx_array in[4] = {*x1, *x2, c, s};
		rc = xmx_apply(dims < dh ? rot : res, f, in, 4);
	}
	if (rc == 0 && dims < dh) {
		start[nd - 1] = dims;
		stop[nd - 1] = dh;
		XMX_DO(X.slice(tail, x, start, nd, stop, nd, step, nd, st));
		if (rc == 0) {
			xmx_array parts[2] = {*rot, *tail};
			xmx_vector_array v = X.vector_array_new_data(parts, 2);
			rc = X.concatenate_axis(res, v, -1, st);
			X.vector_array_free(v);
		}
	}
out:
	xmx_drain(&pool);
	return rc;
}

int xmx_closure_free(xmx_closure c) { return X.closure_free(c); }
// xmx_sample_rows picks one token per row of logits [B, V] on the device
// with sample.Sampler's rules (engine.SampleRows documents the inputs):
// logit bias, repetition penalty, presence and frequency penalties, then
// greedy (argmax) or temperature, top-k, min-p, top-p and an inverse-CDF
// pick of the row's uniform, over the candidates in id order, or by
// descending logit (a stable sort: ties by id) for top-p rows. It writes
// the tokens [B] int32 and, when seen/counts are given, their updates.
int xmx_has_sample(void) {
	return X.where && X.greater && X.greater_equal && X.less && X.less_equal && X.equal && X.is_nan &&
		X.is_neginf && X.logical_and && X.logical_or && X.logical_not && X.max_axis && X.divide && X.arange &&
		X.cumsum && X.sum_axis && X.exp && X.subtract && X.argsort_axis && X.take_along_axis && X.negative;
}

int xmx_sample_rows(xmx_array* tok, xmx_array* seen_out, xmx_array* counts_out, xmx_array logits, xmx_array params,
		xmx_array u, xmx_array mask, xmx_array bias, xmx_array seen, xmx_array counts, int sampled, int sorted, int topp, xmx_stream s) {
	if (!xmx_has_sample()) { snprintf(xmx_err, sizeof xmx_err, "mlx-c lacks the ops of device sampling"); return 3; }
	xmx_pool pool = {.n = 0};
	int rc = 0;
	const int* ls = X.array_shape(logits);
	int B = ls[0], V = ls[1];
	xmx_array col[XMX_SP_N];
	for (int i = 0; i < XMX_SP_N; i++) col[i].ctx = NULL;
	XMX_T(zero) XMX_T(one) XMX_T(ninf) XMX_T(l)
	if (rc == 0) { *zero = X.array_new_float32(0); *one = X.array_new_float32(1); *ninf = X.array_new_float32(-INFINITY); }
	for (int i = 0; i < XMX_SP_N && rc == 0; i++) {
		int start[2] = {0, i}, stop[2] = {B, i + 1}, str[2] = {1, 1};
		rc = X.slice(&col[i], params, start, 2, stop, 2, str, 2, s); // [B, 1]
	}
	XMX_DO(X.astype(l, logits, XMX_FLOAT32, s));
	if (mask.ctx != NULL) { // a constraint's mask (-Inf: not allowed) replaces the logit, as the host's Mask does
		XMX_T(off) XMX_T(lm)
		XMX_DO(X.is_neginf(off, mask, s));
		XMX_DO(X.where(lm, *off, *ninf, *l, s));
		l = lm;
	}
	if (bias.ctx != NULL) {
		XMX_T(lb)
		XMX_DO(X.add(lb, *l, bias, s));
		l = lb;
	}
	if (seen.ctx != NULL) { // HF's repetition penalty: a seen token's logit is divided (> 0) or multiplied (< 0)
		XMX_T(neg) XMX_T(mul) XMX_T(div) XMX_T(pen) XMX_T(hit) XMX_T(lr)
		XMX_DO(X.less(neg, *l, *zero, s));
		XMX_DO(X.multiply(mul, *l, col[XMX_SP_REP], s));
		XMX_DO(X.divide(div, *l, col[XMX_SP_REP], s));
		XMX_DO(X.where(pen, *neg, *mul, *div, s));
		XMX_DO(X.greater(hit, seen, *zero, s));
		XMX_DO(X.where(lr, *hit, *pen, *l, s));
		l = lr;
	}
	if (counts.ctx != NULL) { // OpenAI's: c·frequency + presence for each returned token
		XMX_T(cf) XMX_T(has) XMX_T(pp) XMX_T(pen) XMX_T(lc)
		XMX_DO(X.multiply(cf, counts, col[XMX_SP_FREQ], s));
		XMX_DO(X.greater(has, counts, *zero, s));
		XMX_DO(X.where(pp, *has, col[XMX_SP_PRES], *zero, s));
		XMX_DO(X.add(pen, *cf, *pp, s));
		XMX_DO(X.subtract(lc, *l, *pen, s));
		l = lc;
	}
	XMX_T(gtok)
	XMX_DO(X.argmax_axis(gtok, *l, -1, false, s));
	xmx_array* pick = gtok;
	if (sampled) {
		XMX_T(nan) XMX_T(ni) XMX_T(inval) XMX_T(valid) XMX_T(lv) XMX_T(validf) XMX_T(nvalid)
		XMX_DO(X.is_nan(nan, *l, s));
		XMX_DO(X.is_neginf(ni, *l, s));
		XMX_DO(X.logical_or(inval, *nan, *ni, s));
		XMX_DO(X.logical_not(valid, *inval, s));
		XMX_DO(X.where(lv, *valid, *l, *ninf, s));
		XMX_DO(X.astype(validf, *valid, XMX_FLOAT32, s));
		XMX_DO(X.sum_axis(nvalid, *validf, -1, true, s)); // [B, 1]
		xmx_array* keep = valid;
		xmx_array* order = NULL;
		if (sorted) { // top-k: keep the logits ≥ the k-th largest (ties with it stay)
			XMX_T(nl) XMX_T(ord) XMX_T(sl) XMX_T(kpos) XMX_T(km1) XMX_T(kdef) XMX_T(kcl) XMX_T(kidx) XMX_T(kth) XMX_T(ge) XMX_T(kp) XMX_T(vm1)
			XMX_DO(X.negative(nl, *lv, s));
			XMX_DO(X.argsort_axis(ord, *nl, -1, s)); // stable: equal logits by id
			XMX_DO(X.take_along_axis(sl, *lv, *ord, -1, s));
			XMX_DO(X.greater(kpos, col[XMX_SP_TOPK], *zero, s));
			XMX_DO(X.subtract(km1, col[XMX_SP_TOPK], *one, s));
			if (rc == 0) { *vm1 = X.array_new_float32((float)(V - 1)); rc = vm1->ctx == NULL; }
			XMX_DO(X.where(kdef, *kpos, *km1, *vm1, s));
			XMX_DO(X.minimum(kcl, *kdef, *vm1, s));
			XMX_DO(X.astype(kidx, *kcl, XMX_INT32, s));
			XMX_DO(X.take_along_axis(kth, sl[0], *kidx, -1, s)); // [B, 1]
			XMX_DO(X.greater_equal(ge, *lv, *kth, s));
			XMX_DO(X.logical_and(kp, *valid, *ge, s));
			keep = kp;
			order = ord;
		}
		// probabilities over the kept tokens, from the temperature-scaled logits
		XMX_T(sc) XMX_T(smax) XMX_T(d) XMX_T(e) XMX_T(ek) XMX_T(sum) XMX_T(p) XMX_T(pmax) XMX_T(keepf) XMX_T(n)
		XMX_T(cut) XMX_T(geq) XMX_T(eqm) XMX_T(either) XMX_T(keep2) XMX_T(w) XMX_T(U)
		XMX_DO(X.multiply(sc, *lv, col[XMX_SP_INVT], s));
		XMX_DO(X.max_axis(smax, *sc, -1, true, s));
		XMX_DO(X.subtract(d, *sc, *smax, s));
		XMX_DO(X.exp(e, *d, s));
		XMX_DO(X.where(ek, *keep, *e, *zero, s));
		XMX_DO(X.sum_axis(sum, *ek, -1, true, s));
		XMX_DO(X.divide(p, *ek, *sum, s));
		XMX_DO(X.max_axis(pmax, *p, -1, true, s));
		XMX_DO(X.astype(keepf, *keep, XMX_FLOAT32, s));
		XMX_DO(X.sum_axis(n, *keepf, -1, true, s));
		XMX_DO(X.multiply(cut, col[XMX_SP_MINP], *pmax, s)); // min-p
		if (topp) { // and top-p's lower bound ((1-p)/n·0.999: the nucleus lies above it)
			XMX_T(om) XMX_T(q) XMX_T(q9) XMX_T(c9) XMX_T(on) XMX_T(cp) XMX_T(nine)
			if (rc == 0) { *nine = X.array_new_float32(0.999f); rc = nine->ctx == NULL; }
			XMX_DO(X.subtract(om, *one, col[XMX_SP_TOPP], s));
			XMX_DO(X.divide(q, *om, *n, s));
			XMX_DO(X.multiply(q9, *q, *nine, s));
			XMX_DO(X.greater(on, col[XMX_SP_TOPPON], *zero, s));
			XMX_DO(X.where(c9, *on, *q9, *zero, s));
			XMX_DO(X.maximum(cp, *cut, *c9, s));
			cut = cp;
		}
		XMX_DO(X.greater_equal(geq, *p, *cut, s));
		XMX_DO(X.equal(eqm, *p, *pmax, s));
		XMX_DO(X.logical_or(either, *geq, *eqm, s));
		XMX_DO(X.logical_and(keep2, *keep, *either, s));
		XMX_DO(X.where(w, *keep2, *p, *zero, s));
		if (rc == 0) { int ush[2] = {B, 1}; rc = X.reshape(U, u, ush, 2, s); }
		// inverse CDF in id order: the first token whose cumulative weight exceeds u·total
		XMX_T(tot) XMX_T(tgt) XMX_T(cum) XMX_T(le) XMX_T(lei) XMX_T(j) XMX_T(ar) XMX_T(m1) XMX_T(lastc) XMX_T(last) XMX_T(tokI)
		XMX_DO(X.sum_axis(tot, *w, -1, true, s));
		XMX_DO(X.multiply(tgt, *U, *tot, s));
		XMX_DO(X.cumsum(cum, *w, -1, false, true, s));
		XMX_DO(X.less_equal(le, *cum, *tgt, s));
		XMX_DO(X.astype(lei, *le, XMX_INT32, s));
		XMX_DO(X.sum_axis(j, *lei, -1, true, s)); // [B, 1]
		XMX_DO(X.arange(ar, 0, V, 1, XMX_INT32, s));
		if (rc == 0) { *m1 = X.array_new_float32(-1); rc = m1->ctx == NULL; }
		XMX_T(m1i) XMX_DO(X.astype(m1i, *m1, XMX_INT32, s));
		XMX_DO(X.where(lastc, *keep2, *ar, *m1i, s));
		XMX_DO(X.max_axis(last, *lastc, -1, true, s));
		XMX_DO(X.minimum(tokI, *j, *last, s)); // [B, 1]
		xmx_array* sampledTok = tokI;
		if (topp && order != NULL) { // inverse CDF over the nucleus, by descending logit
			XMX_T(ps) XMX_T(ks) XMX_T(excl) XMX_T(inn) XMX_T(kn) XMX_T(ws) XMX_T(tot2) XMX_T(tgt2) XMX_T(cum2) XMX_T(le2)
			XMX_T(le2i) XMX_T(j2) XMX_T(knf) XMX_T(cnt) XMX_T(lastp) XMX_T(lpi) XMX_T(j2c) XMX_T(tokS) XMX_T(tokSi) XMX_T(on2) XMX_T(mix) XMX_T(onei)
			XMX_DO(X.take_along_axis(ps, *w, *order, -1, s));
			XMX_DO(X.take_along_axis(ks, *keep2, *order, -1, s));
			XMX_DO(X.cumsum(excl, *ps, -1, false, false, s));
			XMX_DO(X.less(inn, *excl, col[XMX_SP_TOPP], s));
			XMX_DO(X.logical_and(kn, *ks, *inn, s));
			XMX_DO(X.where(ws, *kn, *ps, *zero, s));
			XMX_DO(X.sum_axis(tot2, *ws, -1, true, s));
			XMX_DO(X.multiply(tgt2, *U, *tot2, s));
			XMX_DO(X.cumsum(cum2, *ws, -1, false, true, s));
			XMX_DO(X.less_equal(le2, *cum2, *tgt2, s));
			XMX_DO(X.astype(le2i, *le2, XMX_INT32, s));
			XMX_DO(X.sum_axis(j2, *le2i, -1, true, s));
			XMX_DO(X.astype(knf, *kn, XMX_INT32, s));
			XMX_DO(X.sum_axis(cnt, *knf, -1, true, s));
			XMX_DO(X.astype(onei, *one, XMX_INT32, s));
			XMX_DO(X.subtract(lastp, *cnt, *onei, s));
			XMX_DO(X.minimum(j2c, *j2, *lastp, s));
			XMX_DO(X.astype(lpi, *j2c, XMX_INT32, s));
			XMX_DO(X.take_along_axis(tokS, *order, *lpi, -1, s));
			XMX_DO(X.astype(tokSi, *tokS, XMX_INT32, s));
			XMX_DO(X.greater(on2, col[XMX_SP_TOPPON], *zero, s));
			XMX_DO(X.where(mix, *on2, *tokSi, *tokI, s));
			sampledTok = mix;
		}
		// greedy rows, and rows with no candidate at all, take the argmax
		XMX_T(g) XMX_T(none) XMX_T(useg) XMX_T(gt2) XMX_T(gti) XMX_T(both)
		XMX_DO(X.greater(g, col[XMX_SP_GREEDY], *zero, s));
		XMX_DO(X.less_equal(none, *nvalid, *zero, s));
		XMX_DO(X.logical_or(useg, *g, *none, s));
		if (rc == 0) { int sh[2] = {B, 1}; rc = X.reshape(gt2, *gtok, sh, 2, s); }
		XMX_DO(X.astype(gti, *gt2, XMX_INT32, s));
		XMX_DO(X.where(both, *useg, *gti, *sampledTok, s));
		pick = both;
	}
	XMX_T(flat)
	if (rc == 0) { int sh[1] = {B}; rc = X.reshape(flat, *pick, sh, 1, s); }
	XMX_DO(X.astype(tok, *flat, XMX_INT32, s));
	if ((seen.ctx != NULL || counts.ctx != NULL) && rc == 0) {
		XMX_T(ar) XMX_T(t2) XMX_T(hit) XMX_T(hitf)
		XMX_DO(X.arange(ar, 0, V, 1, XMX_INT32, s));
		if (rc == 0) { int sh[2] = {B, 1}; rc = X.reshape(t2, *tok, sh, 2, s); }
		XMX_DO(X.equal(hit, *ar, *t2, s));
		XMX_DO(X.astype(hitf, *hit, XMX_FLOAT32, s));
		if (seen.ctx != NULL) XMX_DO(X.maximum(seen_out, seen, *hitf, s));
		if (counts.ctx != NULL) XMX_DO(X.add(counts_out, counts, *hitf, s));
	}
out:
	for (int i = 0; i < XMX_SP_N; i++) if (col[i].ctx) X.array_free(col[i]);
	xmx_drain(&pool);
	return rc;
}

// xmx_logprobs computes, for logits [B, V] and tok [B] (int32), the
// log-softmax at each row's token (chosen [B] float32) and, with top > 0,
// the top ids [B, top] (int32, by descending logit, ties by id: a stable
// sort) and their log-softmax vals [B, top], as sample.Logprobs (NaN
// logits count as -Inf).
int xmx_logprobs(xmx_array* chosen, xmx_array* ids, xmx_array* vals, xmx_array logits, xmx_array tok, int top, xmx_stream s) {
	if (!xmx_has_sample() || !X.log) { snprintf(xmx_err, sizeof xmx_err, "mlx-c lacks the ops of device logprobs"); return 3; }
	xmx_pool pool = {.n = 0};
	int rc = 0;
	const int* ls = X.array_shape(logits);
	int B = ls[0];
	XMX_T(ninf) XMX_T(l) XMX_T(nan) XMX_T(lv) XMX_T(mx) XMX_T(d) XMX_T(e) XMX_T(sum) XMX_T(lg) XMX_T(lse) XMX_T(lp)
	XMX_T(t2) XMX_T(ch)
	if (rc == 0) { *ninf = X.array_new_float32(-INFINITY); rc = ninf->ctx == NULL; }
	XMX_DO(X.astype(l, logits, XMX_FLOAT32, s));
	XMX_DO(X.is_nan(nan, *l, s));
	XMX_DO(X.where(lv, *nan, *ninf, *l, s));
	XMX_DO(X.max_axis(mx, *lv, -1, true, s));
	XMX_DO(X.subtract(d, *lv, *mx, s));
	XMX_DO(X.exp(e, *d, s));
	XMX_DO(X.sum_axis(sum, *e, -1, true, s));
	XMX_DO(X.log(lg, *sum, s));
	XMX_DO(X.add(lse, *mx, *lg, s));
	XMX_DO(X.subtract(lp, *lv, *lse, s)); // [B, V]
	if (rc == 0) { int sh[2] = {B, 1}; rc = X.reshape(t2, tok, sh, 2, s); }
	XMX_DO(X.take_along_axis(ch, *lp, *t2, -1, s));
	if (rc == 0) { int sh[1] = {B}; rc = X.reshape(chosen, *ch, sh, 1, s); }
	if (top > 0 && rc == 0) {
		XMX_T(nl) XMX_T(ord) XMX_T(ti)
		XMX_DO(X.negative(nl, *lv, s));
		XMX_DO(X.argsort_axis(ord, *nl, -1, s)); // stable: equal logits by id
		if (rc == 0) {
			int start[2] = {0, 0}, stop[2] = {B, top}, str[2] = {1, 1};
			rc = X.slice(ti, *ord, start, 2, stop, 2, str, 2, s);
		}
		XMX_DO(X.astype(ids, *ti, XMX_INT32, s));
		XMX_DO(X.take_along_axis(vals, *lp, *ids, -1, s));
	}
out:
	xmx_drain(&pool);
	return rc;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// library is the process-wide libmlxc: a shared object can be loaded once
// per process, so the first successful load fixes its path for every
// backend made afterwards.
var library struct {
	sync.Mutex
	path    string
	version string
}

// libName is the file name of libmlxc and of the libmlx it needs.
func libNames() (mlxc, mlx string) {
	if runtime.GOOS == "darwin" {
		return "libmlxc.dylib", "libmlx.dylib"
	}
	return "libmlxc.so", "libmlx.so"
}

// loadLibrary loads libmlxc from the first candidate that works and installs
// our error handler before any other mlx-c call. It returns the path and
// MLX's version, or an error wrapping ErrUnavailable listing every attempt.
func loadLibrary(opts Options) (path, version string, err error) {
	library.Lock()
	defer library.Unlock()
	if library.path != "" {
		if opts.LibPath != "" && filepath.Clean(opts.LibPath) != library.path {
			return "", "", fmt.Errorf("%w: %s requested but %s is already loaded in this process",
				ErrUnavailable, opts.LibPath, library.path)
		}
		return library.path, library.version, nil
	}
	mlxcName, mlxName := libNames()
	exe, _ := os.Executable()
	var tried []string
	for _, cand := range candidates(opts.LibPath, os.Getenv(EnvLibPath), exe, mlxcName) {
		preload := ""
		if filepath.IsAbs(cand) {
			preload = filepath.Join(filepath.Dir(cand), mlxName)
			if _, statErr := os.Stat(preload); statErr != nil {
				preload = ""
			}
			if _, statErr := os.Stat(cand); statErr != nil {
				tried = append(tried, fmt.Sprintf("%s: no such file", cand))
				continue
			}
		}
		cpath := C.CString(cand)
		cpre := C.CString(preload)
		var buf [1024]C.char
		rc := C.xmx_load(cpath, cpre, &buf[0], C.size_t(len(buf)))
		C.free(unsafe.Pointer(cpath))
		C.free(unsafe.Pointer(cpre))
		if rc != 0 {
			msg := C.GoString(&buf[0])
			if !strings.Contains(msg, cand) {
				msg = cand + ": " + msg
			}
			tried = append(tried, msg)
			continue
		}
		// mlx-c's default handler prints and exits the process: replace it
		// before anything else can fail.
		C.xmx_install_error_handler()
		var vbuf [64]C.char
		if C.xmx_version(&vbuf[0], C.size_t(len(vbuf))) == 0 {
			library.version = C.GoString(&vbuf[0])
		}
		library.path = cand
		if filepath.IsAbs(cand) {
			library.path = filepath.Clean(cand)
		}
		return library.path, library.version, nil
	}
	return "", "", fmt.Errorf("%w: tried %v", ErrUnavailable, tried)
}
