/* The small per-layer ops of a CPU decode step in one pass each (runtime/cpu_ops.py): at batch 1
 * the pure-torch references spend most of their time dispatching 5-10 tiny tensor ops apiece.
 * float32 only; built into the same library as cpu_quant.c. Each has a *_ref in kernels/. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static void rms_row(const float *x, const float *w, float *out, int64_t h, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < h; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)h + eps);
    for (int64_t i = 0; i < h; i++) out[i] = (x[i] * r) * w[i];
}

/* out [T, H] = rmsnorm(x [T, H]) * w */
void cpu_rmsnorm(const float *x, const float *w, float *out, int64_t t, int64_t h, float eps) {
    for (int64_t r = 0; r < t; r++) rms_row(x + r * h, w, out + r * h, h, eps);
}

/* in place: res += x; x = rmsnorm(res) * w   (x, res [T, H]) */
void cpu_fused_add_rmsnorm(float *x, float *res, const float *w, int64_t t, int64_t h, float eps) {
    for (int64_t r = 0; r < t; r++) {
        float *xr = x + r * h, *rr = res + r * h;
        for (int64_t i = 0; i < h; i++) rr[i] += xr[i];
        rms_row(rr, w, xr, h, eps);
    }
}

/* out [T, I] = silu(x[:, :I]) * x[:, I:]   (x [T, 2I]) */
void cpu_silu_and_mul(const float *x, float *out, int64_t t, int64_t inter) {
    for (int64_t r = 0; r < t; r++) {
        const float *a = x + r * 2 * inter, *b = a + inter;
        for (int64_t i = 0; i < inter; i++) out[r * inter + i] = a[i] / (1.0f + expf(-a[i])) * b[i];
    }
}

/* in place, rotate-half RoPE on heads of D: x [T, heads, D] with row stride `ld` (floats; heads
 * contiguous inside a row), cos_sin [max_pos, D] = cos | sin of each of the D/2 frequencies */
static void rope_rows(float *x, int64_t ld, int64_t t, int64_t heads, int64_t d, const int64_t *pos,
                      const float *cos_sin) {
    int64_t half = d / 2;
    for (int64_t r = 0; r < t; r++) {
        const float *c = cos_sin + pos[r] * d, *s = c + half;
        for (int64_t hh = 0; hh < heads; hh++) {
            float *v = x + r * ld + hh * d;
            for (int64_t i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c[i] - x2 * s[i];
                v[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

void cpu_rope(float *q, int64_t ldq, int64_t hq, float *k, int64_t ldk, int64_t hk, int64_t t, int64_t d,
              const int64_t *pos, const float *cos_sin) {
    rope_rows(q, ldq, t, hq, d, pos, cos_sin);
    rope_rows(k, ldk, t, hk, d, pos, cos_sin);
}

/* Decode attention, one query token per request, over the paged pool:
 *   q [B, Hq, D] (row stride ldq floats), k_buf/v_buf [slots, Hk, D], o [B, Hq, D] contiguous,
 *   keys of request b at slots req_to_token[req_rows[b] * ctx + j], j < seq_lens[b].
 * Query head h reads KV head h / (Hq / Hk). Scores and sums in float32. */
void cpu_decode_attention(const float *q, int64_t ldq, const float *k_buf, const float *v_buf, float *o,
                          const int32_t *req_to_token, int64_t ctx, const int64_t *req_rows,
                          const int64_t *seq_lens, int64_t b, int64_t hq, int64_t hk, int64_t d, float scale,
                          int nthreads) {
    int64_t group = hq / hk;
#pragma omp parallel for schedule(dynamic) num_threads(nthreads)
    for (int64_t task = 0; task < b * hq; task++) {
        int64_t bi = task / hq, h = task % hq, kvh = h / group, len = seq_lens[bi];
        const float *qv = q + bi * ldq + h * d;
        const int32_t *slots = req_to_token + req_rows[bi] * ctx;
        float *out = o + (bi * hq + h) * d;
        float *p = malloc(sizeof(float) * (len > 0 ? len : 1));
        float mx = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
            const float *kv = k_buf + ((int64_t)slots[j] * hk + kvh) * d;
            float sc = 0.0f;
            for (int64_t i = 0; i < d; i++) sc += qv[i] * kv[i];
            p[j] = sc * scale;
            mx = p[j] > mx ? p[j] : mx;
        }
        float den = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            p[j] = expf(p[j] - mx);
            den += p[j];
        }
        for (int64_t i = 0; i < d; i++) out[i] = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            const float *vv = v_buf + ((int64_t)slots[j] * hk + kvh) * d;
            float pj = p[j] / den;
            for (int64_t i = 0; i < d; i++) out[i] += pj * vv[i];
        }
        free(p);
    }
}
