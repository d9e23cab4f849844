/* One-token decode steps of llama-family models on the CPU, weights in 8 bits.
 *
 * A step takes B independent sequences (one token each, each at its own position over
 * its own KV) through the whole model and writes their float32 logits. The weights are
 * read once per step for all B rows, so B rows cost little more than one: a one-row
 * step is bound by reading the weights (135 M of them for SmolLM2-135M).
 *
 * Weights, per matrix, in one of three forms:
 *   - the file's own blocks, for a model kept in its GGUF encoding (Q4_0, Q4_1, Q5_0,
 *     Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): read in place from the mapped file, rows
 *     in an optional order (llama's un-permuted Q/K). A row's blocks are decoded into int8
 *     quants and a float32 scale and minimum per 16 or 32 weights (w = s * q + m, the file's
 *     weights), then multiplied in float32 (see "The file's blocks");
 *   - 8 bits, w = mn + s * q with q in [0, 255] and a float32 scale s and minimum mn per
 *     block of 32 along the input dimension (pcd_quantize_q8 forms each block as affine
 *     min/range or as llama.cpp's symmetric Q8_0, whichever is closer): a copy packed from
 *     dense or MLX-quantized weights;
 *   - float32 (the same step without the rounding, for tests).
 * Gate and up are two matrices whose rows j are taken together, so a chunk of rows yields
 * silu(gate) * up directly. Norms, RoPE, attention and softmax are float32; so are the
 * activations, unless the model's act8 is set: then each phase's input is quantized to 8
 * bits per block (per 256 for K-quants, per 32 otherwise, as the int8 passes and
 * llama.cpp do) and file-block matrices take integer dots (see "8-bit activations").
 * The token embedding is float32 or file blocks (a step decodes its tokens' rows).
 *
 * KV: each row attends over its prefix K/V, read in place from the caller's arrays
 * (strided: head and row strides per layer), then over the tokens this library decoded
 * for it, kept in the row's own buffers ([layer][kv head][cap][head dim]).
 *
 * Threads: a persistent pool; the caller's thread is worker 0. A step is one parallel
 * region split into phases by barriers (four per layer: Q/K/V, attention, output
 * projection, MLP); matrix rows are handed out in chunks from an atomic counter, so a
 * core that the OS takes away slows the step down by its share only. Waits spin briefly,
 * then sleep on a futex (pure spinning collapses when other processes hold the cores).
 *
 * Code paths: AVX-512, AVX2+FMA or portable C (the reference), a table of kernels indexed
 * by cpu_paths.h's path ids; the integer-dot file-block kernels are a table of their own
 * (portable C, AVX2, AVX-512 VNNI), each float path taking the best that its instruction
 * sets allow. Each entry point takes a path (PCD_PATH_AUTO, or one forced by tests)
 * resolved by cpu_paths.h's rule, the one every C source of the engine follows. A row's
 * result does not depend on the batch it is in (same arithmetic for every row).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_paths.h"
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if PCD_X86
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#define X86 1
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#define X86 0
#endif

#define QB 32        /* weights per scale */
#define NB_MAX 8     /* rows of the batch per pass over a weight row */
#define MAX_THREADS 64
#ifndef PF8_AHEAD
#define PF8_AHEAD 8192 /* the same, in the file-block loops: every line of a block */
#endif
#ifndef PF_AHEAD
#define PF_AHEAD 2048 /* bytes of weights prefetched ahead in the row loops */
#endif

typedef struct {
    const void *w;     /* own: uint8 or float32, (rows, cols) row-major; file: rows of blocks */
    const float *s;    /* own 8-bit: (rows, cols / 32) scales; otherwise NULL */
    const float *mn;   /* own 8-bit: (rows, cols / 32) block minimums: w = mn + s * q */
    const float *bias; /* (rows) or NULL */
    const int32_t *order; /* file: row j is stored row order[j] (NULL: row j) */
    int64_t row_bytes;    /* file: bytes of a stored row */
    int32_t rows, cols;
    int32_t type; /* 0: own (8-bit with s, else float32); else the ggml type of file blocks */
    int32_t pad;
} pcd_lin_t;

typedef struct {
    const float *attn_norm, *mlp_norm;
    pcd_lin_t q, k, v, o, gate, up, down;
} pcd_layer_t;

typedef struct {
    int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, inter, vocab, wbits;
    int32_t rope_traditional, rope_dims, rope_len;
    int32_t act8; /* 1: file-block matrices take 8-bit activations (integer dots) */
    float eps, attn_scale;
    const float *embed;      /* (vocab, hidden) float32, or NULL: embed_q's file blocks */
    const float *final_norm; /* (hidden) */
    const float *rope_cos, *rope_sin; /* (rope_len, rope_dims / 2) */
    const pcd_layer_t *layers;
    pcd_lin_t head;
    pcd_lin_t embed_q; /* with embed NULL: the embedding's file blocks (vocab, hidden) */
} pcd_model_t;

typedef struct {
    int32_t token, n_prefix, n_new, cap;
    const float *const *pk; /* per layer: the prefix keys, (kv heads, >= n_prefix, head_dim) */
    const float *const *pv;
    const int64_t *strides; /* per layer: k head, k row, v head, v row strides in floats */
    float *nk, *nv;         /* [layer][kv head][cap][head_dim] */
} pcd_row_t;

/* --- kernels per code path ------------------------------------------------------------- */

enum { MV_STORE = 0, MV_ADD = 1, MV_SWIGLU = 2 };

typedef struct act act_t;
/* Row j of a file-block matrix against nb rows of 8-bit activations (see "8-bit
 * activations"). */
typedef void (*row8_fn)(const pcd_lin_t *, int, const act_t *, int, float *);

/* A phase's input rows quantized to 8 bits per block, as the int8 passes quantize them
 * (_qgemm.c): dx = max|x| / 127, q = x / dx rounded half away from zero, clamped to 127. */
typedef struct {
    int8_t *q;   /* (B, ld) */
    float *dx;   /* (B, ld / block) */
    float *xs;   /* (B, ld / 16): dx * the sum of q over each 16 */
    int16_t *bs; /* (B, ld / 16): the sum of q over each 16 */
} actq_t;

struct act {
    actq_t a[2]; /* blocks of 32 (for 32-block matrices), of 256 (K-quants, as llama.cpp's Q8_K) */
    int64_t ld;
    row8_fn row; /* the kernel that reads them */
};

/* The quantization a file type's matrices read: 1 (blocks of 256) for K-quants. */
#define ACT_K(per) ((per) == 256)

/* xa's rows from b0 on. */
static inline act_t act_from(const act_t *xa, int b0) {
    act_t r = *xa;
    for (int i = 0; i < 2; i++) {
        int64_t blk = i ? 256 : 32;
        r.a[i].q += b0 * xa->ld, r.a[i].dx += b0 * (xa->ld / blk);
        r.a[i].xs += b0 * (xa->ld / 16), r.a[i].bs += b0 * (xa->ld / 16);
    }
    return r;
}

/* Rows [r0, r1) of a matrix L on B rows of x (row stride ldx) into y (row stride ldy);
 * with MV_SWIGLU, U is the up matrix taken row by row with L (gate). With xa (x
 * quantized), file-block matrices take integer dots. */
typedef void (*mv_fn)(const pcd_lin_t *, const pcd_lin_t *, int, int, const float *, int64_t,
                      const act_t *, int, float *, int64_t, int);
typedef void (*scores_fn)(const float *, const float *, int64_t, int, int, float, float *);
typedef void (*accum_fn)(float *, const float *, const float *, int64_t, int, int);
typedef float (*softmax_fn)(float *, int);

typedef struct {
    mv_fn mv;
    row8_fn row8; /* the integer-dot file-block kernel of this path */
    scores_fn scores;
    accum_fn accum;
    softmax_fn softmax;
    int width;
} kern_t;

static inline float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Row j of L against nb rows of x: the file-block, 8-bit or float32 (tests: the portable
 * code on every path) kernel. */
#define ROW_DOTS(Q8FN, FILEFN, L, j, x, ldx, xa, nb, out)                                    \
    do {                                                                                      \
        if ((L)->type && (xa))                                                                \
            (xa)->row(L, j, xa, nb, out);                                                     \
        else if ((L)->type)                                                                   \
            FILEFN(L, j, x, ldx, nb, out);                                                    \
        else if ((L)->s)                                                                      \
            Q8FN(L, j, x, ldx, nb, out);                                                      \
        else                                                                                  \
            row_f32_c(L, j, x, ldx, nb, out);                                                 \
    } while (0)

/* Every row of x goes through the same arithmetic whatever B is and wherever it sits in
 * the batch (groups of at most NB rows share one pass over a weight row), so a batch of
 * B rows gives exactly the logits of B one-row steps. MV_SWIGLU takes row j of gate (L)
 * and of up (U) and writes silu(gate) * up at column j. */
#define MV_DRIVER(NAME, Q8FN, FILEFN, NB)                                                     \
    static void NAME(const pcd_lin_t *L, const pcd_lin_t *U, int r0, int r1, const float *x, \
                     int64_t ldx, const act_t *xa, int B, float *y, int64_t ldy, int mode) {  \
        float dots[NB_MAX], up[NB_MAX];                                                       \
        for (int b0 = 0; b0 < B; b0 += NB) {                                                  \
            int nb = B - b0 < NB ? B - b0 : NB;                                               \
            const float *xb = x + (int64_t)b0 * ldx;                                           \
            float *yb = y + (int64_t)b0 * ldy;                                                 \
            act_t ab, *xab = 0;                                                               \
            if (xa) ab = act_from(xa, b0), xab = &ab;                                         \
            for (int j = r0; j < r1; j++) {                                                   \
                ROW_DOTS(Q8FN, FILEFN, L, j, xb, ldx, xab, nb, dots);                         \
                float bias = L->bias ? L->bias[j] : 0.0f, ub = 0.0f;                          \
                if (mode == MV_SWIGLU) {                                                      \
                    ROW_DOTS(Q8FN, FILEFN, U, j, xb, ldx, xab, nb, up);                       \
                    ub = U->bias ? U->bias[j] : 0.0f;                                         \
                }                                                                             \
                for (int b = 0; b < nb; b++) {                                                \
                    float v = dots[b] + bias;                                                 \
                    if (mode == MV_STORE)                                                     \
                        yb[b * ldy + j] = v;                                                  \
                    else if (mode == MV_ADD)                                                  \
                        yb[b * ldy + j] += v;                                                 \
                    else                                                                      \
                        yb[b * ldy + j] = silu_mul(v, up[b] + ub);                            \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

/* --- The file's blocks ------------------------------------------------------------------
 * A matrix kept in its GGUF encoding is read in place. A row is taken in spans of up to
 * SPAN weights: the span's blocks are decoded into int8 quants q and a float32 scale s and
 * minimum m per group of 16 or 32 weights, w = s * q + m, which are the file's weights
 * (s = d * sc and m = -dmin * mn as gguf-py forms them; for Q4_0 / Q5_0 / Q3_K / Q6_K the
 * offset is in q), then each path multiplies them in float32 against the batch's rows,
 * the group size and the minimum's presence constants of each kernel. The x86 paths
 * decode with AVX2 (portable C for Q2_K and Q3_K), the portable path in C (gguf_blocks.h's
 * scalar decoders, shared with _qweights.c and _qgemm.c); both give the same q, s and m. */

#define SPAN 1024 /* weights decoded at a time: 4 K-quant blocks, 32 blocks of 32 */
#define GI static inline __attribute__((always_inline))

/* The float16 scales through a table of the 65536 halves (filled by half_init). */
static float g_half[65536];
static int g_half_ready;
#define GGUF_FP16(p) g_half[(p)[0] | ((p)[1] << 8)]
#include "gguf_blocks.h"

static void half_init(void) {
    if (__atomic_load_n(&g_half_ready, __ATOMIC_ACQUIRE)) return;
    for (uint32_t i = 0; i < 65536; i++) g_half[i] = gguf_half_bits(i);
    __atomic_store_n(&g_half_ready, 1, __ATOMIC_RELEASE);
}

GI float hf(const uint8_t *p) { return GGUF_FP16(p); }

/* A Q4_K / Q5_K block's 8 six-bit scales (bytes 0-7 of u) and minimums (bytes 8-15). */
GI void k4_unpack(const uint8_t *b, uint32_t u[4]) {
    memcpy(u, b + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    uint32_t lo = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = lo;
    u[0] &= 0x3f3f3f3f;
}

/* n weights (whole blocks) of `type` from b into q, s, m (s and m per group). */
GI void dec_span(int type, const uint8_t *restrict b, int n, int8_t *restrict q,
              float *restrict s, float *restrict m) {
    int per, bytes = gguf_block_bytes(type, &per), g = per >> gguf_group_shift(type);
    for (int e = 0; e < n; e += per, b += bytes, q += per, s += g, m += g) {
        gguf_block_scales(type, b, s, m);
        gguf_block_quants(type, b, q);
    }
}

#if X86
/* A 32-block's quants (Q4_0, Q4_1, Q5_0, Q5_1; Q8_0's bytes) as 32 int8 with AVX2. */
__attribute__((target("avx2,fma"))) GI __m256i dec32_avx2(const int type, const uint8_t *restrict b) {
    if (type == GGUF_Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
    const __m256i lo4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    int one = gguf_b32_min(type), five = gguf_b32_fifth(type);
    __m128i qs = _mm_loadu_si128((const __m128i *)(b + 2 + 2 * one + 4 * five));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), lo4);
    if (five) { /* bit i of qh to byte i: each 128-bit lane takes two of its bytes */
        uint32_t h;
        memcpy(&h, b + 2 + 2 * one, 4);
        const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i hb = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(hb, bit), sixteen));
    }
    v = _mm256_sub_epi8(v, _mm256_set1_epi8((char)gguf_b32_off(type)));
    return v;
}

/* The quants of the common types with AVX2 (bit-identical to block_quants; the others
 * take it): 32 bytes a store. */
__attribute__((target("avx2,fma"))) GI void dec_span_avx2_t(
    const int type, const uint8_t *restrict b, int n, int8_t *restrict q, float *restrict s,
    float *restrict m) {
    int per, bytes = gguf_block_bytes(type, &per), g = per >> gguf_group_shift(type);
    const __m256i lo4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    for (int e = 0; e < n; e += per, b += bytes, q += per, s += g, m += g) {
        for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(b + PF8_AHEAD + o), _MM_HINT_T0);
        if (type == GGUF_Q4_K || type == GGUF_Q5_K) { /* the 8 six-bit scales and minimums at once */
            uint32_t u[4];
            k4_unpack(b, u);
            __m128i v = _mm_loadu_si128((const __m128i *)u);
            __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
            __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
            _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(hf(b)), sc));
            _mm256_storeu_ps(m, _mm256_xor_ps(_mm256_set1_ps(-0.0f),  /* -(dmin * mn) */
                                              _mm256_mul_ps(_mm256_set1_ps(hf(b + 2)), mn)));
        } else {
            gguf_block_scales(type, b, s, m);
        }
        switch (type) {
        case GGUF_Q4_0: case GGUF_Q4_1: case GGUF_Q5_0: case GGUF_Q5_1:
            _mm256_storeu_si256((__m256i *)q, dec32_avx2(type, b));
            break;
        case GGUF_Q8_0:
            _mm256_storeu_si256((__m256i *)q, _mm256_loadu_si256((const __m256i *)(b + 2)));
            break;
        case GGUF_Q4_K: case GGUF_Q5_K: {
            const uint8_t *qs = b + (type == GGUF_Q5_K ? 48 : 16);
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i l4 = _mm256_and_si256(v, lo4), h4 = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                if (type == GGUF_Q5_K) {
                    __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(2 << (2 * c)));
                    l4 = _mm256_or_si256(l4, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
                    h4 = _mm256_or_si256(h4, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
                }
                _mm256_storeu_si256((__m256i *)(q + 64 * c), l4);
                _mm256_storeu_si256((__m256i *)(q + 64 * c + 32), h4);
            }
            break;
        }
        case GGUF_Q6_K: {
            const __m256i hi2 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
            for (int h = 0; h < 2; h++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
                __m256i v0 = _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
                __m256i v1 = _mm256_or_si256(_mm256_and_si256(l1, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
                __m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4), _mm256_and_si256(qh, hi2));
                __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
                _mm256_storeu_si256((__m256i *)(q + 128 * h), _mm256_sub_epi8(v0, off));
                _mm256_storeu_si256((__m256i *)(q + 128 * h + 32), _mm256_sub_epi8(v1, off));
                _mm256_storeu_si256((__m256i *)(q + 128 * h + 64), _mm256_sub_epi8(v2, off));
                _mm256_storeu_si256((__m256i *)(q + 128 * h + 96), _mm256_sub_epi8(v3, off));
            }
            break;
        }
        default:
            gguf_block_quants(type, b, q);
        }
    }
}
/* One copy of the loop per type (the type a constant in each). */
__attribute__((target("avx2,fma"))) static void dec_span_avx2(
    int type, const uint8_t *restrict b, int n, int8_t *restrict q, float *restrict s,
    float *restrict m) {
#define T(t) case t: dec_span_avx2_t(t, b, n, q, s, m); break;
    switch (type) { T(GGUF_Q4_0) T(GGUF_Q4_1) T(GGUF_Q5_0) T(GGUF_Q5_1) T(GGUF_Q8_0) T(GGUF_Q2_K) T(GGUF_Q3_K)
                    T(GGUF_Q4_K) T(GGUF_Q5_K) T(GGUF_Q6_K) }
#undef T
}
#endif

GI const uint8_t *file_row(const pcd_lin_t *L, int j) {
    return (const uint8_t *)L->w + (int64_t)(L->order ? L->order[j] : j) * L->row_bytes;
}

#if defined(__GNUC__) && !defined(__clang__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_CONTRACT
#endif

/* A row of a file-block matrix as float32, exactly the file's weights (s * q, or s * q + m:
 * gguf-py's products and sums, never fused into one multiply-add). */
NO_CONTRACT static void file_dequant_row(int type, const uint8_t *src, int cols, float *out) {
    int8_t q[SPAN];
    float s[SPAN / 16], m[SPAN / 16];
    int per, bytes = gguf_block_bytes(type, &per), mn = gguf_has_min(type), gs = gguf_group_shift(type);
    for (int e0 = 0; e0 < cols; e0 += SPAN) {
        int n = cols - e0 < SPAN ? cols - e0 : SPAN;
        dec_span(type, src + (int64_t)e0 / per * bytes, n, q, s, m);
        for (int e = 0; e < n; e++) {
            float w = s[e >> gs] * (float)q[e];
            out[e0 + e] = mn ? w + m[e >> gs] : w;
        }
    }
}

/* portable C */
static void row_file_c(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb, float *out) {
    int8_t q[SPAN];
    float s[SPAN / 16], m[SPAN / 16], acc[NB_MAX][16] = {{0}};
    int per, bytes = gguf_block_bytes(L->type, &per), gs = gguf_group_shift(L->type);
    const uint8_t *w = file_row(L, j);
    for (int e0 = 0; e0 < L->cols; e0 += SPAN) {
        int n = L->cols - e0 < SPAN ? L->cols - e0 : SPAN;
        dec_span(L->type, w + (int64_t)e0 / per * bytes, n, q, s, m);
        for (int b = 0; b < nb; b++) {
            const float *xb = x + b * ldx + e0;
            for (int e = 0; e < n; e += 16)
                for (int i = 0; i < 16; i++)
                    acc[b][i] += (s[e >> gs] * (float)q[e + i] + m[e >> gs]) * xb[e + i];
        }
    }
    for (int b = 0; b < nb; b++) {
        float r = 0.0f;
        for (int i = 0; i < 16; i++) r += acc[b][i];
        out[b] = r;
    }
}

/* portable C */
static void row_q8_c(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb, float *out) {
    int nblk = L->cols / QB;
    const uint8_t *w = (const uint8_t *)L->w + (int64_t)j * L->cols;
    const float *s = L->s + (int64_t)j * nblk, *mn = L->mn + (int64_t)j * nblk;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * ldx;
        float acc[QB] = {0}; /* one sum per lane: the compiler vectorizes the lane loop */
        for (int k = 0; k < nblk; k++)
            for (int i = 0; i < QB; i++) acc[i] += ((float)w[k * QB + i] * s[k] + mn[k]) * xb[k * QB + i];
        float r = 0.0f;
        for (int i = 0; i < QB; i++) r += acc[i];
        out[b] = r;
    }
}

static void row_f32_c(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb,
                      float *out) {
    const float *w = (const float *)L->w + (int64_t)j * L->cols;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * ldx;
        float acc = 0.0f;
        for (int i = 0; i < L->cols; i++) acc += w[i] * xb[i];
        out[b] = acc;
    }
}

/* --- 8-bit activations ------------------------------------------------------------------
 * With the model's act8 set (compute="int8"), every file-block matrix multiplies its
 * input quantized to 8 bits per block (struct act: per 256 for K-quants, per 32 for the
 * others), as the int8 passes and llama.cpp do: a row is a sum over its groups g (16 or
 * 32 weights) of
 *     s_g * dx(g) * sum_{i in g} q_i xq_i  +  m_g * xs(g)
 * with the integer dot exact, q the file's int8 quants (w = s * q + m). The paths differ
 * in how they form the integer dots (int32 sums here; sign trick with maddubs on AVX2;
 * dpbusd on VNNI) and only in float rounding otherwise. */

/* Rows x (B, cols, row stride ldx) quantized in blocks of blk (32 or 256; cols a multiple
 * of it) into A (row stride ld >= cols). */
static void quantize_act(const float *x, int64_t ldx, int B, int cols, const actq_t *A, int64_t ld,
                         int blk) {
    for (int b = 0; b < B; b++) {
        const float *xb = x + b * ldx;
        for (int k = 0; k < cols / blk; k++) {
            const float *v = xb + k * blk;
            float amax = 0.0f;
            for (int i = 0; i < blk; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            int8_t *q = A->q + b * ld + k * blk;
            for (int i = 0; i < blk; i++) {
                float r = v[i] * id;
                int qv = (int)(r + (r < 0.0f ? -0.5f : 0.5f));
                q[i] = (int8_t)(qv > 127 ? 127 : (qv < -127 ? -127 : qv));
            }
            A->dx[b * (ld / blk) + k] = d;
            for (int h = 0; h < blk / 16; h++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += q[16 * h + i];
                A->bs[b * (ld / 16) + (k * blk) / 16 + h] = (int16_t)sum;
                A->xs[b * (ld / 16) + (k * blk) / 16 + h] = d * (float)sum;
            }
        }
    }
}

/* The minimum's term of a span's groups (n weights from column e0): sum_g m_g * xs(g). */
GI float min_term(const float *m, const float *xs, int e0, int n, const int gs) {
    float r = 0.0f;
    for (int g = 0; g < n >> gs; g++)
        r += m[g] * (gs == 4 ? xs[(e0 >> 4) + g] : xs[(e0 >> 4) + 2 * g] + xs[(e0 >> 4) + 2 * g + 1]);
    return r;
}

/* portable C */
static void row_file8_c(const pcd_lin_t *L, int j, const act_t *xa, int nb, float *out) {
    int8_t q[SPAN];
    float s[SPAN / 16], m[SPAN / 16], acc[NB_MAX] = {0};
    int per, bytes = gguf_block_bytes(L->type, &per), gs = gguf_group_shift(L->type), G = 1 << gs;
    int mn = gguf_has_min(L->type), lb = ACT_K(per) ? 8 : 5;
    const actq_t *A = &xa->a[ACT_K(per)];
    const uint8_t *w = file_row(L, j);
    for (int e0 = 0; e0 < L->cols; e0 += SPAN) {
        int n = L->cols - e0 < SPAN ? L->cols - e0 : SPAN;
        dec_span(L->type, w + (int64_t)e0 / per * bytes, n, q, s, m);
        for (int b = 0; b < nb; b++) {
            const int8_t *x = A->q + b * xa->ld + e0;
            const float *dx = A->dx + b * (xa->ld >> lb);
            for (int g = 0; g < n >> gs; g++) {
                int d = 0;
                for (int i = 0; i < G; i++) d += q[g * G + i] * x[g * G + i];
                acc[b] += (float)d * (s[g] * dx[(e0 + g * G) >> lb]);
            }
            if (mn) acc[b] += gs == 4 ? min_term(m, A->xs + b * (xa->ld / 16), e0, n, 4)
                                      : min_term(m, A->xs + b * (xa->ld / 16), e0, n, 5);
        }
    }
    for (int b = 0; b < nb; b++) out[b] = acc[b];
}

MV_DRIVER(mv_c, row_q8_c, row_file_c, NB_MAX)

#if X86
#define T512 __attribute__((target("avx512f,avx2,fma")))
#define T256 __attribute__((target("avx2,fma")))

/* --- AVX-512: 32 zmm registers hold 2 accumulator chains for each of 8 rows --- */

T512 static inline __m512 u8x16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* nb is a constant at every call site (the switch below), so acc stays in registers. A
 * block's 32 weights are dequantized once (mn + s * q) and shared by the nb rows. */
T512 static inline __attribute__((always_inline)) void row_q8_512_nb(
    const uint8_t *w, const float *s, const float *mn, int nblk, const float *x, int64_t ldx,
    float *out, const int nb) {
    __m512 acc[NB_MAX][2];
    for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = _mm512_setzero_ps();
    for (int k = 0; k < nblk; k++) {
        if (!(k & 1)) _mm_prefetch((const char *)(w + k * QB + PF_AHEAD), _MM_HINT_T0);
        __m512 d = _mm512_set1_ps(s[k]), m = _mm512_set1_ps(mn[k]);
        __m512 w0 = _mm512_fmadd_ps(u8x16(w + k * QB), d, m);
        __m512 w1 = _mm512_fmadd_ps(u8x16(w + k * QB + 16), d, m);
        for (int b = 0; b < nb; b++) {
            const float *xb = x + b * ldx + k * QB;
            acc[b][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc[b][0]);
            acc[b][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), acc[b][1]);
        }
    }
    for (int b = 0; b < nb; b++) out[b] = _mm512_reduce_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]));
}

T512 static void row_q8_512(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb,
                            float *out) {
    int n = L->cols / QB;
    const uint8_t *w = (const uint8_t *)L->w + (int64_t)j * L->cols;
    const float *s = L->s + (int64_t)j * n, *mn = L->mn + (int64_t)j * n;
#define K(c) row_q8_512_nb(w, s, mn, n, x, ldx, out, c)
    switch (nb) { case 1: K(1); break; case 2: K(2); break; case 3: K(3); break; case 4: K(4); break;
                  case 5: K(5); break; case 6: K(6); break; case 7: K(7); break; default: K(8); }
#undef K
}


/* A span's 16-weight groups (one register: w = s * q + m) against nb rows of x. */
T512 static inline __attribute__((always_inline)) __m512 q8x16(const int8_t *q, float s,
                                                                const float *m, const int mn) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)q)));
    return mn ? _mm512_fmadd_ps(v, _mm512_set1_ps(s), _mm512_set1_ps(*m))
              : _mm512_mul_ps(v, _mm512_set1_ps(s));
}

/* A span's weights, 32 at a time (w = s * q + m; gs and mn constants: the group of a
 * scale, whether there is a minimum), against nb rows of x. */
T512 static inline __attribute__((always_inline)) void row_file_512_nb(
    const pcd_lin_t *L, int j, const float *x, int64_t ldx, float *out, const int nb,
    const int gs, const int mn) {
    int8_t q[SPAN] __attribute__((aligned(64)));
    float s[SPAN / 16], m[SPAN / 16];
    int per, bytes = gguf_block_bytes(L->type, &per);
    const uint8_t *w = file_row(L, j);
    __m512 acc[NB_MAX][2];
    for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = _mm512_setzero_ps();
    for (int e0 = 0; e0 < L->cols; e0 += SPAN) {
        int n = L->cols - e0 < SPAN ? L->cols - e0 : SPAN;
        dec_span_avx2(L->type, w + (int64_t)e0 / per * bytes, n, q, s, m);
        for (int e = 0; e < n; e += 32) {
            __m512 w0 = q8x16(q + e, s[e >> gs], m + (e >> gs), mn);
            __m512 w1 = q8x16(q + e + 16, s[(e + 16) >> gs], m + ((e + 16) >> gs), mn);
            for (int b = 0; b < nb; b++) {
                const float *xb = x + b * ldx + e0 + e;
                acc[b][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc[b][0]);
                acc[b][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), acc[b][1]);
            }
        }
    }
    for (int b = 0; b < nb; b++) out[b] = _mm512_reduce_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]));
}

T512 static inline __attribute__((always_inline)) void row_file_512_g(
    const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb, float *out, const int gs,
    const int mn) {
#define K(c) row_file_512_nb(L, j, x, ldx, out, c, gs, mn)
    switch (nb) { case 1: K(1); break; case 2: K(2); break; case 3: K(3); break; case 4: K(4); break;
                  case 5: K(5); break; case 6: K(6); break; case 7: K(7); break; default: K(8); }
#undef K
}

T512 static void row_file_512(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb,
                              float *out) {
    int mn = gguf_has_min(L->type);
    if (gguf_group_shift(L->type) == 4)
        mn ? row_file_512_g(L, j, x, ldx, nb, out, 4, 1) : row_file_512_g(L, j, x, ldx, nb, out, 4, 0);
    else
        mn ? row_file_512_g(L, j, x, ldx, nb, out, 5, 1) : row_file_512_g(L, j, x, ldx, nb, out, 5, 0);
}

T512 MV_DRIVER(mv_512, row_q8_512, row_file_512, NB_MAX)

/* --- AVX2 + FMA: 16 ymm registers hold 2 accumulator chains for each of 4 rows --- */
#define NB_256 4

T256 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T256 static inline __m256 u8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

T256 static inline __attribute__((always_inline)) void row_q8_256_nb(
    const uint8_t *w, const float *s, const float *mn, int nblk, const float *x, int64_t ldx,
    float *out, const int nb) {
    __m256 acc[NB_256][2];
    for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (int k = 0; k < nblk; k++) {
        if (!(k & 1)) _mm_prefetch((const char *)(w + k * QB + PF_AHEAD), _MM_HINT_T0);
        __m256 d = _mm256_set1_ps(s[k]), m = _mm256_set1_ps(mn[k]);
        __m256 wv[4];
        for (int u = 0; u < 4; u++) wv[u] = _mm256_fmadd_ps(u8x8(w + k * QB + 8 * u), d, m);
        for (int b = 0; b < nb; b++) {
            const float *xb = x + b * ldx + k * QB;
            for (int u = 0; u < 4; u++)
                acc[b][u & 1] = _mm256_fmadd_ps(wv[u], _mm256_loadu_ps(xb + 8 * u), acc[b][u & 1]);
        }
    }
    for (int b = 0; b < nb; b++) out[b] = hsum8(_mm256_add_ps(acc[b][0], acc[b][1]));
}

T256 static void row_q8_256(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb,
                            float *out) {
    int n = L->cols / QB;
    const uint8_t *w = (const uint8_t *)L->w + (int64_t)j * L->cols;
    const float *s = L->s + (int64_t)j * n, *mn = L->mn + (int64_t)j * n;
#define K(c) row_q8_256_nb(w, s, mn, n, x, ldx, out, c)
    switch (nb) { case 1: K(1); break; case 2: K(2); break; case 3: K(3); break; default: K(4); }
#undef K
}


T256 static inline __attribute__((always_inline)) __m256 q8x8(const int8_t *q, __m256 s, __m256 m) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))),
                           s, m);
}

T256 static inline __attribute__((always_inline)) void row_file_256_nb(
    const pcd_lin_t *L, int j, const float *x, int64_t ldx, float *out, const int nb,
    const int gs, const int mn) {
    int8_t q[SPAN] __attribute__((aligned(32)));
    float s[SPAN / 16], m[SPAN / 16];
    int per, bytes = gguf_block_bytes(L->type, &per);
    const uint8_t *w = file_row(L, j);
    __m256 acc[NB_256][2];
    for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (int e0 = 0; e0 < L->cols; e0 += SPAN) {
        int n = L->cols - e0 < SPAN ? L->cols - e0 : SPAN;
        dec_span_avx2(L->type, w + (int64_t)e0 / per * bytes, n, q, s, m);
        for (int e = 0; e < n; e += 16) {
            __m256 sv = _mm256_set1_ps(s[e >> gs]), mv = _mm256_set1_ps(mn ? m[e >> gs] : 0.0f);
            __m256 w0 = q8x8(q + e, sv, mv), w1 = q8x8(q + e + 8, sv, mv);
            for (int b = 0; b < nb; b++) {
                const float *xb = x + b * ldx + e0 + e;
                acc[b][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), acc[b][0]);
                acc[b][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), acc[b][1]);
            }
        }
    }
    for (int b = 0; b < nb; b++) out[b] = hsum8(_mm256_add_ps(acc[b][0], acc[b][1]));
}

T256 static inline __attribute__((always_inline)) void row_file_256_g(
    const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb, float *out, const int gs,
    const int mn) {
#define K(c) row_file_256_nb(L, j, x, ldx, out, c, gs, mn)
    switch (nb) { case 1: K(1); break; case 2: K(2); break; case 3: K(3); break; default: K(4); }
#undef K
}

T256 static void row_file_256(const pcd_lin_t *L, int j, const float *x, int64_t ldx, int nb,
                              float *out) {
    int mn = gguf_has_min(L->type);
    if (gguf_group_shift(L->type) == 4)
        mn ? row_file_256_g(L, j, x, ldx, nb, out, 4, 1) : row_file_256_g(L, j, x, ldx, nb, out, 4, 0);
    else
        mn ? row_file_256_g(L, j, x, ldx, nb, out, 5, 1) : row_file_256_g(L, j, x, ldx, nb, out, 5, 0);
}

T256 MV_DRIVER(mv_256, row_q8_256, row_file_256, NB_256)

/* Q4_K and Q6_K rows against activations per 256 (llama.cpp's Q8_K), without the span
 * buffer: per block, one int32 sum over its groups of scale * (q . xq) (maddubs, then
 * madd with the group's integer scale), then one float fma by d * dx; Q4_K's minimum
 * from the block's sums of xq per 16 (madd with the minimums), Q6_K's offset of 32 the
 * same way. The same numbers as the other kernels up to float rounding. AVX2 (every x86
 * integer path takes them); nb <= 4 batch rows a pass. The scales stay in registers
 * (bytes written to memory and read back one at a time stalled the loop 1.4x). */

/* Group g's 16-bit scale in all 16 lanes, from v: the 8 scales as int16 in each half. */
T256 GI __m256i lane16(__m256i v, int g) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * g)));
}

T256 GI void q4k_rows(const pcd_lin_t *L, int j, const act_t *xa, float *out, const int nb) {
    const actq_t *A = &xa->a[1];
    const int64_t ld = xa->ld;
    const uint8_t *w = file_row(L, j);
    const __m256i lo4 = _mm256_set1_epi8(15);
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int kb = 0; kb < L->cols / 256; kb++, w += 144) {
        for (int o = 0; o < 144; o += 64) _mm_prefetch((const char *)(w + PF8_AHEAD + o), _MM_HINT_T0);
        uint32_t u[4];
        k4_unpack(w, u);
        __m256i sc16 = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)((uint64_t)u[1] << 32 | u[0]))));
        __m128i m8 = _mm_cvtsi64_si128((long long)((uint64_t)u[3] << 32 | u[2]));
        __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 .. */
        __m256i sumi[4];
        for (int b = 0; b < nb; b++) sumi[b] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
            __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            __m256i sl = lane16(sc16, 2 * c), sh = lane16(sc16, 2 * c + 1);
            for (int b = 0; b < nb; b++) {
                const int8_t *x = A->q + b * ld + kb * 256 + 64 * c;
                __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x)), sl);
                __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 32))), sh);
                sumi[b] = _mm256_add_epi32(sumi[b], _mm256_add_epi32(pl, ph));
            }
        }
        float d = hf(w), dmin = hf(w + 2);
        for (int b = 0; b < nb; b++) {
            float dx = A->dx[b * (ld / 256) + kb];
            __m256i mm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(A->bs + b * (ld / 16) + kb * 16)), mn16);
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[b]), _mm256_set1_ps(d * dx), acc[b]);
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(-(dmin * dx)), acc[b]);
        }
    }
    for (int b = 0; b < nb; b++) out[b] = hsum8(acc[b]);
}

T256 GI void q6k_rows(const pcd_lin_t *L, int j, const act_t *xa, float *out, const int nb) {
    const actq_t *A = &xa->a[1];
    const int64_t ld = xa->ld;
    const uint8_t *w = file_row(L, j);
    const __m256i lo4 = _mm256_set1_epi8(15), hi2 = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int kb = 0; kb < L->cols / 256; kb++, w += 210) {
        for (int o = 0; o < 210; o += 64) _mm_prefetch((const char *)(w + PF8_AHEAD + o), _MM_HINT_T0);
        const int8_t *sc = (const int8_t *)(w + 192);
        __m256i sumi[4];
        for (int b = 0; b < nb; b++) sumi[b] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i v[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)),
                _mm256_or_si256(_mm256_and_si256(l1, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4), _mm256_and_si256(qh, hi2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2))};
            _Pragma("GCC unroll 4")
            for (int k = 0; k < 4; k++) { /* weights 128h + 32k..: groups 8h + 2k and + 1 */
                int g = 8 * h + 2 * k;
                __m256i s2 = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                for (int b = 0; b < nb; b++) {
                    const int8_t *x = A->q + b * ld + kb * 256 + 128 * h + 32 * k;
                    sumi[b] = _mm256_add_epi32(sumi[b], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(v[k], _mm256_loadu_si256((const __m256i *)x)), s2));
                }
            }
        }
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        float d = hf(w + 208);
        for (int b = 0; b < nb; b++) { /* the quants are stored + 32: take 32 * sum(sc * bs) */
            __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(A->bs + b * (ld / 16) + kb * 16)), sc16);
            __m256i t = _mm256_sub_epi32(sumi[b], _mm256_slli_epi32(off, 5));
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d * A->dx[b * (ld / 256) + kb]), acc[b]);
        }
    }
    for (int b = 0; b < nb; b++) out[b] = hsum8(acc[b]);
}

#define FUSED_ROWS(NAME, BODY)                                                                 \
    T256 static void NAME(const pcd_lin_t *L, int j, const act_t *xa, int nb, float *out) {    \
        for (int b0 = 0; b0 < nb; b0 += 4) {                                                   \
            act_t a = act_from(xa, b0);                                                        \
            switch (nb - b0 < 4 ? nb - b0 : 4) {                                               \
            case 1: BODY(L, j, &a, out + b0, 1); break;                                        \
            case 2: BODY(L, j, &a, out + b0, 2); break;                                        \
            case 3: BODY(L, j, &a, out + b0, 3); break;                                        \
            default: BODY(L, j, &a, out + b0, 4);                                              \
            }                                                                                  \
        }                                                                                      \
    }
FUSED_ROWS(row_q4k8, q4k_rows)
FUSED_ROWS(row_q6k8, q6k_rows)

/* --- 8-bit activations on x86, the other types (Q2_K, Q3_K, Q5_K) through the span
 * buffer: a 32-weight chunk of a row a register of 8 int32 lanes (lane l: weights
 * 4l..4l+3), added to 8 float lanes times s * dx (the two scales of 16-groups each take 4
 * lanes). The integer dots, as in the 32-block kernel below: |q| against sign(xq, q)
 * (q itself against xq where there is a minimum: q >= 0), by maddubs then madd with ones
 * (VNNI 0, AVX2: |q| <= 128, |xq| <= 127, no int16 pair saturates) or dpbusd (VNNI 1,
 * AVX-512 VNNI on ymm). */
#define ROW8_BODY(SUF, TARGET, DPBUSD, VNNI)                                                   \
    TARGET static inline __attribute__((always_inline)) void row_file8##SUF##_nb(            \
        const pcd_lin_t *L, int j, const act_t *xa, float *out, const int nb, const int gs,  \
        const int mn) {                                                                       \
        int8_t q[SPAN] __attribute__((aligned(32)));                                          \
        float s[SPAN / 16], m[SPAN / 16], corr[NB_MAX] = {0}, cs[NB_MAX][SPAN / 16];          \
        int per, bytes = gguf_block_bytes(L->type, &per);                                           \
        const uint8_t *w = file_row(L, j);                                                    \
        const int64_t ld = xa->ld;                                                            \
        const int lb = ACT_K(per) ? 8 : 5;                                                    \
        const actq_t *A = &xa->a[ACT_K(per)];                                                 \
        const __m256i ones = _mm256_set1_epi16(1);                                            \
        (void)ones;                                                                           \
        /* two accumulator chains a row (one would wait on the fma), whatever nb is: a    \
         * row's sums in the same order in any batch */                                     \
        __m256 acc[NB_MAX][2];                                                                \
        for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();             \
        for (int e0 = 0; e0 < L->cols; e0 += SPAN) {                                          \
            int n = L->cols - e0 < SPAN ? L->cols - e0 : SPAN;                                \
            dec_span_avx2(L->type, w + (int64_t)e0 / per * bytes, n, q, s, m);                \
            for (int b = 0; b < nb; b++) { /* s * dx per group */                            \
                const float *dx = A->dx + b * (ld >> lb);                                     \
                for (int g = 0; g < n >> gs; g++) cs[b][g] = s[g] * dx[(e0 + (g << gs)) >> lb]; \
            }                                                                                 \
            for (int c = 0; c < n; c += 32) {                                                 \
                __m256i qv = _mm256_load_si256((const __m256i *)(q + c));                     \
                __m256i aq = mn ? qv : _mm256_abs_epi8(qv);                                   \
                for (int b = 0; b < nb; b++) {                                                \
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(A->q + b * ld + e0 + c)); \
                    if (!mn) xv = _mm256_sign_epi8(xv, qv);                                   \
                    __m256i d = VNNI ? DPBUSD(_mm256_setzero_si256(), aq, xv)                 \
                                     : _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xv), ones); \
                    __m256 sc = gs == 5 ? _mm256_broadcast_ss(&cs[b][c >> 5])                 \
                                        : _mm256_set_m128(_mm_broadcast_ss(&cs[b][(c >> 4) + 1]), \
                                                          _mm_broadcast_ss(&cs[b][c >> 4]));  \
                    int a = (c >> 5) & 1;                                                     \
                    acc[b][a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, acc[b][a]);        \
                }                                                                             \
            }                                                                                 \
            if (mn)                                                                           \
                for (int b = 0; b < nb; b++) corr[b] += min_term(m, A->xs + b * (ld / 16), e0, n, gs);  \
        }                                                                                     \
        for (int b = 0; b < nb; b++) out[b] = hsum8(_mm256_add_ps(acc[b][0], acc[b][1])) + corr[b]; \
    }                                                                                         \
    TARGET static inline __attribute__((always_inline)) void row_file8##SUF##_g(             \
        const pcd_lin_t *L, int j, const act_t *xa, int nb, float *out, const int gs,        \
        const int mn) {                                                                       \
        switch (nb) {                                                                         \
        case 1: row_file8##SUF##_nb(L, j, xa, out, 1, gs, mn); break;                         \
        case 2: row_file8##SUF##_nb(L, j, xa, out, 2, gs, mn); break;                         \
        case 3: row_file8##SUF##_nb(L, j, xa, out, 3, gs, mn); break;                         \
        case 4: row_file8##SUF##_nb(L, j, xa, out, 4, gs, mn); break;                         \
        case 5: if (VNNI) row_file8##SUF##_nb(L, j, xa, out, 5, gs, mn); break;                \
        case 6: if (VNNI) row_file8##SUF##_nb(L, j, xa, out, 6, gs, mn); break;                \
        case 7: if (VNNI) row_file8##SUF##_nb(L, j, xa, out, 7, gs, mn); break;                \
        default: if (VNNI) row_file8##SUF##_nb(L, j, xa, out, 8, gs, mn);                      \
        }                                                                                     \
    }                                                                                         \
    /* 32-block rows without the span buffer: a block's quants decoded into a register,   \
     * one integer dot and one fma by d * dx per block and batch row. */                    \
    TARGET static inline __attribute__((always_inline)) void row_b32##SUF##_nb(              \
        const pcd_lin_t *L, int j, const act_t *xa, float *out, const int nb, const int type) { \
        const actq_t *A = &xa->a[0];                                                          \
        const int64_t ld = xa->ld;                                                            \
        int per, bytes = gguf_block_bytes(type, &per);                                              \
        const int mn = gguf_b32_min(type); /* then q >= 0 */                                       \
        const uint8_t *w = file_row(L, j);                                                    \
        const __m256i ones = _mm256_set1_epi16(1);                                            \
        (void)ones;                                                                           \
        __m256 acc[NB_MAX];                                                                   \
        float corr[NB_MAX] = {0};                                                             \
        for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();                            \
        for (int kb = 0; kb < L->cols / QB; kb++, w += bytes) {                               \
            _mm_prefetch((const char *)(w + PF8_AHEAD), _MM_HINT_T0);                         \
            __m256i qv = dec32_avx2(type, w), aq = mn ? qv : _mm256_abs_epi8(qv);             \
            float dw = hf(w), mw = mn ? hf(w + 2) : 0.0f;                                     \
            for (int b = 0; b < nb; b++) {                                                    \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(A->q + b * ld + kb * QB));  \
                if (!mn) xv = _mm256_sign_epi8(xv, qv);                                       \
                __m256i d = VNNI ? DPBUSD(_mm256_setzero_si256(), aq, xv)                     \
                                 : _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xv), ones);     \
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),                               \
                                         _mm256_set1_ps(dw * A->dx[b * (ld / QB) + kb]), acc[b]); \
                if (mn) corr[b] += mw * (A->xs[b * (ld / 16) + 2 * kb] + A->xs[b * (ld / 16) + 2 * kb + 1]); \
            }                                                                                 \
        }                                                                                     \
        for (int b = 0; b < nb; b++) out[b] = hsum8(acc[b]) + corr[b];                        \
    }                                                                                         \
    TARGET static inline __attribute__((always_inline)) void row_b32##SUF##_t(               \
        const pcd_lin_t *L, int j, const act_t *xa, int nb, float *out, const int type) {     \
        switch (nb) {                                                                         \
        case 1: row_b32##SUF##_nb(L, j, xa, out, 1, type); break;                             \
        case 2: row_b32##SUF##_nb(L, j, xa, out, 2, type); break;                             \
        case 3: row_b32##SUF##_nb(L, j, xa, out, 3, type); break;                             \
        case 4: row_b32##SUF##_nb(L, j, xa, out, 4, type); break;                             \
        case 5: if (VNNI) row_b32##SUF##_nb(L, j, xa, out, 5, type); break;                    \
        case 6: if (VNNI) row_b32##SUF##_nb(L, j, xa, out, 6, type); break;                    \
        case 7: if (VNNI) row_b32##SUF##_nb(L, j, xa, out, 7, type); break;                    \
        default: if (VNNI) row_b32##SUF##_nb(L, j, xa, out, 8, type);                          \
        }                                                                                     \
    }                                                                                         \
    TARGET static void row_file8##SUF(const pcd_lin_t *L, int j, const act_t *xa, int nb,    \
                                      float *out) {                                           \
        if (!VNNI && nb > 4) { /* AVX2 kernels take 4 rows a pass (and compile for 4) */     \
            act_t rest = act_from(xa, 4);                                                     \
            row_file8##SUF(L, j, xa, 4, out);                                                 \
            row_file8##SUF(L, j, &rest, nb - 4, out + 4);                                     \
            return;                                                                           \
        }                                                                                     \
        int mn = gguf_has_min(L->type);                                                       \
        switch (L->type) {                                                                    \
        case GGUF_Q4_0: row_b32##SUF##_t(L, j, xa, nb, out, GGUF_Q4_0); return;                    \
        case GGUF_Q4_1: row_b32##SUF##_t(L, j, xa, nb, out, GGUF_Q4_1); return;                    \
        case GGUF_Q5_0: row_b32##SUF##_t(L, j, xa, nb, out, GGUF_Q5_0); return;                    \
        case GGUF_Q5_1: row_b32##SUF##_t(L, j, xa, nb, out, GGUF_Q5_1); return;                    \
        case GGUF_Q8_0: row_b32##SUF##_t(L, j, xa, nb, out, GGUF_Q8_0); return;                    \
        }                                                                                     \
        if (L->type == GGUF_Q4_K)                                                                \
            row_q4k8(L, j, xa, nb, out);                                                      \
        else if (L->type == GGUF_Q6_K)                                                           \
            row_q6k8(L, j, xa, nb, out);                                                      \
        else if (gguf_group_shift(L->type) == 4) /* Q2_K, Q3_K */                             \
            mn ? row_file8##SUF##_g(L, j, xa, nb, out, 4, 1) : row_file8##SUF##_g(L, j, xa, nb, out, 4, 0); \
        else /* Q5_K */                                                                       \
            row_file8##SUF##_g(L, j, xa, nb, out, 5, 1);                                      \
    }

#define NO_DPBUSD(acc, u, q) (acc)
ROW8_BODY(_avx2, T256, NO_DPBUSD, 0)
ROW8_BODY(_vnni512, __attribute__((target("avx512f,avx512vl,avx512vnni,avx2,fma"))),
          _mm256_dpbusd_epi32, 1)
#undef NO_DPBUSD

#endif


/* Attention: written once with 8-float vector extensions (ymm on both x86 paths, SSE2 or
 * NEON in the portable one) as always_inline bodies that each path's wrapper compiles
 * for its own target. */
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors passed between inlined helpers */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));
#define AI static inline __attribute__((always_inline))
#define VSEL(m, a, b) ((v8)(((v8i)(a) & (m)) | ((v8i)(b) & ~(m))))

AI v8 vld(const float *p) { return *(const v8 *)p; }
AI void vst(float *p, v8 v) { *(v8 *)p = v; }
AI float vsum(v8 v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

/* Cephes-style exp for x <= 0, 1-2 ulp (as in _cpu_kernels.c); below -87 it is 0. */
AI v8 vexp_neg(v8 x) {
    v8i keep = x >= -87.0f;
    x = VSEL(keep, x, (v8){} - 87.0f);
    v8 y = x * 1.44269504088896341f + 0.5f;
    v8 n = __builtin_convertvector(__builtin_convertvector(y, v8i), v8);
    n += __builtin_convertvector(n > y, v8); /* truncation rounded up below zero: floor */
    v8 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + (r + 1.0f);
    v8i two_n = (__builtin_convertvector(n, v8i) + 127) << 23;
    return (v8)((v8i)(p * (v8)two_n) & keep);
}

/* out[j] = scale * q . k_j for n keys of d floats, key j at k + j * ks. */
AI void scores_any(const float *q, const float *k, int64_t ks, int n, int d, float scale,
                   float *out) {
    for (int j = 0; j < n; j++) {
        const float *kj = k + j * ks;
        v8 a0 = {}, a1 = {};
        int i = 0;
        for (; i + 16 <= d; i += 16) {
            a0 += vld(q + i) * vld(kj + i);
            a1 += vld(q + i + 8) * vld(kj + i + 8);
        }
        for (; i + 8 <= d; i += 8) a0 += vld(q + i) * vld(kj + i);
        float r = vsum(a0 + a1);
        for (; i < d; i++) r += q[i] * kj[i];
        out[j] = r * scale;
    }
}

/* acc += sum_j p[j] v_j over n values of d floats, value j at v + j * vs. */
AI void accum_any(float *acc, const float *p, const float *v, int64_t vs, int n, int d) {
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        v8 a = vld(acc + i);
        for (int j = 0; j < n; j++) a += p[j] * vld(v + j * vs + i);
        vst(acc + i, a);
    }
    for (; i < d; i++)
        for (int j = 0; j < n; j++) acc[i] += p[j] * v[j * vs + i];
}

/* row[0, n) <- exp(row - max(row)); returns their sum. */
AI float softmax_any(float *row, int n) {
    float m = row[0], sum = 0.0f;
    int j = 0;
    if (n >= 8) {
        v8 vm = vld(row);
        for (j = 8; j + 8 <= n; j += 8) vm = VSEL(vld(row + j) > vm, vld(row + j), vm);
        for (int i = 0; i < 8; i++) m = vm[i] > m ? vm[i] : m;
    }
    for (; j < n; j++) m = row[j] > m ? row[j] : m;
    v8 acc = {};
    for (j = 0; j + 8 <= n; j += 8) {
        v8 e = vexp_neg(vld(row + j) - m);
        vst(row + j, e);
        acc += e;
    }
    for (; j < n; j++) sum += row[j] = expf(row[j] - m);
    return vsum(acc) + sum;
}

#define ATTENTION_PATH(SUF, TARGET)                                                             \
    TARGET static void scores##SUF(const float *q, const float *k, int64_t ks, int n, int d,    \
                                   float scale, float *out) {                                   \
        scores_any(q, k, ks, n, d, scale, out);                                                 \
    }                                                                                           \
    TARGET static void accum##SUF(float *acc, const float *p, const float *v, int64_t vs, int n, \
                                  int d) {                                                      \
        accum_any(acc, p, v, vs, n, d);                                                         \
    }                                                                                           \
    TARGET static float softmax##SUF(float *row, int n) { return softmax_any(row, n); }

#if X86
ATTENTION_PATH(_512, T512)
ATTENTION_PATH(_256, T256)
#endif
ATTENTION_PATH(_c, )

/* The kernels of each code path (cpu_paths.h; .mv 0 where not built). row8 is filled in
 * by `pick` from ROW8. */
static const kern_t KERNELS[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = {mv_c, 0, scores_c, accum_c, softmax_c, 1},
#if X86
    [PCD_PATH_AVX2] = {mv_256, 0, scores_256, accum_256, softmax_256, 256},
    [PCD_PATH_AVX512] = {mv_512, 0, scores_512, accum_512, softmax_512, 512},
#endif
};

/* The integer-dot file-block kernels on each path (0 where not built); AVX-512 VNNI's
 * on ymm. */
static const row8_fn ROW8[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = row_file8_c,
#if X86
    [PCD_PATH_AVX2] = row_file8_avx2,
    [PCD_PATH_AVX512VNNI] = row_file8_vnni512,
#endif
};

/* The integer-dot kernels a code path may take: its own instruction sets and below. */
static const unsigned ROW8_UNDER[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = PCD_PATH_BIT(PCD_PATH_SCALAR),
    [PCD_PATH_AVX2] = PCD_PATH_BIT(PCD_PATH_SCALAR) | PCD_PATH_BIT(PCD_PATH_AVX2),
    [PCD_PATH_AVX512] = PCD_PATH_BIT(PCD_PATH_SCALAR) | PCD_PATH_BIT(PCD_PATH_AVX2) |
                        PCD_PATH_BIT(PCD_PATH_AVX512VNNI),
};

/* The code path `path` (PCD_PATH_AUTO for the best this CPU has, or a path id to ask for
 * one: tests) resolves to by cpu_paths.h's rule, 0 if not available. */
static int decode_path(int path) { return pcd_path_pick(path, PCD_PATHS_BUILT(KERNELS, .mv)); }

/* The kernels of code path `path` (as decode_path), the integer-dot one the best of ROW8
 * that the path may take. Returns 0 (and leaves *k alone) if the path is not available. */
static int pick(int path, kern_t *k) {
    half_init();
    int p = decode_path(path);
    if (!p) return 0;
    *k = KERNELS[p];
    k->row8 = ROW8[pcd_path_pick(PCD_PATH_AUTO, PCD_PATHS_BUILT(ROW8, ) & ROW8_UNDER[p])];
    return 1;
}

/* The integer-dot kernel `ipath` asks for (tests: a path id of ROW8); NULL where it is not
 * built or this CPU lacks it. */
static row8_fn pick_row8(int ipath) {
    int p = pcd_path_pick(ipath, PCD_PATHS_BUILT(ROW8, ));
    return p ? ROW8[p] : 0;
}

/* Which code path `path` gets here (a PCD_PATH_* id), or 0 if not available. */
int pcd_decode_path(int path) { return decode_path(path); }

/* --- waiting: spin, then sleep on a futex ------------------------------------------------ */

static void futex_wait(int *addr, int val) {
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr, (void)val;
    sched_yield();
#endif
}

static void futex_wake(int *addr) {
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* Waits until *word != old: `spin` polls first, then futex sleeps (counted in *sleepers
 * so that the waker makes the system call only when someone sleeps). */
static void wait_change(int *word, int old, int *sleepers, int spin) {
    for (int i = 0; i < spin; i++) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != old) return;
        CPU_RELAX();
    }
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == old) {
        __atomic_fetch_add(sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == old) futex_wait(word, old);
        __atomic_fetch_sub(sleepers, 1, __ATOMIC_SEQ_CST);
    }
}

static void bump(int *word, int *sleepers) {
    __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) > 0) futex_wake(word);
}

/* --- the pool and one step --------------------------------------------------------------- */

typedef struct {
    float *xn;     /* (B, hidden): this thread's normed copy of x */
    float *sc;     /* (longest row's keys): attention scores */
    float *qk;     /* 2 * head_dim: q and k after RoPE */
    size_t cap_xn, cap_sc;
    act_t act;     /* with act8: this thread's 8-bit copy of a phase's input */
    void *abuf;    /* its buffers */
    size_t cap_abuf;
} scratch_t;

typedef struct pool pool_t;

typedef struct {
    const pcd_model_t *m;
    pcd_row_t *rows;
    int B;
    float *logits;
    kern_t k;
    int *ctr; /* one chunk counter per phase */
} job_t;

typedef struct {
    pool_t *p;
    int tid;
} warg_t;

struct pool {
    int n, active; /* threads in the pool; threads taking part in the current step */
    pthread_t tids[MAX_THREADS];
    warg_t args[MAX_THREADS];
    int work, work_sleepers, quit; /* work: step number << 8 | threads taking part */
    int bar_count, bar_gen, bar_sleepers;
    int spin;
    job_t *job;
    scratch_t scr[MAX_THREADS];
    float *x, *qkv, *att, *act;
    size_t cap_x, cap_qkv, cap_att, cap_act;
    int *ctr;
    int cap_ctr;
};

static void barrier(pool_t *p) {
    if (p->active == 1) return;
    int gen = __atomic_load_n(&p->bar_gen, __ATOMIC_ACQUIRE);
    if (__atomic_fetch_add(&p->bar_count, 1, __ATOMIC_ACQ_REL) == p->active - 1) {
        __atomic_store_n(&p->bar_count, 0, __ATOMIC_RELAXED);
        bump(&p->bar_gen, &p->bar_sleepers);
    } else {
        wait_change(&p->bar_gen, gen, &p->bar_sleepers, p->spin);
    }
}

static void rms_norm(const float *x, const float *w, int n, float eps, float *out) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

static void rope(const pcd_model_t *m, const float *x, int pos, float *out) {
    int half = m->rope_dims / 2, d = m->head_dim;
    const float *c = m->rope_cos + (int64_t)pos * half, *s = m->rope_sin + (int64_t)pos * half;
    if (m->rope_traditional) {
        for (int i = 0; i < half; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            out[2 * i] = a * c[i] - b * s[i];
            out[2 * i + 1] = a * s[i] + b * c[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];
            out[i] = a * c[i] - b * s[i];
            out[i + half] = a * s[i] + b * c[i];
        }
    }
    for (int i = m->rope_dims; i < d; i++) out[i] = x[i];
}

/* The rows of n matrices (their outputs side by side in y: Q, K and V) in chunks handed
 * out by counter *ctr; x is (B, cols). With MV_SWIGLU, n is 1 and U the up matrix. */
static void matvec(job_t *jb, const pcd_lin_t *const *Ls, int n, const pcd_lin_t *U, int *ctr,
                   const float *x, int64_t ldx, const act_t *xa, float *y, int64_t ldy,
                   int mode) {
    int chunk[3], first[4] = {0};
    int64_t off[3] = {0};
    for (int i = 0; i < n; i++) {
        int c = (int)((mode == MV_SWIGLU ? 32768 : 65536) / (Ls[i]->cols > 0 ? Ls[i]->cols : 1));
        chunk[i] = c < 16 ? 16 : c;
        first[i + 1] = first[i] + (Ls[i]->rows + chunk[i] - 1) / chunk[i];
        if (i) off[i] = off[i - 1] + Ls[i - 1]->rows;
    }
    for (;;) {
        int c = __atomic_fetch_add(ctr, 1, __ATOMIC_RELAXED), i = 0;
        if (c >= first[n]) break;
        while (c >= first[i + 1]) i++;
        const pcd_lin_t *L = Ls[i];
        int r0 = (c - first[i]) * chunk[i], r1 = r0 + chunk[i] < L->rows ? r0 + chunk[i] : L->rows;
        jb->k.mv(L, U, r0, r1, x, ldx, xa, jb->B, y + off[i], ldy, mode);
    }
}

static inline int64_t qkv_width(const pcd_layer_t *L) {
    return (int64_t)L->q.rows + L->k.rows + L->v.rows;
}

static void attention(job_t *jb, pool_t *p, int tid, int l, int *ctr) {
    const pcd_model_t *m = jb->m;
    int H = m->n_heads, KH = m->n_kv_heads, d = m->head_dim, G = H / KH;
    int64_t ldq = qkv_width(&m->layers[l]);
    scratch_t *s = &p->scr[tid];
    int ntasks = jb->B * H;
    for (;;) {
        int t = __atomic_fetch_add(ctr, 1, __ATOMIC_RELAXED);
        if (t >= ntasks) break;
        int b = t / H, h = t % H, kvh = h / G;
        pcd_row_t *r = &jb->rows[b];
        int pos = r->n_prefix + r->n_new;
        const float *row = p->qkv + b * ldq;
        float *q = s->qk, *k = s->qk + d;
        rope(m, row + h * d, pos, q);
        rope(m, row + (H + kvh) * d, pos, k);
        const float *v = row + (H + KH + kvh) * d;
        int64_t base = ((int64_t)l * KH + kvh) * r->cap * d;
        if (h % G == 0) { /* the first head of the group stores the token's K/V */
            memcpy(r->nk + base + (int64_t)r->n_new * d, k, sizeof(float) * d);
            memcpy(r->nv + base + (int64_t)r->n_new * d, v, sizeof(float) * d);
        }
        const int64_t *st = r->strides + 4 * l;
        const float *pk = r->pk[l] + kvh * st[0], *pv = r->pv[l] + kvh * st[2];
        int np = r->n_prefix, nn = r->n_new, n = np + nn + 1;
        float *sc = s->sc;
        jb->k.scores(q, pk, st[1], np, d, m->attn_scale, sc);
        jb->k.scores(q, r->nk + base, d, nn, d, m->attn_scale, sc + np);
        jb->k.scores(q, k, d, 1, d, m->attn_scale, sc + np + nn);
        float inv = 1.0f / jb->k.softmax(sc, n);
        float *out = p->att + (int64_t)b * H * d + h * d;
        memset(out, 0, sizeof(float) * d);
        jb->k.accum(out, sc, pv, st[3], np, d);
        jb->k.accum(out, sc + np, r->nv + base, d, nn, d);
        jb->k.accum(out, sc + np + nn, v, d, 1, d);
        for (int i = 0; i < d; i++) out[i] *= inv;
    }
}

/* Bytes of one quantization's buffers for B rows of ld (dx sized for blocks of 32). */
static size_t actq_bytes(int B, int64_t ld) {
    return (size_t)B * ld + (size_t)B * (ld / QB) * sizeof(float) +
           (size_t)B * (ld / 16) * (sizeof(float) + sizeof(int16_t));
}

static size_t act_bytes(int B, int64_t ld) { return 2 * actq_bytes(B, ld); }

/* Points a's two quantizations into buf (act_bytes(B, ld) bytes), for B rows of ld. */
static void act_lay(act_t *a, void *buf, int B, int64_t ld, row8_fn row) {
    char *c = (char *)buf;
    for (int i = 0; i < 2; i++, c += actq_bytes(B, ld)) {
        actq_t *A = &a->a[i];
        A->dx = (float *)c;
        A->xs = (float *)(c + (size_t)B * (ld / QB) * sizeof(float));
        A->bs = (int16_t *)(A->xs + (size_t)B * (ld / 16));
        A->q = (int8_t *)(A->bs + (size_t)B * (ld / 16));
    }
    a->ld = ld, a->row = row;
}

/* x (B rows of cols) quantized into a: per 32, and per 256 where cols allows. */
static void act_fill(act_t *a, const float *x, int64_t ldx, int B, int cols) {
    quantize_act(x, ldx, B, cols, &a->a[0], cols, 32);
    if (cols % 256 == 0) quantize_act(x, ldx, B, cols, &a->a[1], cols, 256);
}

/* With act8, x (B rows of cols) quantized into this thread's scratch; else NULL. */
static const act_t *quant_in(job_t *jb, scratch_t *s, const float *x, int64_t ldx, int cols) {
    if (!jb->m->act8) return 0;
    act_lay(&s->act, s->abuf, jb->B, cols, jb->k.row8);
    act_fill(&s->act, x, ldx, jb->B, cols);
    return &s->act;
}

static void step_body(pool_t *p, int tid) {
    job_t *jb = p->job;
    const pcd_model_t *m = jb->m;
    int B = jb->B, D = m->hidden;
    scratch_t *sc = &p->scr[tid];
    float *xn = sc->xn;
    int ph = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const pcd_layer_t *L = &m->layers[l];
        for (int b = 0; b < B; b++) rms_norm(p->x + b * D, L->attn_norm, D, m->eps, xn + b * D);
        const pcd_lin_t *qkv[3] = {&L->q, &L->k, &L->v};
        matvec(jb, qkv, 3, 0, &jb->ctr[ph++], xn, D, quant_in(jb, sc, xn, D, D), p->qkv,
               qkv_width(L), MV_STORE);
        barrier(p);
        attention(jb, p, tid, l, &jb->ctr[ph++]);
        barrier(p);
        const pcd_lin_t *o = &L->o, *gate = &L->gate, *down = &L->down;
        matvec(jb, &o, 1, 0, &jb->ctr[ph++], p->att, L->o.cols,
               quant_in(jb, sc, p->att, L->o.cols, L->o.cols), p->x, D, MV_ADD);
        barrier(p);
        for (int b = 0; b < B; b++) rms_norm(p->x + b * D, L->mlp_norm, D, m->eps, xn + b * D);
        matvec(jb, &gate, 1, &L->up, &jb->ctr[ph++], xn, D, quant_in(jb, sc, xn, D, D), p->act,
               m->inter, MV_SWIGLU);
        barrier(p);
        matvec(jb, &down, 1, 0, &jb->ctr[ph++], p->act, m->inter,
               quant_in(jb, sc, p->act, m->inter, m->inter), p->x, D, MV_ADD);
        barrier(p);
    }
    for (int b = 0; b < B; b++) rms_norm(p->x + b * D, m->final_norm, D, m->eps, xn + b * D);
    const pcd_lin_t *head = &m->head;
    matvec(jb, &head, 1, 0, &jb->ctr[ph++], xn, D, quant_in(jb, sc, xn, D, D), jb->logits,
           m->vocab, MV_STORE);
    barrier(p);
}

static void *worker(void *arg) {
    pool_t *p = ((warg_t *)arg)->p;
    int tid = ((warg_t *)arg)->tid;
    int seen = 0;
    for (;;) {
        wait_change(&p->work, seen, &p->work_sleepers, p->spin);
        seen = __atomic_load_n(&p->work, __ATOMIC_ACQUIRE); /* step and size in one read */
        if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) break;
        if (tid < (seen & 0xFF)) step_body(p, tid);
    }
    return 0;
}

/* A pool of `threads` threads (the caller's included); `spin` polls before sleeping. */
void *pcd_pool_new(int threads, int spin) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    pool_t *p = (pool_t *)calloc(1, sizeof(pool_t));
    if (!p) return 0;
    p->spin = spin < 0 ? 0 : spin;
    p->n = 1;
    for (int i = 1; i < threads; i++) {
        p->args[i] = (warg_t){p, i};
        if (pthread_create(&p->tids[i], 0, worker, &p->args[i]) != 0) break;
        p->n++;
    }
    return p;
}

int pcd_pool_threads(void *pool) { return pool ? ((pool_t *)pool)->n : 0; }

void pcd_pool_free(void *pool) {
    pool_t *p = (pool_t *)pool;
    if (!p) return;
    __atomic_store_n(&p->quit, 1, __ATOMIC_RELEASE);
    bump(&p->work, &p->work_sleepers);
    for (int i = 1; i < p->n; i++) pthread_join(p->tids[i], 0);
    for (int i = 0; i < MAX_THREADS; i++) {
        free(p->scr[i].xn);
        free(p->scr[i].sc);
        free(p->scr[i].qk);
        free(p->scr[i].abuf);
    }
    free(p->x), free(p->qkv), free(p->att), free(p->act), free(p->ctr);
    free(p);
}

static int grow(float **buf, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    float *nb = (float *)realloc(*buf, n * sizeof(float));
    if (!nb) return 1;
    *buf = nb, *cap = n;
    return 0;
}

/* Whether a matrix's form is one the kernels take: file blocks of a supported type whose
 * rows are whole blocks, or own 8-bit / float32 rows of whole blocks of 32. */
static int lin_ok(const pcd_lin_t *L) {
    if (!L->w || L->rows < 1 || L->cols < 1) return 0;
    if (!L->type) return L->cols % QB == 0;
    int per, bytes = gguf_block_bytes(L->type, &per);
    return bytes && L->cols % per == 0 && L->row_bytes == (int64_t)L->cols / per * bytes;
}

/* Weights per block of a file type the decode kernels read (0: not one of them). */
int pcd_decode_file_block(int type) {
    int per;
    return gguf_block_bytes(type, &per) ? per : 0;
}

/* Rows idx[0, n) of a file-block matrix as float32: exactly the file's weights. Returns
 * 0, or 1 for a matrix the kernels do not take. */
int pcd_decode_dequant_rows(const pcd_lin_t *L, const int32_t *idx, int n, float *out) {
    half_init();
    if (!lin_ok(L) || !L->type) return 1;
    for (int i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= L->rows) return 1;
        file_dequant_row(L->type, file_row(L, idx[i]), L->cols, out + (int64_t)i * L->cols);
    }
    return 0;
}

/* y (B, rows) = x (B, cols) W^T + bias on one thread, through the kernels of `path` (as
 * in pcd_decode_path). Returns 0, or 1 (a path not here, a matrix the kernels do not take). */
int pcd_decode_matvec(const pcd_lin_t *L, const float *x, int B, float *y, int path) {
    kern_t k;
    if (!pick(path, &k) || !lin_ok(L) || B < 1) return 1;
    k.mv(L, 0, 0, L->rows, x, L->cols, 0, B, y, L->rows, MV_STORE);
    return 0;
}

/* x (B, cols) quantized in blocks of blk (32 or 256) as a step quantizes a phase's input
 * (struct act): q (B, cols), dx (B, cols / blk), xs (B, cols / 16). Returns 0, or 1 for
 * another block size or cols not a multiple of it. */
int pcd_decode_quantize_act(const float *x, int B, int cols, int blk, int8_t *q, float *dx,
                            float *xs) {
    if (B < 1 || (blk != 32 && blk != 256) || cols < blk || cols % blk) return 1;
    void *buf = malloc(act_bytes(B, cols));
    if (!buf) return 1;
    act_t a;
    act_lay(&a, buf, B, cols, 0);
    act_fill(&a, x, cols, B, cols);
    const actq_t *A = &a.a[blk == 256];
    memcpy(q, A->q, (size_t)B * cols);
    memcpy(dx, A->dx, sizeof(float) * B * (cols / blk));
    memcpy(xs, A->xs, sizeof(float) * B * (cols / 16));
    free(buf);
    return 0;
}

/* As pcd_decode_matvec for a file-block matrix, x quantized to 8 bits (integer dots):
 * `ipath` 0 the path's own integer kernel, else as pick_row8. Returns 0, or 1 (a path
 * not here, a matrix the kernels do not take, out of memory). */
int pcd_decode_matvec8(const pcd_lin_t *L, const float *x, int B, float *y, int path, int ipath) {
    kern_t k;
    if (!pick(path, &k) || !lin_ok(L) || !L->type || B < 1) return 1;
    row8_fn r8 = ipath ? pick_row8(ipath) : k.row8;
    if (!r8) return 1;
    void *buf = malloc(act_bytes(B, L->cols));
    if (!buf) return 1;
    act_t a;
    act_lay(&a, buf, B, L->cols, r8);
    act_fill(&a, x, L->cols, B, L->cols);
    k.mv(L, 0, 0, L->rows, x, L->cols, &a, B, y, L->rows, MV_STORE);
    free(buf);
    return 0;
}

/* One decode step of B rows on `threads` of the pool's threads (0: all): logits
 * (B, vocab). `path` as in pcd_decode_path. Returns 0, or 1 (bad arguments, a path not
 * available here), 2 (out of memory). The caller keeps each row's token, n_new and
 * buffers; n_new is not advanced here. */
int pcd_decode_step(void *pool, const pcd_model_t *m, pcd_row_t *rows, int B, float *logits,
                    int path, int threads) {
    pool_t *p = (pool_t *)pool;
    job_t jb;
    if (!p || !m || B < 1 || !pick(path, &jb.k)) return 1;
    if (m->hidden % QB || m->inter % QB || m->n_heads % m->n_kv_heads || m->head_dim > 1024)
        return 1;
    if (!(m->embed ? 1 : lin_ok(&m->embed_q) && m->embed_q.rows == m->vocab &&
                             m->embed_q.cols == m->hidden && m->embed_q.type) ||
        !lin_ok(&m->head))
        return 1;
    for (int l = 0; l < m->n_layers; l++) {
        const pcd_layer_t *L = &m->layers[l];
        if (!lin_ok(&L->q) || !lin_ok(&L->k) || !lin_ok(&L->v) || !lin_ok(&L->o) ||
            !lin_ok(&L->gate) || !lin_ok(&L->up) || !lin_ok(&L->down))
            return 1;
    }
    int longest = 0, qkv_rows = (int)qkv_width(&m->layers[0]);
    for (int b = 0; b < B; b++) {
        pcd_row_t *r = &rows[b];
        int pos = r->n_prefix + r->n_new;
        if (r->token < 0 || r->token >= m->vocab || r->n_new >= r->cap || pos >= m->rope_len)
            return 1;
        if (pos + 1 > longest) longest = pos + 1;
    }
    size_t D = (size_t)m->hidden;
    int err = grow(&p->x, &p->cap_x, B * D) | grow(&p->qkv, &p->cap_qkv, (size_t)B * qkv_rows) |
              grow(&p->att, &p->cap_att, (size_t)B * m->n_heads * m->head_dim) |
              grow(&p->act, &p->cap_act, (size_t)B * m->inter);
    for (int t = 0; t < p->n; t++) {
        scratch_t *s = &p->scr[t];
        err |= grow(&s->xn, &s->cap_xn, B * D) | grow(&s->sc, &s->cap_sc, (size_t)longest + 16);
        if (!s->qk) err |= !(s->qk = (float *)malloc(sizeof(float) * 2 * 1024));
        size_t ab = act_bytes(B, m->inter > (int)D ? m->inter : (int)D);
        size_t ao = act_bytes(B, m->layers[0].o.cols);
        ab = ab > ao ? ab : ao;
        if (m->act8 && ab > s->cap_abuf) {
            void *nb = realloc(s->abuf, ab);
            if (nb) s->abuf = nb, s->cap_abuf = ab;
            else err = 1;
        }
    }
    int phases = 5 * m->n_layers + 1;
    if (phases > p->cap_ctr) {
        int *c = (int *)realloc(p->ctr, sizeof(int) * phases);
        if (!c) return 2;
        p->ctr = c, p->cap_ctr = phases;
    }
    if (err) return 2;
    memset(p->ctr, 0, sizeof(int) * phases);
    for (int b = 0; b < B; b++) {
        if (m->embed)
            memcpy(p->x + b * D, m->embed + (int64_t)rows[b].token * D, sizeof(float) * D);
        else
            file_dequant_row(m->embed_q.type, file_row(&m->embed_q, rows[b].token), (int)D,
                             p->x + b * D);
    }
    jb.m = m, jb.rows = rows, jb.B = B, jb.logits = logits, jb.ctr = p->ctr;
    p->job = &jb;
    p->active = threads < 1 || threads > p->n ? p->n : threads;
    if (p->active > 1) { /* the next step number, with its size: read at once by workers */
        int next = ((((unsigned)p->work >> 8) + 1) & 0xFFFFFF) << 8 | p->active;
        __atomic_store_n(&p->work, next, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&p->work_sleepers, __ATOMIC_SEQ_CST) > 0) futex_wake(&p->work);
    }
    step_body(p, 0);
    p->job = 0;
    return 0;
}

typedef struct {
    const float *w;
    uint8_t *q;
    float *s, *mn;
    int64_t r0, r1, cols;
    int scheme;
} quant_t;

/* One block as (d, m, q) under a scheme; returns the largest reconstruction error. */
static float quantize_block(const float *src, int symmetric, float lo, float hi, uint8_t *q,
                            float *d_out, float *m_out) {
    float d, m;
    if (symmetric) { /* d = max|w| / 127, q = round(w / d) + 128 */
        float amax = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
        d = amax / 127.0f;
        m = -128.0f * d;
    } else { /* d = (max - min) / 255, q = round((w - min) / d) */
        d = (hi - lo) / 255.0f;
        m = lo;
    }
    float id = d > 0.0f ? 1.0f / d : 0.0f, err = 0.0f;
    for (int i = 0; i < QB; i++) { /* round half up */
        float v = (src[i] - m) * id + 0.5f;
        v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
        q[i] = (uint8_t)(int)v;
    }
    for (int i = 0; i < QB; i++) {
        float e = fabsf(m + d * (float)q[i] - src[i]);
        err = e > err ? e : err;
    }
    *d_out = d, *m_out = m;
    return err;
}

static void *quantize_rows(void *arg) {
    quant_t *a = (quant_t *)arg;
    int64_t nblk = a->cols / QB;
    uint8_t alt[QB];
    for (int64_t r = a->r0; r < a->r1; r++) {
        for (int64_t k = 0; k < nblk; k++) {
            const float *src = a->w + r * a->cols + k * QB;
            uint8_t *dst = a->q + r * a->cols + k * QB;
            float lo = src[0], hi = src[0], d, m, d2, m2;
            for (int i = 1; i < QB; i++) {
                lo = src[i] < lo ? src[i] : lo;
                hi = src[i] > hi ? src[i] : hi;
            }
            float err = quantize_block(src, a->scheme == 1, lo, hi, dst, &d, &m);
            /* auto: affine blocks of a 4-bit grid are exact to rounding; others try both */
            if (a->scheme == 2 && err > 1e-6f * (hi - lo) &&
                quantize_block(src, 1, lo, hi, alt, &d2, &m2) < err) {
                memcpy(dst, alt, QB);
                d = d2, m = m2;
            }
            a->s[r * nblk + k] = d;
            a->mn[r * nblk + k] = m;
        }
    }
    return 0;
}

/* 8 bits per weight in blocks of 32 along each row, w = mn + s * q with q in [0, 255].
 * scheme 0, affine: mn = the block's minimum, s = its range / 255 (exact for weights from
 * a 4-bit affine grid: GGUF Q4_0, Q4_1); 1, symmetric: s = max|w| / 127, mn = -128 s
 * (llama.cpp's Q8_0; exact for Q8_0 weights); 2: per block, whichever of the two
 * reconstructs it more closely. Runs on `threads` threads. */
void pcd_quantize_q8(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *s,
                     float *mn, int scheme, int threads) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > rows) threads = rows > 0 ? (int)rows : 1;
    quant_t parts[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < threads; t++) {
        parts[t] = (quant_t){w, q, s, mn, rows * t / threads, rows * (t + 1) / threads, cols,
                             scheme};
        if (t > 0) started[t] = pthread_create(&tids[t], 0, quantize_rows, &parts[t]) == 0;
    }
    quantize_rows(&parts[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(tids[t], 0);
        else
            quantize_rows(&parts[t]);
    }
}
