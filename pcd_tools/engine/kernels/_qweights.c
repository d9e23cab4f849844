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
 * The row loops are plain C that the compiler vectorises; each is built for AVX-512,
 * AVX2 and baseline x86-64 with `target_clones`, and the loader picks the clone for the
 * running CPU (GCC's ifunc dispatch). Built and loaded by pcd_tools.engine.qweights.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int,
                        const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

/* ggml type ids */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30
};

static float half_table[65536];
static int half_ready = 0;

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void init_half(void) {
    if (__atomic_load_n(&half_ready, __ATOMIC_ACQUIRE)) return;
    for (uint32_t i = 0; i < 65536; i++) half_table[i] = half_to_float((uint16_t)i);
    __atomic_store_n(&half_ready, 1, __ATOMIC_RELEASE);
}

static inline float fp16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_table[h];
}

/* Bytes and weights of one block of each supported type; 0 for an unsupported type. */
int pcd_q_block(int type, int *weights) {
    switch (type) {
    case T_F32: *weights = 1; return 4;
    case T_F16: *weights = 1; return 2;
    case T_BF16: *weights = 1; return 2;
    case T_Q4_0: *weights = 32; return 18;
    case T_Q4_1: *weights = 32; return 20;
    case T_Q5_0: *weights = 32; return 22;
    case T_Q5_1: *weights = 32; return 24;
    case T_Q8_0: *weights = 32; return 34;
    case T_Q2_K: *weights = 256; return 84;
    case T_Q3_K: *weights = 256; return 110;
    case T_Q4_K: *weights = 256; return 144;
    case T_Q5_K: *weights = 256; return 176;
    case T_Q6_K: *weights = 256; return 210;
    default: *weights = 0; return 0;
    }
}

/* ---- one row of k weights, each type ------------------------------------------------ */

CLONES static void row_f32(const uint8_t *restrict s, float *restrict y, int64_t k) {
    memcpy(y, s, (size_t)k * 4);
}

CLONES static void row_f16(const uint8_t *restrict s, float *restrict y, int64_t k) {
    const uint16_t *h = (const uint16_t *)s;
    for (int64_t i = 0; i < k; i++) y[i] = half_table[h[i]];
}

CLONES static void row_bf16(const uint8_t *restrict s, float *restrict y, int64_t k) {
    const uint16_t *h = (const uint16_t *)s;
    uint32_t *o = (uint32_t *)y;
    for (int64_t i = 0; i < k; i++) o[i] = (uint32_t)h[i] << 16;
}

CLONES static void row_q4_0(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++, s += 18, y += 32) {
        const float d = fp16(s);
        const uint8_t *q = s + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(q[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((int)(q[j] >> 4) - 8);
        }
    }
}

CLONES static void row_q4_1(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++, s += 20, y += 32) {
        const float d = fp16(s), m = fp16(s + 2);
        const uint8_t *q = s + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(q[j] & 0x0f) + m;
            y[j + 16] = d * (float)(q[j] >> 4) + m;
        }
    }
}

CLONES static void row_q5_0(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++, s += 22, y += 32) {
        const float d = fp16(s);
        uint32_t qh;
        memcpy(&qh, s + 2, 4);
        const uint8_t *q = s + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

CLONES static void row_q5_1(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++, s += 24, y += 32) {
        const float d = fp16(s), m = fp16(s + 2);
        uint32_t qh;
        memcpy(&qh, s + 4, 4);
        const uint8_t *q = s + 8;
        for (int j = 0; j < 16; j++) {
            int lo = (q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
    }
}

CLONES static void row_q8_0(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 32; b++, s += 34, y += 32) {
        const float d = fp16(s);
        const int8_t *q = (const int8_t *)(s + 2);
        for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d;
    }
}

CLONES static void row_q2_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 256; b++, s += 84, y += 256) {
        const uint8_t *sc = s, *qs = s + 16;
        const float d = fp16(s + 80), dmin = fp16(s + 82);
        /* 16 groups of 16: group g covers y[16g .. 16g+16); qs laid out as 2 x (4 x 32) */
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)(sc[g] & 0x0f), ml = dmin * (float)(sc[g] >> 4);
            const int half = g / 8, shift = ((g % 8) / 2) * 2, off = (g % 2) * 16;
            const uint8_t *q = qs + half * 32 + off;
            for (int j = 0; j < 16; j++) y[g * 16 + j] = dl * (float)((q[j] >> shift) & 3) - ml;
        }
    }
}

CLONES static void row_q3_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 256; b++, s += 110, y += 256) {
        const uint8_t *hm = s, *qs = s + 32, *scales = s + 96;
        const float d = fp16(s + 108);
        for (int g = 0; g < 16; g++) {
            int lo = (g < 8) ? (scales[g] & 0x0f) : (scales[g - 8] >> 4);
            int hi = (scales[8 + (g % 4)] >> (2 * (g / 4))) & 3;
            const float dl = d * (float)((int8_t)(uint8_t)(lo | (hi << 4)) - 32);
            const int half = g / 8, shift = ((g % 8) / 2) * 2, off = (g % 2) * 16;
            const int hbit = g / 2; /* 0..7 */
            const uint8_t *q = qs + half * 32 + off, *h = hm + off;
            for (int j = 0; j < 16; j++) {
                int ql = (q[j] >> shift) & 3;
                int qh = ((h[j] >> hbit) & 1) ^ 1;
                y[g * 16 + j] = dl * (float)(ql - (qh << 2));
            }
        }
    }
}

static inline void scale_min_k4(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

CLONES static void row_q4_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 256; b++, s += 144, y += 256) {
        const float d = fp16(s), dmin = fp16(s + 2);
        const uint8_t *scales = s + 4, *qs = s + 16;
        for (int g = 0; g < 8; g++) {
            int sc, m;
            scale_min_k4(scales, g, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = qs + (g / 2) * 32;
            const int shift = (g % 2) * 4;
            for (int j = 0; j < 32; j++) y[g * 32 + j] = dl * (float)((q[j] >> shift) & 0x0f) - ml;
        }
    }
}

CLONES static void row_q5_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 256; b++, s += 176, y += 256) {
        const float d = fp16(s), dmin = fp16(s + 2);
        const uint8_t *scales = s + 4, *qh = s + 16, *qs = s + 48;
        for (int g = 0; g < 8; g++) {
            int sc, m;
            scale_min_k4(scales, g, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = qs + (g / 2) * 32;
            const int shift = (g % 2) * 4;
            for (int j = 0; j < 32; j++) {
                int v = ((q[j] >> shift) & 0x0f) | (((qh[j] >> g) & 1) << 4);
                y[g * 32 + j] = dl * (float)v - ml;
            }
        }
    }
}

CLONES static void row_q6_k(const uint8_t *restrict s, float *restrict y, int64_t k) {
    for (int64_t b = 0; b < k / 256; b++, s += 210, y += 256) {
        const uint8_t *ql = s, *qh = s + 128;
        const int8_t *scales = (const int8_t *)(s + 192);
        const float d = fp16(s + 208);
        /* 8 groups of 32: group g = 4 * half + quarter */
        for (int g = 0; g < 8; g++) {
            const int half = g / 4, quarter = g % 4;
            const uint8_t *l = ql + half * 64 + (quarter % 2) * 32;
            const uint8_t *h = qh + half * 32;
            const int lshift = (quarter / 2) * 4, hshift = quarter * 2;
            const float d0 = d * (float)scales[g * 2], d1 = d * (float)scales[g * 2 + 1];
            for (int j = 0; j < 32; j++) {
                int v = (((l[j] >> lshift) & 0x0f) | (((h[j] >> hshift) & 3) << 4)) - 32;
                y[g * 32 + j] = (j < 16 ? d0 : d1) * (float)v;
            }
        }
    }
}

typedef void (*row_fn)(const uint8_t *restrict, float *restrict, int64_t);

static row_fn row_for(int type) {
    switch (type) {
    case T_F32: return row_f32;
    case T_F16: return row_f16;
    case T_BF16: return row_bf16;
    case T_Q4_0: return row_q4_0;
    case T_Q4_1: return row_q4_1;
    case T_Q5_0: return row_q5_0;
    case T_Q5_1: return row_q5_1;
    case T_Q8_0: return row_q8_0;
    case T_Q2_K: return row_q2_k;
    case T_Q3_K: return row_q3_k;
    case T_Q4_K: return row_q4_k;
    case T_Q5_K: return row_q5_k;
    case T_Q6_K: return row_q6_k;
    default: return 0;
    }
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
