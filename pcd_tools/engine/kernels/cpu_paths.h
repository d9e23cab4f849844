/* CPU-feature dispatch, one style for every C source of the engine (`_qweights.c`,
 * `_qgemm.c`, `_cpu_kernels.c`, `_decode.c`).
 *
 * A code path is an instruction-set level, named by a PCD_PATH_* id (the same ids in
 * every library; pcd_tools.engine.kernels.paths holds their names for Python). A kernel
 * family is a table indexed by path id: the portable C body (the reference, at
 * PCD_PATH_SCALAR: built for the baseline target, it is also the `_generic` fallback) and
 * one entry per SIMD build, 0 where a path is not built (e.g. off x86). Each dispatching
 * entry point takes a path: PCD_PATH_AUTO (0) for the best this CPU runs, or a path id to
 * force it (tests); `pcd_path_pick` resolves it, the same rule everywhere:
 *   - a forced path is taken where the family builds it and `pcd_path_runs` says yes,
 *     else nothing (0: the caller reports the path as unavailable);
 *   - auto takes the first of PCD_PATH_ORDER (fastest first) that the family builds and
 *     this CPU runs; the scalar path always runs.
 * What the CPU runs is read once per library (`pcd_cpu_paths`, a cached bit mask). */
#ifndef PCD_CPU_PATHS_H
#define PCD_CPU_PATHS_H

enum {
    PCD_PATH_AUTO = 0,       /* the best this CPU runs */
    PCD_PATH_SCALAR = 1,     /* portable C (the `_generic` reference) */
    PCD_PATH_AVX2 = 2,       /* AVX2 + FMA */
    PCD_PATH_AVXVNNI = 3,    /* AVX2 + FMA + AVX-VNNI (VEX-encoded dpbusd) */
    PCD_PATH_AVX512VNNI = 4, /* AVX-512 F/BW/VL + VNNI (and AVX2 + FMA) */
    PCD_PATH_AVX512BF16 = 5, /* AVX-512 F/BW/VL + BF16 (and AVX2 + FMA) */
    PCD_PATH_AVX512 = 6,     /* AVX-512 F (and AVX2 + FMA) */
    PCD_PATH_AMX = 7,        /* AMX-INT8 and -BF16 tiles, with AVX-512 VNNI's (Intel Sapphire Rapids on) */
    PCD_N_PATHS = 8
};

#define PCD_PATH_BIT(p) (1u << (p))

#if defined(__x86_64__) || defined(__i386__)
#define PCD_X86 1
#else
#define PCD_X86 0
#endif
#include <stdlib.h>
#if PCD_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Whether this process may use the AMX tile registers. Linux hands the tile data state
 * only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA,
 * kernel 5.16 on), once for all its threads; elsewhere, or where the kernel refuses, no
 * AMX. PCD_AMX=0 in the environment turns the path off (an A/B against AVX-512 VNNI). */
static inline int pcd_amx_permitted(void) {
#if PCD_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    const char *off = getenv("PCD_AMX");
    if (off && off[0] == '0' && !off[1]) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

#if PCD_X86
#include <immintrin.h>
#include <string.h>
/* The one tile shape every AMX kernel of the engine uses: eight tiles of 16 rows by 64
 * bytes (int8: 16 x 64; bf16: 16 x 32 pairs' halves; int32 / float32: 16 x 16). The
 * configuration is per thread; each library loads it once per thread, and since all of
 * them load this same one, a thread that runs kernels of several libraries needs no
 * reload between them. */
typedef struct {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} pcd_amx_cfg_t;

__attribute__((target("amx-tile"))) static inline void pcd_amx_config(void) {
    static __thread int loaded;
    if (loaded) return;
    pcd_amx_cfg_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
    loaded = 1;
}
#endif

/* The bit mask (PCD_PATH_BIT) of the paths this CPU runs, read once. */
static inline unsigned pcd_cpu_paths(void) {
    static unsigned cached; /* 0 until read (the scalar bit is always set once read) */
    unsigned m = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (m) return m;
    m = PCD_PATH_BIT(PCD_PATH_SCALAR);
#if PCD_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f");
    int bwvl = avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    if (avx2) m |= PCD_PATH_BIT(PCD_PATH_AVX2);
    if (avx2 && __builtin_cpu_supports("avxvnni")) m |= PCD_PATH_BIT(PCD_PATH_AVXVNNI);
    if (avx512) m |= PCD_PATH_BIT(PCD_PATH_AVX512);
    if (bwvl && __builtin_cpu_supports("avx512vnni")) m |= PCD_PATH_BIT(PCD_PATH_AVX512VNNI);
    if (bwvl && __builtin_cpu_supports("avx512bf16")) m |= PCD_PATH_BIT(PCD_PATH_AVX512BF16);
    if ((m & PCD_PATH_BIT(PCD_PATH_AVX512VNNI)) && __builtin_cpu_supports("amx-tile") &&
        __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("amx-bf16") &&
        pcd_amx_permitted())
        m |= PCD_PATH_BIT(PCD_PATH_AMX);
#endif
    __atomic_store_n(&cached, m, __ATOMIC_RELAXED);
    return m;
}

/* Whether this CPU runs path p. */
static inline int pcd_path_runs(int p) {
    return p > PCD_PATH_AUTO && p < PCD_N_PATHS && (pcd_cpu_paths() & PCD_PATH_BIT(p));
}

/* Auto's preference, fastest first. AVX-512 BF16 is a mode of its own (a caller asks for
 * it by name), never auto's choice. */
static const int PCD_PATH_ORDER[] = {PCD_PATH_AMX, PCD_PATH_AVX512VNNI, PCD_PATH_AVX512, PCD_PATH_AVXVNNI,
                                     PCD_PATH_AVX2, PCD_PATH_SCALAR};

/* The path `asked` (PCD_PATH_AUTO or a path id) resolves to for a family built for the
 * paths in `built` (a PCD_PATH_BIT mask): see the rule above. 0 if none. */
static inline int pcd_path_pick(int asked, unsigned built) {
    unsigned ok = built & pcd_cpu_paths();
    if (asked != PCD_PATH_AUTO)
        return asked > 0 && asked < PCD_N_PATHS && (ok & PCD_PATH_BIT(asked)) ? asked : 0;
    for (unsigned i = 0; i < sizeof PCD_PATH_ORDER / sizeof PCD_PATH_ORDER[0]; i++)
        if (ok & PCD_PATH_BIT(PCD_PATH_ORDER[i])) return PCD_PATH_ORDER[i];
    return 0;
}

/* The PCD_PATH_BIT mask of a table indexed by path whose entries' `FIELD` (write `.fn`,
 * or nothing for a table of function pointers) is not 0. */
#define PCD_PATHS_BUILT(TABLE, FIELD)                                                      \
    __extension__({                                                                        \
        unsigned b_ = 0;                                                                   \
        for (int p_ = 1; p_ < PCD_N_PATHS; p_++)                                           \
            if (TABLE[p_] FIELD) b_ |= PCD_PATH_BIT(p_);                                   \
        b_;                                                                                \
    })

#endif /* PCD_CPU_PATHS_H */
