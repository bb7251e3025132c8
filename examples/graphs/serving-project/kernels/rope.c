/* Rotary position embedding (neox layout), in place: q[seq][heads][dim], positions 0..seq-1. */
#include <math.h>
void forge_rope(float *q, int seq, int heads, int dim, float base) {
    int half = dim / 2;
    for (int s = 0; s < seq; s++)
        for (int h = 0; h < heads; h++) {
            float *v = q + ((long)s * heads + h) * dim;
            for (int i = 0; i < half; i++) {
                float theta = s * powf(base, -2.f * i / dim);
                float c = cosf(theta), sn = sinf(theta);
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * sn;
                v[i + half] = a * sn + b * c;
            }
        }
}
