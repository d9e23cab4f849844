/* y = x @ W^T with W in a GGUF block encoding and x float32: int8 and bf16 kernels.
 *
 * int8 route (as llama.cpp computes it): each activation row is quantized per block of
 * 32 (Q8_0 style: dx = max|x| / 127, xq = round(x / dx), xs = dx * sum(xq)). The weights
 * stay in the file's blocks; each task decodes a panel of NC output columns into int8
 * quants (q), two float scales per block of 32 (one per half of 16: Q6_K's sub-blocks)
 * and a float minimum per block (Q4_1, Q5_1, Q4_K, Q5_K), so that
 *     w[e] = sc[half(e)] * q[e] + mn        (q in [-128, 127])
 * The panel is reused by every row, so decoding costs 1/rows of the arithmetic.
 * Per (row, column, block) the kernel takes int32 dot products of 4-byte groups
 * (8 lanes per block: lane l holds bytes 4l..4l+3), converts them to float and adds
 * lane * (dx * sc[half]) into 8 float lanes. The lanes are summed in a fixed tree, then
 *     y += sum_b mn[b] * xs[b]      (one fma per block, in block order).
 * Integer products:
 *   - AVX2: maddubs(|q|, sign(xq, q)) then madd with ones (the sign trick: |q| <= 128
 *     and |xq| <= 127, so the int16 pairs cannot saturate);
 *   - AVX-VNNI / AVX-512 VNNI: dpbusd(xq + 128, q) started from -128 * sum(q) per lane;
 *   - AMX (the K-quant column panels, 16 rows at a time): tile products of xq against the
 *     quants folded with their sub-block scales, see "AMX" below.
 * The scalar path, AVX2 and AVX-VNNI give bit-identical results (same integer lanes,
 * same float operations in the same order); AVX-512 VNNI holds two blocks per register
 * (16 lanes), so its float sums are ordered differently (equal within rounding).
 *
 * The one-scale 32-block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on every path lay the panel
 * out across columns instead: see "32-blocks, column panels".
 *
 * K-quant mode (Q4_K, Q5_K, Q6_K with activations per 256, as llama.cpp's Q8_K): see
 * "K-quant mode" below.
 *
 * bf16 route (AVX-512 BF16 only): activations rounded to bf16, the panel dequantized to
 * bf16, products with dpbf16_ps into float32.
 *
 * Code paths: each kernel family (the int8 kernels, the K-quant row and column panels, the
 * activation quantizers, the dequantizer) is a table indexed by cpu_paths.h's path ids,
 * the portable C reference at PCD_PATH_SCALAR; each entry point takes a path
 * (PCD_PATH_AUTO, or one forced: qgemm.py's `path=`, tests) resolved by cpu_paths.h's
 * rule, the one every C source of the engine follows. bf16 mode runs on
 * PCD_PATH_AVX512BF16 only.
 *
 * Work: tasks are panels of NC columns, taken from an atomic counter by `threads` POSIX
 * threads (the caller's thread is one), as in _cpu_kernels.c. Built and loaded by
 * pcd_tools.engine.kernels.bindings.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_paths.h"
#if PCD_X86
#include <immintrin.h>
#define X86 1
#else
#define X86 0
#endif

#define QB 32
#define NC 16 /* output columns per panel (task) */
#define RB 4  /* rows per micro tile */
#define CB 2  /* columns per micro tile */

#include "gguf_blocks.h"

/* ---------------------------------------------------------------- blocks and decode */

static inline float h2f(const uint8_t *p) { return GGUF_FP16(p); }

/* Bytes and elements of one block of `type`; 0 if the type is not supported. */
int pcd_qgemm_block(int type, int *elems) {
    int e, b = type == GGUF_Q2_K || type == GGUF_Q3_K ? 0 : gguf_block_bytes(type, &e);
    if (elems) *elems = b ? e : 32;
    return b;
}

/* 1 if the decoded w has a float minimum per block (y needs the xs pass): the types with
 * a minimum, and Q4_0 / Q5_0, decoded unsigned (q in 0..31) with -8 d / -16 d as minimum. */
static int has_min(int type) { return type != GGUF_Q8_0 && type != GGUF_Q6_K; }

/* The float minimum of a one-scale 32-block (blk, scale d) as the decoders store it:
 * Q4_0 / Q5_0 are decoded unsigned, so -8 d / -16 d; Q4_1 / Q5_1 their own; Q8_0 none. */
static inline float block32_min(int type, const uint8_t *blk, float d) {
    return type == GGUF_Q4_0 ? -8.0f * d : type == GGUF_Q5_0 ? -16.0f * d : type == GGUF_Q8_0 ? 0.0f
                                                                                    : h2f(blk + 2);
}

/* One weight row (k elements, its blocks at `src`) into q[k], sc[2 * k / 32], mn[k / 32]:
 * each block by gguf_blocks.h's decoder, then Q4_0 / Q5_0 made unsigned (their offset
 * moved into the minimum) and the scales laid out per 16. */
GGUF_INLINE void decode_row_t(const int type, const uint8_t *src, int k, int8_t *q, float *sc,
                              float *mn) {
    int per, bytes = gguf_block_bytes(type, &per);
    float s16[16], m16[16];
    for (int e = 0; e + per <= k; e += per) {
        const uint8_t *blk = src + (int64_t)(e / per) * bytes;
        int8_t *o = q + e;
        float *so = sc + e / 16, *mo = mn + e / QB;
        gguf_block_quants(type, blk, o);
        gguf_block_scales(type, blk, s16, m16);
        if (type == GGUF_Q6_K) { /* element e of the block has scale s16[e / 16] */
            for (int h = 0; h < 16; h++) so[h] = s16[h];
            for (int b = 0; b < 8; b++) mo[b] = 0.0f;
        } else if (per == GGUF_QK_K) { /* Q4_K, Q5_K: one scale and minimum per 32 */
            for (int b = 0; b < 8; b++) so[2 * b] = so[2 * b + 1] = s16[b], mo[b] = m16[b];
        } else {
            const int off = type == GGUF_Q4_0 ? 8 : type == GGUF_Q5_0 ? 16 : 0;
            if (off)
                for (int j = 0; j < QB; j++) o[j] = (int8_t)(o[j] + off);
            so[0] = so[1] = s16[0];
            mo[0] = block32_min(type, blk, s16[0]);
        }
    }
}

/* One copy of the row loop per type (the type a constant in each). */
#define DECODE_BODY                                                                        \
    switch (type) {                                                                        \
    case GGUF_Q4_0: decode_row_t(GGUF_Q4_0, src, k, q, sc, mn); break;                           \
    case GGUF_Q4_1: decode_row_t(GGUF_Q4_1, src, k, q, sc, mn); break;                           \
    case GGUF_Q5_0: decode_row_t(GGUF_Q5_0, src, k, q, sc, mn); break;                           \
    case GGUF_Q5_1: decode_row_t(GGUF_Q5_1, src, k, q, sc, mn); break;                           \
    case GGUF_Q8_0: decode_row_t(GGUF_Q8_0, src, k, q, sc, mn); break;                           \
    case GGUF_Q4_K: decode_row_t(GGUF_Q4_K, src, k, q, sc, mn); break;                           \
    case GGUF_Q5_K: decode_row_t(GGUF_Q5_K, src, k, q, sc, mn); break;                           \
    case GGUF_Q6_K: decode_row_t(GGUF_Q6_K, src, k, q, sc, mn); break;                           \
    }

static void decode_row_generic(int type, const uint8_t *src, int k, int8_t *q, float *sc,
                               float *mn) {
    DECODE_BODY
}

#if X86
__attribute__((target("avx2,fma"))) static void decode_row_avx2(int type, const uint8_t *src,
                                                                 int k, int8_t *q, float *sc,
                                                                 float *mn) {
    DECODE_BODY
}
#endif

typedef void (*decode_t)(int, const uint8_t *, int, int8_t *, float *, float *);

/* Dequantize rows [r0, r1) of a matrix (row bytes `rb`) into float32 out (ld k):
 * w = sc[e / 16] * q + mn[e / 32], two roundings (as gguf's numpy dequantization). */
#define DEQ_BODY                                                                           \
    int nb = k / QB;                                                                       \
    int8_t *q = malloc((size_t)k);                                                         \
    float *sc = malloc(sizeof(float) * 2 * nb), *mn = malloc(sizeof(float) * nb);          \
    if (q && sc && mn)                                                                     \
        for (int r = r0; r < r1; r++) {                                                    \
            DECODE(type, w + (int64_t)r * rb, k, q, sc, mn);                               \
            float *o = out + (int64_t)(r - r0) * k;                                        \
            for (int b = 0; b < nb; b++)                                                   \
                for (int h = 0; h < 2; h++) {                                              \
                    float s = sc[2 * b + h], m = mn[b];                                    \
                    const int8_t *qb = q + b * QB + h * 16;                                \
                    float *ob = o + b * QB + h * 16;                                       \
                    for (int e = 0; e < 16; e++) ob[e] = s * (float)qb[e] + m;             \
                }                                                                          \
        }                                                                                  \
    free(q);                                                                               \
    free(sc);                                                                              \
    free(mn);

#define DECODE decode_row_generic
static void dequantize_generic(int type, const uint8_t *w, int64_t rb, int k, int r0, int r1,
                               float *out) {
    DEQ_BODY
}
#undef DECODE
#if X86
#define DECODE decode_row_avx2
__attribute__((target("avx2,fma"))) static void dequantize_avx2(int type, const uint8_t *w, int64_t rb, int k, int r0,
                                   int r1, float *out) {
    DEQ_BODY
}
#undef DECODE
#endif

/* ---------------------------------------------------------------- thread pool */

typedef struct {
    void (*fn)(void *, int, void *);
    void *ctx;
    int ntasks;
    size_t scratch_bytes;
    int next;
    int failed;
} pool_t;

static void *pool_worker(void *arg) {
    pool_t *p = (pool_t *)arg;
    void *scratch = p->scratch_bytes ? aligned_alloc(64, (p->scratch_bytes + 63) & ~(size_t)63) : 0;
    if (p->scratch_bytes && !scratch) {
        __atomic_store_n(&p->failed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    for (;;) {
        int t = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (t >= p->ntasks) break;
        p->fn(p->ctx, t, scratch);
    }
    free(scratch);
    return 0;
}

static int run_parallel(void (*fn)(void *, int, void *), void *ctx, int ntasks,
                        size_t scratch_bytes, int threads) {
    pool_t p = {fn, ctx, ntasks, scratch_bytes, 0, 0};
    if (threads > ntasks) threads = ntasks;
    if (threads > 64) threads = 64;
    if (threads < 1) threads = 1;
    pthread_t tids[64];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tids[started], 0, pool_worker, &p) != 0) break;
        started++;
    }
    pool_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(tids[i], 0);
    /* tasks no thread could run (every scratch allocation failed) */
    return __atomic_load_n(&p.next, __ATOMIC_RELAXED) < ntasks ? 1 : 0;
}

/* ---------------------------------------------------------------- activations */

/* Row r of x (k floats) -> xq (int8), dx and xs per block of 32. */
static void quantize_row(const float *x, int k, int8_t *xq, float *dx, float *xs) {
    for (int b = 0; b < k / QB; b++) {
        const float *v = x + b * QB;
        float amax = 0.0f;
        for (int j = 0; j < QB; j++) {
            float a = fabsf(v[j]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QB; j++) {
            int qv = (int)roundf(v[j] * id);
            qv = qv > 127 ? 127 : (qv < -127 ? -127 : qv);
            xq[b * QB + j] = (int8_t)qv;
            sum += qv;
        }
        dx[b] = d;
        xs[b] = d * (float)sum;
    }
}

#if X86
/* The activation quantizers on AVX2, bit-identical to the scalar ones above: the same
 * maximum (exact in any order), the same float products, and roundf's ties away from
 * zero (t = trunc(v), plus sign(v) where |v - t| >= 0.5; v - t is exact). NaN clamps to
 * -127 as the scalar code's (int)roundf does. */
#define QAVX2_T __attribute__((target("avx2,fma")))
QAVX2_T static inline __m256i round_clamp_avx2(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
}

QAVX2_T static inline float hmax_abs_avx2(const float *v, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

QAVX2_T static inline int hsum_epi32_avx2(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

/* 32 values at v times id into 32 int8 at out; their 4 groups of 8 as int32 in q[4] */
QAVX2_T static inline void quantize32_avx2(const float *v, __m256 id, int8_t *out, __m256i q[4]) {
    for (int i = 0; i < 4; i++) q[i] = round_clamp_avx2(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), id));
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, b);
}

QAVX2_T static void quantize_row_avx2(const float *x, int k, int8_t *xq, float *dx, float *xs) {
    for (int b = 0; b < k / QB; b++) {
        const float *v = x + b * QB;
        float amax = hmax_abs_avx2(v, QB);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256i q[4];
        quantize32_avx2(v, _mm256_set1_ps(id), xq + b * QB, q);
        int sum = hsum_epi32_avx2(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        dx[b] = d;
        xs[b] = d * (float)sum;
    }
}
#endif

typedef void (*quantize_t)(const float *, int, int8_t *, float *, float *);

/* The activation quantizers per 32 on each path (bit-identical). */
static const quantize_t QUANTIZE[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = quantize_row,
#if X86
    [PCD_PATH_AVX2] = quantize_row_avx2,
#endif
};

typedef struct {
    const float *x;
    int64_t ldx;
    int k, rows, per_task;
    int8_t *xq;
    float *dx, *xs;
    quantize_t fn;
} qjob_t;

static void quantize_task(void *ctx, int t, void *scratch) {
    (void)scratch;
    qjob_t *j = (qjob_t *)ctx;
    int nb = j->k / QB;
    int r1 = (t + 1) * j->per_task;
    if (r1 > j->rows) r1 = j->rows;
    for (int r = t * j->per_task; r < r1; r++)
        j->fn(j->x + (int64_t)r * j->ldx, j->k, j->xq + (int64_t)r * j->k, j->dx + (int64_t)r * nb,
           j->xs + (int64_t)r * nb);
}

/* As pcd_qgemm_quantize, on quantizer path `path` (PCD_PATH_AUTO, or a path id to force:
 * tests); 3 if it is not available here. */
int pcd_qgemm_quantize_path(const float *x, int64_t ldx, int rows, int k, int8_t *xq,
                            float *dx, float *xs, int threads, int path) {
    if (k % QB) return 2;
    path = pcd_path_pick(path, PCD_PATHS_BUILT(QUANTIZE, ));
    if (!path) return 3;
    qjob_t j = {x, ldx, k, rows, 16, xq, dx, xs, QUANTIZE[path]};
    int ntasks = (rows + 15) / 16;
    return ntasks ? run_parallel(quantize_task, &j, ntasks, 0, threads) : 0;
}

/* Quantize `rows` rows of x (row stride ldx floats) into xq [rows, k], dx and xs
 * [rows, k / 32], with the AVX2 quantizer where the CPU has it (bit-identical). Returns
 * 0, 1 if threads failed, 2 if k is not a multiple of 32. */
int pcd_qgemm_quantize(const float *x, int64_t ldx, int rows, int k, int8_t *xq, float *dx,
                       float *xs, int threads) {
    return pcd_qgemm_quantize_path(x, ldx, rows, k, xq, dx, xs, threads, PCD_PATH_AUTO);
}

/* ---------------------------------------------------------------- micro kernels */

/* Every micro kernel computes, for rows [0, R) of xq (ld k) and columns [0, C) of the
 * panel (q ld k, sc ld 2 nb), y[r * ldy + c] = the dot part (no minimum). */

/* lane tree shared by every path: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) */
static inline float tree8(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static void micro_scalar(int R, int C, const int8_t *xq, const float *dx, const int8_t *q,
                         const float *sc, int k, float *y, int64_t ldy) {
    int nb = k / QB;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float acc[8] = {0};
            const int8_t *xr = xq + (int64_t)r * k, *wc = q + (int64_t)c * k;
            const float *sr = sc + (int64_t)c * 2 * nb;
            for (int b = 0; b < nb; b++) {
                float d = dx[(int64_t)r * nb + b];
                for (int l = 0; l < 8; l++) {
                    int32_t s = 0;
                    for (int e = 0; e < 4; e++) s += (int32_t)xr[b * QB + 4 * l + e] * wc[b * QB + 4 * l + e];
                    float t = d * sr[2 * b + (l >> 2)];
                    acc[l] = fmaf((float)s, t, acc[l]);
                }
            }
            y[(int64_t)r * ldy + c] = tree8(acc);
        }
}

#if X86
#define AVX2_T __attribute__((target("avx2,fma")))
#define AI static inline __attribute__((always_inline))

AVX2_T AI float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

AVX2_T AI void micro_avx2_rc(const int R, const int C, const int U, const int8_t *xq,
                             const float *dx, const int8_t *q, const float *sc, int k, float *y,
                             int64_t ldy) {
    int nb = k / QB;
    __m256 acc[RB][CB];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b++) {
        __m256i w[CB], aw[CB];
        __m256 s[CB];
        for (int c = 0; c < C; c++) {
            w[c] = _mm256_loadu_si256((const __m256i *)(q + (int64_t)c * k + b * QB));
            aw[c] = U ? w[c] : _mm256_abs_epi8(w[c]);
            const float *p = sc + (int64_t)c * 2 * nb + 2 * b;
            s[c] = _mm256_set_m128(_mm_set1_ps(p[1]), _mm_set1_ps(p[0]));
        }
        for (int r = 0; r < R; r++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)r * k + b * QB));
            __m256 d = _mm256_set1_ps(dx[(int64_t)r * nb + b]);
            for (int c = 0; c < C; c++) {
                __m256i p = _mm256_maddubs_epi16(aw[c], U ? x : _mm256_sign_epi8(x, w[c]));
                __m256i i = _mm256_madd_epi16(p, ones);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, s[c]), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(int64_t)r * ldy + c] = hsum256(acc[r][c]);
}

/* The full 4 x 2 tile with its 8 accumulators in named registers. DOT(w, x): the 8
 * int32 lanes of one block. */
#define MICRO32_42(NAME, TGT, DOT)                                                         \
    TGT static void NAME##_42(const int8_t *xq, const float *dx, const int8_t *q,          \
                              const float *sc, int k, float *y, int64_t ldy) {             \
        int nb = k / QB;                                                                   \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                 \
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                 \
        for (int b = 0; b < nb; b++) {                                                     \
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(q + b * QB));                \
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(q + k + b * QB));            \
            __m256 s0 = _mm256_set_m128(_mm_set1_ps(sc[2 * b + 1]), _mm_set1_ps(sc[2 * b])); \
            __m256 s1 = _mm256_set_m128(_mm_set1_ps(sc[2 * nb + 2 * b + 1]),               \
                                        _mm_set1_ps(sc[2 * nb + 2 * b]));                  \
            ROW32(0, a00, a01, DOT)                                                        \
            ROW32(1, a10, a11, DOT)                                                        \
            ROW32(2, a20, a21, DOT)                                                        \
            ROW32(3, a30, a31, DOT)                                                        \
        }                                                                                  \
        y[0] = hsum256(a00); y[1] = hsum256(a01);                                          \
        y[ldy] = hsum256(a10); y[ldy + 1] = hsum256(a11);                                  \
        y[2 * ldy] = hsum256(a20); y[2 * ldy + 1] = hsum256(a21);                          \
        y[3 * ldy] = hsum256(a30); y[3 * ldy + 1] = hsum256(a31);                          \
    }
#define ROW32(r, A0, A1, DOT)                                                              \
    {                                                                                      \
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)(r) * k + b * QB)); \
        __m256 d = _mm256_set1_ps(dx[(int64_t)(r) * nb + b]);                              \
        A0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(w0, x)), _mm256_mul_ps(d, s0), A0);    \
        A1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(w1, x)), _mm256_mul_ps(d, s1), A1);    \
    }
#define DOT_U(w, x) _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
#define DOT_S(w, x) \
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1))
#define DOT_VNNI(w, x)                                                                     \
    _mm256_dpbusd_avx_epi32(_mm256_sub_epi32(_mm256_setzero_si256(),                       \
                                             _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), \
                                                                     _mm256_set1_epi8((char)0x80), w)), \
                            _mm256_xor_si256(x, _mm256_set1_epi8((char)0x80)), w)
MICRO32_42(micro_avx2, AVX2_T, DOT_S)
MICRO32_42(micro_avx2_u, AVX2_T, DOT_U)

/* signed weights (Q8_0, Q6_K): maddubs(|q|, sign(xq, q)) */
AVX2_T static void micro_avx2(int R, int C, const int8_t *xq, const float *dx, const int8_t *q,
                              const float *sc, int k, float *y, int64_t ldy) {
    if (R == RB && C == CB) micro_avx2_42(xq, dx, q, sc, k, y, ldy);
    else if (C == CB) micro_avx2_rc(R < 1 ? 1 : R, CB, 0, xq, dx, q, sc, k, y, ldy);
    else micro_avx2_rc(R, 1, 0, xq, dx, q, sc, k, y, ldy);
}

/* unsigned weights (q in 0..31: every other type): maddubs(q, xq) */
AVX2_T static void micro_avx2_u(int R, int C, const int8_t *xq, const float *dx,
                                const int8_t *q, const float *sc, int k, float *y, int64_t ldy) {
    if (R == RB && C == CB) micro_avx2_u_42(xq, dx, q, sc, k, y, ldy);
    else if (C == CB) micro_avx2_rc(R < 1 ? 1 : R, CB, 1, xq, dx, q, sc, k, y, ldy);
    else micro_avx2_rc(R, 1, 1, xq, dx, q, sc, k, y, ldy);
}

/* AVX-VNNI (VEX, 256-bit): same lanes and float operations as AVX2. */
#define VNNI256_T __attribute__((target("avx2,fma,avxvnni")))
VNNI256_T AI void micro_avxvnni_rc(const int R, const int C, const int8_t *xq, const float *dx,
                                   const int8_t *q, const float *sc, int k, float *y,
                                   int64_t ldy) {
    int nb = k / QB;
    __m256 acc[RB][CB];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b++) {
        __m256i w[CB], base[CB];
        __m256 s[CB];
        for (int c = 0; c < C; c++) {
            w[c] = _mm256_loadu_si256((const __m256i *)(q + (int64_t)c * k + b * QB));
            base[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), bias, w[c]));
            const float *p = sc + (int64_t)c * 2 * nb + 2 * b;
            s[c] = _mm256_set_m128(_mm_set1_ps(p[1]), _mm_set1_ps(p[0]));
        }
        for (int r = 0; r < R; r++) {
            __m256i x = _mm256_xor_si256(
                _mm256_loadu_si256((const __m256i *)(xq + (int64_t)r * k + b * QB)), bias);
            __m256 d = _mm256_set1_ps(dx[(int64_t)r * nb + b]);
            for (int c = 0; c < C; c++) {
                __m256i i = _mm256_dpbusd_avx_epi32(base[c], x, w[c]);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, s[c]), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(int64_t)r * ldy + c] = hsum256(acc[r][c]);
}

VNNI256_T static void micro_avxvnni(int R, int C, const int8_t *xq, const float *dx,
                                    const int8_t *q, const float *sc, int k, float *y,
                                    int64_t ldy) {
    if (R == RB && C == CB) micro_avxvnni_rc(RB, CB, xq, dx, q, sc, k, y, ldy);
    else if (C == CB) micro_avxvnni_rc(R < 1 ? 1 : R, CB, xq, dx, q, sc, k, y, ldy);
    else micro_avxvnni_rc(R, 1, xq, dx, q, sc, k, y, ldy);
}

/* AVX-512 VNNI: two blocks per register (lanes 0-7 block b, 8-15 block b + 1). */
#define VNNI512_T __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
VNNI512_T AI void micro_avx512vnni_rc(const int R, const int C, const int8_t *xq,
                                      const float *dx, const int8_t *q, const float *sc, int k,
                                      float *y, int64_t ldy) {
    int nb = k / QB;
    __m512 acc[RB][CB];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512i half = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i dsel = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i w[CB], base[CB];
        __m512 s[CB];
        for (int c = 0; c < C; c++) {
            w[c] = _mm512_loadu_si512((const void *)(q + (int64_t)c * k + b * QB));
            base[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, w[c]));
            __m128 p = _mm_loadu_ps(sc + (int64_t)c * 2 * nb + 2 * b);
            s[c] = _mm512_permutexvar_ps(half, _mm512_castps128_ps512(p));
        }
        for (int r = 0; r < R; r++) {
            __m512i x = _mm512_xor_si512(
                _mm512_loadu_si512((const void *)(xq + (int64_t)r * k + b * QB)), bias);
            __m128 dd = _mm_castpd_ps(_mm_load_sd((const double *)(dx + (int64_t)r * nb + b)));
            __m512 d = _mm512_permutexvar_ps(dsel, _mm512_castps128_ps512(dd));
            for (int c = 0; c < C; c++) {
                __m512i i = _mm512_dpbusd_epi32(base[c], x, w[c]);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, s[c]), acc[r][c]);
            }
        }
    }
    float tail[RB][CB] = {{0}};
    if (b < nb) { /* last odd block: 256-bit */
        const __m256i bias8 = _mm256_set1_epi8((char)0x80);
        for (int c = 0; c < C; c++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(q + (int64_t)c * k + b * QB));
            __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(),
                                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias8, w));
            const float *p = sc + (int64_t)c * 2 * nb + 2 * b;
            __m256 s = _mm256_set_m128(_mm_set1_ps(p[1]), _mm_set1_ps(p[0]));
            for (int r = 0; r < R; r++) {
                __m256i x = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)(xq + (int64_t)r * k + b * QB)), bias8);
                __m256 d = _mm256_set1_ps(dx[(int64_t)r * nb + b]);
                __m256i i = _mm256_dpbusd_epi32(base, x, w);
                tail[r][c] = hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, s)));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            __m256 v = _mm256_add_ps(_mm512_castps512_ps256(acc[r][c]),
                                     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][c]), 1)));
            y[(int64_t)r * ldy + c] = hsum256(v) + tail[r][c];
        }
}

VNNI512_T static void micro_avx512vnni(int R, int C, const int8_t *xq, const float *dx,
                                       const int8_t *q, const float *sc, int k, float *y,
                                       int64_t ldy) {
    if (R == RB && C == CB) micro_avx512vnni_rc(RB, CB, xq, dx, q, sc, k, y, ldy);
    else if (C == CB) micro_avx512vnni_rc(R < 1 ? 1 : R, CB, xq, dx, q, sc, k, y, ldy);
    else micro_avx512vnni_rc(R, 1, xq, dx, q, sc, k, y, ldy);
}
#endif

typedef void (*micro_t)(int, int, const int8_t *, const float *, const int8_t *, const float *,
                        int, float *, int64_t);

/* ---------------------------------------------------------------- 32-blocks, column panels
 *
 * For the one-scale 32-block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) every path lays the
 * panel out across columns instead (as the K-quants' column panels below; AVX-512 VNNI
 * with its dpbusd on 256 bits: 1.6-1.75x sgemm on a Zen 4, against 0.9-1.2x for the
 * 16-lane kernel above, which now runs only K-quants outside K-quant mode): per group of 8 columns (lane = column % 8), the 32 bytes at (group, 4-byte
 * group q) hold bytes 4q..4q+3 of the 8 columns' quants. One vpmaddubsw (AVX2) or
 * vpdpbusd (AVX-VNNI) with the activation's 4 bytes broadcast then takes 32 multiply-adds
 * for 8 columns, the block's 32 products are summed in the integers, and the float work
 * per (row, block) is one conversion, one product of scales and one fma for 8 columns,
 * where the 8-lane kernels above pay them per column. Per (row, column, block) every path
 * computes the same:
 *     I = sum_{e in block} q[e] * xq[e]          (int32, exact: |I| <= 32 * 128 * 127)
 *     acc = fma((float)I, dx * d, acc)           (in block order, acc from 0)
 * then y = acc and the minimum pass adds sum_b mn[b] * xs[b]. So scalar, AVX2, AVX-VNNI
 * and AVX-512 VNNI are bit-identical, and a row's result never depends on the other rows.
 * AVX2's integer step: unsigned quants (0..31: every type but Q8_0) make maddubs pairs of
 * at most 2 * 31 * 127 = 7874, so four 4-byte groups add in int16 (31496 < 2^15) before
 * one madd with ones; Q8_0's signed quants take the sign trick, maddubs(|q|, sign(x, q))
 * (pairs at most 2 * 128 * 127 < 2^15), and a madd each. AVX-VNNI: dpbusd(q, x), or
 * dpbusd(|q|, sign(x, q)) for Q8_0. */

#define CG 8  /* columns per group (lanes) */
#define CR 6  /* rows per column tile */
#define CR_U 4 /* the same, unsigned quants on AVX2 (int16 sums take registers) */

/* 1 if `type` runs the column-panel 32-block kernels (one float scale per block). */
static int col32_type(int type) {
    return type == GGUF_Q4_0 || type == GGUF_Q4_1 || type == GGUF_Q5_0 || type == GGUF_Q5_1 || type == GGUF_Q8_0;
}

/* Tile kernels: rows [0, R) of xq (ld k) against one group (wg [k/4][8] int32, sg [nb][8]
 * float), out[r * CG + lane] = acc (every lane, the unused ones included). */
typedef void (*col32_t)(int R, const int8_t *xq, const float *dx, const int32_t *wg,
                        const float *sg, int k, int sgn, float *out);

static void col32_scalar(int R, const int8_t *xq, const float *dx, const int32_t *wg,
                         const float *sg, int k, int sgn, float *out) {
    (void)sgn;
    int nb = k / QB;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < CG; l++) {
            const int8_t *xr = xq + (int64_t)r * k;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int32_t I = 0;
                for (int q = b * (QB / 4); q < (b + 1) * (QB / 4); q++) {
                    int32_t wv = wg[q * CG + l];
                    for (int e = 0; e < 4; e++) I += (int32_t)(int8_t)(wv >> (8 * e)) * xr[4 * q + e];
                }
                acc = fmaf((float)I, dx[(int64_t)r * nb + b] * sg[b * CG + l], acc);
            }
            out[r * CG + l] = acc;
        }
}

#if X86
static inline int32_t load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* V: 0 AVX2, 1 VNNI (DP: AVX-VNNI's or AVX-512 VNNI's dpbusd on 256 bits); S: signed
 * quants (Q8_0). The float sums live in `out` (one load and store per block and row),
 * which leaves the registers to the integer sums. */
#define COL32_BODY(V, S, DP)                                                               \
    int nb = k / QB;                                                                       \
    const __m256i ones = _mm256_set1_epi16(1);                                             \
    (void)ones;                                                                            \
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * CG, _mm256_setzero_ps());       \
    for (int b = 0; b < nb; b++) {                                                         \
        __m256i I[CR];                                                                     \
        for (int r = 0; r < R; r++) I[r] = _mm256_setzero_si256();                         \
        for (int h = 0; h < 2; h++) {                                                      \
            __m256i t[CR];                                                                 \
            _Pragma("GCC unroll 4") for (int qi = 0; qi < 4; qi++) {                       \
                const int q = b * 8 + h * 4 + qi;                                          \
                __m256i w = _mm256_load_si256((const __m256i *)(wg + q * CG));             \
                __m256i aw = S ? _mm256_abs_epi8(w) : w;                                   \
                for (int r = 0; r < R; r++) {                                              \
                    __m256i x = _mm256_set1_epi32(load4(xq + (int64_t)r * k + 4 * q));     \
                    if (S) x = _mm256_sign_epi8(x, w);                                     \
                    if (V) {                                                               \
                        I[r] = DP(I[r], aw, x);                                            \
                    } else if (S) {                                                        \
                        I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x), ones)); \
                    } else {                                                               \
                        __m256i p = _mm256_maddubs_epi16(w, x);                            \
                        t[r] = qi ? _mm256_add_epi16(t[r], p) : p;                         \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
            if (!V && !S)                                                                  \
                for (int r = 0; r < R; r++) I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(t[r], ones)); \
        }                                                                                  \
        __m256 s = _mm256_load_ps(sg + b * CG);                                            \
        for (int r = 0; r < R; r++) {                                                      \
            __m256 a = _mm256_loadu_ps(out + r * CG);                                      \
            __m256 d = _mm256_mul_ps(_mm256_set1_ps(dx[(int64_t)r * nb + b]), s);          \
            _mm256_storeu_ps(out + r * CG, _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), d, a)); \
        }                                                                                  \
    }

AVX2_T AI void col32_avx2_rs(const int R, const int S, const int8_t *xq, const float *dx,
                             const int32_t *wg, const float *sg, int k, float *out) {
    COL32_BODY(0, S, _mm256_dpbusd_avx_epi32)
}

VNNI256_T AI void col32_avxvnni_rs(const int R, const int S, const int8_t *xq, const float *dx,
                                   const int32_t *wg, const float *sg, int k, float *out) {
    COL32_BODY(1, S, _mm256_dpbusd_avx_epi32)
}

/* AVX-512 VNNI runs the same 8-lane tiles with its own (EVEX) dpbusd on 256 bits: the same
 * integer lanes and float operations as AVX-VNNI, so bit-identical to it and to AVX2. */
#define VNNI512Y_T __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
VNNI512Y_T AI void col32_vnni512_rs(const int R, const int S, const int8_t *xq, const float *dx,
                                    const int32_t *wg, const float *sg, int k, float *out) {
    COL32_BODY(1, S, _mm256_dpbusd_epi32)
}

#define COL32_DISPATCH(NAME, IMPL, TGT)                                                    \
    TGT static void NAME(int R, const int8_t *xq, const float *dx, const int32_t *wg,      \
                         const float *sg, int k, int sgn, float *out) {                    \
        switch (R * 2 + (sgn != 0)) {                                                      \
        case 12: IMPL(6, 0, xq, dx, wg, sg, k, out); break;                                \
        case 13: IMPL(6, 1, xq, dx, wg, sg, k, out); break;                                \
        case 10: IMPL(5, 0, xq, dx, wg, sg, k, out); break;                                \
        case 11: IMPL(5, 1, xq, dx, wg, sg, k, out); break;                                \
        case 8: IMPL(4, 0, xq, dx, wg, sg, k, out); break;                                 \
        case 9: IMPL(4, 1, xq, dx, wg, sg, k, out); break;                                 \
        case 6: IMPL(3, 0, xq, dx, wg, sg, k, out); break;                                 \
        case 7: IMPL(3, 1, xq, dx, wg, sg, k, out); break;                                 \
        case 4: IMPL(2, 0, xq, dx, wg, sg, k, out); break;                                 \
        case 5: IMPL(2, 1, xq, dx, wg, sg, k, out); break;                                 \
        case 3: IMPL(1, 1, xq, dx, wg, sg, k, out); break;                                 \
        default: IMPL(1, 0, xq, dx, wg, sg, k, out); break;                                \
        }                                                                                  \
    }
COL32_DISPATCH(col32_avx2, col32_avx2_rs, AVX2_T)
COL32_DISPATCH(col32_avxvnni, col32_avxvnni_rs, VNNI256_T)
COL32_DISPATCH(col32_vnni512, col32_vnni512_rs, VNNI512Y_T)
#endif

#if X86
/* One block of 32 quants of a 32-block type as 32 bytes (the DECODE_BODY values). */
AVX2_T AI __m256i block32_avx2(int type, const uint8_t *blk) {
    if (type == GGUF_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const int off = type == GGUF_Q4_0 ? 2 : type == GGUF_Q4_1 ? 4 : type == GGUF_Q5_0 ? 6 : 8;
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + off));
    const __m128i m4 = _mm_set1_epi8(15);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    if (type == GGUF_Q5_0 || type == GGUF_Q5_1) { /* bit j of qh -> bit 4 of byte j */
        uint32_t qh;
        memcpy(&qh, blk + off - 4, 4);
        const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                               0x0101010101010101LL, 0x0000000000000000LL);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
        h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(16)));
    }
    return v;
}

/* Columns [c0, c0 + nc) (nc <= CG) of a 32-block matrix into one group of the column
 * panel: wg [k/4][CG] (lanes >= nc zero), sg [nb][CG], mn [c][nb] (c from 0), with the
 * DECODE_BODY numbers: an 8 x 8 int32 transpose per block. */
AVX2_T static void decode_col32_avx2(int type, const uint8_t *w, int64_t rb, int k, int c0,
                                     int nc, int32_t *wg, float *sg, float *mn) {
    int nb = k / QB, bb = pcd_qgemm_block(type, 0);
    for (int b = 0; b < nb; b++) {
        __m256i v[CG];
        for (int l = 0; l < CG; l++) {
            if (l >= nc) {
                v[l] = _mm256_setzero_si256();
                sg[b * CG + l] = 0.0f;
                continue;
            }
            const uint8_t *blk = w + (int64_t)(c0 + l) * rb + (int64_t)b * bb;
            v[l] = block32_avx2(type, blk);
            float d = h2f(blk);
            sg[b * CG + l] = d;
            mn[(int64_t)l * nb + b] = block32_min(type, blk, d);
        }
        /* transpose: out[q] lane l = int32 q of v[l] */
        __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
        __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
        __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
        __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
        __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
        __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
        __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
        __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
        __m256i *o = (__m256i *)(wg + (int64_t)b * (QB / 4) * CG);
        _mm256_store_si256(o + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
        _mm256_store_si256(o + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
        _mm256_store_si256(o + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
        _mm256_store_si256(o + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
        _mm256_store_si256(o + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
        _mm256_store_si256(o + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
        _mm256_store_si256(o + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
        _mm256_store_si256(o + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
    }
}
#endif

/* ---------------------------------------------------------------- minimum pass */

/* y[r, c] += sum_b mn[c][b] * xs[r][b], one fma per block in block order (every path). */
static void min_pass_scalar(int R, int C, const float *xs, const float *mn, int nb, float *y,
                            int64_t ldy) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float a = y[(int64_t)r * ldy + c];
            for (int b = 0; b < nb; b++) a = fmaf(mn[(int64_t)c * nb + b], xs[(int64_t)r * nb + b], a);
            y[(int64_t)r * ldy + c] = a;
        }
}

#if X86
/* The same, 8 columns at a time from a transposed copy of mn (mnT[b][c], NC wide). */
AVX2_T static void min_pass_avx2(int R, int C, const float *xs, const float *mnT, int nb,
                                 float *y, int64_t ldy) {
    if (C != NC) {
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                float a = y[(int64_t)r * ldy + c];
                for (int b = 0; b < nb; b++) a = fmaf(mnT[(int64_t)b * NC + c], xs[(int64_t)r * nb + b], a);
                y[(int64_t)r * ldy + c] = a;
            }
        return;
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c += 8) {
            __m256 a = _mm256_loadu_ps(y + (int64_t)r * ldy + c);
            for (int b = 0; b < nb; b++)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(mnT + (int64_t)b * NC + c),
                                    _mm256_set1_ps(xs[(int64_t)r * nb + b]), a);
            _mm256_storeu_ps(y + (int64_t)r * ldy + c, a);
        }
}
#endif

/* ---------------------------------------------------------------- int8 driver */

typedef struct {
    int type, k, n, rows;
    const uint8_t *w;
    int64_t rb; /* bytes per weight row */
    const int8_t *xq;
    const float *dx, *xs;
    float *y;
    int64_t ldy;
    decode_t decode;
    micro_t micro;
    int vec_min;
    col32_t col; /* the column-panel kernel (32-block types on scalar, AVX2, AVX-VNNI) */
} gjob_t;

/* The minimum's term of rows [r0, r0 + R) of a panel (mn [c][nb], its transpose mnT). */
static void min_pass(const gjob_t *j, int R, int nc, int r0, const float *mn, const float *mnT,
                     float *yr) {
    int nb = j->k / QB;
#if X86
    if (j->vec_min) {
        min_pass_avx2(R, nc, j->xs + (int64_t)r0 * nb, mnT, nb, yr, j->ldy);
        return;
    }
#endif
    (void)mnT;
    min_pass_scalar(R, nc, j->xs + (int64_t)r0 * nb, mn, nb, yr, j->ldy);
}

static void gemm_task(void *ctx, int t, void *scratch) {
    gjob_t *j = (gjob_t *)ctx;
    int k = j->k, nb = k / QB;
    int c0 = t * NC, nc = j->n - c0 < NC ? j->n - c0 : NC;
    int8_t *q = (int8_t *)scratch;                    /* NC * k */
    float *sc = (float *)(q + (size_t)NC * k);        /* NC * 2 nb */
    float *mn = sc + (size_t)NC * 2 * nb;             /* NC * nb */
    float *mnT = mn + (size_t)NC * nb;                /* nb * NC */
    for (int c = 0; c < nc; c++)
        j->decode(j->type, j->w + (int64_t)(c0 + c) * j->rb, k, q + (int64_t)c * k,
                  sc + (int64_t)c * 2 * nb, mn + (int64_t)c * nb);
    int mins = has_min(j->type);
    if (mins && j->vec_min)
        for (int c = 0; c < nc; c++)
            for (int b = 0; b < nb; b++) mnT[(int64_t)b * NC + c] = mn[(int64_t)c * nb + b];
    for (int r0 = 0; r0 < j->rows; r0 += RB) {
        int R = j->rows - r0 < RB ? j->rows - r0 : RB;
        const int8_t *xr = j->xq + (int64_t)r0 * k;
        const float *dr = j->dx + (int64_t)r0 * nb;
        float *yr = j->y + (int64_t)r0 * j->ldy + c0;
        for (int c = 0; c < nc; c += CB) {
            int C = nc - c < CB ? nc - c : CB;
            j->micro(R, C, xr, dr, q + (int64_t)c * k, sc + (int64_t)c * 2 * nb, k, yr + c, j->ldy);
        }
        if (mins) min_pass(j, R, nc, r0, mn, mnT, yr);
    }
}

/* The scalar twin of decode_col32_avx2 for the task's nc columns: each column decoded by
 * DECODE_BODY into q / sc (one column's scratch), then its 4-byte groups and scales moved
 * into their group's lane (lanes >= nc zero). */
static void decode_col32_generic(const gjob_t *j, int c0, int nc, int32_t *wp, float *sp,
                                 float *mn, float *sc, int8_t *q) {
    int k = j->k, nb = k / QB;
    if (nc < NC) {
        memset(wp, 0, (size_t)(NC / CG) * (k / 4) * CG * sizeof(int32_t));
        memset(sp, 0, (size_t)(NC / CG) * nb * CG * sizeof(float));
    }
    for (int c = 0; c < nc; c++) {
        int g = c / CG, l = c % CG;
        j->decode(j->type, j->w + (int64_t)(c0 + c) * j->rb, k, q, sc, mn + (int64_t)c * nb);
        const int32_t *q4 = (const int32_t *)q;
        int32_t *wg = wp + (size_t)g * (k / 4) * CG;
        for (int i = 0; i < k / 4; i++) wg[i * CG + l] = q4[i];
        float *sgp = sp + (size_t)g * nb * CG;
        for (int b = 0; b < nb; b++) sgp[b * CG + l] = sc[2 * b];
    }
}

/* The column-panel route (see "32-blocks, column panels"): decode the task's NC columns
 * into groups of CG lanes, run the tiles, add the minimum's term. */
static void gemm_col32_task(void *ctx, int t, void *scratch) {
    gjob_t *j = (gjob_t *)ctx;
    int k = j->k, nb = k / QB, ng = NC / CG;
    int c0 = t * NC, nc = j->n - c0 < NC ? j->n - c0 : NC;
    int32_t *wp = (int32_t *)scratch;                    /* [ng][k/4][CG] */
    float *sp = (float *)(wp + (size_t)ng * (k / 4) * CG); /* [ng][nb][CG] */
    float *mn = sp + (size_t)ng * nb * CG;               /* [NC][nb] */
    float *mnT = mn + (size_t)NC * nb;                   /* [nb][NC] */
    float *out = mnT + (size_t)nb * NC;                  /* [CR][CG] */
    float *sc = out + CR * CG;                           /* [2 nb], one column */
    int8_t *q = (int8_t *)(sc + 2 * nb);                 /* [k], one column */
#if X86
    if (j->vec_min) /* the AVX2 decoder, straight into the groups */
        for (int g = 0; g * CG < nc; g++)
            decode_col32_avx2(j->type, j->w + (int64_t)c0 * j->rb, j->rb, k, g * CG,
                              nc - g * CG < CG ? nc - g * CG : CG, wp + (size_t)g * (k / 4) * CG,
                              sp + (size_t)g * nb * CG, mn + (int64_t)g * CG * nb);
    else
#endif
        decode_col32_generic(j, c0, nc, wp, sp, mn, sc, q);
    int mins = has_min(j->type), sgn = j->type == GGUF_Q8_0;
    if (mins && j->vec_min)
        for (int c = 0; c < nc; c++)
            for (int b = 0; b < nb; b++) mnT[(int64_t)b * NC + c] = mn[(int64_t)c * nb + b];
    int rt = sgn ? CR : CR_U;
    for (int r0 = 0; r0 < j->rows; r0 += rt) {
        int R = j->rows - r0 < rt ? j->rows - r0 : rt;
        const int8_t *xr = j->xq + (int64_t)r0 * k;
        const float *dr = j->dx + (int64_t)r0 * nb;
        float *yr = j->y + (int64_t)r0 * j->ldy + c0;
        for (int g = 0; g * CG < nc; g++) {
            j->col(R, xr, dr, wp + (size_t)g * (k / 4) * CG, sp + (size_t)g * nb * CG, k, sgn, out);
            int C = nc - g * CG < CG ? nc - g * CG : CG;
            for (int r = 0; r < R; r++)
                memcpy(yr + (int64_t)r * j->ldy + g * CG, out + r * CG, (size_t)C * sizeof(float));
        }
        if (mins) min_pass(j, R, nc, r0, mn, mnT, yr);
    }
}

/* The int8 kernels (32-block activations) on each path: the row decoder, the micro
 * kernel (with a minimum and without: AVX2 has its own for types with a minimum), the
 * column-panel kernel, and whether the minimum's pass is AVX2's. */
typedef struct {
    decode_t decode;
    micro_t micro, micro_min;
    col32_t col;
    int vec_min;
} int8_kern_t;

static const int8_kern_t INT8[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = {decode_row_generic, micro_scalar, micro_scalar, col32_scalar, 0},
#if X86
    [PCD_PATH_AVX2] = {decode_row_avx2, micro_avx2, micro_avx2_u, col32_avx2, 1},
    [PCD_PATH_AVXVNNI] = {decode_row_avx2, micro_avxvnni, micro_avxvnni, col32_avxvnni, 1},
    [PCD_PATH_AVX512VNNI] = {decode_row_avx2, micro_avx512vnni, micro_avx512vnni, col32_vnni512,
                             1},
#endif
};

#define INT8_PATHS PCD_PATHS_BUILT(INT8, .decode)

/* PCD_PATH_AUTO: the int8 path auto picks. A path id: itself if this CPU runs it and it is
 * an int8 path or AVX-512 BF16 (the bf16 mode's), else 0. */
int pcd_qgemm_has_path(int path) {
    return pcd_path_pick(path, INT8_PATHS | PCD_PATH_BIT(PCD_PATH_AVX512BF16));
}

/* Bytes of scratch each thread needs for a panel of k. */
static size_t panel_bytes(int k) {
    int nb = k / QB;
    size_t col = (size_t)NC * k + sizeof(float) * ((size_t)NC * nb * 3 + CR * CG + 2 * nb) + k;
    size_t lanes = (size_t)NC * k + sizeof(float) * ((size_t)NC * 2 * nb + 2 * (size_t)NC * nb);
    return (col > lanes ? col : lanes) + 64;
}

/* y[rows, n] (ld ldy) = dequant(w)[n, k] applied to the quantized rows (xq, dx, xs from
 * pcd_qgemm_quantize). Returns 0; 1 threads failed; 2 bad type or k; 3 path unavailable. */
int pcd_qgemm_int8(int type, const uint8_t *w, int n, int k, const int8_t *xq, const float *dx,
                   const float *xs, int rows, float *y, int64_t ldy, int path, int threads) {
    int elems, bb = pcd_qgemm_block(type, &elems);
    if (!bb || k % elems) return 2;
    path = pcd_path_pick(path, INT8_PATHS);
    if (!path) return 3;
    const int8_kern_t *kn = &INT8[path];
    gjob_t j = {type, k, n, rows, w, (int64_t)(k / elems) * bb, xq, dx, xs, y, ldy,
                kn->decode, has_min(type) ? kn->micro_min : kn->micro, kn->vec_min, kn->col};
    int ntasks = (n + NC - 1) / NC;
    return run_parallel(col32_type(type) ? gemm_col32_task : gemm_task, &j, ntasks, panel_bytes(k), threads);
}

typedef void (*dequantize_t)(int, const uint8_t *, int64_t, int, int, int, float *);

/* The dequantizers on each path (bit-identical). */
static const dequantize_t DEQUANTIZE[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = dequantize_generic,
#if X86
    [PCD_PATH_AVX2] = dequantize_avx2,
#endif
};

/* Dequantize rows [r0, r1) into out (ld k), on the best dequantizer this CPU runs. */
void pcd_qgemm_dequantize(int type, const uint8_t *w, int64_t rb, int k, int r0, int r1,
                          float *out) {
    DEQUANTIZE[pcd_path_pick(PCD_PATH_AUTO, PCD_PATHS_BUILT(DEQUANTIZE, ))](type, w, rb, k, r0,
                                                                           r1, out);
}

/* ---------------------------------------------------------------- K-quant mode */

/* Q4_K, Q5_K and Q6_K hold integer sub-block scales under one float per 256 values, so
 * with activations quantized per 256 (one dx per superblock, as llama.cpp's Q8_K) the
 * sub-block scales fold into the integer sums and the float work is one fma per 256
 * values instead of one per 32. Per column, a superblock s decodes to
 *     w[e] = d[s] * sc16[e / 16] * u[e] - fm[s] * mi16[e / 16]    (u in 0..63)
 * Q4_K / Q5_K: u = q, sc16 = the 6-bit scale, mi16 = the 6-bit minimum, fm = dmin.
 * Q6_K: u = q + 32, sc16 = the int8 scale, mi16 = 32 * sc16, fm = d.
 * Per (row, column, superblock), lane l (bytes 4l..4l+3 of each sub-block of 32) holds
 *     I[l] = sum_j sc16[2j + l / 4] * sum_e u * xq        (int32, exact)
 * then acc[l] = fma((float)I[l], dx * d, acc[l]), and the tile's y = tree8(acc).
 * The minimum's term is a float product of its own, over K / L terms (L = 32 for Q4_K and
 * Q5_K, whose minimums are per 32, 16 for Q6_K), per row and column:
 *     xm[i] = dx[s] * (float)(sum of the activations' ints over sub-block i)   (per row)
 *     wm[i] = -fm[s] * (float)mi16[i * L / 16]                                  (per column)
 *     m = fma(xm[i], wm[i], m) for i = 0, 1, ..., K / L - 1 in order;  y += m
 * (kmin_pass_*). In the tiles it took a madd, a conversion, a multiply and an fma per 8
 * lanes and superblock, on the ports the integer products need: 25% of the AVX2 kernel's
 * time (Q4_K, 1.5B shapes, Zen 3: 102-104 G op/s a thread with it, 136-147 without); as
 * one fma per column and sub-block, across 8 columns, it costs under a tenth (115-134 G
 * op/s). Every path computes exactly these integers and float
 * operations in this order, so every path (AVX-512 included) gives bit-identical results.
 * AVX2 spends 3 integer instructions per 32 multiply-adds (maddubs, madd with the scales,
 * add); AVX-VNNI / AVX-512 VNNI fold the add into vpdpwssd. */

#define SB 256
#define RBK 4 /* rows per micro tile: 8 int32 accumulators in registers (of 16) */
/* Output columns per panel (task) of the 8-lane K kernels: 8 (the panel's decoded weights
 * and scales, 16 bytes per weight, stay nearer L1; 16 columns read the down projection's
 * activation rows, 35 KB per 4 rows at k = 8960, from L2 twice as often: 1.13x -> 1.19x
 * of sgemm there, the other shapes unchanged, AVX2 Zen 3). */
#define NCK 8

/* One K-quant weight row into u[k], sc16[k / 16], mi16[k / 16], d[k / 256], fm[k / 256]. */
#define DECODE_K_BODY                                                                      \
    for (int s = 0; s < k / SB; s++) {                                                     \
        int8_t *o = u + s * SB;                                                            \
        int16_t *scs = sc16 + s * 16, *mis = mi16 + s * 16;                                \
        if (type == GGUF_Q6_K) {                                                              \
            const uint8_t *blk = src + (int64_t)s * 210;                                   \
            const int8_t *sc8 = (const int8_t *)(blk + 192);                               \
            d[s] = fm[s] = h2f(blk + 208);                                                 \
            gguf_quants_q6_k(blk, o);                                                      \
            for (int l = 0; l < SB; l++) o[l] = (int8_t)(o[l] + 32); /* unsigned: q + 32 */ \
            for (int h = 0; h < 16; h++) {                                                 \
                scs[h] = sc8[h];                                                           \
                mis[h] = (int16_t)(32 * sc8[h]);                                           \
            }                                                                              \
        } else {                                                                           \
            const uint8_t *blk = src + (int64_t)s * (type == GGUF_Q4_K ? 144 : 176);          \
            d[s] = h2f(blk);                                                               \
            fm[s] = h2f(blk + 2);                                                          \
            gguf_quants_q45_k(type == GGUF_Q5_K, blk, o);                                     \
            for (int j = 0; j < 8; j++) {                                                  \
                int c, m;                                                                  \
                gguf_scale_min_k4(j, blk + 4, &c, &m);                                     \
                scs[2 * j] = scs[2 * j + 1] = (int16_t)c;                                  \
                mis[2 * j] = mis[2 * j + 1] = (int16_t)m;                                  \
            }                                                                              \
        }                                                                                  \
    }

static void decode_k_generic(int type, const uint8_t *src, int k, int8_t *u, int16_t *sc16,
                             int16_t *mi16, float *d, float *fm) {
    DECODE_K_BODY
}

/* Activations per 256: xq, dx [k / 256], bs16 [k / 16] (int sums per 16). */
static void quantize_row_k(const float *x, int k, int8_t *xq, float *dx, int16_t *bs16) {
    for (int s = 0; s < k / SB; s++) {
        const float *v = x + s * SB;
        float amax = 0.0f;
        for (int j = 0; j < SB; j++) {
            float a = fabsf(v[j]);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        for (int h = 0; h < 16; h++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                int qv = (int)roundf(v[h * 16 + j] * id);
                qv = qv > 127 ? 127 : (qv < -127 ? -127 : qv);
                xq[s * SB + h * 16 + j] = (int8_t)qv;
                sum += qv;
            }
            bs16[s * 16 + h] = (int16_t)sum; /* |sum| <= 16 * 127 */
        }
        dx[s] = dd;
    }
}

#if X86
QAVX2_T static void quantize_row_k_avx2(const float *x, int k, int8_t *xq, float *dx,
                                        int16_t *bs16) {
    for (int s = 0; s < k / SB; s++) {
        const float *v = x + s * SB;
        float amax = hmax_abs_avx2(v, SB);
        float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        for (int h = 0; h < 16; h += 2) { /* 32 values: two groups of 16 */
            __m256i q[4];
            quantize32_avx2(v + h * 16, idv, xq + s * SB + h * 16, q);
            bs16[s * 16 + h] = (int16_t)hsum_epi32_avx2(_mm256_add_epi32(q[0], q[1]));
            bs16[s * 16 + h + 1] = (int16_t)hsum_epi32_avx2(_mm256_add_epi32(q[2], q[3]));
        }
        dx[s] = dd;
    }
}
#endif

typedef void (*quantize_k_t)(const float *, int, int8_t *, float *, int16_t *);

/* The activation quantizers per 256 on each path (bit-identical). */
static const quantize_k_t QUANTIZE_K[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = quantize_row_k,
#if X86
    [PCD_PATH_AVX2] = quantize_row_k_avx2,
#endif
};

typedef struct {
    const float *x;
    int64_t ldx;
    int k, rows, per_task;
    int8_t *xq;
    float *dx;
    int16_t *bs16;
    quantize_k_t fn;
} qkjob_t;

static void quantize_k_task(void *ctx, int t, void *scratch) {
    (void)scratch;
    qkjob_t *j = (qkjob_t *)ctx;
    int r1 = (t + 1) * j->per_task;
    if (r1 > j->rows) r1 = j->rows;
    for (int r = t * j->per_task; r < r1; r++)
        j->fn(j->x + (int64_t)r * j->ldx, j->k, j->xq + (int64_t)r * j->k,
           j->dx + (int64_t)r * (j->k / SB), j->bs16 + (int64_t)r * (j->k / 16));
}

/* As pcd_qgemm_quantize_k, on quantizer path `path` (as pcd_qgemm_quantize_path). */
int pcd_qgemm_quantize_k_path(const float *x, int64_t ldx, int rows, int k, int8_t *xq,
                              float *dx, int16_t *bs16, int threads, int path) {
    if (k % SB) return 2;
    path = pcd_path_pick(path, PCD_PATHS_BUILT(QUANTIZE_K, ));
    if (!path) return 3;
    qkjob_t j = {x, ldx, k, rows, 16, xq, dx, bs16, QUANTIZE_K[path]};
    int ntasks = (rows + 15) / 16;
    return ntasks ? run_parallel(quantize_k_task, &j, ntasks, 0, threads) : 0;
}

/* As pcd_qgemm_quantize, per 256: xq [rows, k], dx [rows, k / 256],  bs16 [rows, k / 16],
 * with the AVX2 quantizer where the CPU has it (bit-identical). Returns 0, 1 if threads
 * failed, 2 if k is not a multiple of 256. */
int pcd_qgemm_quantize_k(const float *x, int64_t ldx, int rows, int k, int8_t *xq, float *dx,
                         int16_t *bs16, int threads) {
    return pcd_qgemm_quantize_k_path(x, ldx, rows, k, xq, dx, bs16, threads, PCD_PATH_AUTO);
}

/* K micro kernels: y[r * ldy + c] = tree8 of the lanes (no minimum), R x C tile. */
typedef void (*microk_t)(int, int, const int8_t *, const float *, const int8_t *,
                         const int16_t *, const float *, int, float *, int64_t);

static void microk_scalar(int R, int C, const int8_t *xq, const float *dx, const int8_t *u,
                          const int16_t *sc16, const float *d, int k, float *y, int64_t ldy) {
    int ns = k / SB;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float acc[8] = {0};
            const int8_t *xr = xq + (int64_t)r * k, *wc = u + (int64_t)c * k;
            const int16_t *sv = sc16 + (int64_t)c * (k / 2);
            for (int s = 0; s < ns; s++) {
                int32_t I[8] = {0};
                for (int j = 0; j < 8; j++)
                    for (int l = 0; l < 8; l++) {
                        int32_t p = 0;
                        for (int e = 0; e < 4; e++) {
                            int64_t o = (int64_t)s * SB + j * 32 + 4 * l + e;
                            p += (int32_t)wc[o] * xr[o];
                        }
                        I[l] += p * sv[(s * 8 + j) * 16 + (l >> 2) * 8];
                    }
                float t = dx[(int64_t)r * ns + s] * d[(int64_t)c * ns + s];
                for (int l = 0; l < 8; l++) acc[l] = fmaf((float)I[l], t, acc[l]);
            }
            y[(int64_t)r * ldy + c] = tree8(acc);
        }
}

#if X86
AVX2_T static void decode_k_avx2(int type, const uint8_t *src, int k, int8_t *u, int16_t *sc16,
                                 int16_t *mi16, float *d, float *fm) {
    DECODE_K_BODY
}

/* End of superblock s: the lanes into the float sums. I8(r, c) is the superblock's 8
 * int32 lanes. */
#define KSTEP(I8)                                                                          \
    for (int r = 0; r < R; r++) {                                                          \
        for (int c = 0; c < C; c++) {                                                      \
            __m256 t = _mm256_set1_ps(dx[(int64_t)r * ns + s] * d[(int64_t)c * ns + s]);   \
            facc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I8(r, c)), t, facc[r][c]);     \
        }                                                                                  \
    }
#define I256(r, c) iacc[r][c]
#define I512(r, c) _mm256_add_epi32(_mm512_castsi512_si256(iacc[r][c]), _mm512_extracti64x4_epi64(iacc[r][c], 1))
#define KSTEP256 KSTEP(I256)

/* The full 4 x 2 tile with its 8 accumulators in named registers (an array of them is
 * kept on the stack by GCC, and every update then waits on a store). */
#define MICROK256_42(NAME, TGT, ACC)                                                       \
    TGT static void NAME##_42(const int8_t *xq, const float *dx, const int8_t *u,          \
                              const int16_t *sc16, const float *d, int k, float *y,        \
                              int64_t ldy) {                                               \
        const int R = 4, C = 2, ns = k / SB;                                               \
        __m256 facc[RBK][CB];                                                              \
        for (int r = 0; r < R; r++)                                                        \
            for (int c = 0; c < C; c++) facc[r][c] = _mm256_setzero_ps();                  \
        for (int s = 0; s < ns; s++) {                                                     \
            __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;         \
            __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00;                            \
            for (int j = 0; j < 8; j++) {                                                  \
                int64_t o = (int64_t)s * SB + j * 32, so = (int64_t)(s * 8 + j) * 16;     \
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(u + o));                 \
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(u + k + o));             \
                __m256i S0 = _mm256_loadu_si256((const __m256i *)(sc16 + so));             \
                __m256i S1 = _mm256_loadu_si256((const __m256i *)(sc16 + k / 2 + so));     \
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq + o));                 \
                INREG(w0); INREG(w1); INREG(S0); INREG(S1); INREG(x);                      \
                a00 = ACC(a00, _mm256_maddubs_epi16(w0, x), S0);                           \
                a01 = ACC(a01, _mm256_maddubs_epi16(w1, x), S1);                           \
                x = _mm256_loadu_si256((const __m256i *)(xq + k + o));                     \
                INREG(x);                                                                      \
                a10 = ACC(a10, _mm256_maddubs_epi16(w0, x), S0);                           \
                a11 = ACC(a11, _mm256_maddubs_epi16(w1, x), S1);                           \
                x = _mm256_loadu_si256((const __m256i *)(xq + 2 * (int64_t)k + o));        \
                INREG(x);                                                                      \
                a20 = ACC(a20, _mm256_maddubs_epi16(w0, x), S0);                           \
                a21 = ACC(a21, _mm256_maddubs_epi16(w1, x), S1);                           \
                x = _mm256_loadu_si256((const __m256i *)(xq + 3 * (int64_t)k + o));        \
                INREG(x);                                                                      \
                a30 = ACC(a30, _mm256_maddubs_epi16(w0, x), S0);                           \
                a31 = ACC(a31, _mm256_maddubs_epi16(w1, x), S1);                           \
            }                                                                              \
            __m256i iacc[RBK][CB] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};      \
            KSTEP256                                                                       \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int c = 0; c < C; c++) y[(int64_t)r * ldy + c] = hsum256(facc[r][c]);     \
    }

/* keeps a loaded vector in a register: GCC otherwise folds each use into a memory
 * operand, and the loop then makes 18 loads per 8 products instead of 8 */
#define INREG(v) __asm__("" : "+x"(v))
#define ACC_VNNI(a, p, S) _mm256_dpwssd_avx_epi32(a, p, S)
MICROK256_42(microk_avxvnni, VNNI256_T, ACC_VNNI)

/* AVX2's 4 x 2 tile: the 8 integer accumulators, the two weight and scale vectors, one
 * activation and two products take 15 of the 16 ymm registers. Written in C, GCC loads
 * all four activation rows up front and keeps three accumulators on the stack (a load,
 * add and store per step, each chained on the last), about 60% of the pmadd rate; here
 * the sub-block step is one asm block with the registers fixed. Same integers, same float
 * steps (KSTEP) in the same order: bit-identical to the C kernels. */
#define J_AVX2_ROW(XADDR, A0, A1)                                                          \
    "vmovdqu " XADDR ", %%ymm4\n\t"                                                       \
    "vpmaddubsw %%ymm4, %%ymm0, %%ymm5\n\t"                                               \
    "vpmaddubsw %%ymm4, %%ymm1, %%ymm6\n\t"                                               \
    "vpmaddwd %%ymm2, %%ymm5, %%ymm5\n\t"                                                 \
    "vpmaddwd %%ymm3, %%ymm6, %%ymm6\n\t"                                                 \
    "vpaddd %%ymm5, %" A0 ", %" A0 "\n\t"                                                 \
    "vpaddd %%ymm6, %" A1 ", %" A1 "\n\t"
/* KSTEP's float step for the AVX2 tiles (superblock s, columns 0 and 1 of the tile), with
 * the scalar product dx * d taken as a vector one (the same rounding). */
#define KSETUP_AVX2                                                                        \
    __m256 D0 = _mm256_set1_ps(d[s]), D1 = _mm256_set1_ps(d[ns + s]);
#define KROW_AVX2(r, A0, A1)                                                               \
    {                                                                                      \
        __m256 X = _mm256_set1_ps(dx[(int64_t)(r) * ns + s]);                              \
        facc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A0), _mm256_mul_ps(X, D0), facc[r][0]); \
        facc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A1), _mm256_mul_ps(X, D1), facc[r][1]); \
    }
AVX2_T static void microk_avx2_42(const int8_t *xq, const float *dx, const int8_t *u,
                                  const int16_t *sc16, const float *d, int k, float *y,
                                  int64_t ldy) {
    const int R = 4, C = 2, ns = k / SB;
    __m256 facc[RBK][CB];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) facc[r][c] = _mm256_setzero_ps();
    for (int s = 0; s < ns; s++) {
        __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
        __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        for (int j = 0; j < 8; j++) {
            int64_t o = (int64_t)s * SB + j * 32, so = (int64_t)(s * 8 + j) * 16;
            const int8_t *x0 = xq + o, *x3 = xq + 3 * (int64_t)k + o;
            __asm__("vmovdqu (%[w]), %%ymm0\n\t"
                    "vmovdqu (%[w],%[k]), %%ymm1\n\t"
                    "vmovdqu (%[sv]), %%ymm2\n\t"
                    "vmovdqu (%[sv],%[k]), %%ymm3\n\t"
                    J_AVX2_ROW("(%[x])", "[a00]", "[a01]")
                    J_AVX2_ROW("(%[x],%[k])", "[a10]", "[a11]")
                    J_AVX2_ROW("(%[x],%[k],2)", "[a20]", "[a21]")
                    J_AVX2_ROW("(%[x3])", "[a30]", "[a31]")
                    : [a00] "+x"(a00), [a01] "+x"(a01), [a10] "+x"(a10), [a11] "+x"(a11),
                      [a20] "+x"(a20), [a21] "+x"(a21), [a30] "+x"(a30), [a31] "+x"(a31)
                    : [w] "r"(u + o), [sv] "r"(sc16 + so), [x] "r"(x0), [x3] "r"(x3),
                      [k] "r"((int64_t)k)
                    : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "memory");
        }
        KSETUP_AVX2
        KROW_AVX2(0, a00, a01)
        KROW_AVX2(1, a10, a11)
        KROW_AVX2(2, a20, a21)
        KROW_AVX2(3, a30, a31)
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(int64_t)r * ldy + c] = hsum256(facc[r][c]);
}

/* 5 x 2: the scales as memory operands of the madds free the two registers a fifth row's
 * accumulators need (10 accumulators, 2 weights, 1 activation, 2 products), so each pair
 * of weight loads serves 5 rows. Same integers, same float steps per (row, column). */
#define J_AVX2_ROWM(XADDR, A0, A1)                                                         \
    "vmovdqu " XADDR ", %%ymm2\n\t"                                                        \
    "vpmaddubsw %%ymm2, %%ymm0, %%ymm3\n\t"                                                \
    "vpmaddubsw %%ymm2, %%ymm1, %%ymm4\n\t"                                                \
    "vpmaddwd (%[sv]), %%ymm3, %%ymm3\n\t"                                                 \
    "vpmaddwd (%[sv],%[k]), %%ymm4, %%ymm4\n\t"                                            \
    "vpaddd %%ymm3, %" A0 ", %" A0 "\n\t"                                                  \
    "vpaddd %%ymm4, %" A1 ", %" A1 "\n\t"
AVX2_T static void microk_avx2_52(const int8_t *xq, const float *dx, const int8_t *u,
                                  const int16_t *sc16, const float *d, int k, float *y,
                                  int64_t ldy) {
    const int ns = k / SB;
    __m256 facc[5][CB];
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < CB; c++) facc[r][c] = _mm256_setzero_ps();
    for (int s = 0; s < ns; s++) {
        __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
        __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00, a40 = a00, a41 = a00;
        for (int j = 0; j < 8; j++) {
            int64_t o = (int64_t)s * SB + j * 32, so = (int64_t)(s * 8 + j) * 16;
            const int8_t *x0 = xq + o, *x3 = xq + 3 * (int64_t)k + o;
            __asm__("vmovdqu (%[w]), %%ymm0\n\t"
                    "vmovdqu (%[w],%[k]), %%ymm1\n\t"
                    J_AVX2_ROWM("(%[x])", "[a00]", "[a01]")
                    J_AVX2_ROWM("(%[x],%[k])", "[a10]", "[a11]")
                    J_AVX2_ROWM("(%[x],%[k],2)", "[a20]", "[a21]")
                    J_AVX2_ROWM("(%[x3])", "[a30]", "[a31]")
                    J_AVX2_ROWM("(%[x3],%[k])", "[a40]", "[a41]")
                    : [a00] "+x"(a00), [a01] "+x"(a01), [a10] "+x"(a10), [a11] "+x"(a11),
                      [a20] "+x"(a20), [a21] "+x"(a21), [a30] "+x"(a30), [a31] "+x"(a31),
                      [a40] "+x"(a40), [a41] "+x"(a41)
                    : [w] "r"(u + o), [sv] "r"(sc16 + so), [x] "r"(x0), [x3] "r"(x3),
                      [k] "r"((int64_t)k)
                    : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "memory");
        }
        KSETUP_AVX2
        KROW_AVX2(0, a00, a01)
        KROW_AVX2(1, a10, a11)
        KROW_AVX2(2, a20, a21)
        KROW_AVX2(3, a30, a31)
        KROW_AVX2(4, a40, a41)
    }
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < CB; c++) y[(int64_t)r * ldy + c] = hsum256(facc[r][c]);
}

/* V: 0 AVX2 (madd + add), 1 AVX-VNNI (vpdpwssd on 256 bits). */
#define MICROK256(NAME, TGT, V)                                                            \
    TGT AI void NAME##_rc(const int R, const int C, const int8_t *xq, const float *dx,     \
                          const int8_t *u, const int16_t *sc16, const float *d, int k,     \
                          float *y, int64_t ldy) {                                         \
        int ns = k / SB;                                                                   \
        __m256 facc[RBK][CB];                                                               \
        for (int r = 0; r < R; r++)                                                        \
            for (int c = 0; c < C; c++) facc[r][c] = _mm256_setzero_ps();                  \
        for (int s = 0; s < ns; s++) {                                                     \
            __m256i iacc[RBK][CB];                                                          \
            for (int r = 0; r < R; r++)                                                    \
                for (int c = 0; c < C; c++) iacc[r][c] = _mm256_setzero_si256();           \
            for (int j = 0; j < 8; j++) {                                                  \
                __m256i w[CB], S[CB];                                                      \
                for (int c = 0; c < C; c++) {                                              \
                    w[c] = _mm256_loadu_si256(                                             \
                        (const __m256i *)(u + (int64_t)c * k + s * SB + j * 32));          \
                    S[c] = _mm256_loadu_si256(                                             \
                        (const __m256i *)(sc16 + (int64_t)c * (k / 2) + (s * 8 + j) * 16)); \
                }                                                                          \
                for (int r = 0; r < R; r++) {                                              \
                    __m256i x = _mm256_loadu_si256(                                        \
                        (const __m256i *)(xq + (int64_t)r * k + s * SB + j * 32));         \
                    for (int c = 0; c < C; c++) {                                          \
                        __m256i pr = _mm256_maddubs_epi16(w[c], x);                        \
                        if (V) iacc[r][c] = DPWSSD256(iacc[r][c], pr, S[c]);               \
                        else iacc[r][c] = _mm256_add_epi32(iacc[r][c], _mm256_madd_epi16(pr, S[c])); \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
            KSTEP256                                                                       \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int c = 0; c < C; c++) y[(int64_t)r * ldy + c] = hsum256(facc[r][c]);     \
    }                                                                                      \
    TGT static void NAME(int R, int C, const int8_t *xq, const float *dx, const int8_t *u,  \
                         const int16_t *sc16, const float *d, int k, float *y, int64_t ldy) { \
        if (R == 4 && C == 2) NAME##_42(xq, dx, u, sc16, d, k, y, ldy);                    \
        else if (C == CB) NAME##_rc(R, CB, xq, dx, u, sc16, d, k, y, ldy);                 \
        else NAME##_rc(R, 1, xq, dx, u, sc16, d, k, y, ldy);                               \
    }

#define DPWSSD256(a, b, c) _mm256_add_epi32(a, _mm256_madd_epi16(b, c))
MICROK256(microk_avx2, AVX2_T, 0)
#undef DPWSSD256
#define DPWSSD256(a, b, c) _mm256_dpwssd_avx_epi32(a, b, c)
MICROK256(microk_avxvnni, VNNI256_T, 1)
#undef DPWSSD256

/* AVX-512: two sub-blocks per register; the 16 int lanes fold to 8 (exact) before the
 * float step, so the floats are those of the 256-bit paths. */
VNNI512_T AI void microk_avx512_rc(const int R, const int C, const int8_t *xq, const float *dx,
                                   const int8_t *u, const int16_t *sc16, const float *d, int k,
                                   float *y, int64_t ldy) {
    int ns = k / SB;
    __m256 facc[RBK][CB];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) facc[r][c] = _mm256_setzero_ps();
    for (int s = 0; s < ns; s++) {
        __m512i iacc[RBK][CB];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) iacc[r][c] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j += 2) {
            __m512i w[CB], S[CB];
            for (int c = 0; c < C; c++) {
                w[c] = _mm512_loadu_si512((const void *)(u + (int64_t)c * k + s * SB + j * 32));
                S[c] = _mm512_loadu_si512((const void *)(sc16 + (int64_t)c * (k / 2) + (s * 8 + j) * 16));
            }
            for (int r = 0; r < R; r++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq + (int64_t)r * k + s * SB + j * 32));
                for (int c = 0; c < C; c++)
                    iacc[r][c] = _mm512_dpwssd_epi32(iacc[r][c], _mm512_maddubs_epi16(w[c], x), S[c]);
            }
        }
        KSTEP(I512)
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(int64_t)r * ldy + c] = hsum256(facc[r][c]);
}

VNNI512_T static void microk_avx512(int R, int C, const int8_t *xq, const float *dx,
                                    const int8_t *u, const int16_t *sc16, const float *d, int k,
                                    float *y, int64_t ldy) {
    if (R == RBK && C == CB) microk_avx512_rc(RBK, CB, xq, dx, u, sc16, d, k, y, ldy);
    else if (C == CB) microk_avx512_rc(R, CB, xq, dx, u, sc16, d, k, y, ldy);
    else microk_avx512_rc(R, 1, xq, dx, u, sc16, d, k, y, ldy);
}
#endif

typedef void (*decodek_t)(int, const uint8_t *, int, int8_t *, int16_t *, int16_t *, float *,
                          float *);

typedef struct {
    int type, k, n, rows;
    const uint8_t *w;
    int64_t rb;
    const int8_t *xq;
    const float *dx;
    const int16_t *bs16;
    float *y;
    int64_t ldy;
    decodek_t decode;
    microk_t micro;
    int L;   /* column panels: sub-block length, 32 (Q4_K, Q5_K) or 16 (Q6_K) */
    int vec; /* column panels: 1 for the AVX-512 VNNI kernel, 0 for its scalar twin */
    const float *xm; /* row panels: the minimum's activations, rows x k / lm */
    int lm;          /* row panels: the minimums' sub-block length, 32 or 16 */
    const void *bsp; /* column panels: activation sums per sub-block of L, int16 pairs */
    int amx_np;      /* column panels on AMX: panels of KC columns per task */
} kjob_t;

static size_t panel_k_bytes(int k) {
    return (size_t)NCK * k + (size_t)NCK * (k / 16) * 2 * sizeof(int16_t) +
           (size_t)NCK * (k / 2) * sizeof(int16_t) +
           (size_t)NCK * (k / SB) * 2 * sizeof(float) + (size_t)NCK * (k / 16) * sizeof(float) +
           64;
}

/* The minimum's term of a panel (see "K-quant mode"): y[r][c] += the in-order fma chain of
 * xm[r][i] * wm[i][c] over i, for the panel's nc columns (wm: ni x NCK). */
static void kmin_pass_scalar(const float *xm, int ni, int rows, const float *wm, int nc,
                             float *y, int64_t ldy) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < nc; c++) {
            float m = 0.0f;
            for (int i = 0; i < ni; i++) m = fmaf(xm[(int64_t)r * ni + i], wm[(int64_t)i * NCK + c], m);
            y[(int64_t)r * ldy + c] += m;
        }
}

#if X86
AVX2_T static inline void kmin_add_avx2(__m256 m, int nc, float *y) {
    if (nc == NCK) {
        _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), m));
        return;
    }
    float t[NCK];
    _mm256_storeu_ps(t, m);
    for (int c = 0; c < nc; c++) y[c] += t[c];
}

/* kmin_pass_scalar across the panel's 8 columns, 8 rows at a time (8 independent chains
 * keep both fma pipes busy); lane c is column c's chain, so bit-identical. */
AVX2_T static void kmin_pass_avx2(const float *xm, int ni, int rows, const float *wm, int nc,
                                  float *y, int64_t ldy) {
    int r = 0;
    for (; r + 8 <= rows; r += 8) {
        __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0, m4 = m0, m5 = m0, m6 = m0,
               m7 = m0;
        const float *x = xm + (int64_t)r * ni;
        for (int i = 0; i < ni; i++) {
            __m256 w = _mm256_loadu_ps(wm + (int64_t)i * NCK);
            m0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i), w, m0);
            m1 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + ni + i), w, m1);
            m2 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 2 * ni + i), w, m2);
            m3 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 3 * ni + i), w, m3);
            m4 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 4 * ni + i), w, m4);
            m5 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 5 * ni + i), w, m5);
            m6 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 6 * ni + i), w, m6);
            m7 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 7 * ni + i), w, m7);
        }
        __m256 m[8] = {m0, m1, m2, m3, m4, m5, m6, m7};
        for (int q = 0; q < 8; q++) kmin_add_avx2(m[q], nc, y + (int64_t)(r + q) * ldy);
    }
    for (; r < rows; r++) {
        __m256 m0 = _mm256_setzero_ps();
        const float *x = xm + (int64_t)r * ni;
        for (int i = 0; i < ni; i++)
            m0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i), _mm256_loadu_ps(wm + (int64_t)i * NCK), m0);
        kmin_add_avx2(m0, nc, y + (int64_t)r * ldy);
    }
}
#endif

static void gemm_k_task(void *ctx, int t, void *scratch) {
    kjob_t *j = (kjob_t *)ctx;
    int k = j->k, ns = k / SB;
    int c0 = t * NCK, nc = j->n - c0 < NCK ? j->n - c0 : NCK;
    int8_t *u = (int8_t *)scratch;                       /* NCK * k */
    int16_t *sc16 = (int16_t *)(u + (size_t)NCK * k);     /* NCK * k / 16 */
    int16_t *mi16 = sc16 + (size_t)NCK * (k / 16);        /* NCK * k / 16 */
    float *d = (float *)(mi16 + (size_t)NCK * (k / 16));  /* NCK * ns */
    float *fm = d + (size_t)NCK * ns;                     /* NCK * ns */
    int16_t *sv = (int16_t *)(fm + (size_t)NCK * ns);     /* NCK * k / 2: scales by lane */
    float *wm = (float *)(sv + (size_t)NCK * (k / 2));    /* k / lm x NCK: the minimums */
    for (int c = 0; c < nc; c++)
        j->decode(j->type, j->w + (int64_t)(c0 + c) * j->rb, k, u + (int64_t)c * k,
                  sc16 + (int64_t)c * (k / 16), mi16 + (int64_t)c * (k / 16),
                  d + (int64_t)c * ns, fm + (int64_t)c * ns);
    int lm = j->lm, ni = k / lm;
    for (int i = 0; i < ni; i++)
        for (int c = 0; c < NCK; c++)
            wm[(int64_t)i * NCK + c] =
                c < nc ? -fm[(int64_t)c * ns + i * lm / SB] * (float)mi16[(int64_t)c * (k / 16) + i * lm / 16]
                       : 0.0f;
    /* the scales as the madd wants them: per sub-block of 32, 8 x sc16[2j], 8 x sc16[2j+1] */
    for (int c = 0; c < nc; c++)
        for (int b = 0; b < k / 32; b++)
            for (int i = 0; i < 16; i++)
                sv[(int64_t)c * (k / 2) + b * 16 + i] = sc16[(int64_t)c * (k / 16) + 2 * b + i / 8];
    int step = RBK;
#if X86
    if (j->micro == microk_avx2) step = 5; /* microk_avx2_52 */
#endif
    for (int r0 = 0; r0 < j->rows; r0 += step) {
        int R = j->rows - r0 < step ? j->rows - r0 : step;
        const int8_t *xr = j->xq + (int64_t)r0 * k;
        const float *dr = j->dx + (int64_t)r0 * ns;
        float *yr = j->y + (int64_t)r0 * j->ldy + c0;
        for (int c = 0; c < nc; c += CB) {
            int C = nc - c < CB ? nc - c : CB;
#if X86
            if (R == 5 && C == CB) {
                microk_avx2_52(xr, dr, u + (int64_t)c * k, sv + (int64_t)c * (k / 2),
                               d + (int64_t)c * ns, k, yr + c, j->ldy);
                continue;
            }
            if (R == 5) { /* an odd last column: 4 rows, then 1 */
                for (int r = 0; r < 5; r += 4)
                    j->micro(r ? 1 : 4, C, xr + (int64_t)r * k, dr + (int64_t)r * ns,
                             u + (int64_t)c * k, sv + (int64_t)c * (k / 2), d + (int64_t)c * ns,
                             k, yr + (int64_t)r * j->ldy + c, j->ldy);
                continue;
            }
#endif
            j->micro(R, C, xr, dr, u + (int64_t)c * k, sv + (int64_t)c * (k / 2),
                     d + (int64_t)c * ns, k, yr + c, j->ldy);
        }
    }
    float *y0 = j->y + c0;
#if X86
    if (j->micro != microk_scalar) { /* every SIMD path has AVX2 */
        kmin_pass_avx2(j->xm, ni, j->rows, wm, nc, y0, j->ldy);
        return;
    }
#endif
    kmin_pass_scalar(j->xm, ni, j->rows, wm, nc, y0, j->ldy);
}

/* The K-quant row-panel kernels on each path: the decoder and the micro kernel. */
static const struct {
    decodek_t decode;
    microk_t micro;
} INT8_K[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = {decode_k_generic, microk_scalar},
#if X86
    [PCD_PATH_AVX2] = {decode_k_avx2, microk_avx2},
    [PCD_PATH_AVXVNNI] = {decode_k_avx2, microk_avxvnni},
    [PCD_PATH_AVX512VNNI] = {decode_k_avx2, microk_avx512},
#endif
};

/* y = the K-quant matrix applied to activations from pcd_qgemm_quantize_k. Returns 0; 1
 * threads or memory failed; 2 not a K-quant type or k not a multiple of 256; 3 path
 * unavailable. */
int pcd_qgemm_int8_k(int type, const uint8_t *w, int n, int k, const int8_t *xq,
                     const float *dx, const int16_t *bs16, int rows, float *y, int64_t ldy,
                     int path, int threads) {
    if ((type != GGUF_Q4_K && type != GGUF_Q5_K && type != GGUF_Q6_K) || k % SB) return 2;
    int bb = pcd_qgemm_block(type, 0);
    path = pcd_path_pick(path, PCD_PATHS_BUILT(INT8_K, .decode));
    if (!path) return 3;
    kjob_t j = {type, k, n, rows, w, (int64_t)(k / SB) * bb, xq, dx, bs16, y, ldy,
                INT8_K[path].decode, INT8_K[path].micro};
    /* the minimum's activations: dx times the int sums per sub-block of lm */
    int lm = type == GGUF_Q6_K ? 16 : 32, ni = k / lm, ns = k / SB;
    float *xm = (float *)malloc(((size_t)rows * ni + 1) * sizeof(float));
    if (!xm) return 1;
    for (int r = 0; r < rows; r++) {
        const int16_t *bs = bs16 + (int64_t)r * (k / 16);
        for (int i = 0; i < ni; i++) {
            int b = lm == 16 ? bs[i] : bs[2 * i] + bs[2 * i + 1];
            xm[(int64_t)r * ni + i] = dx[(int64_t)r * ns + i * lm / SB] * (float)b;
        }
    }
    j.xm = xm;
    j.lm = lm;
    int rc = run_parallel(gemm_k_task, &j, (n + NCK - 1) / NCK, panel_k_bytes(k), threads);
    free(xm);
    return rc;
}

/* ---------------------------------------------------------------- bf16 route */

#if X86
#define BF16_T __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

/* x [rows, k] float32 -> bf16 (round to nearest even), k a multiple of 32. */
BF16_T static void to_bf16_row(const float *x, int k, uint16_t *out) {
    for (int e = 0; e < k; e += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + e + 16), _mm512_loadu_ps(x + e));
        _mm512_storeu_si512((void *)(out + e), (__m512i)v);
    }
}

typedef struct {
    int type, k, n, rows;
    const uint8_t *w;
    int64_t rb;
    const uint16_t *xb;
    float *y;
    int64_t ldy;
} bjob_t;

BF16_T static void bf16_task(void *ctx, int t, void *scratch) {
    bjob_t *j = (bjob_t *)ctx;
    int k = j->k, nb = k / QB;
    int c0 = t * NC, nc = j->n - c0 < NC ? j->n - c0 : NC;
    uint16_t *wb = (uint16_t *)scratch;                 /* NC * k bf16 */
    float *deq = (float *)(wb + (size_t)NC * k);        /* k floats */
    int8_t *q = (int8_t *)(deq + k);
    float *sc = (float *)(q + k + 64), *mn = sc + 2 * nb;
    for (int c = 0; c < nc; c++) {
        decode_row_avx2(j->type, j->w + (int64_t)(c0 + c) * j->rb, k, q, sc, mn);
        for (int e = 0; e < k; e++) deq[e] = sc[e / 16] * (float)q[e] + mn[e / QB];
        to_bf16_row(deq, k, wb + (int64_t)c * k);
    }
    for (int r0 = 0; r0 < j->rows; r0 += RB) {
        int R = j->rows - r0 < RB ? j->rows - r0 : RB;
        for (int c = 0; c < nc; c += CB) {
            int C = nc - c < CB ? nc - c : CB;
            __m512 acc[RB][CB];
            for (int r = 0; r < R; r++)
                for (int cc = 0; cc < C; cc++) acc[r][cc] = _mm512_setzero_ps();
            for (int e = 0; e < k; e += 32) {
                __m512bh wv[CB];
                for (int cc = 0; cc < C; cc++)
                    wv[cc] = (__m512bh)_mm512_loadu_si512((const void *)(wb + (int64_t)(c + cc) * k + e));
                for (int r = 0; r < R; r++) {
                    __m512bh xv = (__m512bh)_mm512_loadu_si512(
                        (const void *)(j->xb + (int64_t)(r0 + r) * k + e));
                    for (int cc = 0; cc < C; cc++) acc[r][cc] = _mm512_dpbf16_ps(acc[r][cc], xv, wv[cc]);
                }
            }
            for (int r = 0; r < R; r++)
                for (int cc = 0; cc < C; cc++)
                    j->y[(int64_t)(r0 + r) * j->ldy + c0 + c + cc] = _mm512_reduce_add_ps(acc[r][cc]);
        }
    }
}
#endif

/* y = bf16(x) @ bf16(dequant(w))^T, float32 sums. Returns 0; 1 threads failed; 2 bad
 * type or k; 3 this CPU has no AVX-512 BF16. */
int pcd_qgemm_bf16(int type, const uint8_t *w, int n, int k, const float *x, int64_t ldx,
                   int rows, float *y, int64_t ldy, int threads) {
    int elems, bb = pcd_qgemm_block(type, &elems);
    if (!bb || k % elems) return 2;
    if (!pcd_path_runs(PCD_PATH_AVX512BF16)) return 3;
#if X86
    uint16_t *xb = aligned_alloc(64, ((size_t)rows * k * 2 + 63) & ~(size_t)63);
    if (!xb) return 1;
    for (int r = 0; r < rows; r++) to_bf16_row(x + (int64_t)r * ldx, k, xb + (int64_t)r * k);
    bjob_t j = {type, k, n, rows, w, (int64_t)(k / elems) * bb, xb, y, ldy};
    size_t scratch = (size_t)NC * k * 2 + (size_t)k * 4 + (size_t)k + 64 + sizeof(float) * 3 * (k / QB);
    int rc = run_parallel(bf16_task, &j, (n + NC - 1) / NC, scratch, threads);
    free(xb);
    return rc;
#else
    (void)w; (void)n; (void)x; (void)ldx; (void)rows; (void)y; (void)ldy; (void)threads;
    return 3;
#endif
}

/* ---------------------------------------------------------------- K-quants, column panels
 *
 * The K-quant mode again (activations per 256: xq, dx, bs16 from pcd_qgemm_quantize_k),
 * with the products laid out for VNNI across output columns, as llama.cpp's repacked
 * kernels do: a task decodes a panel of KC = 32 columns into two groups of 16, in which
 * the 64 bytes at (group, 4-byte group q) hold bytes 4q..4q+3 of each of the 16 columns'
 * unsigned quants. One vpdpbusd then takes 64 multiply-adds, the activation's 4 bytes
 * broadcast to every lane, and one weight load serves KR rows. Per (row, column,
 * superblock s) every kernel computes the same integers and float operations:
 *     I = sum_j sc[j] * sum_{e in sub-block j} u[e] * xq[e]    (int32, exact; sub-blocks
 *                                                               of 32, Q6_K: 16)
 *     M = sum_j mi[j] * bsL[j]                                 (int32, exact; per
 *                                                               sub-block of L)
 *     acc = fma((float)I, dx * d, acc);  acc = fma(-(float)M, dx * fm, acc)
 * so the scalar twin (cols-scalar) and cols-avx512vnni are bit-identical, and a row's
 * result never depends on the other rows of the call. The float order differs from the
 * 8-lane K micro kernels above (there the lanes are summed at the end): equal within
 * float32 rounding, with fewer roundings here (the superblock's lanes are summed in
 * integers).
 * Bounds: |sum_e u xq| <= 32 * 31 * 127 (Q5_K), times sc <= 63, 8 sub-blocks: < 2^31;
 * Q6_K: 16 * 63 * 127 * 128 * 16 < 2^31; |M| <= 16 * 2032 * 4096 < 2^31.
 * The minimum's term takes one vpdpwssd per pair of sub-blocks: the minimums (mi[j],
 * mi[j + 1]) against the activations' sums (bsL[j], bsL[j + 1]) as int16 pairs; for Q4_K
 * and Q5_K (one minimum per 32) bsL is the sum of two bs16 (|bsL| <= 32 * 128: an int16),
 * formed once per call (`bsp`), so 4 vpdpwssd per superblock instead of 8 over pairs of
 * 16 (the same integer M). */

#define KG 2  /* groups of 16 columns (lanes) per panel */
#define KC (16 * KG) /* columns per panel */
#define KR 6  /* rows per tile */


/* Panel layout in the scratch, per group g of 16 columns (lane = column % 16):
 *   wp  [KG][k/4][16] int32: 4 quant bytes
 *   scp [KG][k/L][16] int32: sub-block scale
 *   mip [KG][k/(2L)][16] int32: mins of sub-blocks (j, j+1) of L as 2 x int16
 *   dp, fmp [KG][ns][16] float */
static size_t panel_kc_bytes(int k) {
    int ns = k / SB;
    return (size_t)KG * 16 * 4 * ((size_t)k / 4 + (size_t)k / 16 + (size_t)k / 32 + 2 * (size_t)ns) +
           16 * (size_t)k + (size_t)k / 16 * 4 + (size_t)ns * 8 + 256;
}

/* Pair p of row r's activation sums (`bsp` may be bs16 itself: read by memcpy). */
static inline int32_t kc_bs(const kjob_t *j, int64_t r, int p) {
    int32_t v;
    memcpy(&v, (const char *)j->bsp + (r * (j->k / (2 * j->L)) + p) * 4, 4);
    return v;
}

/* The panel's arrays in a task's scratch (the layout above). */
typedef struct {
    int32_t *wp, *scp, *mip;
    float *dp, *fmp;
} kcpanel_t;

/* The columns of the panel at column c (KC, or fewer at the matrix's edge). */
static inline int kc_cols(const kjob_t *j, int c) { return j->n - c < KC ? j->n - c : KC; }

static kcpanel_t kc_panel(const void *scratch, int k, int L) {
    kcpanel_t p;
    p.wp = (int32_t *)scratch;
    p.scp = p.wp + (size_t)KG * 16 * (k / 4);
    p.mip = p.scp + (size_t)KG * 16 * (k / L);
    p.dp = (float *)(p.mip + (size_t)KG * 16 * (k / (2 * L)));
    p.fmp = p.dp + (size_t)KG * 16 * (k / SB);
    return p;
}

#if X86
/* dst[i * 16 + l] = src[l * ss + i] for a 16 x 16 block of int32: two interleaving steps
 * within 128-bit lanes, then a 4 x 4 transpose of the lanes. */
VNNI512_T static void kc_transpose16(const int32_t *src, int64_t ss, int32_t *dst) {
    __m512i r[16], t[16];
    for (int l = 0; l < 16; l++) r[l] = _mm512_loadu_si512((const void *)(src + l * ss));
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + j], lane k: rows 4i .. 4i + 3 of item 4k + j */
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int jj = 0; jj < 4; jj++) {
        __m512i b0 = _mm512_shuffle_i32x4(r[jj], r[4 + jj], 0x44);
        __m512i b1 = _mm512_shuffle_i32x4(r[jj], r[4 + jj], 0xEE);
        __m512i b2 = _mm512_shuffle_i32x4(r[8 + jj], r[12 + jj], 0x44);
        __m512i b3 = _mm512_shuffle_i32x4(r[8 + jj], r[12 + jj], 0xEE);
        _mm512_storeu_si512((void *)(dst + (0 + jj) * 16), _mm512_shuffle_i32x4(b0, b2, 0x88));
        _mm512_storeu_si512((void *)(dst + (4 + jj) * 16), _mm512_shuffle_i32x4(b0, b2, 0xDD));
        _mm512_storeu_si512((void *)(dst + (8 + jj) * 16), _mm512_shuffle_i32x4(b1, b3, 0x88));
        _mm512_storeu_si512((void *)(dst + (12 + jj) * 16), _mm512_shuffle_i32x4(b1, b3, 0xDD));
    }
}
#endif

/* The panel of columns [c0, c0 + nc): each column decoded, then laid out by lane. On the
 * vector path a group's 16 columns are decoded side by side and their quant words
 * transposed 16 x 16 at a time (a word per lane scattered one by one cost a 256-token
 * prefill of a 1.5B about 8% of its time); the same panel, byte for byte. */
static void decode_kc_panel(const kjob_t *j, int c0, int nc, void *scratch) {
    int k = j->k, ns = k / SB, L = j->L;
    kcpanel_t P = kc_panel(scratch, k, L);
    int32_t *wp = P.wp, *scp = P.scp, *mip = P.mip;
    float *dp = P.dp, *fmp = P.fmp;
    int8_t *u = (int8_t *)(fmp + (size_t)KG * 16 * ns); /* 16 columns' quants, k each */
    int16_t *sc16 = (int16_t *)(u + 16 * (size_t)k), *mi16 = sc16 + k / 16;
    float *d = (float *)(mi16 + k / 16), *fm = d + ns;
    if (nc < KC) /* a partial panel's missing lanes are zero; a whole one is all written */
        memset(scratch, 0, (size_t)KG * 16 * 4 * ((size_t)k / 4 + k / L + k / (2 * L) + 2 * (size_t)ns));
    for (int c = 0; c < nc; c++) {
        int g = c / 16, l = c % 16;
        int8_t *ul = j->vec ? u + (size_t)l * k : u;
#if X86
        if (j->vec) decode_k_avx2(j->type, j->w + (int64_t)(c0 + c) * j->rb, k, ul, sc16, mi16, d, fm);
        else
#endif
            decode_k_generic(j->type, j->w + (int64_t)(c0 + c) * j->rb, k, ul, sc16, mi16, d, fm);
        int32_t *wg = wp + (size_t)g * 16 * (k / 4);
#if X86
        if (j->vec) {
            if (l == 15 || c == nc - 1) { /* the group's columns are all decoded */
                if (l < 15) memset(u + (size_t)(l + 1) * k, 0, (size_t)(15 - l) * k);
                for (int q = 0; q < k / 4; q += 16) kc_transpose16((const int32_t *)u + q, k / 4, wg + q * 16);
            }
        } else
#endif
        {
            const int32_t *u4 = (const int32_t *)ul;
            for (int q = 0; q < k / 4; q++) wg[q * 16 + l] = u4[q];
        }
        int32_t *sg = scp + (size_t)g * 16 * (k / L);
        for (int b = 0; b < k / L; b++) sg[b * 16 + l] = sc16[b * L / 16];
        int32_t *mg = mip + (size_t)g * 16 * (k / (2 * L)), U = L / 16; /* mi16 per sub-block */
        for (int p = 0; p < k / (2 * L); p++)
            mg[p * 16 + l] = (int32_t)(((uint32_t)(uint16_t)mi16[(2 * p + 1) * U] << 16) | (uint16_t)mi16[2 * p * U]);
        for (int s = 0; s < ns; s++) {
            dp[((size_t)g * ns + s) * 16 + l] = d[s];
            fmp[((size_t)g * ns + s) * 16 + l] = fm[s];
        }
    }
}

/* The scalar twin: rows [r0, r0 + R), panel columns [0, nc). */
static void kc_scalar(const kjob_t *j, const void *scratch, int r0, int R, int c0, int nc) {
    int k = j->k, ns = k / SB, L = j->L;
    kcpanel_t P = kc_panel(scratch, k, L);
    const int32_t *wp = P.wp, *scp = P.scp, *mip = P.mip;
    const float *dp = P.dp, *fmp = P.fmp;
    for (int r = r0; r < r0 + R; r++) {
        const int8_t *xr = j->xq + (int64_t)r * k;
        for (int c = 0; c < nc; c++) {
            int g = c / 16, l = c % 16;
            const int32_t *wg = wp + (size_t)g * 16 * (k / 4);
            float acc = 0.0f;
            for (int s = 0; s < ns; s++) {
                int32_t I = 0, M = 0;
                for (int b = s * (SB / L); b < (s + 1) * (SB / L); b++) {
                    int32_t dot = 0;
                    for (int q = b * L / 4; q < (b + 1) * L / 4; q++) {
                        int32_t wv = wg[q * 16 + l];
                        for (int e = 0; e < 4; e++)
                            dot += (int32_t)(uint8_t)(wv >> (8 * e)) * xr[4 * q + e];
                    }
                    I += dot * scp[((size_t)g * (k / L) + b) * 16 + l];
                }
                for (int p = s * (SB / (2 * L)); p < (s + 1) * (SB / (2 * L)); p++) {
                    int32_t mv = mip[((size_t)g * (k / (2 * L)) + p) * 16 + l], bv = kc_bs(j, r, p);
                    M += (int32_t)(int16_t)(mv & 0xFFFF) * (int16_t)(bv & 0xFFFF) +
                         (int32_t)(int16_t)(mv >> 16) * (int16_t)(bv >> 16);
                }
                float dxs = j->dx[(int64_t)r * ns + s];
                float t = dxs * dp[((size_t)g * ns + s) * 16 + l];
                float tm = dxs * fmp[((size_t)g * ns + s) * 16 + l];
                acc = fmaf((float)I, t, acc);
                acc = fmaf(-(float)M, tm, acc);
            }
            j->y[(int64_t)r * j->ldy + c0 + c] = acc;
        }
    }
}

#if X86
/* R rows x G groups of 16 columns; `mask`: the lanes of the last group to store. The
 * float sums live in y (one load and store per superblock), which leaves the registers
 * to the integer accumulators. */
VNNI512_T AI void kc_avx512_rg(const int R, const int G, const int L, const int FULL, const kjob_t *j,
                               const void *scratch, int r0, int c0, __mmask16 mask) {
    const int k = j->k, ns = k / SB;
    kcpanel_t P = kc_panel(scratch, k, L);
    const int32_t *wp = P.wp, *scp = P.scp, *mip = P.mip;
    const float *dp = P.dp, *fmp = P.fmp;
    const int8_t *xq = j->xq + (int64_t)r0 * k;
    const float *dx = j->dx + (int64_t)r0 * ns;
    float *y = j->y + (int64_t)r0 * j->ldy + c0;
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            _mm512_mask_storeu_ps(y + (int64_t)r * j->ldy + 16 * g, g == G - 1 ? mask : (__mmask16)0xFFFF,
                                  _mm512_setzero_ps());
    for (int s = 0; s < ns; s++) {
        __m512i I[KR][KG];
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++) I[r][g] = _mm512_setzero_si512();
        for (int b = s * (SB / L); b < (s + 1) * (SB / L); b++) {
            __m512i a[KR][KG];
            for (int r = 0; r < R; r++)
                for (int g = 0; g < G; g++) a[r][g] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int qi = 0; qi < L / 4; qi++) {
                const int q = b * (L / 4) + qi;
                __m512i w[KG];
                for (int g = 0; g < G; g++)
                    w[g] = _mm512_load_si512((const void *)(wp + ((size_t)g * (k / 4) + q) * 16));
                for (int r = 0; r < R; r++) {
                    int32_t xv;
                    memcpy(&xv, xq + (int64_t)r * k + 4 * q, 4);
                    __m512i xb = _mm512_set1_epi32(xv);
                    for (int g = 0; g < G; g++) a[r][g] = _mm512_dpbusd_epi32(a[r][g], w[g], xb);
                }
            }
            for (int g = 0; g < G; g++) {
                __m512i sv = _mm512_load_si512((const void *)(scp + ((size_t)g * (k / L) + b) * 16));
                for (int r = 0; r < R; r++) I[r][g] = _mm512_add_epi32(I[r][g], _mm512_mullo_epi32(a[r][g], sv));
            }
        }
        __m512i M[KR][KG];
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++) M[r][g] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int p = s * (SB / (2 * L)); p < (s + 1) * (SB / (2 * L)); p++) {
            __m512i mv[KG];
            for (int g = 0; g < G; g++)
                mv[g] = _mm512_load_si512((const void *)(mip + ((size_t)g * (k / (2 * L)) + p) * 16));
            for (int r = 0; r < R; r++) {
                __m512i bb = _mm512_set1_epi32(kc_bs(j, r0 + r, p));
                for (int g = 0; g < G; g++) M[r][g] = _mm512_dpwssd_epi32(M[r][g], mv[g], bb);
            }
        }
        for (int g = 0; g < G; g++) {
            __m512 dv = _mm512_load_ps(dp + ((size_t)g * ns + s) * 16);
            __m512 fv = _mm512_load_ps(fmp + ((size_t)g * ns + s) * 16);
            const int whole = FULL || g < G - 1; /* masked stores are slow here: only at the edge */
            for (int r = 0; r < R; r++) {
                float *yr = y + (int64_t)r * j->ldy + 16 * g;
                __m512 xs = _mm512_set1_ps(dx[(int64_t)r * ns + s]);
                __m512 acc = whole ? _mm512_loadu_ps(yr) : _mm512_maskz_loadu_ps(mask, yr);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r][g]), _mm512_mul_ps(xs, dv), acc);
                acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[r][g]), _mm512_mul_ps(xs, fv), acc);
                if (whole) _mm512_storeu_ps(yr, acc);
                else _mm512_mask_storeu_ps(yr, mask, acc);
            }
        }
    }
}

VNNI512_T static void kc_avx512(const kjob_t *j, const void *scratch, int r0, int R, int c0, int nc) {
    int G = (nc + 15) / 16;
    __mmask16 mask = (__mmask16)(nc % 16 ? (1u << (nc % 16)) - 1 : 0xFFFF);
#define KC_G(RR, LL)                                                                       \
    if (G == 2 && mask == 0xFFFF) kc_avx512_rg(RR, 2, LL, 1, j, scratch, r0, c0, mask);   \
    else if (G == 2) kc_avx512_rg(RR, 2, LL, 0, j, scratch, r0, c0, mask);              \
    else kc_avx512_rg(RR, 1, LL, 0, j, scratch, r0, c0, mask);
#define KC_CASE(RR)                                                                        \
    if (j->L == 32) {                                                                      \
        KC_G(RR, 32)                                                                       \
    } else {                                                                               \
        KC_G(RR, 16)                                                                       \
    }
    switch (R) {
    case 6: KC_CASE(6) break;
    case 5: KC_CASE(5) break;
    case 4: KC_CASE(4) break;
    case 3: KC_CASE(3) break;
    case 2: KC_CASE(2) break;
    default: KC_CASE(1) break;
    }
#undef KC_CASE
#undef KC_G
}
#endif

#if X86
/* --- AMX (PCD_PATH_AMX): the same integers from the tile unit.
 * A tile product sums its 64 bytes of k in one int32, so the sub-block scales must be in
 * the operands: per panel the quants are folded with their scales, v = sc * u (|v| <=
 * 8,001: Q6_K's 63 * 127), and v split into bytes, v = lo + 256 * hi (lo unsigned, hi
 * signed), laid out as the panel's words (row q of a group: bytes 4q..4q+3 of its 16
 * columns, a B tile's layout). Per superblock, a tile of 16 rows x 16 columns then takes
 *     I = A.lo + 256 * (A.hi)   (tdpbsud and tdpbssd over the 256 bytes, 4 steps of 64)
 * which is kc_scalar's I exactly (the same integer, summed in another order; every
 * partial sum within int32). M (vpdpwssd) and the float steps are kc_avx512_rg's in the
 * same order: the result is kc_scalar's bit for bit. Rows past the last whole 16 go
 * through kc_avx512 (also bit-identical), so no row's result depends on what shares its
 * call. Tiles: A rows 0-15 / 16-31 in tmm0 / tmm1, B lo / hi in tmm2 / tmm3, C in
 * tmm4..7 ((A0, A1) x (lo, hi)). A task holds several panels (`amx_panels`); per 32 rows
 * and superblock each (panel, group) pair in turn takes its products, the activations'
 * 8 KiB staying in L1, and its C tiles (two 4 KiB buffers) are summed by the vector unit
 * between the tile steps of the next pair (on the Xeon measured the two units did not
 * overlap: a 1,024-row product spends about as long in each). The tile shapes are
 * cpu_paths.h's (`pcd_amx_config`). */
#define AMX_T __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

/* An AMX task's scratch: per panel, kc's panel then (at amx_lo_at, 64-aligned) the folded
 * lo and hi; after the panels, the running float sums of each (panel, group) for 32 rows
 * and two buffers of four C tiles. */
#define AMX_ACC_BYTES ((size_t)KG * 32 * 16 * 4) /* a panel's sums: [KG][32][16] floats */
#define AMX_BUF_BYTES ((size_t)2 * 4 * 1024)     /* two of four 16 x 16 int32 tiles */

static size_t amx_lo_at(int k) { return (panel_kc_bytes(k) + 63) & ~(size_t)63; }

static size_t amx_panel_bytes(int k) { return amx_lo_at(k) + 2 * (size_t)KC * k; }

static size_t amx_task_bytes(int k, int np) {
    return (size_t)np * (amx_panel_bytes(k) + AMX_ACC_BYTES) + AMX_BUF_BYTES;
}

/* The panel's folded quants: lo / hi [KG][k/4][16] words, from wp (u) and scp (sc). */
AMX_T static void amx_fold(const kcpanel_t *P, int k, int L, int G, int8_t *lo, int8_t *hi) {
    /* int16 element e of a 32-element half takes the sc of lane e / 4 (+ 8 in the upper) */
    int16_t a0[32], a1[32];
    for (int e = 0; e < 32; e++) {
        a0[e] = (int16_t)(2 * (e / 4));
        a1[e] = (int16_t)(2 * (8 + e / 4));
    }
    const __m512i ix0 = _mm512_loadu_si512((const void *)a0), ix1 = _mm512_loadu_si512((const void *)a1);
    for (int g = 0; g < G; g++)
        for (int q = 0; q < k / 4; q++) {
            const size_t at = ((size_t)g * (k / 4) + q) * 16;
            __m512i sc = _mm512_load_si512((const void *)(P->scp + ((size_t)g * (k / L) + 4 * q / L) * 16));
            __m512i u = _mm512_load_si512((const void *)(P->wp + at));
            __m512i v0 = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(u)),
                                            _mm512_permutexvar_epi16(ix0, sc));
            __m512i v1 = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(u, 1)),
                                            _mm512_permutexvar_epi16(ix1, sc));
            __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(v0)),
                                           _mm512_cvtepi16_epi8(v1), 1);
            __m512i h = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(v0, 8))),
                _mm512_cvtepi16_epi8(_mm512_srai_epi16(v1, 8)), 1);
            _mm512_store_si512((void *)(lo + 4 * at), l);
            _mm512_store_si512((void *)(hi + 4 * at), h);
        }
}

/* The vector half of a superblock: the float sums of rows [r0 + ra, r0 + rb) (of a
 * block of 16 * nrb) and group g from its C tiles in buf. acc [32][16] holds the block's
 * sums until the last superblock, which writes them to y (rows n floats apart; `mask`:
 * the group's columns). */
typedef struct {
    const kcpanel_t *P;
    const int32_t *buf;
    int r0, g, s;
    float *acc, *y;
    __mmask16 mask;
} amx_fin_t;

AMX_T AI void amx_finish(const kjob_t *j, const amx_fin_t *f, int ra, int rb, const int L) {
    /* every field read once into locals: the vector stores may alias them */
    const int k = j->k, ns = k / SB, s = f->s, g = f->g, np = SB / (2 * L), pr = k / (2 * L);
    const int64_t ldy = j->ldy;
    const int32_t *bs = (const int32_t *)j->bsp + (int64_t)f->r0 * pr + s * np;
    const float *dx = j->dx + (int64_t)f->r0 * ns + s;
    const int32_t *buf = f->buf;
    float *acc = f->acc, *y = f->y;
    const __mmask16 mask = f->mask;
    const __m512 dv = _mm512_load_ps(f->P->dp + ((size_t)g * ns + s) * 16);
    const __m512 fv = _mm512_load_ps(f->P->fmp + ((size_t)g * ns + s) * 16);
    const int32_t *mip = f->P->mip + ((size_t)g * pr + (size_t)s * np) * 16;
    __m512i mv[SB / 32]; /* the superblock's minimums, pairs of sub-blocks */
    for (int p = 0; p < np; p++) mv[p] = _mm512_load_si512((const void *)(mip + p * 16));
    for (int r = ra; r < rb; r++) {
        const int32_t *t = buf + (size_t)(r / 16) * 256 + (r % 16) * 16;
        __m512i I = _mm512_add_epi32(_mm512_load_si512((const void *)t),
                                     _mm512_slli_epi32(_mm512_load_si512((const void *)(t + 512)), 8));
        __m512i M = _mm512_setzero_si512();
        for (int p = 0; p < np; p++) { /* bs is read as bytes in kc_bs: the same int32 */
            int32_t v;
            memcpy(&v, bs + (int64_t)r * pr + p, 4);
            M = _mm512_dpwssd_epi32(M, mv[p], _mm512_set1_epi32(v));
        }
        __m512 xs = _mm512_set1_ps(dx[(int64_t)r * ns]);
        __m512 a = s == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc + 16 * r);
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(xs, dv), a);
        a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(xs, fv), a);
        if (s < ns - 1) _mm512_store_ps(acc + 16 * r, a);
        else if (mask == 0xFFFF) _mm512_storeu_ps(y + (int64_t)r * ldy, a);
        else _mm512_mask_storeu_ps(y + (int64_t)r * ldy, mask, a);
    }
}

/* Superblock s's C tiles of rows [r0, r0 + 16 * nrb) and group g into buf (4 tiles of
 * 16 x 16 int32: (A0, lo), (A1, lo), (A0, hi), (A1, hi)), lo / hi 0 for none; and,
 * between its four steps of 64 bytes, a quarter each of the vector half `f` of the
 * previous (panel, group) (0 for none): the tile unit and the vector unit overlap. */
AMX_T AI void amx_superblock(const kjob_t *j, const int8_t *lo, const int8_t *hi, int r0, int nrb,
                             int g, int s, int32_t *buf, const amx_fin_t *f, const int L) {
    const int k = j->k, quarter = 4 * nrb;
    const int8_t *a = j->xq + (int64_t)r0 * k + (int64_t)s * SB;
    const size_t wb = ((size_t)g * (k / 4) + (size_t)s * (SB / 4)) * 64; /* bytes */
    if (lo) {
        _tile_zero(4);
        _tile_zero(6);
        if (nrb == 2) {
            _tile_zero(5);
            _tile_zero(7);
        }
    }
    for (int t = 0; t < SB / 64; t++) {
        if (lo) {
            _tile_loadd(0, a + 64 * t, k);
            _tile_loadd(2, lo + wb + (size_t)t * 1024, 64);
            _tile_loadd(3, hi + wb + (size_t)t * 1024, 64);
            _tile_dpbsud(4, 0, 2);
            _tile_dpbssd(6, 0, 3);
            if (nrb == 2) {
                _tile_loadd(1, a + (int64_t)16 * k + 64 * t, k);
                _tile_dpbsud(5, 1, 2);
                _tile_dpbssd(7, 1, 3);
            }
        }
        if (f) amx_finish(j, f, t * quarter, (t + 1) * quarter, L);
    }
    if (lo) {
        _tile_stored(4, buf, 64);
        _tile_stored(6, buf + 512, 64);
        if (nrb == 2) {
            _tile_stored(5, buf + 256, 64);
            _tile_stored(7, buf + 768, 64);
        }
    }
}

/* The rows of the task's panels (`np` panels of KC columns from c0, each with its
 * scratch `per` bytes apart): 32 at a time on the tiles, then 16; the rest through
 * kc_avx512. For each 32 rows and superblock, the activations' 8 KiB stay in L1 while
 * every (panel, group) takes its products; the vector unit sums one (panel, group)'s C
 * tiles while the tiles of the next run. */
AMX_T AI void kc_amx_l(const kjob_t *j, char *scratch, size_t per, int c0, int np, const int L) {
    const int k = j->k, ns = k / SB;
    const size_t lo_at = amx_lo_at(k);
    float *acc = (float *)(scratch + (size_t)np * per);         /* [np][KG][32][16] */
    int32_t *buf = (int32_t *)((char *)acc + np * AMX_ACC_BYTES); /* two of 1,024 */
    int r0 = 0;
    if (j->rows >= 16) pcd_amx_config();
    for (int i = 0; i < np && j->rows >= 16; i++) {
        const int c = c0 + i * KC, nc = kc_cols(j, c);
        kcpanel_t P = kc_panel(scratch + i * per, k, j->L);
        int8_t *lo = (int8_t *)scratch + i * per + lo_at;
        amx_fold(&P, k, j->L, (nc + 15) / 16, lo, lo + (size_t)KC * k);
    }
    int npairs = 0; /* (panel, group) pairs: panel i's groups */
    for (int i = 0; i < np; i++) {
        const int c = c0 + i * KC, nc = kc_cols(j, c);
        npairs += (nc + 15) / 16;
    }
    for (; j->rows - r0 >= 16; r0 += 16 * (j->rows - r0 >= 32 ? 2 : 1)) {
        const int nrb = j->rows - r0 >= 32 ? 2 : 1;
        for (int s = 0; s < ns; s++) {
            amx_fin_t fin;
            kcpanel_t P;
            int have = 0; /* fin holds the previous pair's vector half */
            for (int q = 0; q <= npairs; q++) {
                const int8_t *lo = 0;
                if (q < npairs)
                    lo = (const int8_t *)scratch + (q / KG) * per + lo_at;
                amx_superblock(j, lo, lo ? lo + (size_t)KC * k : 0, r0, nrb, q % KG, s, buf + 1024 * (q & 1),
                               have ? &fin : 0, L);
                if (q == npairs) break;
                const int i = q / KG, g = q % KG, c = c0 + i * KC, nc = kc_cols(j, c);
                const int edge = g == (nc + 15) / 16 - 1 && nc % 16;
                P = kc_panel(scratch + i * per, k, j->L);
                fin = (amx_fin_t){&P, buf + 1024 * (q & 1), r0, g, s, acc + (size_t)q * 32 * 16,
                                  j->y + (int64_t)r0 * j->ldy + c + 16 * g,
                                  (__mmask16)(edge ? (1u << (nc % 16)) - 1 : 0xFFFF)};
                have = 1;
            }
        }
    }
    for (int i = 0; i < np && r0 < j->rows; i++) {
        const int c = c0 + i * KC, nc = kc_cols(j, c);
        for (int r = r0; r < j->rows; r += KR)
            kc_avx512(j, scratch + i * per, r, j->rows - r < KR ? j->rows - r : KR, c, nc);
    }
}

/* kc_amx_l with the sub-block length a constant (Q4_K / Q5_K: 32, Q6_K: 16). */
AMX_T static void kc_amx(const kjob_t *j, char *scratch, size_t per, int c0, int np) {
    if (j->L == 32) kc_amx_l(j, scratch, per, c0, np, 32);
    else kc_amx_l(j, scratch, per, c0, np, 16);
}

/* Panels of KC columns per AMX task: as many as keep its scratch near 1 MiB (of a 2 MiB
 * L2), so that each 32 rows of activations, read once from memory, serve more columns. */
static int amx_panels(int k) {
    int np = (int)(((size_t)1 << 20) / amx_panel_bytes(k));
    return np < 1 ? 1 : np > 8 ? 8 : np;
}
#endif


static void gemm_kc_task(void *ctx, int t, void *scratch) {
    kjob_t *j = (kjob_t *)ctx;
#if X86
    if (j->vec == 2) { /* j->amx_np panels a task */
        const size_t per = amx_panel_bytes(j->k);
        int c0 = t * KC * j->amx_np, np = 0;
        for (int c = c0; c < j->n && np < j->amx_np; c += KC, np++)
            decode_kc_panel(j, c, kc_cols(j, c), (char *)scratch + np * per);
        kc_amx(j, (char *)scratch, per, c0, np);
        return;
    }
#endif
    int c0 = t * KC, nc = kc_cols(j, c0);
    decode_kc_panel(j, c0, nc, scratch);
    for (int r0 = 0; r0 < j->rows; r0 += KR) {
        int R = j->rows - r0 < KR ? j->rows - r0 : KR;
#if X86
        if (j->vec) {
            kc_avx512(j, scratch, r0, R, c0, nc);
            continue;
        }
#endif
        kc_scalar(j, scratch, r0, R, c0, nc);
    }
}

/* The column-panel K-quant kernels on each path: kc_amx (tiles, vec 2), kc_avx512
 * (vpdpbusd, vec 1) or their bit-identical scalar twin (vec 0); `built` 0 where not
 * built. */
static const struct {
    int built, vec;
} KC_KERN[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = {1, 0},
#if X86
    [PCD_PATH_AVX512VNNI] = {1, 1},
    [PCD_PATH_AMX] = {1, 2},
#endif
};

/* The column-panel kernel `path` resolves to (PCD_PATH_AUTO: AMX, else AVX-512 VNNI,
 * else scalar); 0 where this CPU does not run it. */
int pcd_qgemm_kc_path(int path) { return pcd_path_pick(path, PCD_PATHS_BUILT(KC_KERN, .built)); }

/* The column-panel K-quant kernel on `path` (PCD_PATH_AUTO: AMX, else AVX-512 VNNI where
 * this CPU runs it, else scalar). Returns 0; 1 threads failed; 2 not a K-quant type or k not a
 * multiple of 256; 3 path unavailable. */
int pcd_qgemm_int8_kc(int type, const uint8_t *w, int n, int k, const int8_t *xq,
                      const float *dx, const int16_t *bs16, int rows, float *y, int64_t ldy,
                      int path, int threads) {
    if ((type != GGUF_Q4_K && type != GGUF_Q5_K && type != GGUF_Q6_K) || k % SB) return 2;
    path = pcd_path_pick(path, PCD_PATHS_BUILT(KC_KERN, .built));
    if (!path) return 3;
    int bb = pcd_qgemm_block(type, 0), L = type == GGUF_Q6_K ? 16 : 32;
    /* activation sums per sub-block of L in int16 pairs: bs16 itself where L is 16 */
    int32_t *bsp = 0;
    if (L == 32) {
        int np = k / 64;
        bsp = (int32_t *)malloc((size_t)rows * np * 4);
        if (!bsp) return 1;
        for (int64_t i = 0; i < (int64_t)rows * np; i++) {
            const int16_t *b = bs16 + 4 * i;
            bsp[i] = (int32_t)(((uint32_t)(uint16_t)(b[2] + b[3]) << 16) | (uint16_t)(b[0] + b[1]));
        }
    }
    kjob_t j = {.type = type, .k = k, .n = n, .rows = rows, .w = w, .rb = (int64_t)(k / SB) * bb,
                .xq = xq, .dx = dx, .bs16 = bs16, .y = y, .ldy = ldy,
                .L = L, .vec = KC_KERN[path].vec, .bsp = bsp ? (const void *)bsp : (const void *)bs16};
    size_t scratch = panel_kc_bytes(k);
    int ntasks = (n + KC - 1) / KC;
#if X86
    if (j.vec == 2) { /* fewer panels a task where there are few for the threads */
        int most = (ntasks + threads - 1) / (threads > 1 ? threads : 1);
        if (most < 1) most = 1;
        j.amx_np = amx_panels(k) < most ? amx_panels(k) : most;
        scratch = amx_task_bytes(k, j.amx_np);
        ntasks = (ntasks + j.amx_np - 1) / j.amx_np;
    }
#endif
    int rc = run_parallel(gemm_kc_task, &j, ntasks, scratch, threads);
    free(bsp);
    return rc;
}

/* --- The int8 peak probe (`pcd models --doctor`, `pcd bench`) ----------------------------
 * A loop of dot-product instructions and nothing else, on 12 independent accumulators (the
 * latency of one is hidden behind the others): the most int8 multiply-adds one thread can
 * issue on a path. AVX-512 VNNI: vpdpbusd on zmm, 64 multiply-adds each; AVX-VNNI: the same
 * on ymm, 32; AVX2: vpmaddubsw + vpmaddwd + vpaddd, 32 per three instructions. The portable
 * path is not measured. Returns the int8 operations (2 per multiply-add) the loop ran, 0
 * where the path is not run here. `seed` keeps the compiler from folding the loop. */
#if X86
/* Twelve named accumulators, each started at its own value (equal chains would be computed
 * once), stepped by inline assembly: with the intrinsics GCC copied every accumulator each
 * iteration (the loop then measured its register moves). */
#define PEAK_CHAINS 12
#define PEAK_DECL(T, SET) T c0 = SET(0), c1 = SET(1), c2 = SET(2), c3 = SET(3), c4 = SET(4), \
    c5 = SET(5), c6 = SET(6), c7 = SET(7), c8 = SET(8), c9 = SET(9), c10 = SET(10), c11 = SET(11)
#define PEAK_STEP(OP) OP(c0); OP(c1); OP(c2); OP(c3); OP(c4); OP(c5); OP(c6); OP(c7); OP(c8); \
    OP(c9); OP(c10); OP(c11)
#define PEAK_SUM(ADD) ADD(ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7))), \
    ADD(ADD(c8, c9), ADD(c10, c11)))

VNNI512_T static int64_t peak_avx512vnni(int64_t iters, int seed, int32_t *sink) {
    __m512i a = _mm512_set1_epi8((char)(seed | 1)), b = _mm512_set1_epi8((char)(seed + 2));
    PEAK_DECL(__m512i, _mm512_set1_epi32);
#define DP512(c) __asm__("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(a), "v"(b))
    for (int64_t i = 0; i < iters; i++) {
        PEAK_STEP(DP512);
    }
    *sink = _mm512_reduce_add_epi32(PEAK_SUM(_mm512_add_epi32));
    return iters * PEAK_CHAINS * 64 * 2;
}

VNNI256_T static int64_t peak_avxvnni(int64_t iters, int seed, int32_t *sink) {
    __m256i a = _mm256_set1_epi8((char)(seed | 1)), b = _mm256_set1_epi8((char)(seed + 2));
    PEAK_DECL(__m256i, _mm256_set1_epi32);
#define DPVNNI(c) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(c) : "x"(a), "x"(b))
    for (int64_t i = 0; i < iters; i++) {
        PEAK_STEP(DPVNNI);
    }
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, PEAK_SUM(_mm256_add_epi32));
    *sink = out[0] + out[7];
    return iters * PEAK_CHAINS * 32 * 2;
}

/* AVX2: eight chains (each needs a temporary among the 16 registers). */
AVX2_T static int64_t peak_avx2(int64_t iters, int seed, int32_t *sink) {
    __m256i a = _mm256_set1_epi8((char)(seed | 1)), b = _mm256_set1_epi8((char)(seed + 2));
    __m256i ones = _mm256_set1_epi16(1);
    __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2),
            c3 = _mm256_set1_epi32(3), c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5),
            c6 = _mm256_set1_epi32(6), c7 = _mm256_set1_epi32(7);
#define MAD2(c)                                                                            \
    do {                                                                                   \
        __m256i t_;                                                                        \
        __asm__("vpmaddubsw %3, %2, %1\n\tvpmaddwd %4, %1, %1\n\tvpaddd %1, %0, %0"           \
                : "+x"(c), "=&x"(t_)                                                       \
                : "x"(a), "x"(b), "x"(ones));                                              \
    } while (0)
    for (int64_t i = 0; i < iters; i++) {
        MAD2(c0); MAD2(c1); MAD2(c2); MAD2(c3); MAD2(c4); MAD2(c5); MAD2(c6); MAD2(c7);
    }
    __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                  _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, s8);
    *sink = out[0] + out[7];
    return iters * 8 * 32 * 2;
}

/* AMX: six C tiles stepped by tdpbssd on the same A and B tiles (16 x 16 x 64 = 16,384
 * multiply-adds each), so the tile unit never waits on a load. */
AMX_T static int64_t peak_amx(int64_t iters, int seed, int32_t *sink) {
    int8_t ab[2048] __attribute__((aligned(64)));
    int32_t c[256] __attribute__((aligned(64)));
    for (int i = 0; i < 2048; i++) ab[i] = (int8_t)((i * 7 + seed) % 13 - 6);
    pcd_amx_config();
    _tile_loadd(0, ab, 64);
    _tile_loadd(1, ab + 1024, 64);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbssd(2, 0, 1);
        _tile_dpbssd(3, 0, 1);
        _tile_dpbssd(4, 0, 1);
        _tile_dpbssd(5, 0, 1);
        _tile_dpbssd(6, 0, 1);
        _tile_dpbssd(7, 0, 1);
    }
    _tile_stored(7, c, 64);
    *sink = c[0] + c[255];
    return iters * 6 * 16 * 16 * 64 * 2;
}
#endif

typedef int64_t (*peak_fn)(int64_t, int, int32_t *);
static const struct {
    peak_fn fn;
} PEAK[PCD_N_PATHS] = {
#if X86
    [PCD_PATH_AVX2] = {peak_avx2},
    [PCD_PATH_AVXVNNI] = {peak_avxvnni},
    [PCD_PATH_AVX512VNNI] = {peak_avx512vnni},
    [PCD_PATH_AMX] = {peak_amx},
#endif
};

/* Runs the probe for `iters` iterations on `path` (PCD_PATH_AUTO: the int8 path auto
 * picks); the int8 operations it ran, 0 where the path has no probe or does not run here.
 * Its result lands in *sink. */
int64_t pcd_int8_peak(int path, int64_t iters, int seed, int32_t *sink) {
    path = pcd_path_pick(path, PCD_PATHS_BUILT(PEAK, .fn));
    if (!path || iters < 1) return 0;
    return PEAK[path].fn(iters, seed, sink);
}

/* The path `pcd_int8_peak` measures for `path` (0: none). */
int pcd_int8_peak_path(int path) { return pcd_path_pick(path, PCD_PATHS_BUILT(PEAK, .fn)); }
