/* FP8 (e4m3) fake-quantization with one scale per block of `block` values:
   y = dequant(quant(x)); scales[b] = amax(block) / 448. block == n gives one per-tensor scale. */
#include <math.h>
static float e4m3(float v) {
    float a = fabsf(v);
    if (a > 448.f) a = 448.f;
    if (a == 0.f) return 0.f;
    int e;
    frexpf(a, &e);               /* a = m * 2^e, m in [0.5, 1) */
    int ex = e - 1;
    if (ex < -6) ex = -6;        /* subnormals: fixed quantum 2^-9 */
    float q = ldexpf(1.f, ex - 3);
    float r = roundf(a / q) * q;
    if (r > 448.f) r = 448.f;
    return copysignf(r, v);
}
void forge_fp8_quant(const float *x, float *y, float *scales, int n, int block) {
    for (int b = 0; b * block < n; b++) {
        int lo = b * block, hi = lo + block < n ? lo + block : n;
        float amax = 0.f;
        for (int i = lo; i < hi; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float s = amax > 0.f ? amax / 448.f : 1.f;
        scales[b] = s;
        for (int i = lo; i < hi; i++) y[i] = e4m3(x[i] / s) * s;
    }
}
