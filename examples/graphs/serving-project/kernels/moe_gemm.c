/* Grouped GEMM for MoE experts: for each token row routed to expert e, y = x @ W[e]. */
void forge_moe_gemm(const float *x, const float *w, const int *expert, float *y,
                    int tokens, int d_in, int d_out) {
    for (int t = 0; t < tokens; t++) {
        const float *we = w + (long)expert[t] * d_in * d_out;
        for (int o = 0; o < d_out; o++) {
            float acc = 0.f;
            for (int i = 0; i < d_in; i++) acc += x[(long)t * d_in + i] * we[(long)i * d_out + o];
            y[(long)t * d_out + o] = acc;
        }
    }
}
