/* Matmuls on GGUF's quantized weight blocks, kept packed, for the CPU (runtime/cpu_quant.py).
 *
 * Compiled at first use with the machine's own instruction set (-march=native) and called
 * through ctypes on tensor data pointers. Written with GCC vector extensions, so the same
 * source becomes AVX-512, AVX2 or AVX code as the machine allows; no intrinsics.
 *
 * Weights are repacked at load from GGUF's interleaved blocks into separate arrays, every
 * row the same, one block = 32 consecutive weights of a row:
 *   Q4 (Q4_0 and Q4_1): qs uint8 [N, K/2]  (16 bytes a block: byte j holds weight j in its
 *                       low nibble and weight j + 16 in its high nibble, as in GGUF),
 *                       d, m float32 [N, K/32]; weight = q * d + m  (Q4_0: m = -8 d)
 *   Q8_0:               qs int8 [N, K], d float32 [N, K/32]; weight = q * d
 * The fp16 scales of the file are widened to fp32 at load (exactly), and q * d + m is exact
 * before its one rounding, so the weights this file computes with are bit for bit the ones
 * gguf.quants.dequantize gives; only the order of the sums differs from a dense matmul.
 *
 * y [M, N] = x [M, K] @ W^T, x and y float32, row-major and contiguous.
 */
#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));

#define MTILE 4 /* activation rows sharing one dequantized block */

static inline v16f load16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum(v16f v) {
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += v[i];
    return s;
}

static inline v16f splat(float f) { return (v16f){0} + f; }

/* the 32 weights of one Q4 block as two vectors: weights 0..15 and 16..31 */
static inline void q4_block(const uint8_t *qs, float d, float m, v16f *lo, v16f *hi) {
    v16u8 b;
    memcpy(&b, qs, 16);
    v16f dv = splat(d), mv = splat(m);
    *lo = __builtin_convertvector(__builtin_convertvector(b & 15, v16i), v16f) * dv + mv;
    *hi = __builtin_convertvector(__builtin_convertvector(b >> 4, v16i), v16f) * dv + mv;
}

/* Q8_0 as unsigned bytes: (q + 128) * d - 128 d equals q * d exactly (both products are exact
 * and so is their difference), and GCC widens unsigned bytes in one instruction where it
 * would widen signed ones element by element. */
static inline void q8_block(const int8_t *qs, float d, v16f *lo, v16f *hi) {
    v16u8 a, b;
    memcpy(&a, qs, 16);
    memcpy(&b, qs + 16, 16);
    v16f dv = splat(d), mv = splat(-128.0f * d);
    *lo = __builtin_convertvector(__builtin_convertvector(a ^ 0x80, v16i), v16f) * dv + mv;
    *hi = __builtin_convertvector(__builtin_convertvector(b ^ 0x80, v16i), v16f) * dv + mv;
}

/* One output row n against up to MTILE activation rows: y[r * N + n] for r < rows. Always
 * inlined into a switch on `rows`, so each copy has a constant row count and keeps its
 * accumulators in registers. */
#define INLINE static inline __attribute__((always_inline))

INLINE void q4_row(const float *x, int64_t rows, int64_t K, const uint8_t *qs, const float *d,
                          const float *m, int64_t N, int64_t n, float *y) {
    int64_t nb = K / 32;
    v16f acc_lo[MTILE] = {{0}}, acc_hi[MTILE] = {{0}};
    for (int64_t b = 0; b < nb; b++) {
        v16f lo, hi;
        q4_block(qs + b * 16, d[b], m[b], &lo, &hi);
        for (int64_t r = 0; r < rows; r++) {
            acc_lo[r] += lo * load16(x + r * K + b * 32);
            acc_hi[r] += hi * load16(x + r * K + b * 32 + 16);
        }
    }
    for (int64_t r = 0; r < rows; r++) y[r * N + n] = hsum(acc_lo[r] + acc_hi[r]);
}

INLINE void q8_row(const float *x, int64_t rows, int64_t K, const int8_t *qs, const float *d,
                          int64_t N, int64_t n, float *y) {
    int64_t nb = K / 32;
    v16f acc_lo[MTILE] = {{0}}, acc_hi[MTILE] = {{0}};
    for (int64_t b = 0; b < nb; b++) {
        v16f lo, hi;
        q8_block(qs + b * 32, d[b], &lo, &hi);
        for (int64_t r = 0; r < rows; r++) {
            acc_lo[r] += lo * load16(x + r * K + b * 32);
            acc_hi[r] += hi * load16(x + r * K + b * 32 + 16);
        }
    }
    for (int64_t r = 0; r < rows; r++) y[r * N + n] = hsum(acc_lo[r] + acc_hi[r]);
}

/* y [M, N] = x [M, K] @ dequant(W)^T for a Q4 weight (qs [N, K/2], d and m [N, K/32]). */
void q4_matmul(const float *x, int64_t M, int64_t K, const uint8_t *qs, const float *d, const float *m,
               int64_t N, float *y, int nthreads) {
    int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t r0 = 0; r0 < M; r0 += MTILE) {
            int64_t rows = M - r0 < MTILE ? M - r0 : MTILE;
            const float *xr = x + r0 * K;
            const uint8_t *qn = qs + n * nb * 16;
            float *yr = y + r0 * N;
            switch (rows) {
            case 1: q4_row(xr, 1, K, qn, d + n * nb, m + n * nb, N, n, yr); break;
            case 2: q4_row(xr, 2, K, qn, d + n * nb, m + n * nb, N, n, yr); break;
            case 3: q4_row(xr, 3, K, qn, d + n * nb, m + n * nb, N, n, yr); break;
            default: q4_row(xr, 4, K, qn, d + n * nb, m + n * nb, N, n, yr); break;
            }
        }
    }
}

/* y [M, N] = x [M, K] @ dequant(W)^T for a Q8_0 weight (qs [N, K], d [N, K/32]). */
void q8_matmul(const float *x, int64_t M, int64_t K, const int8_t *qs, const float *d, int64_t N, float *y,
               int nthreads) {
    int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t r0 = 0; r0 < M; r0 += MTILE) {
            int64_t rows = M - r0 < MTILE ? M - r0 : MTILE;
            const float *xr = x + r0 * K;
            float *yr = y + r0 * N;
            switch (rows) {
            case 1: q8_row(xr, 1, K, qs + n * K, d + n * nb, N, n, yr); break;
            case 2: q8_row(xr, 2, K, qs + n * K, d + n * nb, N, n, yr); break;
            case 3: q8_row(xr, 3, K, qs + n * K, d + n * nb, N, n, yr); break;
            default: q8_row(xr, 4, K, qs + n * K, d + n * nb, N, n, yr); break;
            }
        }
    }
}

/* out [N, K] = the float32 weights of a Q4 matrix (for many-row products: dequantize, then GEMM). */
void q4_dequantize(const uint8_t *qs, const float *d, const float *m, int64_t N, int64_t K, float *out,
                   int nthreads) {
    int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < nb; b++) {
            v16f lo, hi;
            q4_block(qs + (n * nb + b) * 16, d[n * nb + b], m[n * nb + b], &lo, &hi);
            memcpy(out + n * K + b * 32, &lo, sizeof lo);
            memcpy(out + n * K + b * 32 + 16, &hi, sizeof hi);
        }
    }
}

void q8_dequantize(const int8_t *qs, const float *d, int64_t N, int64_t K, float *out, int nthreads) {
    int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < nb; b++) {
            v16f lo, hi;
            q8_block(qs + n * K + b * 32, d[n * nb + b], &lo, &hi);
            memcpy(out + n * K + b * 32, &lo, sizeof lo);
            memcpy(out + n * K + b * 32 + 16, &hi, sizeof hi);
        }
    }
}
