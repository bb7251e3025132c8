/* Online (single-pass max/sum) softmax per row, as attention kernels compute it. */
#include <math.h>
void forge_softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float m = -INFINITY, d = 0.f;
        for (int c = 0; c < cols; c++) {
            float mn = xr[c] > m ? xr[c] : m;
            d = d * expf(m - mn) + expf(xr[c] - mn);
            m = mn;
        }
        for (int c = 0; c < cols; c++) y[(long)r * cols + c] = expf(xr[c] - m) / d;
    }
}
