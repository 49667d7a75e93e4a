/* LAMB on the CPU in two passes over memory, called through ctypes by bertrain/train/lamb_native.py.
 *
 * torch ops need 14 tensor-sized reads and writes per LAMB step (7 for fused AdamW); these two loops need
 * 10: pass 1 reads grad, exp_avg, exp_avg_sq, param and writes the moments while it sums ||w||^2 and
 * ||update||^2; pass 2 recomputes the update from the new moments and writes the parameter. The work is a
 * list of segments (tensor, first element, end) so that Python can give each thread an equal share; the
 * squares of a segment are summed in float per 2048 elements (vectorized) and in double across blocks,
 * into sums[2 * tensor] of the calling thread's own array. Where *found_inf is non-zero neither pass
 * changes anything (the step counts are restored by the caller). Each gradient is divided by *grad_scale
 * where given (clipping, as fused AdamW's grad_scale: no pass of its own). Same update as train/lamb.py.
 */
#include <math.h>
#include <stdint.h>

#define BLOCK 2048

static void bias_corrections(float step, double beta1, double beta2, float *step_size, float *inverse_bc2_sqrt) {
    *step_size = (float)(1.0 / (1.0 - pow(beta1, step)));
    *inverse_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(beta2, step)));
}

void lamb_moments_and_squares(int64_t count, const int64_t *tensor, const int64_t *first, const int64_t *end,
                              float *const *grad, float *const *exp_avg, float *const *exp_avg_sq,
                              float *const *param, float *const *step, double beta1, double beta2, double eps,
                              double weight_decay, const float *found_inf, const float *grad_scale,
                              double *sums) {
    if (found_inf && *found_inf != 0.0f) return;
    const float scale = grad_scale ? *grad_scale : 1.0f;  /* x / 1 is x: unclipped steps as before */
    const float b1 = (float)beta1, b2 = (float)beta2, one_minus_b1 = (float)(1.0 - beta1);
    const float one_minus_b2 = (float)(1.0 - beta2), e = (float)eps, wd = (float)weight_decay;
    for (int64_t k = 0; k < count; k++) {
        const int64_t t = tensor[k];
        float step_size, inverse_bc2_sqrt;
        bias_corrections(*step[t], beta1, beta2, &step_size, &inverse_bc2_sqrt);
        const float *g = grad[t], *w = param[t];
        float *m = exp_avg[t], *v = exp_avg_sq[t];
        double weight_squares = 0.0, update_squares = 0.0;
        for (int64_t block = first[k]; block < end[k]; block += BLOCK) {
            const int64_t stop = block + BLOCK < end[k] ? block + BLOCK : end[k];
            float ww = 0.0f, uu = 0.0f;
#pragma omp simd reduction(+ : ww, uu)
            for (int64_t i = block; i < stop; i++) {
                const float gi = g[i] / scale;
                const float mi = m[i] + one_minus_b1 * (gi - m[i]);
                const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
                m[i] = mi;
                v[i] = vi;
                const float u = mi * step_size / (sqrtf(vi) * inverse_bc2_sqrt + e) + wd * w[i];
                ww += w[i] * w[i];
                uu += u * u;
            }
            weight_squares += ww;
            update_squares += uu;
        }
        sums[2 * t] += weight_squares;
        sums[2 * t + 1] += update_squares;
    }
}

void lamb_apply(int64_t count, const int64_t *tensor, const int64_t *first, const int64_t *end,
                float *const *exp_avg, float *const *exp_avg_sq, float *const *param, float *const *step,
                double beta1, double beta2, double eps, double weight_decay, double lr, const float *found_inf,
                const double *sums) {
    if (found_inf && *found_inf != 0.0f) return;
    const float e = (float)eps, wd = (float)weight_decay;
    for (int64_t k = 0; k < count; k++) {
        const int64_t t = tensor[k];
        float step_size, inverse_bc2_sqrt;
        bias_corrections(*step[t], beta1, beta2, &step_size, &inverse_bc2_sqrt);
        const double weight_norm = sqrt(sums[2 * t]), update_norm = sqrt(sums[2 * t + 1]);
        const double trust_ratio = weight_norm > 0 && update_norm > 0 ? weight_norm / update_norm : 1.0;
        const float scale = (float)(lr * trust_ratio);
        const float *m = exp_avg[t], *v = exp_avg_sq[t];
        float *w = param[t];
#pragma omp simd
        for (int64_t i = first[k]; i < end[k]; i++) {
            const float u = m[i] * step_size / (sqrtf(v[i]) * inverse_bc2_sqrt + e) + wd * w[i];
            w[i] -= scale * u;
        }
    }
}
