/* MoE router: per token, the top-k experts by logit and their renormalized softmax weights. */
#include <math.h>
void forge_topk_router(const float *logits, int tokens, int experts, int k, int *idx, float *w) {
    for (int t = 0; t < tokens; t++) {
        const float *l = logits + (long)t * experts;
        int *ti = idx + (long)t * k;
        float *tw = w + (long)t * k;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < experts; e++) {
                int taken = 0;
                for (int p = 0; p < j; p++) taken |= ti[p] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            ti[j] = best;
        }
        float m = l[ti[0]], s = 0.f;
        for (int j = 0; j < k; j++) s += expf(l[ti[j]] - m);
        for (int j = 0; j < k; j++) tw[j] = expf(l[ti[j]] - m) / s;
    }
}
