/* Forwarding shim: exports the unprefixed CBLAS GEMM symbols that libmlx.so imports and
 * forwards them to a BLAS whose symbols carry a prefix (scipy-openblas32 exports
 * `scipy_cblas_sgemm`, ...). Built and loaded by pcd_tools.engine.platform, which calls
 * pcd_blas_bind() and only then promotes this library to RTLD_GLOBAL, before mlx loads.
 *
 * The target is opened RTLD_LOCAL, so its few unprefixed LAPACK helpers (claqz0_, ...)
 * never interpose on the reference LAPACK that MLX links. CBLAS enums are passed as int
 * and blasint is 32-bit (LP64), as in the CBLAS ABI MLX was built against.
 */
#include <dlfcn.h>
#include <stdio.h>

typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int,
                        const float *, int, float, float *, int);
typedef void (*dgemm_t)(int, int, int, int, int, int, double, const double *, int,
                        const double *, int, double, double *, int);
typedef void (*cgemm_t)(int, int, int, int, int, int, const void *, const void *, int,
                        const void *, int, const void *, void *, int);
typedef void (*set_threads_t)(int);
typedef int (*get_threads_t)(void);

static sgemm_t p_sgemm;
static dgemm_t p_dgemm;
static cgemm_t p_cgemm;
static set_threads_t p_set_threads;
static get_threads_t p_get_threads;

static void *lookup(void *handle, const char *prefix, const char *name) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s%s", prefix, name);
    return dlsym(handle, buf);
}

/* Returns 1 when the GEMM entry points were all found, 0 otherwise. */
int pcd_blas_bind(const char *path, const char *prefix) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return 0;
    p_sgemm = (sgemm_t)lookup(handle, prefix, "cblas_sgemm");
    p_dgemm = (dgemm_t)lookup(handle, prefix, "cblas_dgemm");
    p_cgemm = (cgemm_t)lookup(handle, prefix, "cblas_cgemm");
    p_set_threads = (set_threads_t)lookup(handle, prefix, "openblas_set_num_threads");
    p_get_threads = (get_threads_t)lookup(handle, prefix, "openblas_get_num_threads");
    return p_sgemm && p_dgemm && p_cgemm;
}

int pcd_blas_set_num_threads(int n) {
    if (!p_set_threads) return 0;
    p_set_threads(n);
    return 1;
}

int pcd_blas_get_num_threads(void) { return p_get_threads ? p_get_threads() : -1; }

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    p_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                 const double *a, int lda, const double *b, int ldb, double beta, double *c,
                 int ldc) {
    p_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_cgemm(int order, int ta, int tb, int m, int n, int k, const void *alpha,
                 const void *a, int lda, const void *b, int ldb, const void *beta, void *c,
                 int ldc) {
    p_cgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
