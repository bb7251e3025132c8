/* Fused SiLU-and-multiply of the MLP: y = silu(gate) * up. */
#include <math.h>
void forge_silu_mul(const float *gate, const float *up, float *y, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = g / (1.f + expf(-g)) * up[i];
    }
}
