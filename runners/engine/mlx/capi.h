// Our own declarations of the small part of the mlx-c API this package uses,
// and of the C shims (defined in capi.go) that call mlx-c through function
// pointers found with dlsym. Nothing here comes from mlx-c's headers: the
// layouts below are the ABI mlx-c documents (every handle is a struct holding
// one pointer; optionals are a value followed by a bool; dtypes are a C enum).
#ifndef EXO_MLX_CAPI_H
#define EXO_MLX_CAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct { void* ctx; } xmx_array;
typedef struct { void* ctx; } xmx_stream;
typedef struct { void* ctx; } xmx_device;
typedef struct { void* ctx; } xmx_vector_array;
typedef struct { void* ctx; } xmx_string;
typedef struct { void* ctx; } xmx_closure;
typedef struct { void* ctx; } xmx_io_reader;
typedef struct { void* ctx; } xmx_map; // mlx_map_string_to_array or _to_string
typedef struct {
	bool (*is_open)(void*);
	bool (*good)(void*);
	size_t (*tell)(void*);
	void (*seek)(void*, int64_t off, int whence);
	void (*read)(void*, char* data, size_t n);
	void (*read_at_offset)(void*, char* data, size_t n, size_t off);
	void (*write)(void*, const char* data, size_t n);
	const char* (*label)(void*);
	void (*free)(void*);
} xmx_io_vtable; // mlx_io_vtable
typedef struct { int value; bool has_value; } xmx_opt_int;
typedef struct { float value; bool has_value; } xmx_opt_float;
typedef struct { int value; bool has_value; } xmx_opt_dtype;

// mlx_dtype values (mlx-c's enum order).
enum {
	XMX_BOOL = 0,
	XMX_UINT8 = 1,
	XMX_UINT16 = 2,
	XMX_UINT32 = 3,
	XMX_UINT64 = 4,
	XMX_INT8 = 5,
	XMX_INT16 = 6,
	XMX_INT32 = 7,
	XMX_INT64 = 8,
	XMX_FLOAT16 = 9,
	XMX_FLOAT32 = 10,
	XMX_FLOAT64 = 11,
	XMX_BFLOAT16 = 12,
};

// Loading. xmx_load returns 0 when libmlxc at path (and every required
// symbol) loaded; otherwise non-zero with a message in err.
int xmx_load(const char* path, const char* preload, char* err, size_t errlen);
void xmx_install_error_handler(void);
const char* xmx_last_error(void);
void xmx_clear_error(void);
int xmx_version(char* buf, size_t n);
int xmx_has_qmm(void);

// Devices, streams, memory.
int xmx_device_new(xmx_device* dev, int gpu);
int xmx_device_free(xmx_device dev);
int xmx_device_available(bool* res, xmx_device dev);
int xmx_default_stream(xmx_stream* res, xmx_device dev);
int xmx_stream_free(xmx_stream s);
int xmx_synchronize(xmx_stream s);
int xmx_active_memory(size_t* res);
int xmx_cache_memory(size_t* res);
int xmx_clear_cache(void);
int xmx_peak_memory(size_t* res);   // 3 when the library lacks it
int xmx_reset_peak_memory(void);

// Arrays.
int xmx_array_free(xmx_array a);
// xmx_array_free_n frees n handles in one crossing.
void xmx_array_free_n(const xmx_array* a, size_t n);
int xmx_array_from(xmx_array* res, const void* data, const int* shape, int ndim, int dtype);
// xmx_array_load: an array from bytes through mlx_load_safetensors_reader
// (hdr: the one-tensor JSON header, tensor "w"), evaluated; on Linux with
// huge != 0 the buffer's 2 MiB-aligned interior is advised as huge pages
// before the copy (*advised: MiB advised). xmx_has_reader_load is 0 when
// the library lacks the functions it needs.
int xmx_has_reader_load(void);
int xmx_array_load(xmx_array* res, const char* hdr, size_t hdrlen, const void* data, size_t n, int huge, int* advised, xmx_stream s);
int xmx_scalar_f32(xmx_array* res, float v);
size_t xmx_ndim(xmx_array a);
const int* xmx_shape(xmx_array a);
int xmx_dtype(xmx_array a);
// xmx_info is xmx_ndim, xmx_shape and xmx_dtype in one call (one cgo
// crossing per op result instead of three).
typedef struct {
  const int* shape;
  size_t ndim;
  int dtype;
} xmx_info_t;
xmx_info_t xmx_info(xmx_array a);
const void* xmx_data(xmx_array a, int dtype);
int xmx_eval(const xmx_array* arrs, size_t n);
int xmx_async_eval(const xmx_array* arrs, size_t n);

// Ops: each writes its result into *res and returns 0, or non-zero after
// the error handler recorded the message.
int xmx_add(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s);
int xmx_multiply(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s);
int xmx_matmul(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s);
int xmx_sigmoid(xmx_array* res, xmx_array a, xmx_stream s);
int xmx_tanh(xmx_array* res, xmx_array a, xmx_stream s);
int xmx_minimum(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s);
int xmx_maximum(xmx_array* res, xmx_array a, xmx_array b, xmx_stream s);
int xmx_contiguous(xmx_array* res, xmx_array a, xmx_stream s);
int xmx_transpose(xmx_array* res, xmx_array a, const int* axes, size_t n, xmx_stream s);
int xmx_expand_dims(xmx_array* res, xmx_array a, int axis, xmx_stream s);
int xmx_reshape(xmx_array* res, xmx_array a, const int* shape, size_t n, xmx_stream s);
int xmx_slice(xmx_array* res, xmx_array a, const int* start, const int* stop, const int* strides, size_t n, xmx_stream s);
int xmx_slice_update(xmx_array* res, xmx_array src, xmx_array upd, const int* start, const int* stop, const int* strides, size_t n, xmx_stream s);
int xmx_concat(xmx_array* res, const xmx_array* arrs, size_t n, int axis, xmx_stream s);
int xmx_astype(xmx_array* res, xmx_array a, int dtype, xmx_stream s);
int xmx_view(xmx_array* res, xmx_array a, int dtype, xmx_stream s);
int xmx_softmax(xmx_array* res, xmx_array a, int axis, xmx_stream s);
int xmx_argmax(xmx_array* res, xmx_array a, int axis, xmx_stream s);
int xmx_take(xmx_array* res, xmx_array a, xmx_array idx, int axis, xmx_stream s);
int xmx_zeros(xmx_array* res, const int* shape, size_t n, int dtype, xmx_stream s);
int xmx_qmm(xmx_array* res, xmx_array x, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, xmx_stream s);
int xmx_dequantize(xmx_array* res, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, xmx_stream s);
// The _mode forms take MLX's quantization mode ("affine", "mxfp4").
int xmx_qmm_mode(xmx_array* res, xmx_array x, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, const char* mode, xmx_stream s);
int xmx_dequantize_mode(xmx_array* res, xmx_array w, xmx_array scales, xmx_array biases, int group, int bits, const char* mode, xmx_stream s);
int xmx_rms_norm(xmx_array* res, xmx_array x, xmx_array w, float eps, xmx_stream s);
int xmx_rope(xmx_array* res, xmx_array x, int dims, bool has_base, float base, float scale, int offset, xmx_array freqs, xmx_stream s);
// MoE routing (optional symbols: a library without them fails only the
// ops that need them, with the missing name).
int xmx_argpartition(xmx_array* res, xmx_array a, int kth, int axis, xmx_stream s);
int xmx_argsort(xmx_array* res, xmx_array a, int axis, xmx_stream s);
int xmx_take_along_axis(xmx_array* res, xmx_array a, xmx_array idx, int axis, xmx_stream s);
int xmx_put_along_axis(xmx_array* res, xmx_array a, xmx_array idx, xmx_array values, int axis, xmx_stream s);
bool xmx_has_put_along_axis(void);
int xmx_rope_dynamic(xmx_array* res, xmx_array x, int dims, bool has_base, float base, float scale, xmx_array offset, xmx_array freqs, xmx_stream s);
bool xmx_has_rope_dynamic(void);
int xmx_gather_mm(xmx_array* res, xmx_array a, xmx_array b, xmx_array rhs, bool sorted, xmx_stream s);
int xmx_gather_qmm(xmx_array* res, xmx_array x, xmx_array w, xmx_array scales, xmx_array biases, xmx_array rhs, int group, int bits, const char* mode, bool sorted, xmx_stream s);
// Gated delta rule (optional symbols as above): the float32 gates, and the
// recurrence over L tokens built from MLX ops in one call.
int xmx_delta_gates(xmx_array* g, xmx_array* beta, xmx_array a, xmx_array b, xmx_array alog, xmx_array dtbias, xmx_stream s);
int xmx_gated_delta(xmx_array* y, xmx_array* state_out, xmx_array q, xmx_array k, xmx_array v, xmx_array g, xmx_array beta, xmx_array state, int L, int hv, int dv, int dk, int rep, xmx_stream s);
int xmx_gated_delta_chunked(xmx_array* y, xmx_array* state_out, xmx_array q, xmx_array k, xmx_array v, xmx_array g, xmx_array beta, xmx_array state, int L, int hv, int dv, int dk, int rep, int chunk, xmx_stream s);
// Device sampling (engine.SampleRows): the columns of its params [B, XMX_SP_N].
enum { XMX_SP_INVT, XMX_SP_GREEDY, XMX_SP_TOPK, XMX_SP_TOPP, XMX_SP_TOPPON, XMX_SP_MINP, XMX_SP_REP, XMX_SP_PRES, XMX_SP_FREQ, XMX_SP_N };
int xmx_has_sample(void);
int xmx_sample_rows(xmx_array* tok, xmx_array* seen_out, xmx_array* counts_out, xmx_array logits, xmx_array params,
	xmx_array u, xmx_array mask, xmx_array bias, xmx_array seen, xmx_array counts, int sampled, int sorted, int topp, xmx_stream s);
int xmx_logprobs(xmx_array* chosen, xmx_array* ids, xmx_array* vals, xmx_array logits, xmx_array tok, int top, xmx_stream s);
int xmx_sdpa3(xmx_array* res, xmx_array q, xmx_array k, xmx_array v, float scale, const char* mask_mode, xmx_stream s);
// xmx_sdpa_ext takes an explicit mask array (additive, mask_mode "") and
// per-head sinks [H]; either may be {NULL}.
int xmx_sdpa_ext(xmx_array* res, xmx_array q, xmx_array k, xmx_array v, float scale, const char* mask_mode, xmx_array mask, xmx_array sinks, xmx_stream s);

// Compiled (fused) SwiGLU: silu(gate) * up traced once, shapeless, with
// mlx_compile. xmx_has_compile is 0 when the library lacks mlx_compile.
int xmx_has_compile(void);
int xmx_swiglu(xmx_array* res, xmx_array gate, xmx_array up, xmx_stream s);
int xmx_swiglu_compile(xmx_closure* res, xmx_stream s);
int xmx_apply2(xmx_array* res, xmx_closure f, xmx_array a, xmx_array b);
// On MLX's CPU backend (where fast::rms_norm and fast::rope are graphs of
// ops built anew each call): rms_norm compiled for one eps (shapeless: one
// closure per norm width), and rope's rotation compiled, applied with
// cosine and sine tables the caller keeps (xmx_rope_apply).
int xmx_rms_compile(xmx_closure* res, float eps, xmx_stream s);
int xmx_rope_compile(xmx_closure* res, xmx_stream s);
int xmx_rope_apply(xmx_array* res, xmx_closure f, xmx_array x, xmx_array c, xmx_array s, int dims, xmx_stream st);
int xmx_closure_free(xmx_closure c);

#endif
