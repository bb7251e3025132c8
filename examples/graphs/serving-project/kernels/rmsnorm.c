/* RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, one row at a time (float32). */
#include <math.h>
void forge_rmsnorm(const float *x, const float *w, float *y, int rows, int cols, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float ss = 0.f;
        for (int c = 0; c < cols; c++) ss += xr[c] * xr[c];
        float inv = 1.f / sqrtf(ss / cols + eps);
        for (int c = 0; c < cols; c++) yr[c] = xr[c] * inv * w[c];
    }
}
