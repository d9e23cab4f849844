/* The GGUF (ggml) block types the engine reads, declared once for `_qweights.c`,
 * `_qgemm.c` and `_decode.c`: their type ids (ggml.h), block sizes and layouts, and one
 * portable scalar decoder per block type. Each source keeps its own SIMD kernels; where
 * one decodes a block in plain C it uses these.
 *
 * A block decodes into int8 quants q, and a float32 scale s and minimum m per group of 16
 * or 32 weights (`gguf_group_shift`), so that each weight is w = s * q + m; the types
 * without a minimum (`gguf_has_min` 0) are w = s * q. s and m are formed as gguf-py's
 * `gguf.quants.dequantize` forms them (s = d * sc, m = -(dmin * mn)); for Q4_0, Q5_0,
 * Q3_K and Q6_K the offset is in q. So `s * q + m` (or `s * q`) in float32, without
 * fused multiply-adds, is bit-identical to gguf-py's weights.
 *
 * Layouts (bytes, little-endian; d, dmin and m are float16):
 *   Q4_0  18 B / 32 w: d, qs[16]          weight i < 16: qs[i] & 15, i + 16: qs[i] >> 4; w = d (q - 8)
 *   Q4_1  20 B / 32 w: d, m, qs[16]       the same nibbles; w = d q + m
 *   Q5_0  22 B / 32 w: d, qh[4], qs[16]   Q4_0's nibbles, bit 4 = bit i of qh; w = d (q - 16)
 *   Q5_1  24 B / 32 w: d, m, qh[4], qs[16]                                     w = d q + m
 *   Q8_0  34 B / 32 w: d, qs[32] (int8)                                        w = d q
 *   Q2_K  84 B / 256 w: scales[16] (sc | mn << 4), qs[64] (2 bits), d, dmin: 16 groups of 16
 *   Q3_K 110 B / 256 w: hmask[32], qs[64] (2 bits), scales[12] (6 bits, - 32), d: 16 of 16
 *   Q4_K 144 B / 256 w: d, dmin, scales[12] (6-bit sc and mn, 8 each), qs[128]: 8 of 32
 *   Q5_K 176 B / 256 w: d, dmin, scales[12], qh[32], qs[128]: 8 groups of 32
 *   Q6_K 210 B / 256 w: ql[128], qh[64], scales[16] (int8), d: 16 groups of 16, q - 32
 *
 * The float16 scales are read through GGUF_FP16(p) (p: the 2 bytes): a file that keeps a
 * table of the 65536 halves defines it before including this header; the default
 * converts the bits (the same floats: every half is exactly a float).
 */
#ifndef PCD_GGUF_BLOCKS_H
#define PCD_GGUF_BLOCKS_H

#include <stdint.h>
#include <string.h>

/* ggml type ids */
enum {
    GGUF_F32 = 0, GGUF_F16 = 1, GGUF_Q4_0 = 2, GGUF_Q4_1 = 3, GGUF_Q5_0 = 6, GGUF_Q5_1 = 7,
    GGUF_Q8_0 = 8, GGUF_Q2_K = 10, GGUF_Q3_K = 11, GGUF_Q4_K = 12, GGUF_Q5_K = 13,
    GGUF_Q6_K = 14, GGUF_BF16 = 30
};

#define GGUF_QK 32   /* weights of a 32-block */
#define GGUF_QK_K 256 /* weights of a K-quant super-block */

#define GGUF_INLINE static inline __attribute__((always_inline))

/* A float16's bits as the float32 it is exactly (subnormals normalised, inf/NaN kept). */
static inline float gguf_half_bits(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0 && man == 0) {
        u = sign;
    } else if (exp == 0) { /* subnormal: normalise */
        exp = 127 - 15 + 1;
        while (!(man & 0x400)) man <<= 1, exp--;
        u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    } else {
        u = sign | (exp == 31 ? 0x7f800000u : (exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#ifndef GGUF_FP16
#define GGUF_FP16(p) gguf_half_bits((uint32_t)((p)[0] | ((p)[1] << 8)))
#endif

/* Bytes of a block of a quantized type (and its weights in *per); 0 (and *per 0) for any
 * other type. */
static inline int gguf_block_bytes(int type, int *per) {
    *per = GGUF_QK_K;
    switch (type) {
    case GGUF_Q2_K: return 84;
    case GGUF_Q3_K: return 110;
    case GGUF_Q4_K: return 144;
    case GGUF_Q5_K: return 176;
    case GGUF_Q6_K: return 210;
    }
    *per = GGUF_QK;
    switch (type) {
    case GGUF_Q4_0: return 18;
    case GGUF_Q4_1: return 20;
    case GGUF_Q5_0: return 22;
    case GGUF_Q5_1: return 24;
    case GGUF_Q8_0: return 34;
    }
    *per = 0;
    return 0;
}

/* log2 of the weights sharing a scale (and minimum): 16 for Q2_K, Q3_K and Q6_K, else 32. */
static inline int gguf_group_shift(int type) {
    return type == GGUF_Q2_K || type == GGUF_Q3_K || type == GGUF_Q6_K ? 4 : 5;
}

/* Whether the type's weights carry a minimum (w = s * q + m); the others are s * q. */
static inline int gguf_has_min(int type) {
    return type == GGUF_Q4_1 || type == GGUF_Q5_1 || type == GGUF_Q2_K || type == GGUF_Q4_K ||
           type == GGUF_Q5_K;
}

/* Where a 32-block type's parts are: 1 with a minimum, 1 with a fifth bit, q's offset. */
GGUF_INLINE int gguf_b32_min(int type) { return type == GGUF_Q4_1 || type == GGUF_Q5_1; }
GGUF_INLINE int gguf_b32_fifth(int type) { return type == GGUF_Q5_0 || type == GGUF_Q5_1; }
GGUF_INLINE int gguf_b32_off(int type) {
    return gguf_b32_min(type) ? 0 : gguf_b32_fifth(type) ? 16 : 8;
}

/* Q4_K / Q5_K: sub-block j's 6-bit scale and minimum from the 12 bytes at s. */
GGUF_INLINE void gguf_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63, *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* 32-blocks: nibbles (and a fifth bit, bit i of the 4 bytes at qh for weight i) of the
 * 16 bytes at qs, minus `off`. */
GGUF_INLINE void gguf_dec32(const uint8_t *restrict qs, const uint8_t *restrict qh, int off,
                            int8_t *restrict q) {
    uint32_t h = 0;
    if (qh) memcpy(&h, qh, 4);
    for (int i = 0; i < 16; i++) {
        q[i] = (int8_t)(((qs[i] & 15) | (((h >> i) & 1) << 4)) - off);
        q[i + 16] = (int8_t)(((qs[i] >> 4) | (((h >> (i + 16)) & 1) << 4)) - off);
    }
}

/* ---- the scalar decoders, one per block type: scales and minimums, then quants ----- */

/* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one scale (and minimum) per block. */
GGUF_INLINE void gguf_scales_b32(int type, const uint8_t *restrict b, float *restrict s,
                                 float *restrict m) {
    s[0] = GGUF_FP16(b);
    m[0] = gguf_b32_min(type) ? GGUF_FP16(b + 2) : 0.0f;
}

GGUF_INLINE void gguf_scales_q2_k(const uint8_t *restrict b, float *restrict s,
                                  float *restrict m) {
    float d = GGUF_FP16(b + 80), dm = GGUF_FP16(b + 82);
    for (int g = 0; g < 16; g++) s[g] = d * (float)(b[g] & 15), m[g] = -(dm * (float)(b[g] >> 4));
}

GGUF_INLINE void gguf_scales_q3_k(const uint8_t *restrict b, float *restrict s,
                                  float *restrict m) {
    const uint8_t *sc = b + 96;
    float d = GGUF_FP16(b + 108);
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4, hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        s[i] = d * (float)((lo | hi << 4) - 32), m[i] = 0.0f;
    }
}

/* Q4_K and Q5_K share their scales' layout. */
GGUF_INLINE void gguf_scales_q4_k(const uint8_t *restrict b, float *restrict s,
                                  float *restrict m) {
    float d = GGUF_FP16(b), dm = GGUF_FP16(b + 2);
    for (int g = 0; g < 8; g++) {
        int sc, mn;
        gguf_scale_min_k4(g, b + 4, &sc, &mn);
        s[g] = d * (float)sc;
        m[g] = -(dm * (float)mn);
    }
}

GGUF_INLINE void gguf_scales_q6_k(const uint8_t *restrict b, float *restrict s,
                                  float *restrict m) {
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = GGUF_FP16(b + 208);
    for (int i = 0; i < 16; i++) s[i] = d * (float)sc[i], m[i] = 0.0f;
}

/* Q4_0, Q4_1, Q5_0, Q5_1 (Q8_0's quants are its bytes). */
GGUF_INLINE void gguf_quants_b32(int type, const uint8_t *restrict b, int8_t *restrict q) {
    int one = gguf_b32_min(type), five = gguf_b32_fifth(type);
    gguf_dec32(b + 2 + 2 * one + 4 * five, five ? b + 2 + 2 * one : 0, gguf_b32_off(type), q);
}

GGUF_INLINE void gguf_quants_q8_0(const uint8_t *restrict b, int8_t *restrict q) {
    for (int i = 0; i < 32; i++) q[i] = (int8_t)b[2 + i];
}

GGUF_INLINE void gguf_quants_q2_k(const uint8_t *restrict b, int8_t *restrict q) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * j + l] = (int8_t)((b[16 + 32 * h + l] >> (2 * j)) & 3);
}

GGUF_INLINE void gguf_quants_q3_k(const uint8_t *restrict b, int8_t *restrict q) {
    const uint8_t *hm = b, *qs = b + 32;
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * j + l] = (int8_t)(((qs[32 * h + l] >> (2 * j)) & 3) -
                                                   (((hm[l] >> (4 * h + j)) & 1) ? 0 : 4));
}

/* Q4_K (five 0) and Q5_K (five 1): unsigned quants, low nibbles then high per 64. */
GGUF_INLINE void gguf_quants_q45_k(int five, const uint8_t *restrict b, int8_t *restrict q) {
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int h0 = 0, h1 = 0;
            if (five) h0 = ((qh[l] >> (2 * c)) & 1) << 4, h1 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
            q[64 * c + l] = (int8_t)((qs[32 * c + l] & 15) | h0);
            q[64 * c + 32 + l] = (int8_t)((qs[32 * c + l] >> 4) | h1);
        }
}

GGUF_INLINE void gguf_quants_q6_k(const uint8_t *restrict b, int8_t *restrict q) {
    const uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            int hb = qh[32 * h + l];
            const uint8_t *L = ql + 64 * h;
            q[128 * h + l] = (int8_t)(((L[l] & 15) | ((hb & 3) << 4)) - 32);
            q[128 * h + 32 + l] = (int8_t)(((L[l + 32] & 15) | (((hb >> 2) & 3) << 4)) - 32);
            q[128 * h + 64 + l] = (int8_t)(((L[l] >> 4) | (((hb >> 4) & 3) << 4)) - 32);
            q[128 * h + 96 + l] = (int8_t)(((L[l + 32] >> 4) | (((hb >> 6) & 3) << 4)) - 32);
        }
}

/* A block's scales and minimums, one per group (gguf_group_shift). */
GGUF_INLINE void gguf_block_scales(int type, const uint8_t *restrict b, float *restrict s,
                                   float *restrict m) {
    switch (type) {
    case GGUF_Q4_0: case GGUF_Q4_1: case GGUF_Q5_0: case GGUF_Q5_1: case GGUF_Q8_0:
        gguf_scales_b32(type, b, s, m);
        break;
    case GGUF_Q2_K: gguf_scales_q2_k(b, s, m); break;
    case GGUF_Q3_K: gguf_scales_q3_k(b, s, m); break;
    case GGUF_Q4_K: case GGUF_Q5_K: gguf_scales_q4_k(b, s, m); break;
    case GGUF_Q6_K: gguf_scales_q6_k(b, s, m); break;
    }
}

/* A block's int8 quants. */
GGUF_INLINE void gguf_block_quants(int type, const uint8_t *restrict b, int8_t *restrict q) {
    switch (type) {
    case GGUF_Q4_0: case GGUF_Q4_1: case GGUF_Q5_0: case GGUF_Q5_1:
        gguf_quants_b32(type, b, q);
        break;
    case GGUF_Q8_0: gguf_quants_q8_0(b, q); break;
    case GGUF_Q2_K: gguf_quants_q2_k(b, q); break;
    case GGUF_Q3_K: gguf_quants_q3_k(b, q); break;
    case GGUF_Q4_K: gguf_quants_q45_k(0, b, q); break;
    case GGUF_Q5_K: gguf_quants_q45_k(1, b, q); break;
    case GGUF_Q6_K: gguf_quants_q6_k(b, q); break;
    }
}

#endif /* PCD_GGUF_BLOCKS_H */
