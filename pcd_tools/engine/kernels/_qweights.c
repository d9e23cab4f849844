/* GGUF weights kept in their file encoding: dequantization to float32, row by row, and
 * the float32 product of activations with a quantized matrix over a reused scratch.
 *
 * Dequantization repeats gguf-py's `gguf.quants.dequantize` operation for operation (the
 * same float32 products and sums in the same order, no fused multiply-add: the file is
 * compiled with -ffp-contract=off), so its output is bit-identical to gguf-py's and to
 * what the dense load path stores.
 *
 * `pcd_q_matmul` computes y = x W^T for a quantized W (n_out rows of k weights): it
 * dequantizes a panel of W's rows at a time into the caller's scratch (on `threads`
 * threads) and multiplies it with the bound BLAS (`cblas_sgemm`, passed in as a pointer),
 * the same call MLX makes for a dense float32 Linear. Only one panel of float32 weights
 * exists at a time.
 *
 * The row loops are plain C that the compiler vectorises. Each type's row is one portable
 * body built three times: `_generic` (baseline x86-64 or the host's, the reference),
 * `_avx2` and `_avx512` (x86 only); a table per type holds the three, and the path is
 * chosen once, at the first call, from the running CPU (or forced with `pcd_q_path`, for
 * tests). Every copy runs the same float32 operations element by element, so all give
 * the same bits. Built and loaded by pcd_tools.engine.kernels.bindings.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define X86 1
#else
#define X86 0
#endif

typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int,
                        const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static float half_table[65536];
static int half_ready = 0;

/* The float16 scales through a table of the 65536 halves (filled by init_half). */
#define GGUF_FP16(p) half_table[(p)[0] | ((p)[1] << 8)]
#include "gguf_blocks.h"

static void init_half(void) {
    if (__atomic_load_n(&half_ready, __ATOMIC_ACQUIRE)) return;
    for (uint32_t i = 0; i < 65536; i++) half_table[i] = gguf_half_bits(i);
    __atomic_store_n(&half_ready, 1, __ATOMIC_RELEASE);
}

/* Bytes and weights of one block of each supported type; 0 for an unsupported type. */
int pcd_q_block(int type, int *weights) {
    switch (type) {
    case GGUF_F32: *weights = 1; return 4;
    case GGUF_F16: *weights = 1; return 2;
    case GGUF_BF16: *weights = 1; return 2;
    default: return gguf_block_bytes(type, weights);
    }
}

/* ---- one row of k weights, each type ------------------------------------------------ */

GGUF_INLINE void row_f32(const uint8_t *restrict s, float *restrict y, int64_t k) {
    memcpy(y, s, (size_t)k * 4);
}

GGUF_INLINE void row_f16(const uint8_t *restrict s, float *restrict y, int64_t k) {
    const uint16_t *h = (const uint16_t *)s;
    for (int64_t i = 0; i < k; i++) y[i] = half_table[h[i]];
}

GGUF_INLINE void row_bf16(const uint8_t *restrict s, float *restrict y, int64_t k) {
    const uint16_t *h = (const uint16_t *)s;
    uint32_t *o = (uint32_t *)y;
    for (int64_t i = 0; i < k; i++) o[i] = (uint32_t)h[i] << 16;
}

/* The quantized types: each block decoded by gguf_blocks.h into int8 quants q and a scale
 * s (and minimum m) per group, then w = s * q (+ m) in float32, as gguf-py computes it. */
#define ROW_BLOCKS(NAME, TYPE)                                                              \
    GGUF_INLINE void NAME(const uint8_t *restrict s, float *restrict y, int64_t k) {       \
        int per, bytes = gguf_block_bytes(TYPE, &per);                                     \
        const int gs = gguf_group_shift(TYPE);                                             \
        int8_t q[GGUF_QK_K];                                                               \
        float sc[16], mn[16];                                                              \
        for (int64_t b = 0; b < k / per; b++, s += bytes, y += per) {                      \
            gguf_block_scales(TYPE, s, sc, mn);                                            \
            gguf_block_quants(TYPE, s, q);                                                 \
            for (int g = 0; g < per >> gs; g++) {                                          \
                const float d = sc[g], m = mn[g];                                          \
                const int8_t *qg = q + (g << gs);                                          \
                float *yg = y + (g << gs);                                                 \
                if (gguf_has_min(TYPE))                                                    \
                    for (int j = 0; j < 1 << gs; j++) yg[j] = d * (float)qg[j] + m;        \
                else                                                                       \
                    for (int j = 0; j < 1 << gs; j++) yg[j] = d * (float)qg[j];            \
            }                                                                              \
        }                                                                                  \
    }

ROW_BLOCKS(row_q4_0, GGUF_Q4_0)
ROW_BLOCKS(row_q4_1, GGUF_Q4_1)
ROW_BLOCKS(row_q5_0, GGUF_Q5_0)
ROW_BLOCKS(row_q5_1, GGUF_Q5_1)
ROW_BLOCKS(row_q8_0, GGUF_Q8_0)
ROW_BLOCKS(row_q2_k, GGUF_Q2_K)
ROW_BLOCKS(row_q3_k, GGUF_Q3_K)
ROW_BLOCKS(row_q4_k, GGUF_Q4_K)
ROW_BLOCKS(row_q5_k, GGUF_Q5_K)
ROW_BLOCKS(row_q6_k, GGUF_Q6_K)

typedef void (*row_fn)(const uint8_t *restrict, float *restrict, int64_t);

/* ---- the path, chosen once; one table of row kernels per type ----------------------- */

enum { PATH_AUTO = 0, PATH_GENERIC = 1, PATH_AVX2 = 2, PATH_AVX512 = 3, N_PATHS = 4 };

/* NAME's copies: the portable reference and, on x86, AVX2 and AVX-512 builds of it. */
#if X86
#define ROW_COPIES(NAME)                                                                   \
    static void NAME##_generic(const uint8_t *restrict s, float *restrict y, int64_t k) {  \
        NAME(s, y, k);                                                                     \
    }                                                                                      \
    __attribute__((target("avx2"))) static void NAME##_avx2(                               \
        const uint8_t *restrict s, float *restrict y, int64_t k) {                         \
        NAME(s, y, k);                                                                     \
    }                                                                                      \
    __attribute__((target("avx512f"))) static void NAME##_avx512(                          \
        const uint8_t *restrict s, float *restrict y, int64_t k) {                         \
        NAME(s, y, k);                                                                     \
    }
#define ROW_TABLE(TYPE, NAME) {TYPE, {0, NAME##_generic, NAME##_avx2, NAME##_avx512}}
#else
#define ROW_COPIES(NAME)                                                                   \
    static void NAME##_generic(const uint8_t *restrict s, float *restrict y, int64_t k) {  \
        NAME(s, y, k);                                                                     \
    }
#define ROW_TABLE(TYPE, NAME) {TYPE, {0, NAME##_generic, 0, 0}}
#endif

ROW_COPIES(row_f32)
ROW_COPIES(row_f16)
ROW_COPIES(row_bf16)
ROW_COPIES(row_q4_0)
ROW_COPIES(row_q4_1)
ROW_COPIES(row_q5_0)
ROW_COPIES(row_q5_1)
ROW_COPIES(row_q8_0)
ROW_COPIES(row_q2_k)
ROW_COPIES(row_q3_k)
ROW_COPIES(row_q4_k)
ROW_COPIES(row_q5_k)
ROW_COPIES(row_q6_k)

/* Per type, its row kernel on each path (indexed by PATH_*; 0 where not built). */
static const struct {
    int type;
    row_fn fn[N_PATHS];
} ROWS[] = {
    ROW_TABLE(GGUF_F32, row_f32),   ROW_TABLE(GGUF_F16, row_f16),   ROW_TABLE(GGUF_BF16, row_bf16),
    ROW_TABLE(GGUF_Q4_0, row_q4_0), ROW_TABLE(GGUF_Q4_1, row_q4_1), ROW_TABLE(GGUF_Q5_0, row_q5_0),
    ROW_TABLE(GGUF_Q5_1, row_q5_1), ROW_TABLE(GGUF_Q8_0, row_q8_0), ROW_TABLE(GGUF_Q2_K, row_q2_k),
    ROW_TABLE(GGUF_Q3_K, row_q3_k), ROW_TABLE(GGUF_Q4_K, row_q4_k), ROW_TABLE(GGUF_Q5_K, row_q5_k),
    ROW_TABLE(GGUF_Q6_K, row_q6_k),
};

/* Whether this CPU runs `path`'s copies. */
static int path_runs(int path) {
    switch (path) {
    case PATH_GENERIC: return 1;
#if X86
    case PATH_AVX2: return __builtin_cpu_supports("avx2");
    case PATH_AVX512: return __builtin_cpu_supports("avx512f");
#endif
    default: return 0;
    }
}

static int g_path; /* the path the row kernels take; 0 until the first call chooses it */

/* With PATH_AUTO: the path the row kernels take (the fastest this CPU runs, chosen once).
 * Otherwise force `path` (PATH_*) where this CPU runs it and return it, else return 0. */
int pcd_q_path(int path) {
    if (path == PATH_AUTO) {
        int p = __atomic_load_n(&g_path, __ATOMIC_ACQUIRE);
        if (p) return p;
        p = path_runs(PATH_AVX512) ? PATH_AVX512 : path_runs(PATH_AVX2) ? PATH_AVX2 : PATH_GENERIC;
        __atomic_store_n(&g_path, p, __ATOMIC_RELEASE);
        return p;
    }
    if (path < 0 || path >= N_PATHS || !path_runs(path)) return 0;
    __atomic_store_n(&g_path, path, __ATOMIC_RELEASE);
    return path;
}

static row_fn row_for(int type) {
    int path = pcd_q_path(PATH_AUTO);
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++)
        if (ROWS[i].type == type) return ROWS[i].fn[path];
    return 0;
}

/* ---- rows on threads ---------------------------------------------------------------- */

typedef struct {
    row_fn fn;
    const uint8_t *src;
    int64_t row_bytes, k, r0, n;
    const int32_t *rows; /* source row of output row i is rows[r0 + i], else r0 + i */
    float *out;
    int64_t out_stride;
    int parts;
} rows_job;

static void rows_part(rows_job *j, int part) {
    int64_t a = j->n * part / j->parts, b = j->n * (part + 1) / j->parts;
    for (int64_t i = a; i < b; i++) {
        int64_t r = j->rows ? (int64_t)j->rows[j->r0 + i] : j->r0 + i;
        j->fn(j->src + r * j->row_bytes, j->out + i * j->out_stride, j->k);
    }
}

typedef struct {
    rows_job *job;
    int part;
} rows_arg;

static void *rows_thread(void *p) {
    rows_arg *a = (rows_arg *)p;
    rows_part(a->job, a->part);
    return 0;
}

static void run_rows(rows_job *j, int threads) {
    if (threads > 64) threads = 64;
    if (threads > j->n) threads = (int)j->n;
    if (threads < 1) threads = 1;
    j->parts = threads;
    pthread_t tids[64];
    rows_arg args[64];
    int started[64] = {0};
    for (int t = 1; t < threads; t++) {
        args[t].job = j;
        args[t].part = t;
        started[t] = pthread_create(&tids[t], 0, rows_thread, &args[t]) == 0;
        if (!started[t]) rows_part(j, t);
    }
    rows_part(j, 0);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tids[t], 0);
}

/* Dequantizes rows [r0, r0 + n) of a (rows, k) tensor (through `rows` when not NULL) into
 * out (n x k floats). Returns 0, or -1 for an unsupported type or a k that is not a
 * multiple of the block. */
int pcd_q_dequant_rows(int type, const uint8_t *src, int64_t row_bytes, int64_t k,
                       const int32_t *rows, int64_t r0, int64_t n, float *out, int threads) {
    int per;
    row_fn fn = row_for(type);
    if (!fn || !pcd_q_block(type, &per) || k % per) return -1;
    init_half();
    rows_job j = {fn, src, row_bytes, k, r0, n, rows, out, k, 1};
    run_rows(&j, threads);
    return 0;
}

/* y (m x n_out, row stride ldy) = x (m x k) . W^T (+ bias), W the (n_out, k) quantized
 * matrix, one panel of `panel` rows of W at a time dequantized into scratch (panel x k
 * floats). A bias is copied into y first and the GEMM accumulates onto it (beta = 1), as
 * MLX's addmm does for a dense Linear with a bias: the same roundings. */
int pcd_q_matmul(void *gemm, int type, const uint8_t *src, int64_t row_bytes,
                 const int32_t *rows, int64_t n_out, int64_t k, const float *x, int64_t m,
                 float *y, int64_t ldy, int64_t panel, float *scratch, int threads,
                 const float *bias) {
    int per;
    row_fn fn = row_for(type);
    if (!gemm || !fn || !pcd_q_block(type, &per) || k % per || panel < 1) return -1;
    init_half();
    sgemm_t sgemm = (sgemm_t)gemm;
    if (bias)
        for (int64_t i = 0; i < m; i++) memcpy(y + i * ldy, bias, (size_t)n_out * 4);
    for (int64_t p0 = 0; p0 < n_out; p0 += panel) {
        int64_t pn = n_out - p0 < panel ? n_out - p0 : panel;
        rows_job j = {fn, src, row_bytes, k, p0, pn, rows, scratch, k, 1};
        run_rows(&j, threads);
        sgemm(ROW_MAJOR, NO_TRANS, TRANS, (int)m, (int)pn, (int)k, 1.0f, x, (int)k, scratch,
              (int)k, bias ? 1.0f : 0.0f, y + p0, (int)ldy);
    }
    return 0;
}
