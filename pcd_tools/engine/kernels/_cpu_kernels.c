/* Exact float32 attention, SwiGLU and RoPE for the CPU engine.
 *
 * Attention runs one block of query rows at a time. For each (batch row, head, block)
 * the kernel computes the block's scores itself, each score in one fixed order (see
 * "scores"), normalises them in place while they are still in the core's L2 cache (mask,
 * max, exp in one sweep per row), sums each row's nonzero weights, then multiplies the
 * block's weights by V in SIMD over the features, in key order, one L1-sized tile of V at
 * a time for every row of the block (three rows per load of V on AVX2), and divides by the
 * sums: a query's output does not depend on the masked keys beside it (see
 * "composition-invariant sums" and "PV"). The full score matrix (1,398 x 1,552 floats per
 * head group for a 466-token pass) never goes to memory, and for a causal pass the masked
 * keys past each row are never computed. The keys may come in up to MAX_PARTS parts (a
 * cached prefix, a prefill's rows, the call's own), read in place as if concatenated, and
 * a mask's leading columns that every query sees are not read.
 *
 * SwiGLU is silu(gate) * x in one SIMD sweep.
 *
 * Code paths: each kernel family (attention's scores / softmax / compaction / sums / PV,
 * SwiGLU) is a table indexed by cpu_paths.h's path ids, the portable C reference at
 * PCD_PATH_SCALAR and AVX2+FMA and AVX-512 bodies beside it; each entry point takes a
 * path (PCD_PATH_AUTO, or one forced by tests) resolved by cpu_paths.h's rule, the one
 * every C source of the engine follows. PCD_PATH_AMX is attention's alone and never auto's:
 * the AVX-512 softmax, sums and PV after bf16 scores on the AMX tiles, for engines whose
 * matrices compute in int8 or bf16 (see "bf16 scores on the AMX tiles").
 *
 * Work is spread over `threads` POSIX threads (the caller's thread is one of them). Built
 * and loaded by pcd_tools.engine.kernels.bindings; the same math as mlx-lm's
 * scaled_dot_product_attention and swiglu, in float32.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_paths.h"

typedef float (*softmax_row_t)(float *restrict, const float *restrict, int, int);
/* scores(q, q_sr, k, k_sr, m, width, lim, d, scale, buf, ldb): see "scores". */
typedef void (*scores_t)(const float *restrict, int64_t, const float *restrict, int64_t, int,
                         int, const int *restrict, int, float, float *restrict, int64_t);

/* out_r += sum_j w_r[j] v_j over keys lo <= j < min(n_r, hi) of the rows r < m, v holding
 * key lo's row first (see "PV"). */
typedef void (*pv_rows_t)(const float *restrict, int64_t, const int *restrict, int, int, int,
                          const float *restrict, int64_t, float *restrict, int);

/* The most parts a call's keys may come in (a cached prefix, a long prefill's pieces, the
 * call's own), read in place as if concatenated. */
#define MAX_PARTS 16

typedef struct {
    scores_t scores;
    const float *q, *mask;
    float *out;
    int64_t q_sb, q_sh, q_sr; /* strides in floats: batch, head, row (last dim contiguous) */
    int nparts;
    const float *k[MAX_PARTS], *v[MAX_PARTS];
    int64_t k_sb[MAX_PARTS], k_sh[MAX_PARTS], k_sr[MAX_PARTS];
    int64_t v_sb[MAX_PARTS], v_sh[MAX_PARTS], v_sr[MAX_PARTS];
    int start[MAX_PARTS + 1]; /* part p holds keys [start[p], start[p + 1]) */
    int64_t m_sb; /* additive mask (Lq x S rows of S floats): batch stride, 0 = shared */
    int mask_from; /* the mask's columns before this one are 0: they are not read */
    /* per query row (Lq ints, batch stride re_sb, 0 = shared) one past its last open key:
     * the keys after it are masked, so they are neither scored nor summed; or NULL */
    const int *row_end;
    int64_t re_sb;
    int b, h, kh, lq, s, d, causal, block, nqb, ntasks;
    float scale;
    softmax_row_t softmax_row;
    int (*compact)(const float *restrict, int, float *restrict);
    float (*lane_sum)(const float *restrict, int);
    pv_rows_t pv_rows;
    /* bf16 scores on the AMX tiles (see there): each part's converted keys, else 0 */
    int amx;
    uint16_t *kt[MAX_PARTS];
} job_t;

/* Runs fn(ctx, task, scratch) for every task in [0, ntasks) on `threads` threads, each
 * with its own `scratch_bytes` buffer. Returns 0, or 1 if a buffer could not be had (the
 * tasks of that thread are then left to the others; all of them if every thread failed). */
typedef struct {
    void (*fn)(void *, int, void *);
    void *ctx;
    int ntasks;
    size_t scratch_bytes;
    int next;   /* next task, taken atomically */
    int failed;
} pool_t;

static void *pool_worker(void *arg) {
    pool_t *p = (pool_t *)arg;
    void *scratch = p->scratch_bytes ? malloc(p->scratch_bytes) : 0;
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
    pthread_t tids[64];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tids[started], 0, pool_worker, &p) != 0) break;
        started++;
    }
    pool_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(tids[i], 0);
    return __atomic_load_n(&p.next, __ATOMIC_RELAXED) < ntasks ? 1 : p.failed;
}

/* Cephes expf: exp(x) = 2^n * e^r, n = floor(x log2(e) + 1/2), |r| <= ln(2)/2, with a
 * degree-7 polynomial for e^r; about 1-2 ulp. Inputs here are x - max(x) <= 0, and
 * anything below -87 (e^-87 = 1.6e-38, under the normal float range) becomes 0. */
#define EXP_LO -87.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

static float exp_neg(float x) {
    if (x < EXP_LO) return 0.0f;
    float n = __builtin_floorf(x * LOG2E + 0.5f);
    float r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    float p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    return p * two_n.f;
}

/* Each softmax_row_* turns row[0, n) into exp(row + mask - max) in place, zeroes
 * row[n, width) and returns the sum. `madd` is the row's additive mask or NULL. */
static float softmax_row_scalar(float *restrict row, const float *restrict madd, int n,
                                int width) {
    if (madd)
        for (int j = 0; j < n; j++) row[j] += madd[j];
    float m = row[0];
    for (int j = 1; j < n; j++) m = row[j] > m ? row[j] : m;
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        row[j] = exp_neg(row[j] - m);
        sum += row[j];
    }
    for (int j = n; j < width; j++) row[j] = 0.0f;
    return sum;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx512f"))) static inline __m512 exp_neg16(__m512 x) {
    __m512 lo = _mm512_set1_ps(EXP_LO);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(p, n));
}

__attribute__((target("avx512f"))) static float softmax_row_avx512(
    float *restrict row, const float *restrict madd, int n, int width) {
    int full = n & ~15;
    __mmask16 tail = (__mmask16)((1u << (n - full)) - 1u);
    if (madd) {
        for (int j = 0; j < full; j += 16)
            _mm512_storeu_ps(row + j, _mm512_add_ps(_mm512_loadu_ps(row + j),
                                                    _mm512_loadu_ps(madd + j)));
        if (tail)
            _mm512_mask_storeu_ps(row + full, tail,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(tail, row + full),
                                                _mm512_maskz_loadu_ps(tail, madd + full)));
    }
    __m512 vm = _mm512_set1_ps(-3.402823466e38f);
    for (int j = 0; j < full; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(row + j));
    if (tail) vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(vm, tail, row + full));
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < full; j += 16) {
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(row + j), m));
        _mm512_storeu_ps(row + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (tail) {
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + full), m));
        e = _mm512_maskz_mov_ps(tail, e);
        _mm512_mask_storeu_ps(row + full, tail, e);
        acc = _mm512_add_ps(acc, e);
    }
    for (int j = n; j < width; j++) row[j] = 0.0f;
    return _mm512_reduce_add_ps(acc);
}

__attribute__((target("avx2,fma"))) static inline __m256 exp_neg8(__m256 x) {
    __m256 lo = _mm256_set1_ps(EXP_LO);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

__attribute__((target("avx2,fma"))) static float softmax_row_avx2(
    float *restrict row, const float *restrict madd, int n, int width) {
    int full = n & ~7;
    if (madd)
        for (int j = 0; j < n; j++) row[j] += madd[j];
    __m256 vm = _mm256_set1_ps(-3.402823466e38f);
    for (int j = 0; j < full; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(row + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, vm);
    float mx = lanes[0];
    for (int i = 1; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    for (int j = full; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    __m256 m = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
        __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(row + j), m));
        _mm256_storeu_ps(row + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (n > full) { /* the tail through the same vector exp: one key, one value anywhere */
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - full), lane);
        __m256 e = exp_neg8(_mm256_sub_ps(_mm256_maskload_ps(row + full, keep), m));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(keep));
        _mm256_maskstore_ps(row + full, keep, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
    float sum = 0.0f;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    for (int j = n; j < width; j++) row[j] = 0.0f;
    return sum;
}
#endif

/* ---- scores -------------------------------------------------------------------------
 * buf[r * ldb + j] = scale * (q_r . k_j) for the rows r < m and, for each, the keys it can
 * see: j < min(lim[r], width) (a causal row's limit grows by one a row; a masked row's is
 * one past its last open key). Others are left unwritten or written past the limit: the
 * softmax zeroes them. Each score is computed the same way wherever it falls: its own chain over
 * the features, whatever m, width and the tile around it. A BLAS gives no such promise:
 * OpenBLAS's Haswell sgemm returns a score that differs in the last bit with the call's key
 * count, which 8-bit activations downstream turn into a whole step (issue 31). */
static void scores_scalar(const float *restrict q, int64_t q_sr, const float *restrict k,
                          int64_t k_sr, int m, int width, const int *restrict lim, int d,
                          float scale, float *restrict buf, int64_t ldb) {
    for (int r = 0; r < m; r++) {
        const float *qr = q + (int64_t)r * q_sr;
        int n = lim[r] < width ? lim[r] : width;
        for (int j = 0; j < n; j++) {
            const float *kr = k + (int64_t)j * k_sr;
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc += qr[c] * kr[c];
            buf[(int64_t)r * ldb + j] = acc * scale;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
/* The totals of eight accumulators, one per lane: lanes l0..l7 of each summed as
 * ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), whichever slot it has. */
__attribute__((target("avx2,fma"))) static inline __m256 sum8x8(const __m256 *a) {
    __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20),
                         _mm256_permute2f128_ps(g0, g1, 0x31));
}

/* One query row against eight keys `kr` (`w` of them real): each score an FMA chain per
 * lane over the features, then `sum8x8`, scaled, stored at `o`. */
__attribute__((target("avx2,fma"))) static inline void score_row8(
    const float *restrict qr, const float *const *kr, int d, __m256 vs, float *restrict o,
    int w, __m256i keep) {
    __m256 a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
    for (int c = 0; c < d; c += 8) {
        __m256 x = _mm256_loadu_ps(qr + c);
        for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(x, _mm256_loadu_ps(kr[u] + c), a[u]);
    }
    __m256 sc = _mm256_mul_ps(sum8x8(a), vs);
    if (w == 8)
        _mm256_storeu_ps(o, sc);
    else
        _mm256_maskstore_ps(o, keep, sc);
}

/* Eight keys at a time against one query row: each score an FMA chain per lane over the
 * features (lane l holds the features c = l mod 8), then `sum8x8`. The AVX-512 path runs the
 * same arithmetic six rows at a time (`scores_avx512`): one kernel is one set of numbers. */
__attribute__((target("avx2,fma"))) static void scores_avx2(
    const float *restrict q, int64_t q_sr, const float *restrict k, int64_t k_sr, int m,
    int width, const int *restrict lim, int d, float scale, float *restrict buf, int64_t ldb) {
    if (d % 8) {
        scores_scalar(q, q_sr, k, k_sr, m, width, lim, d, scale, buf, ldb);
        return;
    }
    __m256 vs = _mm256_set1_ps(scale);
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int j0 = 0; j0 < width; j0 += 8) {
        int w = width - j0 < 8 ? width - j0 : 8;
        const float *kr[8];
        for (int u = 0; u < 8; u++) kr[u] = k + (int64_t)(j0 + (u < w ? u : 0)) * k_sr;
        __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(w), lane);
        for (int r = 0; r < m; r++) {
            if (lim[r] <= j0) continue; /* the row sees none of these keys */
            score_row8(q + (int64_t)r * q_sr, kr, d, vs, buf + (int64_t)r * ldb + j0, w, keep);
        }
    }
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* `scores_avx2`'s numbers, six rows at a time: a zmm holds two rows' lanes (row r's eight
 * in its low half, row r + 1's in its high half) against one key broadcast to both, so
 * each (row, key) score is still the FMA chain per lane over c = lane mod 8 that
 * `scores_avx2` runs, then the same `sum8x8`: only the registers change. 24 accumulators
 * take three row pairs by eight keys; per eight features, eight key loads and three of
 * queries feed 24 FMAs, against nine loads for eight FMAs a row at a time. */
#define SC_PAIRS 3

__attribute__((target("avx512f,avx2,fma"))) static inline __m512 pair_rows(const float *a,
                                                                          const float *b) {
    __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

__attribute__((target("avx512f,avx2,fma"))) static void scores_avx512(
    const float *restrict q, int64_t q_sr, const float *restrict k, int64_t k_sr, int m,
    int width, const int *restrict lim, int d, float scale, float *restrict buf, int64_t ldb) {
    if (d % 8) {
        scores_scalar(q, q_sr, k, k_sr, m, width, lim, d, scale, buf, ldb);
        return;
    }
    __m256 vs = _mm256_set1_ps(scale);
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int j0 = 0; j0 < width; j0 += 8) {
        int w = width - j0 < 8 ? width - j0 : 8;
        const float *kr[8];
        for (int u = 0; u < 8; u++) kr[u] = k + (int64_t)(j0 + (u < w ? u : 0)) * k_sr;
        __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(w), lane);
        int r = 0;
        while (r < m && lim[r] <= j0) r++; /* rows before r see none of these keys */
        for (; r + 2 * SC_PAIRS <= m; r += 2 * SC_PAIRS) {
            __m512 a[SC_PAIRS][8];
            for (int i = 0; i < SC_PAIRS; i++)
                for (int u = 0; u < 8; u++) a[i][u] = _mm512_setzero_ps();
            const float *q0 = q + (int64_t)r * q_sr;
            for (int c = 0; c < d; c += 8) {
                __m512 x[SC_PAIRS];
                for (int i = 0; i < SC_PAIRS; i++)
                    x[i] = pair_rows(q0 + (int64_t)(2 * i) * q_sr + c,
                                     q0 + (int64_t)(2 * i + 1) * q_sr + c);
                for (int u = 0; u < 8; u++) {
                    __m512 kv = _mm512_castpd_ps(
                        _mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(kr[u] + c))));
                    for (int i = 0; i < SC_PAIRS; i++) a[i][u] = _mm512_fmadd_ps(x[i], kv, a[i][u]);
                }
            }
            for (int i = 0; i < SC_PAIRS; i++)
                for (int half = 0; half < 2; half++) {
                    __m256 t[8];
                    for (int u = 0; u < 8; u++)
                        t[u] = _mm256_castpd_ps(half ? _mm512_extractf64x4_pd(_mm512_castps_pd(a[i][u]), 1)
                                                     : _mm512_castpd512_pd256(_mm512_castps_pd(a[i][u])));
                    __m256 sc = _mm256_mul_ps(sum8x8(t), vs);
                    float *o = buf + (int64_t)(r + 2 * i + half) * ldb + j0;
                    if (w == 8)
                        _mm256_storeu_ps(o, sc);
                    else
                        _mm256_maskstore_ps(o, keep, sc);
                }
        }
        for (; r < m; r++) { /* the last rows one at a time, as scores_avx2 */
            if (lim[r] <= j0) continue;
            score_row8(q + (int64_t)r * q_sr, kr, d, vs, buf + (int64_t)r * ldb + j0, w, keep);
        }
    }
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* ---- bf16 scores on the AMX tiles ----------------------------------------------------
 * Where the matrix products compute in int8 or bf16, a caller may ask for the path
 * PCD_PATH_AMX (auto never takes it): a score is then q_r . k_j over the bf16 roundings
 * (to nearest even) of both, on the AMX-BF16 tiles, d / 32 `tdpbf16ps` steps of 32
 * features into a float32 sum from +0, then times the scale; the softmax, the sums and PV
 * stay float32 as above. Element (r, j) of a tile product reads only row r of Q and
 * column j of K, so a score is the same bits whatever shares its call, as on the float32
 * paths (its bits are not theirs: the hardware sums a step's products in its own order,
 * which the tests do not emulate; they bound it against a float64 sum of the same bf16
 * products). The same products are what a bf16 KV cache gives a GPU's attention; the
 * int8 activations downstream already round far coarser (1 / 127 of a row's largest).
 *
 * The keys are converted once per call (`amx_keys_task`): per (batch row, KV head, part),
 * blocks of 16 keys, each d / 32 B tiles (1 KiB) whose row i holds features (2i, 2i + 1)
 * of the step for the block's 16 keys, zeros past the part's last key to a whole 32. A
 * task's queries are converted into its scratch (`amx_queries`), rows to a whole 32,
 * zeros past the block's last. Per 32 rows and 32 keys, 2 x 2 C tiles (tmm0-3) take each
 * step's A tiles (tmm4, 5: rows 0-15, 16-31) and B tiles (tmm6, 7: keys 0-15, 16-31);
 * keys no row of the 32 sees are skipped (causal). */
#define AMXB_T __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

/* bf16 elements of one (batch row, KV head)'s converted keys for a part of n keys. */
static int64_t amx_keys_elems(int n, int d) { return (int64_t)((n + 31) / 32) * 32 * d; }

/* Task t converts part t % nparts of (batch row, KV head) t / nparts into jb->kt[p] (the
 * part's tiles, one (batch row, KV head) after another). */
AMXB_T static void amx_keys_task(void *ctx, int t, void *scratch) {
    (void)scratch;
    job_t *jb = (job_t *)ctx;
    int p = t % jb->nparts, bh = t / jb->nparts, bb = bh / jb->kh, kv = bh % jb->kh;
    int d = jb->d, nst = d / 32, n = jb->start[p + 1] - jb->start[p];
    const float *k = jb->k[p] + bb * jb->k_sb[p] + kv * jb->k_sh[p];
    uint16_t *dst = jb->kt[p] + bh * amx_keys_elems(n, d);
    __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                        13, 14, 15),
                                      _mm512_set1_epi32(16));
    int nk = (n + 31) / 32 * 32;
    for (int j = 0; j < nk; j++) {
        const float *kr = k + (int64_t)j * jb->k_sr[p];
        int32_t *blk = (int32_t *)(dst + (int64_t)(j / 16) * nst * 512) + j % 16;
        for (int st = 0; st < nst; st++) {
            __m512i x = _mm512_setzero_si512();
            if (j < n)
                x = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(kr + 32 * st + 16),
                                                 _mm512_loadu_ps(kr + 32 * st));
            _mm512_i32scatter_epi32(blk + st * 256, rows, x, 4); /* pair i to row i */
        }
    }
}

/* Rows [0, m) of q (rows q_sr floats apart, d features) as bf16 rows of d, zeros to a
 * whole 32 rows. */
AMXB_T static void amx_queries(const float *q, int64_t q_sr, int m, int d, uint16_t *qt) {
    int mp = (m + 31) / 32 * 32;
    for (int r = 0; r < mp; r++)
        for (int c = 0; c < d; c += 32) {
            __m512i x = _mm512_setzero_si512();
            if (r < m)
                x = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + r * q_sr + c + 16),
                                                 _mm512_loadu_ps(q + r * q_sr + c));
            _mm512_storeu_si512(qt + (int64_t)r * d + c, x);
        }
}

/* The scores of rows [0, m) (bf16 rows `qt`, see above) against one part's converted
 * keys `kt`, for the keys j < min(lim[r], width), into buf (rows ldb apart); `ct` is 4 KiB
 * of scratch. */
AMXB_T static void scores_amx(const uint16_t *qt, int m, const uint16_t *kt, int width,
                              const int *restrict lim, int d, float scale,
                              float *restrict buf, int64_t ldb, float *restrict ct) {
    pcd_amx_config();
    int nst = d / 32;
    __m512 vs = _mm512_set1_ps(scale);
    for (int r0 = 0; r0 < m; r0 += 32) {
        int rm = m - r0 < 32 ? m - r0 : 32, reach = 0;
        for (int r = 0; r < rm; r++) {
            int l = lim[r0 + r] < width ? lim[r0 + r] : width;
            reach = l > reach ? l : reach;
        }
        const uint16_t *a = qt + (int64_t)r0 * d;
        for (int j0 = 0; j0 < reach; j0 += 32) {
            const uint16_t *b = kt + (int64_t)(j0 / 16) * nst * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int st = 0; st < nst; st++) {
                _tile_loadd(4, a + 32 * st, 2 * d);
                _tile_loadd(5, a + 16 * (int64_t)d + 32 * st, 2 * d);
                _tile_loadd(6, b + 512 * st, 64);
                _tile_loadd(7, b + 512 * (nst + st), 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, ct, 128); /* ct[r * 32 + j]: rows 0-15, then 16-31 */
            _tile_stored(1, ct + 16, 128);
            _tile_stored(2, ct + 512, 128);
            _tile_stored(3, ct + 528, 128);
            for (int r = 0; r < rm; r++) {
                int l = lim[r0 + r] < width ? lim[r0 + r] : width, n = l - j0;
                if (n <= 0) continue;
                float *o = buf + (int64_t)(r0 + r) * ldb + j0;
                __mmask16 m0 = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
                _mm512_mask_storeu_ps(o, m0, _mm512_mul_ps(_mm512_loadu_ps(ct + 32 * r), vs));
                if (n > 16) {
                    __mmask16 m1 = n >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - 16)) - 1u);
                    _mm512_mask_storeu_ps(o + 16, m1,
                                          _mm512_mul_ps(_mm512_loadu_ps(ct + 32 * r + 16), vs));
                }
            }
        }
    }
}
#endif

/* ---- composition-invariant sums ------------------------------------------------------
 * A query's weights are summed over its nonzero weights only, in key order, with lanes
 * taken by the weight's rank among them, never by the key's position; the product with V
 * runs in key order per feature, where a zero weight changes nothing (see "PV"). Masked
 * keys add nothing and shift nothing, so a query's output does not depend on which
 * other keys share the call (the packed fields pass against one prompt per candidate, a
 * pruned pass against an exhaustive one, how rows are split over threads): bit-identical,
 * given the same scores. 8-bit activations downstream round a float32-sized difference to
 * a whole step, so this is what keeps int8 scores exact (issue 31). */

/* The nonzero weights of row[0, n), in key order; returns how many. `pv` holds n + 16. */
static int compact_scalar(const float *restrict row, int n, float *restrict pv) {
    int c = 0;
    for (int j = 0; j < n; j++) {
        pv[c] = row[j];
        c += row[j] != 0.0f;
    }
    return c;
}

/* The sum of pv[0, n) in the path's lanes (lane = rank mod width), then a fixed tree. */
static float lane_sum_scalar(const float *restrict pv, int n) {
    float s = 0.0f;
    for (int t = 0; t < n; t++) s += pv[t];
    return s;
}

/* ---- PV ------------------------------------------------------------------------------
 * out_r = inv_r * sum_j w_r[j] v_j for a block's rows, each feature one FMA chain in key
 * order from +0. A weight of exactly 0 (a masked key, an underflowed exp) leaves a chain
 * unchanged: fma(0, v, acc) = acc for finite v, and acc is never -0 (it starts at +0, and
 * an exact zero sum rounds to +0), so this equals the sum over the nonzero weights alone,
 * bit for bit, whatever masked keys share the call. The keys go in tiles of `pv_tile` (16
 * KB of V, in L1), every row of the block over one tile before the next: V is read from
 * memory once per block, not once per row. */
#define PV_TILE_BYTES 16384

static int pv_tile(int d) {
    int t = PV_TILE_BYTES / (4 * d);
    return t < 8 ? 8 : t;
}

static int max_n(const int *restrict n, int m) {
    int x = 0;
    for (int r = 0; r < m; r++) x = n[r] > x ? n[r] : x;
    return x;
}

/* The walk of `pv_rows_*` (arguments w, w_sr, n, m, lo, hi, v, v_sr, out, d in scope):
 * per tile of keys, per group of up to G consecutive rows r .. r + g - 1 that share the
 * tile's key range [j0, j1) (every row of a non-causal call does; a causal block's rows
 * differ only in the last tile each reaches), BODY over those keys, with row r's weights
 * `wr` and output `o`. */
#define PV_GROUPS(G, BODY)                                                                 \
    do {                                                                                   \
        int tile = pv_tile(d), end = max_n(n, m) < hi ? max_n(n, m) : hi;                  \
        for (int j0 = lo; j0 < end; j0 += tile)                                            \
            for (int r = 0, g = 1; r < m; r += g) {                                        \
                int j1 = n[r] < j0 + tile ? n[r] : j0 + tile;                              \
                j1 = j1 < hi ? j1 : hi;                                                    \
                for (g = 1; g < (G) && r + g < m; g++) {                                   \
                    int e = n[r + g] < j0 + tile ? n[r + g] : j0 + tile;                   \
                    if ((e < hi ? e : hi) != j1) break;                                    \
                }                                                                          \
                if (j1 <= j0) continue;                                                    \
                const float *wr = w + (int64_t)r * w_sr;                                   \
                float *o = out + (int64_t)r * d;                                           \
                BODY                                                                       \
            }                                                                              \
    } while (0)

/* One row at a time. */
#define PV_TILES(BODY) PV_GROUPS(1, BODY)

static void pv_rows_scalar(const float *restrict w, int64_t w_sr, const int *restrict n, int m,
                           int lo, int hi, const float *restrict v, int64_t v_sr,
                           float *restrict out, int d) {
    PV_TILES(for (int j = j0; j < j1; j++) {
        const float *vr = v + (int64_t)(j - lo) * v_sr;
        float p = wr[j];
        for (int c = 0; c < d; c++) o[c] += p * vr[c];
    });
}

/* out_r *= inv_r: one rounding per element, the same whatever the vector width. */
static void pv_scale(float *restrict out, int m, int d, const float *restrict inv) {
    for (int r = 0; r < m; r++)
        for (int c = 0; c < d; c++) out[(int64_t)r * d + c] *= inv[r];
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static int compact_avx512(const float *restrict row, int n,
                                                             float *restrict pv) {
    int c = 0, j = 0;
    for (; j < n; j += 16) {
        __mmask16 in = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(in, row + j);
        __mmask16 nz = _mm512_mask_cmp_ps_mask(in, x, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_mask_compressstoreu_ps(pv + c, nz, x);
        c += __builtin_popcount((unsigned)nz);
    }
    return c;
}

__attribute__((target("avx512f"))) static float lane_sum_avx512(const float *restrict pv, int n) {
    __m512 acc = _mm512_setzero_ps();
    int t = 0;
    for (; t + 16 <= n; t += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(pv + t));
    if (t < n) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - t)) - 1u), pv + t));
    return _mm512_reduce_add_ps(acc);
}

/* NC vectors of 16 features of row `o`, over the keys [j0, j1). */
#define PVT512(NC)                                                                         \
    do {                                                                                   \
        __m512 acc[NC];                                                                    \
        for (int u = 0; u < NC; u++) acc[u] = _mm512_loadu_ps(o + c0 + 16 * u);            \
        for (int j = j0; j < j1; j++) {                                                    \
            const float *vr = v + (int64_t)(j - lo) * v_sr + c0;                           \
            __m512 p = _mm512_set1_ps(wr[j]);                                              \
            for (int u = 0; u < NC; u++)                                                   \
                acc[u] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * u), acc[u]);          \
        }                                                                                  \
        for (int u = 0; u < NC; u++) _mm512_storeu_ps(o + c0 + 16 * u, acc[u]);            \
        c0 += 16 * NC;                                                                     \
    } while (0)

/* PVT512 for R rows at once (as PVR256): one load of V feeds R rows' FMAs (the empty asm
 * keeps it in a register: folded into each FMA, it would be loaded R times), each feature
 * of each row still its own chain in key order, so the numbers are PVT512's. */
#define PVR512(R, NC)                                                                      \
    do {                                                                                   \
        __m512 acc[R][NC];                                                                 \
        for (int i = 0; i < R; i++)                                                        \
            for (int u = 0; u < NC; u++)                                                   \
                acc[i][u] = _mm512_loadu_ps(o + (int64_t)i * d + c0 + 16 * u);             \
        for (int j = j0; j < j1; j++) {                                                    \
            const float *vr = v + (int64_t)(j - lo) * v_sr + c0;                           \
            __m512 p[R];                                                                   \
            for (int i = 0; i < R; i++) p[i] = _mm512_set1_ps(wr[(int64_t)i * w_sr + j]);  \
            for (int u = 0; u < NC; u++) {                                                 \
                __m512 x = _mm512_loadu_ps(vr + 16 * u);                                   \
                __asm__("" : "+v"(x));                                                     \
                for (int i = 0; i < R; i++) acc[i][u] = _mm512_fmadd_ps(p[i], x, acc[i][u]); \
            }                                                                              \
        }                                                                                  \
        for (int i = 0; i < R; i++)                                                        \
            for (int u = 0; u < NC; u++)                                                   \
                _mm512_storeu_ps(o + (int64_t)i * d + c0 + 16 * u, acc[i][u]);             \
        c0 += 16 * NC;                                                                     \
    } while (0)

/* Three rows at a time where they share a tile's keys: per key, eight loads of V and
 * three weights feed 24 FMAs (24 independent chains), where one row cost nine loads for
 * eight FMAs on eight chains, FMA latency bound. */
#define PV512_GROUP 3

__attribute__((target("avx512f"))) static void pv_rows_avx512(
    const float *restrict w, int64_t w_sr, const int *restrict n, int m, int lo, int hi,
    const float *restrict v, int64_t v_sr, float *restrict out, int d) {
    if (d % 16) {
        pv_rows_scalar(w, w_sr, n, m, lo, hi, v, v_sr, out, d);
        return;
    }
    PV_GROUPS(PV512_GROUP, {
        int c0 = 0;
        if (g == PV512_GROUP) {
            while (d - c0 >= 128) PVR512(PV512_GROUP, 8);
            if (d - c0 >= 64) PVR512(PV512_GROUP, 4);
            if (d - c0 >= 32) PVR512(PV512_GROUP, 2);
            if (d - c0 >= 16) PVR512(PV512_GROUP, 1);
        } else
            for (int i = 0; i < g; i++, wr += w_sr, o += d) {
                c0 = 0;
                while (d - c0 >= 128) PVT512(8);
                if (d - c0 >= 64) PVT512(4);
                if (d - c0 >= 32) PVT512(2);
                if (d - c0 >= 16) PVT512(1);
            }
    });
}

/* Left-packing permutations for `compact_avx2`: entry `mask` lists the set lanes first. */
static int32_t pack_lut[256][8];

__attribute__((constructor)) static void init_pack_lut(void) {
    for (int mask = 0; mask < 256; mask++) {
        int c = 0;
        for (int l = 0; l < 8; l++)
            if (mask >> l & 1) pack_lut[mask][c++] = l;
        while (c < 8) pack_lut[mask][c++] = 0;
    }
}

__attribute__((target("avx2,fma"))) static int compact_avx2(const float *restrict row, int n,
                                                           float *restrict pv) {
    int c = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(row + j);
        int nz = _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_UQ));
        __m256i perm = _mm256_loadu_si256((const __m256i *)pack_lut[nz]);
        _mm256_storeu_ps(pv + c, _mm256_permutevar8x32_ps(x, perm));
        c += __builtin_popcount((unsigned)nz);
    }
    for (; j < n; j++) {
        pv[c] = row[j];
        c += row[j] != 0.0f;
    }
    return c;
}

__attribute__((target("avx2,fma"))) static float lane_sum_avx2(const float *restrict pv, int n) {
    __m256 acc = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(pv + t));
    if (t < n) {
        __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - t),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        acc = _mm256_add_ps(acc, _mm256_maskload_ps(pv + t, keep));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
           ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

#define PVT256(NC)                                                                         \
    do {                                                                                   \
        __m256 acc[NC];                                                                    \
        for (int u = 0; u < NC; u++) acc[u] = _mm256_loadu_ps(o + c0 + 8 * u);             \
        for (int j = j0; j < j1; j++) {                                                    \
            const float *vr = v + (int64_t)(j - lo) * v_sr + c0;                           \
            __m256 p = _mm256_set1_ps(wr[j]);                                              \
            for (int u = 0; u < NC; u++)                                                   \
                acc[u] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * u), acc[u]);           \
        }                                                                                  \
        for (int u = 0; u < NC; u++) _mm256_storeu_ps(o + c0 + 8 * u, acc[u]);             \
        c0 += 8 * NC;                                                                      \
    } while (0)

/* PVT256 for R rows at once (row r's weights `wr`, output `o`; the others w_sr and d
 * further on): one load of V feeds R rows' FMAs. Each feature of each row is still its own
 * chain in key order, so the numbers are PVT256's. */
#define PVR256(R, NC)                                                                      \
    do {                                                                                   \
        __m256 acc[R][NC];                                                                 \
        for (int i = 0; i < R; i++)                                                        \
            for (int u = 0; u < NC; u++)                                                   \
                acc[i][u] = _mm256_loadu_ps(o + (int64_t)i * d + c0 + 8 * u);              \
        for (int j = j0; j < j1; j++) {                                                    \
            const float *vr = v + (int64_t)(j - lo) * v_sr + c0;                           \
            __m256 p[R];                                                                   \
            for (int i = 0; i < R; i++) p[i] = _mm256_set1_ps(wr[(int64_t)i * w_sr + j]);  \
            for (int u = 0; u < NC; u++) {                                                 \
                __m256 x = _mm256_loadu_ps(vr + 8 * u);                                    \
                for (int i = 0; i < R; i++) acc[i][u] = _mm256_fmadd_ps(p[i], x, acc[i][u]); \
            }                                                                              \
        }                                                                                  \
        for (int i = 0; i < R; i++)                                                        \
            for (int u = 0; u < NC; u++)                                                   \
                _mm256_storeu_ps(o + (int64_t)i * d + c0 + 8 * u, acc[i][u]);              \
        c0 += 8 * NC;                                                                      \
    } while (0)

/* Three rows of 32 features: 12 accumulators, three weights and one V vector fill the 16
 * registers. Best of 1-4 rows by 8-64 features on the shapes of a fields pass and a prefill
 * (Zen 3, one thread: 12.4 -> 10.9 ms for 46 queries over 5,144 keys, 44 -> 41 ms for 189
 * over 5,098). */
#define PV_GROUP 3
#define PV_NC 4

__attribute__((target("avx2,fma"))) static void pv_rows_avx2(
    const float *restrict w, int64_t w_sr, const int *restrict n, int m, int lo, int hi,
    const float *restrict v, int64_t v_sr, float *restrict out, int d) {
    if (d % 8) {
        pv_rows_scalar(w, w_sr, n, m, lo, hi, v, v_sr, out, d);
        return;
    }
    PV_GROUPS(PV_GROUP, {
        int c0 = 0;
        if (g == PV_GROUP) {
            while (d - c0 >= 8 * PV_NC) PVR256(PV_GROUP, PV_NC);
            while (d - c0 >= 8) PVR256(PV_GROUP, 1);
        } else
            for (int i = 0; i < g; i++, wr += w_sr, o += d) {
                c0 = 0;
                while (d - c0 >= 64) PVT256(8);
                if (d - c0 >= 32) PVT256(4);
                if (d - c0 >= 16) PVT256(2);
                if (d - c0 >= 8) PVT256(1);
            }
    });
}
#endif

typedef struct {
    int width; /* 512, 256 or 1 */
    int amx;   /* bf16 scores on the AMX tiles: asked for by name, never auto's */
    scores_t scores;
    softmax_row_t softmax_row;
    int (*compact)(const float *restrict, int, float *restrict);
    float (*lane_sum)(const float *restrict, int);
    pv_rows_t pv_rows;
} attn_path_t;

/* The attention kernels on each path (cpu_paths.h; width 0 where not built). */
static const attn_path_t ATTENTION[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = {1, 0, scores_scalar, softmax_row_scalar, compact_scalar,
                         lane_sum_scalar, pv_rows_scalar},
#if PCD_X86
    [PCD_PATH_AVX2] = {256, 0, scores_avx2, softmax_row_avx2, compact_avx2, lane_sum_avx2,
                       pv_rows_avx2},
    [PCD_PATH_AVX512] = {512, 0, scores_avx512, softmax_row_avx512, compact_avx512,
                         lane_sum_avx512, pv_rows_avx512},
    /* AVX-512's float32 softmax, sums and PV after bf16 scores on the tiles */
    [PCD_PATH_AMX] = {512, 1, 0, softmax_row_avx512, compact_avx512, lane_sum_avx512,
                      pv_rows_avx512},
#endif
};

/* The attention code path id `path` resolves to (PCD_PATH_AUTO: the best float32 path this
 * CPU has, or a path id to force: tests, or PCD_PATH_AMX for bf16 scores): cpu_paths.h's
 * rule; 0 if unavailable. */
static int attention_path(int path) {
    unsigned built = PCD_PATHS_BUILT(ATTENTION, .width);
    if (path == PCD_PATH_AUTO) built &= ~PCD_PATH_BIT(PCD_PATH_AMX);
    return pcd_path_pick(path, built);
}

/* The kernels of `attention_path(path)`; width 0 if unavailable. */
static attn_path_t pick_attention(int path) {
    static const attn_path_t none = {0, 0, 0, 0, 0, 0, 0};
    int p = attention_path(path);
    return p ? ATTENTION[p] : none;
}

/* The softmax code path (as `pick_attention`); NULL if the one asked for is not available
 * here. */
static softmax_row_t pick_softmax_row(int path) { return pick_attention(path).softmax_row; }

static void attention_task(void *ctx, int t, void *scratch) {
    job_t *jb = (job_t *)ctx;
    float *buf = (float *)scratch;
    float *pv = buf + (size_t)jb->block * jb->s; /* s + 16: the compaction writes 8 past */
    float *inv = pv + jb->s + 16;
    int *nr = (int *)(inv + jb->block);
    int *lim = nr + jb->block;
#if PCD_X86
    /* the AMX path's queries (bf16, 32-row multiples) and C tiles, 64-aligned */
    uint16_t *qt = (uint16_t *)(((uintptr_t)(lim + jb->block) + 63) & ~(uintptr_t)63);
    float *ct = (float *)(qt + (size_t)(jb->block + 31) / 32 * 32 * jb->d);
#endif
    int qb = t % jb->nqb;
    int hh = (t / jb->nqb) % jb->h;
    int bb = t / (jb->nqb * jb->h);
    int g = jb->h / jb->kh;
    int i0 = qb * jb->block;
    int m = jb->lq - i0 < jb->block ? jb->lq - i0 : jb->block;
    int past = jb->s - jb->lq; /* keys before the first query */
    const int *re = jb->row_end ? jb->row_end + bb * jb->re_sb + i0 : 0;
    /* the keys each row sees, [0, nr[r]): a causal row up to itself, a masked row up to
     * its last open key (the rest are masked: skipping them changes no bit, see below) */
    int width = 0;
    for (int r = 0; r < m; r++) {
        nr[r] = jb->causal ? past + i0 + r + 1 : re ? re[r] : jb->s;
        width = nr[r] > width ? nr[r] : width;
    }
    const float *q = jb->q + bb * jb->q_sb + hh * jb->q_sh + (int64_t)i0 * jb->q_sr;
    float *out = jb->out + (((int64_t)bb * jb->h + hh) * jb->lq + i0) * jb->d;
#if PCD_X86
    if (jb->amx) amx_queries(q, jb->q_sr, m, jb->d, qt);
#endif
    /* each part's keys [a, e) of the `width` this block sees; its row r sees the part's
     * local keys j < nr[r] - a */
    for (int p = 0; p < jb->nparts; p++) {
        int a = jb->start[p], e = jb->start[p + 1] < width ? jb->start[p + 1] : width;
        if (e <= a) break;
        const float *k = jb->k[p] + bb * jb->k_sb[p] + (hh / g) * jb->k_sh[p];
        for (int r = 0; r < m; r++) lim[r] = nr[r] - a;
#if PCD_X86
        if (jb->amx) {
            const uint16_t *kt = jb->kt[p] + (bb * jb->kh + hh / g) * amx_keys_elems(jb->start[p + 1] - a, jb->d);
            scores_amx(qt, m, kt, e - a, lim, jb->d, jb->scale, buf + a, width, ct);
            continue;
        }
#endif
        jb->scores(q, jb->q_sr, k, jb->k_sr[p], m, e - a, lim, jb->d, jb->scale, buf + a, width);
    }
    for (int r = 0; r < m; r++) {
        int n = nr[r];
        const float *madd = jb->mask ? jb->mask + bb * jb->m_sb + (int64_t)(i0 + r) * jb->s : 0;
        float *row = buf + (int64_t)r * width;
        if (madd && jb->mask_from > 0) { /* x + 0 = x: the skipped columns change nothing */
            for (int j = jb->mask_from; j < n; j++) row[j] += madd[j];
            madd = 0;
        }
        jb->softmax_row(row, madd, n, width);
        /* the sum of the row's nonzero weights, in lanes by rank (see above) */
        int nz = jb->compact(row, n, pv);
        inv[r] = 1.0f / jb->lane_sum(pv, nz);
    }
    memset(out, 0, sizeof(float) * (size_t)m * jb->d);
    for (int p = 0; p < jb->nparts; p++) {
        int a = jb->start[p], e = jb->start[p + 1] < width ? jb->start[p + 1] : width;
        if (e <= a) break;
        const float *v = jb->v[p] + bb * jb->v_sb[p] + (hh / g) * jb->v_sh[p];
        jb->pv_rows(buf, width, nr, m, a, e, v, jb->v_sr[p], out, jb->d);
    }
    pv_scale(out, m, jb->d, inv);
}

/* Attention of q (B, H, Lq, D) over keys and values (B, KH, S, D) that come in `nparts`
 * parts, read in place as if concatenated: part p holds `lens[p]` keys at `ks[p]` / `vs[p]`.
 * `strides` holds strides in floats (batch, head, row): q's, then each part's k and v (3 +
 * 6 nparts values; a batch or head stride may be 0). Out (B, H, Lq, D) is contiguous.
 * `mask` is NULL, or additive (B or 1, Lq, S) with batch stride `m_sb`, its columns before
 * `mask_from` known to be 0 (not read). `causal` masks key j > S - Lq + i for query i.
 * Returns 0 on success, nonzero on failure. */
static int attention(int path, const float *q, int nparts, const float *const *ks,
                     const float *const *vs, const int *lens, float *out,
                     const int64_t *strides, const float *mask, int64_t m_sb, int mask_from,
                     const int *row_end, int64_t re_sb, int b, int h, int kh, int lq, int d,
                     float scale, int causal, int block, int threads) {
    attn_path_t ap = pick_attention(path);
    if (!ap.width || nparts < 1 || nparts > MAX_PARTS || b < 1 || h < 1 || kh < 1 || h % kh ||
        lq < 1 || d < 1 || block < 1 || (ap.amx && d % 32))
        return 1;
    job_t jb;
    memset(&jb, 0, sizeof jb);
    int s = 0;
    for (int p = 0; p < nparts; p++) {
        if (!ks[p] || !vs[p] || lens[p] < 0) return 1;
        const int64_t *st = strides + 3 + 6 * p;
        jb.k[p] = ks[p], jb.v[p] = vs[p], jb.start[p] = s;
        jb.k_sb[p] = st[0], jb.k_sh[p] = st[1], jb.k_sr[p] = st[2];
        jb.v_sb[p] = st[3], jb.v_sh[p] = st[4], jb.v_sr[p] = st[5];
        s += lens[p];
    }
    jb.start[nparts] = s;
    if (s < lq || mask_from < 0 || mask_from > s) return 1;
    jb.nparts = nparts;
    jb.scores = ap.scores;
    jb.softmax_row = ap.softmax_row;
    jb.compact = ap.compact, jb.lane_sum = ap.lane_sum, jb.pv_rows = ap.pv_rows;
    jb.q = q, jb.out = out, jb.mask = mask;
    jb.q_sb = strides[0], jb.q_sh = strides[1], jb.q_sr = strides[2];
    jb.m_sb = m_sb, jb.mask_from = mask ? mask_from : 0;
    if (row_end && !causal) {
        for (int64_t i = 0; i < (re_sb ? (int64_t)b * lq : lq); i++)
            if (row_end[i] < 1 || row_end[i] > s) return 1;
        jb.row_end = row_end, jb.re_sb = re_sb;
    }
    jb.b = b, jb.h = h, jb.kh = kh, jb.lq = lq, jb.s = s, jb.d = d;
    jb.nqb = (lq + block - 1) / block;
    jb.block = (lq + jb.nqb - 1) / jb.nqb; /* even blocks: 152 rows -> 2 x 76, not 128 + 24 */
    jb.causal = causal, jb.scale = scale;
    jb.ntasks = b * h * jb.nqb;
    /* scores (block x s), a row's nonzero weights (s + 16), per row 1 / sum, keys seen and
     * a part's local limit */
    size_t scratch = sizeof(float) * ((size_t)jb.block * s + (size_t)s + 16 + (size_t)jb.block) +
                     2 * sizeof(int) * (size_t)jb.block;
    if (!ap.amx) return run_parallel(attention_task, &jb, jb.ntasks, scratch, threads);
#if PCD_X86
    /* and the AMX path's bf16 queries and C tiles (attention_task), after the keys' tiles */
    scratch += 64 + 2 * (size_t)(jb.block + 31) / 32 * 32 * d + 4096;
    int64_t at[MAX_PARTS + 1] = {0}; /* where each part's tiles start */
    for (int p = 0; p < nparts; p++) at[p + 1] = at[p] + (int64_t)b * kh * amx_keys_elems(lens[p], d);
    uint16_t *tiles = (uint16_t *)aligned_alloc(64, ((size_t)at[nparts] * 2 + 63) & ~(size_t)63);
    if (!tiles) return 1;
    for (int p = 0; p < nparts; p++) jb.kt[p] = tiles + at[p];
    jb.amx = 1;
    int rc = run_parallel(amx_keys_task, &jb, b * kh * nparts, 0, threads);
    if (!rc) rc = run_parallel(attention_task, &jb, jb.ntasks, scratch, threads);
    free(tiles);
    return rc;
#else
    return 1;
#endif
}

/* Keys in one part: `strides` holds 9 values (q, k, v); `path` PCD_PATH_AUTO for the best
 * code path this CPU has, or a path id to ask for one (tests). */
int pcd_attention_path(int path, const float *q, const float *k, const float *v,
                       float *out, const int64_t *strides, const float *mask, int64_t m_sb, int b,
                       int h, int kh, int lq, int s, int d, float scale, int causal, int block,
                       int threads) {
    const float *ks[1] = {k}, *vs[1] = {v};
    int lens[1] = {s};
    return attention(path, q, 1, ks, vs, lens, out, strides, mask, m_sb, 0, 0, 0, b, h, kh, lq,
                     d, scale, causal, block, threads);
}

/* Attention on the best code path this CPU has (`pcd_attention_path`, PCD_PATH_AUTO). */
int pcd_attention(const float *q, const float *k, const float *v, float *out,
                  const int64_t *strides, const float *mask, int64_t m_sb, int b, int h, int kh,
                  int lq, int s, int d, float scale, int causal, int block, int threads) {
    return pcd_attention_path(PCD_PATH_AUTO, q, k, v, out, strides, mask, m_sb, b, h, kh, lq, s, d, scale,
                              causal, block, threads);
}

/* Keys in two parts, [0, s1) in k / v (a cached prefix) and [s1, s) in k2 / v2 (the call's
 * own), not causal: `strides` holds 15 values (q, k, v, k2, v2). */
int pcd_attention_split(int path, const float *q, const float *k, const float *v,
                        const float *k2, const float *v2, int s1, float *out,
                        const int64_t *strides, const float *mask, int64_t m_sb, int b, int h,
                        int kh, int lq, int s, int d, float scale, int block, int threads) {
    const float *ks[2] = {k, k2}, *vs[2] = {v, v2};
    int lens[2] = {s1, s - s1};
    if (s1 < 0 || s1 > s) return 1;
    return attention(path, q, 2, ks, vs, lens, out, strides, mask, m_sb, 0, 0, 0, b, h, kh, lq,
                     d, scale, 0, block, threads);
}

/* Every form in one (see `attention`): the engine's entry point. `row_end` (NULL, or per
 * query row one past its last open key, (B or 1) x Lq ints with batch stride `re_sb`) lets
 * a masked call skip each row's masked tail: a long prefill fused with a fields chunk then
 * costs a causal prefill's scores, not a square's. */
int pcd_attention_parts(int path, const float *q, int nparts, const float *const *ks,
                        const float *const *vs, const int *lens, float *out,
                        const int64_t *strides, const float *mask, int64_t m_sb, int mask_from,
                        const int *row_end, int64_t re_sb, int b, int h, int kh, int lq, int d,
                        float scale, int causal, int block, int threads) {
    return attention(path, q, nparts, ks, vs, lens, out, strides, mask, m_sb, mask_from, row_end,
                     re_sb, b, h, kh, lq, d, scale, causal, block, threads);
}

/* silu(g) * x = g * sigmoid(g) * x, with sigmoid(g) = 1 / (1 + e) for g >= 0 and
 * e / (1 + e) for g < 0, where e = exp(-|g|) never overflows. */
static void swiglu_scalar(const float *restrict g, const float *restrict x, float *restrict out,
                          int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float e = exp_neg(-__builtin_fabsf(g[i]));
        float s = (g[i] >= 0.0f ? 1.0f : e) / (1.0f + e);
        out[i] = g[i] * s * x[i];
    }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static void swiglu_avx512(const float *restrict g,
                                                             const float *restrict x,
                                                             float *restrict out, int64_t n) {
    __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
        __mmask16 pos = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ);
        __m512 s = _mm512_div_ps(_mm512_mask_blend_ps(pos, e, one), _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(gv, s), _mm512_loadu_ps(x + i)));
    }
    swiglu_scalar(g + i, x + i, out + i, n - i);
}

__attribute__((target("avx2,fma"))) static void swiglu_avx2(const float *restrict g,
                                                            const float *restrict x,
                                                            float *restrict out, int64_t n) {
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp_neg8(_mm256_or_ps(gv, sign)); /* -|g| */
        __m256 pos = _mm256_cmp_ps(gv, _mm256_setzero_ps(), _CMP_GE_OQ);
        __m256 s = _mm256_div_ps(_mm256_blendv_ps(e, one, pos), _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(gv, s), _mm256_loadu_ps(x + i)));
    }
    swiglu_scalar(g + i, x + i, out + i, n - i);
}
#endif

typedef void (*swiglu_t)(const float *restrict, const float *restrict, float *restrict, int64_t);

/* SwiGLU on each path (cpu_paths.h; 0 where not built). */
static const swiglu_t SWIGLU[PCD_N_PATHS] = {
    [PCD_PATH_SCALAR] = swiglu_scalar,
#if PCD_X86
    [PCD_PATH_AVX2] = swiglu_avx2,
    [PCD_PATH_AVX512] = swiglu_avx512,
#endif
};

static swiglu_t pick_swiglu(int path) {
    int p = pcd_path_pick(path, PCD_PATHS_BUILT(SWIGLU, ));
    return p ? SWIGLU[p] : 0;
}

#define SWIGLU_CHUNK 16384

typedef struct {
    swiglu_t fn;
    const float *g, *x;
    float *out;
    int64_t n;
} swiglu_job_t;

static void swiglu_task(void *ctx, int t, void *scratch) {
    (void)scratch;
    swiglu_job_t *jb = (swiglu_job_t *)ctx;
    int64_t i = (int64_t)t * SWIGLU_CHUNK;
    int64_t m = jb->n - i < SWIGLU_CHUNK ? jb->n - i : SWIGLU_CHUNK;
    jb->fn(jb->g + i, jb->x + i, jb->out + i, m);
}

/* out = silu(g) * x over n contiguous floats, on `threads` threads. `path` picks the code
 * path (PCD_PATH_AUTO: the best this CPU has; a path id to force one, for tests). Returns
 * 0 on success, 1 if the path is not available here. */
int pcd_swiglu(const float *g, const float *x, float *out, int64_t n, int threads, int path) {
    swiglu_t fn = pick_swiglu(path);
    if (!fn || n < 0) return 1;
    swiglu_job_t jb = {fn, g, x, out, n};
    int ntasks = (int)((n + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK);
    return ntasks ? run_parallel(swiglu_task, &jb, ntasks, 0, threads) : 0;
}

/* Which softmax code path this CPU gets, as its width: 512, 256 (AVX2) or 1 (scalar). */
int pcd_attention_simd_width(void) {
    return pick_attention(PCD_PATH_AUTO).width;
}

/* The path `path` (PCD_PATH_AUTO or a path id) resolves to for the attention kernels; 0 if
 * not available here. SwiGLU is built for the same float32 paths; PCD_PATH_AMX is
 * attention's alone (bf16 scores), asked for by name. */
int pcd_cpu_kernels_path(int path) { return attention_path(path); }

/* One row through a code path (as `pick_softmax_row`), for tests; -1 if unavailable. */
float pcd_softmax_row(int path, float *row, const float *madd, int n, int width) {
    softmax_row_t f = pick_softmax_row(path);
    return f ? f(row, madd, n, width) : -1.0f;
}

/* Rotary position embedding, the same float32 arithmetic as MLX's `fast.rope` on the CPU:
 * out = x1 * cos - x2 * sin, x1 * sin + x2 * cos for each pair (x1, x2) of the first
 * `dims` features (the two halves, or neighbours when `traditional`), the rest copied.
 * The cos / sin tables are the caller's, (positions, dims / 2) floats; token r of batch
 * row bi is at position pos[bi * l + r]. No fused multiply-adds, so that each product is
 * rounded as MLX rounds it. x is (b, h, l, d) with the given (batch, head, row) strides
 * in floats and contiguous features; out is contiguous. */
typedef struct {
    const float *x, *cs, *sn;
    const int32_t *pos;
    float *out;
    int64_t x_sb, x_sh, x_sr;
    int b, h, l, d, dims, traditional;
} rope_job_t;

#if defined(__clang__)
#define NO_CONTRACT
#elif defined(__GNUC__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_CONTRACT
#endif

NO_CONTRACT static void rope_task(void *ctx, int t, void *scratch) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    (void)scratch;
    rope_job_t *jb = (rope_job_t *)ctx;
    int bi = t / jb->h, hi = t % jb->h, half = jb->dims / 2;
    for (int r = 0; r < jb->l; r++) {
        const float *x = jb->x + bi * jb->x_sb + hi * jb->x_sh + r * jb->x_sr;
        float *o = jb->out + (((int64_t)bi * jb->h + hi) * jb->l + r) * jb->d;
        int64_t p = jb->pos[(int64_t)bi * jb->l + r];
        const float *c = jb->cs + p * half, *s = jb->sn + p * half;
        if (jb->traditional) {
            for (int i = 0; i < half; i++) {
                float x1 = x[2 * i], x2 = x[2 * i + 1];
                float a = x1 * c[i], b2 = x2 * s[i], e = x1 * s[i], f = x2 * c[i];
                o[2 * i] = a - b2;
                o[2 * i + 1] = e + f;
            }
        } else {
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[half + i];
                float a = x1 * c[i], b2 = x2 * s[i], e = x1 * s[i], f = x2 * c[i];
                o[i] = a - b2;
                o[half + i] = e + f;
            }
        }
        for (int i = jb->dims; i < jb->d; i++) o[i] = x[i];
    }
}

int pcd_rope(const float *x, float *out, const float *cs, const float *sn, const int32_t *pos,
             const int64_t *strides, int b, int h, int l, int d, int dims, int traditional,
             int threads) {
    if (dims < 2 || dims % 2 || dims > d || b < 0 || h < 0 || l < 0) return 1;
    rope_job_t jb = {x, cs, sn, pos, out, strides[0], strides[1], strides[2],
                     b, h, l, d, dims, traditional};
    int ntasks = b * h;
    return ntasks ? run_parallel(rope_task, &jb, ntasks, 0, threads) : 0;
}
