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
 * body built three times: `_generic` (baseline x86-64 or the host's, the reference, at
 * PCD_PATH_SCALAR), `_avx2` and `_avx512` (x86 only), held in a table per type indexed
 * by path; each call resolves its `path` argument (PCD_PATH_AUTO, or one forced by tests)
 * with cpu_paths.h's rule, the one every C source of the engine follows. Every copy runs
 * the same float32 operations element by element, so all give the same bits. Most types
 * form each weight's quant where they convert it; Q8_0, Q2_K, Q4_K and Q5_K decode a
 * block's quants with gguf_blocks.h first (whichever measured faster, per type). Built
 * and loaded by pcd_tools.engine.kernels.bindings.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_paths.h"

#if PCD_X86 && defined(__GNUC__)
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

/* The quantized types' weights are w = s * q (+ m) in float32, as gguf-py computes them,
 * with gguf_blocks.h's scale s and minimum m per group. ROW_BLOCKS decodes each block's
 * int8 quants q with gguf_blocks.h into a buffer first, then converts them. */
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

/* Q8_0, Q2_K, Q4_K and Q5_K are fastest through the buffer (measured: Q4_K 8x faster
 * than converting as it decodes). The others are faster decoded and converted in one
 * loop (the buffer cost Q4_0, Q5_0, Q5_1 and Q6_K up to 4x): each weight's quant is
 * formed where it is converted, the same values as gguf_blocks.h's decoders form and
 * the same float32 products. */
ROW_BLOCKS(row_q8_0, GGUF_Q8_0)
ROW_BLOCKS(row_q2_k, GGUF_Q2_K)
ROW_BLOCKS(row_q4_k, GGUF_Q4_K)
ROW_BLOCKS(row_q5_k, GGUF_Q5_K)

/* Q4_0, Q4_1, Q5_0 and Q5_1: the nibbles of qs (and a fifth bit from qh, 0 for Q4_0 and
 * Q4_1), minus the type's offset; w = d q (+ m). */
#define ROW_B32(NAME, TYPE)                                                                 \
    GGUF_INLINE void NAME(const uint8_t *restrict s, float *restrict y, int64_t k) {       \
        const int one = gguf_b32_min(TYPE), five = gguf_b32_fifth(TYPE);                  \
        const int off = gguf_b32_off(TYPE);                                                \
        int per, bytes = gguf_block_bytes(TYPE, &per);                                     \
        for (int64_t b = 0; b < k / per; b++, s += bytes, y += per) {                      \
            float d, m;                                                                    \
            gguf_scales_b32(TYPE, s, &d, &m);                                              \
            const uint8_t *qs = s + 2 + 2 * one + 4 * five;                                \
            uint32_t h = 0;                                                                \
            if (five)                                                                      \
                memcpy(&h, s + 2 + 2 * one, 4);                                            \
            else /* h = 0 hidden from the optimiser: GCC then vectorises Q4_0 and Q4_1 */  \
                __asm__("" : "+r"(h)); /* as Q5's loop, 2.5x faster (measured) */          \
            for (int j = 0; j < 16; j++) {                                                 \
                int lo = (qs[j] & 15) | (int)(((h >> j) & 1) << 4);                        \
                int hi = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);                 \
                if (one) {                                                                 \
                    y[j] = d * (float)lo + m;                                              \
                    y[j + 16] = d * (float)hi + m;                                         \
                } else {                                                                   \
                    y[j] = d * (float)(lo - off);                                          \
                    y[j + 16] = d * (float)(hi - off);                                     \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }

ROW_B32(row_q4_0, GGUF_Q4_0)
ROW_B32(row_q4_1, GGUF_Q4_1)
ROW_B32(row_q5_0, GGUF_Q5_0)
ROW_B32(row_q5_1, GGUF_Q5_1)

/* Q3_K: 16 groups of 16; group g's 2-bit quants are bits 2 (g % 8 / 2) of qs[32 (g / 8)
 * + 16 (g % 2) ..], its high bit (set: no - 4) bit g / 2 of hmask[16 (g % 2) ..]. */
GGUF_INLINE void row_q3_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / GGUF_QK_K; b++, s += 110, y += GGUF_QK_K) {
        const uint8_t *hm = s, *qs = s + 32, *scales = s + 96;
        const float d = GGUF_FP16(s + 108);
        for (int g = 0; g < 16; g++) {
            /* gguf_scales_q3_k's scale g */
            int lo = g < 8 ? scales[g] & 15 : scales[g - 8] >> 4;
            int hi = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
            const float dl = d * (float)((lo | hi << 4) - 32);
            const int shift = ((g % 8) / 2) * 2, off = (g % 2) * 16, hbit = g / 2;
            const uint8_t *q = qs + (g / 8) * 32 + off, *h = hm + off;
            for (int j = 0; j < 16; j++) {
                int ql = (q[j] >> shift) & 3;
                int qh = ((h[j] >> hbit) & 1) ^ 1;
                y[g * 16 + j] = dl * (float)(ql - (qh << 2));
            }
        }
    }
}

/* Q6_K: 8 runs of 32 (run r = 4 (r / 4) + quarter): the low nibbles of ql[64 (r / 4) +
 * 32 (quarter % 2) ..] (shifted by 4 (quarter / 2)), the 2 bits 2 quarter of qh[32 (r /
 * 4) ..], minus 32; its two halves take scales 2r and 2r + 1. */
GGUF_INLINE void row_q6_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / GGUF_QK_K; b++, s += 210, y += GGUF_QK_K) {
        float sc[16], mn[16];
        gguf_scales_q6_k(s, sc, mn);
        for (int r = 0; r < 8; r++) {
            const int half = r / 4, quarter = r % 4;
            const uint8_t *l = s + half * 64 + (quarter % 2) * 32, *h = s + 128 + half * 32;
            const int lshift = (quarter / 2) * 4, hshift = quarter * 2;
            const float d0 = sc[2 * r], d1 = sc[2 * r + 1];
            for (int j = 0; j < 32; j++) {
                int v = (((l[j] >> lshift) & 15) | (((h[j] >> hshift) & 3) << 4)) - 32;
                y[r * 32 + j] = (j < 16 ? d0 : d1) * (float)v;
            }
        }
    }
}

typedef void (*row_fn)(const uint8_t *restrict, float *restrict, int64_t);

/* ---- one table of row kernels per type, indexed by path (cpu_paths.h) --------------- */

/* NAME's copies: the portable reference (`_generic`, at PCD_PATH_SCALAR) and, on x86,
 * AVX2 and AVX-512 builds of the same body. */
#if X86
#define ROW_COPIES(NAME)                                                                   \
    static void NAME##_generic(const uint8_t *restrict s, float *restrict y, int64_t k) {  \
        NAME(s, y, k);                                                                     \
    }                                                                                      \
    __attribute__((target("avx2,fma"))) static void NAME##_avx2(                           \
        const uint8_t *restrict s, float *restrict y, int64_t k) {                         \
        NAME(s, y, k);                                                                     \
    }                                                                                      \
    __attribute__((target("avx512f"))) static void NAME##_avx512(                          \
        const uint8_t *restrict s, float *restrict y, int64_t k) {                         \
        NAME(s, y, k);                                                                     \
    }
#define ROW_TABLE(TYPE, NAME)                                                              \
    {TYPE,                                                                                 \
     {[PCD_PATH_SCALAR] = NAME##_generic, [PCD_PATH_AVX2] = NAME##_avx2,                   \
      [PCD_PATH_AVX512] = NAME##_avx512}}
#else
#define ROW_COPIES(NAME)                                                                   \
    static void NAME##_generic(const uint8_t *restrict s, float *restrict y, int64_t k) {  \
        NAME(s, y, k);                                                                     \
    }
#define ROW_TABLE(TYPE, NAME) {TYPE, {[PCD_PATH_SCALAR] = NAME##_generic}}
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

/* Per type, its row kernel on each path (0 where not built). */
static const struct {
    int type;
    row_fn fn[PCD_N_PATHS];
} ROWS[] = {
    ROW_TABLE(GGUF_F32, row_f32),   ROW_TABLE(GGUF_F16, row_f16),   ROW_TABLE(GGUF_BF16, row_bf16),
    ROW_TABLE(GGUF_Q4_0, row_q4_0), ROW_TABLE(GGUF_Q4_1, row_q4_1), ROW_TABLE(GGUF_Q5_0, row_q5_0),
    ROW_TABLE(GGUF_Q5_1, row_q5_1), ROW_TABLE(GGUF_Q8_0, row_q8_0), ROW_TABLE(GGUF_Q2_K, row_q2_k),
    ROW_TABLE(GGUF_Q3_K, row_q3_k), ROW_TABLE(GGUF_Q4_K, row_q4_k), ROW_TABLE(GGUF_Q5_K, row_q5_k),
    ROW_TABLE(GGUF_Q6_K, row_q6_k),
};

/* The paths the row kernels are built for (every type the same). */
#define ROW_PATHS PCD_PATHS_BUILT(ROWS[0].fn, )

/* The path `path` (PCD_PATH_AUTO or a PCD_PATH_* id) resolves to here; 0 if this CPU does
 * not run it or it is not built. */
int pcd_q_path(int path) { return pcd_path_pick(path, ROW_PATHS); }

/* The row kernel of `type` on `path` (as pcd_q_path); 0 for an unsupported type or path. */
static row_fn row_for(int type, int path) {
    path = pcd_q_path(path);
    for (size_t i = 0; path && i < sizeof ROWS / sizeof ROWS[0]; i++)
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
 * out (n x k floats), on `path` (PCD_PATH_AUTO, or one forced: tests). Returns 0, or -1
 * for an unsupported type or path or a k that is not a multiple of the block. */
int pcd_q_dequant_rows(int type, const uint8_t *src, int64_t row_bytes, int64_t k,
                       const int32_t *rows, int64_t r0, int64_t n, float *out, int threads,
                       int path) {
    int per;
    row_fn fn = row_for(type, path);
    if (!fn || !pcd_q_block(type, &per) || k % per) return -1;
    init_half();
    rows_job j = {fn, src, row_bytes, k, r0, n, rows, out, k, 1};
    run_rows(&j, threads);
    return 0;
}

/* y (m x n_out, row stride ldy) = x (m x k) . W^T (+ bias) on `path` (as in
 * pcd_q_dequant_rows), W the (n_out, k) quantized matrix, one panel of `panel` rows of W at a time dequantized into scratch (panel x k
 * floats). A bias is copied into y first and the GEMM accumulates onto it (beta = 1), as
 * MLX's addmm does for a dense Linear with a bias: the same roundings. */
int pcd_q_matmul(void *gemm, int type, const uint8_t *src, int64_t row_bytes,
                 const int32_t *rows, int64_t n_out, int64_t k, const float *x, int64_t m,
                 float *y, int64_t ldy, int64_t panel, float *scratch, int threads,
                 const float *bias, int path) {
    int per;
    row_fn fn = row_for(type, path);
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
