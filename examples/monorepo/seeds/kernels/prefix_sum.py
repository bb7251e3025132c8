"""Inclusive prefix sum: out[i] = xs[0] + … + xs[i]. The first version: sums each prefix
again (O(n²) element reads)."""


def prefix_sum(xs):
    return [sum(xs[: i + 1]) for i in range(len(xs))]
