/* One-token decode steps of llama-family models on the CPU, weights in 8 bits.
 *
 * A step takes B independent sequences (one token each, each at its own position over
 * its own KV) through the whole model and writes their float32 logits. The weights are
 * read once per step for all B rows, so B rows cost little more than one: a one-row
 * step is bound by reading the weights (135 M of them for SmolLM2-135M).
 *
 * Weights: every matrix is 8-bit, w = mn + s * q with q in [0, 255] and a float32 scale
 * s and minimum mn per block of 32 along the input dimension (pcd_quantize_q8 forms each
 * block as affine min/range or as llama.cpp's symmetric Q8_0, whichever is closer), or
 * float32 (the same step without the rounding, for tests). Q/K/V are one matrix; gate
 * and up are interleaved row by row (2j: gate j, 2j+1: up j) so a chunk of rows yields
 * silu(gate) * up directly. Activations, norms, RoPE, attention and softmax are float32.
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
 * Code paths: AVX-512, AVX2+FMA or portable C, picked at run time with
 * __builtin_cpu_supports (or forced, for tests), as in _cpu_kernels.c. A row's result
 * does not depend on the batch it is in (same arithmetic for every row).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
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
#ifndef PF_AHEAD
#define PF_AHEAD 2048 /* bytes of weights prefetched ahead in the row loops */
#endif

typedef struct {
    const void *w;     /* uint8 or float32, (rows, cols) row-major */
    const float *s;    /* 8-bit: (rows, cols / 32) scales; float32: NULL */
    const float *mn;   /* 8-bit: (rows, cols / 32) block minimums: w = mn + s * q */
    const float *bias; /* (rows) or NULL */
    int32_t rows, cols;
} pcd_lin_t;

typedef struct {
    const float *attn_norm, *mlp_norm;
    pcd_lin_t qkv, o, gate_up, down;
} pcd_layer_t;

typedef struct {
    int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, inter, vocab, wbits;
    int32_t rope_traditional, rope_dims, rope_len, pad;
    float eps, attn_scale;
    const float *embed;      /* (vocab, hidden) float32 */
    const float *final_norm; /* (hidden) */
    const float *rope_cos, *rope_sin; /* (rope_len, rope_dims / 2) */
    const pcd_layer_t *layers;
    pcd_lin_t head;
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

/* Rows [r0, r1) of a matrix on B rows of x (row stride ldx) into y (row stride ldy). */
typedef void (*mv_fn)(const pcd_lin_t *, int, int, const float *, int64_t, int, float *, int64_t,
                      int);
typedef void (*scores_fn)(const float *, const float *, int64_t, int, int, float, float *);
typedef void (*accum_fn)(float *, const float *, const float *, int64_t, int, int);
typedef float (*softmax_fn)(float *, int);

typedef struct {
    mv_fn mv;
    scores_fn scores;
    accum_fn accum;
    softmax_fn softmax;
    int width;
} kern_t;

static inline float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Every row of x goes through the same arithmetic whatever B is and wherever it sits in
 * the batch (groups of at most NB rows share one pass over a weight row), so a batch of
 * B rows gives exactly the logits of B one-row steps. MV_SWIGLU keeps each (gate, up)
 * pair's dots and writes silu(gate) * up at column j / 2. */
#define MV_DRIVER(NAME, ROWFN, NB)                                                            \
    static void NAME(const pcd_lin_t *L, int r0, int r1, const float *x, int64_t ldx, int B, \
                     float *y, int64_t ldy, int mode) {                                       \
        float dots[NB_MAX], gate[NB_MAX];                                                     \
        for (int b0 = 0; b0 < B; b0 += NB) {                                                  \
            int nb = B - b0 < NB ? B - b0 : NB;                                               \
            const float *xb = x + (int64_t)b0 * ldx;                                           \
            float *yb = y + (int64_t)b0 * ldy;                                                 \
            for (int j = r0; j < r1; j++) {                                                   \
                if (L->s)                                                                     \
                    ROWFN(L, j, xb, ldx, nb, dots);                                           \
                else /* float32 weights (tests): the portable code on every path */           \
                    row_f32_c(L, j, xb, ldx, nb, dots);                                       \
                float bias = L->bias ? L->bias[j] : 0.0f;                                     \
                for (int b = 0; b < nb; b++) {                                                \
                    float v = dots[b] + bias;                                                 \
                    if (mode == MV_STORE)                                                     \
                        yb[b * ldy + j] = v;                                                  \
                    else if (mode == MV_ADD)                                                  \
                        yb[b * ldy + j] += v;                                                 \
                    else if (!(j & 1))                                                        \
                        gate[b] = v;                                                          \
                    else                                                                      \
                        yb[b * ldy + j / 2] = silu_mul(gate[b], v);                           \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
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

MV_DRIVER(mv_c, row_q8_c, NB_MAX)

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

T512 MV_DRIVER(mv_512, row_q8_512, NB_MAX)

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

T256 MV_DRIVER(mv_256, row_q8_256, NB_256)

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

/* The kernels of a code path: 0 for the best this CPU has, or 512, 256 or 1 to ask for
 * one (tests). Returns 0 (and leaves *k alone) if the one asked for is not available. */
static int pick(int path, kern_t *k) {
#if X86
    __builtin_cpu_init();
    if ((path == 0 || path == 512) && __builtin_cpu_supports("avx512f")) {
        *k = (kern_t){mv_512, scores_512, accum_512, softmax_512, 512};
        return 1;
    }
    if ((path == 0 || path == 256) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        *k = (kern_t){mv_256, scores_256, accum_256, softmax_256, 256};
        return 1;
    }
#endif
    if (path != 0 && path != 1) return 0;
    *k = (kern_t){mv_c, scores_c, accum_c, softmax_c, 1};
    return 1;
}

/* Which code path `path` gets here: 512, 256, 1, or 0 if not available. */
int pcd_decode_path(int path) {
    kern_t k;
    return pick(path, &k) ? k.width : 0;
}

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

/* Rows [r0, r1) of `L` in chunks handed out by counter *ctr; x is (B, cols). */
static void matvec(job_t *jb, const pcd_lin_t *L, int *ctr, const float *x, int64_t ldx, float *y,
                   int64_t ldy, int mode) {
    int chunk = (int)(65536 / (L->cols > 0 ? L->cols : 1));
    chunk = chunk < 16 ? 16 : chunk & ~1; /* even: gate/up pairs stay together */
    int nchunks = (L->rows + chunk - 1) / chunk;
    for (;;) {
        int c = __atomic_fetch_add(ctr, 1, __ATOMIC_RELAXED);
        if (c >= nchunks) break;
        int r0 = c * chunk, r1 = r0 + chunk < L->rows ? r0 + chunk : L->rows;
        jb->k.mv(L, r0, r1, x, ldx, jb->B, y, ldy, mode);
    }
}

static void attention(job_t *jb, pool_t *p, int tid, int l, int *ctr) {
    const pcd_model_t *m = jb->m;
    int H = m->n_heads, KH = m->n_kv_heads, d = m->head_dim, G = H / KH;
    int64_t ldq = m->layers[l].qkv.rows;
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

static void step_body(pool_t *p, int tid) {
    job_t *jb = p->job;
    const pcd_model_t *m = jb->m;
    int B = jb->B, D = m->hidden;
    float *xn = p->scr[tid].xn;
    int ph = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const pcd_layer_t *L = &m->layers[l];
        for (int b = 0; b < B; b++) rms_norm(p->x + b * D, L->attn_norm, D, m->eps, xn + b * D);
        matvec(jb, &L->qkv, &jb->ctr[ph++], xn, D, p->qkv, L->qkv.rows, MV_STORE);
        barrier(p);
        attention(jb, p, tid, l, &jb->ctr[ph++]);
        barrier(p);
        matvec(jb, &L->o, &jb->ctr[ph++], p->att, L->o.cols, p->x, D, MV_ADD);
        barrier(p);
        for (int b = 0; b < B; b++) rms_norm(p->x + b * D, L->mlp_norm, D, m->eps, xn + b * D);
        matvec(jb, &L->gate_up, &jb->ctr[ph++], xn, D, p->act, m->inter, MV_SWIGLU);
        barrier(p);
        matvec(jb, &L->down, &jb->ctr[ph++], p->act, m->inter, p->x, D, MV_ADD);
        barrier(p);
    }
    for (int b = 0; b < B; b++) rms_norm(p->x + b * D, m->final_norm, D, m->eps, xn + b * D);
    matvec(jb, &m->head, &jb->ctr[ph++], xn, D, jb->logits, m->vocab, MV_STORE);
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
    int longest = 0, qkv_rows = m->layers[0].qkv.rows;
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
    }
    int phases = 5 * m->n_layers + 1;
    if (phases > p->cap_ctr) {
        int *c = (int *)realloc(p->ctr, sizeof(int) * phases);
        if (!c) return 2;
        p->ctr = c, p->cap_ctr = phases;
    }
    if (err) return 2;
    memset(p->ctr, 0, sizeof(int) * phases);
    for (int b = 0; b < B; b++)
        memcpy(p->x + b * D, m->embed + (int64_t)rows[b].token * D, sizeof(float) * D);
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
